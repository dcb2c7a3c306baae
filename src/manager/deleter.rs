//! The deleter: a background thread that frees the bytes of DELETING locations on their
//! storage, then removes each location from the index if it is still DELETING
//! (compare-and-delete); a key left without locations is removed.

use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use kvcm_index::{BlockKey, Modify};

use super::entry::{Entry, Location, LocationState};
use super::feed::{ChangeFeed, StateChange};
use super::instance::Instance;
use super::storages::StorageTable;

/// One location to delete.
#[derive(Debug)]
pub struct DeleteJob {
    /// The instance whose key space holds it.
    pub instance: Arc<Instance>,
    /// The block key.
    pub key: BlockKey,
    /// The location (already DELETING in the index).
    pub location: Location,
}

/// Starts the deleter; it runs until every sender of `jobs` is dropped.
pub fn spawn_deleter(
    jobs: Receiver<DeleteJob>,
    storages: Arc<StorageTable>,
    feed: ChangeFeed,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("kvcm-deleter".into())
        .spawn(move || {
            for job in jobs {
                delete_one(&job, &storages, &feed);
            }
        })
}

/// Queues jobs for the deleter (no-op once it stopped).
pub fn enqueue(sender: &Sender<DeleteJob>, jobs: Vec<DeleteJob>) {
    for job in jobs {
        if sender.send(job).is_err() {
            return;
        }
    }
}

fn delete_one(job: &DeleteJob, storages: &StorageTable, feed: &ChangeFeed) {
    free_bytes(job, storages);
    let id = &job.location.id;
    let mut removed = false;
    let result = job.instance.index.read_modify_write(&[job.key], &mut |_,
                                                                        current: Option<
        &Entry,
    >| {
        match current.and_then(|entry| entry.without_deleting(id)) {
            None => Modify::Keep,
            Some(rest) if rest.locations.is_empty() => {
                removed = true;
                Modify::Delete
            }
            Some(rest) => {
                removed = true;
                Modify::Put(Arc::new(rest))
            }
        }
    });
    match result {
        Err(error) => tracing::warn!(%error, key = job.key, "removing a deleted location failed"),
        Ok(()) if removed => {
            let cache_location = &job.location.cache_location;
            let bytes = job.instance.location_bytes(cache_location);
            job.instance.usage().add(cache_location.r#type, -bytes);
            feed.publish(StateChange {
                instance_id: job.instance.id().clone(),
                key: job.key,
                location_id: id.clone(),
                from: Some(LocationState::Deleting),
                to: None,
            })
        }
        Ok(()) => {}
    }
}

/// Asks the location's storage (if still registered) to free its bytes.
fn free_bytes(job: &DeleteJob, storages: &StorageTable) {
    let uris: Vec<String> = job
        .location
        .cache_location
        .location_specs
        .iter()
        .map(|s| s.uri.clone())
        .collect();
    if let Some(backend) = storages.backend(&job.location.storage_name) {
        if let Err(error) = backend.delete(&uris) {
            tracing::warn!(%error, key = job.key, "freeing block bytes failed");
        }
    }
}
