//! A search cache in front of any [`MetaIndex`]: [`CachedIndex`] answers `get` from sharded
//! LRU maps (absent keys are cached too) and forwards everything else to the inner index.
//!
//! Consistency: every write through the cache (`put`, `delete`, `read_modify_write`, whether
//! it succeeds or not) first reaches the inner index, then removes its keys from the cache and
//! bumps the epoch of their cache shards. A `get` that missed remembers the epoch of the key's
//! shard before reading the inner index and fills the cache only if the epoch is unchanged, so
//! a value read before a concurrent write can never be cached after it. Writes that bypass the
//! cache (straight to the inner index) are not seen by it.

mod lru;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use self::lru::Lru;
use crate::{BlockKey, IndexError, MetaIndex, Modify, ScanCursor, ScanPage, MAX_SHARD_BITS};

/// Settings of a [`CachedIndex`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// The cache has `2^shard_bits` LRU shards, each with its own lock; at most
    /// [`MAX_SHARD_BITS`].
    pub shard_bits: u32,
    /// Entries cached in all (split evenly over the shards, rounded up); 0 disables caching.
    pub capacity: usize,
}

/// Hit and miss counts of a [`CachedIndex`] since it was built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheStats {
    /// Keys answered from the cache.
    pub hits: u64,
    /// Keys read from the inner index.
    pub misses: u64,
}

#[derive(Debug)]
struct CacheShard<V> {
    entries: Lru<Option<V>>,
    /// Bumped by every write touching a key of this shard.
    epoch: u64,
}

/// A [`MetaIndex`] that caches the `get` answers of another.
#[derive(Debug)]
pub struct CachedIndex<I, V> {
    inner: I,
    shards: Box<[Mutex<CacheShard<V>>]>,
    shard_bits: u32,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl<I, V: Clone> CachedIndex<I, V> {
    /// Wraps `inner`; fails when `shard_bits` exceeds [`MAX_SHARD_BITS`].
    pub fn new(inner: I, config: CacheConfig) -> Result<Self, IndexError> {
        if config.shard_bits > MAX_SHARD_BITS {
            return Err(IndexError::InvalidArgument(format!(
                "cache shard_bits is {}, at most {MAX_SHARD_BITS} is allowed",
                config.shard_bits
            )));
        }
        let shard_count = 1usize << config.shard_bits;
        let per_shard = config.capacity.div_ceil(shard_count);
        let shard = || CacheShard {
            entries: Lru::new(per_shard),
            epoch: 0,
        };
        let shards = (0..shard_count).map(|_| Mutex::new(shard())).collect();
        Ok(Self {
            inner,
            shards,
            shard_bits: config.shard_bits,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        })
    }

    /// The wrapped index.
    pub fn inner(&self) -> &I {
        &self.inner
    }

    /// Hit and miss counts so far.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
        }
    }

    /// Locks the cache shard of `key` (a cache shard is only ever left consistent, so a
    /// poisoned lock is recovered).
    fn shard_of(&self, key: BlockKey) -> MutexGuard<'_, CacheShard<V>> {
        let mixed = (key as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let shard = mixed.checked_shr(u64::BITS - self.shard_bits).unwrap_or(0) as usize;
        self.shards[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Forgets `keys` and bumps their shards' epochs; runs after every write.
    fn invalidate(&self, keys: impl Iterator<Item = BlockKey>) {
        for key in keys {
            let mut shard = self.shard_of(key);
            shard.entries.remove(key);
            shard.epoch += 1;
        }
    }
}

impl<I: MetaIndex<V>, V: Clone + Send + Sync> MetaIndex<V> for CachedIndex<I, V> {
    fn get(&self, keys: &[BlockKey]) -> Result<Vec<Option<V>>, IndexError> {
        let mut values = Vec::with_capacity(keys.len());
        let mut misses = Vec::new();
        for (index, &key) in keys.iter().enumerate() {
            let mut shard = self.shard_of(key);
            match shard.entries.get(key) {
                Some(cached) => values.push(cached.clone()),
                None => {
                    misses.push((index, shard.epoch));
                    values.push(None);
                }
            }
        }
        self.hits
            .fetch_add((keys.len() - misses.len()) as u64, Ordering::Relaxed);
        if misses.is_empty() {
            return Ok(values);
        }
        self.misses
            .fetch_add(misses.len() as u64, Ordering::Relaxed);
        let missed_keys: Vec<BlockKey> = misses.iter().map(|&(index, _)| keys[index]).collect();
        let fetched = self.inner.get(&missed_keys)?;
        for ((index, epoch), value) in misses.into_iter().zip(fetched) {
            let mut shard = self.shard_of(keys[index]);
            if shard.epoch == epoch {
                shard.entries.insert(keys[index], value.clone());
            }
            values[index] = value;
        }
        Ok(values)
    }

    fn put(&self, entries: Vec<(BlockKey, V)>) -> Result<(), IndexError> {
        let keys: Vec<BlockKey> = entries.iter().map(|(key, _)| *key).collect();
        let result = self.inner.put(entries);
        self.invalidate(keys.into_iter());
        result
    }

    fn delete(&self, keys: &[BlockKey]) -> Result<usize, IndexError> {
        let result = self.inner.delete(keys);
        self.invalidate(keys.iter().copied());
        result
    }

    fn read_modify_write(
        &self,
        keys: &[BlockKey],
        f: &mut dyn FnMut(BlockKey, Option<&V>) -> Modify<V>,
    ) -> Result<(), IndexError> {
        let result = self.inner.read_modify_write(keys, f);
        self.invalidate(keys.iter().copied());
        result
    }

    fn scan(&self, cursor: ScanCursor, limit: usize) -> Result<ScanPage, IndexError> {
        self.inner.scan(cursor, limit)
    }

    fn sample(&self, count: usize) -> Result<Vec<BlockKey>, IndexError> {
        self.inner.sample(count)
    }

    fn len(&self) -> Result<u64, IndexError> {
        self.inner.len()
    }
}

#[cfg(test)]
mod tests;
