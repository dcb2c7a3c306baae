//! A non-blocking TCP connection with input and output buffers, owned by the NIC thread.
//!
//! The NIC never blocks on a socket: it appends frames to `output` and writes what the
//! kernel takes; it reads what is there into `input` and parses whole frames only, except
//! large payloads, which [`Conn::place`] moves from the socket straight into registered
//! memory.

use crate::sys::{OutputQueue, SharedMemory};
use std::io::{self, Read};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};

const INITIAL_INPUT: usize = 256 * 1024;
/// Unwritten output above which a responder stops taking requests (backpressure: a peer
/// that does not read its answers cannot make the NIC queue more than about this).
pub(crate) const OUTPUT_CAP: usize = 4 << 20;
/// Largest input buffer kept once it is empty.
const MAX_IDLE_INPUT: usize = 4 << 20;

/// A buffered non-blocking stream.
///
/// Invariant: `input[consumed..filled]` is received, unparsed data; `input` is allocated
/// (and zeroed) once and only grows, so reads never re-initialise memory.
#[derive(Debug)]
pub(crate) struct Conn {
    stream: TcpStream,
    input: Vec<u8>,
    consumed: usize,
    filled: usize,
    /// Frames waiting to be written.
    pub output: OutputQueue,
    /// The last flush left output the kernel would not take (the socket is full).
    blocked: bool,
}

impl Conn {
    /// Wraps `stream`, switching it to non-blocking, no-delay mode.
    pub(crate) fn new(stream: TcpStream) -> io::Result<Self> {
        Self::with_input(stream, INITIAL_INPUT)
    }

    /// Like [`Conn::new`] with an input buffer of `input_len` bytes (an accepted
    /// connection reads only its hello until it is bound; [`Conn::grow_input`] then).
    pub(crate) fn with_input(stream: TcpStream, input_len: usize) -> io::Result<Self> {
        stream.set_nonblocking(true)?;
        stream.set_nodelay(true)?;
        let input = vec![0; input_len];
        Ok(Conn {
            stream,
            input,
            consumed: 0,
            filled: 0,
            output: OutputQueue::default(),
            blocked: false,
        })
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    /// Unparsed input.
    pub(crate) fn input(&self) -> &[u8] {
        &self.input[self.consumed..self.filled]
    }

    /// Unparsed input and the output buffer, borrowed together.
    pub(crate) fn parts(&mut self) -> (&[u8], &mut OutputQueue) {
        (&self.input[self.consumed..self.filled], &mut self.output)
    }

    /// Marks `count` input bytes as parsed.
    pub(crate) fn consume(&mut self, count: usize) {
        self.consumed = (self.consumed + count).min(self.filled);
        if self.consumed == self.filled {
            self.consumed = 0;
            self.filled = 0;
            if self.input.len() > MAX_IDLE_INPUT {
                // A huge frame grew the buffer; give the memory back once it is parsed.
                self.input = vec![0; INITIAL_INPUT];
            }
        }
    }

    /// Gives a connection made [`Conn::with_input`] the normal input buffer.
    pub(crate) fn grow_input(&mut self) {
        if self.input.len() < INITIAL_INPUT {
            self.input.resize(INITIAL_INPUT, 0);
        }
    }

    /// Makes room for at least `want` unparsed bytes in total (a whole frame).
    pub(crate) fn reserve_frame(&mut self, want: usize) {
        if self.input.len() - self.consumed >= want {
            return;
        }
        self.compact();
        if self.input.len() < want {
            self.input.resize(want.next_power_of_two(), 0);
        }
    }

    fn compact(&mut self) {
        self.input.copy_within(self.consumed..self.filled, 0);
        self.filled -= self.consumed;
        self.consumed = 0;
    }

    /// Shuts the stream down both ways: the peer sees EOF while the descriptor stays open.
    pub(crate) fn shutdown(&self) {
        // A stream the peer already closed needs nothing more.
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }

    /// Whether output is still waiting for the kernel.
    pub(crate) fn has_output(&self) -> bool {
        !self.output.is_empty()
    }

    /// Whether unwritten output has reached [`OUTPUT_CAP`].
    pub(crate) fn output_full(&self) -> bool {
        self.output.len() >= OUTPUT_CAP
    }

    /// Whether output waits and the socket was full at the last flush: only writability
    /// (epoll [`WRITE`](crate::sys::WRITE)) can move it on.
    pub(crate) fn output_blocked(&self) -> bool {
        self.blocked && self.has_output()
    }

    /// Whether output waits that a flush could write now (it was queued after the last
    /// flush, or that flush found room).
    pub(crate) fn output_ready(&self) -> bool {
        self.has_output() && !self.blocked
    }

    /// Reads what is available (a short read means drained); Ok(true) if bytes arrived, an
    /// error on EOF or failure.
    pub(crate) fn fill(&mut self) -> io::Result<bool> {
        let mut progress = false;
        loop {
            if self.filled == self.input.len() {
                if self.consumed == 0 {
                    return Ok(progress);
                }
                self.compact();
            }
            let room = self.input.len() - self.filled;
            match self.stream.read(&mut self.input[self.filled..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    self.filled += n;
                    progress = true;
                    if n < room {
                        // The socket is drained for now; skip the read that would say so.
                        return Ok(true);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(progress),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
    /// Writes buffered output; Ok(true) if bytes left, an error if the peer is gone.
    pub(crate) fn flush(&mut self) -> io::Result<bool> {
        let sent = self.output.write_to(self.stream.as_raw_fd())?;
        // `write_to` stops early only when the kernel would block.
        self.blocked = self.has_output();
        Ok(sent > 0)
    }

    /// Drops up to `len` incoming bytes (a refused payload): first what is buffered, then,
    /// if `read_socket`, from the socket. Returns the bytes dropped; an error on EOF.
    pub(crate) fn discard(&mut self, len: usize, read_socket: bool) -> io::Result<usize> {
        let buffered = (self.filled - self.consumed).min(len);
        self.consume(buffered);
        let mut dropped = buffered;
        let mut scratch = [0u8; 16 * 1024];
        while read_socket && dropped < len {
            let want = (len - dropped).min(scratch.len());
            match self.stream.read(&mut scratch[..want]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(got) => dropped += got,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(dropped)
    }

    /// Moves up to `len` incoming bytes into `mem` at `offset`: first what is buffered,
    /// then, if `read_socket`, straight from the socket. Returns the bytes placed; an
    /// error on EOF or failure.
    pub(crate) fn place(
        &mut self,
        mem: &SharedMemory,
        offset: usize,
        len: usize,
        read_socket: bool,
    ) -> io::Result<usize> {
        let invalid = |_| io::Error::from(io::ErrorKind::InvalidInput);
        let buffered = (self.filled - self.consumed).min(len);
        if buffered > 0 {
            mem.write(offset, &self.input[self.consumed..self.consumed + buffered])
                .map_err(invalid)?;
            self.consume(buffered);
        }
        let mut placed = buffered;
        while read_socket && placed < len {
            match mem.read_from(self.stream.as_raw_fd(), offset + placed, len - placed) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(got) => placed += got,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(placed)
    }
}
