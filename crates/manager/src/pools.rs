//! Memory-pool membership as the manager sees it: nodes join and heartbeat through the
//! pool backend; a node that dies (missed heartbeats, or replaced by its own rejoin) takes
//! its blocks with it, so the manager removes every location on it at once.
//!
//! Ordering: a dead slot refuses new placements and commits first ([`MemPool::holds`] is
//! false from then on, and FinishWriteCache checks it under each key's lock), then its
//! locations are swept. A location committed before the death is therefore found by the
//! sweep's scan, and one committed after it is refused: none survives.
//!
//! A sweep that fails (an index or journal error) is kept and tried again by every later
//! [`Manager::reap_pool_nodes`] until it succeeds, so a dead node's locations never stay
//! SERVING for good; the call that caused it (a join, a reap, a storage update) is not
//! failed for it.

use std::sync::Arc;

use kvcm_index::ScanCursor;
use kvcm_storage::pool::{
    Applied, MemPool, OwnershipUpdate, PoolMembership, PoolNodeJoin, PoolNodeStatus,
};
use kvcm_storage::DataStorage;

use super::entry::{Location, LocationState, StorageHandle};
use super::error::{ManagerError, ManagerResult};
use super::instance::Instance;
use super::Manager;
use crate::sync::lock;

/// Keys per page when sweeping an instance.
const SWEEP_PAGE: usize = 256;

impl Manager {
    /// Adds a node incarnation to pool storage `storage`; an earlier live incarnation of the
    /// same node dies and its blocks are removed before this returns.
    pub fn pool_join(&self, storage: &str, join: PoolNodeJoin) -> ManagerResult<PoolMembership> {
        let backend = self.pool_backend(storage)?;
        let pool = backend.as_pool().ok_or_else(|| not_a_pool(storage))?;
        let (membership, retired) = pool.join(join)?;
        self.after_pool_change(storage, &backend, &retired);
        Ok(membership)
    }

    /// Records a heartbeat of a live node incarnation that applied ownership version
    /// `applied`; answers what it is to apply next when it isolates its tenants
    /// (`kvcm_storage::pool::MemPool::heartbeat`).
    pub fn pool_heartbeat(
        &self,
        storage: &str,
        incarnation: (&str, u64),
        applied: Applied,
    ) -> ManagerResult<Option<OwnershipUpdate>> {
        let backend = self.pool_backend(storage)?;
        let pool = backend.as_pool().ok_or_else(|| not_a_pool(storage))?;
        Ok(pool.heartbeat(incarnation, applied)?)
    }

    /// The tenant number instance `instance_id` has in pool storage `storage` (what an
    /// isolating node knows it by).
    pub fn pool_tenant(&self, storage: &str, instance_id: &str) -> ManagerResult<u32> {
        let backend = self.pool_backend(storage)?;
        let pool = backend.as_pool().ok_or_else(|| not_a_pool(storage))?;
        Ok(pool.tenant(instance_id)?)
    }

    /// Every node incarnation of pool storage `storage`.
    pub fn pool_nodes(&self, storage: &str) -> ManagerResult<Vec<PoolNodeStatus>> {
        let backend = self.pool_backend(storage)?;
        let pool = backend.as_pool().ok_or_else(|| not_a_pool(storage))?;
        Ok(pool.nodes())
    }

    /// Sweeps again the dead slots whose sweep failed, then declares dead the nodes of every
    /// pool that missed their heartbeats and removes their blocks; returns how many died.
    pub fn reap_pool_nodes(&self) -> usize {
        let unswept = std::mem::take(&mut *lock(&self.unswept));
        for Unswept { backend, slots } in unswept {
            if self.sweep_slots(&backend, &slots).is_some() {
                self.keep_unswept(&backend, &slots);
            }
        }
        let mut died = 0;
        for config in self.storages.list() {
            let name = &config.global_unique_name;
            let Ok(backend) = self.pool_backend(name) else {
                continue;
            };
            let Some(pool) = backend.as_pool() else {
                continue;
            };
            let dead = pool.reap();
            died += dead.len();
            self.after_pool_change(name, &backend, &dead);
        }
        died
    }

    /// Pool backends with dead slots whose sweep failed (swept again at each reap).
    #[cfg(test)]
    pub(crate) fn pool_sweeps_pending(&self) -> usize {
        lock(&self.unswept).len()
    }

    /// After a pool storage was replaced (UpdateStorage) or removed: every node incarnation
    /// of its `old` backend dies and its blocks are removed, as if the nodes had died —
    /// nothing more heartbeats to that backend (the nodes join the storage's new backend
    /// afresh, if there is one), and its entries must not go on reading as hits.
    pub(crate) fn retire_pool(&self, old: Option<Arc<dyn DataStorage>>) {
        let Some(old) = old else {
            return;
        };
        let Some(pool) = old.as_pool() else {
            return;
        };
        let dead = pool.retire_all();
        if !dead.is_empty() {
            self.sweep_or_keep(&old, &dead);
        }
    }

    /// The current backend of a registered storage.
    fn pool_backend(&self, storage: &str) -> ManagerResult<Arc<dyn DataStorage>> {
        self.storages
            .backend(storage)
            .ok_or_else(|| ManagerError::NotFound(format!("storage {storage:?} does not exist")))
    }

    /// After joins and deaths: removes the blocks of the `dead` slots, refreshes the
    /// storage's health and republishes availability.
    fn after_pool_change(&self, storage: &str, backend: &Arc<dyn DataStorage>, dead: &[u32]) {
        if !dead.is_empty() {
            self.sweep_or_keep(backend, dead);
        }
        self.storages.probe(storage);
        self.published_storages_changed();
    }

    /// Sweeps `slots` of `backend` (see [`Self::sweep_slots`]); a sweep that fails is kept
    /// for the next reap, with a warning.
    fn sweep_or_keep(&self, backend: &Arc<dyn DataStorage>, slots: &[u32]) {
        if let Some(error) = self.sweep_slots(backend, slots) {
            tracing::warn!(
                %error,
                ?slots,
                "removing the blocks of dead pool nodes failed; tried again at each reap"
            );
            self.keep_unswept(backend, slots);
        }
    }

    /// Removes, in every instance, each location with a part on one of `slots` of `backend`;
    /// when an instance's sweep fails, the others are still swept and the first error is
    /// returned.
    fn sweep_slots(&self, backend: &Arc<dyn DataStorage>, slots: &[u32]) -> Option<ManagerError> {
        let handles = self.storages.handles_of(backend);
        let on_dead = |location: &Location| {
            handles.contains(&location.storage)
                && location.state != LocationState::Deleting
                && location
                    .parts
                    .iter()
                    .any(|part| slots.contains(&MemPool::slot_of(&part.address)))
        };
        let instances: Vec<Arc<Instance>> = self.all_instances();
        let mut failed = None;
        for instance in instances {
            if let Err(error) = self.sweep_instance(&instance, &handles, &on_dead) {
                failed.get_or_insert(error);
            }
        }
        failed
    }

    /// Keeps `slots` of `backend` for the next reap, merged with what is kept for that
    /// backend already (one scan per backend and reap while an outage lasts).
    fn keep_unswept(&self, backend: &Arc<dyn DataStorage>, slots: &[u32]) {
        let mut unswept = lock(&self.unswept);
        match unswept
            .iter_mut()
            .find(|kept| Arc::ptr_eq(&kept.backend, backend))
        {
            Some(kept) => {
                let fresh: Vec<u32> = slots
                    .iter()
                    .copied()
                    .filter(|s| !kept.slots.contains(s))
                    .collect();
                kept.slots.extend(fresh);
            }
            None => unswept.push(Unswept {
                backend: backend.clone(),
                slots: slots.to_vec(),
            }),
        }
    }

    fn sweep_instance(
        &self,
        instance: &Arc<Instance>,
        handles: &[StorageHandle],
        on_dead: &dyn Fn(&Location) -> bool,
    ) -> ManagerResult<()> {
        if handles.is_empty() {
            return Ok(());
        }
        let mut cursor = Some(ScanCursor::START);
        while let Some(position) = cursor {
            let page = instance.index.scan(position, SWEEP_PAGE)?;
            let moved = self.move_locations(
                instance,
                &page.keys,
                LocationState::Deleting,
                &mut |_, l| on_dead(l),
            )?;
            self.delete_later(instance, moved);
            cursor = page.next;
        }
        Ok(())
    }

    /// Whether every part of `location` is on a live node (always, off pools).
    pub(crate) fn location_held(&self, location: &Location) -> bool {
        let incarnations = self.storages.incarnations();
        let Some(incarnation) = incarnations.get(location.storage) else {
            return false;
        };
        match incarnation.backend.as_pool() {
            Some(pool) => location.parts.iter().all(|part| pool.holds(&part.address)),
            None => true,
        }
    }
}

/// Dead slots of a pool backend whose sweep failed (see the module doc).
pub(crate) struct Unswept {
    backend: Arc<dyn DataStorage>,
    slots: Vec<u32>,
}

fn not_a_pool(storage: &str) -> ManagerError {
    ManagerError::Refused(format!("storage {storage:?} is not a memory pool"))
}
