//! The ring's table of registered (fixed) buffers: which slots of the kernel's sparse buffer
//! table hold which of the caller's ranges.
//!
//! A registered range takes one slot per [`MAX_FIXED_BYTES`] piece (the kernel's limit per
//! buffer), so a range of many GiB fits; a transfer uses a slot only when its whole buffer
//! lies inside that one piece (one crossing a piece boundary moves as an unregistered one).
//!
//! Invariants: a piece is in the table only while the kernel's slot of the same index holds
//! it (the ring fills the kernel's slots first and clears ours first, both under its mutex);
//! pieces never overlap and are never empty; `by_addr` and `slots` hold the same pieces.

use std::collections::BTreeMap;

/// Slots of the kernel's sparse buffer table.
pub(super) const FIXED_SLOTS: usize = 1024;

/// The most bytes one slot holds (the kernel's limit per registered buffer).
pub(super) const MAX_FIXED_BYTES: usize = 1 << 30;

/// One slot's piece of a registered range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Piece {
    /// The registered range this piece belongs to (its start address).
    pub range: usize,
    /// The piece's address and length.
    pub addr: usize,
    pub len: usize,
}

/// What each slot of the kernel's table holds.
#[derive(Debug, Default)]
pub(super) struct FixedTable {
    /// Empty until the sparse table was registered with the kernel.
    slots: Vec<Option<Piece>>,
    /// Filled slots by their piece's address.
    by_addr: BTreeMap<usize, usize>,
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

    /// The pieces `len` bytes at `addr` would take, each with the free slot it would fill
    /// (slots from 0 before the table is set up), or why the range cannot be registered.
    pub fn plan(&self, addr: usize, len: usize) -> Result<Vec<(usize, Piece)>, String> {
        if addr == 0 || len == 0 {
            return Err("an empty or null range".into());
        }
        let end = addr
            .checked_add(len)
            .ok_or("the range wraps around the address space")?;
        if let Some(known) = self.overlapping(addr, end) {
            return Err(format!(
                "it overlaps the registered {} bytes at {:#x}",
                known.len, known.addr
            ));
        }
        let pieces = (addr..end).step_by(MAX_FIXED_BYTES).map(|at| Piece {
            range: addr,
            addr: at,
            len: (end - at).min(MAX_FIXED_BYTES),
        });
        let mut free =
            (0..FIXED_SLOTS).filter(|&slot| self.slots.get(slot).is_none_or(Option::is_none));
        pieces
            .map(|piece| free.next().map(|slot| (slot, piece)))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                let pieces = len.div_ceil(MAX_FIXED_BYTES);
                format!("it needs {pieces} of the {FIXED_SLOTS} buffer slots and too few are free")
            })
    }

    /// A registered piece overlapping `[addr, end)`, if one does.
    fn overlapping(&self, addr: usize, end: usize) -> Option<Piece> {
        let before = self.by_addr.range(..end).next_back();
        let piece = self.slots[*before?.1]?;
        (addr < piece.addr + piece.len).then_some(piece)
    }

    /// Records that `slot` holds `piece` (the kernel's slot already does).
    pub fn fill(&mut self, slot: usize, piece: Piece) {
        self.slots[slot] = Some(piece);
        self.by_addr.insert(piece.addr, slot);
    }

    /// The slots holding the pieces of the range registered at `range`.
    pub fn slots_of(&self, range: usize) -> Vec<usize> {
        let pieces = self.slots.iter().enumerate();
        pieces
            .filter(|(_, piece)| piece.is_some_and(|p| p.range == range))
            .map(|(slot, _)| slot)
            .collect()
    }

    /// Records that `slot` is free again: no transfer uses it from now on (the ring then
    /// empties the kernel's slot; a later registration replaces it in any case).
    pub fn clear(&mut self, slot: usize) {
        if let Some(piece) = self.slots[slot].take() {
            self.by_addr.remove(&piece.addr);
        }
    }

    /// The slot whose piece holds all of `[addr, addr + len)`, if one does.
    pub fn containing(&self, addr: usize, len: usize) -> Option<u16> {
        let end = addr.checked_add(len)?;
        let (_, &slot) = self.by_addr.range(..=addr).next_back()?;
        let piece = self.slots[slot]?;
        (end <= piece.addr + piece.len)
            .then(|| u16::try_from(slot).ok())
            .flatten()
    }

    /// How many ranges are registered.
    pub fn ranges(&self) -> usize {
        let pieces = self.slots.iter().flatten();
        pieces.filter(|piece| piece.addr == piece.range).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn register(table: &mut FixedTable, addr: usize, len: usize) -> Vec<usize> {
        let plan = table.plan(addr, len).unwrap();
        for &(slot, piece) in &plan {
            table.fill(slot, piece);
        }
        plan.into_iter().map(|(slot, _)| slot).collect()
    }

    #[test]
    fn ranges_refuse_overlap_and_find_only_whole_containment() {
        let mut table = FixedTable::default();
        table.set_up();
        let first = register(&mut table, 0x10000, 0x1000);
        let second = register(&mut table, 0x20000, 0x1000);
        assert_ne!(first, second, "a taken slot is not offered again");
        for (addr, len, says) in [
            (0, 0x1000, "null"),
            (0x30000, 0, "empty"),
            (0x10800, 0x1000, "overlaps"),
            (0xf800, 0x1000, "overlaps"),
            (0x8000, 0x20000, "overlaps"),
            (usize::MAX - 10, 0x1000, "wraps"),
        ] {
            let error = table.plan(addr, len).unwrap_err();
            assert!(error.contains(says), "{addr:#x}+{len:#x}: {error}");
        }
        let slot = first[0] as u16;
        assert_eq!(table.containing(0x10100, 0x100), Some(slot));
        assert_eq!(table.containing(0x10000, 0x1000), Some(slot));
        assert_eq!(table.containing(0x10f00, 0x200), None, "runs past the end");
        assert_eq!(table.containing(0x1f000, 0x2000), None, "straddles");
        assert_eq!(table.containing(usize::MAX - 1, 4), None, "wraps");
        assert_eq!(table.slots_of(0x20000), second);
        assert!(table.slots_of(0x20100).is_empty(), "not a range start");
        table.clear(first[0]);
        assert_eq!(table.containing(0x10100, 0x100), None);
        assert_eq!(table.ranges(), 1);
    }

    #[test]
    fn a_long_range_takes_one_slot_per_gib() {
        let mut table = FixedTable::default();
        table.set_up();
        let base = 1 << 40;
        let slots = register(&mut table, base, 2 * MAX_FIXED_BYTES + 4096);
        assert_eq!(slots.len(), 3);
        assert_eq!(table.ranges(), 1);
        let at = |offset: usize| table.containing(base + offset, 4096);
        assert_eq!(at(0), Some(slots[0] as u16));
        assert_eq!(at(MAX_FIXED_BYTES), Some(slots[1] as u16));
        assert_eq!(at(2 * MAX_FIXED_BYTES), Some(slots[2] as u16));
        assert_eq!(
            table.containing(base + MAX_FIXED_BYTES - 2048, 4096),
            None,
            "crosses a piece boundary"
        );
        assert_eq!(table.slots_of(base), slots);
    }

    #[test]
    fn a_full_table_says_so_and_a_freed_slot_is_taken_again() {
        let mut table = FixedTable::default();
        table.set_up();
        for n in 0..FIXED_SLOTS {
            register(&mut table, 0x1000 * (n + 1), 0x1000);
        }
        let beyond = 0x1000 * (FIXED_SLOTS + 1);
        let error = table.plan(beyond, 0x1000).unwrap_err();
        assert!(error.contains("too few are free"), "{error}");
        let freed = table.slots_of(0x5000)[0];
        table.clear(freed);
        assert_eq!(register(&mut table, beyond, 0x1000), vec![freed]);
    }
}
