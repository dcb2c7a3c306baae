//! A search cache in front of any [`MetaIndex`]: [`CachedIndex`] answers `get` from sharded
//! LRU maps (absent keys are cached too) and forwards everything else to the inner index.
//!
//! Consistency: every write through the cache (`put`, `delete`, `read_modify_write`, whether
//! it succeeds or not) opens a write window on its keys before it reaches the inner index and
//! closes it after (also on panic): opening and closing each remove the keys from the cache and
//! bump the epoch of their cache shards; while a window is open on a shard, no `get` fills
//! that shard. A `get` that missed remembers the epoch of the key's shard before reading the
//! inner index and fills the cache only if the epoch is unchanged and no write is in flight on
//! the shard. So a value read before or during a write is never cached, and while a write is
//! in flight every reader of its keys goes to the inner index: once one reader has seen the
//! new value, no later reader gets the old one from the cache. Writes that bypass the cache
//! (straight to the inner index) are not seen by it.

mod lru;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use self::lru::Lru;
use crate::{
    BatchesStopped, BlockKey, IndexError, MetaIndex, Modify, ScanCursor, ScanPage, MAX_SHARD_BITS,
};

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
    /// Bumped when a write touching a key of this shard begins and when it ends.
    epoch: u64,
    /// Writes through the cache in flight on keys of this shard (one per key): no fill while
    /// any.
    writers: u64,
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
            writers: 0,
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

    /// Forgets `keys`, bumps their shards' epochs and marks a write on them in flight until
    /// the returned window is dropped (which does the same again and ends the write).
    fn open_write_window(&self, keys: Vec<BlockKey>) -> WriteWindow<'_, I, V> {
        for &key in &keys {
            let mut shard = self.shard_of(key);
            shard.entries.remove(key);
            shard.epoch += 1;
            shard.writers += 1;
        }
        WriteWindow { cache: self, keys }
    }
}

impl<I, V> CachedIndex<I, V> {
    /// Locks the cache shard of `key` (a cache shard is only ever left consistent, so a
    /// poisoned lock is recovered).
    fn shard_of(&self, key: BlockKey) -> MutexGuard<'_, CacheShard<V>> {
        let mixed = (key as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let shard = mixed.checked_shr(u64::BITS - self.shard_bits).unwrap_or(0) as usize;
        self.shards[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// A write through the cache in flight on `keys`; dropping it (after the inner write, or on
/// unwinding) forgets the keys again, bumps their epochs and ends the write.
struct WriteWindow<'a, I, V> {
    cache: &'a CachedIndex<I, V>,
    keys: Vec<BlockKey>,
}

impl<I, V> Drop for WriteWindow<'_, I, V> {
    fn drop(&mut self) {
        for &key in &self.keys {
            let mut shard = self.cache.shard_of(key);
            shard.entries.remove(key);
            shard.epoch += 1;
            shard.writers -= 1;
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
            if shard.epoch == epoch && shard.writers == 0 {
                shard.entries.insert(keys[index], value.clone());
            }
            values[index] = value;
        }
        Ok(values)
    }

    fn put(&self, entries: Vec<(BlockKey, V)>) -> Result<(), IndexError> {
        let _window = self.open_write_window(entries.iter().map(|(key, _)| *key).collect());
        self.inner.put(entries)
    }

    fn delete(&self, keys: &[BlockKey]) -> Result<usize, IndexError> {
        let _window = self.open_write_window(keys.to_vec());
        self.inner.delete(keys)
    }

    fn read_modify_write(
        &self,
        keys: &[BlockKey],
        f: &mut dyn FnMut(BlockKey, Option<&V>) -> Modify<V>,
    ) -> Result<(), IndexError> {
        let _window = self.open_write_window(keys.to_vec());
        self.inner.read_modify_write(keys, f)
    }

    fn read_modify_write_batches(
        &self,
        batches: &[Vec<BlockKey>],
        f: &mut dyn FnMut(BlockKey, Option<&V>) -> Modify<V>,
    ) -> Result<(), BatchesStopped> {
        let _window = self.open_write_window(batches.concat());
        self.inner.read_modify_write_batches(batches, f)
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

    fn lock_group(&self, key: BlockKey) -> usize {
        self.inner.lock_group(key)
    }
}

#[cfg(test)]
mod tests;
