//! An output queue of byte buffers and registered-memory ranges, written with writev(2).
//!
//! Large payloads are queued as ranges of shared memory (held alive by `Arc`) and written
//! straight from the mapping, so the NIC does not copy them into a buffer first.
//! Invariant: every queued memory range was bounds-checked when it was pushed.
//! Writes use send/sendmsg with `MSG_NOSIGNAL` (the descriptor is a socket): a peer that
//! reset the connection is an error, never a SIGPIPE, even in a host (C, Python) that does
//! not ignore that signal.

use super::SharedMemory;
use crate::Result;
use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;

/// Most iovecs handed to one writev.
const MAX_IOVECS: usize = 64;
/// Largest tail written in place (a partial write shifts what is left to the front).
const MAX_INLINE_TAIL: usize = 64 * 1024;

#[derive(Debug)]
enum Segment {
    Bytes(Vec<u8>),
    Memory {
        mem: Arc<SharedMemory>,
        offset: usize,
        len: usize,
    },
}

impl Segment {
    fn len(&self) -> usize {
        match self {
            Segment::Bytes(bytes) => bytes.len(),
            Segment::Memory { len, .. } => *len,
        }
    }

    /// The iovec for this segment past its first `skip` bytes.
    fn iovec(&self, skip: usize) -> libc::iovec {
        let base = match self {
            Segment::Bytes(bytes) => bytes.as_ptr(),
            Segment::Memory { mem, offset, .. } => mem.base_ptr().wrapping_add(*offset),
        };
        libc::iovec {
            iov_base: base.wrapping_add(skip) as *mut libc::c_void,
            iov_len: self.len() - skip,
        }
    }
}

/// Bytes waiting to be written to a socket, in order.
#[derive(Debug, Default)]
pub(crate) struct OutputQueue {
    segments: VecDeque<Segment>,
    /// Unwritten bytes of `segments`.
    sealed: usize,
    /// Bytes appended after the last queued segment.
    tail: Vec<u8>,
    /// Bytes of the front segment already written.
    written: usize,
}

impl OutputQueue {
    /// The byte buffer at the end of the queue, to append to.
    pub(crate) fn bytes(&mut self) -> &mut Vec<u8> {
        &mut self.tail
    }

    /// Queues `len` bytes of `mem` at `offset`, to be written from the mapping.
    pub(crate) fn memory(
        &mut self,
        mem: Arc<SharedMemory>,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        mem.check(offset, len)?;
        self.seal_tail();
        self.sealed += len;
        self.segments
            .push_back(Segment::Memory { mem, offset, len });
        Ok(())
    }

    fn seal_tail(&mut self) {
        if !self.tail.is_empty() {
            self.sealed += self.tail.len();
            self.segments
                .push_back(Segment::Bytes(std::mem::take(&mut self.tail)));
        }
    }

    /// The memory queued by reference and not yet all written, as (memory, offset, length).
    pub(crate) fn memory_segments(
        &self,
    ) -> impl Iterator<Item = (&Arc<SharedMemory>, usize, usize)> {
        self.segments.iter().filter_map(|segment| match segment {
            Segment::Memory { mem, offset, len } => Some((mem, *offset, *len)),
            Segment::Bytes(_) => None,
        })
    }

    /// Bytes queued and not yet written.
    pub(crate) fn len(&self) -> usize {
        self.sealed + self.tail.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.segments.is_empty() && self.tail.is_empty()
    }

    /// Writes as much as `fd` takes; returns the bytes written (0 when it would block).
    pub(crate) fn write_to(&mut self, fd: RawFd) -> io::Result<usize> {
        if self.segments.is_empty() && self.tail.len() <= MAX_INLINE_TAIL {
            return self.write_tail(fd);
        }
        self.seal_tail();
        let mut total = 0;
        while !self.segments.is_empty() {
            let iovecs: Vec<libc::iovec> = self
                .segments
                .iter()
                .take(MAX_IOVECS)
                .enumerate()
                .map(|(index, segment)| segment.iovec(if index == 0 { self.written } else { 0 }))
                .collect();
            // SAFETY: an all-zero msghdr is valid (no name, no control data).
            let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
            message.msg_iov = iovecs.as_ptr().cast_mut();
            message.msg_iovlen = iovecs.len() as _;
            // SAFETY: every iovec points into a Vec or a bounds-checked shared mapping owned
            // by `self.segments`, which is not touched during the call; the kernel only
            // reads them through `message`, which outlives the call.
            let sent = unsafe { libc::sendmsg(fd, &message, libc::MSG_NOSIGNAL) };
            if sent < 0 {
                let err = io::Error::last_os_error();
                return match err.kind() {
                    io::ErrorKind::WouldBlock => Ok(total),
                    io::ErrorKind::Interrupted => continue,
                    _ => Err(err),
                };
            }
            total += sent as usize;
            self.advance(sent as usize);
        }
        Ok(total)
    }

    /// The common small case (only appended bytes queued): one write(2) from the tail,
    /// which keeps its allocation for the next frames.
    fn write_tail(&mut self, fd: RawFd) -> io::Result<usize> {
        let mut total = 0;
        while !self.tail.is_empty() {
            // SAFETY: writes from the initialised bytes of `self.tail`, which is not
            // touched during the call.
            let sent = unsafe {
                libc::send(
                    fd,
                    self.tail.as_ptr().cast(),
                    self.tail.len(),
                    libc::MSG_NOSIGNAL,
                )
            };
            if sent >= 0 {
                self.tail.drain(..sent as usize);
                total += sent as usize;
                continue;
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::WouldBlock => break,
                io::ErrorKind::Interrupted => {}
                _ => return Err(err),
            }
        }
        Ok(total)
    }

    fn advance(&mut self, mut sent: usize) {
        self.sealed -= sent;
        while let Some(front) = self.segments.front() {
            let left = front.len() - self.written;
            if sent < left {
                self.written += sent;
                return;
            }
            sent -= left;
            self.written = 0;
            self.segments.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn appended_bytes_survive_a_full_socket_and_keep_their_buffer() {
        let (writer, mut reader) = UnixStream::pair().unwrap();
        writer.set_nonblocking(true).unwrap();
        let chunk: Vec<u8> = (0..MAX_INLINE_TAIL).map(|i| (i % 251) as u8).collect();
        let mut queue = OutputQueue::default();
        let mut queued = 0;
        while queue.is_empty() {
            // Queue chunks until the socket no longer takes one whole.
            queue.bytes().extend_from_slice(&chunk);
            queued += 1;
            queue.write_to(writer.as_raw_fd()).unwrap();
        }
        let drain = std::thread::spawn(move || {
            let mut got = Vec::new();
            reader.read_to_end(&mut got).unwrap();
            got
        });
        while !queue.is_empty() {
            queue.write_to(writer.as_raw_fd()).unwrap();
            std::thread::yield_now();
        }
        assert!(
            queue.bytes().capacity() >= chunk.len(),
            "the buffer is kept"
        );
        drop(writer);
        let got = drain.join().unwrap();
        assert_eq!(got.len(), queued * chunk.len());
        assert!(
            got.chunks(chunk.len()).all(|piece| piece == chunk),
            "in order, whole"
        );
    }

    /// Whether SIGPIPE is pending for this thread (it must be blocked); consumes it.
    fn take_pending_sigpipe() -> bool {
        // SAFETY: plain signal-set calls on local, initialised sets.
        unsafe {
            let mut pending: libc::sigset_t = std::mem::zeroed();
            libc::sigpending(&mut pending);
            if libc::sigismember(&pending, libc::SIGPIPE) != 1 {
                return false;
            }
            let mut pipe: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut pipe);
            libc::sigaddset(&mut pipe, libc::SIGPIPE);
            let mut signal = 0;
            libc::sigwait(&pipe, &mut signal);
            true
        }
    }

    #[test]
    fn writing_to_a_closed_peer_is_an_error_not_a_sigpipe() {
        // SAFETY: blocks SIGPIPE for this test thread only, so a raised one stays pending.
        unsafe {
            let mut pipe: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut pipe);
            libc::sigaddset(&mut pipe, libc::SIGPIPE);
            libc::pthread_sigmask(libc::SIG_BLOCK, &pipe, std::ptr::null_mut());
        }
        let mem = Arc::new(SharedMemory::create(c"out", 4096).unwrap());
        for with_memory in [false, true] {
            let (writer, reader) = UnixStream::pair().unwrap();
            drop(reader);
            let mut queue = OutputQueue::default();
            queue.bytes().extend_from_slice(b"to nobody");
            if with_memory {
                queue.memory(Arc::clone(&mem), 0, 16).unwrap();
            }
            assert!(queue.write_to(writer.as_raw_fd()).is_err());
            assert!(
                !take_pending_sigpipe(),
                "SIGPIPE raised (memory: {with_memory})"
            );
        }
    }

    #[test]
    fn bytes_and_memory_arrive_in_order() {
        let (writer, mut reader) = UnixStream::pair().unwrap();
        let mem = Arc::new(SharedMemory::create(c"out", 4096).unwrap());
        mem.write(10, b"middle").unwrap();
        let mut queue = OutputQueue::default();
        queue.bytes().extend_from_slice(b"head-");
        queue.memory(Arc::clone(&mem), 10, 6).unwrap();
        queue.bytes().extend_from_slice(b"-tail");
        assert!(
            queue.memory(mem, 4000, 200).is_err(),
            "out-of-bounds ranges are refused"
        );
        assert_eq!(queue.len(), 16);
        assert_eq!(queue.write_to(writer.as_raw_fd()).unwrap(), 16);
        assert!(queue.is_empty());
        assert_eq!(queue.len(), 0);
        let mut got = [0u8; 16];
        reader.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"head-middle-tail");
    }
}
