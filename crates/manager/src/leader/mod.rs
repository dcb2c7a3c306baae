//! Leadership of this node: a lease on a [`LeaseLock`] won by campaigning.
//!
//! An elector thread runs one step per `loop_interval`: the leader renews its lease, a
//! follower campaigns (unless it is in its campaign delay after a LeaderDemote). Backends:
//! `memory://` (process-local, the embedded default) and `file://<dir>` (the processes of
//! one machine); see `docs/election.md`.
//!
//! Invariants:
//! - [`Leadership::is_leader`] is true only while this node holds a lease whose local
//!   deadline — the monotonic instant taken before the acquire/renew call that granted it,
//!   plus `lease − drift margin` — has not passed. A node whose renewals stop (a stalled
//!   process, a stuck file system) refuses leader-only calls from that deadline on, before
//!   any other node can win the lock (fencing for local backends);
//! - a node turns leader only after its promotion hook returned OK (a failing hook
//!   releases the lock and the node stays follower);
//! - after a LeaderDemote the node has released the lock and is follower before `demote`
//!   returns, and campaigns again only after `max(campaign delay, 2 loop periods)`; the
//!   delay is read at every check (an update takes effect at once) and clamped to
//!   [`MAX_CAMPAIGN_DELAY`];
//! - losing leadership by any path (demotion, failed renewal, lease run out) runs the
//!   demotion hooks once each; so does a promotion whose hook succeeded but whose lease
//!   could not be renewed after it (the hook may have taken longer than the lease: it must
//!   not, and the hooks learn that the lead was not taken).
//!
//! Hooks run on the thread that changes leadership (the elector's or the caller of
//! [`Leadership::demote`]) and must not keep the manager alive: capture weak references.

mod elector;
mod file;
mod lock;
mod memory;
mod redis;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

pub use file::FileLock;
pub(crate) use lock::now_ms;
pub use lock::{HolderRecord, LeaseLock, LeaseToken, LockError, LockResult, LockUri, NodeEndpoint};
pub use memory::MemoryLock;

use elector::Shared;

/// The longest campaign delay honoured; a larger `campaign_delay_time_ms` counts as this.
pub const MAX_CAMPAIGN_DELAY: Duration = Duration::from_secs(3600);

/// Lease length and elector period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElectorSettings {
    /// `kvcm.leader_elector.lease_ms`.
    pub lease: Duration,
    /// `kvcm.leader_elector.loop_interval_ms`.
    pub loop_interval: Duration,
}

impl Default for ElectorSettings {
    /// The reference's defaults: a 10 s lease, a 100 ms loop.
    fn default() -> Self {
        ElectorSettings {
            lease: Duration::from_secs(10),
            loop_interval: Duration::from_millis(100),
        }
    }
}

impl ElectorSettings {
    /// How much earlier than the lock's expiry a leader stops acting: a tenth of the lease
    /// (room for clock-rate drift between processes and for the renewal's own latency).
    pub fn drift_margin(&self) -> Duration {
        self.lease / 10
    }

    /// How long a granted lease lets this node act: `lease − drift margin`.
    fn local_term(&self) -> Duration {
        self.lease - self.drift_margin()
    }

    /// The shortest demotion: two loop periods, so that every other live node (campaigning
    /// once a period) sees the released lock before this one campaigns again.
    fn min_demotion(&self) -> Duration {
        self.loop_interval * 2
    }

    /// Checks that a leader renews at least three times per local term.
    pub fn validate(&self) -> Result<(), String> {
        if self.loop_interval.is_zero() {
            return Err("loop_interval_ms must be positive".into());
        }
        if self.local_term() < self.loop_interval * 3 {
            return Err(format!(
                "lease_ms ({} ms) minus its tenth must cover three loop_interval_ms ({} ms)",
                self.lease.as_millis(),
                self.loop_interval.as_millis()
            ));
        }
        Ok(())
    }
}

/// What a promotion hook learns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Promotion {
    /// The fencing token of the lease this node just won.
    pub fencing_token: u64,
}

/// Runs after the lock was won and before the node serves as leader (e.g. recovery); an
/// error keeps the node follower.
pub type PromoteHook = Arc<dyn Fn(&Promotion) -> Result<(), String> + Send + Sync>;
/// Runs once each time the node stops being leader.
pub type DemoteHook = Arc<dyn Fn() + Send + Sync>;

/// What a node campaigns on.
#[derive(Debug, Clone)]
pub struct Election {
    /// The lock.
    pub lock: Arc<dyn LeaseLock>,
    /// Lease and loop period.
    pub settings: ElectorSettings,
    /// The endpoint published while leading (its node id is replaced by this node's).
    pub endpoint: NodeEndpoint,
}

/// Leader state of the node; stops its elector thread when dropped.
#[derive(Debug)]
pub struct Leadership {
    shared: Arc<Shared>,
}

impl Leadership {
    /// A node campaigning on its own `memory://` lock with the default settings: leader
    /// before this returns. [`Leadership::configure`] moves it to another lock.
    pub fn new(node_id: String) -> std::io::Result<Self> {
        let election = Election {
            lock: Arc::new(MemoryLock::default()),
            settings: ElectorSettings::default(),
            endpoint: NodeEndpoint {
                node_id: node_id.clone(),
                ..NodeEndpoint::default()
            },
        };
        let shared = Arc::new(Shared::new(node_id, election));
        shared.step();
        elector::spawn(shared.clone())?;
        Ok(Leadership { shared })
    }

    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.shared.node_id
    }

    /// Whether this node holds a live lease and finished its promotion.
    pub fn is_leader(&self) -> bool {
        self.shared.held().is_some()
    }

    /// Steps down: releases the lock and stays follower for the campaign delay; false when
    /// not leader.
    pub fn demote(&self) -> bool {
        self.shared.demote()
    }

    /// How long a demoted node refrains from campaigning, as set.
    pub fn campaign_delay_ms(&self) -> i64 {
        self.shared.campaign_delay_ms.load(Ordering::Relaxed)
    }

    /// Sets the campaign delay (negative values are stored as 0); a demoted node whose new
    /// delay has passed campaigns at once.
    pub fn set_campaign_delay_ms(&self, delay_ms: i64) {
        self.shared
            .campaign_delay_ms
            .store(delay_ms.max(0), Ordering::Relaxed);
        self.shared.wake();
    }

    /// Lease expiry in microseconds since the epoch, -1 when not leader.
    pub fn lease_expiration_us(&self) -> i64 {
        self.shared.held().map_or(-1, |token| {
            i64::try_from(token.expires_at_ms.saturating_mul(1000)).unwrap_or(i64::MAX)
        })
    }

    /// The lock's live holder, read from the lock now (the last one observed by the elector
    /// when the lock cannot be read).
    pub fn leader(&self) -> Option<HolderRecord> {
        self.shared.leader()
    }

    /// Wall-clock milliseconds of the elector's last step.
    pub fn elector_last_loop_ms(&self) -> i64 {
        self.shared.last_step_ms.load(Ordering::Relaxed)
    }

    /// Leaves the current lock (releasing a lease held on it) and campaigns on `election`
    /// once before returning.
    pub fn configure(&self, election: Election) {
        self.shared.configure(election);
    }

    /// Replaces the endpoint published from the next renewal on.
    pub fn set_endpoint(&self, endpoint: NodeEndpoint) {
        self.shared.set_endpoint(endpoint);
    }

    /// Installs the promotion hook.
    pub fn set_on_promote(&self, hook: PromoteHook) {
        self.shared.set_on_promote(hook);
    }

    /// How long until this node may campaign again after a LeaderDemote (zero when it may).
    pub fn campaign_pause_left(&self) -> Duration {
        self.shared.campaign_pause_left()
    }

    /// Campaigns no sooner than `pause` from now (a node restarted after a LeaderDemote
    /// keeps the rest of its pause).
    pub fn hold_off(&self, pause: Duration) {
        self.shared.hold_off(pause);
    }

    /// Adds a demotion hook (hooks run in the order they were added).
    pub fn add_on_demote(&self, hook: DemoteHook) {
        self.shared.add_on_demote(hook);
    }

    /// Whether the node resigned (a demotion hook running now runs for the resignation).
    pub fn is_resigned(&self) -> bool {
        self.shared.resigned()
    }

    /// Stops campaigning for good and releases a lease held (at shutdown: the other nodes
    /// need not wait for it to expire).
    pub fn resign(&self) {
        self.shared.resign();
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.shared.resign();
    }
}

#[cfg(test)]
mod tests;
