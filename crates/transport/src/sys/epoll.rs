//! A level-triggered epoll set keyed by file descriptor.
//!
//! Interest is a mask of [`READ`] and [`WRITE`]; 0 means "not in the set". A socket with
//! unwritten output is watched for [`WRITE`] so that a NIC with nothing else to do sleeps
//! until the kernel takes more, instead of retrying the write in a loop.

use crate::{Result, TransportError};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const MAX_EVENTS: usize = 256;
/// Interest in readability (and hang-up).
pub(crate) const READ: u32 = libc::EPOLLIN as u32;
/// Interest in writability.
pub(crate) const WRITE: u32 = libc::EPOLLOUT as u32;

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
        self.ctl(libc::EPOLL_CTL_ADD, fd, READ)
    }

    /// Stops watching `fd` (which stays open).
    pub(crate) fn delete(&self, fd: RawFd) -> Result<()> {
        self.ctl(libc::EPOLL_CTL_DEL, fd, 0)
    }

    /// Changes the interest in `fd` from `before` to `after` (masks of [`READ`] and
    /// [`WRITE`]; 0: not in the set).
    pub(crate) fn update(&self, fd: RawFd, before: u32, after: u32) -> Result<()> {
        match (before, after) {
            _ if before == after => Ok(()),
            (0, _) => self.ctl(libc::EPOLL_CTL_ADD, fd, after),
            (_, 0) => self.ctl(libc::EPOLL_CTL_DEL, fd, 0),
            _ => self.ctl(libc::EPOLL_CTL_MOD, fd, after),
        }
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, events: u32) -> Result<()> {
        let mut event = libc::epoll_event {
            events,
            u64: fd as u64,
        };
        // SAFETY: `event` is a live, initialised epoll_event for the call's duration.
        let rc = unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut event) };
        if rc < 0 {
            return Err(TransportError::last_os("epoll_ctl"));
        }
        Ok(())
    }

    /// Replaces `ready` with the descriptors ready (as their interest asks) within
    /// `timeout_ms` (0: now).
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

    #[test]
    fn write_interest_reports_a_writable_descriptor_and_can_be_dropped() {
        let mut epoll = Epoll::new().unwrap();
        let quiet = EventFd::new().unwrap();
        let mut ready = Vec::new();
        epoll.update(quiet.raw_fd(), 0, READ).unwrap();
        epoll.wait(&mut ready, 0).unwrap();
        assert!(ready.is_empty(), "not readable");
        epoll.update(quiet.raw_fd(), READ, READ | WRITE).unwrap();
        epoll.wait(&mut ready, 0).unwrap();
        assert_eq!(ready, [quiet.raw_fd()], "an eventfd is writable");
        epoll.update(quiet.raw_fd(), READ | WRITE, 0).unwrap();
        epoll.wait(&mut ready, 0).unwrap();
        assert!(ready.is_empty());
        assert!(
            epoll.update(quiet.raw_fd(), READ, WRITE).is_err(),
            "not in the set"
        );
    }
}
