//! Registrable host memory, common to every provider.
//!
//! Memory is a memfd mapping (page aligned, zeroed), so the soft provider can share it
//! with same-host peers and the verbs provider can pin it; or it is the caller's own
//! (an engine's buffers, pinned host memory: [`HostMemory::from_vec`],
//! [`HostMemory::from_raw_parts`]), which every provider uses in local scatter-gather
//! elements and only verbs lets peers reach (no descriptor exists to share it). Caller
//! memory goes back to its owner only when nothing holds it any more: not the handles,
//! not a registration, not a transfer that resolved it. It records the ranges
//! registered on it per domain (as verbs, one buffer may be registered in several
//! protection domains); invariant: the ranges one domain registered never overlap.

use crate::sys::{Release, SharedMemory};
use crate::{Memory, Result, TransportError};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

/// A protection domain as registrations name it: a value unique to its provider object
/// (an address) and a number within it (a soft domain's protection domains share one
/// registry).
pub(crate) type Owner = (usize, u32);

/// The mapping and its registered ranges.
#[derive(Debug)]
pub(crate) struct MemoryInner {
    pub(crate) shm: Arc<SharedMemory>,
    /// (owning protection domain, start, end) of every registration.
    registered: Mutex<Vec<(Owner, usize, usize)>>,
}

impl MemoryInner {
    pub(crate) fn allocate(len: usize) -> Result<Self> {
        let shm = SharedMemory::create(c"kvcm-memory", len)?;
        Ok(Self::over(shm))
    }

    pub(crate) fn allocate_huge(len: usize) -> Result<Self> {
        let shm = SharedMemory::create_huge(c"kvcm-memory-huge", len)?;
        Ok(Self::over(shm))
    }

    fn over(shm: SharedMemory) -> Self {
        MemoryInner {
            shm: Arc::new(shm),
            registered: Mutex::new(Vec::new()),
        }
    }

    /// Claims `[offset, offset + len)` for a registration of protection domain `owner`:
    /// non-empty, inside the memory and overlapping no other registration of that
    /// protection domain.
    pub(crate) fn claim(&self, owner: Owner, offset: usize, len: usize) -> Result<()> {
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

    /// Releases the registration of protection domain `owner` that starts at `offset`.
    pub(crate) fn release(&self, owner: Owner, offset: usize) {
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

    /// `len` zeroed bytes on 2 MiB huge pages of the kernel's hugetlb pool, registrable
    /// like [`crate::Domain::alloc`]'s memory (fewer TLB misses and page-table entries for
    /// a large region; the NIC pins fewer pages). `len` must be a multiple of 2 MiB; refused
    /// when the kernel has not that many free huge pages (`vm.nr_hugepages`).
    pub fn allocate_huge(len: usize) -> Result<Self> {
        Ok(HostMemory {
            inner: Arc::new(MemoryInner::allocate_huge(len)?),
        })
    }

    /// Whether this memory lies on hugetlb pages ([`HostMemory::allocate_huge`]).
    pub fn is_huge(&self) -> bool {
        self.inner.shm.is_huge()
    }

    /// Backs every page of memory allocated here now rather than at first touch (a
    /// pool region that must not pay page faults on its first writes); refused for memory
    /// that is a peer's or a caller's.
    pub fn populate(&self) -> Result<()> {
        self.inner.shm.populate()
    }

    /// The bytes of `bytes` (its length, not its capacity) as caller-owned memory; the
    /// vector is dropped once nothing holds the memory. Refused when empty.
    pub fn from_vec(mut bytes: Vec<u8>) -> Result<Self> {
        let (ptr, len) = (bytes.as_mut_ptr(), bytes.len());
        // SAFETY: the vector's buffer is valid for `len` bytes and does not move while the
        // vector is owned by the release, which drops it only when the memory is dropped;
        // nothing else can reach the vector meanwhile.
        unsafe { Self::from_raw_parts(ptr, len, move || drop(bytes)) }
    }

    /// `len` bytes at `addr` that the caller owns (engine buffers, pinned host memory), as
    /// memory any provider registers; `release` runs exactly once, when nothing holds the
    /// memory any more (handles, registrations, transfers in flight). Refused for a null
    /// address, zero length, or a range that wraps; `release` does not run then (the bytes
    /// stay the caller's).
    ///
    /// # Safety
    /// The bytes stay allocated and valid for reads and writes until `release` runs. Until
    /// then the caller follows the RDMA contract: from the post of a work request on these
    /// bytes to its completion (or the end of its queue pair), the caller does not write
    /// them, nor read bytes the NIC may write; outside those windows they are the caller's
    /// to use (the completion orders the NIC's accesses before the caller's).
    pub unsafe fn from_raw_parts(
        addr: *mut u8,
        len: usize,
        release: impl FnOnce() + Send + 'static,
    ) -> Result<Self> {
        let release: Release = Box::new(release);
        // SAFETY: forwarded from this function's contract.
        let shm = unsafe { SharedMemory::from_caller(addr, len, release)? };
        Ok(HostMemory {
            inner: Arc::new(MemoryInner::over(shm)),
        })
    }

    /// Whether this is the caller's memory ([`HostMemory::from_vec`],
    /// [`HostMemory::from_raw_parts`]) rather than memory a domain allocated.
    pub fn is_caller_owned(&self) -> bool {
        self.inner.shm.is_caller_owned()
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
        memory.claim((1, 0), 0, 4096).unwrap();
        assert!(matches!(
            memory.claim((1, 0), 4000, 100),
            Err(TransportError::OverlappingRegistration { .. })
        ));
        assert!(memory.claim((1, 0), 4096, 0).is_err());
        assert!(memory.claim((1, 0), 8000, 200).is_err());
        assert!(memory.claim((1, 0), usize::MAX, 2).is_err());
        memory
            .claim((2, 0), 0, 4096)
            .expect("another domain may register the same bytes");
        memory
            .claim((1, 1), 0, 4096)
            .expect("so may another protection domain of the same provider object");
        memory.release((1, 0), 0);
        memory.claim((1, 0), 100, 100).unwrap();
        assert!(
            memory.claim((2, 0), 100, 100).is_err(),
            "domain 2 still holds its range"
        );
    }

    #[test]
    fn caller_memory_is_refused_when_null_empty_or_wrapping_and_keeps_its_release_then() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static RELEASED: AtomicUsize = AtomicUsize::new(0);
        let release = || {
            RELEASED.fetch_add(1, Ordering::SeqCst);
        };
        let mut byte = 0u8;
        // SAFETY: every call is refused before the address is used.
        let refused = unsafe {
            [
                HostMemory::from_raw_parts(std::ptr::null_mut(), 8, release),
                HostMemory::from_raw_parts(&mut byte, 0, release),
                HostMemory::from_raw_parts(&mut byte, usize::MAX, release),
            ]
        };
        for outcome in refused {
            assert!(
                matches!(outcome, Err(TransportError::InvalidArgument(_))),
                "{outcome:?}"
            );
        }
        assert_eq!(
            RELEASED.load(Ordering::SeqCst),
            0,
            "a refusal runs no release"
        );
        assert!(HostMemory::from_vec(Vec::new()).is_err());

        let memory = HostMemory::from_vec(vec![7u8; 20]).unwrap();
        assert!(memory.is_caller_owned());
        assert_eq!(memory.len(), 20);
        let mut got = [0u8; 20];
        memory.read(0, &mut got).unwrap();
        assert_eq!(got, [7u8; 20]);
        assert!(memory.write(15, &[1; 6]).is_err(), "bounds are checked");
    }

    #[test]
    fn huge_page_memory_needs_whole_huge_pages() {
        for len in [0, 4096, (2 << 20) + 4096] {
            assert!(
                matches!(
                    HostMemory::allocate_huge(len),
                    Err(TransportError::InvalidArgument(_))
                ),
                "{len} bytes"
            );
        }
        assert!(!HostMemory::allocate(4096).unwrap().is_huge());
        // Whether the kernel has free huge pages is the machine's business; when it does,
        // the memory is on them and works (tests/data_plane.rs reserves some as root).
        if let Ok(memory) = HostMemory::allocate_huge(2 << 20) {
            assert!(memory.is_huge());
            memory.write((2 << 20) - 8, &[7; 8]).unwrap();
            assert_eq!(
                memory.load_u64((2 << 20) - 8).unwrap(),
                0x0707_0707_0707_0707
            );
        }
    }
}
