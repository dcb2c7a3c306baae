//! Attributes of this process: whether it is dumpable (a server on the shared-memory wire
//! is not, see the crate's `set_dumpable`).

use crate::{Result, TransportError};

/// Sets whether this process is dumpable (prctl(PR_SET_DUMPABLE)). A non-dumpable
/// process's `/proc/<pid>` entries belong to root and other users cannot open its
/// descriptors there.
pub fn set_dumpable(dumpable: bool) -> Result<()> {
    let value = libc::c_ulong::from(dumpable);
    // SAFETY: PR_SET_DUMPABLE takes one integer argument and touches no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, value, 0, 0, 0) };
    if rc != 0 {
        return Err(TransportError::last_os("prctl(PR_SET_DUMPABLE)"));
    }
    Ok(())
}

/// Whether this process is dumpable (prctl(PR_GET_DUMPABLE)).
pub fn is_dumpable() -> Result<bool> {
    // SAFETY: PR_GET_DUMPABLE takes no argument and touches no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) };
    if rc < 0 {
        return Err(TransportError::last_os("prctl(PR_GET_DUMPABLE)"));
    }
    Ok(rc != 0)
}
