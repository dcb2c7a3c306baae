//! A pool node's region: one memory (a memfd mapping, backed lazily page by page as
//! blocks are written, or wholly at start with `--prefault`; on 2 MiB hugetlb pages when the size is a multiple of 2 MiB and the
//! kernel has that many free, on regular pages otherwise, and the node says which) registered for remote reads and writes on a soft-TCP and a
//! soft-shm domain (and a verbs one when the node is given an RDMA device), the node's current incarnation (`range_id`) and, when its server
//! demands tickets, the incarnation's ticket key (`super::ticket`), and the connected queue
//! pairs, each with an id (never reused: the hang-up watcher names it) and the grant it was
//! opened under; a revoked grant's are torn down, and so is one whose client hung up
//! (`super::listener`). When the server has the node isolate instances, each instance's
//! queue pairs live in a protection domain of its own that reaches its runs only
//! (`super::isolation`). It also carries the membership thread's wake-ups: its stop, and
//! the heartbeats the listener asks for when a client needs ownership newer than the
//! node's.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kvcm_transport::any::{AnyCq, AnyDomain, AnyQp, AnyRegion, VerbsDevice};
use kvcm_transport::{Domain, HostMemory, Memory, QpConfig, QpState, QueuePair, Region};

use super::isolation::{region_access, Isolation, RunKey};
use super::routes::{AppliedVersion, OwnershipAnswer};
use super::ticket::{self, Admit, NodeKey, Ticket};
use super::PoolError;
use crate::lookup::WIRE_SOFT_SHM;

/// One wire's domain, completion queue and registration of the memory.
struct WireRegion {
    wire: usize,
    domain: AnyDomain,
    cq: AnyCq,
    region: AnyRegion,
}

/// The memory of a pool node and its registrations.
pub struct PoolRegion {
    memory: HostMemory,
    wires: Vec<WireRegion>,
    range_id: AtomicU64,
    /// The ticket key of the current incarnation (`None`: the server demands no tickets).
    ticket_key: Mutex<Option<NodeKey>>,
    /// Connected queue pairs.
    peers: Mutex<Vec<Peer>>,
    /// The id of the next queue pair kept.
    next_peer: AtomicU64,
    /// Incarnations recorded so far: a hello admitted under an earlier one (whose policy
    /// may have been laxer) keeps no queue pair.
    epoch: AtomicU64,
    /// Grants the server answered revoked, and when: their tickets open nothing more (kept
    /// for a ticket's life, after which every ticket of theirs has expired).
    revoked: Mutex<Vec<(u64, Instant)>>,
    /// Each instance's access, while the server has this incarnation isolate them.
    isolation: Mutex<Option<Isolation>>,
    /// Whether a shared-memory queue pair was ever made (set under the `isolation` lock):
    /// its client may map the whole region, and no mapping can be taken back, so from then
    /// on this node can never isolate instances.
    shared_on_shm: AtomicBool,
    /// The membership thread's wake-ups.
    beats: Beats,
}

/// Wake-ups of the membership thread: stop, or heartbeat now (asked by a hello that needs
/// newer ownership), and how far the heartbeats have come.
#[derive(Default)]
struct Beats {
    state: Mutex<BeatState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct BeatState {
    stopped: bool,
    /// Heartbeats asked for so far.
    wanted: u64,
    /// The `wanted` count the last finished heartbeat started at.
    done: u64,
    /// Callers of [`PoolRegion::beat_now`] waiting now.
    waiting: usize,
}

/// Most callers of [`PoolRegion::beat_now`] that wait at once. Each holds one of the
/// listener's handshake threads (runs requests), so while heartbeats are slow (a server
/// that does not answer) waiters never take more than these from the hellos; more callers
/// ask for the heartbeat and return at once.
pub(super) const MAX_BEAT_WAITERS: usize = 8;

/// Why a pause of the membership thread ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wake {
    /// The node stops.
    Stopped,
    /// Its time is up, or a heartbeat was asked for.
    Beat,
}

/// A queue pair opened for a client: where it reaches the region.
pub(super) struct Opened {
    pub qp: AnyQp,
    /// Address of byte 0 of the region on the wire.
    pub addr: u64,
    /// The whole region's rkey (0 when the queue pair reaches only its instance's runs).
    pub rkey: u32,
    /// The queue pair reaches only its instance's runs (`runs` gives their keys).
    pub isolated: bool,
}

/// A connected queue pair, its id and what the ticket it was opened with admitted.
struct Peer {
    id: u64,
    qp: AnyQp,
    admit: Option<Admit>,
}

/// What memory a pool region is: its bytes, its pages, and whether they are backed at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionSpec {
    /// Bytes of the region (`kvcm pool --size`, `kvcm.pool.size`).
    pub size: u64,
    /// Whether it goes on huge pages (`--huge-pages`).
    pub huge_pages: HugePages,
    /// Back every page at start (`--prefault`, `kvcm.pool.prefault`) instead of at its first
    /// write: the node takes the whole size from the start, and no transfer pays for
    /// allocating and zeroing the pages it lands on.
    pub prefault: bool,
}

/// Whether a pool region goes on 2 MiB hugetlb pages (`kvcm pool --huge-pages`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HugePages {
    /// When the size is a multiple of 2 MiB and the kernel has enough free (the default).
    #[default]
    Auto,
    /// Always: a node that cannot have them does not start.
    Required,
    /// Never.
    Off,
}

impl std::str::FromStr for HugePages {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "auto" => Ok(HugePages::Auto),
            "on" => Ok(HugePages::Required),
            "off" => Ok(HugePages::Off),
            other => Err(format!("{other:?} is not auto, on or off")),
        }
    }
}

/// `len` bytes on 2 MiB hugetlb pages, or why not.
fn huge_pages(len: usize) -> Result<HostMemory, String> {
    if len % (2 << 20) != 0 {
        return Err("the size is not a multiple of 2 MiB".into());
    }
    HostMemory::allocate_huge(len).map_err(|error| {
        format!(
            "the kernel gave no {} free 2 MiB huge pages (vm.nr_hugepages): {error}",
            len >> 21
        )
    })
}

/// Registrations of a soft domain left for other uses than instances' runs (the whole
/// region's, and room to spare).
const RESERVED_REGISTRATIONS: usize = 64;

/// Whether a region of `bytes` can isolate instances: the soft wire's registrations
/// suffice for one per 2 MiB slab (each run is one slab or more), beside the node's own —
/// [`MAX_ISOLATING_BYTES`] at most.
pub fn can_isolate(bytes: u64) -> bool {
    bytes <= MAX_ISOLATING_BYTES
}

/// The largest region that can isolate instances (about 32 GiB).
pub const MAX_ISOLATING_BYTES: u64 =
    ((kvcm_transport::soft::MAX_REGISTRATIONS - RESERVED_REGISTRATIONS) as u64) << 21;

/// Most queue pairs kept.
const MAX_PEERS: usize = 1024;
/// Most queue pairs of one share (an instance's tenant, or a credential's grant) kept: a
/// share at its limit makes room among its own queue pairs, so one tenant opening queue
/// pairs in a loop never drops another's.
const MAX_PEERS_PER_SHARE: usize = 256;

/// Whose share a queue pair counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Share {
    /// Its ticket names an instance: that instance's tenant.
    Tenant(u32),
    /// Its ticket names none: the credential's grant.
    Grant(u64),
    /// No ticket (the server issues none): one share, limited by [`MAX_PEERS`] only.
    Open,
}

impl Share {
    fn of(admit: Option<Admit>) -> Share {
        match admit {
            Some(Admit {
                tenant: Some(tenant),
                ..
            }) => Share::Tenant(tenant),
            Some(Admit { grant, .. }) => Share::Grant(grant),
            None => Share::Open,
        }
    }

    fn limit(self) -> usize {
        match self {
            Share::Open => MAX_PEERS,
            _ => MAX_PEERS_PER_SHARE,
        }
    }
}

/// Makes room among `peers` for one more queue pair of `share`: drops broken ones, then the
/// oldest of `share` when it is at its limit, else (all places taken) the oldest of the
/// largest share.
fn make_room(peers: &mut Vec<Peer>, share: Share) {
    let of = |peer: &Peer| Share::of(peer.admit);
    let count = |peers: &[Peer], share| peers.iter().filter(|&p| of(p) == share).count();
    if peers.len() >= MAX_PEERS || count(peers, share) >= share.limit() {
        peers.retain(|peer| peer.qp.state() != QpState::Error);
    }
    let evicted = if count(peers, share) >= share.limit() {
        Some(share)
    } else if peers.len() >= MAX_PEERS {
        let mut sizes: HashMap<Share, usize> = HashMap::new();
        for peer in peers.iter() {
            *sizes.entry(of(peer)).or_default() += 1;
        }
        sizes
            .into_iter()
            .max_by_key(|&(_, size)| size)
            .map(|(s, _)| s)
    } else {
        None
    };
    if let Some(at) = evicted.and_then(|evicted| peers.iter().position(|p| of(p) == evicted)) {
        peers.remove(at);
    }
}

impl PoolRegion {
    /// Allocates the memory of `spec` (backed at once when it says so) and registers it on
    /// both soft wires (soft NIC bound to `bind`) and, when given, on RDMA device `verbs`.
    pub fn open(
        spec: RegionSpec,
        bind: IpAddr,
        verbs: Option<&VerbsDevice>,
    ) -> Result<PoolRegion, PoolError> {
        let RegionSpec {
            size,
            huge_pages: huge,
            prefault,
        } = spec;
        let len = usize::try_from(size)
            .ok()
            .filter(|&len| len > 0)
            .ok_or_else(|| PoolError::Config(format!("--size {size} is not a usable size")))?;
        let domains = crate::lookup::open_wires(bind, verbs, "--verbs-device")?;
        let memory = match huge {
            HugePages::Off => domains[0].1.alloc(len)?,
            HugePages::Required => huge_pages(len)
                .map_err(|why| PoolError::Config(format!("--huge-pages on: {why}")))?,
            HugePages::Auto => match huge_pages(len) {
                Ok(memory) => memory,
                Err(why) => {
                    tracing::info!("pool region on regular pages: {why}");
                    domains[0].1.alloc(len)?
                }
            },
        };
        if prefault {
            let started = Instant::now();
            memory.populate()?;
            tracing::info!(bytes = len, elapsed = ?started.elapsed(), "pool region backed");
        }
        let mut wires = Vec::with_capacity(domains.len());
        for (wire, domain) in domains {
            let region = domain.register(&memory, 0, len, region_access())?;
            let cq = domain.create_cq()?;
            wires.push(WireRegion {
                wire,
                domain,
                cq,
                region,
            });
        }
        Ok(PoolRegion {
            memory,
            wires,
            range_id: AtomicU64::new(0),
            ticket_key: Mutex::new(None),
            peers: Mutex::new(Vec::new()),
            next_peer: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            revoked: Mutex::new(Vec::new()),
            isolation: Mutex::new(None),
            shared_on_shm: AtomicBool::new(false),
            beats: Beats::default(),
        })
    }

    /// Bytes of the region.
    pub fn len(&self) -> u64 {
        self.memory.len() as u64
    }

    /// Whether the region lies on hugetlb pages.
    pub fn is_huge(&self) -> bool {
        self.memory.is_huge()
    }

    /// Whether the region is empty (never: `open` refuses 0).
    pub fn is_empty(&self) -> bool {
        self.memory.is_empty()
    }

    /// The incarnation the server gave (0 before the first join).
    pub fn range_id(&self) -> u64 {
        self.range_id.load(Ordering::Acquire)
    }

    /// Whether this node can isolate instances: its region is small enough
    /// ([`Self::can_isolate`]) and it never shared its memory on the shared-memory wire.
    pub(super) fn may_isolate(&self) -> bool {
        self.can_isolate() && !self.shared_on_shm.load(Ordering::Acquire)
    }

    /// Records a new incarnation, its ticket key and whether it isolates instances (the
    /// key and the isolation first: a hello that sees the new incarnation checks its
    /// ticket with the new key; an isolating incarnation starts with no instance reaching
    /// anything until its first ownership answer). Refused when told to isolate after its
    /// memory was shared on the shared-memory wire: the node then admits no one
    /// ([`Self::forget_incarnation`]) until it joins again (saying it cannot isolate).
    pub(super) fn set_incarnation(
        &self,
        range_id: u64,
        ticket_key: Option<NodeKey>,
        isolated: bool,
    ) -> Result<(), PoolError> {
        let mut isolation = self.isolation();
        if isolated && self.shared_on_shm.load(Ordering::Acquire) {
            drop(isolation);
            self.forget_incarnation();
            return Err(PoolError::Refused(
                "told to isolate instances after its memory was shared on the shared-memory \
                 wire, whose mappings cannot be taken back: restart this node (it starts with \
                 fresh memory)"
                    .into(),
            ));
        }
        let demands_tickets = ticket_key.is_some();
        *self
            .ticket_key
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = ticket_key;
        let before = std::mem::replace(&mut *isolation, isolated.then(Isolation::default));
        drop(isolation);
        // Dropped after the lock (each registration's drop waits for the NIC's fence).
        drop(before);
        self.range_id.store(range_id, Ordering::Release);
        // Queue pairs opened under another policy keep no access it would not give: an
        // isolating incarnation keeps none (each instance's domain is new), one that demands
        // tickets none opened without. Under the peers' lock, as `keep` checks the epoch.
        let mut peers = self.peers();
        self.epoch.fetch_add(1, Ordering::AcqRel);
        peers.retain(|peer| !isolated && (!demands_tickets || peer.admit.is_some()));
        Ok(())
    }

    /// Forgets the incarnation (the server no longer knows it): no hello is admitted and
    /// every queue pair is torn down until the node joins again, so nothing is served under
    /// a policy its server no longer vouches for (as a rejoin its server refuses).
    pub(super) fn forget_incarnation(&self) {
        // Range id 0 admits no hello; a hello admitted before is refused by `keep` (the
        // epoch moved), so the queue pairs kept until now are all there is to drop.
        let unisolated = self.set_incarnation(0, None, false);
        debug_assert!(unisolated.is_ok(), "isolating nothing is never refused");
        self.peers().clear();
    }

    /// The incarnations recorded so far: read before a hello is admitted, and handed to
    /// [`Self::keep`].
    pub(super) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    fn isolation(&self) -> std::sync::MutexGuard<'_, Option<Isolation>> {
        self.isolation
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The node's domains on the wires that can confine a queue pair to runs.
    fn isolating_wires(&self) -> Vec<(usize, &AnyDomain)> {
        let wires = self.wires.iter().filter(|w| w.wire != WIRE_SOFT_SHM);
        wires.map(|w| (w.wire, &w.domain)).collect()
    }

    /// The ownership version this incarnation applied (`None` when it does not isolate,
    /// or applied nothing yet).
    pub(super) fn applied(&self) -> Option<AppliedVersion> {
        self.isolation().as_ref().and_then(Isolation::applied)
    }

    /// Applies an ownership answer (nothing when this incarnation does not isolate), in
    /// the phases of [`Isolation`]: the registrations the answer takes out are dropped
    /// after the lock hellos take is let go (each drop waits for the NIC's fence) and
    /// before the grants are registered; the grants are planned under that lock, registered
    /// outside it and installed under it; the membership thread (the only caller, and the
    /// one that changes incarnations) reports the version applied after this returns.
    pub(super) fn apply_ownership(&self, answer: &OwnershipAnswer) -> Result<(), PoolError> {
        let wires = self.isolating_wires();
        let connected: HashSet<u32> = self
            .peers()
            .iter()
            .filter(|peer| peer.qp.state() != QpState::Error)
            .filter_map(|peer| peer.admit?.tenant)
            .collect();
        let retired = match self.isolation().as_mut() {
            Some(isolation) => {
                isolation.retire(answer);
                isolation.take_retired()
            }
            None => return Ok(()),
        };
        drop(retired);
        let planned = match self.isolation().as_mut() {
            Some(isolation) => isolation.plan(answer, &wires, self.memory.len()),
            None => return Ok(()),
        };
        // Registering (a verbs registration pins its run) with the lock let go: no other
        // thread changes incarnations or applies answers meanwhile, and hellos only add
        // domains, so what was planned is still what the isolation needs.
        let made = planned.make(&self.memory);
        let (applied, retired) = match self.isolation().as_mut() {
            Some(isolation) => (
                isolation.install(made, &connected),
                isolation.take_retired(),
            ),
            None => return Ok(()),
        };
        drop(retired);
        applied
    }

    /// The runs of `tenant` holding each of `offsets`, with their rkeys on `wire` (`None`
    /// for an offset in no run of the tenant).
    pub(super) fn runs(&self, tenant: u32, wire: usize, offsets: &[u64]) -> Vec<Option<RunKey>> {
        let isolation = self.isolation();
        offsets
            .iter()
            .map(|&at| isolation.as_ref()?.run_at(tenant, wire, at))
            .collect()
    }

    /// Whether this region can isolate instances ([`can_isolate`]).
    pub fn can_isolate(&self) -> bool {
        can_isolate(self.memory.len() as u64)
    }

    /// Whether this incarnation isolates instances on wire `wire` (one it serves, not the
    /// shared-memory one).
    pub(super) fn isolates_on(&self, wire: usize) -> bool {
        self.isolation().is_some() && self.isolating_wires().iter().any(|(w, _)| *w == wire)
    }

    fn beat_state(&self) -> std::sync::MutexGuard<'_, BeatState> {
        self.beats
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits `duration`, or less when stopped or (with `or_asked`) when a heartbeat is
    /// asked for.
    pub(super) fn pause(&self, duration: Duration, or_asked: bool) -> Wake {
        let guard = self.beat_state();
        let waiting = |s: &mut BeatState| !(s.stopped || or_asked && s.wanted > s.done);
        let waited = self
            .beats
            .changed
            .wait_timeout_while(guard, duration, waiting);
        let (state, _) = waited.unwrap_or_else(PoisonError::into_inner);
        if state.stopped {
            Wake::Stopped
        } else {
            Wake::Beat
        }
    }

    /// Stops the membership thread's pauses for good.
    pub(super) fn stop(&self) {
        self.beat_state().stopped = true;
        self.beats.changed.notify_all();
    }

    /// A heartbeat starts: the count of those asked for so far, for [`Self::beat_finished`].
    pub(super) fn beat_started(&self) -> u64 {
        self.beat_state().wanted
    }

    /// The heartbeat that started at `started` is answered (and its ownership applied).
    pub(super) fn beat_finished(&self, started: u64) {
        let mut state = self.beat_state();
        state.done = state.done.max(started);
        drop(state);
        self.beats.changed.notify_all();
    }

    /// Asks the membership thread for a heartbeat now and waits, at most `wait`, until one
    /// that started after the ask is answered; whether one was. With
    /// [`MAX_BEAT_WAITERS`] callers already waiting it only asks (false at once).
    pub(super) fn beat_now(&self, wait: Duration) -> bool {
        let mut state = self.beat_state();
        state.wanted += 1;
        let target = state.wanted;
        self.beats.changed.notify_all();
        if state.waiting >= MAX_BEAT_WAITERS {
            return false;
        }
        state.waiting += 1;
        let pending = |s: &mut BeatState| !s.stopped && s.done < target;
        let waited = self.beats.changed.wait_timeout_while(state, wait, pending);
        let (mut state, _) = waited.unwrap_or_else(PoisonError::into_inner);
        state.waiting -= 1;
        state.done >= target
    }

    /// Whether a hello with `ticket` may open a queue pair: always while the server demands
    /// no tickets; otherwise only with a ticket of this incarnation that has not expired.
    /// What the ticket admits (`None` without tickets).
    pub(super) fn admit(&self, ticket: Option<&Ticket>) -> Result<Option<Admit>, PoolError> {
        let key = *self
            .ticket_key
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let refused = |why: &str| PoolError::Refused(why.to_string());
        if self.range_id() == 0 {
            // Before the first join answer the node knows neither whether its server
            // demands tickets nor whom it isolates: it admits no one.
            return Err(refused("this pool node has not joined its server yet"));
        }
        match (key, ticket) {
            (None, _) => Ok(None),
            (Some(_), None) => Err(refused("this pool node's server demands a ticket")),
            (Some(key), Some(ticket)) => {
                let admit = ticket::verify(&key, self.range_id(), ticket, ticket::now_ms())
                    .map_err(refused)?;
                let revoked = self.revoked.lock().unwrap_or_else(PoisonError::into_inner);
                if revoked.iter().any(|(g, _)| *g == admit.grant) {
                    return Err(refused("the credential of this ticket was revoked"));
                }
                Ok(Some(admit))
            }
        }
    }

    fn peers(&self) -> std::sync::MutexGuard<'_, Vec<Peer>> {
        self.peers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps a connected queue pair admitted at `epoch` (see [`Self::epoch`]), making room
    /// by dropping broken ones, then the oldest of its own share, or of the largest share
    /// when every place is taken ([`make_room`]); returns its id. Refused (and the queue pair
    /// dropped) when an incarnation was recorded since: its policy may not have admitted it.
    pub(super) fn keep(
        &self,
        qp: AnyQp,
        admit: Option<Admit>,
        epoch: u64,
    ) -> Result<u64, PoolError> {
        let id = self.next_peer.fetch_add(1, Ordering::Relaxed);
        let mut peers = self.peers();
        if self.epoch() != epoch {
            return Err(PoolError::Refused(
                "the node joined its server again during this hello: say hello again".into(),
            ));
        }
        make_room(&mut peers, Share::of(admit));
        peers.push(Peer { id, qp, admit });
        Ok(id)
    }

    /// Whether queue pair `id` is still kept.
    pub(super) fn holds(&self, id: u64) -> bool {
        self.peers().iter().any(|peer| peer.id == id)
    }

    /// Tears queue pair `id` down (its client's operations fail from then on).
    pub(super) fn drop_peer(&self, id: u64) {
        self.peers().retain(|peer| peer.id != id);
    }

    /// The distinct grants of the queue pairs kept.
    pub(super) fn live_grants(&self) -> Vec<u64> {
        let peers = self.peers();
        let grants = peers.iter().filter_map(|peer| Some(peer.admit?.grant));
        let mut grants: Vec<u64> = grants.collect();
        grants.sort_unstable();
        grants.dedup();
        grants
    }

    /// Tears down the queue pairs opened under `revoked` grants and refuses their tickets
    /// from now on; returns how many queue pairs were torn down.
    pub(super) fn revoke(&self, revoked: &[u64]) -> usize {
        {
            let mut known = self.revoked.lock().unwrap_or_else(PoisonError::into_inner);
            known.retain(|(_, at)| at.elapsed() < ticket::TICKET_TTL);
            known.extend(revoked.iter().map(|grant| (*grant, Instant::now())));
        }
        let mut peers = self.peers();
        let before = peers.len();
        peers.retain(|peer| !peer.admit.is_some_and(|a| revoked.contains(&a.grant)));
        before - peers.len()
    }

    /// A new queue pair on wire `wire` for a client admitted as `admit`: on an isolating
    /// incarnation in the domain of the instance its ticket names (refused without one, and
    /// on the shared-memory wire), otherwise with the whole region's rkey.
    pub(super) fn create_qp(&self, wire: usize, admit: Option<Admit>) -> Result<Opened, PoolError> {
        let entry = self
            .wires
            .iter()
            .find(|w| w.wire == wire)
            .ok_or_else(|| PoolError::Config(format!("wire {wire} is not served")))?;
        let refused = |why: &str| PoolError::Refused(why.to_string());
        let isolating_wires = self.isolating_wires();
        let tenant_domain = match self.isolation().as_mut() {
            // Under the isolation lock, so that no incarnation starts isolating between
            // this check and the mark (`set_incarnation` reads it under the same lock).
            None if wire == WIRE_SOFT_SHM => {
                self.shared_on_shm.store(true, Ordering::Release);
                None
            }
            None => None,
            Some(_) if wire == WIRE_SOFT_SHM => {
                return Err(refused(
                    "this node isolates instances, which the shared-memory wire cannot (a \
                     mapping covers the whole region): use the TCP or verbs wire",
                ))
            }
            Some(isolation) => {
                let tenant = admit.and_then(|a| a.tenant).ok_or_else(|| {
                    refused("this node isolates instances: the ticket must name one")
                })?;
                Some(isolation.domain(tenant, wire, &isolating_wires)?)
            }
        };
        let domain = tenant_domain.as_ref().unwrap_or(&entry.domain);
        let qp = domain.create_qp(&entry.cq, &entry.cq, QpConfig::default())?;
        let isolated = tenant_domain.is_some();
        Ok(Opened {
            qp,
            addr: entry.region.addr(),
            rkey: if isolated { 0 } else { entry.region.rkey() },
            isolated,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lookup::WIRE_SOFT_TCP;

    /// A 4 MiB region on regular pages, joined to no server.
    fn small_region() -> PoolRegion {
        let spec = RegionSpec {
            size: 4 << 20,
            huge_pages: HugePages::Off,
            prefault: false,
        };
        PoolRegion::open(spec, [127, 0, 0, 1].into(), None).unwrap()
    }

    #[test]
    fn while_heartbeats_are_slow_only_a_few_callers_wait_for_one() {
        // No membership thread: no heartbeat is answered until the test says so.
        let region = std::sync::Arc::new(small_region());
        let long = Duration::from_secs(60);
        let waiters: Vec<_> = (0..MAX_BEAT_WAITERS)
            .map(|_| {
                let region = std::sync::Arc::clone(&region);
                std::thread::spawn(move || region.beat_now(long))
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(20);
        while region.beat_state().waiting < MAX_BEAT_WAITERS {
            assert!(Instant::now() < deadline, "the waiters never waited");
            std::thread::yield_now();
        }
        // One more caller asks for the heartbeat but does not wait for it.
        let asked = Instant::now();
        assert!(!region.beat_now(long));
        assert!(asked.elapsed() < long / 2, "it waited");
        assert_eq!(region.beat_state().wanted, MAX_BEAT_WAITERS as u64 + 1);
        // The heartbeat that answers every ask releases the waiters, each answered.
        region.beat_finished(region.beat_started());
        for waiter in waiters {
            assert!(waiter.join().unwrap());
        }
        assert_eq!(region.beat_state().waiting, 0);
    }

    #[test]
    fn a_share_opening_queue_pairs_in_a_loop_drops_only_its_own() {
        let region = small_region();
        region.set_incarnation(7, None, false).unwrap();
        let keep = |grant: u64| {
            let admit = Some(Admit {
                grant,
                tenant: None,
            });
            let opened = region.create_qp(WIRE_SOFT_TCP, admit).unwrap();
            region.keep(opened.qp, admit, region.epoch()).unwrap()
        };
        let victim = keep(1);
        let flood: Vec<u64> = (0..MAX_PEERS_PER_SHARE + 44).map(|_| keep(2)).collect();
        assert!(region.holds(victim), "another share's queue pair stays");
        assert!(
            !flood[..44].iter().any(|&id| region.holds(id)),
            "its oldest go"
        );
        assert!(flood[44..].iter().all(|&id| region.holds(id)));
        // Every place taken: the largest share gives one up, never the small one.
        for grant in 3.. {
            if region.peers().len() == MAX_PEERS {
                break;
            }
            keep(grant);
        }
        let oldest_of_largest = flood[44];
        keep(1);
        assert_eq!(region.peers().len(), MAX_PEERS);
        assert!(region.holds(victim));
        assert!(!region.holds(oldest_of_largest));
    }

    #[test]
    fn a_node_that_shared_its_memory_on_shm_never_isolates() {
        let region = small_region();
        region.set_incarnation(7, None, false).unwrap();
        assert!(region.may_isolate());
        // A TCP queue pair shares nothing a later isolation cannot take back.
        region.create_qp(WIRE_SOFT_TCP, None).unwrap();
        assert!(region.may_isolate());
        let shm = region
            .create_qp(crate::lookup::WIRE_SOFT_SHM, None)
            .unwrap();
        let id = region.keep(shm.qp, None, region.epoch()).unwrap();
        assert!(
            !region.may_isolate(),
            "its next join says it cannot isolate"
        );
        let refused = region
            .set_incarnation(8, None, true)
            .unwrap_err()
            .to_string();
        assert!(refused.contains("restart this node"), "{refused}");
        assert!(!region.holds(id), "it serves no one");
        assert_eq!(region.range_id(), 0);
        assert!(matches!(region.admit(None), Err(PoolError::Refused(_))));
    }

    #[test]
    fn a_queue_pair_admitted_before_the_node_joined_again_is_not_kept() {
        let region = small_region();
        region.set_incarnation(7, None, false).unwrap();
        // A hello is admitted under a policy that isolates nothing...
        let epoch = region.epoch();
        let admit = region.admit(None).unwrap();
        let opened = region.create_qp(WIRE_SOFT_TCP, admit).unwrap();
        assert!(!opened.isolated);
        // ...the node joins again and now isolates instances, before the hello keeps its
        // queue pair (which reaches the whole region): it is refused.
        region.set_incarnation(7, None, true).unwrap();
        let kept = region.keep(opened.qp, None, epoch);
        assert!(matches!(kept, Err(PoolError::Refused(_))), "{kept:?}");
        assert!(region.live_grants().is_empty());
        assert_eq!(region.peers().len(), 0);
        // A hello admitted under the current policy is kept.
        let epoch = region.epoch();
        let admit = Some(Admit {
            grant: 3,
            tenant: Some(1),
        });
        let opened = region.create_qp(WIRE_SOFT_TCP, admit).unwrap();
        assert!(opened.isolated);
        let id = region.keep(opened.qp, admit, epoch).unwrap();
        assert!(region.holds(id));
        // The server forgets the incarnation: its queue pairs go, and no hello is admitted
        // until the node joins again.
        region.forget_incarnation();
        assert!(!region.holds(id));
        assert!(matches!(region.admit(None), Err(PoolError::Refused(_))));
        region.set_incarnation(8, None, false).unwrap();
        assert!(region.admit(None).is_ok());
    }
}
