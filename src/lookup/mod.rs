//! The lookup path's server side: per instance, a table of its SERVING locations in memory
//! registered with the transport (the soft TCP and shared-memory wires, and verbs when
//! `kvcm.lookup.verbs_device` names a device in a build with feature `rdma`), which clients read
//! with one-sided READs and no server thread (docs/lookup-table.md); the queue-pair
//! listener that connects them; and the bootstrap that tells a client where a table is.
//!
//! Tables are built on the first bootstrap of an instance and then kept in step by the
//! manager's [`Publication`] calls, synchronously, so a location that leaves SERVING is
//! unpublished before the request that moved it is answered. A table that cannot be kept
//! in step (memory exhausted, an index error) is retired and forgotten: its readers then
//! refuse it and fall back to gRPC, and the next bootstrap builds it again.
//!
//! The same queue pairs carry the write path as RDMA messages ([`messages`]): a
//! polling-thread core (`core`) hands them to manager workers and sends their replies.
//!
//! Isolation: each instance's table is registered in protection domains of its own (one
//! per wire), and a client's queue pair is created in the protection domain of the
//! instance its bootstrap named (the hello carries the bootstrap's single-use token,
//! [`grants`]); so a queue pair reads that instance's table and no other, and its messages
//! may name no other instance. Every [`AVAILABILITY_TICK`] the service checks each queue
//! pair's bootstrap credentials again; a queue pair that no longer passes is torn down
//! (and, when it was on shared memory, where a client keeps what it mapped, the instance's
//! table is retired and rebuilt in new memory on the next bootstrap; on TCP and verbs a
//! READ needs the queue pair, so tearing it down is enough).

mod access;
mod bootstrap;
mod core;
pub mod grants;
pub mod messages;
pub(crate) mod peers;
pub mod stats;
mod table;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use kvcm_index::BlockKey;
use kvcm_manager::{Instance, Manager, Publication};
use kvcm_transport::any::{AnyDomain, VerbsDevice};
use kvcm_transport::soft::{SoftConfig, SoftDomain, Wire};
use kvcm_transport::TransportError;

use crate::config::RequestLimits;
use crate::hangups::HangupWatcher;
use crate::service::meta::MetaHandler;

pub use access::{AccessCheck, LookupAccess};
pub use bootstrap::{router, BootstrapAnswer, BootstrapRequest, WireAnswer, ROUTE};
pub use peers::{hello as qp_hello, HELLO as QP_HELLO};
pub use table::{InstanceTable, TableAddress, GRACE};

/// Wire indexes of the header's rkey array.
pub const WIRE_SOFT_TCP: usize = 0;
/// See [`WIRE_SOFT_TCP`].
pub const WIRE_SOFT_SHM: usize = 1;
/// See [`WIRE_SOFT_TCP`].
pub const WIRE_VERBS: usize = 2;

/// The name of wire index `wire` in bootstrap answers.
pub fn wire_name(wire: usize) -> &'static str {
    match wire {
        WIRE_SOFT_TCP => "soft-tcp",
        WIRE_SOFT_SHM => "soft-shm",
        WIRE_VERBS => "verbs",
        _ => "unknown",
    }
}

/// How often availability is re-read for health changes the admin API did not make.
const AVAILABILITY_TICK: Duration = Duration::from_millis(100);

/// Errors of the lookup path's server side.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    /// The transport failed.
    #[error("lookup transport: {0}")]
    Transport(#[from] kvcm_transport::TransportError),
    /// The table format refused something.
    #[error(transparent)]
    Format(#[from] kvcm_lookup::FormatError),
    /// The instance's index failed.
    #[error("lookup table index read: {0}")]
    Index(#[from] kvcm_index::IndexError),
    /// The instance is not registered.
    #[error("instance {0:?} is not registered")]
    UnknownInstance(String),
    /// The instance cannot be published (more specs than a slot holds).
    #[error("instance {0:?} has more than 64 specs: the lookup table cannot hold its blocks")]
    TooManySpecs(String),
    /// The access check refused the request.
    #[error("lookup bootstrap refused: {0}")]
    Refused(String),
    /// This node does not lead: its tables would not follow the leader's changes.
    #[error("this node is not the leader: its lookup tables are not served")]
    NotLeader,
    /// Too many requests wait (try again later).
    #[error("lookup busy: {0}")]
    Busy(String),
    /// No wire is open.
    #[error("no lookup wire is open")]
    NoWire,
    /// The queue-pair listener, a connecting client or a core thread failed (I/O).
    #[error("lookup listener: {0}")]
    Listener(std::io::Error),
    /// A background growth stopped building: a rebuild in a call or the table's retirement
    /// replaced it.
    #[error("lookup table growth superseded")]
    GrowthSuperseded,
}

/// Settings of the lookup path (`kvcm.lookup.*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupConfig {
    /// `kvcm.lookup.enabled`: publish tables and accept queue pairs.
    pub enabled: bool,
    /// `kvcm.lookup.bind`: address of the soft NIC and the queue-pair listener; it is
    /// handed to clients, so it must be reachable by them.
    pub bind: IpAddr,
    /// `kvcm.lookup.verbs_device`: also serve the tables on this RDMA device (`mlx5_0`,
    /// `rxe0`; a build with feature `rdma`); `None` (or empty) serves the soft wires only.
    pub verbs_device: Option<String>,
    /// `kvcm.lookup.verbs_gid_index`: the device's GID table index for RoCE addressing
    /// (1 is RoCE v2 on rxe).
    pub verbs_gid_index: u8,
    /// `kvcm.lookup.max_queue_pairs`, `kvcm.lookup.max_queue_pairs_per_instance`.
    pub queue_pairs: QueuePairLimits,
}

/// How many queue pairs the core holds at once (each holds 2 MiB of message buffers,
/// registered — pinned — on verbs): in all, and of one instance, so that one tenant
/// cannot take every place. A queue pair beyond either is refused at its hello (its client
/// uses gRPC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuePairLimits {
    /// `kvcm.lookup.max_queue_pairs`.
    pub total: usize,
    /// `kvcm.lookup.max_queue_pairs_per_instance`.
    pub per_instance: usize,
}

impl Default for QueuePairLimits {
    fn default() -> Self {
        QueuePairLimits {
            total: 1024,
            per_instance: 256,
        }
    }
}

impl LookupConfig {
    /// The RDMA device the tables are also served on, if any.
    pub fn verbs(&self) -> Option<VerbsDevice> {
        self.verbs_device.as_ref().map(|name| VerbsDevice {
            name: name.clone(),
            gid_index: self.verbs_gid_index,
        })
    }
}

impl Default for LookupConfig {
    fn default() -> Self {
        LookupConfig {
            enabled: true,
            bind: IpAddr::from([127, 0, 0, 1]),
            verbs_device: None,
            verbs_gid_index: 0,
            queue_pairs: QueuePairLimits::default(),
        }
    }
}

/// The lookup path's server side.
pub struct LookupService {
    /// Itself (for the threads it starts).
    this: Weak<LookupService>,
    manager: Weak<Manager>,
    /// Random id of this server process (clients refuse tables of another).
    incarnation: u64,
    /// (wire index, domain).
    domains: Vec<(usize, AnyDomain)>,
    tables: Mutex<HashMap<String, Arc<InstanceTable>>>,
    /// Where clients connect their queue pairs.
    connect_addr: SocketAddr,
    access: LookupAccess,
    /// Tokens issued by bootstraps, waiting for their hello.
    grants: grants::Grants,
    /// The polling-thread core (queue pairs are handed to it).
    core: core::CoreHandle,
    /// What one meta request may ask for: the lookups the server refuses are told to
    /// clients at bootstrap.
    request_limits: RequestLimits,
    /// Tears verbs queue pairs down when their client hangs up.
    hangups: HangupWatcher<(core::PeerKey, Arc<grants::Grant>)>,
    /// Tables retired because they could not be kept in step.
    tables_dropped: AtomicU64,
}

impl std::fmt::Debug for LookupService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LookupService")
            .field("incarnation", &self.incarnation)
            .finish_non_exhaustive()
    }
}

impl LookupService {
    /// Opens the wires, starts the polling-thread core (serving write-path messages with
    /// `meta`) and the queue-pair listener, and installs itself as the manager's publisher.
    pub fn start(
        manager: &Arc<Manager>,
        meta: MetaHandler,
        config: &LookupConfig,
        access: LookupAccess,
    ) -> Result<Arc<LookupService>, LookupError> {
        let verbs = config.verbs();
        let domains = open_wires(config.bind, verbs.as_ref(), "kvcm.lookup.verbs_device")?;
        let request_limits = meta.request_limits();
        let core = core::start(&domains, meta, config.queue_pairs)?;
        let listener = peers::bind(config.bind)?;
        let connect_addr = peers::local_addr(&listener)?;
        let hangups = watch_hangups(core.clone()).map_err(LookupError::Listener)?;
        let service = Arc::new_cyclic(|this| LookupService {
            this: this.clone(),
            manager: Arc::downgrade(manager),
            incarnation: fastrand::u64(1..),
            domains,
            tables: Mutex::new(HashMap::new()),
            connect_addr,
            access,
            grants: grants::Grants::default(),
            hangups,
            core,
            tables_dropped: AtomicU64::new(0),
            request_limits,
        });
        peers::serve(listener, Arc::downgrade(&service))?;
        let demoted = Arc::downgrade(&service);
        manager.leadership().add_on_demote(Arc::new(move || {
            if let Some(service) = demoted.upgrade() {
                service.retire_all("this node is no longer the leader");
            }
        }));
        manager.set_publication(service.clone());
        spawn_availability_ticks(Arc::downgrade(&service))?;
        Ok(service)
    }

    /// Where clients connect their queue pairs.
    pub fn connect_addr(&self) -> SocketAddr {
        self.connect_addr
    }

    /// Whether wire index `wire` is open.
    fn serves_wire(&self, wire: usize) -> bool {
        self.domains.iter().any(|(w, _)| *w == wire)
    }

    fn tables(&self) -> MutexGuard<'_, HashMap<String, Arc<InstanceTable>>> {
        self.tables.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn table(&self, instance_id: &str) -> Option<Arc<InstanceTable>> {
        self.tables().get(instance_id).cloned()
    }

    /// The table of `instance_id`, built on first use, and the registered instance it was
    /// checked against (after publishing, the instance of that id, the same object).
    pub fn table_for(
        &self,
        instance_id: &str,
    ) -> Result<(Arc<InstanceTable>, Arc<Instance>), LookupError> {
        let manager = self.manager.upgrade().ok_or(LookupError::NoWire)?;
        let instance = manager
            .instance(instance_id)
            .ok_or_else(|| LookupError::UnknownInstance(instance_id.to_string()))?;
        if instance.specs().len() > kvcm_lookup::header::MAX_PARTS {
            return Err(LookupError::TooManySpecs(instance_id.to_string()));
        }
        // Entered in the map at once (empty, not yet readable), then filled under its own
        // lock: publication calls for this instance wait for the fill, other instances' do
        // not, and a concurrent bootstrap waits for the same fill.
        let (table, stale) = {
            let mut tables = self.tables();
            match tables.get(instance_id) {
                Some(table) if table.is_of(&instance) => (table.clone(), None),
                // None, or a removed instance's table its removal has not retired yet.
                kept => {
                    let stale = kept.cloned();
                    let table = InstanceTable::create(
                        &manager,
                        &instance,
                        &self.domains,
                        self.incarnation,
                    )?;
                    let table = Arc::new(table);
                    tables.insert(instance_id.to_string(), table.clone());
                    (table, stale)
                }
            }
        };
        if let Some(stale) = stale {
            retire(instance_id, &stale);
        }
        if let Err(error) = table.ensure_published(&manager, &instance) {
            self.drop_this_table(instance_id, &table, &error);
            return Err(error);
        }
        // Removed (and perhaps registered again) while its table was built: the removal
        // found no table to retire, so this one goes now.
        let current = manager.instance(instance_id);
        if !current.is_some_and(|kept| Arc::ptr_eq(&kept, &instance)) {
            let gone = LookupError::UnknownInstance(instance_id.to_string());
            self.drop_this_table(instance_id, &table, &gone);
            return Err(gone);
        }
        Ok((table, instance))
    }

    /// Retires and forgets every table and tears down every queue pair (a demoted node: the
    /// leader's changes no longer reach its index, so its tables must not answer). Readers
    /// fall back to gRPC, which sends them to the leader; a later bootstrap (once this node
    /// leads again) builds the tables anew.
    fn retire_all(&self, why: &str) {
        let tables: Vec<(String, Arc<InstanceTable>)> = self.tables().drain().collect();
        for (id, table) in tables {
            retire(&id, &table);
        }
        for (key, grant) in self.core.bound() {
            self.core.close(key, grant);
        }
        tracing::info!(why, "lookup tables retired and queue pairs torn down");
    }

    /// Retires and forgets a table that could not be kept in step.
    fn drop_table(&self, instance_id: &str, error: &LookupError) {
        if let Some(table) = self.table(instance_id) {
            self.drop_this_table(instance_id, &table, error);
        }
    }

    /// Retires `table` and forgets it if it is still the one kept for `instance_id` (a
    /// newer table of a re-registered instance stays).
    fn drop_this_table(&self, instance_id: &str, table: &Arc<InstanceTable>, error: &LookupError) {
        tracing::error!(instance = instance_id, %error,
            "lookup table dropped: readers fall back to gRPC");
        {
            let mut tables = self.tables();
            if tables
                .get(instance_id)
                .is_some_and(|kept| Arc::ptr_eq(kept, table))
            {
                tables.remove(instance_id);
                // Counted once per table, however many callers saw it fail.
                self.tables_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        retire(instance_id, table);
    }

    fn refresh_availability(&self) {
        let Some(manager) = self.manager.upgrade() else {
            return;
        };
        let tables: Vec<(String, Arc<InstanceTable>)> = self
            .tables()
            .iter()
            .map(|(id, table)| (id.clone(), table.clone()))
            .collect();
        for (id, table) in tables {
            let Some(instance) = manager.instance(&id).filter(|i| table.is_of(i)) else {
                continue;
            };
            if let Err(error) = table.refresh_availability(&manager, &instance) {
                self.drop_this_table(&id, &table, &error);
            }
        }
    }

    /// Runs `growth` of `table` (of `instance`) on a thread of its own (see the growth notes
    /// in `table.rs`).
    fn grow_in_background(
        &self,
        table: Arc<InstanceTable>,
        manager: Arc<Manager>,
        instance: Arc<Instance>,
        growth: table::Growth,
    ) {
        let service = self.this.clone();
        let id = instance.id().clone();
        let pending = PendingGrowth { table, growth };
        let spawned = std::thread::Builder::new()
            .name("kvcm-table-grow".into())
            .spawn(move || grow(&service, &manager, &instance, pending));
        if let Err(error) = spawned {
            // The closure, and with it the pending growth, was dropped: it is abandoned.
            tracing::warn!(instance = %id, %error,
                "lookup table growth not started: the table grows when it runs out");
        }
    }

    /// Tears down every queue pair whose bootstrap credentials no longer pass (a revoked or
    /// expired key, a removed instance); an instance that lost a shared-memory reader so
    /// has its table retired, so that what that reader mapped is never updated again.
    fn sweep_queue_pairs(&self) {
        let manager = self.manager.upgrade();
        let mut stale_tables = Vec::new();
        for (key, grant) in self.core.bound() {
            let registered = manager
                .as_ref()
                .is_some_and(|m| m.instance(&grant.instance_id).is_some());
            let leading = manager.as_ref().is_some_and(|m| m.leadership().is_leader());
            let refusal = match (self.access)(&grant.check()) {
                Err(why) => why,
                Ok(()) if !registered => "the instance was removed".to_string(),
                Ok(()) if !leading => "this node is no longer the leader".to_string(),
                Ok(()) => continue,
            };
            tracing::info!(instance = &*grant.instance_id, wire = key.0, qpn = key.1, %refusal, "lookup queue pair torn down");
            self.core.close(key, Arc::clone(&grant));
            if key.0 == WIRE_SOFT_SHM && !stale_tables.contains(&grant.instance_id) {
                stale_tables.push(grant.instance_id.clone());
            }
        }
        for instance_id in stale_tables {
            let why = LookupError::Refused("a shared-memory reader lost its access".into());
            self.drop_table(&instance_id, &why);
        }
    }
}

impl Publication for LookupService {
    fn keys_changed(&self, instance: &Instance, keys: &[BlockKey]) {
        // A removed instance's late changes never reach a later instance's table.
        let Some(table) = self.table(instance.id()).filter(|t| t.is_of(instance)) else {
            return;
        };
        let Some(manager) = self.manager.upgrade() else {
            return;
        };
        match table.refresh(&manager, instance, keys) {
            Ok(Some(growth)) => match manager.instance(instance.id()) {
                Some(kept) if std::ptr::eq(Arc::as_ptr(&kept), instance) => {
                    self.grow_in_background(table, manager, kept, growth);
                }
                _ => table.abandon_growth(&growth),
            },
            Ok(None) => {}
            Err(error) => self.drop_this_table(instance.id(), &table, &error),
        }
    }

    fn storages_changed(&self) {
        self.refresh_availability();
    }

    fn instance_removed(&self, instance: &Instance) {
        // Only its own table: a later instance of the id may have been registered, and its
        // table built, before this call. Out of the map first, the map's lock released:
        // retiring waits for the table's own lock (a fill or a rebuild may hold it for a
        // while), and other instances' changes must not wait for that.
        let removed = {
            let mut tables = self.tables();
            let own = tables
                .get(instance.id().as_ref())
                .is_some_and(|table| table.is_of(instance));
            own.then(|| tables.remove(instance.id().as_ref())).flatten()
        };
        if let Some(table) = removed {
            retire(instance.id(), &table);
        }
    }
}

/// Retires `table` of `instance_id` (readers refuse it from now on), logging a failure.
fn retire(instance_id: &str, table: &InstanceTable) {
    if let Err(error) = table.retire() {
        tracing::error!(instance = instance_id, %error, "retiring a lookup table failed");
    }
}

/// A growth handed to a background thread; abandoned when dropped (after its install that
/// changes nothing), so a build that failed or panicked leaves no growth pending.
struct PendingGrowth {
    table: Arc<InstanceTable>,
    growth: table::Growth,
}

impl Drop for PendingGrowth {
    fn drop(&mut self) {
        self.table.abandon_growth(&self.growth);
    }
}

/// A background growth: builds the next generation and installs it. A failed build leaves
/// the current generation as it was (exact); a failed install drops the table, as a failed
/// change does.
fn grow(
    service: &Weak<LookupService>,
    manager: &Manager,
    instance: &Instance,
    pending: PendingGrowth,
) {
    let (table, id) = (&pending.table, instance.id());
    let started = std::time::Instant::now();
    let grown = match table.build_grown(manager, instance, &pending.growth) {
        Ok(grown) => grown,
        Err(LookupError::GrowthSuperseded) => {
            tracing::debug!(instance = %id, elapsed = ?started.elapsed(),
                "lookup table growth superseded: its build stopped");
            return;
        }
        Err(error) => {
            tracing::warn!(instance = %id, %error,
                "lookup table growth failed: the table grows when it runs out");
            return;
        }
    };
    match table.install_grown(manager, instance, grown) {
        Ok(installed) => tracing::debug!(instance = %id, installed, elapsed = ?started.elapsed(),
            "lookup table grown in the background"),
        Err(error) => {
            if let Some(service) = service.upgrade() {
                service.drop_this_table(id, table, &error);
            }
        }
    }
}

/// Opens both soft wires (their NICs bound to `bind`) and, when given, RDMA device `verbs`,
/// each with its wire index; a device that does not open is an error naming `setting`,
/// where it was configured. Used by the lookup path and by pool nodes.
pub(crate) fn open_wires(
    bind: IpAddr,
    verbs: Option<&VerbsDevice>,
    setting: &str,
) -> Result<Vec<(usize, AnyDomain)>, TransportError> {
    let open = |wire| {
        SoftDomain::open(SoftConfig {
            wire,
            bind,
            ..SoftConfig::default()
        })
        .map(AnyDomain::from)
    };
    let mut domains = vec![
        (WIRE_SOFT_TCP, open(Wire::Tcp)?),
        (WIRE_SOFT_SHM, open(Wire::Shm)?),
    ];
    if let Some(device) = verbs {
        let domain = AnyDomain::open_verbs(device).map_err(|error| {
            TransportError::NoDevice(format!("{setting} {:?}: {error}", device.name))
        })?;
        tracing::info!(device = device.name, "also serving on RDMA verbs");
        domains.push((WIRE_VERBS, domain));
    }
    Ok(domains)
}

/// The watcher that tears a verbs queue pair down through `core` when its client hangs up
/// (`crate::hangups`); a queue pair `core` no longer binds to its grant is not watched.
fn watch_hangups(
    core: core::CoreHandle,
) -> std::io::Result<HangupWatcher<(core::PeerKey, Arc<grants::Grant>)>> {
    let live_core = core.clone();
    let live =
        move |(key, grant): &(core::PeerKey, Arc<grants::Grant>)| live_core.is_bound(*key, grant);
    let hung_up = move |(key, grant): &(core::PeerKey, Arc<grants::Grant>)| {
        tracing::info!(
            wire = key.0,
            qpn = key.1,
            "lookup queue pair torn down: its client hung up"
        );
        core.close(*key, Arc::clone(grant));
    };
    HangupWatcher::start("kvcm-lookup-hangup", live, hung_up)
}

/// Re-reads availability every [`AVAILABILITY_TICK`] until the service is dropped.
fn spawn_availability_ticks(service: Weak<LookupService>) -> Result<(), LookupError> {
    std::thread::Builder::new()
        .name("kvcm-lookup-avail".into())
        .spawn(move || loop {
            std::thread::sleep(AVAILABILITY_TICK);
            match service.upgrade() {
                Some(service) => {
                    service.refresh_availability();
                    service.sweep_queue_pairs();
                }
                None => return,
            }
        })
        .map(drop)
        .map_err(LookupError::Listener)
}

#[cfg(test)]
mod tests {
    use kvcm_manager::registration::{InstanceInfo, ModelDeployment};
    use kvcm_storage::BlockSpec;

    use super::*;
    use crate::config::ServerConfig;

    /// The registration of instance `i`: one spec of 4 KiB, blocks of 4 tokens.
    pub(crate) fn info() -> InstanceInfo {
        InstanceInfo {
            quota_group_name: String::new(),
            instance_group_name: "default".into(),
            instance_id: "i".into(),
            block_size: 4,
            specs: vec![BlockSpec {
                name: "tp0".into(),
                size: 4096,
            }],
            model: ModelDeployment {
                model_name: "m".into(),
                dtype: "fp8".into(),
                ..Default::default()
            },
            spec_groups: Vec::new(),
            default_query: Default::default(),
        }
    }

    /// An instance removed and registered again under its id before its removal reached the
    /// lookup service (or was even recorded there): a bootstrap of the later instance gets a
    /// table of its own, not the removed instance's, and the removal's late notice retires
    /// only the removed instance's table (it once retired whatever table the id had).
    #[test]
    fn a_removed_instance_never_touches_the_table_of_a_later_instance_of_its_id() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = ServerConfig {
            data_dir: dir.path().to_path_buf(),
            ..ServerConfig::default()
        };
        let manager = crate::server::embedded_manager(&config).expect("manager");
        manager.register_instance(info()).expect("register");
        let handlers = crate::service::Handlers::new(manager.clone(), None);
        let access: LookupAccess = Arc::new(|_| Ok(()));
        let service = LookupService::start(&manager, handlers.meta.clone(), &config.lookup, access)
            .expect("lookup service");
        let (removed_table, first) = service.table_for("i").expect("bootstrap");
        manager.remove_instance("i").expect("remove");
        manager.register_instance(info()).expect("register again");
        // The removal not retired yet: its table still kept under the id.
        service
            .tables()
            .insert("i".into(), Arc::clone(&removed_table));
        let (table, later) = service.table_for("i").expect("bootstrap again");
        assert!(!Arc::ptr_eq(&first, &later));
        assert!(
            !Arc::ptr_eq(&table, &removed_table) && table.is_of(&later),
            "the later instance's own table"
        );
        service.instance_removed(&first);
        let kept = service.table("i").expect("kept");
        assert!(
            Arc::ptr_eq(&kept, &table),
            "the removal's notice leaves the later instance's table"
        );
    }
}
