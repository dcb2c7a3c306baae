//! Accepting connections whose first bytes are a handshake (the lookup and pool queue-pair
//! listeners): each connection is handled on a thread of its own, at most `max` at once;
//! more are closed at once, so silent clients neither delay others nor pile up.
//!
//! Invariants: a handshake holds its slot until its handler returns or panics (the slot is
//! given back either way); a connection whose handler still runs [`HANDSHAKE_LIMIT`] after
//! it was accepted is shut down, so a client that trickles its bytes (each read's own
//! timeout restarting at every byte) holds a slot for that long at most. A handler that
//! keeps the connection past its handshake (to watch its client's life) ends the limit
//! first with [`Handshake::keep`], which atomically either takes the connection out of
//! the limit's reach or says it was already cut off.

use std::collections::BTreeMap;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use nix::errno::Errno;

/// Longest a handshake's handler may use its connection: the reads of a hello, a ticket
/// and an endpoint, a queue pair's connect (5 s at most on soft-TCP) and a heartbeat
/// awaited by a runs request (1 s at most) all fit, with room for a loaded machine.
pub(crate) const HANDSHAKE_LIMIT: Duration = Duration::from_secs(15);

/// Accepts on `listener` on a thread named `name` until the process ends, running
/// `handle` for each connection on its own thread (at most `max` at once, each for at most
/// [`HANDSHAKE_LIMIT`] unless it keeps the connection).
pub(crate) fn serve(
    listener: TcpListener,
    name: &str,
    max: usize,
    handle: impl Fn(TcpStream, Handshake) + Send + Sync + 'static,
) -> std::io::Result<()> {
    serve_within(listener, name, max, HANDSHAKE_LIMIT, handle)
}

/// [`serve`] with a handler's time limited to `limit`.
fn serve_within(
    listener: TcpListener,
    name: &str,
    max: usize,
    limit: Duration,
    handle: impl Fn(TcpStream, Handshake) + Send + Sync + 'static,
) -> std::io::Result<()> {
    let handle = Arc::new(handle);
    let worker = format!("{name}-hello");
    let limits = Limits::start(&format!("{name}-limit"))?;
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let in_flight = Arc::new(AtomicUsize::new(0));
            let mut out_of_descriptors = false;
            for accepted in listener.incoming() {
                let stream = match accepted {
                    Ok(stream) => {
                        out_of_descriptors = false;
                        stream
                    }
                    Err(error) => {
                        out_of_descriptors = back_off(&error, out_of_descriptors);
                        continue;
                    }
                };
                if in_flight.fetch_add(1, Ordering::SeqCst) >= max {
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    continue; // dropped: closed at once
                }
                let slot = Slot(in_flight.clone());
                let handshake = Handshake {
                    limits: limits.clone(),
                    watched: limits.watch(&stream, limit),
                };
                let handle = handle.clone();
                let spawned = std::thread::Builder::new()
                    .name(worker.clone())
                    .spawn(move || {
                        let _slot = slot;
                        handle(stream, handshake);
                    });
                if spawned.is_err() {
                    tracing::warn!("no thread for a handshake: connection refused");
                }
            }
        })?;
    Ok(())
}

/// After a failed accept: when the process or the system is out of descriptors or memory
/// (the connection stays queued in the kernel), waits [`EXHAUSTED_PAUSE`] instead of
/// spinning on the error, and says so once per episode; other errors (a connection that
/// aborted before it was accepted) are passed over at once. Returns whether the process is
/// still out of descriptors.
fn back_off(error: &std::io::Error, already_said: bool) -> bool {
    let exhausted = matches!(
        error.raw_os_error().map(Errno::from_raw),
        Some(Errno::EMFILE | Errno::ENFILE | Errno::ENOBUFS | Errno::ENOMEM)
    );
    if exhausted {
        if !already_said {
            tracing::warn!(%error, "queue-pair listener cannot accept: pausing between tries");
        }
        std::thread::sleep(EXHAUSTED_PAUSE);
    }
    exhausted
}

/// How long a listener out of descriptors waits before it accepts again.
const EXHAUSTED_PAUSE: Duration = Duration::from_millis(50);

/// A handshake's place among the `max`: given back when dropped, also when its handler
/// panics or its thread could not start.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A handshake's time limit on its connection, ended when dropped (the handler returned or
/// panicked) or by [`Handshake::keep`].
pub(crate) struct Handshake {
    limits: Arc<Limits>,
    watched: Option<WatchKey>,
}

impl Handshake {
    /// Ends the limit, for a connection kept past its handshake: false when the limit
    /// already cut the connection off (it is shut down, and must not be kept).
    pub(crate) fn keep(&mut self) -> bool {
        self.watched
            .take()
            .is_none_or(|key| self.limits.unwatch(key))
    }
}

impl Drop for Handshake {
    fn drop(&mut self) {
        if let Some(key) = self.watched.take() {
            self.limits.unwatch(key);
        }
    }
}

/// A watched connection: its deadline and a number telling connections with the same one
/// apart.
type WatchKey = (Instant, u64);

/// The connections whose handlers run, by deadline; a thread shuts down each one still
/// there at its deadline.
#[derive(Default)]
struct Limits {
    watched: Mutex<(BTreeMap<WatchKey, TcpStream>, u64)>,
    changed: Condvar,
}

impl Limits {
    fn start(name: &str) -> std::io::Result<Arc<Limits>> {
        let limits = Arc::new(Limits::default());
        let enforcing = Arc::clone(&limits);
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || enforcing.enforce())?;
        Ok(limits)
    }

    fn lock(&self) -> MutexGuard<'_, (BTreeMap<WatchKey, TcpStream>, u64)> {
        self.watched.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Watches `stream` until `limit` from now (`None`: it could not be watched, as when
    /// the process is out of descriptors; its reads' own timeouts still apply).
    fn watch(&self, stream: &TcpStream, limit: Duration) -> Option<WatchKey> {
        let copy = stream.try_clone().ok()?;
        let mut watched = self.lock();
        watched.1 += 1;
        let key = (Instant::now() + limit, watched.1);
        watched.0.insert(key, copy);
        drop(watched);
        self.changed.notify_one();
        Some(key)
    }

    /// Stops watching; false when the connection was shut down already.
    fn unwatch(&self, key: WatchKey) -> bool {
        self.lock().0.remove(&key).is_some()
    }

    /// Shuts down each connection still watched at its deadline (a blocked read on it then
    /// fails at once); runs for the life of the process.
    fn enforce(&self) {
        let mut watched = self.lock();
        loop {
            let next = watched.0.first_key_value().map(|(key, _)| key.0);
            let now = Instant::now();
            watched = match next {
                Some(deadline) if deadline <= now => {
                    if let Some((_, stream)) = watched.0.pop_first() {
                        let _ = stream.shutdown(Shutdown::Both);
                    }
                    watched
                }
                Some(deadline) => {
                    self.changed
                        .wait_timeout(watched, deadline - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
                None => self
                    .changed
                    .wait(watched)
                    .unwrap_or_else(PoisonError::into_inner),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::sync::mpsc;

    /// A listener on a free port whose handler reads 64 bytes, reporting what the read
    /// came to; `max` handlers at once, each for at most `limit`.
    fn reader(max: usize, limit: Duration) -> (std::net::SocketAddr, mpsc::Receiver<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (told, heard) = mpsc::channel();
        let told = Mutex::new(told);
        serve_within(listener, "test-hs", max, limit, move |mut stream, _| {
            stream
                .set_read_timeout(Some(Duration::from_secs(30)))
                .unwrap();
            let mut bytes = [0u8; 64];
            let outcome = match stream.read_exact(&mut bytes) {
                Ok(()) => "read".to_string(),
                Err(error) => format!("{:?}", error.kind()),
            };
            let _ = told.lock().unwrap().send(outcome);
            if bytes[0] == b'!' {
                panic!("a handler that panics");
            }
        })
        .unwrap();
        (addr, heard)
    }

    #[test]
    fn an_accept_out_of_descriptors_pauses_and_an_aborted_one_does_not() {
        let started = Instant::now();
        let emfile = std::io::Error::from_raw_os_error(Errno::EMFILE as i32);
        assert!(back_off(&emfile, false), "still out of descriptors");
        assert!(started.elapsed() >= EXHAUSTED_PAUSE, "it paused");
        let aborted = std::io::Error::from_raw_os_error(Errno::ECONNABORTED as i32);
        assert!(!back_off(&aborted, true), "the episode is over");
    }

    #[test]
    fn a_client_trickling_its_bytes_is_cut_off_at_the_limit() {
        let (addr, heard) = reader(4, Duration::from_millis(300));
        let mut client = TcpStream::connect(addr).unwrap();
        let started = Instant::now();
        // One byte every 50 ms: each read's own timeout (30 s) would never fire.
        let mut cut = false;
        for _ in 0..60 {
            if client.write_all(b"x").is_err() {
                cut = true;
                break;
            }
            if let Ok(outcome) = heard.try_recv() {
                // Shut, the connection ends the read at its end of stream, or with a reset
                // when the client's next byte reached the shut socket first.
                assert!(
                    outcome == "UnexpectedEof" || outcome == "ConnectionReset",
                    "the read ends when its connection is shut: {outcome}"
                );
                cut = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(cut, "the trickling client was never cut off");
        assert!(started.elapsed() < Duration::from_secs(3));
    }

    #[test]
    fn a_panicking_handler_gives_its_slot_back() {
        let (addr, heard) = reader(1, Duration::from_secs(60));
        for round in 0..3 {
            // The slot comes back as the panicking handler's thread unwinds, which may be
            // just after its connection closed: a connection accepted before that is
            // closed at once, unheard, and tried again. A slot never given back would
            // leave every try unheard.
            let deadline = Instant::now() + Duration::from_secs(10);
            let served = loop {
                let mut client = TcpStream::connect(addr).unwrap();
                let _ = client.write_all(&[b'!'; 64]);
                if let Ok(outcome) = heard.recv_timeout(Duration::from_millis(200)) {
                    break Some(outcome);
                }
                if Instant::now() > deadline {
                    break None;
                }
            };
            assert_eq!(
                served.as_deref(),
                Some("read"),
                "round {round}: one slot, served"
            );
        }
    }

    #[test]
    fn a_kept_connection_outlives_the_limit_and_a_cut_one_is_not_kept() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (told, heard) = mpsc::channel();
        let told = Mutex::new(told);
        let limit = Duration::from_millis(200);
        serve_within(
            listener,
            "test-keep",
            4,
            limit,
            move |stream, mut handshake| {
                let mut first = [0u8; 1];
                let _ = (&stream).read_exact(&mut first);
                if first[0] == b'k' {
                    // Kept at once: the stream answers long after the limit.
                    let kept = handshake.keep();
                    std::thread::sleep(limit * 3);
                    let _ = (&stream).write_all(b"alive");
                    let _ = told.lock().unwrap().send(kept);
                } else {
                    // Kept only after the limit passed: refused.
                    std::thread::sleep(limit * 3);
                    let _ = told.lock().unwrap().send(handshake.keep());
                }
            },
        )
        .unwrap();
        let mut kept = TcpStream::connect(addr).unwrap();
        kept.write_all(b"k").unwrap();
        kept.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut alive = [0u8; 5];
        kept.read_exact(&mut alive)
            .expect("the kept stream still works");
        assert_eq!(&alive, b"alive");
        assert_eq!(heard.recv_timeout(Duration::from_secs(10)), Ok(true));
        let mut late = TcpStream::connect(addr).unwrap();
        late.write_all(b"l").unwrap();
        assert_eq!(
            heard.recv_timeout(Duration::from_secs(10)),
            Ok(false),
            "a connection the limit cut off is not kept"
        );
    }
}
