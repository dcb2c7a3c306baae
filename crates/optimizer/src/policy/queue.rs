//! LRU and FIFO: one queue, evicting from the back; LRU also moves a hit block to the front.

use super::list::Lists;
use super::{Access, BlockId, EvictionPolicy};

/// Least recently used: evicts the block whose last access is oldest.
pub type Lru = Queue<true>;

/// First in, first out: evicts the block inserted earliest; hits change nothing.
pub type Fifo = Queue<false>;

/// A single queue; `REFRESH_ON_HIT` makes it LRU, otherwise FIFO.
#[derive(Debug)]
pub struct Queue<const REFRESH_ON_HIT: bool> {
    capacity: usize,
    order: Lists,
}

impl<const REFRESH_ON_HIT: bool> Queue<REFRESH_ON_HIT> {
    /// An empty queue holding at most `capacity` blocks.
    pub fn new(capacity: usize) -> Self {
        Queue {
            capacity,
            order: Lists::new(1),
        }
    }
}

impl<const REFRESH_ON_HIT: bool> EvictionPolicy for Queue<REFRESH_ON_HIT> {
    fn capacity(&self) -> usize {
        self.capacity
    }

    fn len(&self) -> usize {
        self.order.len(0)
    }

    fn contains(&self, block: BlockId) -> bool {
        self.order.which(block).is_some()
    }

    fn access(&mut self, access: Access, evicted: &mut Vec<BlockId>) -> bool {
        if self.contains(access.block) {
            if REFRESH_ON_HIT {
                self.order.move_to_front(0, access.block);
            }
            return true;
        }
        self.order.push_front(0, access.block);
        while self.order.len(0) > self.capacity {
            evicted.extend(self.order.pop_back(0));
        }
        false
    }

    fn remove(&mut self, block: BlockId) -> bool {
        self.order.remove(block).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_util::{run_plain, Outcome};

    #[test]
    fn lru_evicts_least_recent_and_fifo_ignores_hits() {
        // Accesses 1 2 1 3 1 2 with capacity 2.
        let trace = [1, 2, 1, 3, 1, 2];
        let lru = run_plain(&mut Lru::new(2), &trace);
        assert_eq!(lru, Outcome::parse("m m h m(2) h m(3)"));
        let fifo = run_plain(&mut Fifo::new(2), &trace);
        assert_eq!(fifo, Outcome::parse("m m h m(1) m(2) m(3)"));
    }
}
