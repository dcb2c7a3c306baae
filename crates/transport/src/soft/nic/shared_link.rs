//! Manual progress: a queue pair's outbound link, driven by whichever thread holds it.
//!
//! Application threads drive the link: `post_send` issues and writes its requests itself,
//! and a `poll` of the send completion queue that finds it empty reads and completes the
//! responses itself (see `cq::Progress`). On a busy-polling path the request and its answer
//! thus need no hand-off to the NIC thread and no wake-up. Nobody waits for the lock: a
//! thread that finds the link taken leaves the work to the holder or the NIC's next round.
//!
//! The NIC thread steps the link every round it is awake, so a queue pair whose
//! application never polls still progresses. It watches the socket in its epoll set except
//! while an application thread polls the link (within [`POLL_GRACE`] of the last poll, and
//! not since a `CompletionQueue::arm` handed the link back): then a response must not wake
//! the NIC, whose wake-up would only compete with the poller for the CPU. While a link is
//! unwatched the NIC parks at most [`POLL_GRACE`], so a poller that stops without arming
//! delays its completions by at most that.
//!
//! While the socket does not take the link's output, the NIC watches it for writability too
//! (and does not count the link as busy), so a full socket never keeps the NIC spinning.
//!
//! Invariants: only the NIC thread changes `interest` and the epoll set, and only it retires
//! a link (drops it from the set and shuts the socket down, so the peer sees EOF); a retired
//! link's queue pair is closed or in `Error`, so application threads find nothing more to
//! drive on it.

use super::conn::Conn;
use super::requester::RequesterLink;
use super::{LinkClosed, NicShared};
use crate::soft::cq::Progress;
use crate::soft::queue_pair::QpShared;
use crate::soft::registry::Registry;
use crate::sys::{Epoll, READ, WRITE};
use std::net::TcpStream;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::{Duration, Instant};

/// How long after an application poll the NIC leaves the link's socket to the poller.
/// The NIC re-checks this often while a link is polled, so a shorter grace costs
/// wake-ups that show in the poller's tail latency (1 ms put a ~20-30 µs p99 on the 64 B
/// READ; 10 ms does not). A longer one is cheap: whoever polls the send queue drives the
/// link itself and `arm` hands it back at once, so only a poller that left without arming
/// waits (for its READ data to land) up to this long.
pub(crate) const POLL_GRACE: Duration = Duration::from_millis(10);

/// The outbound link of one TCP queue pair, shared by the NIC and application threads.
#[derive(Debug)]
pub(crate) struct SharedLink {
    link: Mutex<RequesterLink>,
    nic: Arc<NicShared>,
    fd: RawFd,
    /// Origin of `polled_at`.
    epoch: Instant,
    /// Nanoseconds after `epoch` of the last application poll, plus one; 0: none since
    /// the link was handed back to the NIC.
    polled_at: AtomicU64,
    /// The socket's interest in the NIC's epoll set ([`READ`], put there on adoption).
    interest: AtomicU32,
}

impl SharedLink {
    /// Wraps the connected `stream` of queue pair `qp` (hello already sent), to be
    /// adopted by the NIC of `nic`; `lists`: the peer NIC answers READ lists.
    pub(crate) fn new(
        nic: Arc<NicShared>,
        qp: Arc<QpShared>,
        stream: TcpStream,
        timeout: Duration,
        lists: bool,
    ) -> std::io::Result<Self> {
        let conn = Conn::new(stream)?;
        let fd = conn.raw_fd();
        Ok(SharedLink {
            link: Mutex::new(RequesterLink::new(qp, conn, timeout, lists)),
            nic,
            fd,
            epoch: Instant::now(),
            polled_at: AtomicU64::new(0),
            interest: AtomicU32::new(READ),
        })
    }

    fn registry(&self) -> &Registry {
        &self.nic.registry
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX - 1) + 1
    }

    /// Whether an application thread is polling the link (the NIC should not watch it).
    pub(super) fn polled(&self) -> bool {
        let polled_at = self.polled_at.load(Ordering::SeqCst);
        polled_at != 0 && self.now().saturating_sub(polled_at) < POLL_GRACE.as_nanos() as u64
    }

    /// Whether the socket is in the NIC's epoll set.
    pub(super) fn watched(&self) -> bool {
        self.interest.load(Ordering::Relaxed) != 0
    }

    /// The interest the socket should have: none while polled, else input, plus
    /// writability while the output is blocked (unchanged while another thread holds it).
    fn wanted_interest(&self) -> u32 {
        if self.polled() {
            return 0;
        }
        let blocked = match self.try_lock() {
            Some(link) => link.conn.output_blocked(),
            None => self.interest.load(Ordering::Relaxed) & WRITE != 0,
        };
        READ | if blocked { WRITE } else { 0 }
    }

    /// Whether the epoll set should change: the link started or stopped being polled, or
    /// its output became blocked or unblocked.
    pub(super) fn watch_outdated(&self) -> bool {
        self.wanted_interest() != self.interest.load(Ordering::Relaxed)
    }

    /// Sets the socket's interest in the NIC's epoll set as polling and blocked output
    /// require. An error when the socket cannot be watched.
    pub(super) fn update_watch(&self, epoll: &Epoll) -> crate::Result<()> {
        let want = self.wanted_interest();
        epoll.update(self.fd, self.interest.load(Ordering::Relaxed), want)?;
        self.interest.store(want, Ordering::Relaxed);
        Ok(())
    }

    /// The socket, for the NIC's epoll set.
    pub(super) fn raw_fd(&self) -> RawFd {
        self.fd
    }

    fn try_lock(&self) -> Option<MutexGuard<'_, RequesterLink>> {
        match self.link.try_lock() {
            Ok(link) => Some(link),
            Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// Issues what is queued and writes it, unless another thread holds the link. True
    /// when nothing is left for the NIC to write (it need not be woken).
    pub(crate) fn push(&self) -> bool {
        let Some(mut link) = self.try_lock() else {
            return false;
        };
        // A failure is recorded in the queue pair (completions, Error state); the NIC
        // retires the link on its next round. Blocked output needs the NIC to watch it.
        link.step(self.registry(), false).is_ok() && !link.busy() && !link.conn.has_output()
    }

    /// The NIC's round on this link; Ok(false) when another thread holds it or an
    /// application thread is polling it (that thread does the work, timeouts included).
    pub(super) fn step(&self, readable: bool) -> Result<bool, LinkClosed> {
        if self.polled() {
            return Ok(false);
        }
        match self.try_lock() {
            Some(mut link) => link.step(self.registry(), readable),
            None => Ok(false),
        }
    }

    /// Whether the NIC must not park: the link is not being polled, and work is waiting
    /// or another thread holds it (a poster kicks the NIC for leftovers). A polled link's
    /// work, unwritten output included, is its poller's: a NIC spinning beside it would
    /// only take CPU from the poller and the peer.
    pub(super) fn busy(&self) -> bool {
        if self.polled() {
            return false;
        }
        self.try_lock().is_none_or(|link| link.busy())
    }

    /// Whether the NIC may only park briefly: the link is polled or not watched.
    pub(super) fn needs_recheck(&self) -> bool {
        !self.watched() || self.polled()
    }

    /// Moves the queue pair to `Error` (the link could not be watched).
    pub(super) fn fail(&self) {
        self.link
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .qp
            .enter_error();
    }

    /// Stops watching the link and shuts its socket down; the peer sees EOF.
    pub(super) fn retire(&self, epoll: &Epoll) {
        if self.watched() {
            let _ = epoll.delete(self.fd);
        }
        self.link
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .conn
            .shutdown();
    }
}

impl Progress for SharedLink {
    fn progress(&self) -> bool {
        let Some(mut link) = self.try_lock() else {
            return false;
        };
        if !link.wants_progress() {
            return false;
        }
        self.polled_at.store(self.now(), Ordering::SeqCst);
        // An error completed (and flushed) the outstanding requests: that is progress.
        link.step(self.registry(), true).unwrap_or(true)
    }

    fn release(&self) {
        self.polled_at.store(0, Ordering::SeqCst);
        self.nic.kick();
    }
}
