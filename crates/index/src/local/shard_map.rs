//! The map inside one shard: key position → value in an insertion-ordered hash map
//! (`IndexMap`), so that a point lookup is one hash probe and the i-th entry (for uniform
//! sampling) is O(1). Deleting swaps the last entry into the hole, keeping entries dense.
//!
//! Hashing is [`super::key_order::MixHasher`]: positions are already mixed.

use std::sync::RwLock;

use indexmap::IndexMap;

use super::key_order::BuildMixHasher;

/// Entries of one shard by key position.
pub(crate) type ShardMap<V> = IndexMap<u64, V, BuildMixHasher>;

/// One shard: its map behind its own lock, alone on its cache lines so that threads working
/// on neighbouring shards do not contend.
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct Shard<V> {
    /// The shard's entries.
    pub map: RwLock<ShardMap<V>>,
}

impl<V> Shard<V> {
    /// An empty shard.
    pub(crate) fn new() -> Self {
        Self {
            map: RwLock::new(ShardMap::default()),
        }
    }
}
