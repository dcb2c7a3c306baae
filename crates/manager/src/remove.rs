//! Deletion requested by clients: RemoveCache (listed keys) and TrimCache (every key of an
//! instance). Locations flip to DELETING synchronously, so reads stop seeing them at once;
//! the deleter frees bytes and index entries afterwards.

use std::sync::Arc;

use kvcm_index::{BlockKey, ScanCursor};

use super::deleter::{self, DeleteJob};
use super::entry::{Location, LocationState};
use super::error::{ManagerError, ManagerResult};
use super::instance::Instance;
use super::Manager;

/// Keys per page when trimming an instance.
const TRIM_PAGE: usize = 64;

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
