//! A level-triggered epoll set keyed by file descriptor.

use crate::{Result, TransportError};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const MAX_EVENTS: usize = 256;

/// An epoll instance; a closed descriptor leaves the set by itself.
#[derive(Debug)]
pub(crate) struct Epoll {
    fd: OwnedFd,
    /// Event buffer reused by every `wait` (filling a fresh one each round costs more than
    /// the busy-polling syscall it serves).
    events: Vec<libc::epoll_event>,
}

impl Epoll {
    pub(crate) fn new() -> Result<Self> {
        // SAFETY: plain syscall with a constant flag.
        let raw = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if raw < 0 {
            return Err(TransportError::last_os("epoll_create1"));
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let events = vec![libc::epoll_event { events: 0, u64: 0 }; MAX_EVENTS];
        Ok(Epoll { fd, events })
    }

    /// Watches `fd` for readability (and hang-up), level-triggered.
    pub(crate) fn add(&self, fd: RawFd) -> Result<()> {
        let mut event = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: fd as u64,
        };
        // SAFETY: `event` is a live, initialised epoll_event for the call's duration.
        let rc =
            unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut event) };
        if rc < 0 {
            return Err(TransportError::last_os("epoll_ctl"));
        }
        Ok(())
    }

    /// Stops watching `fd` (which stays open).
    pub(crate) fn delete(&self, fd: RawFd) -> Result<()> {
        let mut event = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: `event` is a live epoll_event (ignored by EPOLL_CTL_DEL on current kernels).
        let rc =
            unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, &mut event) };
        if rc < 0 {
            return Err(TransportError::last_os("epoll_ctl"));
        }
        Ok(())
    }

    /// Replaces `ready` with the descriptors readable within `timeout_ms` (0: now).
    pub(crate) fn wait(&mut self, ready: &mut Vec<RawFd>, timeout_ms: i32) -> Result<()> {
        let events = &mut self.events;
        // SAFETY: `events` is a live, initialised buffer of MAX_EVENTS entries the kernel
        // may fill.
        let count = unsafe {
            libc::epoll_wait(
                self.fd.as_raw_fd(),
                events.as_mut_ptr(),
                MAX_EVENTS as i32,
                timeout_ms,
            )
        };
        ready.clear();
        if count < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                return Ok(());
            }
            return Err(TransportError::io("epoll_wait", err));
        }
        ready.extend(
            events[..count as usize]
                .iter()
                .map(|event| event.u64 as RawFd),
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::EventFd;

    #[test]
    fn reports_only_readable_descriptors() {
        let mut epoll = Epoll::new().unwrap();
        let (quiet, loud) = (EventFd::new().unwrap(), EventFd::new().unwrap());
        epoll.add(quiet.raw_fd()).unwrap();
        epoll.add(loud.raw_fd()).unwrap();
        let mut ready = Vec::new();
        epoll.wait(&mut ready, 0).unwrap();
        assert!(ready.is_empty());
        loud.ring();
        epoll.wait(&mut ready, 0).unwrap();
        assert_eq!(ready, [loud.raw_fd()]);
        epoll.delete(loud.raw_fd()).unwrap();
        epoll.wait(&mut ready, 0).unwrap();
        assert!(
            ready.is_empty(),
            "a deleted descriptor is no longer reported"
        );
        assert!(epoll.delete(loud.raw_fd()).is_err());
        assert!(epoll.add(-1).is_err());
    }
}
