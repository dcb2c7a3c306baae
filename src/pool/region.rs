//! A pool node's region: one memory (a memfd mapping, backed lazily page by page as
//! blocks are written, or wholly at start with `--prefault`; on 2 MiB hugetlb pages when the size is a multiple of 2 MiB and the
//! kernel has that many free, on regular pages otherwise, and the node says which) registered for remote reads and writes on a soft-TCP and a
//! soft-shm domain (and a verbs one when the node is given an RDMA device), the node's current incarnation (`range_id`) and, when its server
//! demands tickets, the incarnation's ticket key (`super::ticket`), and the connected queue
//! pairs, each with an id (never reused: the hang-up watcher names it) and the grant it was
//! opened under; a revoked grant's are torn down, and so is one whose client hung up
//! (`super::listener`).

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use kvcm_transport::any::{AnyCq, AnyDomain, AnyQp, AnyRegion, VerbsDevice};
use kvcm_transport::{Access, Domain, HostMemory, Memory, QpConfig, QpState, QueuePair, Region};

use super::ticket::{self, NodeKey, Ticket};
use super::PoolError;

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
    /// Grants the server answered revoked, and when: their tickets open nothing more (kept
    /// for a ticket's life, after which every ticket of theirs has expired).
    revoked: Mutex<Vec<(u64, Instant)>>,
}

/// A connected queue pair, its id and the grant of the ticket it was opened with.
struct Peer {
    id: u64,
    qp: AnyQp,
    grant: Option<u64>,
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

/// Most queue pairs kept.
const MAX_PEERS: usize = 1024;

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
        let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
        let mut wires = Vec::with_capacity(domains.len());
        for (wire, domain) in domains {
            let region = domain.register(&memory, 0, len, access)?;
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
            revoked: Mutex::new(Vec::new()),
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

    /// Records a new incarnation and its ticket key (the key first: a hello that sees the
    /// new incarnation checks its ticket with the new key).
    pub(super) fn set_incarnation(&self, range_id: u64, ticket_key: Option<NodeKey>) {
        *self
            .ticket_key
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = ticket_key;
        self.range_id.store(range_id, Ordering::Release);
    }

    /// Whether a hello with `ticket` may open a queue pair: always while the server demands
    /// no tickets; otherwise only with a ticket of this incarnation that has not expired.
    /// The grant the ticket carries (`None` without tickets).
    pub(super) fn admit(&self, ticket: Option<&Ticket>) -> Result<Option<u64>, PoolError> {
        let key = *self
            .ticket_key
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let refused = |why: &str| PoolError::Refused(why.to_string());
        match (key, ticket) {
            (None, _) => Ok(None),
            (Some(_), None) => Err(refused("this pool node's server demands a ticket")),
            (Some(key), Some(ticket)) => {
                let grant = ticket::verify(&key, self.range_id(), ticket, ticket::now_ms())
                    .map_err(refused)?;
                let revoked = self.revoked.lock().unwrap_or_else(PoisonError::into_inner);
                if revoked.iter().any(|(g, _)| *g == grant) {
                    return Err(refused("the credential of this ticket was revoked"));
                }
                Ok(Some(grant))
            }
        }
    }

    fn peers(&self) -> std::sync::MutexGuard<'_, Vec<Peer>> {
        self.peers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps a connected queue pair, making room by dropping broken ones, then the oldest;
    /// returns its id.
    pub(super) fn keep(&self, qp: AnyQp, grant: Option<u64>) -> u64 {
        let id = self.next_peer.fetch_add(1, Ordering::Relaxed);
        let mut peers = self.peers();
        if peers.len() >= MAX_PEERS {
            peers.retain(|peer| peer.qp.state() != QpState::Error);
        }
        if peers.len() >= MAX_PEERS {
            peers.remove(0);
        }
        peers.push(Peer { id, qp, grant });
        id
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
        let mut grants: Vec<u64> = peers.iter().filter_map(|peer| peer.grant).collect();
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
        peers.retain(|peer| !peer.grant.is_some_and(|g| revoked.contains(&g)));
        before - peers.len()
    }

    /// A new queue pair on wire `wire` and the region's address and rkey there.
    pub(super) fn create_qp(&self, wire: usize) -> Result<(AnyQp, u64, u32), PoolError> {
        let entry = self
            .wires
            .iter()
            .find(|w| w.wire == wire)
            .ok_or_else(|| PoolError::Config(format!("wire {wire} is not served")))?;
        let qp = entry
            .domain
            .create_qp(&entry.cq, &entry.cq, QpConfig::default())?;
        Ok((qp, entry.region.addr(), entry.region.rkey()))
    }
}
