//! LFU: on a miss with the cache full, evicts the held block with the fewest accesses since it
//! was inserted (ties go to the least recently used), then inserts the newcomer with count 1:
//! the newcomer never competes with resident blocks. Counts restart when a block is evicted (in-cache LFU) and saturate
//! at [`Lfu::MAX_COUNT`].
//!
//! O(1) per access: list `c` holds the blocks accessed `c` times, most recent first, and
//! `min_count` is at or below the smallest non-empty list.

use super::list::Lists;
use super::{Access, BlockId, EvictionPolicy};

/// Least frequently used, LRU among equals.
#[derive(Debug)]
pub struct Lfu {
    capacity: usize,
    len: usize,
    /// List `c`: held blocks with access count `c` (list 0 stays empty).
    by_count: Lists,
    min_count: usize,
}

impl Lfu {
    /// Access counts stop growing here (bounds the number of lists).
    pub const MAX_COUNT: usize = 1 << 16;

    /// An empty cache of `capacity` blocks.
    pub fn new(capacity: usize) -> Self {
        Lfu {
            capacity,
            len: 0,
            by_count: Lists::new(2),
            min_count: 1,
        }
    }

    fn pop_least(&mut self) -> Option<BlockId> {
        while self.by_count.len(self.min_count) == 0 {
            if self.min_count >= Self::MAX_COUNT {
                return None;
            }
            self.min_count += 1;
        }
        let victim = self.by_count.pop_back(self.min_count)?;
        self.len -= 1;
        Some(victim)
    }
}

impl EvictionPolicy for Lfu {
    fn capacity(&self) -> usize {
        self.capacity
    }

    fn len(&self) -> usize {
        self.len
    }

    fn contains(&self, block: BlockId) -> bool {
        self.by_count.which(block).is_some()
    }

    fn access(&mut self, access: Access, evicted: &mut Vec<BlockId>) -> bool {
        let block = access.block;
        if let Some(count) = self.by_count.which(block) {
            let next = (count + 1).min(Self::MAX_COUNT);
            self.by_count.move_to_front(next, block);
            if count == self.min_count && self.by_count.len(count) == 0 {
                self.min_count = next;
            }
            return true;
        }
        if self.capacity == 0 {
            evicted.push(block);
            return false;
        }
        // Make room first, so the newcomer (count 1) never competes with resident blocks.
        while self.len >= self.capacity {
            let Some(victim) = self.pop_least() else {
                break;
            };
            evicted.push(victim);
        }
        self.by_count.push_front(1, block);
        self.len += 1;
        self.min_count = 1;
        false
    }

    fn remove(&mut self, block: BlockId) -> bool {
        let removed = self.by_count.remove(block).is_some();
        self.len -= usize::from(removed);
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_util::{run_plain, Outcome};

    #[test]
    fn evicts_least_frequent_then_least_recent() {
        // Capacity 2: 1 is accessed twice; 3 pushes out 2 (count 1 < 2), then 4 pushes out
        // 3 (count 1, older than 4's count 1).
        let trace = [1, 1, 2, 3, 4, 1];
        let outcome = run_plain(&mut Lfu::new(2), &trace);
        assert_eq!(outcome, Outcome::parse("m h m m(2) m(3) h"));
    }

    #[test]
    fn a_resident_block_makes_room_before_the_newcomer_enters() {
        // Capacity 2: 1 and 2 reach count 2; 3 evicts the least recent of them (1) rather
        // than itself, then hits three times.
        let trace = [1, 1, 2, 2, 3, 3, 3, 3];
        let outcome = run_plain(&mut Lfu::new(2), &trace);
        assert_eq!(outcome, Outcome::parse("m h m h m(1) h h h"));
    }

    #[test]
    fn counts_saturate_and_saturated_blocks_stay_lru_among_themselves() {
        let mut cache = Lfu::new(2);
        let mut evicted = Vec::new();
        for _ in 0..Lfu::MAX_COUNT + 5 {
            cache.access(Access::plain(1), &mut evicted);
            cache.access(Access::plain(2), &mut evicted);
        }
        assert_eq!(cache.by_count.which(1), Some(Lfu::MAX_COUNT));
        // Both saturated: the newcomer evicts the least recent of them (1) and enters.
        assert!(!cache.access(Access::plain(3), &mut evicted));
        assert_eq!(evicted, vec![1]);
        assert!(cache.contains(2) && cache.contains(3));
        assert_eq!(cache.by_count.which(3), Some(1));
    }
}
