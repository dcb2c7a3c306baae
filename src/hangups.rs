//! Hang-up detection for verbs queue pairs (the lookup path's and the pool nodes'). A verbs
//! queue pair notices that its peer is gone only when it sends to it, and a responder-only
//! queue pair (a pool node's, served by the device) never sends; so a client that exits
//! would leave the server's queue pair and its buffers behind for good. On verbs the
//! handshake connection therefore stays open for the queue pair's life (the client keeps
//! it), and its closing — the client dropped it, or its process ended and the kernel closed
//! the socket — tears the queue pair down. A client host that died or was cut off sends no
//! FIN: TCP keepalive ([`KEEPALIVE_IDLE`], then probes every [`KEEPALIVE_INTERVAL`], the
//! kernel's count of them) then fails the connection, about a minute later. The soft wires
//! detect a lost peer themselves.
//!
//! One thread polls every watched connection (and a doorbell for new ones). Invariants: a
//! watched connection belongs to the queue pair its key names; once `live` says that queue
//! pair is gone (its owner dropped it for another reason), its connection is closed at the
//! next round without tearing anything down; `live` and `hung_up` run without the
//! watcher's lock held (they may take their owner's locks, and a `watch` may come from a
//! thread holding those).

use std::io::ErrorKind;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// Longest wait between two looks at the watched connections.
const ROUND: Duration = Duration::from_secs(1);
/// Silence on a watched connection after which TCP keepalive starts probing its peer.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
/// Time between keepalive probes.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// Most bytes read from one connection per round (a client sends nothing after its
/// handshake; one that does cannot hold the watcher).
const DRAIN_PER_ROUND: usize = 4096;

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
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(KEEPALIVE_IDLE)
            .with_interval(KEEPALIVE_INTERVAL);
        socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive)?;
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
/// queue pairs that are gone (looked at with the lock released: new watches wait meanwhile
/// in the list and are looked at next round).
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
        let looked_at = std::mem::take(&mut *lock(watched));
        let mut kept = Vec::with_capacity(looked_at.len());
        for (key, stream) in looked_at {
            if !live(&key) {
                continue;
            }
            if closed(&stream) {
                hung_up(&key);
                continue;
            }
            kept.push((key, stream));
        }
        lock(watched).append(&mut kept);
    }
}

/// Whether the peer closed `stream` (EOF or an error); up to [`DRAIN_PER_ROUND`] bytes it
/// sent are read and ignored.
fn closed(stream: &TcpStream) -> bool {
    let mut buffer = [0u8; 256];
    let mut drained = 0;
    while drained < DRAIN_PER_ROUND {
        match std::io::Read::read(&mut &*stream, &mut buffer) {
            Ok(0) => return true,
            Ok(n) => drained += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return true,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::io::Write;
    use std::net::TcpListener;
    use std::sync::mpsc;
    use std::time::Instant;

    impl<K> HangupWatcher<K> {
        fn watching(&self) -> usize {
            lock(&self.watched).len()
        }
    }

    #[test]
    fn a_closed_connection_of_a_live_queue_pair_is_reported_once_and_others_are_not() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = listener.local_addr().expect("address");
        let live: Arc<Mutex<HashSet<u64>>> = Arc::new(Mutex::new((1..=3).collect()));
        let (reports, reported) = mpsc::channel();
        let still = Arc::clone(&live);
        let watcher = HangupWatcher::start(
            "test-hangup",
            move |key: &u64| still.lock().unwrap().contains(key),
            move |key: &u64| reports.send(*key).unwrap(),
        )
        .expect("watcher");
        let mut clients = Vec::new();
        for key in 1..=3 {
            clients.push(TcpStream::connect(address).expect("connect"));
            let (accepted, _) = listener.accept().expect("accept");
            watcher.watch(key, accepted).expect("watch");
        }
        let [first, mut talker, third] = <[TcpStream; 3]>::try_from(clients).expect("three");
        // A client that keeps sending is read and ignored, not reported.
        talker
            .write_all(&[7u8; 3 * DRAIN_PER_ROUND])
            .expect("write");
        // A queue pair its owner dropped already: its connection is forgotten unreported.
        live.lock().unwrap().remove(&3);
        drop(third);
        drop(first);
        let report = reported.recv_timeout(Duration::from_secs(10));
        assert_eq!(report, Ok(1), "the live queue pair whose client hung up");
        let deadline = Instant::now() + Duration::from_secs(10);
        while watcher.watching() != 1 {
            assert!(
                Instant::now() < deadline,
                "the third connection is forgotten"
            );
            std::thread::yield_now();
        }
        assert_eq!(reported.try_recv(), Err(mpsc::TryRecvError::Empty));
        drop(talker);
        assert_eq!(reported.recv_timeout(Duration::from_secs(10)), Ok(2));
    }
}
