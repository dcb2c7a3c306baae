//! The access clock of one instance: for each block key, when it was last read
//! (GetCacheLocation) or written (StartWriteCache), as a logical time, so that the reclaimer
//! evicts by real access rather than by write time.
//!
//! Cheap on the hot path: one `fetch_add` per request and one relaxed store per key into a
//! fixed array of slots chosen by hashing the key — no lock, no allocation. Keys that share
//! a slot share its stamp, which only makes a key look more recently used than it is (it
//! survives longer, never shorter).
//!
//! Within one request the earlier keys get the later stamps: a key's parent is the key
//! before it in the same request, so among blocks of equal recency the reclaimer takes the
//! suffix before the prefix it extends.

use std::sync::atomic::{AtomicU64, Ordering};

use kvcm_index::BlockKey;

/// Fewest and most slots of a clock.
const MIN_SLOTS: u64 = 1 << 10;
const MAX_SLOTS: u64 = 1 << 20;
/// Slots of an instance without a key cap.
const UNCAPPED_SLOTS: u64 = 1 << 16;

/// Last-access stamps of one instance's keys.
#[derive(Debug)]
pub struct AccessClock {
    now: AtomicU64,
    stamps: Box<[AtomicU64]>,
    shift: u32,
}

impl AccessClock {
    /// A clock sized for an instance of at most `max_key_count` keys (0 or negative: none).
    pub fn new(max_key_count: i64) -> AccessClock {
        let wanted = u64::try_from(max_key_count)
            .ok()
            .filter(|&m| m > 0)
            .map_or(UNCAPPED_SLOTS, |m| m.clamp(MIN_SLOTS, MAX_SLOTS));
        let slots = wanted.next_power_of_two();
        AccessClock {
            now: AtomicU64::new(1),
            stamps: (0..slots).map(|_| AtomicU64::new(0)).collect(),
            shift: 64 - slots.trailing_zeros(),
        }
    }

    /// Records an access to `keys`, in request (prefix) order.
    pub fn touch(&self, keys: &[BlockKey]) {
        let count = keys.len() as u64;
        let base = self.now.fetch_add(count, Ordering::Relaxed);
        for (position, &key) in keys.iter().enumerate() {
            let stamp = base + (count - 1 - position as u64);
            self.stamps[self.slot(key)].store(stamp, Ordering::Relaxed);
        }
    }

    /// When `key` was last accessed (0: never, as far as the clock knows).
    pub fn last_access(&self, key: BlockKey) -> u64 {
        self.stamps[self.slot(key)].load(Ordering::Relaxed)
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
        let clock = AccessClock::new(16);
        clock.touch(&[1, 2, 3]);
        assert!(clock.last_access(1) > clock.last_access(2));
        assert!(clock.last_access(2) > clock.last_access(3));
        clock.touch(&[3]);
        assert!(clock.last_access(3) > clock.last_access(1), "a read counts");
        assert_eq!(clock.last_access(99), 0, "never touched");
    }

    #[test]
    fn slot_counts_follow_the_key_cap_within_bounds() {
        assert_eq!(AccessClock::new(16).stamps.len() as u64, MIN_SLOTS);
        assert_eq!(AccessClock::new(0).stamps.len() as u64, UNCAPPED_SLOTS);
        assert_eq!(AccessClock::new(i64::MAX).stamps.len() as u64, MAX_SLOTS);
        assert_eq!(AccessClock::new(3000).stamps.len(), 4096);
    }
}
