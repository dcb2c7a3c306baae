//! Every storage incarnation ever registered, by handle: an append-only table that readers
//! use without a lock. Handles are 16-bit and never reused (at most 65,536 incarnations per
//! process life); the table grows in chunks of 256 slots, allocated on first use.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use super::entry::StorageHandle;
use super::storages::Incarnation;

/// Slots per chunk.
const CHUNK: usize = 256;
/// Chunks (CHUNK × CHUNKS = 65,536 handles).
const CHUNKS: usize = (u16::MAX as usize + 1) / CHUNK;

/// One chunk of slots, each set once.
type Chunk = Box<[OnceLock<Incarnation>]>;

/// The incarnations by handle.
#[derive(Debug)]
pub struct IncarnationTable {
    chunks: Box<[OnceLock<Chunk>]>,
    /// Handles given out so far.
    len: AtomicUsize,
}

impl Default for IncarnationTable {
    fn default() -> Self {
        IncarnationTable {
            chunks: (0..CHUNKS).map(|_| OnceLock::new()).collect(),
            len: AtomicUsize::new(0),
        }
    }
}

impl IncarnationTable {
    /// The incarnation behind a handle.
    pub fn get(&self, handle: StorageHandle) -> Option<&Incarnation> {
        let index = usize::from(handle.0);
        self.chunks[index / CHUNK].get()?[index % CHUNK].get()
    }

    /// Handles given out so far.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// The handles of the incarnations for which `wanted` holds.
    pub fn handles_where(&self, wanted: impl Fn(&Incarnation) -> bool) -> Vec<StorageHandle> {
        (0..self.len())
            .filter_map(|index| u16::try_from(index).ok().map(StorageHandle))
            .filter(|&handle| self.get(handle).is_some_and(&wanted))
            .collect()
    }

    /// The handle the next [`Incarnations::push`] returns (`None` once they are used up).
    pub fn next_handle(&self) -> Option<StorageHandle> {
        let index = self.len.load(Ordering::Acquire);
        u16::try_from(index).ok().map(StorageHandle)
    }

    /// Stores a new incarnation under the next handle; `None` when every handle is taken.
    /// Callers serialise pushes (the storage table's write lock).
    pub fn push(&self, incarnation: Incarnation) -> Option<StorageHandle> {
        let index = self.len.load(Ordering::Acquire);
        let handle = StorageHandle(u16::try_from(index).ok()?);
        let chunk = self.chunks[index / CHUNK]
            .get_or_init(|| (0..CHUNK).map(|_| OnceLock::new()).collect());
        chunk[index % CHUNK].set(incarnation).ok()?;
        self.len.store(index + 1, Ordering::Release);
        Some(handle)
    }
}
