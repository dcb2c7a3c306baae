//! The `soft` provider: software RDMA that runs on any Linux host.
//!
//! Each [`SoftDomain`] owns a userspace NIC thread (see `nic`) that serves remote READ /
//! WRITE / atomics against the domain's registrations with no application thread on the
//! path, checking rkeys, bounds and access rights as hardware does. Two wires:
//! - [`Wire::Tcp`]: between hosts; framed requests, many per write, TCP_NODELAY.
//! - [`Wire::Shm`]: same host; regions are memfds mapped by both processes, so one-sided
//!   operations are memory accesses; SENDs travel through shared rings. Peers get every
//!   memfd from the owning domain's descriptor broker (SCM_RIGHTS over an abstract unix
//!   socket, `shm/broker.rs`), which hands a queue pair's token holder only what that queue
//!   pair may touch: the key table and liveness page read-only, its own inbound ring, and
//!   the memories registered in its protection domain (read-write only where a
//!   registration grants a remote write or atomic). Nothing is opened through
//!   `/proc/<pid>/fd`, so processes may be non-dumpable and of different users; the key
//!   table still shows every peer the metadata of every registration (not the contents).
//!
//! Source layout: `domain` (domain, region), `qp` (queue-pair handle), `queue_pair`
//! (state shared with the NIC, completion rules), `cq`, `registry` + `keytable` (keys
//! and checks), `scatter` (local lists), `responder`
//! (request execution), `frame` + `endpoint` (encodings), `nic/` (the thread and TCP
//! links), `shm/` (rings, the descriptor broker and inline one-sided execution), `probe`
//! (hidden test support: a peer's view of a broker).

mod cq;
mod domain;
mod endpoint;
mod frame;
mod keytable;
mod nic;
#[doc(hidden)]
pub mod probe;
mod qp;
mod queue_pair;
mod registry;
mod responder;
mod scatter;
mod shm;

pub use cq::SoftCq;
pub use domain::{SoftDomain, SoftRegion};
pub use nic::IdlePolicy;
pub use qp::SoftQp;

/// Most live registrations one soft domain holds, all its protection domains together.
pub const MAX_REGISTRATIONS: usize = keytable::SLOTS;

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

/// Which wire a soft domain's queue pairs use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    /// Framed TCP between NIC threads (works across hosts).
    Tcp,
    /// memfd shared memory and rings (same host only).
    Shm,
}

/// Configuration of a soft domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SoftConfig {
    /// Wire of the domain's queue pairs. Default TCP.
    pub wire: Wire,
    /// Address the NIC listens on for TCP links (port chosen by the OS); it is written
    /// into endpoints, so it must be an address peers can reach (not 0.0.0.0).
    /// Default 127.0.0.1.
    pub bind: IpAddr,
    /// What the NIC thread does when idle.
    pub idle: IdlePolicy,
    /// How long a queue pair waits for its peer before failing the oldest outstanding
    /// request with `RetryExceeded` (a transport / RNR retry timeout): on TCP, time without
    /// any answer while requests are outstanding; on shared memory, time a SEND waits for
    /// ring room. Default 10 s.
    pub response_timeout: Duration,
    /// Bytes of each queue pair's inbound ring on the shared-memory wire (rounded up to a
    /// power of two; the largest SEND is about half of it). 4 KiB to 1 GiB; default 4 MiB.
    pub ring_capacity: usize,
}

impl Default for SoftConfig {
    fn default() -> Self {
        SoftConfig {
            wire: Wire::Tcp,
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            idle: IdlePolicy::default(),
            response_timeout: Duration::from_secs(10),
            ring_capacity: 4 << 20,
        }
    }
}

impl SoftConfig {
    /// The default configuration on `wire`.
    pub fn with_wire(wire: Wire) -> Self {
        SoftConfig {
            wire,
            ..SoftConfig::default()
        }
    }

    /// Sets the TCP listening address.
    pub fn with_bind(self, bind: IpAddr) -> Self {
        SoftConfig { bind, ..self }
    }

    /// Sets the idle policy.
    pub fn with_idle(self, idle: IdlePolicy) -> Self {
        SoftConfig { idle, ..self }
    }

    /// Sets the response timeout.
    pub fn with_response_timeout(self, response_timeout: Duration) -> Self {
        SoftConfig {
            response_timeout,
            ..self
        }
    }
}
