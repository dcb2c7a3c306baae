//! Which blocks of each multi-block file are still allocated, so that a file is unlinked only
//! when the last of them is freed, never while a neighbour is still being written.
//!
//! The `file` / `hf3fs` backends mark a file's block ids live when the file's chunk is
//! allocated and release one id per deleted URI. Releasing an id that is not live (a second
//! delete of the same URI) changes nothing, so a file is kept until every block id it was
//! given has been freed.
//!
//! Invariants:
//! - a tracked file's entry is removed in the same critical section as its unlink, and only
//!   then; an entry with no live id left is a file whose unlink failed and is retried on the
//!   next release;
//! - allocation (directories, touch) and the last release (unlink) of one path run under the
//!   same shard lock, so a file being allocated anew is never unlinked by a stale count.
//!
//! The counts live in memory only: files allocated before a restart are `Untracked` and the
//! caller falls back to judging the file by its own contents.

use std::collections::hash_map::{Entry, HashMap, RandomState};
use std::collections::BTreeSet;
use std::hash::BuildHasher;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Shards of the map: deletes of different files rarely wait for each other.
const SHARD_COUNT: usize = 64;

type Shard = HashMap<PathBuf, BTreeSet<u64>>;

/// What a release left of the file's blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Remaining {
    /// Other blocks of the file are still allocated: keep the file.
    OthersLive,
    /// No block of the file is allocated any more: unlink it.
    None,
    /// The file has no count (allocated before a restart): judge it by its contents.
    Untracked,
}

/// Live block ids per file, in `SHARD_COUNT` mutex-guarded shards keyed by path hash.
#[derive(Debug)]
pub(crate) struct LiveBlocks {
    hasher: RandomState,
    shards: Vec<Mutex<Shard>>,
}

impl Default for LiveBlocks {
    fn default() -> Self {
        Self {
            hasher: RandomState::new(),
            shards: (0..SHARD_COUNT).map(|_| Mutex::default()).collect(),
        }
    }
}

impl LiveBlocks {
    fn shard(&self, path: &Path) -> MutexGuard<'_, Shard> {
        let index = self.hasher.hash_one(path) as usize % SHARD_COUNT;
        // A panic while holding the lock cannot leave a set half-updated in a way that
        // matters: every update is a single insert or remove.
        self.shards[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `create` (directories, touch) under the file's lock and, when it succeeds, marks
    /// `blkids` live. An empty `blkids` (a single-block file) tracks nothing.
    pub(crate) fn allocate<E>(
        &self,
        path: &Path,
        blkids: &[u64],
        create: impl FnOnce() -> Result<(), E>,
    ) -> Result<(), E> {
        let mut shard = self.shard(path);
        create()?;
        if !blkids.is_empty() {
            let live = shard.entry(path.to_path_buf()).or_default();
            live.extend(blkids.iter().copied());
        }
        Ok(())
    }

    /// Frees `blkid` of `path` and calls `finish` with what remains, under the file's lock.
    /// When nothing remains and `finish` succeeds (it unlinked the file), the entry is
    /// dropped; when `finish` fails, the entry stays (empty) so the next release retries.
    pub(crate) fn release<E>(
        &self,
        path: &Path,
        blkid: u64,
        finish: impl FnOnce(Remaining) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut shard = self.shard(path);
        let Entry::Occupied(mut entry) = shard.entry(path.to_path_buf()) else {
            return finish(Remaining::Untracked);
        };
        entry.get_mut().remove(&blkid);
        if !entry.get().is_empty() {
            return finish(Remaining::OthersLive);
        }
        finish(Remaining::None)?;
        entry.remove();
        Ok(())
    }

    /// Number of files with a count (for tests of the no-growth invariant).
    #[cfg(test)]
    pub(crate) fn tracked_files(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.lock().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> Result<(), String> {
        Ok(())
    }

    /// Releases `blkid` and reports what remained (unlink treated as successful).
    fn release(live: &LiveBlocks, path: &str, blkid: u64) -> Remaining {
        let mut seen = None;
        live.release(Path::new(path), blkid, |remaining| {
            seen = Some(remaining);
            ok()
        })
        .expect("finish succeeded");
        seen.expect("finish is always called")
    }

    #[test]
    fn a_file_is_released_once_per_distinct_block() {
        let live = LiveBlocks::default();
        live.allocate(Path::new("/f"), &[0, 1, 2], ok).expect("ok");
        assert_eq!(release(&live, "/f", 0), Remaining::OthersLive);
        assert_eq!(release(&live, "/f", 0), Remaining::OthersLive, "repeat");
        assert_eq!(release(&live, "/f", 7), Remaining::OthersLive, "unknown");
        assert_eq!(release(&live, "/f", 1), Remaining::OthersLive);
        assert_eq!(release(&live, "/f", 2), Remaining::None);
        assert_eq!(live.tracked_files(), 0, "the entry goes with the file");
        assert_eq!(release(&live, "/f", 2), Remaining::Untracked);
    }

    #[test]
    fn unknown_and_single_block_files_are_untracked() {
        let live = LiveBlocks::default();
        live.allocate(Path::new("/single"), &[], ok).expect("ok");
        assert_eq!(live.tracked_files(), 0);
        assert_eq!(release(&live, "/single", 0), Remaining::Untracked);
        assert_eq!(release(&live, "/never", 0), Remaining::Untracked);
    }

    #[test]
    fn a_failed_create_tracks_nothing() {
        let live = LiveBlocks::default();
        let failed = live.allocate(Path::new("/f"), &[0, 1], || Err("no space"));
        assert_eq!(failed, Err("no space"));
        assert_eq!(live.tracked_files(), 0);
    }

    #[test]
    fn a_failed_unlink_keeps_the_entry_for_a_retry() {
        let live = LiveBlocks::default();
        live.allocate(Path::new("/f"), &[0], ok).expect("ok");
        let failed = live.release(Path::new("/f"), 0, |_| Err("EIO"));
        assert_eq!(failed, Err("EIO"));
        assert_eq!(live.tracked_files(), 1);
        assert_eq!(release(&live, "/f", 0), Remaining::None, "retried");
        assert_eq!(live.tracked_files(), 0);
    }

    #[test]
    fn reallocation_adds_to_the_live_blocks() {
        let live = LiveBlocks::default();
        live.allocate(Path::new("/f"), &[0, 1], ok).expect("ok");
        assert_eq!(release(&live, "/f", 0), Remaining::OthersLive);
        live.allocate(Path::new("/f"), &[0, 1], ok).expect("ok");
        assert_eq!(release(&live, "/f", 1), Remaining::OthersLive);
        assert_eq!(release(&live, "/f", 0), Remaining::None);
    }

    #[test]
    fn concurrent_releases_unlink_exactly_once() {
        let live = LiveBlocks::default();
        let blkids: Vec<u64> = (0..64).collect();
        live.allocate(Path::new("/f"), &blkids, ok).expect("ok");
        let unlinks = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for thread in 0..8u64 {
                let (live, unlinks) = (&live, &unlinks);
                scope.spawn(move || {
                    // Each thread frees its 8 ids twice; threads overlap on nothing else.
                    for blkid in (thread * 8..thread * 8 + 8).chain(thread * 8..thread * 8 + 8) {
                        if release(live, "/f", blkid) == Remaining::None {
                            unlinks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(unlinks.into_inner(), 1);
        assert_eq!(live.tracked_files(), 0);
    }
}
