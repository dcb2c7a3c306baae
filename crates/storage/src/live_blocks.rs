//! How many allocations still hold each block of each file, so that a block is punched and a
//! file unlinked only when nobody holds them any more — never while a neighbour, or another
//! allocation of the same block, is still being written.
//!
//! Object names depend on the keys only, so two allocations of the same new keys (two
//! concurrent StartWriteCache calls before either claims the keys) get the same URIs. Each
//! allocation that hands out a URI adds one reference to its (file, blkid) — blkid 0 for a
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
//!   entry with no referenced block is a file whose unlink failed (the backend tries it
//!   again: [`LiveBlocks::finish_unreferenced`]);
//! - allocation (directories, touch) and every release of one file run under the same shard
//!   lock, so a file being allocated anew is never unlinked by a stale count.
//!
//! Files are tracked by their name below the storage's base path (the base is the same for
//! every file of a storage, so it is not stored per file), with the size of their blocks: a
//! block id names a byte range only for one size, so an allocation or adoption of another
//! size is refused while the file is tracked (an instance re-registered under the same id
//! with other spec sizes names the same files; freeing one of the earlier instance's blocks
//! would punch a range inside one of the later's).
//!
//! The counts live in memory; after a restart the journal's recovery adopts every logged
//! block again (one reference each). A file with no count is `Untracked`: not kvcm's.

use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, MutexGuard, PoisonError};

use hashbrown::HashTable;

/// Shards of the map: deletes of different files rarely wait for each other.
const SHARD_COUNT: usize = 64;

/// One tracked file: its name and, per block id, the allocations still holding it.
#[derive(Debug)]
struct FileRecord {
    /// The file's name below the storage's base path.
    name: Box<str>,
    /// The bytes of each of its blocks.
    block_size: u64,
    /// References per block id (dense: block ids are small, 0..blocks per file).
    counts: Box<[u16]>,
}

impl FileRecord {
    fn is_unreferenced(&self) -> bool {
        self.counts.iter().all(|&count| count == 0)
    }
}

/// One slot: the file tracked in it, if any, and how many files it held before (the
/// generation an address must name to reach the current one).
#[derive(Debug, Default)]
struct Slot {
    generation: u16,
    file: Option<FileRecord>,
}

/// The files of one shard: records by slot, and an index of slots by name hash.
#[derive(Debug, Default)]
struct Shard {
    /// The slots.
    files: Vec<Slot>,
    /// Free slots, reused first.
    free: Vec<u32>,
    /// Slots of tracked files, hashed by name.
    by_name: HashTable<u32>,
}

impl Shard {
    /// The slot of the file named `name`.
    fn find(&self, hash: u64, name: &str) -> Option<u32> {
        let files = &self.files;
        let matches = |slot: &u32| {
            let file = files[*slot as usize].file.as_ref();
            file.is_some_and(|f| &*f.name == name)
        };
        self.by_name.find(hash, matches).copied()
    }

    fn record(&mut self, slot: u32) -> &mut FileRecord {
        self.files[slot as usize]
            .file
            .as_mut()
            .expect("an indexed slot holds a record")
    }

    /// The slot a new file would get.
    fn next_slot(&self) -> u32 {
        self.free.last().copied().unwrap_or(self.files.len() as u32)
    }

    /// Tracks a new file in [`Shard::next_slot`].
    fn insert(&mut self, hash: u64, record: FileRecord, hasher: &RandomState) -> u32 {
        let slot = match self.free.pop() {
            Some(slot) => {
                self.files[slot as usize].file = Some(record);
                slot
            }
            None => {
                self.files.push(Slot {
                    generation: 0,
                    file: Some(record),
                });
                (self.files.len() - 1) as u32
            }
        };
        let files = &self.files;
        let rehash = |slot: &u32| {
            let name = files[*slot as usize].file.as_ref().map_or("", |f| &f.name);
            hasher.hash_one(name)
        };
        self.by_name.insert_unique(hash, slot, rehash);
        slot
    }

    /// Stops tracking the file in `slot`.
    fn remove(&mut self, hash: u64, slot: u32) {
        if let Ok(entry) = self.by_name.find_entry(hash, |s| *s == slot) {
            entry.remove();
        }
        let freed = &mut self.files[slot as usize];
        freed.file = None;
        freed.generation = freed.generation.wrapping_add(1);
        self.free.push(slot);
    }
}

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

/// Block references per file, in `SHARD_COUNT` mutex-guarded shards keyed by name hash.
/// Each tracked file has a small id (`slot * SHARD_COUNT + shard`), stable while it is
/// tracked and reused after its file is released.
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

fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

impl LiveBlocks {
    /// The name's hash and shard.
    fn place(&self, name: &str) -> (u64, usize) {
        let hash = self.hasher.hash_one(name);
        (hash, (hash >> 32) as usize % SHARD_COUNT)
    }

    /// Runs `create` (directories, touch; told whether the file is tracked already) and adds
    /// one reference to each of `blkids` (blocks of `block_size` bytes) of the file `name`,
    /// under its shard lock; returns the file's id and generation. A failed `create`, counts
    /// that would overflow, or a file tracked with blocks of another size, track nothing new.
    pub(crate) fn allocate<E: From<TooManyReferences> + From<OtherBlockSize>>(
        &self,
        name: &str,
        blkids: &[u64],
        block_size: u64,
        create: impl FnOnce(bool) -> Result<(), E>,
    ) -> Result<(u32, u16), E> {
        let (hash, index) = self.place(name);
        let mut shard = lock(&self.shards[index]);
        let found = shard.find(hash, name);
        let current = found.and_then(|slot| shard.files[slot as usize].file.as_ref());
        if let Some(file) = current.filter(|file| file.block_size != block_size) {
            return Err(E::from(OtherBlockSize {
                name: name.to_string(),
                tracked: file.block_size,
                asked: block_size,
            }));
        }
        let current = current.map(|file| &*file.counts);
        let counts = add_references(current.unwrap_or(&[]), blkids)?;
        let slot = found.unwrap_or_else(|| shard.next_slot());
        file_id(slot, index)?;
        create(found.is_some())?;
        match found {
            Some(slot) => shard.record(slot).counts = counts,
            None => {
                let record = FileRecord {
                    name: name.into(),
                    block_size,
                    counts,
                };
                shard.insert(hash, record, &self.hasher);
            }
        }
        let generation = shard.files[slot as usize].generation;
        Ok((file_id(slot, index)?, generation))
    }

    /// Drops one reference to `blkid` of the file `name` and calls `finish` with what
    /// remained, under its shard lock. A file's record goes (with its id) only when `finish`
    /// succeeded on `FileFreed`.
    pub(crate) fn release<E>(
        &self,
        name: &str,
        blkid: u64,
        finish: impl FnOnce(Remaining) -> Result<(), E>,
    ) -> Result<(), E> {
        let (hash, index) = self.place(name);
        let mut shard = lock(&self.shards[index]);
        let Some(slot) = shard.find(hash, name) else {
            return finish(Remaining::Untracked);
        };
        let record = shard.record(slot);
        let block = drop_reference(&mut record.counts, blkid);
        if !record.is_unreferenced() {
            return finish(block);
        }
        finish(Remaining::FileFreed)?;
        shard.remove(hash, slot);
        Ok(())
    }

    /// Calls `finish` for the file `name` if it is still tracked with no block held (its
    /// unlink failed on the release that freed it) and stops tracking it when `finish`
    /// succeeds; `Ok(false)` without calling it when there is nothing to finish (the file is
    /// not tracked, or an allocation took a block of it again).
    pub(crate) fn finish_unreferenced<E>(
        &self,
        name: &str,
        finish: impl FnOnce() -> Result<(), E>,
    ) -> Result<bool, E> {
        let (hash, index) = self.place(name);
        let mut shard = lock(&self.shards[index]);
        let Some(slot) = shard.find(hash, name) else {
            return Ok(false);
        };
        if !shard.record(slot).is_unreferenced() {
            return Ok(false);
        }
        finish()?;
        shard.remove(hash, slot);
        Ok(true)
    }

    /// Calls `with` on the name of the file tracked under `id` in `generation` (`None` when
    /// that file is no longer tracked, even if another file now has the id).
    pub(crate) fn with_name<T>(
        &self,
        id: u32,
        generation: u16,
        with: impl FnOnce(&str) -> T,
    ) -> Option<T> {
        let id = id as usize;
        let shard = lock(self.shards.get(id % SHARD_COUNT)?);
        let slot = shard.files.get(id / SHARD_COUNT)?;
        let file = slot
            .file
            .as_ref()
            .filter(|_| slot.generation == generation)?;
        Some(with(&file.name))
    }

    /// Number of files tracked.
    #[cfg(test)]
    pub(crate) fn tracked_files(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| lock(shard).by_name.len())
            .sum()
    }
}

/// A block would be held by more allocations than a count can say (65 535), or a file id
/// does not fit 32 bits; nothing changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TooManyReferences;

/// The file is tracked with blocks of `tracked` bytes, not `asked`; nothing changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OtherBlockSize {
    pub name: String,
    pub tracked: u64,
    pub asked: u64,
}

/// `counts` with one more reference per block id.
fn add_references(counts: &[u16], blkids: &[u64]) -> Result<Box<[u16]>, TooManyReferences> {
    let mut updated = counts.to_vec();
    for &blkid in blkids {
        let index = usize::try_from(blkid).map_err(|_| TooManyReferences)?;
        if updated.len() <= index {
            updated.resize(index + 1, 0);
        }
        updated[index] = updated[index].checked_add(1).ok_or(TooManyReferences)?;
    }
    Ok(updated.into_boxed_slice())
}

/// The id of a file in `slot` of shard `shard`.
fn file_id(slot: u32, shard: usize) -> Result<u32, TooManyReferences> {
    let id = slot as usize * SHARD_COUNT + shard;
    u32::try_from(id).map_err(|_| TooManyReferences)
}

fn drop_reference(counts: &mut [u16], blkid: u64) -> Remaining {
    let Some(count) = usize::try_from(blkid)
        .ok()
        .and_then(|index| counts.get_mut(index))
        .filter(|count| **count > 0)
    else {
        return Remaining::BlockHeld;
    };
    *count -= 1;
    if *count > 0 {
        return Remaining::BlockHeld;
    }
    Remaining::BlockFreed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StorageError;

    fn ok() -> Result<(), StorageError> {
        Ok(())
    }

    fn created(_tracked: bool) -> Result<(), StorageError> {
        Ok(())
    }

    /// Releases `blkid` and reports what remained (unlink treated as successful).
    fn release(live: &LiveBlocks, path: &str, blkid: u64) -> Remaining {
        let mut seen = None;
        live.release(path, blkid, |remaining| {
            seen = Some(remaining);
            ok()
        })
        .expect("finish succeeded");
        seen.expect("finish is always called")
    }

    #[test]
    fn a_tracked_file_refuses_blocks_of_another_size_and_keeps_its_counts() {
        let live = LiveBlocks::default();
        live.allocate("/f", &[0], 100, created).expect("ok");
        let refused = live.allocate("/f", &[1], 200, created);
        assert!(matches!(refused, Err(StorageError::Full(why)) if why.contains("100 bytes")));
        assert_eq!(
            release(&live, "/f", 1),
            Remaining::BlockHeld,
            "block 1 was not taken"
        );
        assert_eq!(release(&live, "/f", 0), Remaining::FileFreed);
        live.allocate("/f", &[1], 200, created)
            .expect("free again: any size");
    }

    #[test]
    fn a_file_is_released_once_per_held_block() {
        let live = LiveBlocks::default();
        live.allocate("/f", &[0, 1, 2], 100, created).expect("ok");
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
        live.allocate("/f", &[0, 1], 100, created).expect("winner");
        live.allocate("/f", &[0, 1], 100, created).expect("loser");
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
        live.allocate("/single", &[0], 100, created).expect("a");
        live.allocate("/single", &[0], 100, created).expect("b");
        assert_eq!(release(&live, "/single", 0), Remaining::BlockHeld);
        assert_eq!(release(&live, "/single", 0), Remaining::FileFreed);
        assert_eq!(live.tracked_files(), 0);
    }

    #[test]
    fn files_without_a_count_are_untracked() {
        let live = LiveBlocks::default();
        assert_eq!(release(&live, "/never", 0), Remaining::Untracked);
    }

    #[test]
    fn a_failed_create_tracks_nothing() {
        let live = LiveBlocks::default();
        let failed = live.allocate("/f", &[0, 1], 100, |_| {
            Err(StorageError::InvalidRequest("no space".into()))
        });
        assert!(matches!(failed, Err(StorageError::InvalidRequest(_))));
        assert_eq!(live.tracked_files(), 0);
    }

    #[test]
    fn a_failed_unlink_keeps_the_entry_for_a_retry() {
        let live = LiveBlocks::default();
        live.allocate("/f", &[0], 100, created).expect("ok");
        let failed = live.release("/f", 0, |_| Err("EIO"));
        assert_eq!(failed, Err("EIO"));
        assert_eq!(live.tracked_files(), 1);
        assert_eq!(release(&live, "/f", 0), Remaining::FileFreed, "retried");
        assert_eq!(live.tracked_files(), 0);
    }

    #[test]
    fn reallocation_adds_references() {
        let live = LiveBlocks::default();
        live.allocate("/f", &[0, 1], 100, created).expect("ok");
        assert_eq!(release(&live, "/f", 0), Remaining::BlockFreed);
        live.allocate("/f", &[0, 1], 100, created).expect("ok");
        assert_eq!(release(&live, "/f", 1), Remaining::BlockHeld);
        assert_eq!(release(&live, "/f", 0), Remaining::BlockFreed);
        assert_eq!(release(&live, "/f", 1), Remaining::FileFreed);
    }

    #[test]
    fn a_reused_id_does_not_render_the_old_file() {
        let live = LiveBlocks::default();
        let (id, generation) = live.allocate("/old", &[0], 100, created).expect("old");
        assert_eq!(release(&live, "/old", 0), Remaining::FileFreed);
        // Some new file lands in the freed slot (1 in 64 names share its shard).
        let reused = (0..10_000)
            .map(|i| format!("/new{i}"))
            .find_map(|name| {
                let placed = live.allocate(&name, &[0], 100, created).expect("new");
                (placed.0 == id).then_some((name, placed.1))
            })
            .expect("a new file reused the id");
        assert_ne!(reused.1, generation, "a new generation");
        assert_eq!(live.with_name(id, generation, str::to_string), None);
        assert_eq!(live.with_name(id, reused.1, str::to_string), Some(reused.0));
    }

    #[test]
    fn concurrent_releases_unlink_exactly_once() {
        let live = LiveBlocks::default();
        let blkids: Vec<u64> = (0..64).collect();
        live.allocate("/f", &blkids, 100, created).expect("ok");
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
