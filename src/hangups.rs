//! Hang-up detection for verbs queue pairs (the lookup path's and the pool nodes'). A verbs
//! queue pair notices that its peer is gone only when it sends to it, and a responder-only
//! queue pair (a pool node's, served by the device) never sends; so a client that exits
//! would leave the server's queue pair and its buffers behind for good. On verbs the
//! handshake connection therefore stays open for the queue pair's life (the client keeps
//! it), and its closing — the client dropped it, or its process ended and the kernel closed
//! the socket — tears the queue pair down. The soft wires detect a lost peer themselves.
//!
//! One thread polls every watched connection (and a doorbell for new ones). Invariant: a
//! watched connection belongs to the queue pair its key names; once `live` says that queue
//! pair is gone (its owner dropped it for another reason), its connection is closed at the
//! next round without tearing anything down.

use std::io::ErrorKind;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// Longest wait between two looks at the watched connections.
const ROUND: Duration = Duration::from_secs(1);

type Watched<K> = Arc<Mutex<Vec<(K, TcpStream)>>>;

/// Watches the handshake connections of queue pairs, each named by a key `K`.
pub(crate) struct HangupWatcher<K> {
    watched: Watched<K>,
    doorbell: UnixDatagram,
}

impl<K: Send + 'static> HangupWatcher<K> {
    /// Starts the watching thread `name`: it calls `hung_up` with the key of each watched
    /// connection that closes while `live` still holds for that key.
    pub(crate) fn start(
        name: &str,
        live: impl Fn(&K) -> bool + Send + 'static,
        hung_up: impl Fn(&K) + Send + 'static,
    ) -> std::io::Result<Self> {
        let (doorbell, wake) = UnixDatagram::pair()?;
        doorbell.set_nonblocking(true)?;
        wake.set_nonblocking(true)?;
        let watched = Watched::default();
        let shared = Arc::clone(&watched);
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || run(&shared, &wake, &live, &hung_up))?;
        Ok(HangupWatcher { watched, doorbell })
    }

    /// Watches `stream`, the handshake connection of `key`'s queue pair.
    pub(crate) fn watch(&self, key: K, stream: TcpStream) -> std::io::Result<()> {
        stream.set_nonblocking(true)?;
        lock(&self.watched).push((key, stream));
        let _ = self.doorbell.send(&[1]);
        Ok(())
    }
}

fn lock<K>(watched: &Watched<K>) -> MutexGuard<'_, Vec<(K, TcpStream)>> {
    watched.lock().unwrap_or_else(PoisonError::into_inner)
}

/// While the [`HangupWatcher`] lives: waits for a hang-up, a new connection or [`ROUND`],
/// then reports the live queue pairs whose connection closed and forgets the connections of
/// queue pairs that are gone.
fn run<K>(
    watched: &Watched<K>,
    wake: &UnixDatagram,
    live: &dyn Fn(&K) -> bool,
    hung_up: &dyn Fn(&K),
) {
    while Arc::strong_count(watched) > 1 {
        let mut fds: Vec<_> = lock(watched).iter().map(|(_, s)| s.as_raw_fd()).collect();
        fds.push(wake.as_raw_fd());
        let _ = kvcm_transport::poll_readable(&fds, ROUND.as_millis() as i32);
        let mut drain = [0u8; 64];
        while wake.recv(&mut drain).is_ok_and(|n| n > 0) {}
        lock(watched).retain(|(key, stream)| {
            if !live(key) {
                return false;
            }
            if closed(stream) {
                hung_up(key);
                return false;
            }
            true
        });
    }
}

/// Whether the peer closed `stream` (EOF or an error); bytes it sent are read and ignored.
fn closed(stream: &TcpStream) -> bool {
    let mut buffer = [0u8; 64];
    loop {
        match std::io::Read::read(&mut &*stream, &mut buffer) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return true,
        }
    }
}
