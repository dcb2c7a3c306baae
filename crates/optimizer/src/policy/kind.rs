//! [`PolicyKind`]: the policies by name, and a constructor for each.

use super::{Arc, Belady, EvictionPolicy, Fifo, LeafLru, Lfu, Lru, RandomLru, S3Fifo, Sieve};

/// Seed of the sampled random-LRU, fixed so that runs are reproducible.
const RANDOM_LRU_SEED: u64 = 0x6b76_636d;

/// Every policy the optimizer can replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum)]
pub enum PolicyKind {
    /// Least recently used.
    Lru,
    /// Sampled random-LRU (5 samples per eviction, as Redis).
    RandomLru,
    /// LRU over the leaves of the held prefix tree.
    LeafLru,
    /// First in, first out.
    Fifo,
    /// Least frequently used (LRU among equals).
    Lfu,
    /// S3-FIFO: small, main and ghost FIFO queues.
    S3fifo,
    /// SIEVE: FIFO with visited bits and a sweeping hand.
    Sieve,
    /// Adaptive replacement cache.
    Arc,
    /// Belady's offline optimum (upper bound).
    Belady,
}

impl PolicyKind {
    /// All policies, in a stable order.
    pub const ALL: [PolicyKind; 9] = [
        PolicyKind::Lru,
        PolicyKind::RandomLru,
        PolicyKind::LeafLru,
        PolicyKind::Fifo,
        PolicyKind::Lfu,
        PolicyKind::S3fifo,
        PolicyKind::Sieve,
        PolicyKind::Arc,
        PolicyKind::Belady,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Lru => "lru",
            PolicyKind::RandomLru => "random-lru",
            PolicyKind::LeafLru => "leaf-lru",
            PolicyKind::Fifo => "fifo",
            PolicyKind::Lfu => "lfu",
            PolicyKind::S3fifo => "s3fifo",
            PolicyKind::Sieve => "sieve",
            PolicyKind::Arc => "arc",
            PolicyKind::Belady => "belady",
        }
    }

    /// A new, empty policy of this kind holding at most `capacity` blocks.
    pub fn build(self, capacity: usize) -> Box<dyn EvictionPolicy> {
        match self {
            PolicyKind::Lru => Box::new(Lru::new(capacity)),
            PolicyKind::RandomLru => Box::new(RandomLru::new(
                capacity,
                RandomLru::DEFAULT_SAMPLES,
                RANDOM_LRU_SEED,
            )),
            PolicyKind::LeafLru => Box::new(LeafLru::new(capacity)),
            PolicyKind::Fifo => Box::new(Fifo::new(capacity)),
            PolicyKind::Lfu => Box::new(Lfu::new(capacity)),
            PolicyKind::S3fifo => Box::new(S3Fifo::new(capacity)),
            PolicyKind::Sieve => Box::new(Sieve::new(capacity)),
            PolicyKind::Arc => Box::new(Arc::new(capacity)),
            PolicyKind::Belady => Box::new(Belady::new(capacity)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Access;

    #[test]
    fn every_policy_honours_capacity_zero_and_remove() {
        for kind in PolicyKind::ALL {
            let mut zero = kind.build(0);
            let mut evicted = Vec::new();
            assert!(!zero.access(Access::plain(3), &mut evicted), "{kind:?}");
            assert_eq!((zero.len(), evicted), (0, vec![3]), "{kind:?}");

            let mut cache = kind.build(4);
            let mut evicted = Vec::new();
            cache.access(Access::plain(1), &mut evicted);
            cache.access(Access::plain(2), &mut evicted);
            assert!(cache.remove(1) && !cache.remove(1), "{kind:?}");
            assert!(!cache.contains(1) && cache.contains(2), "{kind:?}");
            assert_eq!((cache.len(), evicted.len()), (1, 0), "{kind:?}");
            assert!(cache.access(Access::plain(2), &mut Vec::new()), "{kind:?}");
        }
    }

    #[test]
    fn huge_capacity_holds_everything_without_overflow() {
        for kind in PolicyKind::ALL {
            let mut cache = kind.build(usize::MAX);
            let mut evicted = Vec::new();
            let hits = (0..50)
                .filter(|&i| cache.access(Access::plain(i % 7), &mut evicted))
                .count();
            assert_eq!((cache.len(), hits, evicted.len()), (7, 43, 0), "{kind:?}");
        }
    }
}
