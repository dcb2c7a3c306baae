//! Uniform random sampling of the local index.
//!
//! All shards are read-locked (ascending, like writers) so that the draw is over one
//! consistent set of keys; `count` distinct ranks are drawn uniformly from `0..len` and each
//! is mapped to the entry at that offset of its shard (O(1) in a shard map). Every key is
//! equally likely and every subset of `count` keys is equally likely.

use rand::seq::{index, SliceRandom};

use super::key_order::key_at;
use super::locked_shards::read_shard;
use super::shard_map::Shard;
use crate::BlockKey;

/// Up to `count` distinct keys drawn uniformly at random, in random order.
pub(crate) fn sample<V>(shards: &[Shard<V>], count: usize) -> Vec<BlockKey> {
    let maps: Vec<_> = shards.iter().map(read_shard).collect();
    let total: usize = maps.iter().map(|map| map.len()).sum();
    let mut rng = rand::rng();
    let mut ranks = index::sample(&mut rng, total, count.min(total)).into_vec();
    ranks.sort_unstable();

    let mut keys = Vec::with_capacity(ranks.len());
    let mut wanted = ranks.into_iter().peekable();
    let mut shard_start = 0;
    for map in &maps {
        let shard_end = shard_start + map.len();
        while let Some(rank) = wanted.next_if(|&rank| rank < shard_end) {
            if let Some((&position, _)) = map.get_index(rank - shard_start) {
                keys.push(key_at(position));
            }
        }
        shard_start = shard_end;
    }
    drop(maps);
    keys.shuffle(&mut rng);
    keys
}
