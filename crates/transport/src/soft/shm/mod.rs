//! The same-host shared-memory wire.
//!
//! A connected queue pair maps the peer's key table, its inbound frame ring and its
//! liveness page, and rings its NIC doorbell. Every descriptor comes from the peer's
//! descriptor broker (`broker`): the peer process passes it with SCM_RIGHTS to whoever
//! names the queue pair by number and token, the key table and liveness page read-only,
//! the ring read-write, and a memory only if a live registration of it belongs to the
//! queue pair's protection domain (read-write only if one grants a remote write or
//! atomic). Nothing is opened through `/proc/<pid>/fd`, so the peer may be non-dumpable
//! and run as another user, and a queue pair of one protection domain cannot obtain the
//! memory of another however it lies.
//!
//! One-sided operations run on the posting thread as plain memory accesses to the peer's
//! memfd-backed regions (a READ is a memory read), after the peer's key table has vouched
//! for the rkey, bounds and right; the peer's CPU is not involved (a memory is asked from
//! the broker once, on the first use of a key, and stays mapped). A mapping the broker
//! handed out read-only refuses writes and atomics whatever the key table claims. SENDs
//! and WRITE-with-immediate notifications go through the peer's ring, drained by its NIC
//! thread, which rings nothing back: the data is in place when the post returns.

pub(crate) mod broker;
mod post;
mod ring;

pub(crate) use broker::Broker;
pub(crate) use post::{post_inline, read_direct, retry_stalled, write_direct};
pub(crate) use ring::Ring;

use super::frame::{self, Op, RequestHeader};
use super::keytable::{self, KeyTable};
use super::queue_pair::QpShared;
use super::registry::{Registry, Target};
use super::responder;
use crate::sys::{life, Protection, RemoteDoorbell, SharedMemory};
use crate::{Access, Result};
use broker::Object;
use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// What a same-host peer publishes in its endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ShmAddress {
    /// The peer process (for messages; nothing is opened through it).
    pub pid: u32,
    /// The protection domain of the queue pair: accesses through it may use only keys of
    /// that protection domain.
    pub pd: u32,
    pub ring_capacity: usize,
    pub doorbell: String,
    /// The abstract socket name of the peer domain's descriptor broker.
    pub broker: String,
    /// The queue pair's secret: the broker serves only requests that carry it.
    pub token: u64,
}

/// The peer key a batch resolved last: a batch's many accesses under one rkey look the key
/// up and map it once (a key deregistered while the batch runs is still served to its
/// end, as a NIC serves requests already in flight).
#[derive(Default)]
pub(crate) struct Memo {
    last: Option<(u32, keytable::KeyEntry, Arc<SharedMemory>)>,
}

/// The offset of `len` bytes at `addr` into the memory of `entry`, if its rights and
/// bounds allow the access.
fn within(
    entry: &keytable::KeyEntry,
    mem: &SharedMemory,
    addr: u64,
    len: u64,
    need: Access,
) -> Option<usize> {
    if !keytable::check_access(entry, addr, len, need) {
        return None;
    }
    // The broker decides what may be written, not the table: a read-only mapping serves
    // reads only (its writes would be refused anyway, after this check).
    let writes = need.contains(Access::REMOTE_WRITE) || need.contains(Access::REMOTE_ATOMIC);
    if writes && !mem.is_writable() {
        return None;
    }
    // The entry comes from the peer: an offset outside the mapping is caught here or by
    // the mapping's own bounds checks.
    let offset = usize::try_from(addr.checked_sub(entry.mem_base)?).ok()?;
    mem.check(offset, usize::try_from(len).ok()?).ok()?;
    Some(offset)
}

/// Most peer memories one queue pair keeps mapped (each maps a whole memfd; no descriptor
/// stays open), so at most this many broker requests per working set.
const MAX_MAPPINGS: usize = 256;

/// The mapped state of a connected same-host peer.
#[derive(Debug)]
pub(crate) struct ShmPeer {
    /// The peer queue pair's number, protection domain (see [`ShmAddress::pd`]) and
    /// token, and its broker's name: what every broker request carries.
    qpn: u32,
    pd: u32,
    token: u64,
    broker: String,
    table: KeyTable,
    ring: Ring,
    bell: RemoteDoorbell,
    /// The peer process's liveness page: one load tells whether it still runs.
    life: SharedMemory,
    mappings: Mutex<HashMap<u32, Arc<SharedMemory>>>,
    send_lock: Mutex<()>,
    /// How long a SEND waits for ring room (the peer posting receives) before it fails
    /// with `RetryExceeded`, like an RNR retry limit.
    timeout: Duration,
    /// Since when the head of the send queue has waited for ring room.
    stalled_since: Mutex<Option<Instant>>,
}

impl ShmPeer {
    /// Maps what queue pair `qpn` at `address` offers, each descriptor obtained from its
    /// broker.
    pub(crate) fn open(qpn: u32, address: &ShmAddress, timeout: Duration) -> Result<Self> {
        let obtain = |object| broker::obtain(&address.broker, qpn, address.token, object);
        let life = obtain(Object::LifePage)?;
        Ok(ShmPeer {
            qpn,
            pd: address.pd,
            token: address.token,
            broker: address.broker.clone(),
            life: SharedMemory::from_descriptor(life, life::PAGE, Protection::ReadOnly)?,
            table: KeyTable::from_descriptor(obtain(Object::KeyTable)?)?,
            ring: Ring::from_descriptor(obtain(Object::Ring)?, address.ring_capacity)?,
            bell: RemoteDoorbell::new(&address.doorbell)?,
            mappings: Mutex::default(),
            send_lock: Mutex::default(),
            timeout,
            stalled_since: Mutex::default(),
        })
    }

    /// Whether the peer is gone: its queue pair was destroyed or its process exited.
    pub(crate) fn gone(&self) -> bool {
        self.ring.is_closed() || !life::alive(&self.life)
    }

    /// Notes that the head send found the ring full; true once it has waited longer than
    /// the timeout.
    fn stall_expired(&self) -> bool {
        let mut since = self
            .stalled_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        since.get_or_insert_with(Instant::now).elapsed() > self.timeout
    }

    /// The head send got through (or failed): the next stall starts its own clock.
    fn end_stall(&self) {
        *self
            .stalled_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Resolves `len` bytes at the peer's `addr` under `rkey` if its table allows `need`.
    fn resolve(
        &self,
        memo: &mut Memo,
        rkey: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Option<Target> {
        let (mem, offset) = self.locate(memo, rkey, addr, len, need)?;
        Some(Target {
            mem: Arc::clone(mem),
            offset,
        })
    }

    /// As [`ShmPeer::resolve`], lending the mapping from `memo` (no reference count taken:
    /// what direct copies use per range).
    fn locate<'m>(
        &self,
        memo: &'m mut Memo,
        rkey: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Option<(&'m Arc<SharedMemory>, usize)> {
        if memo.last.as_ref().is_none_or(|(key, _, _)| *key != rkey) {
            let Some(entry) = self.table.lookup(rkey) else {
                self.forget(rkey);
                return None;
            };
            if entry.pd != self.pd {
                return None;
            }
            let mem = self.mapping(rkey, entry.fd, usize::try_from(entry.mem_len).ok()?)?;
            if !self.table.is_live(rkey) {
                return None;
            }
            memo.last = Some((rkey, entry, mem));
        }
        let (_, entry, mem) = memo.last.as_ref()?;
        let offset = within(entry, mem, addr, len, need)?;
        Some((mem, offset))
    }

    /// Drops the cached mapping of a key that is no longer registered.
    fn forget(&self, rkey: u32) {
        self.mappings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&rkey);
    }

    fn mapping(&self, rkey: u32, fd: RawFd, len: usize) -> Option<Arc<SharedMemory>> {
        let mut mappings = self.mappings.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(mem) = mappings.get(&rkey) {
            return Some(Arc::clone(mem));
        }
        if mappings.len() >= MAX_MAPPINGS {
            // Keys the peer deregistered go first; if all are live, start over (each is
            // mapped again on its next use).
            mappings.retain(|&key, _| self.table.is_live(key));
            if mappings.len() >= MAX_MAPPINGS {
                mappings.clear();
            }
        }
        // A refusal (say, the key's memory is not in our protection domain after all: the
        // table lied or changed) fails the access like a bad key.
        let fd = broker::obtain(&self.broker, self.qpn, self.token, Object::Memory(fd)).ok()?;
        let mem = SharedMemory::from_descriptor(fd, len, Protection::AsOpened).ok()?;
        let mem = Arc::new(mem);
        mappings.insert(rkey, Arc::clone(&mem));
        Some(mem)
    }

    /// Pushes a frame to the peer's ring and rings its doorbell if it sleeps; false if the
    /// ring has no room now.
    fn try_push(&self, parts: &[&[u8]]) -> bool {
        if !self.ring.push(parts) {
            return false;
        }
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.table.is_parked() {
            self.bell.ring();
        }
        true
    }
}

/// Most inbound frames one NIC round takes from one ring.
const MAX_FRAMES_PER_DRAIN: usize = 256;

/// Delivers frames waiting in `qp`'s inbound ring to its receive queue; true on progress.
/// A ring the producer corrupted puts the queue pair in `Error`.
pub(crate) fn drain_inbound(registry: &Registry, qp: &QpShared) -> bool {
    let Some(ring) = &qp.inbound else {
        return false;
    };
    let broken = qp.closed.load(Ordering::Acquire) || qp.state() == crate::QpState::Error;
    if ring.is_empty() || broken {
        return false;
    }
    let mut frame_bytes = Vec::new();
    // Bounded, so a producer that keeps the ring full cannot hold the NIC here.
    for drained in 0..MAX_FRAMES_PER_DRAIN {
        match ring.peek(&mut frame_bytes) {
            Ok(true) => {}
            Ok(false) => return drained > 0,
            Err(ring::Corrupt) => {
                qp.enter_error();
                return true;
            }
        }
        if !deliver_frame(registry, qp, &frame_bytes) {
            return drained > 0;
        }
        ring.pop(frame_bytes.len());
    }
    true
}

/// Delivers one inbound frame (a malformed one is dropped); false when it must wait for
/// a receive buffer.
fn deliver_frame(registry: &Registry, qp: &QpShared, frame_bytes: &[u8]) -> bool {
    let Some(header) = RequestHeader::decode(frame_bytes) else {
        return true;
    };
    let payload = &frame_bytes[frame::REQUEST_LEN..];
    match header.op {
        Op::Send if payload.len() == header.len as usize => {
            responder::deliver(registry, qp, header.imm, Some(payload), header.len).is_some()
        }
        Op::ImmNotify => responder::deliver(registry, qp, header.imm, None, header.len).is_some(),
        _ => true, // malformed: dropped
    }
}

/// Whether `qp` has inbound frames that a posted receive buffer can take now.
pub(crate) fn inbound_ready(qp: &QpShared) -> bool {
    qp.inbound.as_ref().is_some_and(|ring| !ring.is_empty()) && !qp.lock_rq().is_empty()
}
