//! Memory the caller registered with the engine for zero-copy transfers.
//!
//! Each range is a [`HostMemory`] over the caller's bytes (its release does nothing: the
//! bytes stay the caller's). Pool links register a range with their own domain the first
//! time a buffer inside it moves, and drop that registration when the caller deregisters
//! the range. Invariant: ranges never overlap.

use kvcm_transport::{HostMemory, Memory};

/// The caller's registered ranges.
#[derive(Debug, Default)]
pub(crate) struct CallerMemory {
    ranges: Vec<HostMemory>,
}

impl CallerMemory {
    /// Adds `len` bytes at `addr`.
    ///
    /// # Safety
    /// The bytes stay allocated until [`CallerMemory::remove`] of `addr` returns or this
    /// value drops. The NIC touches them only during an engine call whose buffers lie
    /// there (the caller lends those buffers to the call), never after it returns.
    pub(crate) unsafe fn add(&mut self, addr: *mut u8, len: usize) -> Result<(), String> {
        let end = (addr as u64).checked_add(len as u64);
        let overlapping = self.ranges.iter().find(|known| {
            let known_end = known.addr() + known.len() as u64;
            end.is_some_and(|end| (addr as u64) < known_end && known.addr() < end)
        });
        if let Some(known) = overlapping {
            return Err(format!(
                "{len} bytes at {addr:p} overlap the registered {} bytes at {:#x}",
                known.len(),
                known.addr()
            ));
        }
        // SAFETY: forwarded from this function's contract; the release does nothing, so
        // the bytes stay the caller's.
        let memory = unsafe { HostMemory::from_raw_parts(addr, len, || {}) };
        self.ranges.push(memory.map_err(|e| e.to_string())?);
        Ok(())
    }

    /// Removes the range that starts at `addr`; false when none does.
    pub(crate) fn remove(&mut self, addr: u64) -> bool {
        let before = self.ranges.len();
        self.ranges.retain(|memory| memory.addr() != addr);
        self.ranges.len() != before
    }

    /// The registered range holding all of `[addr, addr + len)`, if one does.
    pub(crate) fn containing(&self, addr: u64, len: usize) -> Option<&HostMemory> {
        let end = addr.checked_add(len as u64)?;
        self.ranges
            .iter()
            .find(|memory| memory.addr() <= addr && end <= memory.addr() + memory.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_refuse_overlap_and_find_only_whole_containment() {
        let mut bytes = vec![0u8; 300];
        let base = bytes.as_mut_ptr();
        let mut caller = CallerMemory::default();
        // SAFETY: `bytes` outlives `caller`, and nothing moves through these ranges.
        unsafe {
            caller.add(base, 100).unwrap();
            caller.add(base.add(200), 100).unwrap();
            let overlap = caller.add(base.add(50), 100).unwrap_err();
            assert!(overlap.contains("overlap"), "{overlap}");
            assert!(caller.add(base.add(100), 0).is_err(), "zero length");
            caller.add(base.add(100), 100).unwrap();
        }
        let at = |offset: usize| base as u64 + offset as u64;
        assert_eq!(caller.containing(at(10), 90).map(Memory::addr), Some(at(0)));
        assert!(
            caller.containing(at(90), 20).is_none(),
            "straddles two ranges"
        );
        assert!(
            caller.containing(at(250), 60).is_none(),
            "runs past the end"
        );
        assert!(caller.containing(u64::MAX - 1, 4).is_none(), "wraps");
        assert!(caller.remove(at(100)));
        assert!(!caller.remove(at(100)), "already gone");
        assert!(caller.containing(at(150), 1).is_none());
    }
}
