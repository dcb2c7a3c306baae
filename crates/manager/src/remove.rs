//! Deletion requested by clients: RemoveCache (listed keys) and TrimCache (every key of an
//! instance). Locations flip to DELETING synchronously, so reads stop seeing them at once;
//! the deleter frees bytes and index entries afterwards.

use std::sync::{Arc, PoisonError, Weak};
use std::time::Duration;

use kvcm_index::{BlockKey, ScanCursor};

use super::deleter::{self, DeleteJob};
use super::entry::{Location, LocationState};
use super::error::{ManagerError, ManagerResult};
use super::instance::Instance;
use super::Manager;

/// Keys per page when trimming an instance.
const TRIM_PAGE: usize = 64;
/// First and longest wait between tries to delete a removed instance's cache.
const REMOVAL_RETRY: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(30));

/// TrimCache strategies (wire `TrimStrategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrimStrategy {
    /// Delete every block of the instance.
    RemoveAllCache,
    /// Delete metadata only (not supported: would leak every block's bytes).
    RemoveAllMeta,
    /// Delete by time range (not supported: entries carry no timestamps yet).
    Timestamp,
}

impl Manager {
    /// Marks every location of `keys` DELETING and queues their deletion; absent keys are
    /// ignored.
    pub fn remove_cache(&self, instance: &Arc<Instance>, keys: &[BlockKey]) -> ManagerResult<()> {
        let mut keys = keys.to_vec();
        keys.sort_unstable();
        keys.dedup();
        let moved =
            self.move_locations(instance, &keys, LocationState::Deleting, &mut |_, l| {
                l.state != LocationState::Deleting
            })?;
        self.delete_later(instance, moved);
        Ok(())
    }

    /// Hands DELETING locations to the deleter.
    pub(crate) fn delete_later(&self, instance: &Arc<Instance>, moved: Vec<(BlockKey, Location)>) {
        let jobs = moved
            .into_iter()
            .map(|(key, location)| DeleteJob {
                instance: instance.clone(),
                key,
                location,
            })
            .collect();
        deleter::enqueue(&self.deletes, jobs);
    }

    /// Deletes DELETING locations on the calling thread (bytes freed, index entries gone)
    /// before returning.
    pub(crate) fn delete_at_once(
        &self,
        instance: &Arc<Instance>,
        moved: Vec<(BlockKey, Location)>,
    ) {
        let jobs: Vec<DeleteJob> = moved
            .into_iter()
            .map(|(key, location)| DeleteJob {
                instance: instance.clone(),
                key,
                location,
            })
            .collect();
        deleter::delete_now(&jobs, &self.storages, &self.feed);
    }

    /// Applies a trim strategy to an instance.
    pub fn trim_cache(
        &self,
        instance: &Arc<Instance>,
        strategy: TrimStrategy,
    ) -> ManagerResult<()> {
        match strategy {
            TrimStrategy::RemoveAllCache => self.remove_all(instance),
            TrimStrategy::RemoveAllMeta => Err(ManagerError::Unsupported(
                "TS_REMOVE_ALL_META would drop metadata while keeping the bytes; use TS_REMOVE_ALL_CACHE".into(),
            )),
            TrimStrategy::Timestamp => Err(ManagerError::Unsupported(
                "TS_TIMESTAMP: blocks carry no timestamps; use TS_REMOVE_ALL_CACHE".into(),
            )),
        }
    }

    /// Deletes every block of `instance`, which was just removed; on failure keeps it in
    /// `removals_left` for [`retry_removals`], so no block of a removed instance is left
    /// while the process runs.
    pub(crate) fn delete_removed(&self, instance: Arc<Instance>) {
        let deleted = self.remove_all(&instance);
        let mut left = self.removals_left();
        if let Err(error) = deleted {
            tracing::warn!(%error, instance = %instance.id(),
                "deleting a removed instance's cache failed: retrying in the background");
            left.instances.push(instance);
        }
        if left.instances.is_empty() || left.retrying {
            return;
        }
        let manager = self.this.clone();
        let started = std::thread::Builder::new()
            .name("kvcm-removals".into())
            .spawn(move || retry_removals(&manager));
        match started {
            Ok(_) => left.retrying = true,
            Err(error) => tracing::warn!(%error,
                "no thread to retry removals: the next removal starts one"),
        }
    }

    fn removals_left(&self) -> std::sync::MutexGuard<'_, RemovalsLeft> {
        self.removals_left
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a removed instance as unfinished until [`Manager::prune_unfinished`] finds
    /// its index empty.
    pub(crate) fn track_unfinished(&self, instance: Arc<Instance>) {
        self.unfinished_removals_locked().push(instance);
    }

    /// Forgets the unfinished removals that finished (the snapshot thread calls it, so that
    /// a removed instance's memory goes soon after its blocks). Their indexes are asked
    /// outside every lock (a Redis index asks its server).
    pub(crate) fn prune_unfinished(&self) {
        let listed = self.unfinished_removals();
        let finished: Vec<Arc<Instance>> = listed
            .into_iter()
            .filter(|instance| !holds_blocks(instance))
            .collect();
        if !finished.is_empty() {
            self.unfinished_removals_locked()
                .retain(|instance| !finished.iter().any(|done| Arc::ptr_eq(done, instance)));
        }
    }

    /// Removed instances whose index may still hold blocks (pruned by
    /// [`Manager::prune_unfinished`]): their clean-up is not logged, so snapshots record them
    /// as removed with their entries, and a restart deletes what is left
    /// (`journal::recover`). Call it under the instances' lock, as removals track under it.
    pub(crate) fn unfinished_removals(&self) -> Vec<Arc<Instance>> {
        self.unfinished_removals_locked().clone()
    }

    fn unfinished_removals_locked(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Instance>>> {
        self.unfinished_removals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Removed instances whose cache is still being deleted.
    pub fn removals_pending(&self) -> usize {
        self.removals_left().instances.len()
    }

    /// Removes every key of an instance, page by page.
    pub(crate) fn remove_all(&self, instance: &Arc<Instance>) -> ManagerResult<()> {
        let mut cursor = Some(ScanCursor::START);
        while let Some(position) = cursor {
            let page = instance.index.scan(position, TRIM_PAGE)?;
            self.remove_cache(instance, &page.keys)?;
            cursor = page.next;
        }
        Ok(())
    }
}

fn holds_blocks(instance: &Arc<Instance>) -> bool {
    instance.index.len().map_or(true, |len| len > 0)
}

/// Clears `retrying` when the retry thread panics.
struct Retired(Weak<Manager>);

impl Drop for Retired {
    fn drop(&mut self) {
        if let Some(manager) = std::thread::panicking().then(|| self.0.upgrade()).flatten() {
            manager.removals_left().retrying = false;
        }
    }
}

/// Removed instances whose cache is still to be deleted, and whether a thread retries them
/// (at most one does; it ends once none is left).
#[derive(Default)]
pub(crate) struct RemovalsLeft {
    instances: Vec<Arc<Instance>>,
    retrying: bool,
}

/// Tries the removals left again, waiting longer after each round that fails (up to
/// [`REMOVAL_RETRY`]'s longest), until none is left or the manager is gone.
fn retry_removals(manager: &Weak<Manager>) {
    super::background::lower_priority();
    // A panic in a round leaves the flag clear, so the next removal that fails starts
    // another thread.
    let _retired = Retired(manager.clone());
    let (mut wait, longest) = REMOVAL_RETRY;
    loop {
        std::thread::sleep(wait);
        let Some(manager) = manager.upgrade() else {
            return;
        };
        // Listed, not taken: they count as pending until deleted.
        let round = manager.removals_left().instances.clone();
        let deleted: Vec<Arc<Instance>> = round
            .into_iter()
            .filter(|instance| manager.remove_all(instance).is_ok())
            .collect();
        let mut left = manager.removals_left();
        left.instances
            .retain(|instance| !deleted.iter().any(|done| Arc::ptr_eq(done, instance)));
        if left.instances.is_empty() {
            // Under the lock: a removal failing from now on starts a thread of its own.
            left.retrying = false;
            tracing::info!("every removed instance's cache is deleted");
            return;
        }
        wait = (wait * 2).min(longest);
    }
}
