//! ARC (Megiddo & Modha, FAST'03): two LRU lists, T1 (seen once) and T2 (seen at least
//! twice), plus ghost lists B1 and B2 of their recent evictions. A ghost hit in B1 grows the
//! target size `p` of T1, a ghost hit in B2 shrinks it; eviction takes from T1 when it is
//! above target.
//!
//! Invariants: |T1| + |T2| <= c, |T1| + |B1| <= c, |T1| + |T2| + |B1| + |B2| <= 2c.

use super::list::Lists;
use super::{Access, BlockId, EvictionPolicy};

const T1: usize = 0;
const T2: usize = 1;
const B1: usize = 2;
const B2: usize = 3;

/// Adaptive replacement cache.
#[derive(Debug)]
pub struct Arc {
    capacity: usize,
    /// Target size of T1.
    target_t1: usize,
    lists: Lists,
}

impl Arc {
    /// An empty cache of `capacity` blocks.
    pub fn new(capacity: usize) -> Self {
        Arc {
            capacity,
            target_t1: 0,
            lists: Lists::new(4),
        }
    }

    fn held(&self) -> usize {
        self.lists.len(T1) + self.lists.len(T2)
    }

    /// Moves the LRU block of T1 or T2 to its ghost list, if the cache is full.
    fn replace(&mut self, ghost_hit_in_b2: bool, evicted: &mut Vec<BlockId>) {
        if self.held() < self.capacity {
            return;
        }
        let t1 = self.lists.len(T1);
        let from_t1 = t1 > 0 && (t1 > self.target_t1 || (ghost_hit_in_b2 && t1 == self.target_t1));
        let (list, ghost) = if from_t1 { (T1, B1) } else { (T2, B2) };
        if let Some(victim) = self.lists.pop_back(list) {
            self.lists.push_front(ghost, victim);
            evicted.push(victim);
        }
    }

    fn ghost_hit(&mut self, block: BlockId, in_b1: bool, evicted: &mut Vec<BlockId>) {
        let (b1, b2) = (self.lists.len(B1).max(1), self.lists.len(B2).max(1));
        if in_b1 {
            self.target_t1 = (self.target_t1 + (b2 / b1).max(1)).min(self.capacity);
        } else {
            self.target_t1 = self.target_t1.saturating_sub((b1 / b2).max(1));
        }
        self.lists.remove(block);
        self.replace(!in_b1, evicted);
        self.lists.push_front(T2, block);
    }

    fn miss(&mut self, block: BlockId, evicted: &mut Vec<BlockId>) {
        let l1 = self.lists.len(T1) + self.lists.len(B1);
        let total = l1 + self.lists.len(T2) + self.lists.len(B2);
        if l1 >= self.capacity {
            if self.lists.len(T1) < self.capacity {
                self.lists.pop_back(B1);
                self.replace(false, evicted);
            } else if let Some(victim) = self.lists.pop_back(T1) {
                evicted.push(victim);
            }
        } else if total >= self.capacity {
            if total >= self.capacity.saturating_mul(2) {
                self.lists.pop_back(B2);
            }
            self.replace(false, evicted);
        }
        self.lists.push_front(T1, block);
    }
}

impl EvictionPolicy for Arc {
    fn capacity(&self) -> usize {
        self.capacity
    }

    fn len(&self) -> usize {
        self.held()
    }

    fn contains(&self, block: BlockId) -> bool {
        matches!(self.lists.which(block), Some(T1 | T2))
    }

    fn access(&mut self, access: Access, evicted: &mut Vec<BlockId>) -> bool {
        let block = access.block;
        if self.capacity == 0 {
            evicted.push(block);
            return false;
        }
        match self.lists.which(block) {
            Some(T1 | T2) => {
                self.lists.move_to_front(T2, block);
                return true;
            }
            Some(B1) => self.ghost_hit(block, true, evicted),
            Some(_) => self.ghost_hit(block, false, evicted),
            None => self.miss(block, evicted),
        }
        false
    }

    fn remove(&mut self, block: BlockId) -> bool {
        if !self.contains(block) {
            return false;
        }
        self.lists.remove(block);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_util::{run_plain, Outcome};

    #[test]
    fn frequent_blocks_survive_a_scan_and_ghost_hits_adapt_the_target() {
        // Capacity 2. 1 is hit (moves to T2). The scan 2,3,4 only churns T1: 3 evicts 2 into
        // B1; 4 finds |T1| + |B1| = c, drops 2 from B1 and evicts 3 into B1. 1 survives.
        let mut cache = Arc::new(2);
        let outcome = run_plain(&mut cache, &[1, 1, 2, 3, 4, 1]);
        assert_eq!(outcome, Outcome::parse("m h m m(2) m(3) h"));
        assert_eq!(cache.lists.which(3), Some(B1));
        assert_eq!(cache.lists.which(2), None);
        // 3 is a B1 ghost hit: the T1 target grows to 1; T1 = {4} is not above it, so T2's
        // LRU block, 1, goes to B2 and 3 enters T2.
        let outcome = run_plain(&mut cache, &[3]);
        assert_eq!(outcome, Outcome::parse("m(1)"));
        assert_eq!(cache.target_t1, 1);
        assert_eq!(cache.lists.which(1), Some(B2));
        assert_eq!(cache.lists.which(3), Some(T2));
        assert_eq!(cache.lists.which(4), Some(T1));
    }
}
