//! Operations on one block file of the `file` / `hf3fs` backends: create its directories,
//! touch it, punch one block out of it, unlink it, probe a directory.
//!
//! Punching a block frees `[blkid × size, +size)` with `fallocate(PUNCH_HOLE | KEEP_SIZE)`:
//! the bytes of neighbours sharing the file are not touched. A file that does not exist has
//! nothing to punch (the client may never have written it). When to unlink a file is the
//! caller's decision (`live_blocks`); these functions only act.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

#[cfg(test)]
use nix::errno::Errno;
use nix::fcntl::{fallocate, FallocateFlags};

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
fn create_parents(path: &Path) -> Result<(), StorageError> {
    match path.parent() {
        Some(parent) => fs::create_dir_all(parent).map_err(|e| io_error(parent, e)),
        None => Ok(()),
    }
}

/// How long a directory seen to exist is trusted without looking again.
const KNOWN_FOR: Duration = Duration::from_secs(1);
/// Directories remembered at most (a storage has one per instance and spec); past it the
/// memory starts afresh.
const MAX_KNOWN: usize = 4096;

/// The parent directories of block files seen to exist in the last [`KNOWN_FOR`]: every
/// block of an instance's spec lies in one directory, and without this memory each
/// allocation would look it up again (a `stat` per block). A directory removed behind
/// kvcm's back is created again once its entry is older than [`KNOWN_FOR`].
#[derive(Debug)]
pub(crate) struct KnownDirs {
    seen: Mutex<HashMap<PathBuf, Instant>>,
    known_for: Duration,
}

impl Default for KnownDirs {
    fn default() -> Self {
        KnownDirs::trusted_for(KNOWN_FOR)
    }
}

impl KnownDirs {
    /// A memory trusting what it saw for `known_for`.
    fn trusted_for(known_for: Duration) -> Self {
        KnownDirs {
            seen: Mutex::default(),
            known_for,
        }
    }

    /// [`create_parents`], skipped while the parent was seen within the trusted time.
    pub(crate) fn create_parents(&self, path: &Path) -> Result<(), StorageError> {
        self.create_parents_at(path, Instant::now())
    }

    /// [`KnownDirs::create_parents`] as of `now`.
    fn create_parents_at(&self, path: &Path, now: Instant) -> Result<(), StorageError> {
        let Some(parent) = path.parent() else {
            return Ok(());
        };
        let fresh = |seen: &Instant| now.saturating_duration_since(*seen) < self.known_for;
        if self.lock().get(parent).is_some_and(fresh) {
            return Ok(());
        }
        create_parents(path)?;
        let mut seen = self.lock();
        if seen.len() >= MAX_KNOWN {
            seen.clear();
        }
        seen.insert(parent.to_path_buf(), now);
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Instant>> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
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

/// Punches the block `range` out of `path` (nothing to do when `path` does not exist).
pub(crate) fn punch_hole(path: &Path, range: BlockRange) -> Result<(), StorageError> {
    let file = match OpenOptions::new().write(true).open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_error(path, e)),
    };
    punch(&file, range).map_err(|e| io_error(path, e.into()))
}

fn punch(file: &File, range: BlockRange) -> nix::Result<()> {
    #[cfg(test)]
    if PUNCH_UNSUPPORTED.get() {
        return Err(Errno::EOPNOTSUPP);
    }
    let mode = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
    fallocate(file, mode, range.offset, range.len)
}

#[cfg(test)]
thread_local! {
    /// Test seam: makes this thread's punches fail as on a mount without hole punching.
    static PUNCH_UNSUPPORTED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Test seam: makes this thread's unlinks fail with `EIO`.
    static UNLINK_FAILS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Test seam: while `failing`, unlinks on this thread fail with `EIO`.
#[cfg(test)]
pub(crate) fn set_unlink_fails(failing: bool) {
    UNLINK_FAILS.set(failing);
}

/// Test seam: while `unsupported`, punches on this thread fail with `EOPNOTSUPP` (as on
/// NFSv3, FUSE or 3FS mounts).
#[cfg(test)]
pub(crate) fn set_punch_unsupported(unsupported: bool) {
    PUNCH_UNSUPPORTED.set(unsupported);
}

/// Unlinks `path`; a missing file is fine.
pub(crate) fn remove_if_present(path: &Path) -> Result<(), StorageError> {
    remove_file(path).map(drop)
}

/// Unlinks `path`: whether it existed.
pub(crate) fn remove_file(path: &Path) -> Result<bool, StorageError> {
    #[cfg(test)]
    if UNLINK_FAILS.get() {
        return Err(io_error(
            path,
            std::io::Error::from_raw_os_error(Errno::EIO as i32),
        ));
    }
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_error(path, e)),
    }
}

/// Subdirectory of a storage's anchor that health probes write in (kvcm's own).
pub(crate) const PROBE_SUBDIR: &str = ".kvcm";

/// Fails unless `dir` is a directory in which a file can be created, written, read back
/// with the same bytes and removed; the probe file is created in kvcm's own subdirectory
/// [`PROBE_SUBDIR`] (created when missing, unless `own_exists`: then a missing one fails the
/// probe), never among other files of `dir`.
pub(crate) fn probe_directory(dir: &Path, own_exists: bool) -> Result<(), StorageError> {
    static PROBES: AtomicU64 = AtomicU64::new(0);
    let metadata = fs::metadata(dir).map_err(|e| io_error(dir, e))?;
    if !metadata.is_dir() {
        let not_dir = std::io::Error::new(ErrorKind::NotADirectory, "not a directory");
        return Err(io_error(dir, not_dir));
    }
    let own = dir.join(PROBE_SUBDIR);
    if !own_exists {
        fs::create_dir_all(&own).map_err(|e| io_error(&own, e))?;
    }
    let probe_number = PROBES.fetch_add(1, Ordering::Relaxed);
    let probe = own.join(format!("probe-{}-{probe_number}", std::process::id()));
    let written = format!("kvcm health probe {probe_number}\n");
    let outcome = write_and_read_back(&probe, written.as_bytes());
    let removed = remove_if_present(&probe);
    outcome.and(removed)
}

/// `dir/.kvcm/id`: a random identity the first probe of a storage writes, which later
/// probes check to tell the storage's file system from a bare mount point.
pub(crate) fn identity_path(dir: &Path) -> PathBuf {
    dir.join(PROBE_SUBDIR).join("id")
}

/// The identity in `dir/.kvcm/id`.
pub(crate) fn read_identity(dir: &Path) -> Result<String, StorageError> {
    let path = identity_path(dir);
    fs::read_to_string(&path)
        .map(|id| id.trim().to_string())
        .map_err(|e| io_error(&path, e))
}

/// The identity in `dir/.kvcm/id`, written first (a random one) when there is none.
pub(crate) fn read_or_create_identity(dir: &Path) -> Result<String, StorageError> {
    let path = identity_path(dir);
    let fresh = format!("{:016x}{:016x}\n", fastrand::u64(..), fastrand::u64(..));
    match write_and_read_back(&path, fresh.as_bytes()) {
        Ok(()) => Ok(fresh.trim().to_string()),
        // Written before (by an earlier probe or process): that identity it is.
        Err(StorageError::Io { source, .. }) if source.kind() == ErrorKind::AlreadyExists => {
            read_identity(dir)
        }
        Err(error) => Err(error),
    }
}

/// Creates `path` with `bytes` and checks that reading it gives them back.
fn write_and_read_back(path: &Path, bytes: &[u8]) -> Result<(), StorageError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| io_error(path, e))?;
    std::io::Write::write_all(&mut file, bytes).map_err(|e| io_error(path, e))?;
    drop(file);
    let read = fs::read(path).map_err(|e| io_error(path, e))?;
    if read != bytes {
        let mismatch = std::io::Error::new(ErrorKind::InvalidData, "read back other bytes");
        return Err(io_error(path, mismatch));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_known_directory_is_trusted_for_a_while_then_looked_at_again() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("instance/tp0");
        let known = KnownDirs::trusted_for(Duration::from_millis(200));
        let seen = Instant::now();
        let at = |ms| seen + Duration::from_millis(ms);
        known
            .create_parents_at(&dir.join("7b"), seen)
            .expect("create");
        assert!(dir.is_dir(), "the parent is created");

        fs::remove_dir(&dir).expect("remove it behind the memory's back");
        known
            .create_parents_at(&dir.join("7c"), at(199))
            .expect("trusted");
        assert!(!dir.exists(), "within the trusted time no lookup is made");

        known
            .create_parents_at(&dir.join("7d"), at(200))
            .expect("create again");
        assert!(
            dir.is_dir(),
            "past the trusted time the directory is created again"
        );
    }
}
