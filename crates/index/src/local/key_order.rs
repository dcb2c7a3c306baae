//! The order in which the local index places and scans keys.
//!
//! A key's *position* is a bijective 64-bit mix of the key (murmur3's `fmix64`). Positions
//! spread even sequential keys evenly, so the top `shard_bits` bits of a position choose its
//! shard, and shards hold their entries sorted by position. The whole index is therefore one
//! total order over positions, which is what makes a `u64` scan cursor sufficient.
//!
//! Invariant: `key_at(position_of(k)) == k` for every key.

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

#[cfg(test)]
mod tests {
    use super::*;

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
