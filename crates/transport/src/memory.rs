//! Registrable host memory, common to every provider.
//!
//! Memory is a memfd mapping (page aligned, zeroed), so the soft provider can share it
//! with same-host peers and the verbs provider can pin it. It records the ranges
//! registered on it; invariant: those ranges never overlap.

use crate::sys::SharedMemory;
use crate::{Memory, Result, TransportError};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

/// The mapping and its registered ranges.
#[derive(Debug)]
pub(crate) struct MemoryInner {
    pub(crate) shm: Arc<SharedMemory>,
    registered: Mutex<Vec<(usize, usize)>>,
}

impl MemoryInner {
    pub(crate) fn allocate(len: usize) -> Result<Self> {
        let shm = SharedMemory::create(c"kvcm-memory", len)?;
        Ok(MemoryInner {
            shm: Arc::new(shm),
            registered: Mutex::new(Vec::new()),
        })
    }

    /// Claims `[offset, offset + len)` for a registration: non-empty, inside the memory
    /// and overlapping no other registration.
    pub(crate) fn claim(&self, offset: usize, len: usize) -> Result<()> {
        let end = offset
            .checked_add(len)
            .filter(|&end| len > 0 && end <= self.shm.len());
        let end = end.ok_or(TransportError::InvalidArgument(
            "zero or out-of-bounds registration",
        ))?;
        let mut ranges = self
            .registered
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if ranges
            .iter()
            .any(|&(start, stop)| offset < stop && start < end)
        {
            return Err(TransportError::OverlappingRegistration { offset, end });
        }
        ranges.push((offset, end));
        Ok(())
    }

    /// Releases the registration that starts at `offset`.
    pub(crate) fn release(&self, offset: usize) {
        let mut ranges = self
            .registered
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        ranges.retain(|&(start, _)| start != offset);
    }
}

/// Host memory allocated by a domain ([`crate::Domain::alloc`]).
#[derive(Clone, Debug)]
pub struct HostMemory {
    pub(crate) inner: Arc<MemoryInner>,
}

impl HostMemory {
    pub(crate) fn allocate(len: usize) -> Result<Self> {
        Ok(HostMemory {
            inner: Arc::new(MemoryInner::allocate(len)?),
        })
    }
}

impl Memory for HostMemory {
    fn addr(&self) -> u64 {
        self.inner.shm.addr()
    }

    fn len(&self) -> usize {
        self.inner.shm.len()
    }

    fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.inner.shm.write(offset, data)
    }

    fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.inner.shm.read(offset, out)
    }

    fn fetch_add_u64(&self, offset: usize, add: u64) -> Result<u64> {
        Ok(self
            .inner
            .shm
            .atomic_u64(offset)?
            .fetch_add(add, Ordering::SeqCst))
    }

    fn load_u64(&self, offset: usize) -> Result<u64> {
        Ok(self.inner.shm.atomic_u64(offset)?.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_refuse_overlap_zero_and_out_of_bounds_and_release_frees() {
        let memory = MemoryInner::allocate(8192).unwrap();
        memory.claim(0, 4096).unwrap();
        assert!(matches!(
            memory.claim(4000, 100),
            Err(TransportError::OverlappingRegistration { .. })
        ));
        assert!(memory.claim(4096, 0).is_err());
        assert!(memory.claim(8000, 200).is_err());
        assert!(memory.claim(usize::MAX, 2).is_err());
        memory.release(0);
        memory.claim(100, 100).unwrap();
    }
}
