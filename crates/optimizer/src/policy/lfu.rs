//! LFU: evicts the held block with the fewest accesses since it was inserted; ties go to the
//! least recently used. Counts restart when a block is evicted (in-cache LFU).

use std::collections::BTreeSet;

use super::{grow, Access, BlockId, EvictionPolicy};

/// Least frequently used, LRU among equals.
#[derive(Debug)]
pub struct Lfu {
    capacity: usize,
    clock: u64,
    /// (accesses, last access) of each block; accesses 0 = not held.
    rank: Vec<(u64, u64)>,
    /// Held blocks ordered by (accesses, last access, block).
    order: BTreeSet<(u64, u64, BlockId)>,
}

impl Lfu {
    /// An empty cache of `capacity` blocks.
    pub fn new(capacity: usize) -> Self {
        Lfu {
            capacity,
            clock: 0,
            rank: Vec::new(),
            order: BTreeSet::new(),
        }
    }
}

impl EvictionPolicy for Lfu {
    fn capacity(&self) -> usize {
        self.capacity
    }

    fn len(&self) -> usize {
        self.order.len()
    }

    fn contains(&self, block: BlockId) -> bool {
        self.rank.get(block as usize).is_some_and(|r| r.0 != 0)
    }

    fn access(&mut self, access: Access, evicted: &mut Vec<BlockId>) -> bool {
        let block = access.block;
        self.clock += 1;
        grow(&mut self.rank, block, (0, 0));
        let (count, last) = self.rank[block as usize];
        let hit = count != 0;
        if hit {
            self.order.remove(&(count, last, block));
        }
        self.rank[block as usize] = (count + 1, self.clock);
        self.order.insert((count + 1, self.clock, block));
        while self.order.len() > self.capacity {
            let Some((_, _, victim)) = self.order.pop_first() else {
                break;
            };
            self.rank[victim as usize] = (0, 0);
            evicted.push(victim);
        }
        hit
    }

    fn remove(&mut self, block: BlockId) -> bool {
        if !self.contains(block) {
            return false;
        }
        let (count, last) = self.rank[block as usize];
        self.order.remove(&(count, last, block));
        self.rank[block as usize] = (0, 0);
        true
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
}
