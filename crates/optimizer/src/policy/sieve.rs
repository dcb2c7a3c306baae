//! SIEVE (Zhang et al., NSDI'24): a FIFO queue with a visited bit per block and a hand that
//! sweeps from the oldest block toward the newest, clearing visited bits and evicting the
//! first unvisited block. Hits only set the bit; blocks never move. A miss with the cache full
//! evicts before the newcomer is inserted, so the hand never reaches the newcomer.

use super::list::Lists;
use super::{grow, Access, BlockId, EvictionPolicy};

/// SIEVE eviction.
#[derive(Debug)]
pub struct Sieve {
    capacity: usize,
    queue: Lists,
    visited: Vec<bool>,
    /// Where the next sweep starts; `None` = at the oldest block.
    hand: Option<BlockId>,
}

impl Sieve {
    /// An empty cache of `capacity` blocks.
    pub fn new(capacity: usize) -> Self {
        Sieve {
            capacity,
            queue: Lists::new(1),
            visited: Vec::new(),
            hand: None,
        }
    }

    fn evict_one(&mut self) -> Option<BlockId> {
        let mut candidate = self.hand.or(self.queue.back(0))?;
        while self.visited[candidate as usize] {
            self.visited[candidate as usize] = false;
            candidate = self.queue.newer(candidate).or(self.queue.back(0))?;
        }
        // Removing the block under the hand moves the hand to the next newer block.
        self.hand = Some(candidate);
        self.remove(candidate);
        Some(candidate)
    }
}

impl EvictionPolicy for Sieve {
    fn capacity(&self) -> usize {
        self.capacity
    }

    fn len(&self) -> usize {
        self.queue.len(0)
    }

    fn contains(&self, block: BlockId) -> bool {
        self.queue.which(block).is_some()
    }

    fn access(&mut self, access: Access, evicted: &mut Vec<BlockId>) -> bool {
        let block = access.block;
        grow(&mut self.visited, block, false);
        if self.contains(block) {
            self.visited[block as usize] = true;
            return true;
        }
        if self.capacity == 0 {
            evicted.push(block);
            return false;
        }
        // Make room first: the hand sweeps resident blocks only, never the newcomer.
        while self.queue.len(0) >= self.capacity {
            let Some(victim) = self.evict_one() else {
                break;
            };
            evicted.push(victim);
        }
        self.visited[block as usize] = false;
        self.queue.push_front(0, block);
        false
    }

    fn remove(&mut self, block: BlockId) -> bool {
        if !self.contains(block) {
            return false;
        }
        if self.hand == Some(block) {
            self.hand = self.queue.newer(block);
        }
        self.queue.remove(block);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_util::{run_plain, Outcome};

    #[test]
    fn hand_skips_visited_blocks_and_wraps_to_the_oldest() {
        // Capacity 2. 1 and 2 are hit (visited). 3 arrives with the cache full: the hand
        // clears 1 and 2, wraps to the oldest, 1, now unvisited, and evicts it; only then does
        // 3 enter, and the hand rests on 2. 4: the hand at 2 (cleared) evicts it.
        let mut cache = Sieve::new(2);
        let outcome = run_plain(&mut cache, &[1, 2, 1, 2, 3, 4]);
        assert_eq!(outcome, Outcome::parse("m m h h m(1) m(2)"));
        assert_eq!(cache.hand, Some(3));
    }

    #[test]
    fn hand_resumes_where_it_stopped() {
        // Capacity 3. 1 visited; 4 clears 1 and evicts 2, the hand rests on 3. 1 is hit
        // again; 5: the hand at 3 (unvisited) evicts it.
        let outcome = run_plain(&mut Sieve::new(3), &[1, 2, 3, 1, 4, 1, 5]);
        assert_eq!(outcome, Outcome::parse("m m m h m(2) h m(3)"));
    }
}
