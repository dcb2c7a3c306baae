//! Locking the shards of a batch: keys are grouped by shard and the shards are locked in
//! ascending shard order, so two batches over overlapping shards can never deadlock.
//!
//! Invariant: a [`LockedShards`] holds the write lock of every shard of the keys it was built
//! for, sorted by shard number, each exactly once.

use std::sync::{PoisonError, RwLockReadGuard, RwLockWriteGuard};

use super::key_order::{position_of, shard_of};
use super::shard_map::{Shard, ShardMap};
use super::write_batch::Mutation;
use crate::{BlockKey, IndexError};

/// `(shard, index into keys)` for every key, sorted by shard (stable: keys of one shard keep
/// their request order).
pub(crate) fn group_by_shard(keys: &[BlockKey], shard_bits: u32) -> Vec<(usize, usize)> {
    let mut groups: Vec<(usize, usize)> = keys
        .iter()
        .enumerate()
        .map(|(index, &key)| (shard_of(position_of(key), shard_bits), index))
        .collect();
    groups.sort_unstable();
    groups
}

/// Read-locks one shard. A poisoned lock is recovered: a panic can only come from a caller's
/// `read_modify_write` closure, which runs before anything is applied, so the map is intact.
pub(crate) fn read_shard<V>(shard: &Shard<V>) -> RwLockReadGuard<'_, ShardMap<V>> {
    shard.map.read().unwrap_or_else(PoisonError::into_inner)
}

fn write_shard<V>(shard: &Shard<V>) -> RwLockWriteGuard<'_, ShardMap<V>> {
    shard.map.write().unwrap_or_else(PoisonError::into_inner)
}

/// The write-locked shards of one batch.
pub(crate) struct LockedShards<'a, V> {
    guards: Vec<(usize, RwLockWriteGuard<'a, ShardMap<V>>)>,
    shard_bits: u32,
}

impl<'a, V> LockedShards<'a, V> {
    /// Write-locks the shards of `keys`, in ascending shard order.
    pub(crate) fn lock(shards: &'a [Shard<V>], keys: &[BlockKey], shard_bits: u32) -> Self {
        let mut shard_numbers: Vec<usize> = group_by_shard(keys, shard_bits)
            .into_iter()
            .map(|(shard, _)| shard)
            .collect();
        shard_numbers.dedup();
        let guards = shard_numbers
            .into_iter()
            .map(|shard| (shard, write_shard(&shards[shard])))
            .collect();
        Self { guards, shard_bits }
    }

    fn slot(&self, position: u64) -> Result<usize, IndexError> {
        let shard = shard_of(position, self.shard_bits);
        self.guards
            .binary_search_by_key(&shard, |(number, _)| *number)
            .map_err(|_| IndexError::Backend(format!("internal: shard {shard} is not locked")))
    }

    /// The stored value of `key`.
    pub(crate) fn get(&self, key: BlockKey) -> Result<Option<&V>, IndexError> {
        let position = position_of(key);
        let slot = self.slot(position)?;
        Ok(self.guards[slot].1.get(&position))
    }

    /// Applies one record.
    pub(crate) fn apply(&mut self, key: BlockKey, mutation: Mutation<V>) -> Result<(), IndexError> {
        let position = position_of(key);
        let slot = self.slot(position)?;
        let map = &mut self.guards[slot].1;
        match mutation {
            Mutation::Put(value) => map.insert(position, value),
            Mutation::Delete => map.swap_remove(&position),
        };
        Ok(())
    }
}
