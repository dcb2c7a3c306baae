//! Sampled random-LRU (as Redis does it): on eviction, look at a few random held blocks and
//! evict the least recently used of the sample. The draws are with replacement (a sample may
//! repeat a block), and the newcomer is inserted before sampling, so it is the victim when
//! every draw picks it.

use super::{grow, Access, BlockId, EvictionPolicy};
use crate::rng::SplitMix64;

const ABSENT: u32 = u32::MAX;

/// Approximate LRU by sampling `samples` held blocks per eviction.
#[derive(Debug)]
pub struct RandomLru {
    capacity: usize,
    samples: usize,
    rng: SplitMix64,
    clock: u64,
    /// Held blocks, in no order (sampling picks indexes into it).
    held: Vec<BlockId>,
    /// Index of each block in `held`, or `ABSENT`.
    slot: Vec<u32>,
    last_access: Vec<u64>,
}

impl RandomLru {
    /// Redis' default sample size.
    pub const DEFAULT_SAMPLES: usize = 5;

    /// An empty cache of `capacity` blocks sampling `samples` (at least 1) per eviction,
    /// with a fixed `seed` so runs are reproducible.
    pub fn new(capacity: usize, samples: usize, seed: u64) -> Self {
        RandomLru {
            capacity,
            samples: samples.max(1),
            rng: SplitMix64::new(seed),
            clock: 0,
            held: Vec::new(),
            slot: Vec::new(),
            last_access: Vec::new(),
        }
    }

    fn evict_one(&mut self) -> BlockId {
        let mut victim = self.held[self.rng.below(self.held.len())];
        for _ in 1..self.samples {
            let candidate = self.held[self.rng.below(self.held.len())];
            if self.last_access[candidate as usize] < self.last_access[victim as usize] {
                victim = candidate;
            }
        }
        self.remove(victim);
        victim
    }
}

impl EvictionPolicy for RandomLru {
    fn capacity(&self) -> usize {
        self.capacity
    }

    fn len(&self) -> usize {
        self.held.len()
    }

    fn contains(&self, block: BlockId) -> bool {
        self.slot.get(block as usize).is_some_and(|&s| s != ABSENT)
    }

    fn access(&mut self, access: Access, evicted: &mut Vec<BlockId>) -> bool {
        let block = access.block;
        self.clock += 1;
        grow(&mut self.last_access, block, 0);
        self.last_access[block as usize] = self.clock;
        if self.contains(block) {
            return true;
        }
        grow(&mut self.slot, block, ABSENT);
        self.slot[block as usize] = self.held.len() as u32;
        self.held.push(block);
        while self.held.len() > self.capacity {
            let victim = self.evict_one();
            evicted.push(victim);
        }
        false
    }

    fn remove(&mut self, block: BlockId) -> bool {
        if !self.contains(block) {
            return false;
        }
        let index = self.slot[block as usize] as usize;
        self.held.swap_remove(index);
        if let Some(&moved) = self.held.get(index) {
            self.slot[moved as usize] = index as u32;
        }
        self.slot[block as usize] = ABSENT;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_util::{run_plain, Outcome};

    #[test]
    fn with_samples_covering_the_cache_it_is_exact_lru_in_expectation_of_the_oldest() {
        // Capacity 2, many samples: the sample almost surely contains the LRU block.
        let trace = [1, 2, 1, 3, 1, 2];
        let outcome = run_plain(&mut RandomLru::new(2, 64, 7), &trace);
        assert_eq!(outcome, Outcome::parse("m m h m(2) h m(3)"));
    }

    #[test]
    fn one_sample_is_random_eviction_and_deterministic_per_seed() {
        let trace: Vec<BlockId> = (0..200).map(|i| (i * 7 % 13) as BlockId).collect();
        let first = run_plain(&mut RandomLru::new(4, 1, 42), &trace);
        let second = run_plain(&mut RandomLru::new(4, 1, 42), &trace);
        assert_eq!(first, second);
    }
}
