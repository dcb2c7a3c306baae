//! Registered storage backends: the storage crate's `StorageRegistry` (open, enable /
//! disable, background health probes) plus the wire config each storage was added with
//! (ListStorage answers it back). Available = enabled by the admin and healthy.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use kvcm_storage::{DataStorage, StorageConfig, StorageError, StorageRegistry};

use super::entry::Location;
use super::error::{ManagerError, ManagerResult};
use crate::proto::{admin, meta, storage as wire};
use crate::sync::{read_lock, write_lock};

/// All registered storages.
#[derive(Debug)]
pub struct StorageTable {
    registry: StorageRegistry,
    wire_configs: RwLock<BTreeMap<String, admin::StorageConfig>>,
    /// `wire_configs.len()`, readable without its lock (updated under it).
    registered_count: AtomicUsize,
}

impl StorageTable {
    /// An empty table; with `probe_interval`, storages are health-probed in the background.
    pub fn new(probe_interval: Option<Duration>) -> ManagerResult<Self> {
        let registry = match probe_interval {
            Some(interval) => StorageRegistry::with_health_probes(interval)?,
            None => StorageRegistry::new(),
        };
        Ok(StorageTable {
            registry,
            wire_configs: RwLock::default(),
            registered_count: AtomicUsize::new(0),
        })
    }

    /// Stops the background probes.
    pub fn stop(&self) {
        self.registry.stop_health_probes();
    }

    /// Validates, opens and registers a storage (available at once).
    pub fn add(&self, wire_config: admin::StorageConfig) -> ManagerResult<()> {
        let config = validated(&wire_config)?;
        let mut wire_configs = write_lock(&self.wire_configs);
        self.registry.add(config).map_err(already_exists)?;
        wire_configs.insert(wire_config.global_unique_name.clone(), wire_config);
        self.registered_count
            .store(wire_configs.len(), Ordering::Release);
        Ok(())
    }

    /// Replaces a registered storage. The new config is validated and opened first, so a
    /// config that cannot be opened changes nothing; only then is the old one swapped out
    /// (remove + add). Should the add still fail, the old one is restored, or, if even that
    /// fails, forgotten in the listing too (never a stale entry).
    pub fn update(&self, wire_config: admin::StorageConfig) -> ManagerResult<()> {
        let config = validated(&wire_config)?;
        let name = config.global_unique_name.clone();
        let mut wire_configs = write_lock(&self.wire_configs);
        if !wire_configs.contains_key(&name) {
            return Err(ManagerError::NotFound(format!(
                "storage {name:?} does not exist"
            )));
        }
        drop(kvcm_storage::open(config.clone())?);
        let old = self.registry.remove(&name)?;
        if let Err(error) = self.registry.add(config) {
            if let Err(restore) = self.registry.add(old.config().clone()) {
                tracing::warn!(%restore, storage = %name, "restoring a storage after a failed update");
                wire_configs.remove(&name);
                self.registered_count
                    .store(wire_configs.len(), Ordering::Release);
            }
            return Err(error.into());
        }
        wire_configs.insert(name, wire_config);
        Ok(())
    }

    /// Forgets a storage.
    pub fn remove(&self, name: &str) -> ManagerResult<()> {
        let mut wire_configs = write_lock(&self.wire_configs);
        self.registry.remove(name)?;
        wire_configs.remove(name);
        self.registered_count
            .store(wire_configs.len(), Ordering::Release);
        Ok(())
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

    /// Every registered storage's wire config, by name.
    pub fn list(&self) -> Vec<admin::StorageConfig> {
        read_lock(&self.wire_configs).values().cloned().collect()
    }

    /// The backend registered under `name`.
    pub fn backend(&self, name: &str) -> Option<Arc<dyn DataStorage>> {
        self.registry.get(name)
    }

    /// The available backends among `candidates`, in candidate order.
    pub fn available(&self, candidates: &[String]) -> Vec<Arc<dyn DataStorage>> {
        candidates
            .iter()
            .filter(|name| self.registry.is_available(name))
            .filter_map(|name| self.registry.get(name))
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
        let rule = if self.every_storage_available(candidates, available_candidates) {
            WeightRule::FixedPerType
        } else {
            self.partial_rule(candidates)
        };
        Ok(ReadWeights {
            table: self,
            candidates,
            rule,
            memo: RefCell::default(),
        })
    }

    /// Whether every registered storage is available. Fast path (no further lock): the
    /// group's distinct available candidates are as many as the registered storages.
    fn every_storage_available(&self, candidates: &[String], available_candidates: usize) -> bool {
        let registered = self.registered_count.load(Ordering::Acquire);
        let distinct = || {
            candidates
                .iter()
                .enumerate()
                .all(|(i, c)| !candidates[..i].contains(c))
        };
        if available_candidates == registered && distinct() {
            return true;
        }
        read_lock(&self.wire_configs)
            .keys()
            .all(|name| self.registry.is_available(name))
    }

    /// The rule while some storage is unavailable: per type when the candidates hold at most
    /// one storage of each type, otherwise per candidate storage.
    fn partial_rule(&self, candidates: &[String]) -> WeightRule {
        let mut types: Vec<(i32, bool)> = Vec::with_capacity(candidates.len());
        for name in candidates {
            let Some(backend) = self.registry.get(name) else {
                continue;
            };
            let wire_type = wire::wire_type(backend.kind()) as i32;
            if types.iter().any(|(t, _)| *t == wire_type) {
                return WeightRule::AvailableCandidates;
            }
            types.push((wire_type, self.registry.is_available(name)));
        }
        WeightRule::AvailableTypes(types)
    }

    /// The `storage_configs` JSON text of a group's registered candidates, by name.
    pub fn storage_configs_json(&self, candidates: &[String]) -> String {
        let items: Vec<serde_json::Value> = self
            .registry
            .list()
            .into_iter()
            .filter(|status| candidates.contains(&status.storage.config().global_unique_name))
            .map(|status| wire::storage_config_json(status.storage.config(), status.is_available()))
            .collect();
        serde_json::Value::Array(items).to_string()
    }
}

/// How locations are weighted in one request (wire fact sheet §11).
enum WeightRule {
    /// Every registered storage is available: fixed weights per storage type.
    FixedPerType,
    /// Some storage is not, and the group has at most one storage per type: 1 for the types
    /// (wire numbers) whose storage is available, 0 for the others.
    AvailableTypes(Vec<(i32, bool)>),
    /// Some storage is not, and the group has several of one type: 1 for a location on an
    /// available candidate storage, 0 for everything else.
    AvailableCandidates,
}

/// Weights that pick among a key's readable replicas, for one request.
pub struct ReadWeights<'t> {
    table: &'t StorageTable,
    candidates: &'t [String],
    rule: WeightRule,
    /// Availability per storage name seen so far (locations of a request mostly share one).
    memo: RefCell<Vec<(Arc<str>, bool)>>,
}

impl ReadWeights<'_> {
    /// The weight of a location; 0 makes it a miss.
    pub fn weight(&self, location: &Location) -> u32 {
        let wire_type = location.cache_location.r#type;
        match &self.rule {
            WeightRule::FixedPerType => type_weight(wire_type),
            WeightRule::AvailableTypes(types) => {
                let available = types.iter().any(|&(t, up)| t == wire_type && up);
                u32::from(available)
            }
            WeightRule::AvailableCandidates => {
                let name = &location.storage_name;
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

/// The fixed weight of a storage type: NFS 5; 3FS, Mooncake, TairMemPool 3; others 1.
fn type_weight(wire_type: i32) -> u32 {
    match meta::StorageType::try_from(wire_type) {
        Ok(meta::StorageType::StNfs) => 5,
        Ok(
            meta::StorageType::St3fs
            | meta::StorageType::StMooncake
            | meta::StorageType::StTairmempool,
        ) => 3,
        _ => 1,
    }
}

fn already_exists(error: StorageError) -> ManagerError {
    match error {
        StorageError::DuplicateStorage(name) => {
            ManagerError::AlreadyExists(format!("storage {name:?} already exists"))
        }
        other => other.into(),
    }
}

/// The typed config of a wire config, with the admin's validation rules.
fn validated(wire_config: &admin::StorageConfig) -> ManagerResult<StorageConfig> {
    let config =
        wire::from_wire(wire_config).map_err(|e| ManagerError::InvalidArgument(e.to_string()))?;
    config
        .validate()
        .map_err(|e| ManagerError::InvalidArgument(e.to_string()))?;
    Ok(config)
}
