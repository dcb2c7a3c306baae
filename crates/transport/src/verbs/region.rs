//! Verbs memory registration over [`HostMemory`].

use super::device::ProtectionDomain;
use crate::memory::{HostMemory, MemoryInner};
use crate::{Access, Region, Result, TransportError};
use rdma_sys::*;
use std::ptr::NonNull;
use std::sync::Arc;

/// A registration of the verbs provider; dropping it deregisters.
#[derive(Debug)]
pub struct VerbsRegion {
    raw: NonNull<ibv_mr>,
    memory: Arc<MemoryInner>,
    offset: usize,
    len: usize,
    access: Access,
    /// The protection domain's identity in the memory's claim list.
    owner: crate::memory::Owner,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: verbs objects are thread safe; the MR is owned and deregistered once in `Drop`.
unsafe impl Send for VerbsRegion {}
// SAFETY: see `Send`; only plain fields of the MR are read.
unsafe impl Sync for VerbsRegion {}

impl VerbsRegion {
    pub(crate) fn register(
        pd: &Arc<ProtectionDomain>,
        memory: &HostMemory,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Self> {
        access.validate()?;
        memory
            .inner
            .claim((pd.raw.as_ptr() as usize, 0), offset, len)?;
        let addr = (memory.inner.shm.addr() + offset as u64) as *mut std::ffi::c_void;
        // SAFETY: the claimed range lies inside a live mapping that this region keeps
        // alive (through `memory`) until after deregistration; the PD is live.
        let raw = unsafe { ibv_reg_mr(pd.raw.as_ptr(), addr, len, verbs_access(access) as i32) };
        let Some(raw) = NonNull::new(raw) else {
            memory.inner.release((pd.raw.as_ptr() as usize, 0), offset);
            return Err(TransportError::last_os("ibv_reg_mr"));
        };
        let memory = Arc::clone(&memory.inner);
        Ok(VerbsRegion {
            raw,
            memory,
            offset,
            len,
            access,
            owner: (pd.raw.as_ptr() as usize, 0),
            _pd: Arc::clone(pd),
        })
    }

    fn mr(&self) -> &ibv_mr {
        // SAFETY: the MR is live until `Drop`; its fields are not changed after creation.
        unsafe { self.raw.as_ref() }
    }
}

/// Verbs access bits of `access`.
pub(crate) fn verbs_access(access: Access) -> u32 {
    let pairs = [
        (
            Access::LOCAL_WRITE,
            ibv_access_flags::IBV_ACCESS_LOCAL_WRITE,
        ),
        (
            Access::REMOTE_READ,
            ibv_access_flags::IBV_ACCESS_REMOTE_READ,
        ),
        (
            Access::REMOTE_WRITE,
            ibv_access_flags::IBV_ACCESS_REMOTE_WRITE,
        ),
        (
            Access::REMOTE_ATOMIC,
            ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC,
        ),
    ];
    pairs
        .iter()
        .filter(|(ours, _)| access.contains(*ours))
        .fold(0, |bits, (_, theirs)| bits | theirs.0)
}

impl Region for VerbsRegion {
    fn addr(&self) -> u64 {
        self.memory.shm.addr() + self.offset as u64
    }

    fn len(&self) -> usize {
        self.len
    }

    fn lkey(&self) -> u32 {
        self.mr().lkey
    }

    fn rkey(&self) -> u32 {
        self.mr().rkey
    }

    fn access(&self) -> Access {
        self.access
    }
}

impl Drop for VerbsRegion {
    fn drop(&mut self) {
        // SAFETY: registered in `register`, deregistered once, before the memory it pins
        // can be unmapped (this value still holds the memory).
        unsafe { ibv_dereg_mr(self.raw.as_ptr()) };
        self.memory.release(self.owner, self.offset);
    }
}
