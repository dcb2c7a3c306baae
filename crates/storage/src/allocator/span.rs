//! A class span: a run of slabs owned by one size class, cut into equal slots.
//!
//! Invariants: `requested[slot]` is 0 exactly for free slots, and otherwise the bytes the
//! caller asked for (1..=slot_bytes); `free_slots` lists every free slot once; slots lie in
//! the first `slot_count * slot_bytes` bytes of the span, the rest is tail slack.

use super::size_class::SizeClass;
use super::slab_pool::SlabRun;

/// A run of slabs holding the slots of one class.
#[derive(Debug)]
pub(super) struct Span {
    /// The class of every slot.
    pub class: SizeClass,
    /// The slabs the span owns.
    pub run: SlabRun,
    /// Byte offset of slot 0 in the region.
    base_offset: u64,
    /// Requested bytes of each slot's allocation, 0 where the slot is free.
    requested: Vec<u32>,
    /// Free slots; a new span hands out slot 0 first, later the most recently freed.
    free_slots: Vec<u32>,
}

impl Span {
    /// A span of `run` (holding `run_bytes` bytes at `base_offset`) with every slot free.
    /// `run_bytes` holds at least one slot and at most `u32::MAX` slots.
    pub fn new(class: SizeClass, run: SlabRun, base_offset: u64, run_bytes: u64) -> Self {
        let slot_count = (run_bytes / class.slot_bytes) as u32;
        Span {
            class,
            run,
            base_offset,
            requested: vec![0; slot_count as usize],
            free_slots: (0..slot_count).rev().collect(),
        }
    }

    pub fn slot_count(&self) -> usize {
        self.requested.len()
    }

    pub fn free_slot_count(&self) -> usize {
        self.free_slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.free_slots.len() == self.requested.len()
    }

    /// Places an allocation of `requested` bytes in the lowest free slot; returns its
    /// offset, or `None` when the span is full.
    pub fn take_slot(&mut self, requested: u32) -> Option<u64> {
        let slot = self.free_slots.pop()?;
        self.requested[slot as usize] = requested;
        Some(self.base_offset + u64::from(slot) * self.class.slot_bytes)
    }

    /// Frees the slot at `offset`; returns the bytes that were requested there, or `None`
    /// (changing nothing) when no live allocation starts at `offset`.
    pub fn release_slot(&mut self, offset: u64) -> Option<u64> {
        let relative = offset.checked_sub(self.base_offset)?;
        if relative % self.class.slot_bytes != 0 {
            return None;
        }
        let slot = relative / self.class.slot_bytes;
        let requested = self.requested.get_mut(usize::try_from(slot).ok()?)?;
        if *requested == 0 {
            return None;
        }
        let released = u64::from(*requested);
        *requested = 0;
        self.free_slots.push(slot as u32);
        Some(released)
    }
}
