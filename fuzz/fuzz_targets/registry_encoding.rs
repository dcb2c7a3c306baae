//! The storage encoding of block entries and registry objects (`kvcm_manager::encoding`),
//! as the journal, snapshots and the Redis index hand it back: every decoder gets the
//! input. What the module promises of hostile bytes is checked: decoding never panics, a
//! value that decodes re-encodes canonically (decode ∘ encode is stable after one pass),
//! and a decode's live allocations stay within `ALLOCATION_FACTOR` × the input length
//! (plus one page for the decoder's own bookkeeping).
#![no_main]

use kvcm_manager::encoding::{Encode, ALLOCATION_FACTOR};
use kvcm_manager::{Account, Entry, GroupConfig, InstanceInfo};
use kvcm_storage::StorageConfig;
use libfuzzer_sys::fuzz_target;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The system allocator, counting live bytes and their peak since [`Counting::reset`].
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

impl Counting {
    fn grew(bytes: usize) {
        let live = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
        PEAK.fetch_max(live, Ordering::Relaxed);
    }

    fn shrank(bytes: usize) {
        LIVE.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Starts a measurement from the bytes live now; returns them.
    fn reset() -> usize {
        let live = LIVE.load(Ordering::Relaxed);
        PEAK.store(live, Ordering::Relaxed);
        live
    }
}

// SAFETY: every call forwards to the system allocator with the caller's layout and
// pointer unchanged; the counters are only statistics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Counting::grew(layout.size());
        // SAFETY: forwarded as received (the caller upholds `alloc`'s contract).
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        Counting::shrank(layout.size());
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        Counting::grew(new_size);
        Counting::shrank(layout.size());
        // SAFETY: forwarded as received (the caller upholds `realloc`'s contract).
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Slack for the decoder's own small allocations (error messages, a reader).
const SLACK: usize = 4096;

fn check<T: Encode>(input: &[u8]) {
    let before = Counting::reset();
    let decoded = T::decode(input);
    let used = PEAK.load(Ordering::Relaxed) - before;
    let budget = input.len() * ALLOCATION_FACTOR + SLACK;
    assert!(
        used <= budget,
        "{used} bytes live decoding {} input bytes",
        input.len()
    );
    let Ok(value) = decoded else {
        return;
    };
    let encoded = value.encode();
    let again = T::decode(&encoded).expect("a re-encoded value decodes");
    assert_eq!(again.encode(), encoded, "re-encoding is stable");
}

fuzz_target!(|input: &[u8]| {
    check::<Entry>(input);
    check::<StorageConfig>(input);
    check::<GroupConfig>(input);
    check::<InstanceInfo>(input);
    check::<Account>(input);
});
