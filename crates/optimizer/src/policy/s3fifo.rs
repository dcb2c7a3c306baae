//! S3-FIFO (Yang et al., SOSP'23): a small FIFO (10% of capacity) filters one-hit wonders, a
//! main FIFO with reinsertion keeps the rest, and a ghost FIFO remembers recently evicted
//! blocks so they re-enter straight into main.
//!
//! Rules here: a hit raises a block's frequency (max 3). Evicting from small moves the block
//! to main if it was hit while in small (frequency > 0), else drops it into the ghost queue.
//! Evicting from main reinserts a block with frequency > 0 (decrementing it), else drops it.
//! Small is evicted from while it holds at least its share; the ghost queue holds at most as
//! many blocks as main's share. A miss with the cache full evicts before the newcomer is
//! inserted (as in the paper), so the newcomer never counts toward small's share.

use super::list::Lists;
use super::{grow, Access, BlockId, EvictionPolicy};

const SMALL: usize = 0;
const MAIN: usize = 1;
const GHOST: usize = 2;
const MAX_FREQUENCY: u8 = 3;

/// S3-FIFO with a 10% small queue.
#[derive(Debug)]
pub struct S3Fifo {
    capacity: usize,
    small_share: usize,
    queues: Lists,
    frequency: Vec<u8>,
}

impl S3Fifo {
    /// An empty cache of `capacity` blocks.
    pub fn new(capacity: usize) -> Self {
        S3Fifo {
            capacity,
            small_share: capacity.div_ceil(10),
            queues: Lists::new(3),
            frequency: Vec::new(),
        }
    }

    fn held(&self) -> usize {
        self.queues.len(SMALL) + self.queues.len(MAIN)
    }

    /// Evicts exactly one block from small or main.
    fn evict_one(&mut self) -> Option<BlockId> {
        loop {
            let small = self.queues.len(SMALL);
            let from_small = small > 0 && (small >= self.small_share || self.queues.len(MAIN) == 0);
            let list = if from_small { SMALL } else { MAIN };
            let block = self.queues.pop_back(list)?;
            let frequency = &mut self.frequency[block as usize];
            if *frequency > 0 {
                *frequency = if from_small { 0 } else { *frequency - 1 };
                self.queues.push_front(MAIN, block);
                continue;
            }
            if from_small {
                self.remember(block);
            }
            return Some(block);
        }
    }

    fn remember(&mut self, block: BlockId) {
        self.queues.push_front(GHOST, block);
        while self.queues.len(GHOST) > self.capacity - self.small_share {
            self.queues.pop_back(GHOST);
        }
    }
}

impl EvictionPolicy for S3Fifo {
    fn capacity(&self) -> usize {
        self.capacity
    }

    fn len(&self) -> usize {
        self.held()
    }

    fn contains(&self, block: BlockId) -> bool {
        matches!(self.queues.which(block), Some(SMALL | MAIN))
    }

    fn access(&mut self, access: Access, evicted: &mut Vec<BlockId>) -> bool {
        let block = access.block;
        grow(&mut self.frequency, block, 0);
        if self.contains(block) {
            let frequency = &mut self.frequency[block as usize];
            *frequency = (*frequency + 1).min(MAX_FREQUENCY);
            return true;
        }
        let was_ghost = self.queues.remove(block) == Some(GHOST);
        self.frequency[block as usize] = 0;
        if self.capacity == 0 {
            evicted.push(block);
            return false;
        }
        // Make room first: the queues' shares are judged without the newcomer in them.
        while self.held() >= self.capacity {
            let Some(victim) = self.evict_one() else {
                break;
            };
            evicted.push(victim);
        }
        self.queues
            .push_front(if was_ghost { MAIN } else { SMALL }, block);
        false
    }

    fn remove(&mut self, block: BlockId) -> bool {
        if !self.contains(block) {
            return false;
        }
        self.queues.remove(block);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_util::{run_plain, Outcome};

    #[test]
    fn one_hit_wonders_leave_through_small_and_come_back_through_ghost() {
        // Capacity 3: small share 1, main share 2, ghost holds up to 2.
        // 1 is hit in small; when 4 overflows the cache, 1 moves to main and 2 (never hit)
        // goes to the ghost. 2 returns from the ghost straight into main, which overflows
        // the cache again: small {4,3} is over its share, so 3 goes.
        let mut cache = S3Fifo::new(3);
        let outcome = run_plain(&mut cache, &[1, 1, 2, 3, 4, 2]);
        assert_eq!(outcome, Outcome::parse("m h m m m(2) m(3)"));
        assert_eq!(cache.queues.which(1), Some(MAIN));
        assert_eq!(cache.queues.which(2), Some(MAIN));
        assert_eq!(cache.queues.which(4), Some(SMALL));
        assert_eq!(cache.queues.which(3), Some(GHOST));
    }

    #[test]
    fn newcomer_enters_after_main_makes_room() {
        // Capacity 2: small share 1. 1 and 2 are hit in small. 3 arrives with the cache full:
        // small holds its share, so 1 and 2 (hit) move to main with frequency 0; small is
        // then empty, so main evicts its oldest, 1. Only then does 3 enter small, and its
        // next access hits.
        let mut cache = S3Fifo::new(2);
        let outcome = run_plain(&mut cache, &[1, 1, 2, 2, 3, 3]);
        assert_eq!(outcome, Outcome::parse("m h m h m(1) h"));
        assert_eq!(cache.queues.which(2), Some(MAIN));
        assert_eq!(cache.queues.which(3), Some(SMALL));
    }

    #[test]
    fn full_cache_evicts_small_first_and_reinserts_hit_main_blocks() {
        // Capacity 2: small share 1, main share 1, ghost holds 1.
        // 1,2: both in small (main empty). 3: small (3 blocks) evicts 1 to the ghost.
        // 1 again: from the ghost into main; small {2,3} evicts 2 into the ghost.
        // 4: small {3,4} is over its share, evicts 3. 1 is still held in main.
        let outcome = run_plain(&mut S3Fifo::new(2), &[1, 2, 3, 1, 4, 1]);
        assert_eq!(outcome, Outcome::parse("m m m(1) m(2) m(3) h"));
    }
}
