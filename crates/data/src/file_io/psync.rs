//! The psync backend: one `pwrite`/`pread` loop per op, retrying the remainder of a short
//! transfer and an interrupted call, until the op is complete, fails, or (reads) hits EOF.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Writes all of `data` at `offset`; returns its length.
pub(super) fn write_at(file: &File, data: &[u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < data.len() {
        match file.write_at(&data[done..], offset + done as u64) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(written) => done += written,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(done)
}

/// Fills `buf` from `offset`; returns the bytes read, fewer than `buf.len()` only at EOF.
pub(super) fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(read) => done += read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(done)
}
