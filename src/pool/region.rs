//! A pool node's region: one memory (a memfd mapping, backed lazily page by page as
//! blocks are written) registered for remote reads and writes on a soft-TCP and a
//! soft-shm domain, the node's current incarnation (`range_id`) and, when its server
//! demands tickets, the incarnation's ticket key (`super::ticket`).

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use kvcm_transport::soft::{SoftConfig, SoftCq, SoftDomain, SoftQp, SoftRegion, Wire};
use kvcm_transport::{Access, Domain, HostMemory, Memory, QpConfig, Region};

use super::ticket::{self, NodeKey, Ticket};
use super::PoolError;
use crate::lookup::{WIRE_SOFT_SHM, WIRE_SOFT_TCP};

/// One wire's domain, completion queue and registration of the memory.
struct WireRegion {
    wire: usize,
    domain: SoftDomain,
    cq: SoftCq,
    region: SoftRegion,
}

/// The memory of a pool node and its registrations.
pub struct PoolRegion {
    memory: HostMemory,
    wires: Vec<WireRegion>,
    range_id: AtomicU64,
    /// The ticket key of the current incarnation (`None`: the server demands no tickets).
    ticket_key: Mutex<Option<NodeKey>>,
}

impl PoolRegion {
    /// Allocates `size` bytes and registers them on both wires (soft NIC bound to `bind`).
    pub fn open(size: u64, bind: IpAddr) -> Result<PoolRegion, PoolError> {
        let len = usize::try_from(size)
            .ok()
            .filter(|&len| len > 0)
            .ok_or_else(|| PoolError::Config(format!("--size {size} is not a usable size")))?;
        let open = |wire| {
            SoftDomain::open(SoftConfig {
                wire,
                bind,
                ..SoftConfig::default()
            })
        };
        let domains = [
            (WIRE_SOFT_TCP, open(Wire::Tcp)?),
            (WIRE_SOFT_SHM, open(Wire::Shm)?),
        ];
        let memory = domains[0].1.alloc(len)?;
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
        })
    }

    /// Bytes of the region.
    pub fn len(&self) -> u64 {
        self.memory.len() as u64
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
    pub(super) fn admit(&self, ticket: Option<&Ticket>) -> Result<(), PoolError> {
        let key = *self
            .ticket_key
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let refused = |why: &str| PoolError::Refused(why.to_string());
        match (key, ticket) {
            (None, _) => Ok(()),
            (Some(_), None) => Err(refused("this pool node's server demands a ticket")),
            (Some(key), Some(ticket)) => {
                ticket::verify(&key, self.range_id(), ticket, ticket::now_ms()).map_err(refused)
            }
        }
    }

    /// A new queue pair on wire `wire` and the region's address and rkey there.
    pub(super) fn create_qp(&self, wire: usize) -> Result<(SoftQp, u64, u32), PoolError> {
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
