//! Cursor scan over the local index.
//!
//! The index is one total order over key positions (see `key_order`), so a cursor is simply
//! the position of the next key to return. Pages cover consecutive, disjoint position ranges:
//! every key present for the whole scan is returned exactly once, whatever writes run between
//! pages; keys added or removed during the scan may or may not appear.

use super::key_order::{first_position_of, key_at, shard_of};
use super::locked_shards::{read_shard, Shard};
use crate::{IndexError, ScanCursor, ScanPage};

/// Up to `limit` keys from `cursor` on, read-locking one shard at a time.
pub(crate) fn scan<V>(
    shards: &[Shard<V>],
    shard_bits: u32,
    cursor: ScanCursor,
    limit: usize,
) -> Result<ScanPage, IndexError> {
    if limit == 0 {
        return Err(IndexError::InvalidArgument(
            "scan limit must be at least 1".to_string(),
        ));
    }
    let mut keys = Vec::with_capacity(limit.min(4096));
    let mut from = cursor.0;
    loop {
        let shard = shard_of(from, shard_bits);
        let map = read_shard(&shards[shard]);
        for &position in map.range(from..).map(|(position, _)| position) {
            if keys.len() == limit {
                let next = Some(ScanCursor(position));
                return Ok(ScanPage { keys, next });
            }
            keys.push(key_at(position));
        }
        drop(map);
        match first_position_of(shard + 1, shard_bits) {
            Some(next_shard_start) => from = next_shard_start,
            None => return Ok(ScanPage { keys, next: None }),
        }
    }
}
