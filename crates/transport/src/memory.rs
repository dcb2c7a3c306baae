//! Registrable host memory, common to every provider.
//!
//! Memory is a memfd mapping (page aligned, zeroed), so the soft provider can share it
//! with same-host peers and the verbs provider can pin it. It records the ranges
//! registered on it per domain (as verbs, one buffer may be registered in several
//! protection domains); invariant: the ranges one domain registered never overlap.

use crate::sys::SharedMemory;
use crate::{Memory, Result, TransportError};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

/// The mapping and its registered ranges.
#[derive(Debug)]
pub(crate) struct MemoryInner {
    pub(crate) shm: Arc<SharedMemory>,
    /// (owning domain, start, end) of every registration.
    registered: Mutex<Vec<(usize, usize, usize)>>,
}

impl MemoryInner {
    pub(crate) fn allocate(len: usize) -> Result<Self> {
        let shm = SharedMemory::create(c"kvcm-memory", len)?;
        Ok(MemoryInner {
            shm: Arc::new(shm),
            registered: Mutex::new(Vec::new()),
        })
    }

    /// Claims `[offset, offset + len)` for a registration of domain `owner` (any value
    /// unique to the domain): non-empty, inside the memory and overlapping no other
    /// registration of that domain.
    pub(crate) fn claim(&self, owner: usize, offset: usize, len: usize) -> Result<()> {
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
            .any(|&(domain, start, stop)| domain == owner && offset < stop && start < end)
        {
            return Err(TransportError::OverlappingRegistration { offset, end });
        }
        ranges.push((owner, offset, end));
        Ok(())
    }

    /// Releases the registration of domain `owner` that starts at `offset`.
    pub(crate) fn release(&self, owner: usize, offset: usize) {
        let mut ranges = self
            .registered
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        ranges.retain(|&(domain, start, _)| domain != owner || start != offset);
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
    fn claims_refuse_overlap_within_a_domain_zero_and_out_of_bounds_and_release_frees() {
        let memory = MemoryInner::allocate(8192).unwrap();
        memory.claim(1, 0, 4096).unwrap();
        assert!(matches!(
            memory.claim(1, 4000, 100),
            Err(TransportError::OverlappingRegistration { .. })
        ));
        assert!(memory.claim(1, 4096, 0).is_err());
        assert!(memory.claim(1, 8000, 200).is_err());
        assert!(memory.claim(1, usize::MAX, 2).is_err());
        memory
            .claim(2, 0, 4096)
            .expect("another domain may register the same bytes");
        memory.release(1, 0);
        memory.claim(1, 100, 100).unwrap();
        assert!(
            memory.claim(2, 100, 100).is_err(),
            "domain 2 still holds its range"
        );
    }
}
