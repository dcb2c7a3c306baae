//! Eviction policies behind one trait, [`EvictionPolicy`], shared with the server's reclaimer.
//!
//! Contract every policy meets:
//! - Blocks are dense slot ids ([`BlockId`]); tables grow on demand, so any `u32` works.
//! - [`EvictionPolicy::access`] refreshes a present block, or admits an absent one, evicting
//!   so that `len() <= capacity()` afterwards and pushing every evicted block to `evicted`.
//!   LFU, S3-FIFO, SIEVE and ARC evict resident blocks *before* inserting, so a newcomer never
//!   competes with them; LRU and FIFO give the same result either way. The accessed block
//!   itself may be the one evicted only at capacity 0, by Belady (it is "not admitted" when
//!   its next use is furthest), by leaf-LRU (when it is the only leaf), or by random-LRU
//!   (when every sample draws it).
//! - [`EvictionPolicy::remove`] drops a block without counting it as an eviction.
//! - Nothing here knows about traces: the only per-access knowledge is [`Access`].
//!
//! For the server's reclaimer: give each cached block a stable slot id (its index slot) and
//! keep it for the block's lifetime; policies with ghost entries (S3-FIFO, ARC) remember ids
//! of evicted blocks, so an id reused for another block soon after is seen as a ghost hit.

mod arc;
mod belady;
mod kind;
mod leaf_lru;
mod lfu;
mod list;
mod queue;
mod random_lru;
mod s3fifo;
mod sieve;

pub use arc::Arc;
pub use belady::Belady;
pub use kind::PolicyKind;
pub use leaf_lru::LeafLru;
pub use lfu::Lfu;
pub use queue::{Fifo, Lru};
pub use random_lru::RandomLru;
pub use s3fifo::S3Fifo;
pub use sieve::Sieve;

/// A cache block as policies see it: a dense slot id.
pub type BlockId = u32;

/// What a policy learns about one access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// The block accessed.
    pub block: BlockId,
    /// The block's parent in its prefix tree, if any (used by leaf-aware policies).
    pub parent: Option<BlockId>,
    /// Oracle hint for offline replays: the logical time of the block's next access
    /// (`None` = never again or unknown). Only [`Belady`] reads it; the server passes `None`.
    pub next_use: Option<u64>,
}

impl Access {
    /// An access with no parent and no oracle hint.
    pub fn plain(block: BlockId) -> Access {
        Access {
            block,
            parent: None,
            next_use: None,
        }
    }
}

/// A bounded set of blocks with a rule for which block to evict.
pub trait EvictionPolicy: Send {
    /// Maximum number of blocks held after every call.
    fn capacity(&self) -> usize;
    /// Number of blocks held.
    fn len(&self) -> usize;
    /// Whether no block is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Whether `block` is held.
    fn contains(&self, block: BlockId) -> bool;
    /// Records an access (see the module contract); returns whether the block was held.
    fn access(&mut self, access: Access, evicted: &mut Vec<BlockId>) -> bool;
    /// Drops `block` if held; returns whether it was.
    fn remove(&mut self, block: BlockId) -> bool;
}

/// Grows `table` so that `block` indexes it, filling with `fill`.
pub(crate) fn grow<T: Clone>(table: &mut Vec<T>, block: BlockId, fill: T) {
    let needed = block as usize + 1;
    if table.len() < needed {
        table.resize(needed.max(table.len() * 2), fill);
    }
}

#[cfg(test)]
pub(crate) mod test_util;
