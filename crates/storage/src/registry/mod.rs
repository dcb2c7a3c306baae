//! [`StorageRegistry`]: the registered storages by name, each enabled or disabled by the
//! admin and healthy or not per the latest probe; available = enabled and healthy.
//!
//! Probes run outside the registry lock (a hanging mount blocks no lookup) and a result only
//! updates the entry it was taken for (a storage removed or re-added meanwhile is untouched).
//! With [`StorageRegistry::with_health_probes`] a background thread probes every storage each
//! interval until [`StorageRegistry::stop_health_probes`] or drop, which join it.

mod health;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use self::health::HealthProber;
use crate::{open, DataStorage, StorageConfig, StorageError};

/// One registered storage as [`StorageRegistry::list`] reports it.
#[derive(Debug, Clone)]
pub struct StorageStatus {
    /// The opened backend.
    pub storage: Arc<dyn DataStorage>,
    /// Enabled by the admin (new storages are).
    pub enabled: bool,
    /// The latest probe passed (true until a probe fails).
    pub healthy: bool,
    /// The error of the latest failed probe, while unhealthy.
    pub last_error: Option<String>,
}

impl StorageStatus {
    /// Usable for new allocations: enabled and healthy.
    pub fn is_available(&self) -> bool {
        self.enabled && self.healthy
    }
}

type Entries = BTreeMap<String, StorageStatus>;

/// Told the name and new health of a storage whose probe result flipped: `Ok`, or the
/// failed probe's error.
pub type HealthListener = Box<dyn Fn(&str, Result<(), &str>) + Send + Sync>;

/// The registered storages.
#[derive(Default)]
pub struct StorageRegistry {
    entries: Arc<RwLock<Entries>>,
    prober: Mutex<Option<HealthProber>>,
    listener: Arc<OnceLock<HealthListener>>,
}

impl std::fmt::Debug for StorageRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StorageRegistry")
            .field("entries", &self.entries)
            .finish_non_exhaustive()
    }
}

impl StorageRegistry {
    /// An empty registry without background probes.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty registry whose storages are probed every `interval` by a background thread;
    /// fails only when the thread cannot be started.
    pub fn with_health_probes(interval: Duration) -> Result<Self, StorageError> {
        let registry = Self::new();
        let entries = registry.entries.clone();
        let listener = registry.listener.clone();
        let prober = HealthProber::start(interval, move || probe_all(&entries, &listener))
            .map_err(|source| StorageError::Io {
                path: "<health probe thread>".to_string(),
                source,
            })?;
        *registry.prober_slot() = Some(prober);
        Ok(registry)
    }

    /// Sets who is told when a probe flips a storage's health (once; later calls are
    /// ignored). It runs on the probing thread, after the new state is recorded.
    pub fn set_health_listener(&self, listener: HealthListener) {
        let _ = self.listener.set(listener);
    }

    /// Stops and joins the background probe thread, if any.
    pub fn stop_health_probes(&self) {
        let prober = self.prober_slot().take();
        drop(prober);
    }

    /// Opens `config` and registers it, enabled and healthy. An existing name is refused.
    pub fn add(&self, config: StorageConfig) -> Result<Arc<dyn DataStorage>, StorageError> {
        let name = config.global_unique_name.clone();
        if self.read().contains_key(&name) {
            return Err(StorageError::DuplicateStorage(name));
        }
        self.insert(name, open(config)?, None)
    }

    /// Registers an opened storage under `name`, enabled, healthy unless `failed_probe`
    /// says why not (a storage recovered from a journal whose probe failed: unhealthy until
    /// a health probe passes). An existing name is refused.
    pub fn insert(
        &self,
        name: String,
        storage: Arc<dyn DataStorage>,
        failed_probe: Option<String>,
    ) -> Result<Arc<dyn DataStorage>, StorageError> {
        let status = StorageStatus {
            storage: storage.clone(),
            enabled: true,
            healthy: failed_probe.is_none(),
            last_error: failed_probe,
        };
        match self.write().entry(name) {
            std::collections::btree_map::Entry::Occupied(taken) => {
                Err(StorageError::DuplicateStorage(taken.key().clone()))
            }
            std::collections::btree_map::Entry::Vacant(slot) => {
                slot.insert(status);
                Ok(storage)
            }
        }
    }

    /// Forgets a storage and returns it.
    pub fn remove(&self, name: &str) -> Result<Arc<dyn DataStorage>, StorageError> {
        let removed = self.write().remove(name);
        removed
            .map(|status| status.storage)
            .ok_or_else(|| unknown(name))
    }

    /// Marks a storage enabled.
    pub fn enable(&self, name: &str) -> Result<(), StorageError> {
        self.set_enabled(name, true)
    }

    /// Marks a storage disabled: it stays registered but is not available.
    pub fn disable(&self, name: &str) -> Result<(), StorageError> {
        self.set_enabled(name, false)
    }

    fn set_enabled(&self, name: &str, enabled: bool) -> Result<(), StorageError> {
        let mut entries = self.write();
        let status = entries.get_mut(name).ok_or_else(|| unknown(name))?;
        status.enabled = enabled;
        Ok(())
    }

    /// The backend registered under `name`.
    pub fn get(&self, name: &str) -> Option<Arc<dyn DataStorage>> {
        self.read().get(name).map(|status| status.storage.clone())
    }

    /// Every registered storage, ordered by name (byte order).
    pub fn list(&self) -> Vec<StorageStatus> {
        self.read().values().cloned().collect()
    }

    /// True when `name` is registered, enabled and healthy.
    pub fn is_available(&self, name: &str) -> bool {
        self.read()
            .get(name)
            .is_some_and(StorageStatus::is_available)
    }

    /// Probes every storage once now and records the results.
    pub fn probe_now(&self) {
        probe_all(&self.entries, &self.listener);
    }

    /// Probes one storage now and records the result (nothing for an unknown name).
    pub fn probe(&self, name: &str) {
        let Some(storage) = self.get(name) else {
            return;
        };
        let flipped = record_probe(&self.entries, name, &storage, storage.check_health());
        tell(&self.listener, name, flipped);
    }

    fn read(&self) -> RwLockReadGuard<'_, Entries> {
        self.entries.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Entries> {
        self.entries.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn prober_slot(&self) -> std::sync::MutexGuard<'_, Option<HealthProber>> {
        self.prober.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn unknown(name: &str) -> StorageError {
    StorageError::UnknownStorage(name.to_string())
}

/// Probes each storage without holding the lock, then records each result on its entry if
/// that entry still holds the same backend, and tells `listener` of each flip.
fn probe_all(entries: &RwLock<Entries>, listener: &OnceLock<HealthListener>) {
    let storages: Vec<(String, Arc<dyn DataStorage>)> = {
        let entries = entries.read().unwrap_or_else(PoisonError::into_inner);
        let named = entries.iter();
        named
            .map(|(name, status)| (name.clone(), status.storage.clone()))
            .collect()
    };
    for (name, storage) in storages {
        let outcome = storage.check_health();
        let flipped = record_probe(entries, &name, &storage, outcome);
        tell(listener, &name, flipped);
    }
}

/// Tells `listener` (if set) the new health of `name` when it `flipped`.
fn tell(listener: &OnceLock<HealthListener>, name: &str, flipped: Option<Result<(), String>>) {
    if let (Some(health), Some(listener)) = (flipped, listener.get()) {
        listener(name, health.as_ref().map(|_| ()).map_err(String::as_str));
    }
}

/// Records a probe's outcome on the entry of `name` if it still holds `storage`; the new
/// health (`Ok` or the probe's error) when it changed.
fn record_probe(
    entries: &RwLock<Entries>,
    name: &str,
    storage: &Arc<dyn DataStorage>,
    outcome: Result<(), StorageError>,
) -> Option<Result<(), String>> {
    let mut entries = entries.write().unwrap_or_else(PoisonError::into_inner);
    let status = entries.get_mut(name)?;
    if !Arc::ptr_eq(&status.storage, storage) {
        return None;
    }
    let was = status.healthy;
    status.healthy = outcome.is_ok();
    status.last_error = outcome.err().map(|error| error.to_string());
    let health = match &status.last_error {
        None => Ok(()),
        Some(error) => Err(error.clone()),
    };
    (status.healthy != was).then_some(health)
}

#[cfg(test)]
mod tests;
