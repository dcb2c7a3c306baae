//! Attributes of this process (test support: the shared-memory isolation test makes its
//! owner process non-dumpable).

use crate::{Result, TransportError};

/// Sets whether this process is dumpable (prctl(PR_SET_DUMPABLE)). A non-dumpable
/// process's `/proc/<pid>` entries belong to root and other users cannot open its
/// descriptors there.
pub(crate) fn set_dumpable(dumpable: bool) -> Result<()> {
    let value = libc::c_ulong::from(dumpable);
    // SAFETY: PR_SET_DUMPABLE takes one integer argument and touches no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, value, 0, 0, 0) };
    if rc != 0 {
        return Err(TransportError::last_os("prctl(PR_SET_DUMPABLE)"));
    }
    Ok(())
}

/// Whether this process is dumpable (prctl(PR_GET_DUMPABLE)).
pub(crate) fn is_dumpable() -> Result<bool> {
    // SAFETY: PR_GET_DUMPABLE takes no argument and touches no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) };
    if rc < 0 {
        return Err(TransportError::last_os("prctl(PR_GET_DUMPABLE)"));
    }
    Ok(rc != 0)
}
