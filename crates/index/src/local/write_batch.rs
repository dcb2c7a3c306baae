//! The unit of the write path: a batch of `(key, Put/Delete)` records.
//!
//! Every mutation of the local index is first staged into a [`WriteBatch`] while the batch's
//! shards are locked, then applied in one place (`LocalIndex::commit`). That one place is where
//! a change log appends the batch before memory changes.
//!
//! Invariants: a batch holds at most one record per key, the last one staged for it; each
//! record remembers whether its key was stored before the batch, so the key-count change of
//! the batch is known without looking the keys up again.

use std::collections::HashMap;

use super::key_order::BuildMixHasher;
use crate::{BlockKey, Change};

/// One record of a write batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Mutation<V> {
    /// Insert or replace the key's value.
    Put(V),
    /// Remove the key.
    Delete,
}

/// Up to this many records, a key's record is found by a linear search (cheaper than hashing
/// for the usual batch of a few dozen keys); beyond it, through `slot_of_key`.
const LINEAR_SEARCH_RECORDS: usize = 32;

/// The records of one write, one per distinct key, in the order keys were first staged.
#[derive(Debug)]
pub(crate) struct WriteBatch<V> {
    records: Vec<(BlockKey, Mutation<V>)>,
    stored_before: Vec<bool>,
    /// Record slot by key; filled only once the batch outgrows `LINEAR_SEARCH_RECORDS`.
    slot_of_key: HashMap<BlockKey, usize, BuildMixHasher>,
}

impl<V> WriteBatch<V> {
    /// An empty batch with room for `capacity` keys.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            records: Vec::with_capacity(capacity),
            stored_before: Vec::with_capacity(capacity),
            slot_of_key: HashMap::default(),
        }
    }

    fn slot_of(&self, key: BlockKey) -> Option<usize> {
        if self.records.len() <= LINEAR_SEARCH_RECORDS {
            return self.records.iter().position(|(staged, _)| *staged == key);
        }
        self.slot_of_key.get(&key).copied()
    }

    /// What the batch does to `key`: `None` when it does not touch it, otherwise the value the
    /// key will hold (`Some(None)` for a delete).
    pub(crate) fn staged(&self, key: BlockKey) -> Option<Option<&V>> {
        let slot = self.slot_of(key)?;
        match &self.records[slot].1 {
            Mutation::Put(value) => Some(Some(value)),
            Mutation::Delete => Some(None),
        }
    }

    /// Stages `mutation` for `key`, replacing an earlier record of the same key.
    /// `stored_before` tells whether the index held `key` before the batch; it is only read
    /// for the first record of a key.
    pub(crate) fn record(&mut self, key: BlockKey, mutation: Mutation<V>, stored_before: bool) {
        if let Some(slot) = self.slot_of(key) {
            self.records[slot].1 = mutation;
            return;
        }
        self.records.push((key, mutation));
        self.stored_before.push(stored_before);
        match self.records.len() {
            count if count <= LINEAR_SEARCH_RECORDS => {}
            count if count == LINEAR_SEARCH_RECORDS + 1 => {
                let slots = self
                    .records
                    .iter()
                    .enumerate()
                    .map(|(slot, (key, _))| (*key, slot));
                self.slot_of_key.extend(slots);
            }
            count => {
                self.slot_of_key.insert(key, count - 1);
            }
        }
    }

    /// How many keys the batch adds and removes.
    pub(crate) fn key_count_change(&self) -> (u64, u64) {
        let (mut added, mut removed) = (0, 0);
        for ((_, mutation), &stored) in self.records.iter().zip(&self.stored_before) {
            match (mutation, stored) {
                (Mutation::Put(_), false) => added += 1,
                (Mutation::Delete, true) => removed += 1,
                _ => {}
            }
        }
        (added, removed)
    }

    /// True when the batch changes nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The batch as a change log sees it: per key its new value, `None` for a delete.
    pub(crate) fn changes(&self) -> Vec<Change<'_, V>> {
        self.records
            .iter()
            .map(|(key, mutation)| match mutation {
                Mutation::Put(value) => (*key, Some(value)),
                Mutation::Delete => (*key, None),
            })
            .collect()
    }

    /// Consumes the batch into its records.
    pub(crate) fn into_records(self) -> Vec<(BlockKey, Mutation<V>)> {
        self.records
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_record_of_a_key_replaces_the_earlier() {
        let mut batch = WriteBatch::with_capacity(2);
        assert_eq!(batch.staged(7), None);
        batch.record(7, Mutation::Put(1), true);
        batch.record(8, Mutation::Put(2), false);
        assert_eq!(batch.staged(7), Some(Some(&1)));
        batch.record(7, Mutation::Delete, false);
        assert_eq!(batch.staged(7), Some(None));
        assert_eq!(batch.key_count_change(), (1, 1), "7 was stored, 8 was not");
        assert_eq!(
            batch.into_records(),
            vec![(7, Mutation::Delete), (8, Mutation::Put(2))]
        );
    }

    #[test]
    fn large_batches_find_their_records_through_the_map() {
        let mut batch = WriteBatch::with_capacity(0);
        for key in 0..100 {
            batch.record(key, Mutation::Put(key), key % 2 == 0);
        }
        for key in [0, 31, 32, 33, 99] {
            batch.record(key, Mutation::Delete, false);
            assert_eq!(batch.staged(key), Some(None), "key {key}");
        }
        assert_eq!(batch.staged(50), Some(Some(&50)));
        assert_eq!(batch.staged(100), None);
        assert_eq!(
            batch.key_count_change(),
            (47, 2),
            "puts of 47 odd keys, deletes of 0 and 32"
        );
    }
}
