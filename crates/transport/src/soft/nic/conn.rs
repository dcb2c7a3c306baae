//! A non-blocking TCP connection with input and output buffers, owned by the NIC thread.
//!
//! The NIC never blocks on a socket: it appends frames to `output` and writes what the
//! kernel takes; it reads what is there into `input` and parses whole frames only.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};

const READ_CHUNK: usize = 256 * 1024;

/// A buffered non-blocking stream.
#[derive(Debug)]
pub(crate) struct Conn {
    stream: TcpStream,
    input: Vec<u8>,
    consumed: usize,
    /// Frames waiting to be written.
    pub output: Vec<u8>,
    written: usize,
}

impl Conn {
    /// Wraps `stream`, switching it to non-blocking, no-delay mode.
    pub(crate) fn new(stream: TcpStream) -> io::Result<Self> {
        stream.set_nonblocking(true)?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            input: Vec::new(),
            consumed: 0,
            output: Vec::new(),
            written: 0,
        })
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    /// Unparsed input.
    pub(crate) fn input(&self) -> &[u8] {
        &self.input[self.consumed..]
    }

    /// Unparsed input and the output buffer, borrowed together.
    pub(crate) fn parts(&mut self) -> (&[u8], &mut Vec<u8>) {
        (&self.input[self.consumed..], &mut self.output)
    }

    /// Marks `count` input bytes as parsed.
    pub(crate) fn consume(&mut self, count: usize) {
        self.consumed += count;
        if self.consumed == self.input.len() {
            self.input.clear();
            self.consumed = 0;
        }
    }

    /// Whether output is still waiting for the kernel.
    pub(crate) fn has_output(&self) -> bool {
        self.written < self.output.len()
    }

    /// Reads what is available; Ok(true) if bytes arrived, an error on EOF or failure.
    pub(crate) fn fill(&mut self) -> io::Result<bool> {
        if self.consumed > 0 && self.consumed * 2 >= self.input.len() {
            self.input.drain(..self.consumed);
            self.consumed = 0;
        }
        let mut progress = false;
        loop {
            let start = self.input.len();
            self.input.resize(start + READ_CHUNK, 0);
            let result = self.stream.read(&mut self.input[start..]);
            let got = *result.as_ref().unwrap_or(&0);
            self.input.truncate(start + got);
            match result {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) if n < READ_CHUNK => return Ok(true),
                Ok(_) => progress = true,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(progress),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Writes buffered output; Ok(true) if bytes left, an error if the peer is gone.
    pub(crate) fn flush(&mut self) -> io::Result<bool> {
        let mut progress = false;
        while self.has_output() {
            match self.stream.write(&self.output[self.written..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.written += n;
                    progress = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(progress),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.output.clear();
        self.written = 0;
        Ok(progress)
    }
}
