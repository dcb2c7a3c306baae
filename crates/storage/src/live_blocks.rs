//! How many allocations still hold each block of each file, so that a block is punched and a
//! file unlinked only when nobody holds them any more — never while a neighbour, or another
//! allocation of the same block, is still being written.
//!
//! Object names depend on the keys only, so two allocations of the same new keys (two
//! concurrent StartWriteCache calls before either claims the keys) get the same URIs. Each
//! allocation that hands out a URI adds one reference to its (path, blkid) — blkid 0 for a
//! single-block file — and each delete of that URI removes one.
//!
//! The rule: **each allocation of a URI is released by exactly one delete.** A delete of a
//! block with no reference left changes nothing (no underflow, nothing punched), so a repeat
//! delete cannot free a block another allocation holds while that allocation's count is
//! still there.
//!
//! Invariants:
//! - a block's count and the punch of its hole change under the same shard lock; a tracked
//!   file's entry is removed in the same critical section as its unlink, and only then; an
//!   entry with no referenced block is a file whose unlink failed, retried on the next
//!   release;
//! - allocation (directories, touch) and every release of one path run under the same shard
//!   lock, so a file being allocated anew is never unlinked by a stale count.
//!
//! The counts live in memory only: files allocated before a restart are `Untracked` and the
//! caller falls back to judging the file by its own contents.

use std::collections::hash_map::{Entry, HashMap, RandomState};
use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Shards of the map: deletes of different files rarely wait for each other.
const SHARD_COUNT: usize = 64;

/// Per file: the allocations still holding each block id (never 0: a freed id is removed).
type Shard = HashMap<PathBuf, BTreeMap<u64, u64>>;

/// What a release left of the block and its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Remaining {
    /// The block is still held by another allocation, or was held by none: touch nothing.
    BlockHeld,
    /// The last holder of the block let go, other blocks of the file are held: punch it.
    BlockFreed,
    /// No block of the file is held any more: unlink it.
    FileFreed,
    /// The file has no count (allocated before a restart): judge it by its contents.
    Untracked,
}

/// Block references per file, in `SHARD_COUNT` mutex-guarded shards keyed by path hash.
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
        // A panic while holding the lock cannot leave a count half-updated in a way that
        // matters: every update is a single increment, decrement or remove.
        self.shards[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `create` (directories, touch) under the file's lock and, when it succeeds, adds
    /// one reference to each of `blkids` (a single-block file passes `[0]`).
    pub(crate) fn allocate<E>(
        &self,
        path: &Path,
        blkids: &[u64],
        create: impl FnOnce() -> Result<(), E>,
    ) -> Result<(), E> {
        let mut shard = self.shard(path);
        create()?;
        if !blkids.is_empty() {
            let counts = shard.entry(path.to_path_buf()).or_default();
            for &blkid in blkids {
                *counts.entry(blkid).or_default() += 1;
            }
        }
        Ok(())
    }

    /// Drops one reference to `blkid` of `path` (none left: nothing changes) and calls
    /// `finish` with what remains, under the file's lock. When no block is held and `finish`
    /// succeeds (it unlinked the file), the entry is dropped; when `finish` fails, the entry
    /// stays (empty) so the next release retries.
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
        let block = drop_reference(entry.get_mut(), blkid);
        if !entry.get().is_empty() {
            return finish(block);
        }
        finish(Remaining::FileFreed)?;
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

/// Drops one reference to `blkid`: `BlockFreed` when it was the last, else `BlockHeld`.
fn drop_reference(counts: &mut BTreeMap<u64, u64>, blkid: u64) -> Remaining {
    let Some(count) = counts.get_mut(&blkid) else {
        return Remaining::BlockHeld;
    };
    *count -= 1;
    if *count > 0 {
        return Remaining::BlockHeld;
    }
    counts.remove(&blkid);
    Remaining::BlockFreed
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
    fn a_file_is_released_once_per_held_block() {
        let live = LiveBlocks::default();
        live.allocate(Path::new("/f"), &[0, 1, 2], ok).expect("ok");
        assert_eq!(release(&live, "/f", 0), Remaining::BlockFreed);
        assert_eq!(release(&live, "/f", 0), Remaining::BlockHeld, "repeat");
        assert_eq!(release(&live, "/f", 7), Remaining::BlockHeld, "unknown");
        assert_eq!(release(&live, "/f", 1), Remaining::BlockFreed);
        assert_eq!(release(&live, "/f", 2), Remaining::FileFreed);
        assert_eq!(live.tracked_files(), 0, "the entry goes with the file");
        assert_eq!(release(&live, "/f", 2), Remaining::Untracked);
    }

    #[test]
    fn each_allocation_of_a_block_is_released_by_one_delete() {
        let live = LiveBlocks::default();
        live.allocate(Path::new("/f"), &[0, 1], ok).expect("winner");
        live.allocate(Path::new("/f"), &[0, 1], ok).expect("loser");
        assert_eq!(release(&live, "/f", 0), Remaining::BlockHeld, "loser");
        assert_eq!(release(&live, "/f", 1), Remaining::BlockHeld, "loser");
        assert_eq!(release(&live, "/f", 0), Remaining::BlockFreed, "winner");
        // One delete too many must not underflow nor free block 1, still held by the winner.
        assert_eq!(release(&live, "/f", 0), Remaining::BlockHeld, "extra");
        assert_eq!(release(&live, "/f", 1), Remaining::FileFreed, "winner");
    }

    #[test]
    fn single_block_files_count_as_block_zero() {
        let live = LiveBlocks::default();
        live.allocate(Path::new("/single"), &[0], ok).expect("a");
        live.allocate(Path::new("/single"), &[0], ok).expect("b");
        assert_eq!(release(&live, "/single", 0), Remaining::BlockHeld);
        assert_eq!(release(&live, "/single", 0), Remaining::FileFreed);
        assert_eq!(live.tracked_files(), 0);
    }

    #[test]
    fn files_without_a_count_are_untracked() {
        let live = LiveBlocks::default();
        live.allocate(Path::new("/none"), &[], ok).expect("ok");
        assert_eq!(live.tracked_files(), 0);
        assert_eq!(release(&live, "/none", 0), Remaining::Untracked);
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
        assert_eq!(release(&live, "/f", 0), Remaining::FileFreed, "retried");
        assert_eq!(live.tracked_files(), 0);
    }

    #[test]
    fn reallocation_adds_references() {
        let live = LiveBlocks::default();
        live.allocate(Path::new("/f"), &[0, 1], ok).expect("ok");
        assert_eq!(release(&live, "/f", 0), Remaining::BlockFreed);
        live.allocate(Path::new("/f"), &[0, 1], ok).expect("ok");
        assert_eq!(release(&live, "/f", 1), Remaining::BlockHeld);
        assert_eq!(release(&live, "/f", 0), Remaining::BlockFreed);
        assert_eq!(release(&live, "/f", 1), Remaining::FileFreed);
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
                        if release(live, "/f", blkid) == Remaining::FileFreed {
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
