//! Cursor scan over the local index.
//!
//! The index is one total order over key positions (see `key_order`), so a cursor is simply
//! the position of the next key to return. Pages cover consecutive, disjoint position ranges:
//! every key present for the whole scan is returned exactly once, whatever writes run between
//! pages; keys added or removed during the scan may or may not appear.
//!
//! Shards are hash maps, so a page reads the positions of one shard at or after the cursor
//! (O(shard size)) and keeps the smallest ones; pages of a few hundred keys amortise that.

use super::key_order::{first_position_of, key_at, shard_of};
use super::locked_shards::read_shard;
use super::shard_map::Shard;
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
        let need = limit - keys.len();
        if need == 0 {
            return Ok(ScanPage {
                keys,
                next: Some(ScanCursor(from)),
            });
        }
        let shard = shard_of(from, shard_bits);
        let mut later: Vec<u64> = {
            let map = read_shard(&shards[shard]);
            map.keys()
                .copied()
                .filter(|&position| position >= from)
                .collect()
        };
        if later.len() > need {
            later.select_nth_unstable(need);
            let next = Some(ScanCursor(later[need]));
            later.truncate(need);
            later.sort_unstable();
            keys.extend(later.into_iter().map(key_at));
            return Ok(ScanPage { keys, next });
        }
        later.sort_unstable();
        keys.extend(later.into_iter().map(key_at));
        match first_position_of(shard + 1, shard_bits) {
            Some(next_shard_start) => from = next_shard_start,
            None => return Ok(ScanPage { keys, next: None }),
        }
    }
}
