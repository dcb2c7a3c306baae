//! The map inside one shard: key position → value in an insertion-ordered hash map
//! (`IndexMap`), so that a point lookup is one hash probe and the i-th entry (for uniform
//! sampling) is O(1). Deleting swaps the last entry into the hole, keeping entries dense.
//!
//! Positions are already uniformly mixed, so the hasher only rotates them: every position of a
//! shard shares its top `shard_bits` bits, which the hash table must not rely on.

use std::hash::{BuildHasherDefault, Hasher};
use std::sync::RwLock;

use indexmap::IndexMap;

/// Hashes a key position by rotating it (positions are already well mixed).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PositionHasher(u64);

impl Hasher for PositionHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u64(&mut self, position: u64) {
        self.0 = position.rotate_left(32);
    }
}

/// Entries of one shard by key position.
pub(crate) type ShardMap<V> = IndexMap<u64, V, BuildHasherDefault<PositionHasher>>;

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn positions_of_one_shard_differ_in_the_high_hash_bits() {
        let build = BuildHasherDefault::<PositionHasher>::default();
        let shard_prefix = 0xABCD_0000_0000_0000u64;
        let low_bits = |n: u64| n.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 16;
        let tag = |n: u64| build.hash_one(shard_prefix | low_bits(n)) >> 57;
        let distinct: std::collections::HashSet<u64> = (0..2_000).map(tag).collect();
        assert_eq!(
            distinct.len(),
            128,
            "every 7-bit tag is used within one shard"
        );
    }
}
