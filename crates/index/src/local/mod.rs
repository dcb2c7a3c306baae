//! The local (embedded) index: the key space in `2^shard_bits` shards, each a hash map
//! (see `shard_map`) behind its own `RwLock`.
//!
//! - Reads group their keys by shard and read-lock one shard at a time.
//! - Writes (`put`, `delete`, `read_modify_write`) lock every shard of the batch for writing,
//!   in ascending shard order (no deadlock), stage a [`WriteBatch`] and apply it in
//!   [`LocalIndex::commit`], the single place every mutation goes through.
//! - The key count is kept in an atomic that changes only inside `commit`, under the locks of
//!   the shards it accounts for, so it never exceeds `max_key_count`.
//! - With a [`ChangeLog`] attached, `commit` appends the batch after the cap check and before
//!   memory changes; the write waits for the log's durability after the locks are released.
//!
//! Within one `read_modify_write` the closure is called once per key occurrence, in request
//! order, and sees the effect of the earlier calls of the same batch (a key listed twice is
//! modified twice, as if the calls ran one after the other).

mod key_order;
mod locked_shards;
mod sample;
mod scan;
mod shard_map;
mod write_batch;

use std::sync::atomic::{AtomicU64, Ordering};

use self::key_order::position_of;
pub use self::key_order::BuildMixHasher;
use self::locked_shards::{group_by_shard, read_shard, LockedShards};
use self::shard_map::Shard;
use self::write_batch::{Mutation, WriteBatch};
use crate::{
    BatchesStopped, BlockKey, ChangeLog, IndexError, LogTicket, MetaIndex, Modify, ScanCursor,
    ScanPage,
};
use std::sync::Arc;

/// The largest accepted `shard_bits` (65 536 shards).
pub const MAX_SHARD_BITS: u32 = 16;

/// Settings of a [`LocalIndex`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalIndexConfig {
    /// The index has `2^shard_bits` shards; at most [`MAX_SHARD_BITS`].
    pub shard_bits: u32,
    /// Writes that would store more keys than this fail with [`IndexError::Full`];
    /// `u64::MAX` for no cap.
    pub max_key_count: u64,
}

impl Default for LocalIndexConfig {
    /// 256 shards, no key cap.
    fn default() -> Self {
        Self {
            shard_bits: 8,
            max_key_count: u64::MAX,
        }
    }
}

/// The in-memory sharded index.
pub struct LocalIndex<V> {
    shards: Box<[Shard<V>]>,
    config: LocalIndexConfig,
    key_count: AtomicU64,
    log: Option<Arc<dyn ChangeLog<V>>>,
}

impl<V> std::fmt::Debug for LocalIndex<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalIndex")
            .field("config", &self.config)
            .field("key_count", &self.key_count)
            .field("logged", &self.log.is_some())
            .finish_non_exhaustive()
    }
}

impl<V> LocalIndex<V> {
    /// An empty index; fails when `shard_bits` exceeds [`MAX_SHARD_BITS`].
    pub fn new(config: LocalIndexConfig) -> Result<Self, IndexError> {
        if config.shard_bits > MAX_SHARD_BITS {
            return Err(IndexError::InvalidArgument(format!(
                "shard_bits is {}, at most {MAX_SHARD_BITS} is allowed",
                config.shard_bits
            )));
        }
        let shards = (0..1usize << config.shard_bits)
            .map(|_| Shard::new())
            .collect();
        Ok(Self {
            shards,
            config,
            key_count: AtomicU64::new(0),
            log: None,
        })
    }

    /// An empty index whose committed batches are appended to `log`.
    pub fn with_log(
        config: LocalIndexConfig,
        log: Arc<dyn ChangeLog<V>>,
    ) -> Result<Self, IndexError> {
        Ok(Self {
            log: Some(log),
            ..Self::new(config)?
        })
    }

    /// The settings this index was built with.
    pub fn config(&self) -> LocalIndexConfig {
        self.config
    }

    /// Locks the shards of `keys`, lets `decide` choose each key's fate, commits, and waits
    /// for the change log.
    fn write(
        &self,
        keys: &[BlockKey],
        decide: &mut dyn FnMut(BlockKey, Option<&V>) -> Modify<V>,
    ) -> Result<(), IndexError> {
        let ticket = self.write_unwaited(keys, decide)?;
        self.wait_durable(ticket)
    }

    /// Returns once the append of `ticket` is durable (at once without a log or a ticket).
    fn wait_durable(&self, ticket: Option<LogTicket>) -> Result<(), IndexError> {
        match (ticket, &self.log) {
            (Some(ticket), Some(log)) => log.wait_durable(ticket),
            _ => Ok(()),
        }
    }

    /// [`LocalIndex::write`] up to its append to the change log, whose ticket it returns
    /// (`None`: nothing changed or no log) with the locks released.
    fn write_unwaited(
        &self,
        keys: &[BlockKey],
        decide: &mut dyn FnMut(BlockKey, Option<&V>) -> Modify<V>,
    ) -> Result<Option<LogTicket>, IndexError> {
        let mut locked = LockedShards::lock(&self.shards, keys, self.config.shard_bits);
        let mut batch = WriteBatch::with_capacity(keys.len());
        for &key in keys {
            let (modify, stored_before) = match batch.staged(key) {
                Some(staged) => (decide(key, staged), true),
                None => {
                    let stored = locked.get(key)?;
                    (decide(key, stored), stored.is_some())
                }
            };
            match modify {
                Modify::Keep => {}
                Modify::Put(value) => batch.record(key, Mutation::Put(value), stored_before),
                Modify::Delete => batch.record(key, Mutation::Delete, stored_before),
            }
        }
        self.commit(&mut locked, batch)
    }

    /// Applies a staged batch to its locked shards: the one place every mutation goes through.
    /// Checks the key cap, then appends the batch to the change log (its ticket is returned);
    /// on `Full` or a refused append nothing changes.
    fn commit(
        &self,
        locked: &mut LockedShards<'_, V>,
        batch: WriteBatch<V>,
    ) -> Result<Option<LogTicket>, IndexError> {
        let (added, removed) = batch.key_count_change();
        self.reserve(added, removed)?;
        let ticket = match (&self.log, batch.is_empty()) {
            (Some(log), false) => match log.append(&batch.changes()) {
                Ok(ticket) => Some(ticket),
                Err(error) => {
                    self.unreserve(added, removed);
                    return Err(error);
                }
            },
            _ => None,
        };
        for (key, mutation) in batch.into_records() {
            locked.apply(key, mutation)?;
        }
        Ok(ticket)
    }

    /// Undoes [`LocalIndex::reserve`] of a batch that was refused after it.
    fn unreserve(&self, added: u64, removed: u64) {
        if added >= removed {
            self.key_count.fetch_sub(added - removed, Ordering::AcqRel);
        } else {
            self.key_count.fetch_add(removed - added, Ordering::AcqRel);
        }
    }

    /// Moves the key count by `added - removed`, refusing to pass `max_key_count`.
    fn reserve(&self, added: u64, removed: u64) -> Result<(), IndexError> {
        if added <= removed {
            self.key_count.fetch_sub(removed - added, Ordering::AcqRel);
            return Ok(());
        }
        let max = self.config.max_key_count;
        let grow = added - removed;
        self.key_count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |count| {
                count.checked_add(grow).filter(|&total| total <= max)
            })
            .map(|_| ())
            .map_err(|_| IndexError::Full { max })
    }
}

impl<V: Clone + Send + Sync> MetaIndex<V> for LocalIndex<V> {
    fn get(&self, keys: &[BlockKey]) -> Result<Vec<Option<V>>, IndexError> {
        let mut values = vec![None; keys.len()];
        let groups = group_by_shard(keys, self.config.shard_bits);
        for group in groups.chunk_by(|a, b| a.0 == b.0) {
            let map = read_shard(&self.shards[group[0].0]);
            for &(_, index) in group {
                values[index] = map.get(&position_of(keys[index])).cloned();
            }
        }
        Ok(values)
    }

    fn put(&self, entries: Vec<(BlockKey, V)>) -> Result<(), IndexError> {
        let keys: Vec<BlockKey> = entries.iter().map(|(key, _)| *key).collect();
        let mut values = entries.into_iter().map(|(_, value)| value);
        // `write` calls the closure exactly once per key, in order: values stay aligned.
        self.write(&keys, &mut |_, _| match values.next() {
            Some(value) => Modify::Put(value),
            None => Modify::Keep,
        })
    }

    fn delete(&self, keys: &[BlockKey]) -> Result<usize, IndexError> {
        let mut present = 0;
        self.write(keys, &mut |_, current| {
            present += usize::from(current.is_some());
            Modify::Delete
        })?;
        Ok(present)
    }

    fn read_modify_write(
        &self,
        keys: &[BlockKey],
        f: &mut dyn FnMut(BlockKey, Option<&V>) -> Modify<V>,
    ) -> Result<(), IndexError> {
        self.write(keys, f)
    }

    /// Each batch under its own locks, one after the other; the change log is waited for
    /// once, for the highest ticket (a log's tickets grow with each append, and a ticket is
    /// durable only once every earlier one is), after the last batch, or after the last one
    /// applied when a later one fails.
    fn read_modify_write_batches(
        &self,
        batches: &[Vec<BlockKey>],
        f: &mut dyn FnMut(BlockKey, Option<&V>) -> Modify<V>,
    ) -> Result<(), BatchesStopped> {
        let mut last = None;
        for (applied, keys) in batches.iter().enumerate() {
            if let Err(error) = self.write_unwaited(keys, f).map(|t| last = last.max(t)) {
                // A failed wait is the error that matters: nothing applied is durable.
                let waited = self.wait_durable(last);
                return Err(BatchesStopped {
                    applied,
                    durable: waited.is_ok(),
                    error: waited.err().unwrap_or(error),
                });
            }
        }
        self.wait_durable(last).map_err(|error| BatchesStopped {
            applied: batches.len(),
            durable: false,
            error,
        })
    }

    fn scan(&self, cursor: ScanCursor, limit: usize) -> Result<ScanPage, IndexError> {
        scan::scan(&self.shards, self.config.shard_bits, cursor, limit)
    }

    fn sample(&self, count: usize) -> Result<Vec<BlockKey>, IndexError> {
        Ok(sample::sample(&self.shards, count))
    }

    fn len(&self) -> Result<u64, IndexError> {
        Ok(self.key_count.load(Ordering::Acquire))
    }

    fn lock_group(&self, key: BlockKey) -> usize {
        key_order::shard_of(key_order::position_of(key), self.config.shard_bits)
    }
}

#[cfg(test)]
mod tests;
