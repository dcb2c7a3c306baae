//! The descriptor broker of a shared-memory domain: the one way a peer process gets the
//! domain's memfds (key table, liveness page, a queue pair's inbound ring, registered
//! memory), passed with SCM_RIGHTS, each only to a peer that names a queue pair by number
//! and secret token, and each memory only to queue pairs of a protection domain that has
//! a live registration of it.
//!
//! The owning process listens on an abstract unix stream socket named
//! `kvcm-shm-<pid>-<16 random hex digits>`, published in each queue pair's endpoint
//! (`broker=<name> token=<hex>`). One connection carries one request and one reply; the
//! broker closes it after replying.
//!
//! Frames (fixed size, little-endian):
//!
//! | request, 24 bytes | |
//! |---|---|
//! | 0..4 | magic `KVSB` |
//! | 4..8 | object: 1 key table, 2 liveness page, 3 the queue pair's inbound ring, 4 memory |
//! | 8..12 | queue pair number |
//! | 12..16 | memory: its memfd number as the key table shows it (i32); otherwise 0 |
//! | 16..24 | the queue pair's token |
//!
//! | reply, 8 bytes | |
//! |---|---|
//! | 0..4 | status: 0 granted, 1 malformed request, 2 no such live queue pair (or wrong token), 3 not a memory of a live registration in the queue pair's protection domain, 4 the owner failed to open it |
//! | 4..8 | 1 if the descriptor is read-write, 0 otherwise |
//!
//! A granted reply carries exactly one descriptor (SCM_RIGHTS), a fresh open of
//! `/proc/self/fd/<n>` (its own open file description): the key table and the liveness
//! page read-only, the ring read-write, a memory read-write only if a live registration of
//! it in the queue pair's protection domain grants `REMOTE_WRITE` or `REMOTE_ATOMIC`,
//! read-only otherwise. A refusal carries none.
//!
//! The broker is one thread per domain with non-blocking sockets in an epoll set: a request
//! complete at accept time (an honest client writes it right after connecting) is served
//! at once; a partial one waits at most [`DEADLINE`], and at most [`MAX_PENDING`] wait
//! (beyond that the oldest is dropped), so silent or slow clients cost neither threads nor
//! other clients' service. The thread ends when the domain is dropped.
//!
//! What the broker cannot do: take back a descriptor once handed over (a peer keeps the
//! mapping after a deregistration, as it kept the memfd before), or give less than a whole
//! memory (a registration covers a range of a memfd; the peer gets the memfd).

use crate::soft::queue_pair::QpShared;
use crate::soft::registry::Registry;
use crate::sys::{life, recv_with_fd, send_with_fd, Epoll, EventFd, SharedMemory};
use crate::{Result, TransportError};
use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const MAGIC: &[u8; 4] = b"KVSB";
/// Bytes of a request.
pub const REQUEST_LEN: usize = 24;
/// Bytes of a reply.
pub const REPLY_LEN: usize = 8;
/// How long a connection may take to deliver its request.
pub const DEADLINE: Duration = Duration::from_secs(1);
/// Most connections waiting for the rest of their request.
pub const MAX_PENDING: usize = 64;
/// How long a client waits for a broker (connect, request, reply).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the broker pauses after an accept failure other than "none waiting" (say,
/// the process ran out of descriptors), so that it does not spin on a readable listener.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);

/// What a peer asks the broker for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Object {
    /// The domain's key table (read-only).
    KeyTable,
    /// The owner process's liveness page (read-only).
    LifePage,
    /// The named queue pair's inbound ring (read-write).
    Ring,
    /// The memory whose memfd number (in the owner) is this, as the key table shows it.
    Memory(RawFd),
}

impl Object {
    fn code(self) -> (u32, RawFd) {
        match self {
            Object::KeyTable => (1, 0),
            Object::LifePage => (2, 0),
            Object::Ring => (3, 0),
            Object::Memory(fd) => (4, fd),
        }
    }

    fn decode(code: u32, fd: RawFd) -> Option<Object> {
        match (code, fd) {
            (1, 0) => Some(Object::KeyTable),
            (2, 0) => Some(Object::LifePage),
            (3, 0) => Some(Object::Ring),
            (4, fd) => Some(Object::Memory(fd)),
            _ => None,
        }
    }
}

impl std::fmt::Display for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Object::KeyTable => f.write_str("key table"),
            Object::LifePage => f.write_str("liveness page"),
            Object::Ring => f.write_str("inbound ring"),
            Object::Memory(fd) => write!(f, "memory with descriptor {fd}"),
        }
    }
}

/// Why the broker refused a request (the reply's status; 0 is "granted").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The request was not a well-formed frame.
    Malformed = 1,
    /// No live queue pair has that number and token.
    UnknownQp = 2,
    /// The descriptor is not the memory of a live registration in the queue pair's
    /// protection domain.
    NotInPd = 3,
    /// The owner could not open the object.
    Failed = 4,
}

impl Refusal {
    fn decode(status: u32) -> Option<Refusal> {
        [
            Refusal::Malformed,
            Refusal::UnknownQp,
            Refusal::NotInPd,
            Refusal::Failed,
        ]
        .into_iter()
        .find(|refusal| *refusal as u32 == status)
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::Malformed => "malformed request",
            Refusal::UnknownQp => "no such live queue pair, or wrong token",
            Refusal::NotInPd => {
                "not the memory of a live registration in the queue pair's protection domain"
            }
            Refusal::Failed => "the owner failed to open it",
        })
    }
}

/// A parsed request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Request {
    object: Object,
    qpn: u32,
    token: u64,
}

impl Request {
    fn encode(&self) -> [u8; REQUEST_LEN] {
        let (code, fd) = self.object.code();
        let mut bytes = [0u8; REQUEST_LEN];
        bytes[0..4].copy_from_slice(MAGIC);
        bytes[4..8].copy_from_slice(&code.to_le_bytes());
        bytes[8..12].copy_from_slice(&self.qpn.to_le_bytes());
        bytes[12..16].copy_from_slice(&fd.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.token.to_le_bytes());
        bytes
    }

    fn decode(bytes: &[u8; REQUEST_LEN]) -> Option<Request> {
        let u32_at = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        if &bytes[0..4] != MAGIC {
            return None;
        }
        let mut token = [0u8; 8];
        token.copy_from_slice(&bytes[16..24]);
        Some(Request {
            object: Object::decode(u32_at(4), u32_at(12) as RawFd)?,
            qpn: u32_at(8),
            token: u64::from_le_bytes(token),
        })
    }
}

/// A descriptor the broker granted, or why it refused.
#[derive(Debug)]
pub enum Reply {
    /// The descriptor (read-write when the flag says so).
    Granted(OwnedFd, bool),
    /// No descriptor.
    Refused(Refusal),
}

/// Asks the broker called `broker` for `object` on behalf of queue pair `qpn` (secret
/// `token`). Errors are failures to talk to it; a refusal is a [`Reply::Refused`].
pub fn request(broker: &str, qpn: u32, token: u64, object: Object) -> Result<Reply> {
    let io = |e| TransportError::io("talk to the peer's descriptor broker", e);
    let addr = SocketAddr::from_abstract_name(broker.as_bytes()).map_err(io)?;
    let mut stream = UnixStream::connect_addr(&addr).map_err(io)?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT)).map_err(io)?;
    let request = Request { object, qpn, token };
    stream.write_all(&request.encode()).map_err(io)?;
    let mut reply = [0u8; REPLY_LEN];
    let mut got = 0;
    let mut descriptor = None;
    // One deadline for the whole reply: a broker that trickles its bytes does not restart
    // the clock with each one.
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    let late = || {
        TransportError::BadEndpoint(format!(
            "the peer's descriptor broker {broker} did not reply within {CLIENT_TIMEOUT:?}"
        ))
    };
    while got < REPLY_LEN {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(late());
        }
        stream.set_read_timeout(Some(left)).map_err(io)?;
        let (read, fd) = match recv_with_fd(&stream, &mut reply[got..]) {
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(late())
            }
            other => other.map_err(io)?,
        };
        if read == 0 {
            return Err(TransportError::BadEndpoint(format!(
                "the peer's descriptor broker {broker} closed before replying"
            )));
        }
        got += read;
        // Only the first descriptor counts; any other is closed here.
        descriptor = descriptor.or(fd);
    }
    let status = u32::from_le_bytes([reply[0], reply[1], reply[2], reply[3]]);
    let writable = reply[4] == 1;
    match (status, descriptor) {
        (0, Some(fd)) => Ok(Reply::Granted(fd, writable)),
        (0, None) => Err(TransportError::BadEndpoint(format!(
            "the peer's descriptor broker {broker} granted the {object} without a descriptor"
        ))),
        (status, _) => Refusal::decode(status).map(Reply::Refused).ok_or_else(|| {
            TransportError::BadEndpoint(format!(
                "the peer's descriptor broker {broker} answered unknown status {status}"
            ))
        }),
    }
}

/// [`request`], with a refusal as an error.
pub(crate) fn obtain(broker: &str, qpn: u32, token: u64, object: Object) -> Result<OwnedFd> {
    match request(broker, qpn, token, object)? {
        Reply::Granted(fd, _) => Ok(fd),
        Reply::Refused(why) => Err(TransportError::BadEndpoint(format!(
            "the peer's descriptor broker refused the {object} to queue pair {qpn}: {why}"
        ))),
    }
}

/// What the broker thread shares with the domain.
#[derive(Debug)]
struct Shared {
    registry: Arc<Registry>,
    /// The domain's shared-memory queue pairs by number (a dropped one is closed or gone).
    qps: Mutex<HashMap<u32, Weak<QpShared>>>,
    stop: AtomicBool,
    wake: EventFd,
}

/// The broker of one domain; dropping it stops its thread.
#[derive(Debug)]
pub(crate) struct Broker {
    shared: Arc<Shared>,
    name: String,
    thread: Option<JoinHandle<()>>,
}

impl Broker {
    /// Binds a fresh name and starts the broker thread.
    pub(crate) fn start(registry: Arc<Registry>) -> Result<Self> {
        let name = format!(
            "kvcm-shm-{}-{:016x}",
            std::process::id(),
            crate::sys::random_u64()?
        );
        let io = |e| TransportError::io("bind descriptor broker", e);
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).map_err(io)?;
        let listener = UnixListener::bind_addr(&addr).map_err(io)?;
        listener.set_nonblocking(true).map_err(io)?;
        let shared = Arc::new(Shared {
            registry,
            qps: Mutex::default(),
            stop: AtomicBool::new(false),
            wake: EventFd::new()?,
        });
        let mut epoll = Epoll::new()?;
        epoll.add(listener.as_raw_fd())?;
        epoll.add(shared.wake.raw_fd())?;
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("kvcm-shm-broker".into())
            .spawn(move || Server::new(listener, thread_shared).run(&mut epoll))
            .map_err(|e| TransportError::io("spawn descriptor broker", e))?;
        Ok(Broker {
            shared,
            name,
            thread: Some(thread),
        })
    }

    /// The abstract socket name peers connect to.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Lets holders of `qp`'s token ask for its objects (until it is closed or dropped).
    pub(crate) fn adopt_qp(&self, qp: &Arc<QpShared>) {
        let mut qps = self
            .shared
            .qps
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        qps.retain(|_, qp| {
            qp.upgrade()
                .is_some_and(|qp| !qp.closed.load(Ordering::Acquire))
        });
        qps.insert(qp.qpn, Arc::downgrade(qp));
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake.ring();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A connection whose request has not fully arrived.
struct Pending {
    stream: UnixStream,
    request: [u8; REQUEST_LEN],
    got: usize,
    deadline: Instant,
}

/// What reading a connection's input came to.
enum Input {
    Complete,
    Partial,
    Closed,
}

impl Pending {
    /// Reads what has arrived (non-blocking).
    fn fill(&mut self) -> Input {
        while self.got < REQUEST_LEN {
            match self.stream.read(&mut self.request[self.got..]) {
                Ok(0) => return Input::Closed,
                Ok(read) => self.got += read,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Input::Partial,
                Err(_) => return Input::Closed,
            }
        }
        Input::Complete
    }
}

/// The broker thread's state.
struct Server {
    listener: UnixListener,
    shared: Arc<Shared>,
    pending: VecDeque<Pending>,
    ready: Vec<RawFd>,
}

impl Server {
    fn new(listener: UnixListener, shared: Arc<Shared>) -> Self {
        Server {
            listener,
            shared,
            pending: VecDeque::new(),
            ready: Vec::new(),
        }
    }

    fn run(mut self, epoll: &mut Epoll) {
        while !self.shared.stop.load(Ordering::Acquire) {
            // Pending connections are in deadline order: the first expires first.
            let timeout = self.pending.front().map_or(-1, |first| {
                let left = first.deadline.saturating_duration_since(Instant::now());
                left.as_millis().clamp(1, i32::MAX as u128) as i32
            });
            if epoll.wait(&mut self.ready, timeout).is_err() {
                // Nothing else to wait with; peers' requests fail from now on.
                return;
            }
            if self.ready.contains(&self.shared.wake.raw_fd()) {
                self.shared.wake.drain();
            }
            self.step_pending();
            if self.ready.contains(&self.listener.as_raw_fd()) {
                self.accept(epoll);
            }
        }
    }

    /// Serves pending connections whose request completed; drops closed and late ones.
    fn step_pending(&mut self) {
        let now = Instant::now();
        let (ready, shared) = (&self.ready, &self.shared);
        self.pending.retain_mut(|pending| {
            if ready.contains(&pending.stream.as_raw_fd()) {
                match pending.fill() {
                    Input::Complete => {
                        serve(shared, &pending.stream, &pending.request);
                        return false;
                    }
                    Input::Closed => return false,
                    Input::Partial => {}
                }
            }
            pending.deadline > now
        });
    }

    fn accept(&mut self, epoll: &Epoll) {
        loop {
            let stream = match self.listener.accept() {
                Ok((stream, _)) => stream,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                // Anything else (descriptors exhausted): the listener stays readable, so
                // back off a moment instead of spinning; retried at the next report.
                Err(_) => {
                    std::thread::sleep(ACCEPT_BACKOFF);
                    return;
                }
            };
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let mut pending = Pending {
                stream,
                request: [0; REQUEST_LEN],
                got: 0,
                deadline: Instant::now() + DEADLINE,
            };
            match pending.fill() {
                Input::Complete => serve(&self.shared, &pending.stream, &pending.request),
                Input::Closed => {}
                Input::Partial => {
                    if self.pending.len() >= MAX_PENDING {
                        // Closing it also takes it out of the epoll set.
                        self.pending.pop_front();
                    }
                    if epoll.add(pending.stream.as_raw_fd()).is_ok() {
                        self.pending.push_back(pending);
                    }
                }
            }
        }
    }
}

/// Answers one complete request on `stream` (best effort: a client that is gone gets
/// nothing).
fn serve(shared: &Shared, stream: &UnixStream, request: &[u8; REQUEST_LEN]) {
    let (status, writable, descriptor) = match decide(shared, request) {
        Ok((fd, writable)) => (0, writable, Some(fd)),
        Err(refusal) => (refusal as u32, false, None),
    };
    let mut reply = [0u8; REPLY_LEN];
    reply[0..4].copy_from_slice(&status.to_le_bytes());
    reply[4..8].copy_from_slice(&u32::from(writable).to_le_bytes());
    let _ = send_with_fd(stream, &reply, descriptor.as_ref().map(AsFd::as_fd));
}

/// The descriptor `request` may have (and whether it is read-write), or why not.
fn decide(
    shared: &Shared,
    request: &[u8; REQUEST_LEN],
) -> std::result::Result<(OwnedFd, bool), Refusal> {
    let request = Request::decode(request).ok_or(Refusal::Malformed)?;
    let qp = shared
        .qps
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&request.qpn)
        .and_then(Weak::upgrade)
        .filter(|qp| qp.token == request.token && !qp.closed.load(Ordering::Acquire))
        .ok_or(Refusal::UnknownQp)?;
    let open = |memory: &SharedMemory, writable: bool| {
        memory
            .reopen(writable)
            .map(|fd| (fd, writable))
            .map_err(|_| Refusal::Failed)
    };
    match request.object {
        Object::KeyTable => open(shared.registry.table().memory(), false),
        Object::LifePage => open(life::process_page().map_err(|_| Refusal::Failed)?, false),
        Object::Ring => open(
            qp.inbound.as_ref().ok_or(Refusal::UnknownQp)?.memory(),
            true,
        ),
        Object::Memory(fd) => {
            // `memory` holds the memfd open, so its number cannot be reused meanwhile.
            let (memory, writable) = shared
                .registry
                .memory_for_fd(qp.pd, fd)
                .ok_or(Refusal::NotInPd)?;
            open(&memory, writable)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soft::shm::Ring;
    use crate::soft::{SoftConfig, SoftCq, SoftDomain, SoftQp, SoftRegion, Wire};
    use crate::sys::Protection;
    use crate::{Access, Domain, HostMemory, QpConfig};
    use std::os::unix::fs::MetadataExt;

    /// A shared-memory domain with two protection domains, a queue pair in each, and
    /// memories registered in them.
    struct Setup {
        qp_a: SoftQp,
        qp_b: SoftQp,
        /// Registered in A's pd for remote reads only.
        read_only: (HostMemory, SoftRegion),
        /// Registered in A's pd for remote writes.
        writable: (HostMemory, SoftRegion),
        /// Registered in B's pd only.
        foreign: (HostMemory, SoftRegion),
        _cqs: (SoftCq, SoftCq),
        _domain: SoftDomain,
    }

    fn setup() -> Setup {
        let domain = SoftDomain::open(SoftConfig::with_wire(Wire::Shm)).unwrap();
        let other = domain.new_pd().unwrap();
        let cqs = (domain.create_cq().unwrap(), domain.create_cq().unwrap());
        let qp = |d: &SoftDomain| d.create_qp(&cqs.0, &cqs.1, QpConfig::default()).unwrap();
        let registered = |d: &SoftDomain, access| {
            let memory = d.alloc(8192).unwrap();
            let region = d.register(&memory, 0, 4096, access).unwrap();
            (memory, region)
        };
        let write = Access::REMOTE_WRITE | Access::LOCAL_WRITE;
        Setup {
            qp_a: qp(&domain),
            qp_b: qp(&other),
            read_only: registered(&domain, Access::REMOTE_READ),
            writable: registered(&domain, write),
            foreign: registered(&other, Access::ALL),
            _cqs: cqs,
            _domain: domain,
        }
    }

    fn fd_of(memory: &HostMemory) -> RawFd {
        memory.inner.shm.raw_fd()
    }

    fn broker_name(qp: &SoftQp) -> String {
        crate::soft::probe::broker_of(&crate::QueuePair::endpoint(qp))
            .unwrap()
            .name
    }

    /// Asks for `object` as holder of `qp`'s token.
    fn ask(qp: &SoftQp, object: Object) -> Reply {
        let shared = qp.shared();
        request(&broker_name(qp), shared.qpn, shared.token, object).unwrap()
    }

    fn granted(reply: Reply) -> (OwnedFd, bool) {
        match reply {
            Reply::Granted(fd, writable) => (fd, writable),
            Reply::Refused(why) => panic!("refused: {why}"),
        }
    }

    fn refusal(reply: Reply) -> Refusal {
        match reply {
            Reply::Granted(..) => panic!("granted"),
            Reply::Refused(why) => why,
        }
    }

    fn inode_of_fd(fd: &OwnedFd) -> u64 {
        std::fs::File::from(fd.try_clone().unwrap())
            .metadata()
            .unwrap()
            .ino()
    }

    fn inode(memory: &SharedMemory) -> u64 {
        std::fs::metadata(format!("/proc/self/fd/{}", memory.raw_fd()))
            .unwrap()
            .ino()
    }

    #[test]
    fn a_queue_pair_gets_its_ring_and_the_memories_of_its_protection_domain() {
        let s = setup();
        let (ring, writable) = granted(ask(&s.qp_a, Object::Ring));
        assert!(writable);
        let own_ring = s.qp_a.shared().inbound.as_ref().unwrap().memory();
        assert_eq!(inode_of_fd(&ring), inode(own_ring), "A's own ring");
        assert_ne!(
            inode(own_ring),
            inode(s.qp_b.shared().inbound.as_ref().unwrap().memory())
        );
        let capacity = s.qp_a.shared().inbound.as_ref().unwrap().capacity();
        Ring::from_descriptor(ring, capacity).expect("maps read-write");

        let (fd, writable) = granted(ask(&s.qp_a, Object::Memory(fd_of(&s.writable.0))));
        assert!(writable, "a REMOTE_WRITE registration: read-write");
        assert_eq!(inode_of_fd(&fd), inode(&s.writable.0.inner.shm));
        let mapped = SharedMemory::from_descriptor(fd, 8192, Protection::ReadWrite).unwrap();
        mapped.write(100, b"through the broker").unwrap();
        let mut seen = [0u8; 18];
        crate::Memory::read(&s.writable.0, 100, &mut seen).unwrap();
        assert_eq!(&seen, b"through the broker");

        let local_only = s._domain.alloc(8192).unwrap();
        let _local_region = s
            ._domain
            .register(&local_only, 0, 4096, Access::LOCAL_WRITE)
            .unwrap();
        assert_eq!(
            refusal(ask(&s.qp_a, Object::Memory(fd_of(&local_only)))),
            Refusal::NotInPd,
            "a registration without remote rights is never handed out"
        );
        let (fd, writable) = granted(ask(&s.qp_a, Object::Memory(fd_of(&s.read_only.0))));
        assert!(!writable, "a REMOTE_READ registration: read-only");
        let mapped =
            SharedMemory::from_descriptor(fd.try_clone().unwrap(), 8192, Protection::AsOpened)
                .unwrap();
        assert!(!mapped.is_writable());
        assert!(mapped.write(0, b"x").is_err());
        assert!(
            SharedMemory::from_descriptor(fd, 8192, Protection::ReadWrite).is_err(),
            "the descriptor itself is read-only"
        );

        for object in [Object::KeyTable, Object::LifePage] {
            let (fd, writable) = granted(ask(&s.qp_b, object));
            assert!(!writable, "{object}");
            let len = std::fs::File::from(fd.try_clone().unwrap())
                .metadata()
                .unwrap()
                .len() as usize;
            let read_write = SharedMemory::from_descriptor(fd, len, Protection::ReadWrite);
            assert!(read_write.is_err(), "{object} is handed out read-only");
        }
    }

    #[test]
    fn other_protection_domains_wrong_tokens_and_gone_queue_pairs_are_refused() {
        let s = setup();
        let foreign = Object::Memory(fd_of(&s.foreign.0));
        assert_eq!(refusal(ask(&s.qp_a, foreign)), Refusal::NotInPd);
        granted(ask(&s.qp_b, foreign));
        assert_eq!(
            refusal(ask(&s.qp_b, Object::Memory(fd_of(&s.read_only.0)))),
            Refusal::NotInPd
        );
        // Memfds that are not registered memory: the liveness page and a ring.
        let life_fd = life::process_page().unwrap().raw_fd();
        let ring_fd = s.qp_a.shared().inbound.as_ref().unwrap().memory().raw_fd();
        for fd in [life_fd, ring_fd, -1, 0, 1 << 30] {
            let reply = ask(&s.qp_a, Object::Memory(fd));
            assert_eq!(refusal(reply), Refusal::NotInPd, "descriptor {fd}");
        }

        let shared = s.qp_a.shared();
        let name = broker_name(&s.qp_a);
        let wrong = request(&name, shared.qpn, shared.token ^ 1, Object::KeyTable).unwrap();
        assert_eq!(refusal(wrong), Refusal::UnknownQp, "wrong token");
        let b_token = s.qp_b.shared().token;
        let mixed = request(&name, shared.qpn, b_token, Object::Ring).unwrap();
        assert_eq!(
            refusal(mixed),
            Refusal::UnknownQp,
            "another queue pair's token"
        );
        let unknown = request(&name, 999, shared.token, Object::KeyTable).unwrap();
        assert_eq!(refusal(unknown), Refusal::UnknownQp, "unknown qpn");

        let Setup {
            qp_a, read_only, ..
        } = s;
        let read_only_fd = Object::Memory(fd_of(&read_only.0));
        drop(read_only.1);
        assert_eq!(
            refusal(ask(&qp_a, read_only_fd)),
            Refusal::NotInPd,
            "deregistered"
        );
        let (qpn, token) = (qp_a.shared().qpn, qp_a.shared().token);
        drop(qp_a);
        let gone = request(&name, qpn, token, Object::Ring).unwrap();
        assert_eq!(refusal(gone), Refusal::UnknownQp, "destroyed queue pair");
    }

    #[test]
    fn malformed_requests_are_refused() {
        let s = setup();
        let shared = s.qp_a.shared();
        let good = Request {
            object: Object::KeyTable,
            qpn: shared.qpn,
            token: shared.token,
        }
        .encode();
        let mut bad_magic = good;
        bad_magic[0] = b'X';
        let mut bad_object = good;
        bad_object[4] = 9;
        let mut fd_on_table = good;
        fd_on_table[12] = 3;
        for bytes in [bad_magic, bad_object, fd_on_table] {
            let mut stream = connect(&broker_name(&s.qp_a));
            stream.write_all(&bytes).unwrap();
            let mut reply = [0u8; REPLY_LEN];
            let (got, fd) = recv_with_fd(&stream, &mut reply).unwrap();
            assert_eq!((got, fd.is_none()), (REPLY_LEN, true));
            assert_eq!(reply[..4], (Refusal::Malformed as u32).to_le_bytes());
        }
    }

    fn connect(name: &str) -> UnixStream {
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let stream = UnixStream::connect_addr(&addr).unwrap();
        stream.set_read_timeout(Some(DEADLINE * 10)).unwrap();
        stream
    }

    /// Whether the broker has closed `stream` (now, without waiting).
    fn closed_now(stream: &UnixStream) -> bool {
        stream.set_nonblocking(true).unwrap();
        let closed = !matches!(
            (&*stream).read(&mut [0u8; 1]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
        );
        stream.set_nonblocking(false).unwrap();
        closed
    }

    #[test]
    fn silent_and_slow_clients_do_not_hold_up_others() {
        let s = setup();
        let name = broker_name(&s.qp_a);
        // More silent connections than may wait, a slow one and one sending garbage.
        let silent: Vec<UnixStream> = (0..MAX_PENDING + 8).map(|_| connect(&name)).collect();
        let mut slow = connect(&name);
        slow.write_all(b"KVSB").unwrap();
        let mut garbage = connect(&name);
        garbage.write_all(&[0xee; 100]).unwrap();
        let started = Instant::now();
        granted(ask(&s.qp_a, Object::Ring));
        let served_in = started.elapsed();
        assert!(
            served_in < DEADLINE,
            "served in {served_in:?}, behind the silent clients"
        );
        let newest = silent.last().unwrap();
        assert!(
            !closed_now(newest),
            "served while the silent clients still wait"
        );
        // Garbage is answered as malformed, the oldest silent ones were dropped for room,
        // and every other one is closed at its deadline.
        let mut reply = [0u8; REPLY_LEN];
        garbage.read_exact(&mut reply).unwrap();
        assert_eq!(reply[..4], (Refusal::Malformed as u32).to_le_bytes());
        for stream in silent.iter().chain([&slow]) {
            let eof = (&*stream).read(&mut [0u8; 1]);
            assert!(matches!(eof, Ok(0)), "closed by the broker: {eof:?}");
        }
        slow.flush().unwrap();
    }

    #[test]
    fn the_broker_ends_with_its_domain() {
        let s = setup();
        let name = broker_name(&s.qp_a);
        drop(s);
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let refused = UnixStream::connect_addr(&addr).unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    }

    #[test]
    fn a_broker_trickling_its_reply_runs_out_of_one_deadline() {
        let name = format!("kvcm-test-trickle-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let listener = UnixListener::bind_addr(&addr).unwrap();
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut request = [0u8; REQUEST_LEN];
            stream.read_exact(&mut request).unwrap();
            // One byte of the 8-byte reply every 1.5 s: each read's own timeout (5 s)
            // would never fire, and the reply would take 12 s.
            for _ in 0..REPLY_LEN {
                if stream.write_all(&[0]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(1500));
            }
        });
        let error = request(&name, 1, 2, Object::KeyTable)
            .unwrap_err()
            .to_string();
        assert!(error.contains("did not reply within"), "{error}");
    }
}
