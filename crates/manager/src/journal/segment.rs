//! The open log segment: a file written ahead with zeros, so that syncing an append
//! writes no file-size metadata.
//!
//! An `fdatasync` after an append that grows the file must also commit the new size (a
//! filesystem journal commit); after a write into bytes the file already holds it writes the
//! data alone — about half the time on the virtio disks measured (docs/performance.md,
//! "Durability"). So a segment is created with [`PREALLOCATED_BYTES`] of zeros after its
//! header, and whenever an append would pass the end of the zeros, the append writes
//! another such stretch after its records before the sync: one slower sync per stretch.
//! A hole (`set_len`) or `fallocate`d space would not do: the first write into either still
//! changes the file's block map.
//!
//! Readers see the zeros as the end of the log: a frame header of eight zero bytes (an empty
//! record with the checksum of nothing, which the writer never writes) followed by nothing
//! but zeros ends a segment's records like the end of the file (see
//! [`super::files::read_records`]).
//!
//! Invariants: records are written at `written`, in order, always followed by at least one
//! zero frame header before the end of the file (extended in the same flush otherwise); a
//! rotated segment is cut at the end of its records before the next one exists, and
//! recovery cuts the newest one's zeros before it starts a new one — so only the newest
//! segment ever ends in zeros, and zeros ending any other are damage.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::files::{self, FRAME_BYTES, HEADER_BYTES, LOG_MAGIC};
use super::JournalError;

/// Zeros written ahead of the records, at creation and at each extension.
pub(crate) const PREALLOCATED_BYTES: u64 = 1 << 20;

/// The log segment being written.
#[derive(Debug)]
pub(crate) struct Segment {
    file: File,
    path: PathBuf,
    /// Where the next record goes (bytes of header and records).
    written: u64,
    /// The file's length: zeros from `written` to here.
    allocated: u64,
}

impl Segment {
    /// Creates segment `sequence` in `dir`, its header and zeros durable (the directory
    /// synced) before it returns.
    pub fn create(dir: &Path, sequence: u64) -> Result<Self, JournalError> {
        let path = files::segment_path(dir, sequence);
        let mut bytes = files::header(LOG_MAGIC, sequence);
        bytes.resize((HEADER_BYTES + PREALLOCATED_BYTES) as usize, 0);
        let file = files::create_durable(&path, &bytes)?;
        Ok(Segment {
            file,
            path,
            written: HEADER_BYTES,
            allocated: bytes.len() as u64,
        })
    }

    /// Writes `records` after the last ones (not synced), first writing more zeros past
    /// them when they would reach the end of the zeros.
    pub fn write(&mut self, records: &[u8]) -> io::Result<()> {
        let end = self.written + records.len() as u64;
        // A whole zero frame header must follow the records: fewer zeros before the end of
        // the file would read as a torn frame.
        if end + FRAME_BYTES as u64 > self.allocated {
            let zeros = vec![0u8; PREALLOCATED_BYTES as usize];
            self.file.write_all_at(&zeros, end)?;
            self.allocated = end + PREALLOCATED_BYTES;
        }
        self.file.write_all_at(records, self.written)?;
        self.written = end;
        Ok(())
    }

    /// Makes what was written durable (`fdatasync`).
    pub fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    /// Cuts the zeros after the records and syncs (a rotation: the segment is done; a later
    /// write would extend it again).
    pub fn close(&mut self) -> io::Result<()> {
        self.file.set_len(self.written)?;
        self.allocated = self.written;
        self.file.sync_data()
    }

    /// The file's path (for errors).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A segment writing to `file` from its start (a test's broken disk).
    #[cfg(test)]
    pub fn over(file: File) -> Self {
        Segment {
            file,
            path: PathBuf::from("(a test's file)"),
            written: 0,
            allocated: u64::MAX,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(payloads: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for payload in payloads {
            files::frame(payload, &mut out).unwrap();
        }
        out
    }

    /// The payloads of a segment file, and how the read ended.
    fn read_back(path: &Path) -> (Vec<Vec<u8>>, files::ReadEnd) {
        let mut payloads = Vec::new();
        let end = files::read_records(path, LOG_MAGIC, |p| payloads.push(p.to_vec())).unwrap();
        (payloads, end)
    }

    fn file_len(path: &Path) -> u64 {
        std::fs::metadata(path).unwrap().len()
    }

    #[test]
    fn records_overwrite_zeros_written_ahead_and_read_back_up_to_them() {
        let dir = tempfile::tempdir().unwrap();
        let mut segment = Segment::create(dir.path(), 7).unwrap();
        let path = segment.path().to_path_buf();
        let ahead = HEADER_BYTES + PREALLOCATED_BYTES;
        assert_eq!(file_len(&path), ahead, "zeros after the header");

        let first = framed(&[b"one", b"two"]);
        segment.write(&first).unwrap();
        segment.sync().unwrap();
        assert_eq!(
            file_len(&path),
            ahead,
            "an append inside the zeros keeps the size"
        );
        let (payloads, end) = read_back(&path);
        assert_eq!(payloads, [b"one".to_vec(), b"two".to_vec()]);
        assert_eq!(end.damage, None, "the zeros end the records cleanly");
        assert_eq!(end.valid_bytes, HEADER_BYTES + first.len() as u64);

        // A record that reaches past the zeros writes another stretch after itself.
        let big = vec![0xA5u8; PREALLOCATED_BYTES as usize];
        let second = framed(&[&big]);
        segment.write(&second).unwrap();
        segment.sync().unwrap();
        let written = HEADER_BYTES + (first.len() + second.len()) as u64;
        assert_eq!(file_len(&path), written + PREALLOCATED_BYTES);
        let (payloads, end) = read_back(&path);
        assert_eq!(payloads.len(), 3);
        assert_eq!(payloads[2], big);
        assert_eq!((end.valid_bytes, end.damage), (written, None));

        segment.close().unwrap();
        assert_eq!(file_len(&path), written, "closing cuts the zeros");
        assert_eq!(read_back(&path).0.len(), 3);
        segment.write(&framed(&[b"three"])).unwrap();
        assert_eq!(
            read_back(&path).0.len(),
            4,
            "a write after close extends again"
        );
    }

    #[test]
    fn records_ending_within_a_frame_header_of_the_zeros_end_extend_them() {
        let dir = tempfile::tempdir().unwrap();
        let mut segment = Segment::create(dir.path(), 1).unwrap();
        let path = segment.path().to_path_buf();
        // One record whose frame ends 3 bytes before the end of the file.
        let payload = vec![1u8; PREALLOCATED_BYTES as usize - 3 - FRAME_BYTES];
        segment.write(&framed(&[&payload])).unwrap();
        let written = HEADER_BYTES + PREALLOCATED_BYTES - 3;
        assert_eq!(file_len(&path), written + PREALLOCATED_BYTES);
        let (payloads, end) = read_back(&path);
        assert_eq!(payloads.len(), 1);
        assert_eq!((end.damage, end.zeros_after), (None, true));
    }

    #[test]
    fn data_after_the_zeros_that_end_the_records_is_damage() {
        let dir = tempfile::tempdir().unwrap();
        let mut segment = Segment::create(dir.path(), 1).unwrap();
        let path = segment.path().to_path_buf();
        let records = framed(&[b"kept"]);
        segment.write(&records).unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(b"stray", HEADER_BYTES + records.len() as u64 + 4096)
            .unwrap();
        let (payloads, end) = read_back(&path);
        assert_eq!(payloads, [b"kept".to_vec()]);
        assert_eq!(end.valid_bytes, HEADER_BYTES + records.len() as u64);
        assert!(!end.zeros_after);
        assert_eq!(
            end.damage.as_deref(),
            Some("data after zeros that end the records")
        );
    }

    #[test]
    fn zeros_end_the_records_of_version_2_files_only() {
        let dir = tempfile::tempdir().unwrap();
        let mut segment = Segment::create(dir.path(), 1).unwrap();
        let path = segment.path().to_path_buf();
        segment.write(&framed(&[b"kept"])).unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(&1u32.to_le_bytes(), 8).unwrap();
        let (payloads, end) = read_back(&path);
        assert!(!end.zeros_after, "version 1 wrote no zeros ahead");
        assert_eq!(payloads[0], b"kept");
        assert!(
            payloads[1..].iter().all(Vec::is_empty),
            "a version-1 file reads zeros as it always did: empty records"
        );
    }

    #[test]
    fn an_empty_record_is_refused_it_would_read_as_the_end() {
        let mut out = Vec::new();
        assert!(matches!(
            files::frame(b"", &mut out),
            Err(JournalError::EmptyRecord)
        ));
        assert!(out.is_empty(), "nothing framed");
    }
}
