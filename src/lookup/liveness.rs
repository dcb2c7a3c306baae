//! Hang-up detection for verbs queue pairs. A verbs queue pair notices that its peer is gone
//! only when it sends to it, so a client that exits would leave the server's queue pair and
//! its message buffers (2 MiB) behind for good. On verbs the handshake connection therefore
//! stays open for the queue pair's life (the client keeps it), and its closing — the client
//! dropped its connection, or its process ended and the kernel closed the socket — tears the
//! queue pair down. The soft wires detect a lost peer themselves and are not watched.
//!
//! One thread polls every watched connection (and a doorbell for new ones). Invariant: a
//! watched connection belongs to the queue pair its key names; when that key is no longer
//! bound in the core (the sweep or the poller dropped the queue pair), the connection is
//! closed at the next round, and a new queue pair with the same key replaces the old watch.

use std::io::ErrorKind;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::core::{CoreHandle, PeerKey};
use super::grants::Grant;
use super::LookupError;

/// Longest wait between two looks at the watched connections.
const ROUND: Duration = Duration::from_secs(1);

/// A watched connection: its queue pair's key and grant (the grant tells a queue pair from
/// a later one with the same number).
type Watch = (PeerKey, Arc<Grant>, TcpStream);

type Watched = Arc<Mutex<Vec<Watch>>>;

/// Watches handshake connections of verbs queue pairs.
pub(super) struct Watcher {
    watched: Watched,
    doorbell: UnixDatagram,
}

impl Watcher {
    /// Starts the watching thread, which tears queue pairs down through `core`.
    pub(super) fn start(core: CoreHandle) -> Result<Watcher, LookupError> {
        let (doorbell, wake) = UnixDatagram::pair().map_err(LookupError::Listener)?;
        doorbell
            .set_nonblocking(true)
            .map_err(LookupError::Listener)?;
        wake.set_nonblocking(true).map_err(LookupError::Listener)?;
        let watched = Watched::default();
        let shared = Arc::clone(&watched);
        std::thread::Builder::new()
            .name("kvcm-lookup-hangup".into())
            .spawn(move || run(&shared, &wake, &core))
            .map_err(LookupError::Listener)?;
        Ok(Watcher { watched, doorbell })
    }

    /// Tears `key`'s queue pair (bound to `grant`) down once `stream` closes.
    pub(super) fn watch(
        &self,
        key: PeerKey,
        grant: Arc<Grant>,
        stream: TcpStream,
    ) -> Result<(), LookupError> {
        stream
            .set_nonblocking(true)
            .map_err(LookupError::Listener)?;
        let mut watched = lock(&self.watched);
        watched.retain(|(watched_key, _, _)| *watched_key != key);
        watched.push((key, grant, stream));
        drop(watched);
        let _ = self.doorbell.send(&[1]);
        Ok(())
    }
}

fn lock(watched: &Watched) -> MutexGuard<'_, Vec<Watch>> {
    watched.lock().unwrap_or_else(PoisonError::into_inner)
}

/// While the [`Watcher`] lives: waits for a hang-up, a new connection or [`ROUND`], then
/// tears down the queue pairs whose connection closed and forgets the connections of queue
/// pairs that are gone.
fn run(watched: &Watched, wake: &UnixDatagram, core: &CoreHandle) {
    while Arc::strong_count(watched) > 1 {
        let mut fds: Vec<_> = lock(watched)
            .iter()
            .map(|(_, _, s)| s.as_raw_fd())
            .collect();
        fds.push(wake.as_raw_fd());
        let _ = kvcm_transport::poll_readable(&fds, ROUND.as_millis() as i32);
        let mut drain = [0u8; 64];
        while wake.recv(&mut drain).is_ok_and(|n| n > 0) {}
        let bound = core.bound();
        lock(watched).retain(|(key, grant, stream)| {
            let live = bound.iter().any(|(k, g)| k == key && Arc::ptr_eq(g, grant));
            if !live {
                return false;
            }
            if hung_up(stream) {
                tracing::info!(
                    wire = key.0,
                    qpn = key.1,
                    "lookup queue pair torn down: its client hung up"
                );
                core.close(*key, Arc::clone(grant));
                return false;
            }
            true
        });
    }
}

/// Whether the peer closed `stream` (EOF or an error); bytes it sent are read and ignored.
fn hung_up(stream: &TcpStream) -> bool {
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
