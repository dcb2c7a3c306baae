//! Doorbells (an eventfd inside a process, an abstract unix datagram socket across
//! processes).

use crate::{Result, TransportError};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::atomic::{AtomicU64, Ordering};

/// A doorbell other processes on the host can ring: a non-blocking unix datagram socket
/// bound to an abstract name; any datagram makes it readable.
#[derive(Debug)]
pub(crate) struct Doorbell {
    socket: UnixDatagram,
    name: String,
}

impl Doorbell {
    /// Binds a new doorbell with a name unique on this host.
    pub(crate) fn new() -> Result<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "kvcm-nic-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let io = |e| TransportError::io("bind doorbell", e);
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).map_err(io)?;
        let socket = UnixDatagram::bind_addr(&addr).map_err(io)?;
        socket.set_nonblocking(true).map_err(io)?;
        Ok(Doorbell { socket, name })
    }

    /// The name peers ring.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Makes the doorbell readable.
    pub(crate) fn ring(&self) {
        if let Ok(addr) = SocketAddr::from_abstract_name(self.name.as_bytes()) {
            // A full queue already means "readable"; nothing to handle.
            let _ = self.socket.send_to_addr(&[1], &addr);
        }
    }

    /// Empties the doorbell.
    pub(crate) fn drain(&self) {
        let mut buf = [0u8; 16];
        while self.socket.recv(&mut buf).is_ok() {}
    }

    /// The descriptor, for polling.
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

/// The ringing end of another process's [`Doorbell`].
#[derive(Debug)]
pub(crate) struct RemoteDoorbell {
    socket: UnixDatagram,
    addr: SocketAddr,
}

impl RemoteDoorbell {
    /// Prepares to ring the doorbell called `name`.
    pub(crate) fn new(name: &str) -> Result<Self> {
        let io = |e| TransportError::io("doorbell", e);
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).map_err(io)?;
        let socket = UnixDatagram::unbound().map_err(io)?;
        socket.set_nonblocking(true).map_err(io)?;
        Ok(RemoteDoorbell { socket, addr })
    }

    /// Rings it (best effort: a full queue or a gone peer need no ring).
    pub(crate) fn ring(&self) {
        let _ = self.socket.send_to_addr(&[1], &self.addr);
    }
}

/// An eventfd used as a doorbell: `ring` makes it readable, `drain` resets it.
#[derive(Debug)]
pub(crate) struct EventFd(OwnedFd);

impl EventFd {
    /// A new non-blocking eventfd.
    pub(crate) fn new() -> Result<Self> {
        // SAFETY: plain syscall with constant flags.
        let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(TransportError::last_os("eventfd"));
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(raw) }))
    }

    /// Makes the eventfd readable.
    pub(crate) fn ring(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live local buffer. A full counter (EAGAIN) already
        // means "readable", so the result needs no handling.
        unsafe { libc::write(self.0.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    /// Resets the eventfd to not readable.
    pub(crate) fn drain(&self) {
        let mut buf = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live local buffer; EAGAIN means already empty.
        unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    }

    /// The descriptor, for polling.
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_makes_readable_and_drain_resets() {
        let bell = EventFd::new().unwrap();
        assert_eq!(super::super::poll_readable(&[bell.raw_fd()], 0).unwrap(), 0);
        bell.ring();
        bell.ring();
        assert_eq!(super::super::poll_readable(&[bell.raw_fd()], 0).unwrap(), 1);
        bell.drain();
        assert_eq!(super::super::poll_readable(&[bell.raw_fd()], 0).unwrap(), 0);
    }

    #[test]
    fn remote_ring_wakes_the_doorbell() {
        let bell = Doorbell::new().unwrap();
        let remote = RemoteDoorbell::new(bell.name()).unwrap();
        assert_eq!(super::super::poll_readable(&[bell.raw_fd()], 0).unwrap(), 0);
        remote.ring();
        bell.ring();
        assert_eq!(super::super::poll_readable(&[bell.raw_fd()], 0).unwrap(), 1);
        bell.drain();
        assert_eq!(super::super::poll_readable(&[bell.raw_fd()], 0).unwrap(), 0);
    }
}
