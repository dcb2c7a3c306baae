//! Registered storage backends: the storage crate's `StorageRegistry` (open, enable /
//! disable, background health probes) plus the wire config each storage was added with
//! (ListStorage answers it back). Available = enabled by the admin and healthy.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use kvcm_storage::{DataStorage, StorageConfig, StorageError, StorageRegistry};

use super::entry::Location;
use super::error::{ManagerError, ManagerResult};
use super::{read_lock, write_lock};
use crate::proto::{admin, meta, storage as wire};

/// All registered storages.
#[derive(Debug)]
pub struct StorageTable {
    registry: StorageRegistry,
    wire_configs: RwLock<BTreeMap<String, admin::StorageConfig>>,
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
        Ok(())
    }

    /// Replaces a registered storage (remove + add); the old one is restored on failure.
    pub fn update(&self, wire_config: admin::StorageConfig) -> ManagerResult<()> {
        let config = validated(&wire_config)?;
        let name = config.global_unique_name.clone();
        let mut wire_configs = write_lock(&self.wire_configs);
        let old = self.registry.remove(&name)?;
        if let Err(error) = self.registry.add(config) {
            if let Err(restore) = self.registry.add(old.config().clone()) {
                tracing::warn!(%restore, storage = %name, "restoring a storage after a failed update");
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

    /// Read weights for one request on a group with these candidates (wire fact sheet §11).
    pub fn read_weights(&self, candidates: &[String]) -> ManagerResult<ReadWeights<'_>> {
        let available = candidates
            .iter()
            .filter(|name| self.registry.is_available(name))
            .count();
        if available == 0 {
            return Err(ManagerError::NoSpace(
                "none of the group's storages is available".into(),
            ));
        }
        Ok(ReadWeights {
            table: self,
            all_available: available == candidates.len(),
            memo: RefCell::default(),
        })
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

/// Weights that pick among a key's readable replicas, for one request.
pub struct ReadWeights<'t> {
    table: &'t StorageTable,
    all_available: bool,
    /// Availability per storage name seen so far (locations of a request mostly share one).
    memo: RefCell<Vec<(Arc<str>, bool)>>,
}

impl ReadWeights<'_> {
    /// The weight of a location: by backend kind while every candidate storage is available,
    /// otherwise 1 when its own storage is available; 0 (a miss) when it is not.
    pub fn weight(&self, location: &Location) -> u32 {
        if !self.is_available(&location.storage_name) {
            return 0;
        }
        if !self.all_available {
            return 1;
        }
        match meta::StorageType::try_from(location.cache_location.r#type) {
            Ok(meta::StorageType::StNfs) => 5,
            Ok(
                meta::StorageType::St3fs
                | meta::StorageType::StMooncake
                | meta::StorageType::StTairmempool,
            ) => 3,
            _ => 1,
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
