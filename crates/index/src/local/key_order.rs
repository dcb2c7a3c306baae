//! The order in which the local index places and scans keys.
//!
//! A key's *position* is a bijective 64-bit mix of the key (murmur3's `fmix64`). Positions
//! spread even sequential keys evenly, so the top `shard_bits` bits of a position choose its
//! shard, and shards hold their entries sorted by position. The whole index is therefore one
//! total order over positions, which is what makes a `u64` scan cursor sufficient.
//!
//! Invariant: `key_at(position_of(k)) == k` for every key.

use std::hash::{BuildHasherDefault, Hasher};

use crate::BlockKey;

const MIX_1: u64 = 0xff51_afd7_ed55_8ccd;
const MIX_2: u64 = 0xc4ce_b9fe_1a85_ec53;
const UNMIX_1: u64 = inverse_of_odd(MIX_1);
const UNMIX_2: u64 = inverse_of_odd(MIX_2);

/// The multiplicative inverse of an odd number modulo 2^64 (Newton iteration: each step
/// doubles the number of correct low bits, starting from 3).
const fn inverse_of_odd(odd: u64) -> u64 {
    let mut inverse = odd;
    let mut step = 0;
    while step < 5 {
        inverse = inverse.wrapping_mul(2u64.wrapping_sub(odd.wrapping_mul(inverse)));
        step += 1;
    }
    inverse
}

/// `x ^ (x >> 33)` is its own inverse because a second shift by 33 leaves nothing.
fn fold_high(x: u64) -> u64 {
    x ^ (x >> 33)
}

/// Where `key` sits in the index order.
pub(crate) fn position_of(key: BlockKey) -> u64 {
    let x = fold_high(key as u64).wrapping_mul(MIX_1);
    fold_high(fold_high(x).wrapping_mul(MIX_2))
}

/// The key at `position` (inverse of [`position_of`]).
pub(crate) fn key_at(position: u64) -> BlockKey {
    let x = fold_high(fold_high(position).wrapping_mul(UNMIX_2));
    fold_high(x.wrapping_mul(UNMIX_1)) as BlockKey
}

/// The shard (of `1 << shard_bits`) that holds `position`.
pub(crate) fn shard_of(position: u64, shard_bits: u32) -> usize {
    position.checked_shr(u64::BITS - shard_bits).unwrap_or(0) as usize
}

/// The first position of `shard`, or `None` past the last shard.
pub(crate) fn first_position_of(shard: usize, shard_bits: u32) -> Option<u64> {
    if shard >= 1usize << shard_bits {
        return None;
    }
    Some(
        (shard as u64)
            .checked_shl(u64::BITS - shard_bits)
            .unwrap_or(0),
    )
}

/// A hasher for positions and keys: a position (`u64`) is already mixed and is only rotated,
/// because every position of a shard shares its top `shard_bits` bits, which hash tables use
/// as tags; a key (`i64`) is mixed into its position first.
#[derive(Debug, Default, Clone, Copy)]
pub struct MixHasher(u64);

/// Builds [`MixHasher`]s.
pub type BuildMixHasher = BuildHasherDefault<MixHasher>;

impl Hasher for MixHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = position_of((self.0 << 8 | u64::from(byte)) as BlockKey);
        }
    }

    fn write_u64(&mut self, position: u64) {
        self.0 = position.rotate_left(32);
    }

    fn write_i64(&mut self, key: i64) {
        self.write_u64(position_of(key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn positions_of_one_shard_differ_in_the_high_hash_bits() {
        let shard_prefix = 0xABCD_0000_0000_0000u64;
        let low_bits = |n: u64| n.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 16;
        let tag = |n: u64| BuildMixHasher::default().hash_one(shard_prefix | low_bits(n)) >> 57;
        let distinct: std::collections::HashSet<u64> = (0..2_000).map(tag).collect();
        assert_eq!(
            distinct.len(),
            128,
            "every 7-bit tag is used within one shard"
        );
    }

    #[test]
    fn inverses_are_inverses() {
        assert_eq!(MIX_1.wrapping_mul(UNMIX_1), 1);
        assert_eq!(MIX_2.wrapping_mul(UNMIX_2), 1);
    }

    #[test]
    fn key_at_inverts_position_of() {
        for key in [0, 1, -1, 123, i64::MIN, i64::MAX, 0x1234_5678_9abc_def0] {
            assert_eq!(key_at(position_of(key)), key);
        }
    }

    #[test]
    fn sequential_keys_spread_over_shards() {
        let mut per_shard = [0u32; 16];
        for key in 0..16_000 {
            per_shard[shard_of(position_of(key), 4)] += 1;
        }
        assert!(
            per_shard.iter().all(|&n| (800..1200).contains(&n)),
            "{per_shard:?}"
        );
    }

    #[test]
    fn shard_bounds() {
        assert_eq!(shard_of(u64::MAX, 0), 0);
        assert_eq!(shard_of(u64::MAX, 8), 255);
        assert_eq!(first_position_of(0, 0), Some(0));
        assert_eq!(first_position_of(1, 0), None);
        assert_eq!(first_position_of(3, 2), Some(3 << 62));
        assert_eq!(first_position_of(4, 2), None);
    }
}
