//! A bounded least-recently-used map: a hash map into a slab of nodes linked from most to
//! least recently used. Every operation is O(1).
//!
//! Invariants: `map` and the linked nodes hold the same keys; `len() <= capacity`; a capacity
//! of 0 stores nothing.

use std::collections::HashMap;

use crate::local::BuildMixHasher;
use crate::BlockKey;

const NONE: usize = usize::MAX;

#[derive(Debug)]
struct Node<V> {
    key: BlockKey,
    value: V,
    newer: usize,
    older: usize,
}

/// The LRU map of one cache shard.
#[derive(Debug)]
pub(crate) struct Lru<V> {
    slot_of: HashMap<BlockKey, usize, BuildMixHasher>,
    nodes: Vec<Node<V>>,
    free_slots: Vec<usize>,
    newest: usize,
    oldest: usize,
    capacity: usize,
}

impl<V> Lru<V> {
    /// An empty map holding at most `capacity` entries.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            slot_of: HashMap::default(),
            nodes: Vec::new(),
            free_slots: Vec::new(),
            newest: NONE,
            oldest: NONE,
            capacity,
        }
    }

    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        self.slot_of.len()
    }

    /// The value of `key`, which becomes the most recently used.
    pub(crate) fn get(&mut self, key: BlockKey) -> Option<&V> {
        let slot = *self.slot_of.get(&key)?;
        self.unlink(slot);
        self.link_newest(slot);
        Some(&self.nodes[slot].value)
    }

    /// Stores `value` as the most recently used, evicting the least recently used if full.
    pub(crate) fn insert(&mut self, key: BlockKey, value: V) {
        if self.capacity == 0 {
            return;
        }
        if let Some(&slot) = self.slot_of.get(&key) {
            self.nodes[slot].value = value;
            self.unlink(slot);
            self.link_newest(slot);
            return;
        }
        if self.len() == self.capacity {
            self.remove_slot(self.oldest);
        }
        let node = Node {
            key,
            value,
            newer: NONE,
            older: NONE,
        };
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                self.nodes[slot] = node;
                slot
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        };
        self.slot_of.insert(key, slot);
        self.link_newest(slot);
    }

    /// Forgets `key`.
    pub(crate) fn remove(&mut self, key: BlockKey) {
        if let Some(&slot) = self.slot_of.get(&key) {
            self.remove_slot(slot);
        }
    }

    fn remove_slot(&mut self, slot: usize) {
        self.unlink(slot);
        self.slot_of.remove(&self.nodes[slot].key);
        self.free_slots.push(slot);
    }

    fn unlink(&mut self, slot: usize) {
        let (newer, older) = (self.nodes[slot].newer, self.nodes[slot].older);
        match newer {
            NONE => self.newest = older,
            newer => self.nodes[newer].older = older,
        }
        match older {
            NONE => self.oldest = newer,
            older => self.nodes[older].newer = newer,
        }
    }

    fn link_newest(&mut self, slot: usize) {
        self.nodes[slot].newer = NONE;
        self.nodes[slot].older = self.newest;
        match self.newest {
            NONE => self.oldest = slot,
            newest => self.nodes[newest].newer = slot,
        }
        self.newest = slot;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_least_recently_used() {
        let mut lru = Lru::new(3);
        for key in 1..=3 {
            lru.insert(key, key * 10);
        }
        assert_eq!(lru.get(1), Some(&10));
        lru.insert(4, 40);
        assert_eq!(lru.get(2), None, "2 was the least recently used");
        assert_eq!(lru.len(), 3);
        lru.insert(3, 33);
        lru.insert(5, 50);
        assert_eq!(lru.get(1), None, "1 became the oldest after 3 was replaced");
        assert_eq!(
            [3, 4, 5].map(|key| lru.get(key).copied()),
            [Some(33), Some(40), Some(50)]
        );
    }

    #[test]
    fn removed_slots_are_reused() {
        let mut lru = Lru::new(2);
        lru.insert(1, 1);
        lru.insert(2, 2);
        lru.remove(1);
        lru.remove(9);
        assert_eq!(lru.len(), 1);
        lru.insert(3, 3);
        lru.insert(4, 4);
        assert_eq!(lru.nodes.len(), 2, "slab never grows past the capacity");
        assert_eq!(
            [2, 3, 4].map(|key| lru.get(key).copied()),
            [None, Some(3), Some(4)]
        );
        lru.remove(3);
        lru.remove(4);
        assert_eq!((lru.newest, lru.oldest, lru.len()), (NONE, NONE, 0));
    }

    #[test]
    fn capacity_zero_stores_nothing() {
        let mut lru = Lru::new(0);
        lru.insert(1, 1);
        assert_eq!(lru.get(1), None);
    }
}
