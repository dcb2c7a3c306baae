//! Operations on one block file of the `file` / `hf3fs` backends: create its directories,
//! touch it, free one block of it, probe a directory.
//!
//! Freeing a block punches a hole over `[blkid × size, +size)` with
//! `fallocate(PUNCH_HOLE | KEEP_SIZE)`: the bytes of neighbours sharing the file are not
//! touched. Once `lseek(SEEK_DATA)` finds no data left, the file is unlinked. A file that does
//! not exist has nothing to free (the client may never have written it).

use std::fs::{self, File, OpenOptions};
use std::io::ErrorKind;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::errno::Errno;
use nix::fcntl::{fallocate, FallocateFlags};
use nix::unistd::{lseek, Whence};

use crate::StorageError;

/// Which bytes of a file one block occupies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlockRange {
    /// Byte offset (`blkid × size`).
    pub offset: i64,
    /// Length in bytes.
    pub len: i64,
}

fn io_error(path: &Path, source: std::io::Error) -> StorageError {
    StorageError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Creates the parent directories of `path`.
pub(crate) fn create_parents(path: &Path) -> Result<(), StorageError> {
    match path.parent() {
        Some(parent) => fs::create_dir_all(parent).map_err(|e| io_error(parent, e)),
        None => Ok(()),
    }
}

/// Creates `path` empty if it does not exist (never truncates).
pub(crate) fn touch(path: &Path) -> Result<(), StorageError> {
    let created = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path);
    created.map(drop).map_err(|e| io_error(path, e))
}

/// Frees one block of `path` (`None`: the whole file is the block).
pub(crate) fn free_block(path: &Path, block: Option<BlockRange>) -> Result<(), StorageError> {
    let Some(range) = block else {
        return remove_if_present(path);
    };
    let file = match OpenOptions::new().write(true).open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_error(path, e)),
    };
    let mode = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
    fallocate(&file, mode, range.offset, range.len).map_err(|e| io_error(path, e.into()))?;
    if !has_data(&file).map_err(|e| io_error(path, e.into()))? {
        remove_if_present(path)?;
    }
    Ok(())
}

/// True when some byte of the file is data (not a hole).
fn has_data(file: &File) -> Result<bool, Errno> {
    match lseek(file, 0, Whence::SeekData) {
        Ok(_) => Ok(true),
        Err(Errno::ENXIO) => Ok(false),
        Err(other) => Err(other),
    }
}

fn remove_if_present(path: &Path) -> Result<(), StorageError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(io_error(path, e)),
        _ => Ok(()),
    }
}

/// Fails unless `dir` is a directory in which a file can be created and removed.
pub(crate) fn probe_directory(dir: &Path) -> Result<(), StorageError> {
    static PROBES: AtomicU64 = AtomicU64::new(0);
    let metadata = fs::metadata(dir).map_err(|e| io_error(dir, e))?;
    if !metadata.is_dir() {
        let not_dir = std::io::Error::new(ErrorKind::NotADirectory, "not a directory");
        return Err(io_error(dir, not_dir));
    }
    let probe_number = PROBES.fetch_add(1, Ordering::Relaxed);
    let probe = dir.join(format!(".kvcm-probe-{}-{probe_number}", std::process::id()));
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .map_err(|e| io_error(&probe, e))?;
    fs::remove_file(&probe).map_err(|e| io_error(&probe, e))
}
