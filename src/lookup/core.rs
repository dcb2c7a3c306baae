//! The polling-thread core of the write path: one thread polls the receive and send
//! completion queues of every lookup queue pair (all wires), decodes request messages and
//! hands them through a bounded queue to a few manager workers, and sends their replies.
//! The polling thread takes no lock and runs no manager code; no tokio or HTTP/2 is on the
//! path. It busy-polls while there is work and for [`SPIN`] after (for [`SPIN_IN_FLIGHT`]
//! while workers hold requests, so that a reply usually leaves without a wake-up), yielding
//! the CPU between rounds, then parks on the completion queues' event descriptors and its
//! doorbell (2-core machines must not starve).
//!
//! Invariants: every peer has [`RECV_SLOTS`] receive buffers posted except the ones whose
//! message is being copied out; a reply is sent on the queue pair its request came from,
//! from one of the peer's [`SEND_SLOTS`] send buffers, reclaimed at its send completion;
//! a peer's queue pair and buffers are in its instance's protection domain, and its
//! messages may name only that instance (others are refused `Unauthenticated`); the
//! [`Bindings`] map holds exactly the peers the polling thread holds (its grant, for the
//! service's sweep), and a peer the sweep closes is dropped at the poller's next round.

use std::collections::{HashMap, VecDeque};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use kvcm_transport::any::{AnyCq, AnyDomain, AnyQp, AnyRegion};
use kvcm_transport::{
    Access, CompletionQueue, Domain, HostMemory, Memory, QpConfig, QpState, QueuePair, RecvWr,
    Region, SendOp, SendWr, WcStatus, WorkCompletion,
};

use super::grants::Grant;
use super::messages::{self, Op, Reply, Request, Status, MAX_MESSAGE};
use super::{LookupError, QueuePairLimits};
use crate::proto::meta::{
    CommonResponse, ErrorCode, StartWriteCacheRequest, StartWriteCacheResponse,
};
use crate::service::meta::MetaHandler;
use crate::service::Reply as _;

/// Receive buffers per peer.
pub const RECV_SLOTS: usize = 4;
/// Send buffers per peer.
const SEND_SLOTS: usize = 4;
/// Replies queued for one peer whose send buffers are all in flight, at most: a peer past
/// this takes no replies and is dropped.
const MAX_WAITING_REPLIES: usize = 256;
/// Requests waiting for a worker, at most (more are answered busy).
const WORK_QUEUE: usize = 1024;
/// Manager worker threads.
const WORKERS: usize = 2;
/// How long the polling thread spins after its last work before parking.
const SPIN: Duration = Duration::from_micros(100);
/// How long it spins after its last work while workers hold requests (a write call's
/// manager work, often a journal sync, takes a few hundred µs).
const SPIN_IN_FLIGHT: Duration = Duration::from_millis(2);
/// Longest park (a safety net: completions, replies and new peers all wake the poller).
const PARK: Duration = Duration::from_millis(250);

/// A peer: (wire index, queue pair number).
pub(super) type PeerKey = (usize, u32);

/// A connected peer on its way to the polling thread: its wire, itself, and the grant it
/// was bound to (adopted only if still bound to it: the sweep may have closed it while its
/// buffers were made).
type NewPeer = (usize, Peer, Arc<Grant>);

/// The grant of every peer the polling thread holds.
type Bindings = Arc<Mutex<HashMap<PeerKey, Arc<Grant>>>>;

/// A connected peer's queue pair and buffers, owned by the polling thread.
pub(super) struct Peer {
    qp: AnyQp,
    memory: HostMemory,
    region: AnyRegion,
    free_sends: Vec<usize>,
    /// Replies waiting for a free send buffer.
    waiting: VecDeque<Vec<u8>>,
    /// The credential its last Authenticate carried (checked again at every message, so a
    /// revoked key stops at the next one).
    credential: Option<Arc<[u8]>>,
    /// The only instance its messages may name.
    instance: Arc<str>,
    /// Which queue pair this is among those that had its key (queue pair numbers are
    /// reused): a worker's reply goes only to the queue pair that asked.
    serial: u64,
}

/// A reply a worker made: to whom (key and serial) and its bytes.
type Answer = (PeerKey, u64, Vec<u8>);

/// One domain's completion queues, shared by every peer queue pair of that wire.
#[derive(Clone)]
pub(super) struct WireQueues {
    wire: usize,
    send_cq: AnyCq,
    recv_cq: AnyCq,
}

/// What the queue-pair listener needs from the core.
#[derive(Clone)]
pub(super) struct CoreHandle {
    wires: Vec<WireQueues>,
    new_peers: Sender<NewPeer>,
    closing: Sender<(PeerKey, Arc<Grant>)>,
    bindings: Bindings,
    limits: QueuePairLimits,
    doorbell: Arc<Doorbell>,
    counts: Arc<MessageCounts>,
}

/// Messages the polling thread received, and those it refused before any manager work.
#[derive(Debug, Default)]
struct MessageCounts {
    received: AtomicU64,
    busy: AtomicU64,
    malformed: AtomicU64,
}

/// The core's figures for the server's metrics (`kvcm_lookup_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoreStats {
    /// Queue pairs connected now.
    pub queue_pairs: u64,
    /// Request messages received.
    pub messages: u64,
    /// Of those, answered busy (every worker's queue full: nothing applied).
    pub busy: u64,
    /// Of those, answered malformed (nothing applied).
    pub malformed: u64,
}

/// Wakes the polling thread when it parks.
struct Doorbell {
    parked: AtomicBool,
    ring: UnixDatagram,
    wait: UnixDatagram,
}

impl Doorbell {
    fn ring(&self) {
        if self.parked.load(Ordering::SeqCst) {
            let _ = self.ring.send(&[1]);
        }
    }
}

impl CoreHandle {
    /// A queue pair on `wire` in protection domain `pd` (a handle of that wire's domain),
    /// bound to the core's completion queues (not yet connected).
    pub(super) fn create_qp(&self, wire: usize, pd: &AnyDomain) -> Result<AnyQp, LookupError> {
        let queues = self.queues(wire)?;
        let config = QpConfig {
            max_recv_wr: RECV_SLOTS,
            max_send_wr: SEND_SLOTS,
            max_sge: 1,
        };
        Ok(pd.create_qp(&queues.send_cq, &queues.recv_cq, config)?)
    }

    /// Refuses a queue pair of `instance` when the core holds as many as its limits allow
    /// (checked at the hello, before any queue pair is made, and again when one is adopted).
    pub(super) fn has_room(&self, instance: &str) -> Result<(), LookupError> {
        room_for(&lock(&self.bindings), self.limits, instance)
    }

    /// Hands a connected queue pair of protection domain `pd` to the polling thread, its
    /// receive buffers posted, bound to `grant`'s instance; returns its key and grant.
    /// Refused beyond the limits (the place is taken before the buffers are made, so
    /// concurrent handshakes cannot overshoot them).
    pub(super) fn adopt(
        &self,
        wire: usize,
        pd: &AnyDomain,
        qp: AnyQp,
        grant: Grant,
    ) -> Result<(PeerKey, Arc<Grant>), LookupError> {
        let key = (wire, qp.qpn());
        let grant = Arc::new(grant);
        {
            let mut bindings = lock(&self.bindings);
            room_for(&bindings, self.limits, &grant.instance_id)?;
            bindings.insert(key, Arc::clone(&grant));
        }
        let handed = peer_of(pd, qp, &grant).and_then(|peer| {
            self.new_peers
                .send((wire, peer, Arc::clone(&grant)))
                .map_err(|_| LookupError::NoWire)
        });
        if let Err(error) = handed {
            lock(&self.bindings).remove(&key);
            return Err(error);
        }
        self.doorbell.ring();
        Ok((key, grant))
    }

    /// Whether `key` is a connected peer bound to `grant`.
    pub(super) fn is_bound(&self, key: PeerKey, grant: &Arc<Grant>) -> bool {
        bound_to(&self.bindings, key, grant)
    }

    /// Every connected peer and its grant.
    pub(super) fn bound(&self) -> Vec<(PeerKey, Arc<Grant>)> {
        lock(&self.bindings)
            .iter()
            .map(|(key, grant)| (*key, Arc::clone(grant)))
            .collect()
    }

    /// Tears `key`'s queue pair down (at the polling thread's next round) if it is still the
    /// one bound to `grant` (a verbs device reuses the number of a destroyed queue pair, so
    /// a late close must not reach its successor).
    pub(super) fn close(&self, key: PeerKey, grant: Arc<Grant>) {
        if self.closing.send((key, grant)).is_ok() {
            self.doorbell.ring();
        }
    }

    /// The core's figures now.
    pub(super) fn stats(&self) -> CoreStats {
        let count = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        CoreStats {
            queue_pairs: lock(&self.bindings).len() as u64,
            messages: count(&self.counts.received),
            busy: count(&self.counts.busy),
            malformed: count(&self.counts.malformed),
        }
    }

    fn queues(&self, wire: usize) -> Result<&WireQueues, LookupError> {
        self.wires
            .iter()
            .find(|q| q.wire == wire)
            .ok_or_else(|| LookupError::Refused(format!("unknown wire {wire}")))
    }
}

fn lock(bindings: &Bindings) -> std::sync::MutexGuard<'_, HashMap<PeerKey, Arc<Grant>>> {
    bindings.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A queue pair of `grant`'s instance, its receive buffers posted.
fn peer_of(pd: &AnyDomain, qp: AnyQp, grant: &Grant) -> Result<Peer, LookupError> {
    let memory = pd.alloc((RECV_SLOTS + SEND_SLOTS) * MAX_MESSAGE)?;
    let region = pd.register(&memory, 0, memory.len(), Access::LOCAL_WRITE)?;
    for slot in 0..RECV_SLOTS {
        post_recv(&qp, &region, slot)?;
    }
    Ok(Peer {
        qp,
        memory,
        region,
        free_sends: (0..SEND_SLOTS).collect(),
        waiting: VecDeque::new(),
        credential: None,
        instance: grant.instance_id.clone(),
        serial: 0,
    })
}

/// Whether `bindings` leave room for one more queue pair of `instance` under `limits`.
fn room_for(
    bindings: &HashMap<PeerKey, Arc<Grant>>,
    limits: QueuePairLimits,
    instance: &str,
) -> Result<(), LookupError> {
    if bindings.len() >= limits.total {
        return Err(LookupError::Busy(format!(
            "{} lookup queue pairs are connected (kvcm.lookup.max_queue_pairs)",
            bindings.len()
        )));
    }
    let of_instance = bindings
        .values()
        .filter(|grant| &*grant.instance_id == instance)
        .count();
    if of_instance >= limits.per_instance {
        return Err(LookupError::Busy(format!(
            "{of_instance} lookup queue pairs of instance {instance:?} are connected \
             (kvcm.lookup.max_queue_pairs_per_instance)"
        )));
    }
    Ok(())
}

/// Whether `key` is bound to `grant` in `bindings`.
fn bound_to(bindings: &Bindings, key: PeerKey, grant: &Arc<Grant>) -> bool {
    lock(bindings)
        .get(&key)
        .is_some_and(|bound| Arc::ptr_eq(bound, grant))
}

fn post_recv(qp: &AnyQp, region: &AnyRegion, slot: usize) -> Result<(), LookupError> {
    let sge = region.sge(slot * MAX_MESSAGE, MAX_MESSAGE as u32);
    qp.post_recv(&[RecvWr {
        wr_id: slot as u64,
        sg_list: &[sge],
    }])?;
    Ok(())
}

/// A request on its way to a worker, and its answer on the way back.
struct Work {
    peer: PeerKey,
    /// The asking queue pair's serial (see [`Peer::serial`]).
    serial: u64,
    id: u32,
    op: u8,
    request: Request,
    /// The queue pair's credential.
    credential: Option<Arc<[u8]>>,
    /// The queue pair's instance.
    instance: Arc<str>,
}

/// Starts the polling thread and the workers on `domains`, serving requests with `meta`.
pub(super) fn start(
    domains: &[(usize, AnyDomain)],
    meta: MetaHandler,
    limits: QueuePairLimits,
) -> Result<CoreHandle, LookupError> {
    let wires = domains
        .iter()
        .map(|(wire, domain)| {
            Ok(WireQueues {
                wire: *wire,
                send_cq: domain.create_cq()?,
                recv_cq: domain.create_cq()?,
            })
        })
        .collect::<Result<Vec<_>, LookupError>>()?;
    let (ring, wait) = UnixDatagram::pair().map_err(LookupError::Listener)?;
    wait.set_nonblocking(true).map_err(LookupError::Listener)?;
    ring.set_nonblocking(true).map_err(LookupError::Listener)?;
    let doorbell = Arc::new(Doorbell {
        parked: AtomicBool::new(false),
        ring,
        wait,
    });
    let (new_peers, adopted) = crossbeam_channel::unbounded();
    let (closing, closed) = crossbeam_channel::unbounded();
    let bindings = Bindings::default();
    let counts = Arc::new(MessageCounts::default());
    let (work, jobs) = crossbeam_channel::bounded::<Work>(WORK_QUEUE);
    let (answers, replies) = crossbeam_channel::unbounded::<Answer>();
    for n in 0..WORKERS {
        let (jobs, answers, meta, doorbell) = (
            jobs.clone(),
            answers.clone(),
            meta.clone(),
            doorbell.clone(),
        );
        std::thread::Builder::new()
            .name(format!("kvcm-core-worker-{n}"))
            .spawn(move || serve(&jobs, &answers, &meta, &doorbell))
            .map_err(LookupError::Listener)?;
    }
    let poller = Poller {
        wires: wires.clone(),
        peers: HashMap::new(),
        adopted,
        closed,
        bindings: bindings.clone(),
        work,
        replies,
        in_flight: 0,
        next_serial: 1,
        doorbell: doorbell.clone(),
        counts: counts.clone(),
    };
    std::thread::Builder::new()
        .name("kvcm-core-poll".into())
        .spawn(move || poller.run())
        .map_err(LookupError::Listener)?;
    Ok(CoreHandle {
        wires,
        new_peers,
        closing,
        bindings,
        limits,
        doorbell,
        counts,
    })
}

/// A manager worker: answers requests until the polling thread is gone.
fn serve(jobs: &Receiver<Work>, answers: &Sender<Answer>, meta: &MetaHandler, doorbell: &Doorbell) {
    for job in jobs {
        let (peer, serial, id, op) = (job.peer, job.serial, job.id, job.op);
        let bytes = answer_or_internal_error(id, op, || answer(meta, job));
        if answers.send((peer, serial, bytes)).is_err() {
            return;
        }
        doorbell.ring();
    }
}

/// The reply to one request.
fn answer(meta: &MetaHandler, job: Work) -> Vec<u8> {
    let credential = job.credential.as_deref();
    match job.request {
        Request::Authenticate(_) => {
            let answer = meta.check_credential(credential);
            messages::encode_reply(job.id, job.op, &Reply::Common(answer))
        }
        request
            if !names_only(&request, &job.instance)
                || !meta.message_allowed(credential, &request) =>
        {
            messages::encode_reply(job.id, job.op, &Reply::Refused(Status::Unauthenticated))
        }
        Request::StartWrite(r) => start_write(meta, job.id, job.op, r),
        Request::FinishWrite(r) => {
            messages::encode_reply(job.id, job.op, &Reply::Common(meta.finish_write_cache(r)))
        }
        Request::Remove(r) => {
            messages::encode_reply(job.id, job.op, &Reply::Common(meta.remove_cache(r)))
        }
        Request::Reads(lookups) => {
            let answer = meta.record_table_lookups(lookups);
            messages::encode_reply(job.id, job.op, &Reply::Common(answer))
        }
    }
}

/// `reply()`, or, when it panics, INTERNAL_ERROR in the response type of `op`: the worker lives on and the request is answered, so
/// the polling thread's count of requests in flight stays exact and the client is not left
/// waiting for its timeout (the gRPC path answers such a failure with an error too).
fn answer_or_internal_error(id: u32, op: u8, reply: impl FnOnce() -> Vec<u8>) -> Vec<u8> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(reply)).unwrap_or_else(|_| {
        let message = "the server failed while handling this request".to_string();
        let reply = if op == Op::StartWrite as u8 {
            let mut response = StartWriteCacheResponse::default();
            response.set_header(ErrorCode::InternalError, message, String::new());
            Reply::StartWrite(response)
        } else {
            let mut response = CommonResponse::default();
            response.set_header(ErrorCode::InternalError, message, String::new());
            Reply::Common(response)
        };
        messages::encode_reply(id, op, &reply)
    })
}

/// Whether `request` names no instance but `instance`.
fn names_only(request: &Request, instance: &str) -> bool {
    match request {
        Request::StartWrite(r) => r.instance_id == instance,
        Request::FinishWrite(r) => r.instance_id == instance,
        Request::Remove(r) => r.instance_id == instance,
        Request::Reads(lookups) => lookups.iter().all(|r| r.instance_id == instance),
        Request::Authenticate(_) => true,
    }
}

/// StartWriteCache's reply; an answer too large for a message abandons its new session at
/// once (its blocks removed before the reply), so that "too large" means "nothing applied"
/// and the client's retry over gRPC allocates the same keys again.
fn start_write(meta: &MetaHandler, id: u32, op: u8, request: StartWriteCacheRequest) -> Vec<u8> {
    let instance_id = request.instance_id.clone();
    let answer = meta.start_write_cache(request);
    let session = answer.write_session_id.clone();
    let bytes = messages::encode_reply(id, op, &Reply::StartWrite(answer));
    if messages::peek_status(&bytes) == Some(Status::TooLarge) && !session.is_empty() {
        meta.abandon_write_session(&instance_id, &session);
    }
    bytes
}

/// The polling thread's state.
struct Poller {
    wires: Vec<WireQueues>,
    peers: HashMap<PeerKey, Peer>,
    adopted: Receiver<NewPeer>,
    closed: Receiver<(PeerKey, Arc<Grant>)>,
    bindings: Bindings,
    work: Sender<Work>,
    replies: Receiver<Answer>,
    /// Requests handed to the workers whose replies have not come back.
    in_flight: usize,
    /// The serial the next adopted queue pair gets.
    next_serial: u64,
    doorbell: Arc<Doorbell>,
    counts: Arc<MessageCounts>,
}

impl Poller {
    fn run(mut self) {
        let mut last_work = Instant::now();
        let mut completions = [WorkCompletion::EMPTY; 32];
        loop {
            let (alive, mut worked) = self.adopt_new_peers();
            if !alive {
                return;
            }
            for index in 0..self.wires.len() {
                let wire = self.wires[index].wire;
                let count = self.wires[index].recv_cq.poll(&mut completions);
                for completion in &completions[..count] {
                    self.received(wire, completion);
                }
                let sent = self.wires[index].send_cq.poll(&mut completions);
                for completion in &completions[..sent] {
                    self.sent(wire, completion);
                }
                worked |= count + sent > 0;
            }
            while let Ok((peer, serial, bytes)) = self.replies.try_recv() {
                self.in_flight -= 1;
                // To the queue pair that asked, not to a later one given its number.
                if self.peers.get(&peer).is_some_and(|p| p.serial == serial) {
                    self.reply(peer, bytes);
                }
                worked = true;
            }
            let spin = if self.in_flight > 0 {
                SPIN_IN_FLIGHT
            } else {
                SPIN
            };
            if worked {
                last_work = Instant::now();
            } else if last_work.elapsed() > spin {
                // A park that ends without work parks again after one round (no new spin).
                self.park();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// The peer a completion belongs to; a failed completion means the peer is gone (it is
    /// forgotten), and a completion of a forgotten peer is dropped.
    fn completed(&mut self, key: PeerKey, completion: &WorkCompletion) -> Option<&mut Peer> {
        if completion.status != WcStatus::Success {
            self.forget(key);
            return None;
        }
        self.peers.get_mut(&key)
    }

    /// A request arrived (or a receive failed: the peer is gone).
    fn received(&mut self, wire: usize, completion: &WorkCompletion) {
        let key = (wire, completion.qpn);
        let Some(peer) = self.completed(key, completion) else {
            return;
        };
        let slot = completion.wr_id as usize;
        let len = completion.byte_len as usize;
        // A receive buffer holds MAX_MESSAGE bytes: a peer claiming more lies (a soft-shm
        // peer writes its own completions' lengths) and is dropped before any allocation.
        if len > MAX_MESSAGE || slot >= RECV_SLOTS {
            self.forget(key);
            return;
        }
        let mut message = vec![0u8; len];
        let copied = peer.memory.read(slot * MAX_MESSAGE, &mut message);
        if copied.is_err() || post_recv(&peer.qp, &peer.region, slot).is_err() {
            self.forget(key);
            return;
        }
        self.counts.received.fetch_add(1, Ordering::Relaxed);
        let refuse = |status| {
            let (id, op) = messages::peek(&message).unwrap_or((0, 0));
            messages::encode_reply(id, op, &Reply::Refused(status))
        };
        let Some((id, request)) = messages::decode_request(&message) else {
            self.counts.malformed.fetch_add(1, Ordering::Relaxed);
            let answer = refuse(Status::Malformed);
            self.reply(key, answer);
            return;
        };
        let op = message[4];
        let Some(peer) = self.peers.get_mut(&key) else {
            return;
        };
        if let Request::Authenticate(credential) = &request {
            peer.credential = Some(credential.as_slice().into());
        }
        let credential = peer.credential.clone();
        let instance = peer.instance.clone();
        let serial = peer.serial;
        match self.work.try_send(Work {
            peer: key,
            serial,
            id,
            op,
            request,
            credential,
            instance,
        }) {
            Ok(()) => self.in_flight += 1,
            Err(TrySendError::Full(_)) => {
                self.counts.busy.fetch_add(1, Ordering::Relaxed);
                let answer = refuse(Status::Busy);
                self.reply(key, answer);
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    /// A reply was sent (its buffer is free again) or failed (the peer is gone).
    fn sent(&mut self, wire: usize, completion: &WorkCompletion) {
        let key = (wire, completion.qpn);
        let Some(peer) = self.completed(key, completion) else {
            return;
        };
        peer.free_sends.push(completion.wr_id as usize);
        if let Some(bytes) = peer.waiting.pop_front() {
            self.reply(key, bytes);
        }
    }

    /// Sends `bytes` to `key` from a free send buffer (or queues them for one).
    fn reply(&mut self, key: PeerKey, bytes: Vec<u8>) {
        let Some(peer) = self.peers.get_mut(&key) else {
            return;
        };
        let Some(slot) = peer.free_sends.pop() else {
            if peer.waiting.len() >= MAX_WAITING_REPLIES {
                // It sends requests but takes no replies: it is dropped rather than let
                // its queue grow without bound.
                self.forget(key);
                return;
            }
            peer.waiting.push_back(bytes);
            return;
        };
        let offset = (RECV_SLOTS + slot) * MAX_MESSAGE;
        let sge = peer.region.sge(offset, bytes.len().max(1) as u32);
        let posted = peer.memory.write(offset, &bytes).is_ok()
            && peer
                .qp
                .post_send(&[SendWr {
                    wr_id: slot as u64,
                    op: SendOp::Send { imm: None },
                    sg_list: &[sge],
                    signaled: true,
                }])
                .is_ok();
        if !posted || peer.qp.state() == QpState::Error {
            self.forget(key);
        }
    }

    /// Sleeps until a completion, a reply or a new peer (or [`PARK`]).
    fn park(&mut self) {
        self.doorbell.parked.store(true, Ordering::SeqCst);
        let pending =
            !self.replies.is_empty() || !self.adopted.is_empty() || !self.closed.is_empty();
        let mut armed_ready = false;
        for queues in &self.wires {
            armed_ready |= queues.recv_cq.arm().unwrap_or(true);
            armed_ready |= queues.send_cq.arm().unwrap_or(true);
        }
        if !pending && !armed_ready {
            let mut fds = Vec::with_capacity(2 * self.wires.len() + 1);
            for queues in &self.wires {
                fds.push(queues.recv_cq.event_fd());
                fds.push(queues.send_cq.event_fd());
            }
            fds.push(self.doorbell.wait.as_raw_fd());
            let _ = kvcm_transport::poll_readable(&fds, PARK.as_millis() as i32);
        }
        self.doorbell.parked.store(false, Ordering::SeqCst);
        let mut drain = [0u8; 64];
        while self.doorbell.wait.recv(&mut drain).is_ok() {}
    }

    /// Drops a peer: its queue pair is destroyed (the client's reads and messages fail).
    fn forget(&mut self, key: PeerKey) {
        self.peers.remove(&key);
        lock(&self.bindings).remove(&key);
    }

    /// Takes the queue pairs the listener connected and drops those the sweep closed;
    /// false once the service is gone (every handle dropped) and no peer is left.
    fn adopt_new_peers(&mut self) -> (bool, bool) {
        let mut changed = false;
        // New peers first: a close sent after its peer's adoption then finds the peer.
        let alive = loop {
            match self.adopted.try_recv() {
                Ok((wire, mut peer, grant)) => {
                    let key = (wire, peer.qp.qpn());
                    // Closed (and unbound) while its buffers were made: dropped, never served.
                    if bound_to(&self.bindings, key, &grant) {
                        peer.serial = self.next_serial;
                        self.next_serial += 1;
                        self.peers.insert(key, peer);
                    }
                    changed = true;
                }
                Err(crossbeam_channel::TryRecvError::Empty) => break true,
                Err(crossbeam_channel::TryRecvError::Disconnected) => break false,
            }
        };
        while let Ok((key, grant)) = self.closed.try_recv() {
            if !bound_to(&self.bindings, key, &grant) {
                continue;
            }
            self.forget(key);
            changed = true;
        }
        (alive || !self.peers.is_empty(), changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(reply: Reply) -> i32 {
        let header = match reply {
            Reply::StartWrite(r) => r.header,
            Reply::Common(r) => r.header,
            Reply::Refused(status) => panic!("refused: {status:?}"),
        };
        header.and_then(|h| h.status).map_or(-1, |s| s.code)
    }

    #[test]
    fn a_panicking_request_is_answered_internal_error_in_its_own_response_type() {
        let start = answer_or_internal_error(7, Op::StartWrite as u8, || panic!("injected"));
        let reply = messages::decode_reply(&start, 7, Op::StartWrite).unwrap();
        assert!(matches!(reply, Reply::StartWrite(_)));
        assert_eq!(code(reply), ErrorCode::InternalError as i32);
        for op in [Op::FinishWrite, Op::Remove, Op::Reads, Op::Authenticate] {
            let bytes = answer_or_internal_error(9, op as u8, || panic!("injected"));
            let reply = messages::decode_reply(&bytes, 9, op).unwrap();
            assert!(matches!(reply, Reply::Common(_)), "{op:?}");
            assert_eq!(code(reply), ErrorCode::InternalError as i32);
        }
        let fine = messages::encode_reply(3, Op::Remove as u8, &Reply::Refused(Status::Busy));
        assert_eq!(
            answer_or_internal_error(3, Op::Remove as u8, || fine.clone()),
            fine
        );
    }
}
