//! The lease lock every node campaigns on, and the rules all backends share.
//!
//! A lock holds at most one live [`HolderRecord`]: a node's published endpoint, the fencing
//! token it was granted and the wall-clock expiry of its lease. Invariants (every backend
//! applies them through [`Slot`], under its own mutual exclusion):
//! - a live record (expiry in the future) is never replaced: `try_acquire` only succeeds on
//!   a free or expired lock;
//! - each successful acquisition hands out a fencing token greater than every token handed
//!   out before by that lock (the last token survives release);
//! - `renew` and `release` name the token: a stale token (an older holder, or a lease that
//!   already expired) is refused, so a node can never extend or drop a successor's lease.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::file::FileLock;
use super::memory::MemoryLock;
use super::redis::RedisLock;

/// Where a node can be reached (published in the lock record; what leader discovery returns).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeEndpoint {
    /// The node id (`kvcm.leader_elector.node_id`).
    pub node_id: String,
    /// The host clients should use (`kvcm.service.advertised_host`).
    pub host: String,
    /// Meta gRPC port.
    pub rpc_port: u16,
    /// Meta HTTP port.
    pub http_port: u16,
    /// Admin gRPC port (equals `rpc_port` when admin shares it).
    pub admin_rpc_port: u16,
    /// Admin HTTP port.
    pub admin_http_port: u16,
    /// `kvcm.service.custom_info`: opaque text for clients.
    pub custom_info: String,
}

/// The lock's current holder as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderRecord {
    /// The holder's endpoint (its node id included).
    pub endpoint: NodeEndpoint,
    /// The fencing token of the holder's acquisition.
    pub fencing_token: u64,
    /// Lease expiry, wall-clock milliseconds since the epoch.
    pub expires_at_ms: u64,
}

/// What an acquisition or a renewal grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseToken {
    /// The fencing token (unchanged by renewals).
    pub fencing_token: u64,
    /// Lease expiry, wall-clock milliseconds since the epoch.
    pub expires_at_ms: u64,
}

/// Why a lock operation failed.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The caller does not hold a live lease with this token.
    #[error("the lease is lost: another node holds the lock or the lease expired")]
    Lost,
    /// The backend's files cannot be read or written.
    #[error("lock file {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The lock record does not parse.
    #[error("lock record {path} is corrupt: {reason}")]
    Corrupt {
        /// The record file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Other processes changed the lock first at every try.
    #[error("lock {0} stayed busy: other nodes changed it first at every try")]
    Busy(PathBuf),
    /// The URI names no backend this build has.
    #[error("{0}")]
    Unsupported(String),
}

/// Result of lock operations.
pub type LockResult<T> = Result<T, LockError>;

/// A lease lock backend (see the module invariants).
pub trait LeaseLock: Send + Sync + std::fmt::Debug {
    /// Takes the lock for `candidate` for `lease` when it is free or expired; `None` when a
    /// live lease is held (by anyone, the candidate included).
    fn try_acquire(
        &self,
        candidate: &NodeEndpoint,
        lease: Duration,
    ) -> LockResult<Option<LeaseToken>>;

    /// Extends the live lease of `holder` with `fencing_token` by `lease` from now and
    /// republishes its endpoint; [`LockError::Lost`] when that lease is not live.
    fn renew(
        &self,
        holder: &NodeEndpoint,
        fencing_token: u64,
        lease: Duration,
    ) -> LockResult<LeaseToken>;

    /// Compare-and-delete: frees the lock when `node_id` holds it with `fencing_token`;
    /// false (nothing changed) otherwise.
    fn release(&self, node_id: &str, fencing_token: u64) -> LockResult<bool>;

    /// The live holder, `None` when the lock is free or its lease expired.
    fn current_holder(&self) -> LockResult<Option<HolderRecord>>;
}

/// Where a backend keeps its one [`Slot`], changed atomically; every backend is one of these,
/// and the lease rules come from the [`LeaseLock`] implementation they all share.
pub(super) trait SlotStore: Send + Sync + std::fmt::Debug {
    /// Runs `change` on the slot and stores the result atomically. `change` may run more
    /// than once (a backend that retries a lost race), so it must only change the slot.
    fn change<T>(&self, change: impl Fn(&mut Slot) -> T) -> LockResult<T>;
    /// The slot as stored now.
    fn read(&self) -> LockResult<Slot>;
}

impl<S: SlotStore> LeaseLock for S {
    fn try_acquire(
        &self,
        candidate: &NodeEndpoint,
        lease: Duration,
    ) -> LockResult<Option<LeaseToken>> {
        self.change(|slot| slot.acquire(candidate, lease, now_ms()))
    }

    fn renew(
        &self,
        holder: &NodeEndpoint,
        fencing_token: u64,
        lease: Duration,
    ) -> LockResult<LeaseToken> {
        self.change(|slot| slot.renew(holder, fencing_token, lease, now_ms()))?
    }

    fn release(&self, node_id: &str, fencing_token: u64) -> LockResult<bool> {
        self.change(|slot| slot.release(node_id, fencing_token))
    }

    fn current_holder(&self) -> LockResult<Option<HolderRecord>> {
        Ok(self.read()?.live_holder(now_ms()).cloned())
    }
}

/// A lock URI (`kvcm.coordination.uri` / `kvcm.distributed_lock.uri`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockUri {
    /// `""` or `memory://`: a process-local lock (single node).
    Memory,
    /// `file://<dir>`: a lock shared by the processes of one machine.
    File(PathBuf),
    /// `redis://[user:password@]host:port[/db]`: a lock shared by nodes on any machines.
    Redis(String),
}

impl LockUri {
    /// Parses a URI; Redis and unknown schemes are refused with the reason.
    pub fn parse(uri: &str) -> LockResult<LockUri> {
        let unsupported = |reason: String| Err(LockError::Unsupported(reason));
        if uri.is_empty() || uri.starts_with("memory://") {
            return Ok(LockUri::Memory);
        }
        if let Some(dir) = uri.strip_prefix("file://") {
            if dir.is_empty() {
                return unsupported("file:// needs a directory, e.g. file:///var/lib/kvcm".into());
            }
            return Ok(LockUri::File(PathBuf::from(dir)));
        }
        if uri.starts_with("redis://") || uri.starts_with("rediss://") {
            kvcm_index::redis::parse_uri(uri).map_err(|e| LockError::Unsupported(e.to_string()))?;
            return Ok(LockUri::Redis(uri.to_string()));
        }
        unsupported(format!(
            "{uri:?} has no known scheme (memory://, file://<dir>, redis://host:port)"
        ))
    }

    /// Opens the backend (a file lock creates its directory).
    pub fn open(&self) -> LockResult<Arc<dyn LeaseLock>> {
        Ok(match self {
            LockUri::Memory => Arc::new(MemoryLock::default()),
            LockUri::File(dir) => Arc::new(FileLock::open(dir)?),
            LockUri::Redis(uri) => Arc::new(RedisLock::open(uri)?),
        })
    }
}

/// Wall-clock milliseconds since the epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A lease's length in whole milliseconds (at least 1).
fn lease_ms(lease: Duration) -> u64 {
    (lease.as_millis() as u64).max(1)
}

/// The state a backend keeps: the last token handed out and the holder, if any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Slot {
    /// The greatest fencing token handed out so far (0 = none yet).
    pub last_token: u64,
    /// The recorded holder (possibly expired).
    pub holder: Option<HolderRecord>,
}

impl Slot {
    /// The holder whose lease is still live at `now_ms`.
    pub fn live_holder(&self, now_ms: u64) -> Option<&HolderRecord> {
        self.holder.as_ref().filter(|h| h.expires_at_ms > now_ms)
    }

    /// [`LeaseLock::try_acquire`] at `now_ms`.
    pub fn acquire(
        &mut self,
        candidate: &NodeEndpoint,
        lease: Duration,
        now_ms: u64,
    ) -> Option<LeaseToken> {
        if self.live_holder(now_ms).is_some() {
            return None;
        }
        let fencing_token = self.last_token.checked_add(1)?;
        let token = LeaseToken {
            fencing_token,
            expires_at_ms: now_ms.saturating_add(lease_ms(lease)),
        };
        self.last_token = fencing_token;
        self.holder = Some(HolderRecord {
            endpoint: candidate.clone(),
            fencing_token,
            expires_at_ms: token.expires_at_ms,
        });
        Some(token)
    }

    /// [`LeaseLock::renew`] at `now_ms`.
    pub fn renew(
        &mut self,
        holder: &NodeEndpoint,
        fencing_token: u64,
        lease: Duration,
        now_ms: u64,
    ) -> LockResult<LeaseToken> {
        let held = self.live_holder(now_ms).is_some_and(|h| {
            h.fencing_token == fencing_token && h.endpoint.node_id == holder.node_id
        });
        if !held {
            return Err(LockError::Lost);
        }
        let token = LeaseToken {
            fencing_token,
            expires_at_ms: now_ms.saturating_add(lease_ms(lease)),
        };
        self.holder = Some(HolderRecord {
            endpoint: holder.clone(),
            fencing_token,
            expires_at_ms: token.expires_at_ms,
        });
        Ok(token)
    }

    /// [`LeaseLock::release`]: compare-and-delete.
    pub fn release(&mut self, node_id: &str, fencing_token: u64) -> bool {
        let held = self
            .holder
            .as_ref()
            .is_some_and(|h| h.fencing_token == fencing_token && h.endpoint.node_id == node_id);
        if held {
            self.holder = None;
        }
        held
    }
}

#[cfg(test)]
pub(super) mod conformance {
    //! The behaviour every backend must show, run against each of them.

    use super::*;

    /// An endpoint named `id`.
    pub fn node(id: &str) -> NodeEndpoint {
        NodeEndpoint {
            node_id: id.into(),
            host: "127.0.0.1".into(),
            rpc_port: 1,
            http_port: 2,
            admin_rpc_port: 1,
            admin_http_port: 3,
            custom_info: "zone a\nline two \\ back".into(),
        }
    }

    /// Polls `probe` every millisecond until it yields a value (panics after 10 s).
    fn eventually<T>(mut probe: impl FnMut() -> Option<T>) -> T {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(value) = probe() {
                return value;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "condition not met in 10 s"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Two lockers `a` and `b` on the same lock.
    pub fn two_lockers_exclude_each_other(a: &dyn LeaseLock, b: &dyn LeaseLock) {
        let long = Duration::from_secs(60);
        let first = a
            .try_acquire(&node("a"), long)
            .unwrap()
            .expect("a free lock");
        assert!(b.try_acquire(&node("b"), long).unwrap().is_none());
        assert!(
            a.try_acquire(&node("a"), long).unwrap().is_none(),
            "no re-entry"
        );
        let holder = b.current_holder().unwrap().expect("a holds it");
        assert_eq!(holder.endpoint, node("a"), "the endpoint round-trips");
        assert_eq!(holder.fencing_token, first.fencing_token);
        let renewed = a.renew(&node("a"), first.fencing_token, long).unwrap();
        assert_eq!(renewed.fencing_token, first.fencing_token);
        assert!(matches!(
            b.renew(&node("b"), first.fencing_token, long),
            Err(LockError::Lost)
        ));
        assert!(
            !b.release("b", first.fencing_token).unwrap(),
            "not b's lease"
        );
        assert!(a.release("a", first.fencing_token).unwrap());
        assert!(b.current_holder().unwrap().is_none());
        let second = b
            .try_acquire(&node("b"), long)
            .unwrap()
            .expect("a released lock");
        assert!(second.fencing_token > first.fencing_token);
        assert!(
            !a.release("a", first.fencing_token).unwrap(),
            "a stale token"
        );
        assert_eq!(a.current_holder().unwrap().unwrap().endpoint.node_id, "b");
    }

    /// An expired lease passes to the next campaigner, and its holder can neither renew
    /// nor release the successor's lease.
    pub fn an_expired_lease_is_taken_over(a: &dyn LeaseLock, b: &dyn LeaseLock) {
        let short = Duration::from_millis(30);
        let first = a
            .try_acquire(&node("a"), short)
            .unwrap()
            .expect("a free lock");
        let second = eventually(|| b.try_acquire(&node("b"), Duration::from_secs(60)).unwrap());
        assert!(second.fencing_token > first.fencing_token);
        assert!(matches!(
            a.renew(&node("a"), first.fencing_token, short),
            Err(LockError::Lost)
        ));
        assert!(!a.release("a", first.fencing_token).unwrap());
        assert_eq!(a.current_holder().unwrap().unwrap().endpoint.node_id, "b");
    }

    /// An expired lease cannot be renewed even when nobody took it.
    pub fn an_expired_lease_is_not_renewed(a: &dyn LeaseLock) {
        let short = Duration::from_millis(20);
        let token = a
            .try_acquire(&node("a"), short)
            .unwrap()
            .expect("a free lock");
        eventually(|| a.current_holder().unwrap().is_none().then_some(()));
        assert!(matches!(
            a.renew(&node("a"), token.fencing_token, short),
            Err(LockError::Lost)
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_pick_a_backend_and_redis_is_refused() {
        assert_eq!(LockUri::parse("").unwrap(), LockUri::Memory);
        assert_eq!(LockUri::parse("memory://").unwrap(), LockUri::Memory);
        assert_eq!(
            LockUri::parse("file:///tmp/x").unwrap(),
            LockUri::File("/tmp/x".into())
        );
        assert_eq!(
            LockUri::parse("redis://127.0.0.1:6379").unwrap(),
            LockUri::Redis("redis://127.0.0.1:6379".into())
        );
        let tls = LockUri::parse("rediss://127.0.0.1:6379")
            .unwrap_err()
            .to_string();
        assert!(tls.contains("TLS"), "{tls}");
        assert!(LockUri::parse("file://").is_err());
        assert!(LockUri::parse("zk://x")
            .unwrap_err()
            .to_string()
            .contains("zk://x"));
    }

    #[test]
    fn a_slot_hands_out_increasing_tokens() {
        let mut slot = Slot::default();
        let a = conformance::node("a");
        let lease = Duration::from_millis(10);
        let first = slot.acquire(&a, lease, 100).unwrap();
        assert_eq!(first.expires_at_ms, 110);
        assert!(slot.acquire(&a, lease, 109).is_none());
        let second = slot.acquire(&a, lease, 110).expect("expired at 110");
        assert!(second.fencing_token > first.fencing_token);
        assert!(slot.renew(&a, first.fencing_token, lease, 111).is_err());
        assert_eq!(
            slot.renew(&a, second.fencing_token, lease, 115)
                .unwrap()
                .expires_at_ms,
            125
        );
    }
}
