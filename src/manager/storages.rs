//! Registered storage backends: name → opened backend, its wire config and availability.
//! Readers (the hot path) take a shared lock; admin changes take the exclusive one.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock, RwLockReadGuard};

use kvcm_storage::{DataStorage, StorageConfig, StorageError, StorageKind};

use super::entry::Location;
use super::error::{ManagerError, ManagerResult};
use crate::proto::{admin, storage as wire};

/// Opens a backend from its typed config (injected so that every backend kind is opened by
/// the storage crate, never here).
pub type StorageOpener =
    Arc<dyn Fn(&StorageConfig) -> Result<Arc<dyn DataStorage>, StorageError> + Send + Sync>;

/// One registered storage.
#[derive(Debug, Clone)]
pub struct StorageRecord {
    /// The config as the admin sent it (ListStorage answers it back).
    pub wire: admin::StorageConfig,
    /// The typed config.
    pub config: StorageConfig,
    /// The opened backend.
    pub backend: Arc<dyn DataStorage>,
    /// Whether new writes may go to it and reads may be served from it.
    pub available: bool,
}

/// All registered storages, by name.
pub struct StorageTable {
    opener: StorageOpener,
    records: RwLock<BTreeMap<String, StorageRecord>>,
}

impl std::fmt::Debug for StorageTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StorageTable").finish_non_exhaustive()
    }
}

impl StorageTable {
    /// An empty table that opens backends with `opener`.
    pub fn new(opener: StorageOpener) -> Self {
        StorageTable {
            opener,
            records: RwLock::new(BTreeMap::new()),
        }
    }

    /// A read view for one request.
    pub fn read(&self) -> StorageView<'_> {
        StorageView {
            records: self.records.read().unwrap_or_else(|p| p.into_inner()),
        }
    }

    /// Validates, opens and registers a storage (available at once).
    pub fn add(&self, wire_config: admin::StorageConfig) -> ManagerResult<()> {
        let config = validated(&wire_config)?;
        let mut records = self.records.write().unwrap_or_else(|p| p.into_inner());
        if records.contains_key(&config.global_unique_name) {
            return Err(ManagerError::AlreadyExists(format!(
                "storage {:?} already exists",
                config.global_unique_name
            )));
        }
        let backend = (self.opener)(&config)?;
        let record = StorageRecord {
            wire: wire_config,
            config: config.clone(),
            backend,
            available: true,
        };
        records.insert(config.global_unique_name, record);
        Ok(())
    }

    /// Replaces a registered storage (remove + add); unchanged on failure.
    pub fn update(&self, wire_config: admin::StorageConfig) -> ManagerResult<()> {
        let config = validated(&wire_config)?;
        let mut records = self.records.write().unwrap_or_else(|p| p.into_inner());
        let old = records
            .get(&config.global_unique_name)
            .ok_or_else(|| unknown(&config.global_unique_name))?;
        let available = old.available;
        let backend = (self.opener)(&config)?;
        let record = StorageRecord {
            wire: wire_config,
            config: config.clone(),
            backend,
            available,
        };
        records.insert(config.global_unique_name, record);
        Ok(())
    }

    /// Forgets a storage.
    pub fn remove(&self, name: &str) -> ManagerResult<()> {
        let mut records = self.records.write().unwrap_or_else(|p| p.into_inner());
        records.remove(name).map(drop).ok_or_else(|| unknown(name))
    }

    /// Marks a storage available or not.
    pub fn set_available(&self, name: &str, available: bool) -> ManagerResult<()> {
        let mut records = self.records.write().unwrap_or_else(|p| p.into_inner());
        let record = records.get_mut(name).ok_or_else(|| unknown(name))?;
        record.available = available;
        Ok(())
    }

    /// Every registered storage's wire config, by name.
    pub fn list(&self) -> Vec<admin::StorageConfig> {
        self.read()
            .records
            .values()
            .map(|r| r.wire.clone())
            .collect()
    }

    /// The backend holding a location, if still registered.
    pub fn backend(&self, name: &str) -> Option<Arc<dyn DataStorage>> {
        self.read().records.get(name).map(|r| r.backend.clone())
    }
}

/// A consistent view of the table for the duration of one request.
pub struct StorageView<'a> {
    records: RwLockReadGuard<'a, BTreeMap<String, StorageRecord>>,
}

impl StorageView<'_> {
    /// The record of a registered storage.
    pub fn get(&self, name: &str) -> Option<&StorageRecord> {
        self.records.get(name)
    }

    /// Read weights for one group's candidates (wire fact sheet §11).
    pub fn read_weights<'v>(&'v self, candidates: &'v [String]) -> ManagerResult<ReadWeights<'v>> {
        let available = |name: &String| self.records.get(name).is_some_and(|r| r.available);
        if !candidates.iter().any(available) {
            return Err(ManagerError::NoSpace(
                "none of the group's storages is available".into(),
            ));
        }
        Ok(ReadWeights {
            view: self,
            all_available: candidates.iter().all(available),
        })
    }

    /// The `storage_configs` JSON text of a group's candidates that are registered, by name.
    pub fn storage_configs_json(&self, candidates: &[String]) -> String {
        let mut names: Vec<&String> = candidates
            .iter()
            .filter(|n| self.records.contains_key(*n))
            .collect();
        names.sort();
        names.dedup();
        let items: Vec<serde_json::Value> = names
            .into_iter()
            .filter_map(|name| self.records.get(name))
            .map(|r| wire::storage_config_json(&r.config, r.available))
            .collect();
        serde_json::Value::Array(items).to_string()
    }
}

/// Weights that pick among a key's readable replicas.
pub struct ReadWeights<'v> {
    view: &'v StorageView<'v>,
    all_available: bool,
}

impl ReadWeights<'_> {
    /// The weight of a location: by backend kind while every candidate storage is available,
    /// otherwise 1 when its own storage is available and 0 (a miss) when not.
    pub fn weight(&self, location: &Location) -> u32 {
        let Some(record) = self.view.get(&location.storage_name) else {
            return 0;
        };
        match (self.all_available, record.available) {
            (_, false) => 0,
            (false, true) => 1,
            (true, true) => kind_weight(record.backend.kind()),
        }
    }
}

/// Fixed read preference per backend kind when everything is available.
fn kind_weight(kind: StorageKind) -> u32 {
    match kind {
        StorageKind::Nfs => 5,
        StorageKind::ThreeFs | StorageKind::Mooncake | StorageKind::TairMemPool => 3,
        StorageKind::VcnsThreeFs => 1,
    }
}

fn unknown(name: &str) -> ManagerError {
    ManagerError::NotFound(format!("storage {name:?} does not exist"))
}

/// The typed config of a wire config, with the admin's validation rules.
fn validated(wire_config: &admin::StorageConfig) -> ManagerResult<StorageConfig> {
    if wire_config.global_unique_name.is_empty() {
        return Err(ManagerError::InvalidArgument(
            "{AddStorage: {storage.global_unique_name}}".into(),
        ));
    }
    let config =
        wire::from_wire(wire_config).map_err(|e| ManagerError::InvalidArgument(e.to_string()))?;
    config
        .validate()
        .map_err(|e| ManagerError::InvalidArgument(e.to_string()))?;
    Ok(config)
}
