//! Leaf-aware LRU: evicts the least recently used block among those with no held child in
//! the prefix tree, so a held block's prefix stays held (a block without its prefix can never
//! be a prefix hit).
//!
//! A child is linked to its parent when the child is inserted while the parent is held; the
//! link remembers the parent's incarnation, so a parent removed and re-inserted meanwhile is
//! not miscounted.

use std::collections::BTreeSet;

use super::{grow, Access, BlockId, EvictionPolicy};

const NO_LINK: BlockId = BlockId::MAX;

/// LRU over the leaves of the held part of the prefix tree.
#[derive(Debug)]
pub struct LeafLru {
    capacity: usize,
    len: usize,
    clock: u64,
    /// Last access time of each block; 0 = not held.
    last_access: Vec<u64>,
    /// Held children linked to each block.
    children: Vec<u32>,
    /// The parent each block is linked to, and that parent's incarnation at link time.
    link: Vec<(BlockId, u64)>,
    /// Bumped at every insertion of a block.
    incarnation: Vec<u64>,
    /// Held blocks without held children, by (last access, block).
    leaves: BTreeSet<(u64, BlockId)>,
}

impl LeafLru {
    /// An empty cache of `capacity` blocks.
    pub fn new(capacity: usize) -> Self {
        LeafLru {
            capacity,
            len: 0,
            clock: 0,
            last_access: Vec::new(),
            children: Vec::new(),
            link: Vec::new(),
            incarnation: Vec::new(),
            leaves: BTreeSet::new(),
        }
    }

    fn insert(&mut self, block: BlockId, parent: Option<BlockId>) {
        for table in [&mut self.last_access, &mut self.incarnation] {
            grow(table, block, 0);
        }
        grow(&mut self.children, block, 0);
        grow(&mut self.link, block, (NO_LINK, 0));
        self.incarnation[block as usize] += 1;
        self.last_access[block as usize] = self.clock;
        self.children[block as usize] = 0;
        self.link[block as usize] = (NO_LINK, 0);
        if let Some(parent) = parent.filter(|&p| p != block && self.contains(p)) {
            self.link[block as usize] = (parent, self.incarnation[parent as usize]);
            if self.children[parent as usize] == 0 {
                self.leaves
                    .remove(&(self.last_access[parent as usize], parent));
            }
            self.children[parent as usize] += 1;
        }
        self.leaves.insert((self.clock, block));
        self.len += 1;
    }

    /// Removes a held block and unlinks it from its parent (which may become a leaf).
    fn drop_block(&mut self, block: BlockId) {
        let index = block as usize;
        if self.children[index] == 0 {
            self.leaves.remove(&(self.last_access[index], block));
        }
        self.last_access[index] = 0;
        self.len -= 1;
        let (parent, incarnation) = self.link[index];
        if parent != NO_LINK
            && self.contains(parent)
            && self.incarnation[parent as usize] == incarnation
        {
            self.children[parent as usize] -= 1;
            if self.children[parent as usize] == 0 {
                self.leaves
                    .insert((self.last_access[parent as usize], parent));
            }
        }
    }
}

impl EvictionPolicy for LeafLru {
    fn capacity(&self) -> usize {
        self.capacity
    }

    fn len(&self) -> usize {
        self.len
    }

    fn contains(&self, block: BlockId) -> bool {
        self.last_access
            .get(block as usize)
            .is_some_and(|&t| t != 0)
    }

    fn access(&mut self, access: Access, evicted: &mut Vec<BlockId>) -> bool {
        self.clock += 1;
        let block = access.block;
        if self.contains(block) {
            let index = block as usize;
            if self.children[index] == 0 {
                self.leaves.remove(&(self.last_access[index], block));
                self.leaves.insert((self.clock, block));
            }
            self.last_access[index] = self.clock;
            return true;
        }
        self.insert(block, access.parent);
        while self.len > self.capacity {
            // A non-empty forest always has a leaf.
            let Some(&(_, victim)) = self.leaves.first() else {
                break;
            };
            self.drop_block(victim);
            evicted.push(victim);
        }
        false
    }

    fn remove(&mut self, block: BlockId) -> bool {
        if !self.contains(block) {
            return false;
        }
        self.drop_block(block);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_util::{run, Outcome};

    fn child(block: BlockId, parent: BlockId) -> Access {
        Access {
            parent: Some(parent),
            ..Access::plain(block)
        }
    }

    #[test]
    fn evicts_the_oldest_leaf_not_the_oldest_block() {
        // Chain 1 <- 2, then 3 and 4 at the root; capacity 3.
        // After 1,2,3: leaves {2,3}, 1 is oldest but inner. Inserting 4 evicts 2 (oldest leaf),
        // which makes 1 a leaf again (last access 1): inserting 5 evicts 1.
        let accesses = [
            Access::plain(1),
            child(2, 1),
            Access::plain(3),
            Access::plain(4),
            Access::plain(5),
        ];
        let outcome = run(&mut LeafLru::new(3), &accesses);
        assert_eq!(outcome, Outcome::parse("m m m m(2) m(1)"));
    }

    #[test]
    fn removed_and_reinserted_parent_is_not_miscounted() {
        let mut cache = LeafLru::new(10);
        let mut evicted = Vec::new();
        cache.access(Access::plain(1), &mut evicted);
        cache.access(child(2, 1), &mut evicted);
        assert!(cache.remove(1));
        cache.access(Access::plain(1), &mut evicted);
        assert!(cache.remove(2));
        // 1 was re-inserted after 2 linked to it: it has no linked child and is a leaf.
        assert_eq!(cache.children[1], 0);
        assert!(cache.leaves.contains(&(cache.last_access[1], 1)));
        assert_eq!(cache.len(), 1);
    }
}
