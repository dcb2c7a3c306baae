//! The access clock of one instance: for each block key, when it was last read
//! (GetCacheLocation) or written (StartWriteCache), as a logical time, so that the reclaimer
//! evicts by real access rather than by write time; and, under the SIEVE and S3-FIFO
//! policies, when the key was inserted and what it did since (see [`LivePolicy`]).
//!
//! Cheap on the hot path: one `fetch_add` per request and one relaxed store (and under
//! SIEVE or S3-FIFO one atomic update) per key into fixed arrays of slots chosen by hashing
//! the key — no lock, no allocation. Keys that share a slot share its stamp and visited bit, which only
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
/// An S3-FIFO slot: `stamp << 3 | in main << 2 | frequency` (0..=3; the stamp orders the
/// key in its queue).
const IN_MAIN: u64 = 1 << 2;
const FREQUENCY: u64 = 3;
const S3_STAMP_SHIFT: u32 = 3;
/// S3-FIFO's small queue is evicted from while it holds at least this many tenths of the
/// sampled keys.
const SMALL_TENTHS: usize = 1;

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
    /// S3-FIFO over the sample: a key enters the small queue (or the main queue when the
    /// ghost remembers it was evicted lately); each access raises its frequency (at most 3).
    /// While the sampled small queue holds at least a tenth of the sample, its oldest key
    /// goes — to main if it was accessed, else out (remembered by the ghost); otherwise
    /// main's oldest goes unless accessed, when it is put back as the newest with one
    /// access less.
    S3Fifo,
}

/// Last-access stamps of one instance's keys.
#[derive(Debug)]
pub struct AccessClock {
    now: AtomicU64,
    stamps: Box<[AtomicU64]>,
    policy: LivePolicy,
    /// SIEVE and S3-FIFO: per slot the key's queue word (layouts above).
    queue: Option<Box<[AtomicU64]>>,
    /// S3-FIFO: per slot the eviction count when a key of the slot was evicted (0: none).
    ghost: Option<Box<[AtomicU64]>>,
    /// S3-FIFO: evictions so far, from 1 (the ghost's clock).
    evictions: AtomicU64,
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
            policy,
            queue: (policy != LivePolicy::Lru).then(|| slots(count)),
            ghost: (policy == LivePolicy::S3Fifo).then(|| slots(count)),
            evictions: AtomicU64::new(1),
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
            let Some(queue) = &self.queue else {
                continue;
            };
            if self.policy == LivePolicy::Sieve {
                queue[slot].fetch_or(VISITED, Ordering::Relaxed);
            } else {
                let more = |w: u64| Some(if w & FREQUENCY < FREQUENCY { w + 1 } else { w });
                // The closure never refuses, so the update always succeeds.
                let _ = queue[slot].fetch_update(Ordering::Relaxed, Ordering::Relaxed, more);
            }
        }
    }

    /// Records that `keys` (in request order) entered the index: unvisited (SIEVE), in the
    /// small queue, or in the main one when the ghost remembers them (S3-FIFO).
    /// Only the keys `placed` accepts count; under LRU nothing is done (nor allocated).
    pub fn inserted(&self, keys: &[BlockKey], placed: impl Fn(BlockKey) -> bool) {
        let Some(queue) = &self.queue else {
            return;
        };
        let keys: Vec<BlockKey> = keys.iter().copied().filter(|&k| placed(k)).collect();
        for (&key, stamp) in keys.iter().zip(self.stamps_for(keys.len())) {
            let slot = self.slot(key);
            let word = match self.policy {
                LivePolicy::S3Fifo if self.ghost_remembers(slot) => {
                    stamp << S3_STAMP_SHIFT | IN_MAIN
                }
                LivePolicy::S3Fifo => stamp << S3_STAMP_SHIFT,
                _ => stamp << 1,
            };
            queue[slot].store(word, Ordering::Relaxed);
        }
    }

    /// Whether a key of `slot` was evicted within the last `slots` evictions (S3-FIFO).
    fn ghost_remembers(&self, slot: usize) -> bool {
        let Some(ghost) = &self.ghost else {
            return false;
        };
        let evicted_at = ghost[slot].load(Ordering::Relaxed);
        let now = self.evictions.load(Ordering::Relaxed);
        evicted_at != 0 && now - evicted_at < ghost.len() as u64
    }

    /// When `key` was last accessed (0: never, as far as the clock knows).
    pub fn last_access(&self, key: BlockKey) -> u64 {
        self.stamps[self.slot(key)].load(Ordering::Relaxed)
    }

    /// Up to `count` victims among `candidates` (distinct keys), by the clock's policy.
    pub fn victims(&self, candidates: &[BlockKey], count: usize) -> Vec<BlockKey> {
        match (&self.queue, self.policy) {
            (Some(queue), LivePolicy::Sieve) => self.sieve_victims(queue, candidates, count),
            (Some(queue), LivePolicy::S3Fifo) => self.s3fifo_victims(queue, candidates, count),
            _ => {
                let mut by_access: Vec<(u64, BlockKey)> = candidates
                    .iter()
                    .map(|&key| (self.last_access(key), key))
                    .collect();
                by_access.sort_unstable();
                by_access.into_iter().take(count).map(|(_, k)| k).collect()
            }
        }
    }

    /// SIEVE's hand over the candidates (see [`LivePolicy::Sieve`]).
    fn sieve_victims(
        &self,
        sieve: &[AtomicU64],
        candidates: &[BlockKey],
        count: usize,
    ) -> Vec<BlockKey> {
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

    /// S3-FIFO over the candidates (see [`LivePolicy::S3Fifo`]).
    fn s3fifo_victims(
        &self,
        queue: &[AtomicU64],
        candidates: &[BlockKey],
        count: usize,
    ) -> Vec<BlockKey> {
        // Both queues of the sample, newest first (their oldest is popped from the back).
        let (mut small, mut main) = (Vec::new(), Vec::new());
        for &key in candidates {
            let word = queue[self.slot(key)].load(Ordering::Relaxed);
            let entry = (word >> S3_STAMP_SHIFT, key);
            if word & IN_MAIN != 0 {
                main.push(entry);
            } else {
                small.push(entry);
            }
        }
        small.sort_unstable_by(|a, b| b.cmp(a));
        main.sort_unstable_by(|a, b| b.cmp(a));
        let small_share = (candidates.len() * SMALL_TENTHS).div_ceil(10);
        let mut victims = Vec::new();
        // Each key moves at most 4 times (small to main, then 3 reinsertions).
        for _ in 0..4 * candidates.len() {
            if victims.len() == count {
                break;
            }
            let from_small = !small.is_empty() && (small.len() >= small_share || main.is_empty());
            let Some((_, key)) = (if from_small { small.pop() } else { main.pop() }) else {
                break;
            };
            let slot = &queue[self.slot(key)];
            let frequency = slot.load(Ordering::Relaxed) & FREQUENCY;
            if frequency == 0 {
                victims.push(key);
                self.remember_evicted(key);
                continue;
            }
            // To main's newest end: from small with frequency 0, in main with one less.
            let stamp = self.now.fetch_add(1, Ordering::Relaxed);
            let kept = if from_small { 0 } else { frequency - 1 };
            slot.store(stamp << S3_STAMP_SHIFT | IN_MAIN | kept, Ordering::Relaxed);
            main.insert(0, (stamp, key));
        }
        victims
    }

    /// Lets the ghost remember that `key` was evicted (S3-FIFO).
    fn remember_evicted(&self, key: BlockKey) {
        if let Some(ghost) = &self.ghost {
            let at = self.evictions.fetch_add(1, Ordering::Relaxed);
            ghost[self.slot(key)].store(at, Ordering::Relaxed);
        }
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
        assert!(clock(16).queue.is_none(), "LRU keeps no insertion stamps");
        let sieve = AccessClock::new(16, LivePolicy::Sieve);
        let len = |slots: &Option<Box<[AtomicU64]>>| slots.as_ref().map(|s| s.len());
        assert_eq!(len(&sieve.queue), Some(MIN_SLOTS as usize));
        assert_eq!(len(&sieve.ghost), None, "SIEVE keeps no ghost");
        let s3fifo = AccessClock::new(16, LivePolicy::S3Fifo);
        assert_eq!(len(&s3fifo.ghost), Some(MIN_SLOTS as usize));
    }

    #[test]
    fn sieve_passes_visited_keys_once_and_evicts_in_insertion_order() {
        let clock = AccessClock::new(1 << 16, LivePolicy::Sieve);
        // Ten single-key writes: key 1 is the oldest.
        for key in 1..=10 {
            clock.inserted(&[key], |_| true);
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
        clock.inserted(&[1, 2, 3], |_| true);
        assert_eq!(
            clock.victims(&[1, 2, 3], 1),
            [3],
            "the suffix before its prefix"
        );
    }

    #[test]
    fn s3fifo_filters_one_hit_keys_through_small_and_promotes_accessed_ones() {
        let clock = AccessClock::new(1 << 16, LivePolicy::S3Fifo);
        for key in 1..=10 {
            clock.inserted(&[key], |_| true);
        }
        clock.touch(&[1, 2]);
        let keys: Vec<BlockKey> = (1..=10).collect();
        // All ten are in small: 1 and 2 (accessed) move to main, 3 and 4 go.
        assert_eq!(clock.victims(&keys, 2), [3, 4]);
        // Key 3 comes back: the ghost sends it straight to main.
        clock.inserted(&[3], |_| true);
        // Small {5..10} still holds its share: 5 and 6 (never accessed) go first.
        assert_eq!(clock.victims(&[1, 2, 3, 5, 6, 7, 8, 9, 10], 2), [5, 6]);
        // Main alone {1, 2, 3}, none accessed since it got there: oldest first.
        assert_eq!(clock.victims(&[1, 2, 3], 2), [1, 2]);
    }

    #[test]
    fn s3fifo_gives_main_keys_one_reinsertion_per_access() {
        let clock = AccessClock::new(1 << 16, LivePolicy::S3Fifo);
        clock.inserted(&[1], |_| true);
        clock.inserted(&[2], |_| true);
        clock.touch(&[1]);
        // Small {1, 2}: 1 (accessed) moves to main with frequency 0, 2 goes.
        assert_eq!(clock.victims(&[1, 2], 1), [2]);
        clock.inserted(&[3], |_| true);
        clock.touch(&[1]);
        clock.touch(&[1]);
        // Small {3} holds its share of the two: it goes before main's 1.
        assert_eq!(clock.victims(&[1, 3], 1), [3]);
        // Main alone: 1's two accesses put it back twice, then it goes.
        assert_eq!(clock.victims(&[1], 1), [1]);
        clock.inserted(&[4], |_| true);
        clock.touch(&[4]);
        assert_eq!(clock.victims(&[4], 1), [4], "moved to main, then gone");
    }
}
