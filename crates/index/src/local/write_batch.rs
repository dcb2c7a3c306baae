//! The unit of the write path: a batch of `(key, Put/Delete)` records.
//!
//! Every mutation of the local index is first staged into a [`WriteBatch`] while the batch's
//! shards are locked, then applied in one place (`LocalIndex::commit`). That one place is where
//! a write-ahead log appends the batch before memory changes.
//!
//! Invariant: a batch holds at most one record per key, the last one staged for it.

use std::collections::HashMap;

use crate::BlockKey;

/// One record of a write batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Mutation<V> {
    /// Insert or replace the key's value.
    Put(V),
    /// Remove the key.
    Delete,
}

/// The records of one write, one per distinct key, in the order keys were first staged.
#[derive(Debug)]
pub(crate) struct WriteBatch<V> {
    records: Vec<(BlockKey, Mutation<V>)>,
    slot_of_key: HashMap<BlockKey, usize>,
}

impl<V> WriteBatch<V> {
    /// An empty batch with room for `capacity` keys.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            records: Vec::with_capacity(capacity),
            slot_of_key: HashMap::with_capacity(capacity),
        }
    }

    /// What the batch does to `key`: `None` when it does not touch it, otherwise the value the
    /// key will hold (`Some(None)` for a delete).
    pub(crate) fn staged(&self, key: BlockKey) -> Option<Option<&V>> {
        let slot = *self.slot_of_key.get(&key)?;
        match &self.records[slot].1 {
            Mutation::Put(value) => Some(Some(value)),
            Mutation::Delete => Some(None),
        }
    }

    /// Stages `mutation` for `key`, replacing an earlier record of the same key.
    pub(crate) fn record(&mut self, key: BlockKey, mutation: Mutation<V>) {
        match self.slot_of_key.get(&key) {
            Some(&slot) => self.records[slot].1 = mutation,
            None => {
                self.slot_of_key.insert(key, self.records.len());
                self.records.push((key, mutation));
            }
        }
    }

    /// The staged records.
    pub(crate) fn records(&self) -> &[(BlockKey, Mutation<V>)] {
        &self.records
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
        batch.record(7, Mutation::Put(1));
        batch.record(8, Mutation::Put(2));
        assert_eq!(batch.staged(7), Some(Some(&1)));
        batch.record(7, Mutation::Delete);
        assert_eq!(batch.staged(7), Some(None));
        assert_eq!(
            batch.into_records(),
            vec![(7, Mutation::Delete), (8, Mutation::Put(2))]
        );
    }
}
