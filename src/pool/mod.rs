//! Memory-pool nodes (`kvcm pool`, or one inside `kvcm serve --pool-size`): a node serves
//! one region of memory registered with the transport (soft TCP and shared-memory wires, and
//! verbs when given an RDMA device)
//! that clients read and write with one-sided operations, joins a pool storage on a kvcm
//! server and heartbeats; the server places blocks in its region (kvcm-storage `pool`).
//!
//! - [`region`]: the memory and its registrations;
//! - `isolation`: on a node the server has isolate instances, each instance's protection
//!   domains and the registrations of the runs it owns;
//! - [`listener`]: the queue-pair listener clients connect to (`KVPL` + wire byte, the
//!   endpoint exchange, then the region's description for that wire);
//! - [`member`]: join and heartbeat over meta HTTP, or by direct calls for the embedded
//!   node ([`Channel`]), rejoining with a fresh incarnation when the server forgot this one;
//! - [`routes`]: the server's side of membership ([`Registrar`]) and the
//!   `POST /kvcm/v1/pool*` routes over it on meta HTTP.
//!
//! Invariant: a node's region only ever holds blocks of its current incarnation: when the
//! server declares an incarnation dead it forgets every block on it before the node can
//! join again.

pub mod grants;
mod isolation;
pub mod listener;
pub mod member;
pub mod region;
pub mod routes;
pub mod ticket;

use std::net::SocketAddr;

use kvcm_transport::any::VerbsDevice;
use std::time::Duration;

pub use isolation::RunKey;
pub use listener::{RegionInfo, HELLO as POOL_HELLO, KEEPS_CONNECTION};
pub use member::{Channel, Joining, Member, MemberConfig, MetaHttp};
pub use region::{HugePages, PoolRegion, RegionSpec};
pub use routes::{
    AppliedVersion, HeartbeatAnswer, HeartbeatRequest, JoinAnswer, JoinRequest, NodesAnswer,
    NodesRequest, OwnershipAnswer, Registrar, RunChange, HEARTBEAT_ROUTE, JOIN_ROUTE, NODES_ROUTE,
};

/// A byte count with an optional binary suffix: `4096`, `64K`, `512M`, `2G`, `1T`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (digits, shift) = match text.char_indices().last() {
        Some((at, 'K' | 'k')) => (&text[..at], 10),
        Some((at, 'M' | 'm')) => (&text[..at], 20),
        Some((at, 'G' | 'g')) => (&text[..at], 30),
        Some((at, 'T' | 't')) => (&text[..at], 40),
        _ => (text, 0),
    };
    let count: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a byte count (e.g. 4096, 64K, 512M, 2G)"))?;
    count
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{text:?} does not fit in 64 bits"))
}

/// Errors of a pool node.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// The transport failed.
    #[error("pool transport: {0}")]
    Transport(#[from] kvcm_transport::TransportError),
    /// The listener or a connecting client failed.
    #[error("pool listener: {0}")]
    Listener(std::io::Error),
    /// No server accepted the join.
    #[error("joining a kvcm server: {0}")]
    Join(String),
    /// A setting is unusable; the message names it.
    #[error("{0}")]
    Config(String),
    /// A connecting client was refused (no or a bad hello or ticket).
    #[error("pool queue pair refused: {0}")]
    Refused(String),
}

/// Settings of the pool (`kvcm.pool.*`), for servers and nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// `kvcm.pool.heartbeat_ms`: how often nodes heartbeat; a node is dead after 3 missed.
    pub heartbeat_ms: u64,
    /// `kvcm.pool.rejoin_ramp_ms`: how long a rejoining node takes to reach its full share
    /// of new blocks.
    pub rejoin_ramp_ms: u64,
    /// `kvcm.pool.resume_window_ms`: after a server restart, how long the blocks of a node
    /// that kept its memory wait for it to resume its incarnation before they are removed.
    pub resume_window_ms: u64,
    /// `kvcm.pool.size` (`kvcm serve --pool-size`): bytes of the pool node run inside the
    /// server (0 = none, the embedded default as without a pool).
    pub embedded_size: u64,
    /// `kvcm.pool.prefault`: back the embedded node's region at start
    /// ([`RegionSpec::prefault`]).
    pub embedded_prefault: bool,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            heartbeat_ms: 500,
            rejoin_ramp_ms: 30_000,
            resume_window_ms: 30_000,
            embedded_size: 0,
            embedded_prefault: false,
        }
    }
}

impl PoolConfig {
    /// The timing the server gives its pool storages.
    pub fn timing(&self) -> kvcm_storage::pool::PoolTiming {
        kvcm_storage::pool::PoolTiming {
            heartbeat: Duration::from_millis(self.heartbeat_ms),
            rejoin_ramp: Duration::from_millis(self.rejoin_ramp_ms),
            resume_window: Duration::from_millis(self.resume_window_ms),
        }
    }

    /// Checks the ranges; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        if !(10..=60_000).contains(&self.heartbeat_ms) {
            return Err("kvcm.pool.heartbeat_ms must be between 10 and 60000".into());
        }
        if self.rejoin_ramp_ms > 3_600_000 {
            return Err("kvcm.pool.rejoin_ramp_ms must be at most 3600000 (one hour)".into());
        }
        if self.resume_window_ms > 3_600_000 {
            return Err("kvcm.pool.resume_window_ms must be at most 3600000 (one hour)".into());
        }
        if self.embedded_size > kvcm_storage::pool::MAX_NODE_CAPACITY {
            return Err(format!(
                "kvcm.pool.size must be at most {} bytes",
                kvcm_storage::pool::MAX_NODE_CAPACITY
            ));
        }
        if self.embedded_prefault && self.embedded_size == 0 {
            return Err("kvcm.pool.prefault needs kvcm.pool.size (an embedded pool node)".into());
        }
        Ok(())
    }
}

impl std::fmt::Debug for PoolNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolNode")
            .field("listen_addr", &self.listen_addr)
            .field("range_id", &self.range_id())
            .finish_non_exhaustive()
    }
}

/// A running pool node: its region, listener and membership.
pub struct PoolNode {
    region: std::sync::Arc<PoolRegion>,
    listen_addr: SocketAddr,
    _member: Member,
}

impl PoolNode {
    /// Allocates and registers the memory of `spec` (also on RDMA device `verbs` when
    /// given), starts the listener on `listen` and joins `joining.storage` through its
    /// channel.
    pub fn start(
        spec: RegionSpec,
        listen: SocketAddr,
        node_id: Option<String>,
        joining: Joining,
        verbs: Option<&VerbsDevice>,
    ) -> Result<PoolNode, PoolError> {
        let region = std::sync::Arc::new(PoolRegion::open(spec, listen.ip(), verbs)?);
        let listen_addr = listener::listen(listen, region.clone())?;
        let member = Member::start(
            MemberConfig {
                node_id: node_id.unwrap_or_else(|| listen_addr.to_string()),
                endpoint: listen_addr.to_string(),
                capacity: spec.size,
                joining,
            },
            region.clone(),
        )?;
        Ok(PoolNode {
            region,
            listen_addr,
            _member: member,
        })
    }

    /// Where clients connect.
    pub fn listen_addr(&self) -> SocketAddr {
        self.listen_addr
    }

    /// The current incarnation (0 before the first join).
    pub fn range_id(&self) -> u64 {
        self.region.range_id()
    }

    /// Whether the region lies on 2 MiB hugetlb pages.
    pub fn huge_pages(&self) -> bool {
        self.region.is_huge()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_suffixes_and_refuse_garbage_and_overflow() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("512m"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        for bad in ["", "G", "1.5G", "-1", "12X", "99999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
