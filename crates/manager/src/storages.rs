//! Registered storage backends: the storage crate's `StorageRegistry` (open, enable /
//! disable, background health probes) plus a handle per incarnation, which is what stored
//! locations name. Available = enabled by the admin and healthy.
//!
//! Invariant: a handle names the same backend object forever (handles are never reused), so
//! a location renders and frees through the backend that allocated it, even after its
//! storage was updated or removed.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use kvcm_storage::pool::PoolTiming;
use kvcm_storage::{AllowedRoots, DataStorage, StorageConfig, StorageError, StorageRegistry};

use super::entry::{LocationRef, StorageHandle};
use super::error::{ManagerError, ManagerResult};
use super::incarnations::IncarnationTable;
use super::storage_type::StorageType;
use crate::sync::{read_lock, write_lock};

/// One opened backend under one registration. A storage that is updated gets a new
/// incarnation; the old one stays so that its blocks keep rendering and freeing through the
/// backend that allocated them.
#[derive(Debug, Clone)]
pub struct Incarnation {
    /// The storage's name.
    pub name: Arc<str>,
    /// Its type.
    pub storage_type: StorageType,
    /// The backend.
    pub backend: Arc<dyn DataStorage>,
}

/// Every incarnation ever registered, by handle (shared; append-only).
pub type Incarnations = Arc<IncarnationTable>;

/// One storage's state for health reports and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageHealth {
    /// The storage's unique name.
    pub name: String,
    /// Enabled by the admin.
    pub enabled: bool,
    /// Its latest health probe passed (true until one fails).
    pub healthy: bool,
    /// The latest failed probe's error, while unhealthy.
    pub last_error: Option<String>,
}

/// Records a storage's new incarnation (its handle) in the journal.
pub(crate) type LogIncarnation<'a> = dyn Fn(StorageHandle) -> ManagerResult<()> + 'a;

/// All registered storages.
#[derive(Debug)]
pub struct StorageTable {
    registry: StorageRegistry,
    /// The current incarnation of each registered storage, by name.
    current: RwLock<HashMap<String, StorageHandle>>,
    /// Every incarnation, by handle.
    incarnations: Incarnations,
    /// Given to every memory pool registered.
    pool_timing: PoolTiming,
    /// Where file-tier roots may lie (`kvcm.service.storage_root_allow_list`).
    allowed_roots: AllowedRoots,
}

impl StorageTable {
    /// An empty table; with `probe_interval`, storages are health-probed in the background.
    /// Memory pools get `pool_timing`; file tiers must lie in `allowed_roots`.
    pub fn new(
        probe_interval: Option<Duration>,
        pool_timing: PoolTiming,
        allowed_roots: AllowedRoots,
    ) -> ManagerResult<Self> {
        let registry = match probe_interval {
            Some(interval) => StorageRegistry::with_health_probes(interval)?,
            None => StorageRegistry::new(),
        };
        Ok(StorageTable {
            registry,
            current: RwLock::default(),
            incarnations: Arc::default(),
            pool_timing,
            allowed_roots,
        })
    }

    /// Stops the background probes.
    pub fn stop(&self) {
        self.registry.stop_health_probes();
    }

    /// Validates, opens and registers a storage (available at once).
    ///
    /// The backend is opened first, then `log` records it with the handle its incarnation
    /// gets, and only then is it registered and made current: no write can be placed on it
    /// before its record (a location logged before its storage could not be restored), and a
    /// failure anywhere before that changes nothing. The caller serialises storage changes
    /// (the manager's storage-admin lock): the handle `log` is given is the next one.
    pub fn add(&self, config: StorageConfig, log: &LogIncarnation<'_>) -> ManagerResult<()> {
        self.validate(&config)?;
        let name = config.global_unique_name.clone();
        if self.registry.get(&name).is_some() {
            return Err(already_exists(StorageError::DuplicateStorage(name)));
        }
        let opened = kvcm_storage::open(config)?;
        self.install(name, opened, None, log)
    }

    /// [`StorageTable::add`] of a storage recovered from the journal: registered even when
    /// the probe its config asks for fails, unhealthy until a probe passes (its blocks are
    /// restored either way).
    pub fn add_recovered(
        &self,
        config: StorageConfig,
        log: &LogIncarnation<'_>,
    ) -> ManagerResult<()> {
        self.validate(&config)?;
        let name = config.global_unique_name.clone();
        if self.registry.get(&name).is_some() {
            return Err(already_exists(StorageError::DuplicateStorage(name)));
        }
        let (opened, failed_probe) = kvcm_storage::open_recovered(config)?;
        self.install(name, opened, failed_probe, log)
    }

    /// Replaces a registered storage: the new config is validated and opened, its record
    /// logged (see [`StorageTable::add`]), and only then is the old backend swapped out; a
    /// config that cannot be opened or logged changes nothing.
    pub fn update(&self, config: StorageConfig, log: &LogIncarnation<'_>) -> ManagerResult<()> {
        self.validate(&config)?;
        let name = config.global_unique_name.clone();
        if !read_lock(&self.current).contains_key(&name) {
            return Err(ManagerError::NotFound(format!(
                "storage {name:?} does not exist"
            )));
        }
        let opened = kvcm_storage::open(config)?;
        self.install(name, opened, None, log)
    }

    /// Logs `opened` with its incarnation's handle (outside the lock readers take: the log
    /// may wait for a sync), then registers it in place of any earlier backend of `name`,
    /// records the incarnation and makes it current.
    fn install(
        &self,
        name: String,
        opened: Arc<dyn DataStorage>,
        failed_probe: Option<String>,
        log: &LogIncarnation<'_>,
    ) -> ManagerResult<()> {
        self.check_handles_left()?;
        let handle = self
            .incarnations
            .next_handle()
            .ok_or_else(handles_exhausted)?;
        log(handle)?;
        let mut current = write_lock(&self.current);
        let _ = self.registry.remove(&name);
        self.registry.insert(name.clone(), opened, failed_probe)?;
        let pushed = self.new_incarnation(&name)?;
        debug_assert_eq!(pushed, handle, "storage changes are serialised");
        current.insert(name, pushed);
        Ok(())
    }

    /// Forgets a storage (its incarnations stay for the blocks they hold).
    pub fn remove(&self, name: &str) -> ManagerResult<()> {
        let mut current = write_lock(&self.current);
        self.registry.remove(name)?;
        current.remove(name);
        Ok(())
    }

    /// Where an NFS prefix root's files land (its parent) passes the checks a root passes:
    /// for storages being added or updated, not for those the journal restores.
    pub fn check_files_dir(&self, config: &StorageConfig) -> ManagerResult<()> {
        config
            .validate_files_dir()
            .and_then(|()| self.allowed_roots.check_files_dir(config))
            .map_err(ManagerError::InvalidStorage)
    }

    /// The config's own checks, then the allow-list of roots.
    fn validate(&self, config: &StorageConfig) -> ManagerResult<()> {
        config
            .validate()
            .and_then(|()| self.allowed_roots.check(config))
            .map_err(ManagerError::InvalidStorage)
    }

    /// Refuses a registration when every handle is taken.
    fn check_handles_left(&self) -> ManagerResult<()> {
        if self.incarnations.len() > usize::from(u16::MAX) {
            return Err(handles_exhausted());
        }
        Ok(())
    }

    /// Records the registry's backend of `name` as a new incarnation.
    fn new_incarnation(&self, name: &str) -> ManagerResult<StorageHandle> {
        let backend = self
            .registry
            .get(name)
            .ok_or_else(|| ManagerError::NotFound(format!("storage {name:?} does not exist")))?;
        if let Some(pool) = backend.as_pool() {
            pool.set_timing(self.pool_timing);
        }
        let incarnation = Incarnation {
            name: name.into(),
            storage_type: StorageType::of(backend.kind()),
            backend,
        };
        self.incarnations
            .push(incarnation)
            .ok_or_else(handles_exhausted)
    }

    /// Enables or disables a storage.
    pub fn set_available(&self, name: &str, available: bool) -> ManagerResult<()> {
        let toggled = if available {
            self.registry.enable(name)
        } else {
            self.registry.disable(name)
        };
        Ok(toggled?)
    }

    /// Names of the storages the admin disabled.
    pub fn disabled(&self) -> Vec<String> {
        let statuses = self.registry.list().into_iter();
        let disabled = statuses.filter(|status| !status.enabled);
        disabled
            .map(|status| status.storage.config().global_unique_name.clone())
            .collect()
    }

    /// Every registered storage's config, by name.
    pub fn list(&self) -> Vec<StorageConfig> {
        let mut configs: Vec<StorageConfig> = self
            .registry
            .list()
            .into_iter()
            .map(|status| status.storage.config().clone())
            .collect();
        configs.sort_by(|a, b| a.global_unique_name.cmp(&b.global_unique_name));
        configs
    }

    /// Sets who is told when a health probe flips a storage (see
    /// `StorageRegistry::set_health_listener`).
    pub(crate) fn on_health_change(&self, listener: kvcm_storage::HealthListener) {
        self.registry.set_health_listener(listener);
    }

    /// Every registered storage's admin state and latest probe result, by name.
    pub fn health(&self) -> Vec<StorageHealth> {
        let mut health: Vec<StorageHealth> = self
            .registry
            .list()
            .into_iter()
            .map(|status| StorageHealth {
                name: status.storage.config().global_unique_name.clone(),
                enabled: status.enabled,
                healthy: status.healthy,
                last_error: status.last_error,
            })
            .collect();
        health.sort_by(|a, b| a.name.cmp(&b.name));
        health
    }

    /// Every registered storage among `candidates`, with whether it is available.
    pub fn statuses(&self, candidates: &[String]) -> Vec<(StorageConfig, bool)> {
        self.registry
            .list()
            .into_iter()
            .filter(|status| candidates.contains(&status.storage.config().global_unique_name))
            .map(|status| (status.storage.config().clone(), status.is_available()))
            .collect()
    }

    /// The handle of a registered storage's current incarnation.
    pub(crate) fn current_handle(&self, name: &str) -> Option<StorageHandle> {
        read_lock(&self.current).get(name).copied()
    }

    /// The current backend of a registered storage.
    pub fn backend(&self, name: &str) -> Option<Arc<dyn DataStorage>> {
        self.registry.get(name)
    }

    /// Probes one storage now and records the result.
    pub fn probe(&self, name: &str) {
        self.registry.probe(name);
    }

    /// The handles of every incarnation opened with this backend object.
    pub fn handles_of(&self, backend: &Arc<dyn DataStorage>) -> Vec<StorageHandle> {
        self.incarnations
            .handles_where(|incarnation| Arc::ptr_eq(&incarnation.backend, backend))
    }

    /// A snapshot of every incarnation, by handle.
    pub fn incarnations(&self) -> Incarnations {
        self.incarnations.clone()
    }

    /// The available storages among `candidates` (current incarnations), in candidate order.
    pub fn available(&self, candidates: &[String]) -> Vec<(StorageHandle, Incarnation)> {
        let current = read_lock(&self.current);
        let incarnations = self.incarnations();
        candidates
            .iter()
            .filter(|name| self.registry.is_available(name))
            .filter_map(|name| current.get(name.as_str()))
            .filter_map(|&handle| Some((handle, incarnations.get(handle)?.clone())))
            .collect()
    }

    /// Read weights for one request on a group with these candidates (wire fact sheet §11);
    /// fails when none of the candidates is available.
    pub fn read_weights<'t>(&'t self, candidates: &'t [String]) -> ManagerResult<ReadWeights<'t>> {
        let available_candidates = candidates
            .iter()
            .filter(|name| self.registry.is_available(name))
            .count();
        if available_candidates == 0 {
            return Err(ManagerError::NoSpace(
                "none of the group's storages is available".into(),
            ));
        }
        let incarnations = self.incarnations();
        let rule = if self.every_storage_available(candidates, available_candidates) {
            WeightRule::FixedPerType
        } else {
            self.partial_rule(candidates)
        };
        Ok(ReadWeights {
            table: self,
            incarnations,
            candidates,
            rule,
            memo: RefCell::default(),
        })
    }

    /// Whether every registered storage is available. Fast path (no further lock): the
    /// group's distinct available candidates are as many as the registered storages.
    fn every_storage_available(&self, candidates: &[String], available_candidates: usize) -> bool {
        let current = read_lock(&self.current);
        let distinct = || {
            candidates
                .iter()
                .enumerate()
                .all(|(i, c)| !candidates[..i].contains(c))
        };
        if available_candidates == current.len() && distinct() {
            return true;
        }
        current.keys().all(|name| self.registry.is_available(name))
    }

    /// The rule while some storage is unavailable: per type when the candidates hold at most
    /// one storage of each type, otherwise per candidate storage.
    fn partial_rule(&self, candidates: &[String]) -> WeightRule {
        let mut types: Vec<(StorageType, bool)> = Vec::with_capacity(candidates.len());
        for name in candidates {
            let Some(backend) = self.registry.get(name) else {
                continue;
            };
            let storage_type = StorageType::of(backend.kind());
            if types.iter().any(|(t, _)| *t == storage_type) {
                return WeightRule::AvailableCandidates;
            }
            types.push((storage_type, self.registry.is_available(name)));
        }
        WeightRule::AvailableTypes(types)
    }
}

/// How locations are weighted in one request (wire fact sheet §11).
enum WeightRule {
    /// Every registered storage is available: fixed weights per storage type.
    FixedPerType,
    /// Some storage is not, and the group has at most one storage per type: 1 for the types
    /// (wire numbers) whose storage is available, 0 for the others.
    AvailableTypes(Vec<(StorageType, bool)>),
    /// Some storage is not, and the group has several of one type: 1 for a location on an
    /// available candidate storage, 0 for everything else.
    AvailableCandidates,
}

/// Weights that pick among a key's readable replicas, for one request.
pub struct ReadWeights<'t> {
    table: &'t StorageTable,
    /// The incarnations as the request began.
    pub incarnations: Incarnations,
    candidates: &'t [String],
    rule: WeightRule,
    /// Availability per storage name seen so far (locations of a request mostly share one).
    memo: RefCell<Vec<(Arc<str>, bool)>>,
}

impl ReadWeights<'_> {
    /// The weight of a location; 0 makes it a miss (as is a location of an unknown handle).
    pub fn weight(&self, location: &LocationRef<'_>) -> u32 {
        self.handle_weight(location.storage)
    }

    /// The weight of every location on storage incarnation `handle`.
    pub fn handle_weight(&self, handle: StorageHandle) -> u32 {
        let Some(incarnation) = self.incarnations.get(handle) else {
            return 0;
        };
        let storage_type = incarnation.storage_type;
        match &self.rule {
            WeightRule::FixedPerType => storage_type.read_weight(),
            WeightRule::AvailableTypes(types) => {
                let available = types.iter().any(|&(t, up)| t == storage_type && up);
                u32::from(available)
            }
            WeightRule::AvailableCandidates => {
                let name = &incarnation.name;
                let candidate = self.candidates.iter().any(|c| **c == **name);
                u32::from(candidate && self.is_available(name))
            }
        }
    }

    fn is_available(&self, name: &Arc<str>) -> bool {
        let mut memo = self.memo.borrow_mut();
        if let Some((_, available)) = memo.iter().find(|(n, _)| n == name) {
            return *available;
        }
        let available = self.table.registry.is_available(name);
        memo.push((name.clone(), available));
        available
    }
}

fn handles_exhausted() -> ManagerError {
    ManagerError::Refused(
        "65,536 storage registrations were made: no storage handle is left".into(),
    )
}

fn already_exists(error: StorageError) -> ManagerError {
    match error {
        StorageError::DuplicateStorage(name) => {
            ManagerError::AlreadyExists(format!("storage {name:?} already exists"))
        }
        other => other.into(),
    }
}
