//! The ring's table of registered (fixed) buffers: which slot of the kernel's sparse buffer
//! table holds which of the caller's ranges.
//!
//! Invariants: a range is in `slots` only while the kernel's slot of the same index holds it
//! (the ring fills the kernel's slot first and clears ours first, both under its mutex);
//! ranges never overlap and are never empty; a transfer uses a slot only when its whole
//! buffer lies inside the slot's range.

/// Slots of the kernel's sparse buffer table (each registered range takes one).
pub(super) const FIXED_SLOTS: usize = 1024;

/// The most bytes one registered range may hold (the kernel's limit per buffer).
pub(super) const MAX_FIXED_BYTES: usize = 1 << 30;

/// One registered range: its address and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Range {
    addr: usize,
    len: usize,
}

impl Range {
    fn end(&self) -> usize {
        self.addr + self.len
    }
}

/// What each slot of the kernel's table holds.
#[derive(Debug, Default)]
pub(super) struct FixedTable {
    /// Empty until the sparse table was registered with the kernel.
    slots: Vec<Option<Range>>,
}

impl FixedTable {
    /// Whether the kernel's sparse table exists yet.
    pub fn is_set_up(&self) -> bool {
        !self.slots.is_empty()
    }

    /// Records that the kernel's sparse table of [`FIXED_SLOTS`] now exists.
    pub fn set_up(&mut self) {
        self.slots = vec![None; FIXED_SLOTS];
    }

    /// The free slot `len` bytes at `addr` would take (slot 0 before the table is set up),
    /// or why they cannot be registered.
    pub fn slot_for(&self, addr: usize, len: usize) -> Result<usize, String> {
        if addr == 0 || len == 0 {
            return Err("an empty or null range".into());
        }
        if len > MAX_FIXED_BYTES {
            return Err(format!(
                "longer than the {MAX_FIXED_BYTES} bytes io_uring takes per buffer"
            ));
        }
        let end = addr
            .checked_add(len)
            .ok_or("the range wraps around the address space")?;
        let taken = self.slots.iter().flatten();
        if let Some(known) = taken.clone().find(|r| addr < r.end() && r.addr < end) {
            return Err(format!(
                "it overlaps the registered {} bytes at {:#x}",
                known.len, known.addr
            ));
        }
        if !self.is_set_up() {
            return Ok(0);
        }
        let free = self.slots.iter().position(Option::is_none);
        free.ok_or_else(|| format!("all {FIXED_SLOTS} buffer slots are taken"))
    }

    /// Records that `slot` holds `len` bytes at `addr` (the kernel's slot already does).
    pub fn fill(&mut self, slot: usize, addr: usize, len: usize) {
        self.slots[slot] = Some(Range { addr, len });
    }

    /// The slot of the range starting at `addr`.
    pub fn slot_starting_at(&self, addr: usize) -> Option<usize> {
        self.slots
            .iter()
            .position(|r| r.is_some_and(|r| r.addr == addr))
    }

    /// Records that `slot` is free again: no transfer uses it from now on (the ring then
    /// empties the kernel's slot; a later registration replaces it in any case).
    pub fn clear(&mut self, slot: usize) {
        self.slots[slot] = None;
    }

    /// The slot whose range holds all of `[addr, addr + len)`, if one does.
    pub fn containing(&self, addr: usize, len: usize) -> Option<u16> {
        let end = addr.checked_add(len)?;
        let slot = self
            .slots
            .iter()
            .position(|r| r.is_some_and(|r| r.addr <= addr && end <= r.end()))?;
        u16::try_from(slot).ok()
    }

    /// How many ranges are registered.
    pub fn len(&self) -> usize {
        self.slots.iter().flatten().count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_refuse_bad_ranges_and_find_only_whole_containment() {
        let mut table = FixedTable::default();
        table.set_up();
        let slot = table.slot_for(0x10000, 0x1000).unwrap();
        table.fill(slot, 0x10000, 0x1000);
        let next = table.slot_for(0x20000, 0x1000).unwrap();
        assert_ne!(next, slot, "a taken slot is not offered again");
        table.fill(next, 0x20000, 0x1000);
        for (addr, len, says) in [
            (0, 0x1000, "null"),
            (0x30000, 0, "empty"),
            (0x10800, 0x1000, "overlaps"),
            (0xf800, 0x1000, "overlaps"),
            (usize::MAX - 10, 0x1000, "wraps"),
            (0x40000, MAX_FIXED_BYTES + 1, "bytes io_uring takes"),
        ] {
            let error = table.slot_for(addr, len).unwrap_err();
            assert!(error.contains(says), "{addr:#x}+{len:#x}: {error}");
        }
        assert_eq!(table.containing(0x10100, 0x100), Some(slot as u16));
        assert_eq!(table.containing(0x10000, 0x1000), Some(slot as u16));
        assert_eq!(table.containing(0x10f00, 0x200), None, "runs past the end");
        assert_eq!(table.containing(0x1f000, 0x2000), None, "straddles");
        assert_eq!(table.containing(usize::MAX - 1, 4), None, "wraps");
        assert_eq!(table.slot_starting_at(0x20000), Some(next));
        assert_eq!(table.slot_starting_at(0x20100), None, "not a start");
        table.clear(slot);
        assert_eq!(table.containing(0x10100, 0x100), None);
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn a_full_table_says_so() {
        let mut table = FixedTable::default();
        table.set_up();
        for n in 0..FIXED_SLOTS {
            let addr = 0x1000 * (n + 1);
            let slot = table.slot_for(addr, 0x1000).unwrap();
            table.fill(slot, addr, 0x1000);
        }
        let error = table
            .slot_for(0x1000 * (FIXED_SLOTS + 1), 0x1000)
            .unwrap_err();
        assert!(error.contains("slots are taken"), "{error}");
    }
}
