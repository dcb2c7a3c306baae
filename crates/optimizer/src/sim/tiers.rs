//! [`Tiers`]: one policy, or a small memory tier in front of a large main (file) tier.
//!
//! Two-tier rules (exclusive tiers): new blocks are written to memory; blocks evicted from
//! memory are demoted (written) to main; a hit in main promotes the block back to memory,
//! removing it from main. A block is a hit if either tier holds it.

use crate::policy::{Access, BlockId, EvictionPolicy};

use super::ReplayStats;

/// Which tier served a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// The memory tier.
    Memory,
    /// The main tier.
    Main,
}

/// The cache under replay.
pub struct Tiers {
    main: Box<dyn EvictionPolicy>,
    memory: Option<Box<dyn EvictionPolicy>>,
    evicted: Vec<BlockId>,
    /// Blocks the main tier evicts during demotions (only counted, then dropped).
    main_evicted: Vec<BlockId>,
    /// Latest next-use hint of each block, for demotions into an oracle main tier.
    next_use: Vec<Option<u64>>,
}

impl Tiers {
    /// A single tier.
    pub fn single(main: Box<dyn EvictionPolicy>) -> Tiers {
        Tiers {
            main,
            memory: None,
            evicted: Vec::new(),
            main_evicted: Vec::new(),
            next_use: Vec::new(),
        }
    }

    /// A memory tier in front of a main tier.
    pub fn two_tier(memory: Box<dyn EvictionPolicy>, main: Box<dyn EvictionPolicy>) -> Tiers {
        Tiers {
            memory: Some(memory),
            ..Tiers::single(main)
        }
    }

    /// The tier holding `block`, if any.
    pub fn lookup(&self, block: BlockId) -> Option<Tier> {
        match &self.memory {
            Some(memory) if memory.contains(block) => Some(Tier::Memory),
            _ if self.main.contains(block) => Some(Tier::Main),
            _ => None,
        }
    }

    /// Applies one access, counting writes into `stats`. `parent_of` gives a demoted block's
    /// parent.
    pub fn access(
        &mut self,
        access: Access,
        parent_of: impl Fn(BlockId) -> Option<BlockId>,
        stats: &mut ReplayStats,
    ) {
        let Some(memory) = self.memory.as_mut() else {
            if !self.main.access(access, &mut self.evicted) {
                stats.blocks_written_main += 1;
            }
            self.evicted.clear();
            return;
        };
        crate::policy::grow(&mut self.next_use, access.block, None);
        self.next_use[access.block as usize] = access.next_use;
        if !memory.contains(access.block) {
            self.main.remove(access.block);
            stats.blocks_written_memory += 1;
        }
        memory.access(access, &mut self.evicted);
        for victim in self.evicted.drain(..) {
            let demoted = Access {
                block: victim,
                parent: parent_of(victim),
                next_use: self.next_use[victim as usize],
            };
            if !self.main.access(demoted, &mut self.main_evicted) {
                stats.blocks_written_main += 1;
            }
        }
        self.main_evicted.clear();
    }
}
