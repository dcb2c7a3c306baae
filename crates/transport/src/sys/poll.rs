//! poll(2) over a set of descriptors.

use crate::{Result, TransportError};
use std::os::fd::RawFd;

/// Waits up to `timeout_ms` (-1: forever) until one of `fds` is readable or hung up;
/// returns how many are. EINTR counts as zero.
pub fn poll_readable(fds: &[RawFd], timeout_ms: i32) -> Result<usize> {
    let mut polls: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `polls` is a live, correctly sized array of pollfd for the call's duration.
    let ready = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, timeout_ms) };
    if ready < 0 {
        let err = std::io::Error::last_os_error();
        if err.kind() == std::io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(TransportError::io("poll", err));
    }
    Ok(ready as usize)
}

/// Puts `fd` in non-blocking mode.
#[cfg(feature = "rdma")]
pub(crate) fn set_nonblocking(fd: RawFd) -> Result<()> {
    // SAFETY: fcntl on a descriptor number only reads and sets its status flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(TransportError::last_os("fcntl O_NONBLOCK"));
    }
    Ok(())
}
