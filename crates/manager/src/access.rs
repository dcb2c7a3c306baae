//! The access clock of one instance: for each block key, when it was last read
//! (GetCacheLocation) or written (StartWriteCache), as a logical time, so that the reclaimer
//! evicts by real access rather than by write time; and, under the SIEVE policy, when the key
//! was inserted and whether it was visited since (see [`LivePolicy`]).
//!
//! Cheap on the hot path: one `fetch_add` per request and one relaxed store (and under
//! SIEVE one `fetch_or`) per key into fixed arrays of slots chosen by hashing the key — no
//! lock, no allocation. Keys that share a slot share its stamp and visited bit, which only
//! makes a key look more recently used than it is (it survives longer, never shorter).
//!
//! Within one request the earlier keys get the later stamps: a key's parent is the key
//! before it in the same request, so among blocks of equal recency (or inserted by one
//! request) the reclaimer takes the suffix before the prefix it extends.

use std::sync::atomic::{AtomicU64, Ordering};

use kvcm_index::BlockKey;

/// Fewest and most slots of a clock.
const MIN_SLOTS: u64 = 1 << 10;
const MAX_SLOTS: u64 = 1 << 20;
/// Slots of an instance without a key cap.
const UNCAPPED_SLOTS: u64 = 1 << 16;
/// The visited bit of a SIEVE slot (the insertion stamp is above it).
const VISITED: u64 = 1;

/// How the reclaimer picks victims among an instance's sampled keys
/// (`kvcm.cache_reclaimer.policy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LivePolicy {
    /// The least recently accessed first.
    #[default]
    Lru,
    /// SIEVE over the sample: in insertion order, oldest first, a key visited (accessed)
    /// since it was inserted or since the hand last passed it loses its visited bit and
    /// stays; the first unvisited ones are the victims. The hand passes the sample twice at
    /// most, so a pass always finds its victims.
    Sieve,
}

/// Last-access stamps of one instance's keys.
#[derive(Debug)]
pub struct AccessClock {
    now: AtomicU64,
    stamps: Box<[AtomicU64]>,
    /// SIEVE only: per slot `insertion stamp << 1 | visited`.
    sieve: Option<Box<[AtomicU64]>>,
    shift: u32,
}

fn slots(count: u64) -> Box<[AtomicU64]> {
    (0..count).map(|_| AtomicU64::new(0)).collect()
}

impl AccessClock {
    /// A clock sized for an instance of at most `max_key_count` keys (0 or negative: none),
    /// keeping what `policy` needs.
    pub fn new(max_key_count: i64, policy: LivePolicy) -> AccessClock {
        let wanted = u64::try_from(max_key_count)
            .ok()
            .filter(|&m| m > 0)
            .map_or(UNCAPPED_SLOTS, |m| m.clamp(MIN_SLOTS, MAX_SLOTS));
        let count = wanted.next_power_of_two();
        AccessClock {
            now: AtomicU64::new(1),
            stamps: slots(count),
            sieve: (policy == LivePolicy::Sieve).then(|| slots(count)),
            shift: 64 - count.trailing_zeros(),
        }
    }

    /// Stamps for `count` keys in request order: the first key gets the latest.
    fn stamps_for(&self, count: usize) -> impl Iterator<Item = u64> {
        let count = count as u64;
        let base = self.now.fetch_add(count, Ordering::Relaxed);
        (0..count).map(move |position| base + (count - 1 - position))
    }

    /// Records an access to `keys`, in request (prefix) order.
    pub fn touch(&self, keys: &[BlockKey]) {
        for (&key, stamp) in keys.iter().zip(self.stamps_for(keys.len())) {
            let slot = self.slot(key);
            self.stamps[slot].store(stamp, Ordering::Relaxed);
            if let Some(sieve) = &self.sieve {
                sieve[slot].fetch_or(VISITED, Ordering::Relaxed);
            }
        }
    }

    /// Records that `keys` (in request order) entered the index, unvisited (SIEVE only).
    pub fn inserted(&self, keys: &[BlockKey]) {
        let Some(sieve) = &self.sieve else {
            return;
        };
        for (&key, stamp) in keys.iter().zip(self.stamps_for(keys.len())) {
            sieve[self.slot(key)].store(stamp << 1, Ordering::Relaxed);
        }
    }

    /// When `key` was last accessed (0: never, as far as the clock knows).
    pub fn last_access(&self, key: BlockKey) -> u64 {
        self.stamps[self.slot(key)].load(Ordering::Relaxed)
    }

    /// Up to `count` victims among `candidates` (distinct keys), by the clock's policy.
    pub fn victims(&self, candidates: &[BlockKey], count: usize) -> Vec<BlockKey> {
        let Some(sieve) = &self.sieve else {
            let mut by_access: Vec<(u64, BlockKey)> = candidates
                .iter()
                .map(|&key| (self.last_access(key), key))
                .collect();
            by_access.sort_unstable();
            return by_access.into_iter().take(count).map(|(_, k)| k).collect();
        };
        let mut by_insertion: Vec<(u64, BlockKey)> = candidates
            .iter()
            .map(|&key| (sieve[self.slot(key)].load(Ordering::Relaxed) >> 1, key))
            .collect();
        by_insertion.sort_unstable();
        let mut chosen = vec![false; by_insertion.len()];
        let mut victims = Vec::new();
        for pass in 0..2 {
            for (i, &(_, key)) in by_insertion.iter().enumerate() {
                if victims.len() == count {
                    return victims;
                }
                if chosen[i] {
                    continue;
                }
                let slot = &sieve[self.slot(key)];
                if pass == 0 && slot.fetch_and(!VISITED, Ordering::Relaxed) & VISITED != 0 {
                    continue; // visited: the hand clears the bit and passes on
                }
                chosen[i] = true;
                victims.push(key);
            }
        }
        victims
    }

    fn slot(&self, key: BlockKey) -> usize {
        // Fibonacci hashing: the top bits of the product spread keys over the slots.
        ((key as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_accesses_stamp_later_and_prefixes_after_their_suffixes() {
        let clock = AccessClock::new(16, LivePolicy::Lru);
        clock.touch(&[1, 2, 3]);
        assert!(clock.last_access(1) > clock.last_access(2));
        assert!(clock.last_access(2) > clock.last_access(3));
        clock.touch(&[3]);
        assert!(clock.last_access(3) > clock.last_access(1), "a read counts");
        assert_eq!(clock.last_access(99), 0, "never touched");
        assert_eq!(
            clock.victims(&[1, 2, 3, 99], 2),
            [99, 2],
            "least recent first"
        );
    }

    #[test]
    fn slot_counts_follow_the_key_cap_within_bounds() {
        let clock = |cap| AccessClock::new(cap, LivePolicy::Lru);
        assert_eq!(clock(16).stamps.len() as u64, MIN_SLOTS);
        assert_eq!(clock(0).stamps.len() as u64, UNCAPPED_SLOTS);
        assert_eq!(clock(i64::MAX).stamps.len() as u64, MAX_SLOTS);
        assert_eq!(clock(3000).stamps.len(), 4096);
        assert!(clock(16).sieve.is_none(), "LRU keeps no insertion stamps");
        let sieve = AccessClock::new(16, LivePolicy::Sieve);
        assert_eq!(
            sieve.sieve.as_ref().map(|s| s.len()),
            Some(MIN_SLOTS as usize)
        );
    }

    #[test]
    fn sieve_passes_visited_keys_once_and_evicts_in_insertion_order() {
        let clock = AccessClock::new(1 << 16, LivePolicy::Sieve);
        // Ten single-key writes: key 1 is the oldest.
        for key in 1..=10 {
            clock.inserted(&[key]);
        }
        clock.touch(&[1, 2]);
        let keys: Vec<BlockKey> = (1..=10).collect();
        // The hand clears 1 and 2 (visited) and takes the oldest unvisited ones.
        assert_eq!(clock.victims(&keys, 3), [3, 4, 5]);
        // Now 1 and 2 are unvisited and the oldest left: they go next.
        assert_eq!(clock.victims(&[1, 2, 6, 7, 8, 9, 10], 3), [1, 2, 6]);
        // A key read again is spared again; an LRU would have evicted 7 (older access).
        clock.touch(&[7]);
        assert_eq!(clock.victims(&[7, 8, 9, 10], 1), [8]);
        // When every candidate was visited the hand goes round: the oldest goes.
        clock.touch(&[9, 10]);
        assert_eq!(clock.victims(&[9, 10], 1), [9]);
    }

    #[test]
    fn sieve_inserts_a_request_suffix_first_so_it_goes_first() {
        let clock = AccessClock::new(1 << 16, LivePolicy::Sieve);
        clock.inserted(&[1, 2, 3]);
        assert_eq!(
            clock.victims(&[1, 2, 3], 1),
            [3],
            "the suffix before its prefix"
        );
    }
}
