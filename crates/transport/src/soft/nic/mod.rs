//! The soft NIC: one thread per domain that owns every wire of the domain.
//!
//! It accepts inbound TCP links, issues requests posted on connected queue pairs, serves
//! READ / WRITE / atomics / SEND arriving from peers against the domain's registrations,
//! drains the shared-memory rings of same-host peers, and watches those peers' liveness.
//! No application thread is on the responder path.
//!
//! One level-triggered epoll set holds the listener, every connection and the doorbell;
//! a busy round costs one `epoll_wait(0)` plus reads of the ready sockets only.
//! Idle policy: after `spin` without work the thread parks in `epoll_wait` (at most
//! `park_timeout`, after which it re-checks same-host peers' liveness). While it is parked, the `parked` word in its key
//! table is set, and whoever adds work (a post, a connection, a same-host peer) rings the
//! doorbell; the flag is set before the last work check, so no wake-up is lost.
//!
//! On the TCP wire a registration with remote rights is withdrawn through a fence
//! ([`fence`]): between two rounds the NIC cuts the inbound links still holding its bytes.

mod conn;
mod fence;
mod requester;
mod serve;
mod shared_link;
mod zero_copy;

pub(crate) use shared_link::SharedLink;

use super::frame;
use super::queue_pair::QpShared;
use super::registry::Registry;
use crate::sys::{Doorbell, Epoll};
use conn::Conn;
use fence::Fence;
use serve::ResponderLink;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an accepted connection may take to be bound (its valid hello in, for a
/// connected queue pair) before it is closed.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long it may take to send its whole hello (a peer writes it right after connecting;
/// the rest of [`HANDSHAKE_TIMEOUT`] is for its queue pair to finish connecting).
const HELLO_TIMEOUT: Duration = Duration::from_secs(2);
/// Most accepted connections waiting for their hello; beyond, the oldest one that has not
/// sent its whole hello is closed to make room (or the new one, when all have).
const MAX_HANDSHAKES: usize = 256;
/// How long an accepted connection may wait to be bound: [`HELLO_TIMEOUT`] until its whole
/// hello is in, [`HANDSHAKE_TIMEOUT`] in all.
fn wait_limit(has_hello: bool) -> Duration {
    if has_hello {
        HANDSHAKE_TIMEOUT
    } else {
        HELLO_TIMEOUT
    }
}

/// How often same-host peers' liveness is checked while the NIC is busy.
const LIVENESS_PERIOD: Duration = Duration::from_millis(1);
/// Most rounds in a row a NIC with hot inbound links reads them directly instead of
/// asking epoll first; other descriptors wait at most this many rounds.
const EPOLL_SKIP: u32 = 8;

/// The fate of an accepted connection's hello.
enum Bind {
    /// Bind it to this queue pair.
    To(Arc<QpShared>),
    /// Not yet: the hello is incomplete or its queue pair is not connected yet.
    Wait,
    /// Close it.
    Refuse,
}

/// A link that is finished: its queue pair was closed or failed.
#[derive(Debug)]
pub(crate) struct LinkClosed;

/// What the NIC thread does when it has no work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdlePolicy {
    /// How long to keep polling (yielding the CPU between rounds) after the last work
    /// before parking. Default 50 µs; zero parks at once.
    pub spin: Duration,
    /// Longest single park; the NIC re-checks its state after it. Default 100 ms.
    pub park_timeout: Duration,
}

impl Default for IdlePolicy {
    fn default() -> Self {
        IdlePolicy {
            spin: Duration::from_micros(50),
            park_timeout: Duration::from_millis(100),
        }
    }
}

/// What the application side shares with the NIC thread.
#[derive(Debug)]
pub(crate) struct NicShared {
    pub registry: Arc<Registry>,
    doorbell: Doorbell,
    new_qps: Mutex<Vec<Arc<QpShared>>>,
    new_links: Mutex<Vec<Arc<SharedLink>>>,
    /// Set when `new_qps` or `new_links` gained an entry (checked without locking).
    news: AtomicBool,
    stop: AtomicBool,
    idle: IdlePolicy,
    /// Remote registrations withdrawn and not yet fenced off.
    fence: Fence,
    /// The domain takes inbound TCP links (the TCP wire): only they need the fence.
    inbound_links: bool,
}

impl NicShared {
    pub(crate) fn new(
        registry: Arc<Registry>,
        idle: IdlePolicy,
        inbound_links: bool,
    ) -> crate::Result<Self> {
        Ok(NicShared {
            registry,
            doorbell: Doorbell::new()?,
            new_qps: Mutex::default(),
            new_links: Mutex::default(),
            news: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            idle,
            fence: Fence::default(),
            inbound_links,
        })
    }

    /// Wakes the NIC if it is parked.
    pub(crate) fn kick(&self) {
        fence(Ordering::SeqCst);
        if self.registry.table().parked().load(Ordering::SeqCst) != 0 {
            self.doorbell.ring();
        }
    }

    /// The doorbell name (same-host peers ring it).
    pub(crate) fn doorbell_name(&self) -> &str {
        self.doorbell.name()
    }

    /// Hands a new queue pair to the NIC.
    pub(crate) fn adopt_qp(&self, qp: Arc<QpShared>) {
        self.new_qps
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(qp);
        self.news.store(true, Ordering::Release);
        self.kick();
    }

    /// Hands the outbound link of a queue pair to the NIC.
    pub(crate) fn adopt_link(&self, link: Arc<SharedLink>) {
        self.new_links
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(link);
        self.news.store(true, Ordering::Release);
        self.kick();
    }

    /// Withdraws registration `key`. On the TCP wire one with remote rights is a fence:
    /// this returns only once no inbound link holds its bytes (see [`fence`]).
    pub(crate) fn deregister(&self, key: u32) {
        let Some((span, access)) = self.registry.deregister(key) else {
            return;
        };
        if self.inbound_links && access.grants_remote() {
            let ticket = self.fence.post(span);
            self.kick();
            self.fence.wait(ticket);
        }
    }

    /// Asks the NIC thread to exit.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.doorbell.ring();
    }
}

/// Starts the NIC thread of a domain.
pub(crate) fn spawn(
    shared: Arc<NicShared>,
    listener: Option<TcpListener>,
) -> crate::Result<JoinHandle<()>> {
    let epoll = Epoll::new()?;
    epoll.add(shared.doorbell.raw_fd())?;
    if let Some(listener) = &listener {
        epoll.add(listener.as_raw_fd())?;
    }
    let nic = Nic {
        shared,
        listener,
        epoll,
        ready: Vec::new(),
        qps: Vec::new(),
        handshakes: Vec::new(),
        requesters: Vec::new(),
        responders: Vec::new(),
        liveness_checked: Instant::now(),
        epoll_skipped: 0,
    };
    std::thread::Builder::new()
        .name("kvcm-soft-nic".into())
        .spawn(move || nic.run())
        .map_err(|e| crate::TransportError::io("spawn NIC thread", e))
}

/// The NIC thread's state; dropped when the thread ends (or unwinds).
struct Nic {
    shared: Arc<NicShared>,
    listener: Option<TcpListener>,
    epoll: Epoll,
    /// Descriptors found readable by the last `epoll_wait`.
    ready: Vec<RawFd>,
    qps: Vec<Arc<QpShared>>,
    /// Accepted connections waiting for their hello, with when they were accepted.
    handshakes: Vec<(Conn, Instant)>,
    requesters: Vec<Arc<SharedLink>>,
    responders: Vec<ResponderLink>,
    liveness_checked: Instant,
    /// Rounds since the last `epoll_wait`.
    epoll_skipped: u32,
}

impl Drop for Nic {
    fn drop(&mut self) {
        self.shared.fence.close();
    }
}

impl Nic {
    fn run(mut self) {
        let mut idle_since = Instant::now();
        while !self.shared.stop.load(Ordering::Acquire) {
            if self.step() {
                idle_since = Instant::now();
            } else if idle_since.elapsed() < self.shared.idle.spin {
                std::thread::yield_now();
            } else {
                // Stays idle: a park that ends without work parks again after one round.
                self.park();
            }
        }
    }

    fn step(&mut self) -> bool {
        let registry = Arc::clone(&self.shared.registry);
        let mut progress = self.fence_off_withdrawn();
        progress |= self.adopt();
        let now = Instant::now();
        let direct = self.poll_ready(now);
        if self.ready.contains(&self.shared.doorbell.raw_fd()) {
            self.shared.doorbell.drain();
        }
        // Handshakes first: connections that closed leave room under the cap for new ones.
        progress |= self.handshake() | self.accept();
        progress |= self.step_requesters();
        let (ready, epoll) = (&self.ready, &self.epoll);
        self.responders.retain_mut(|link| {
            let readable = ready.contains(&link.conn.raw_fd()) || (direct && link.hot(now));
            link.step(&registry, readable, now)
                .and_then(|moved| link.sync_watch(epoll).map(|()| progress |= moved))
                .is_ok()
        });
        for qp in &self.qps {
            progress |= super::shm::drain_inbound(&registry, qp);
            if let Some(peer) = qp.shm_peer.get() {
                progress |= super::shm::retry_stalled(&registry, qp, peer);
            }
        }
        self.check_liveness();
        progress
    }

    /// Cuts every inbound link that holds bytes of a withdrawn remote registration, then
    /// lets their withdrawers go. Runs between rounds: a round uses the keys it resolves
    /// within itself, except for what links hold (see [`fence`]).
    fn fence_off_withdrawn(&mut self) -> bool {
        if !self.shared.fence.pending() {
            return false;
        }
        let (ticket, spans) = self.shared.fence.take();
        self.responders.retain(|link| {
            let holds = link.holds_any(&spans);
            if holds {
                link.qp.enter_error();
            }
            !holds
        });
        self.shared.fence.pass(ticket);
        true
    }

    /// Fills `ready` from epoll, or (at most [`EPOLL_SKIP`] rounds in a row, while an
    /// inbound link is hot) skips the syscall: true when hot links are then to be read
    /// directly. A request on a hot link is then seen one syscall sooner.
    fn poll_ready(&mut self, now: Instant) -> bool {
        let hot = self.responders.iter().any(|link| link.hot(now));
        if hot && self.epoll_skipped < EPOLL_SKIP {
            self.epoll_skipped += 1;
            self.ready.clear();
            return true;
        }
        self.epoll_skipped = 0;
        let _ = self.epoll.wait(&mut self.ready, 0);
        false
    }

    /// Steps every outbound link not taken by an application thread; retires finished ones.
    fn step_requesters(&mut self) -> bool {
        let mut progress = false;
        let (ready, epoll) = (&self.ready, &self.epoll);
        self.requesters.retain(|link| {
            if link.update_watch(epoll).is_err() {
                link.fail();
            }
            let readable = link.watched() && ready.contains(&link.raw_fd());
            match link.step(readable) {
                Ok(moved) => {
                    progress |= moved;
                    true
                }
                Err(LinkClosed) => {
                    link.retire(epoll);
                    false
                }
            }
        });
        progress
    }

    fn watch(&self, conn: &Conn) -> bool {
        self.epoll.add(conn.raw_fd()).is_ok()
    }

    fn adopt(&mut self) -> bool {
        if !self.shared.news.swap(false, Ordering::AcqRel) {
            return false;
        }
        let qps: Vec<_> = self
            .shared
            .new_qps
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
            .collect();
        let links: Vec<_> = self
            .shared
            .new_links
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
            .collect();
        let progress = !qps.is_empty() || !links.is_empty();
        self.qps.extend(qps);
        for link in links {
            if self.epoll.add(link.raw_fd()).is_ok() {
                self.requesters.push(link);
            } else {
                link.fail();
                link.retire(&self.epoll);
            }
        }
        progress
    }

    fn accept(&mut self) -> bool {
        let ready = |l: &TcpListener| self.ready.contains(&l.as_raw_fd());
        if !self.listener.as_ref().is_some_and(ready) {
            return false;
        }
        // Out of `self` while it accepts, which may close waiting connections.
        let Some(listener) = self.listener.take() else {
            return false;
        };
        let progress = self.accept_from(&listener);
        self.listener = Some(listener);
        progress
    }

    fn accept_from(&mut self, listener: &TcpListener) -> bool {
        let mut accepted = Vec::new();
        while let Ok((stream, _)) = listener.accept() {
            // At the cap, silent connections make room for new ones (oldest first), so a
            // flood of them cannot keep honest peers out; when every waiting connection has
            // sent its hello, the new stream is dropped (closed) at once.
            if self.handshakes.len() + accepted.len() >= MAX_HANDSHAKES
                && !self.close_oldest_silent()
            {
                continue;
            }
            accepted.extend(Conn::with_input(stream, frame::HELLO_LEN).ok());
        }
        accepted.retain(|conn| self.watch(conn));
        let progress = !accepted.is_empty();
        let now = Instant::now();
        self.handshakes
            .extend(accepted.into_iter().map(|conn| (conn, now)));
        progress
    }

    /// Binds accepted connections to queue pairs once their hello has arrived: it must
    /// name a connected queue pair that has no inbound link yet and carry its token. A
    /// hello for a queue pair not connected yet waits (the pair connects both ways); a
    /// wrong one, none within [`HELLO_TIMEOUT`], or no binding within [`HANDSHAKE_TIMEOUT`],
    /// closes the connection.
    fn handshake(&mut self) -> bool {
        let mut progress = false;
        for (mut conn, accepted) in std::mem::take(&mut self.handshakes) {
            let had_hello = conn.input().len() >= frame::HELLO_LEN;
            if self.ready.contains(&conn.raw_fd()) && !had_hello && conn.fill().is_err() {
                continue;
            }
            // A complete hello leaves the epoll set until bound: bytes after it would keep
            // the NIC spinning while its queue pair finishes connecting.
            let has_hello = conn.input().len() >= frame::HELLO_LEN;
            if has_hello && !had_hello && self.epoll.delete(conn.raw_fd()).is_err() {
                continue;
            }
            match self.bind(&conn) {
                Bind::To(qp) if self.epoll.add(conn.raw_fd()).is_ok() => {
                    conn.consume(frame::HELLO_LEN);
                    conn.grow_input();
                    self.responders.push(ResponderLink::new(qp, conn));
                    progress = true;
                }
                Bind::Wait if accepted.elapsed() < wait_limit(has_hello) => {
                    self.handshakes.push((conn, accepted));
                }
                Bind::To(_) | Bind::Wait | Bind::Refuse => {}
            }
        }
        progress
    }

    /// Closes the oldest waiting connection that has not sent its whole hello; false when
    /// there is none. A hello the kernel holds counts as sent: each candidate's bytes are
    /// read before it is judged, so a peer is never closed for the NIC's own lag.
    fn close_oldest_silent(&mut self) -> bool {
        for at in 0..self.handshakes.len() {
            let conn = &mut self.handshakes[at].0;
            if conn.input().len() >= frame::HELLO_LEN {
                continue;
            }
            let gone = conn.fill().is_err();
            let completed = !gone && conn.input().len() >= frame::HELLO_LEN;
            // As in `handshake`: a complete hello leaves the epoll set until bound.
            if completed && self.epoll.delete(conn.raw_fd()).is_ok() {
                continue;
            }
            let (conn, _) = self.handshakes.remove(at);
            let _ = self.epoll.delete(conn.raw_fd());
            return true;
        }
        false
    }

    /// What to do with an accepted connection, given its input so far.
    fn bind(&self, conn: &Conn) -> Bind {
        if conn.input().len() < frame::HELLO_LEN {
            return Bind::Wait;
        }
        let Some((qpn, token)) = frame::parse_hello(conn.input()) else {
            return Bind::Refuse;
        };
        let qp = self
            .qps
            .iter()
            .find(|qp| qp.qpn == qpn && qp.token == token && !qp.closed.load(Ordering::Acquire));
        let Some(qp) = qp else {
            return Bind::Refuse;
        };
        if self.responders.iter().any(|link| Arc::ptr_eq(&link.qp, qp)) {
            return Bind::Refuse; // one inbound link per queue pair
        }
        match qp.state() {
            crate::QpState::Init => Bind::Wait,
            crate::QpState::ReadyToSend => Bind::To(Arc::clone(qp)),
            crate::QpState::Error => Bind::Refuse,
        }
    }

    fn check_liveness(&mut self) {
        if self.liveness_checked.elapsed() < LIVENESS_PERIOD {
            return;
        }
        self.liveness_checked = Instant::now();
        self.qps.retain(|qp| !qp.closed.load(Ordering::Acquire));
        for qp in &self.qps {
            if qp.shm_peer.get().is_some_and(|peer| peer.gone())
                && qp.state() != crate::QpState::Error
            {
                qp.enter_error();
            }
        }
    }

    fn has_work(&self) -> bool {
        self.shared.news.load(Ordering::Acquire)
            || self.shared.fence.pending()
            || self
                .requesters
                .iter()
                .any(|link| link.busy() || link.watch_outdated())
            || self.responders.iter().any(ResponderLink::busy)
            || self.qps.iter().any(|qp| super::shm::inbound_ready(qp))
    }

    /// Whether a same-host queue pair has sends waiting for ring room.
    fn sends_stalled(&self) -> bool {
        self.qps
            .iter()
            .any(|qp| qp.shm_peer.get().is_some() && !qp.lock_sq().is_empty())
    }

    fn park(&mut self) {
        let parked = self.shared.registry.table().parked();
        parked.store(1, Ordering::SeqCst);
        // Pairs with the fence in `kick`: either a poster sees the NIC parked and rings, or
        // `has_work` sees what it posted.
        fence(Ordering::SeqCst);
        if !self.has_work() && !self.shared.stop.load(Ordering::Acquire) {
            let mut park = self.shared.idle.park_timeout;
            if self.requesters.iter().any(|link| link.needs_recheck()) || self.sends_stalled() {
                // A polled link is left to its poller: look again when polling may stop.
                // Sends waiting for a peer's ring are retried as often (no one rings when
                // the peer frees room).
                park = park.min(shared_link::POLL_GRACE);
            }
            let timeout = park.as_millis().clamp(1, i32::MAX as u128) as i32;
            let _ = self.epoll.wait(&mut self.ready, timeout);
        }
        parked.store(0, Ordering::SeqCst);
    }
}
