//! Belady's MIN: evicts the held block whose next access is furthest in the future — the
//! offline optimum, an upper bound for every online policy. Needs [`Access::next_use`]; a
//! block without a hint counts as never used again.
//!
//! The block just accessed competes too: when its own next use is the furthest, it is the
//! one evicted (it is "not admitted"), which is what MIN does.

use std::collections::BinaryHeap;

use super::{grow, Access, BlockId, EvictionPolicy};

const NOT_HELD: u64 = 0;

/// Belady's optimal offline replacement.
#[derive(Debug)]
pub struct Belady {
    capacity: usize,
    len: usize,
    /// Next use + 1 of each held block (`u64::MAX` = never); `NOT_HELD` when not held.
    next_use: Vec<u64>,
    /// (next use + 1, block) of held blocks, with stale entries skipped on pop.
    furthest: BinaryHeap<(u64, BlockId)>,
}

impl Belady {
    /// An empty cache of `capacity` blocks.
    pub fn new(capacity: usize) -> Self {
        Belady {
            capacity,
            len: 0,
            next_use: Vec::new(),
            furthest: BinaryHeap::new(),
        }
    }

    fn pop_furthest(&mut self) -> Option<BlockId> {
        while let Some((key, block)) = self.furthest.pop() {
            if self.next_use[block as usize] == key {
                return Some(block);
            }
        }
        None
    }

    /// Rebuilds the heap when stale entries dominate it.
    fn compact(&mut self) {
        if self.furthest.len() > 4 * self.len + 1024 {
            let live = self.next_use.iter().enumerate();
            self.furthest = live
                .filter(|(_, &key)| key != NOT_HELD)
                .map(|(block, &key)| (key, block as BlockId))
                .collect();
        }
    }
}

impl EvictionPolicy for Belady {
    fn capacity(&self) -> usize {
        self.capacity
    }

    fn len(&self) -> usize {
        self.len
    }

    fn contains(&self, block: BlockId) -> bool {
        self.next_use
            .get(block as usize)
            .is_some_and(|&key| key != NOT_HELD)
    }

    fn access(&mut self, access: Access, evicted: &mut Vec<BlockId>) -> bool {
        let block = access.block;
        let hit = self.contains(block);
        let key = access.next_use.map_or(u64::MAX, |t| t.saturating_add(1));
        grow(&mut self.next_use, block, NOT_HELD);
        self.next_use[block as usize] = key;
        self.furthest.push((key, block));
        if !hit {
            self.len += 1;
        }
        while self.len > self.capacity {
            let Some(victim) = self.pop_furthest() else {
                break;
            };
            self.next_use[victim as usize] = NOT_HELD;
            self.len -= 1;
            evicted.push(victim);
        }
        self.compact();
        hit
    }

    fn remove(&mut self, block: BlockId) -> bool {
        if !self.contains(block) {
            return false;
        }
        self.next_use[block as usize] = NOT_HELD;
        self.len -= 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_util::{run, Outcome};

    fn with_next_uses(blocks: &[BlockId]) -> Vec<Access> {
        (0..blocks.len())
            .map(|i| Access {
                next_use: (i + 1..blocks.len())
                    .find(|&j| blocks[j] == blocks[i])
                    .map(|j| j as u64),
                ..Access::plain(blocks[i])
            })
            .collect()
    }

    #[test]
    fn evicts_the_block_used_furthest_in_the_future() {
        // Capacity 2 over 1 2 3 1 2 3 1 (positions 0..6). At position 2 the next uses are
        // 1 -> 3, 2 -> 4, 3 -> 5: the new block 3 is the one evicted. At position 5, 2 and 3
        // are never used again (tie broken by the larger id), 1 at 6. LRU gets no hit here.
        let accesses = with_next_uses(&[1, 2, 3, 1, 2, 3, 1]);
        let outcome = run(&mut Belady::new(2), &accesses);
        assert_eq!(outcome, Outcome::parse("m m m(3) h h m(3) h"));
    }
}
