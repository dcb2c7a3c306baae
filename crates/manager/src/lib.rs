//! kvcm-manager: storages, instance groups, instances, accounts, block metadata and write
//! sessions — every rule of the control plane that is not about the wire.
//!
//! The crate speaks its own domain types only: it does not depend on the generated protos,
//! so the compiler keeps wire types out (the service edge of the `kvcm` crate converts
//! proto ⇄ domain once, in each direction). Naming a wire type here does not compile:
//!
//! ```compile_fail
//! use kvcm::proto::meta::CacheLocation; // unresolved import: the protos live in `kvcm`
//! ```
//!
//! ```compile_fail
//! use prost::Message; // unresolved import: no protobuf runtime in the domain crate
//! ```
//!
//! Invariants:
//! - each instance owns one index key space; entries are `Arc<KeyEntry>` and only change
//!   through `read_modify_write` compare-and-set steps (state machine in [`entry`]);
//! - a location is WRITING only while its session is open: Finish, expiry or demotion moves
//!   it to SERVING or DELETING exactly once;
//! - a DELETING location is never readable and is removed by the deleter thread;
//! - every state transition is published on the change feed, and every move into or out of
//!   SERVING reaches the lookup-table publisher before the call that made it returns
//!   ([`publication`]).
//!
//! Operations are synchronous and short; background work runs on threads (session expiry,
//! deleter, reclaimer) that stop when the manager is dropped.

mod access;
mod accounts;
mod api_keys;
mod background;
mod deleter;
pub mod encoding;
pub mod entry;
mod error;
pub mod feed;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod group_config;
mod groups;
pub mod hex;
mod incarnations;
mod instance;
mod journal;
pub mod keys;
pub mod leader;
mod local_index;
pub mod mask;
pub mod password;
mod pools;
mod publication;
pub mod query;
mod quota;
mod read;
pub mod reclaimer;
pub mod registration;
mod remove;
pub mod reports;
mod sessions;
pub mod storage_type;
mod storages;
pub mod sync;
mod write;

use crate::sync::read_lock;
use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, RwLock, Weak};

use kvcm_index::{ChangeLog, MetaIndex};

pub use access::LivePolicy;
pub use accounts::{Account, AccountRole};
pub use api_keys::{ApiKey, KeyGrant, KeyRefusal, NewApiKey, MAX_API_KEYS, MAX_KEY_INSTANCES};
pub use entry::{Entry, Location, LocationId, LocationRef, LocationState, Part, StorageHandle};
pub use error::{ManagerError, ManagerResult};
pub use feed::{ChangeFeed, StateChange};
pub use group_config::GroupConfig;
pub use instance::Instance;
pub use journal::{
    FsyncPolicy, JournalConfig, JournalError, JournalStats, RecoveryReport, SharedStore,
};
pub use leader::Leadership;
pub use local_index::local_index_factory;
pub use publication::{Publication, ServingLocation, StorageWeights};
pub use quota::{GroupCapacity, InstanceCapacity, TypeCapacity};
pub use read::{BlockLocation, CacheLookup, CacheMeta, LocationView, PartView, RenderedPart};
pub use registration::InstanceInfo;
pub use remove::TrimStrategy;
pub use sessions::{random_id, SESSION_ID_LEN};
pub use storage_type::StorageType;
pub use storages::StorageHealth;
pub use write::WriteStart;

use deleter::DeleteJob;
use group_config::IndexerConfig;
use sessions::SessionTable;
use storages::StorageTable;

/// Creates the index of a new instance from its group's indexer settings; the index hands
/// its committed batches to the change log (the journal, once open).
pub type IndexFactory = Arc<
    dyn Fn(&IndexerConfig, Arc<dyn ChangeLog<Entry>>) -> ManagerResult<Arc<dyn MetaIndex<Entry>>>
        + Send
        + Sync,
>;

/// What the manager is built from.
pub struct ManagerDeps {
    /// Health-probe period of storages (`None` = no background probes).
    pub storage_probe_interval: Option<std::time::Duration>,
    /// Creates instance indexes.
    pub open_index: IndexFactory,
    /// This node's id (HA reports).
    pub node_id: String,
    /// Heartbeat interval and rejoin ramp of memory-pool nodes.
    pub pool_timing: kvcm_storage::pool::PoolTiming,
    /// Period of the reclaimer's passes (`None` = no reclaimer; see [`reclaimer`]).
    pub reclaim_period: Option<std::time::Duration>,
    /// How the reclaimer picks victims (`kvcm.cache_reclaimer.policy`).
    pub reclaim_policy: LivePolicy,
    /// Limits on what clients may open.
    pub limits: ManagerLimits,
    /// Where file-tier roots may lie (`kvcm.service.storage_root_allow_list`; empty = anywhere
    /// the storage checks allow).
    pub allowed_roots: kvcm_storage::AllowedRoots,
}

/// Limits on what clients may open; beyond one, REACH_MAX_ENTITY_CAPACITY naming its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ManagerLimits {
    /// `kvcm.service.max_sessions_per_instance`: open write sessions of one instance.
    pub max_sessions_per_instance: usize,
    /// `kvcm.service.max_instances_per_group`: instances registered in one group.
    pub max_instances_per_group: usize,
    /// `kvcm.service.max_reporters_per_instance`: ReportEvent reporters (host and tier) known
    /// for one instance.
    pub max_reporters_per_instance: usize,
}

impl Default for ManagerLimits {
    fn default() -> Self {
        ManagerLimits {
            max_sessions_per_instance: 65_536,
            max_instances_per_group: 4_096,
            max_reporters_per_instance: 4_096,
        }
    }
}

/// The control plane's state and rules.
pub struct Manager {
    storages: Arc<StorageTable>,
    groups: RwLock<BTreeMap<String, Arc<GroupConfig>>>,
    instances: RwLock<HashMap<String, Arc<Instance>>>,
    accounts: Mutex<BTreeMap<String, Account>>,
    /// API keys by id (locked after `accounts` where both are held).
    api_keys: RwLock<BTreeMap<String, ApiKey>>,
    sessions: Arc<SessionTable>,
    deletes: Sender<Vec<DeleteJob>>,
    feed: ChangeFeed,
    leadership: Leadership,
    open_index: IndexFactory,
    /// The next location nonce (ids of locations, see [`entry::LocationId`]).
    nonces: std::sync::atomic::AtomicU32,
    /// The lookup-table publisher, once installed.
    publication: std::sync::OnceLock<Arc<dyn publication::Publication>>,
    /// The journal, once open (see [`Manager::open_journal`]).
    journal: journal::JournalSlot,
    /// Held across a storage admin change and its journal record, so the log's order of
    /// storage changes is the order they were made in.
    storage_admin: Mutex<()>,
    /// What the reclaimer did so far.
    reclaim_stats: reclaimer::ReclaimStats,
    /// Held while a StartWriteCache budgets and allocates (see [`quota::WriteGates`]).
    write_gates: quota::WriteGates,
    /// How the reclaimer picks victims (each instance's clock keeps what it needs).
    reclaim_policy: LivePolicy,
    /// Told about every eviction, once installed.
    reclaim_listener: std::sync::OnceLock<reclaimer::ReclaimListener>,
    /// Limits on what clients may open.
    limits: ManagerLimits,
    /// Cache subscribers' reported blocks (in this process only, as upstream keeps them).
    reports: reports::Reports,
    /// The shared store's URI, once connected (groups may then name the `redis` backend).
    shared_store_uri: std::sync::OnceLock<String>,
    /// Removed instances whose cache is still to be deleted (`remove::retry_removals`).
    removals_left: Mutex<remove::RemovalsLeft>,
    /// Removed instances whose blocks may not all be deleted yet (see
    /// `Manager::unfinished_removals`).
    unfinished_removals: Mutex<Vec<Arc<Instance>>>,
    /// Dead pool slots whose sweep failed, swept again by the next reap (see `pools`).
    unswept: Mutex<Vec<pools::Unswept>>,
    /// Held for writing while recovery or a promotion restores state (until what it restored
    /// is durable in the new process's terms); a reclaim pass runs only with it for reading,
    /// so nothing is evicted while it would not be logged.
    recovery_gate: std::sync::RwLock<()>,
    /// Itself, for the threads it starts on demand.
    this: Weak<Manager>,
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager").finish_non_exhaustive()
    }
}

impl Manager {
    /// A manager with no storages, groups or instances; starts its background threads.
    pub fn new(deps: ManagerDeps) -> ManagerResult<Arc<Manager>> {
        let storages = Arc::new(StorageTable::new(
            deps.storage_probe_interval,
            deps.pool_timing,
            deps.allowed_roots,
        )?);
        let feed = ChangeFeed::default();
        let (deletes, jobs) = mpsc::channel();
        deleter::spawn_deleter(jobs, storages.clone(), feed.clone())
            .map_err(ManagerError::Thread)?;
        let sessions = Arc::new(SessionTable::default());
        let leadership = Leadership::new(deps.node_id).map_err(ManagerError::Thread)?;
        let manager = Arc::new_cyclic(|this| Manager {
            this: this.clone(),
            storages,
            groups: RwLock::default(),
            instances: RwLock::default(),
            accounts: Mutex::default(),
            api_keys: RwLock::default(),
            sessions: sessions.clone(),
            deletes,
            feed,
            leadership,
            open_index: deps.open_index,
            nonces: std::sync::atomic::AtomicU32::new(1),
            publication: std::sync::OnceLock::new(),
            journal: journal::JournalSlot::default(),
            storage_admin: Mutex::default(),
            reclaim_stats: reclaimer::ReclaimStats::default(),
            write_gates: quota::WriteGates::default(),
            reclaim_policy: deps.reclaim_policy,
            reclaim_listener: std::sync::OnceLock::new(),
            limits: deps.limits,
            reports: reports::Reports::default(),
            shared_store_uri: std::sync::OnceLock::new(),
            removals_left: Mutex::default(),
            unfinished_removals: Mutex::default(),
            unswept: Mutex::default(),
            recovery_gate: std::sync::RwLock::new(()),
        });
        if let Some(period) = deps.reclaim_period {
            reclaimer::spawn_reclaimer(Arc::downgrade(&manager), period)
                .map_err(ManagerError::Thread)?;
        }
        let weak: Weak<Manager> = Arc::downgrade(&manager);
        reports::spawn_reporter_sweep(weak.clone()).map_err(ManagerError::Thread)?;
        let on_health = weak.clone();
        manager
            .storages
            .on_health_change(Box::new(move |name, health| {
                match health {
                    Ok(()) => {
                        tracing::info!(storage = name, "storage healthy again: back in service")
                    }
                    Err(error) => tracing::warn!(
                        storage = name,
                        error,
                        "storage failed its health probe: out of service"
                    ),
                }
                if let Some(manager) = on_health.upgrade() {
                    manager.published_storages_changed();
                }
            }));
        let on_demote = weak.clone();
        manager.leadership.add_on_demote(Arc::new(move || {
            if let Some(manager) = on_demote.upgrade() {
                manager.fail_open_sessions();
            }
        }));
        sessions::spawn_expiry(sessions, move |session| {
            if let Some(manager) = weak.upgrade() {
                manager.fail_session(session);
            }
        })
        .map_err(ManagerError::Thread)?;
        Ok(manager)
    }

    /// Subscribes to the change feed (lossless, ordered per key; see [`feed`]).
    pub fn subscribe(&self) -> mpsc::Receiver<StateChange> {
        self.feed.subscribe()
    }

    /// This node's leadership.
    pub fn leadership(&self) -> &Leadership {
        &self.leadership
    }

    /// Steps down (the demotion hook fails every open write session). False when not
    /// leader.
    pub fn demote(&self) -> bool {
        self.leadership.demote()
    }

    /// Fails every open write session (run whenever this node stops being leader).
    fn fail_open_sessions(&self) {
        for session in self.sessions.take_all() {
            self.fail_session(session);
        }
    }

    /// The registered instance with this id.
    pub fn instance(&self, instance_id: &str) -> Option<Arc<Instance>> {
        read_lock(&self.instances).get(instance_id).cloned()
    }

    /// The instance or `InstanceNotExist`.
    pub fn require_instance(&self, instance_id: &str) -> ManagerResult<Arc<Instance>> {
        self.instance(instance_id)
            .ok_or_else(|| ManagerError::InstanceNotExist(instance_id.to_string()))
    }

    /// Every registered instance.
    pub(crate) fn all_instances(&self) -> Vec<Arc<Instance>> {
        read_lock(&self.instances).values().cloned().collect()
    }

    /// Number of open write sessions.
    pub fn open_sessions(&self) -> usize {
        self.sessions.len()
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        self.sessions.shutdown();
        self.storages.stop();
    }
}

#[cfg(test)]
mod tests;
