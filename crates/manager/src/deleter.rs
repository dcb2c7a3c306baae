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
use super::read::stored_uris;
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
                delete_now(&job, &storages, &feed);
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

/// Frees a DELETING location's bytes and removes it from the index, on this thread.
pub(crate) fn delete_now(job: &DeleteJob, storages: &StorageTable, feed: &ChangeFeed) {
    free_bytes(job, storages);
    let id = job.location.as_ref().id();
    let mut removed = false;
    let result = job.instance.index.read_modify_write(&[job.key], &mut |key,
                                                                        current: Option<
        &Entry,
    >| {
        let Some(rest) = current.and_then(|entry| entry.without_deleting(id)) else {
            return Modify::Keep;
        };
        removed = true;
        feed.publish(StateChange {
            instance_id: job.instance.id().clone(),
            key,
            location_id: id,
            from: Some(LocationState::Deleting),
            to: None,
        });
        if rest.is_empty() {
            Modify::Delete
        } else {
            Modify::Put(Entry::new(rest))
        }
    });
    match result {
        Err(error) => tracing::warn!(%error, key = job.key, "removing a deleted location failed"),
        Ok(()) if removed => {
            let bytes = job.instance.location_bytes(&job.location.as_ref());
            let storage_type = storages
                .incarnations()
                .get(job.location.storage)
                .map(|i| i.storage_type);
            if let Some(storage_type) = storage_type {
                job.instance.usage().add(storage_type, -bytes);
            }
        }
        Ok(()) => {}
    }
}

/// Asks the backend that allocated the location to free its bytes.
fn free_bytes(job: &DeleteJob, storages: &StorageTable) {
    let incarnations = storages.incarnations();
    let location = job.location.as_ref();
    let Some(incarnation) = incarnations.get(location.storage) else {
        return;
    };
    let uris = stored_uris(&job.instance, incarnations.clone(), job.key, &location);
    if let Err(error) = incarnation.backend.delete(&uris) {
        tracing::warn!(%error, key = job.key, "freeing block bytes failed");
    }
}
