//! Size classes: the geometric ladder a small request is rounded up to, and how many slabs a
//! span of one class takes.
//!
//! Invariants: a class holds a whole number of granules; requests of 1..=8 granules get a
//! class of exactly their size; above that there are 8 classes per power of two, so a class
//! exceeds the request by less than 1/8 of the request; the largest class is one slab.

use super::{GRANULE, SLAB_BYTES};

/// Classes per power of two (above 8 granules, where the ladder becomes geometric).
const CLASSES_PER_DOUBLING: u64 = 8;

/// The most slabs a span of one class may take when looking for a small tail slack.
const MAX_SPAN_SLABS: u64 = 8;

/// The number of size classes: 8 exact ones (1..=8 granules), then 8 per doubling up to the
/// 4096 granules of one slab (the tests walk the ladder with it).
#[cfg(test)]
pub(super) const CLASS_COUNT: usize = 80;

/// One size class: every slot of its spans is `slot_bytes` long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SizeClass {
    /// Position in the ladder, `0..CLASS_COUNT`.
    pub index: usize,
    /// Bytes of one slot; a multiple of `GRANULE`, at most `SLAB_BYTES`.
    pub slot_bytes: u64,
}

/// The class a request of `size` bytes (`1..=SLAB_BYTES`) is rounded up to.
pub(super) fn size_class_for(size: u64) -> SizeClass {
    let granules = size.div_ceil(GRANULE).max(1);
    let slot_granules = round_up_to_class(granules);
    SizeClass {
        index: class_index(slot_granules),
        slot_bytes: slot_granules * GRANULE,
    }
}

/// Rounds `granules` up to the nearest class: exact up to 8, then keeping the top 4 bits.
fn round_up_to_class(granules: u64) -> u64 {
    if granules <= CLASSES_PER_DOUBLING {
        return granules;
    }
    let step = 1u64 << (floor_log2(granules) - 3);
    granules.div_ceil(step) * step
}

/// The ladder position of a class size (a value `round_up_to_class` returns).
fn class_index(slot_granules: u64) -> usize {
    if slot_granules <= CLASSES_PER_DOUBLING {
        return (slot_granules - 1) as usize;
    }
    let exponent = floor_log2(slot_granules);
    let mantissa = slot_granules >> (exponent - 3);
    (7 + (exponent - 3) * CLASSES_PER_DOUBLING + (mantissa - 8)) as usize
}

fn floor_log2(value: u64) -> u64 {
    u64::from(63 - value.leading_zeros())
}

/// Slabs a new span of slots of `slot_bytes` should take: the fewest (up to 8) whose tail
/// slack, the bytes too few for one more slot, is at most 1/8 of the span. Every class of the
/// ladder finds one (the worst needs 5 slabs); `MAX_SPAN_SLABS` is only a guard.
pub(super) fn preferred_span_slabs(slot_bytes: u64) -> u64 {
    let slack_is_small = |slabs: &u64| {
        let span_bytes = slabs * SLAB_BYTES;
        (span_bytes % slot_bytes) * 8 <= span_bytes
    };
    (1..=MAX_SPAN_SLABS)
        .find(slack_is_small)
        .unwrap_or(MAX_SPAN_SLABS)
}
