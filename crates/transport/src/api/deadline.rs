//! A TCP stream with one deadline for everything read and written on it: before each
//! socket read or write the stream's timeout is set to what is left, and once the deadline
//! has passed every call fails with `TimedOut`. So a peer that trickles its bytes (each
//! read quick, the whole slow) cannot stretch a handshake, a TLS negotiation run inside
//! the first read or write, or an answer, past the deadline.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// `stream`, with every byte in or out by `end` (see the module docs).
#[derive(Debug)]
pub struct DeadlineStream<S> {
    stream: S,
    end: Instant,
}

impl<S: std::borrow::BorrowMut<TcpStream>> DeadlineStream<S> {
    /// `stream` (owned or borrowed) with a deadline of `limit` from now.
    pub fn new(stream: S, limit: Duration) -> DeadlineStream<S> {
        DeadlineStream {
            stream,
            end: Instant::now() + limit,
        }
    }

    /// What is left until the deadline; `TimedOut` once none is.
    fn left(&self) -> io::Result<Duration> {
        let left = self.end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        Ok(left)
    }
}

impl<S: std::borrow::BorrowMut<TcpStream>> Read for DeadlineStream<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.left()?;
        let stream = self.stream.borrow_mut();
        stream.set_read_timeout(Some(left))?;
        stream.read(buf).map_err(timeout_as_timed_out)
    }
}

impl<S: std::borrow::BorrowMut<TcpStream>> Write for DeadlineStream<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let left = self.left()?;
        let stream = self.stream.borrow_mut();
        stream.set_write_timeout(Some(left))?;
        stream.write(buf).map_err(timeout_as_timed_out)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.borrow_mut().flush()
    }
}

/// A blocking socket whose timeout runs out reports `WouldBlock` (EAGAIN) on Linux; the
/// deadline has then passed, so it is reported as `TimedOut` like every later call.
fn timeout_as_timed_out(error: io::Error) -> io::Error {
    if error.kind() == io::ErrorKind::WouldBlock {
        return io::ErrorKind::TimedOut.into();
    }
    error
}

/// A test peer that accepts one connection, writes `head`, then one byte every `every`
/// (`count` of them, or until the reader hangs up): each read is quick, the whole slow.
#[cfg(test)]
pub(crate) fn trickler(
    head: Vec<u8>,
    every: Duration,
    count: usize,
) -> (std::net::SocketAddr, std::thread::JoinHandle<()>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let trickling = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        if stream.write_all(&head).is_err() {
            return;
        }
        for _ in 0..count {
            std::thread::sleep(every);
            if stream.write_all(b"x").is_err() {
                return;
            }
        }
    });
    (addr, trickling)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_trickling_bytes_runs_out_of_one_deadline() {
        let (addr, trickler) = trickler(Vec::new(), Duration::from_millis(50), 200);
        let client = TcpStream::connect(addr).unwrap();
        let limit = Duration::from_millis(300);
        let started = Instant::now();
        let mut stream = DeadlineStream::new(client, limit);
        let mut all = Vec::new();
        let error = stream.read_to_end(&mut all).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() < limit * 2, "{:?}", started.elapsed());
        assert!(!all.is_empty(), "it read what came in time");
        drop(stream);
        trickler.join().unwrap();
    }

    #[test]
    fn a_silent_peer_is_timed_out_not_would_block() {
        // The socket's own timeout ends this read (EAGAIN on Linux); it still reads as
        // the deadline passing, as callers match on `TimedOut`.
        let (addr, trickler) = trickler(Vec::new(), Duration::from_millis(500), 1);
        let client = TcpStream::connect(addr).unwrap();
        let mut stream = DeadlineStream::new(client, Duration::from_millis(100));
        let error = stream.read(&mut [0u8; 8]).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        drop(stream);
        trickler.join().unwrap();
    }
}
