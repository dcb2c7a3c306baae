//! The deleter: a background thread that frees the bytes of DELETING locations on their
//! storage, then removes each location from the index if it is still DELETING
//! (compare-and-delete); a key left without locations is removed. It takes what is queued
//! together and, per instance, writes the index in background batches (each under one lock
//! group) that share one journal sync.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use kvcm_index::{BatchesStopped, BlockKey, Modify};

use super::entry::{without_deleting, Entry, Location, LocationState};
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

/// An instance's jobs, by key.
type JobsByKey<'a> = BTreeMap<BlockKey, Vec<&'a DeleteJob>>;

/// Jobs the deleter takes at once: it stops taking queued pieces (each at most this many)
/// once it holds this many.
pub(crate) const BATCH: usize = 4096;

/// Most keys of one index batch of background work (the deleter, the reclaimer): an
/// instance's lookups wait for at most this many keys' changes behind its shard locks.
const INDEX_CHUNK: usize = 64;

/// `keys` in index batches of background work: at most [`INDEX_CHUNK`] keys, all under one
/// lock of the index (so a batch blocks the readers of one shard only).
pub(crate) fn background_batches(
    instance: &Instance,
    mut keys: Vec<BlockKey>,
) -> Vec<Vec<BlockKey>> {
    keys.sort_unstable_by_key(|&key| (instance.index.lock_group(key), key));
    let mut batches: Vec<Vec<BlockKey>> = Vec::new();
    let mut group = None;
    for key in keys {
        let here = Some(instance.index.lock_group(key));
        match batches.last_mut() {
            Some(batch) if group == here && batch.len() < INDEX_CHUNK => batch.push(key),
            _ => batches.push(vec![key]),
        }
        group = here;
    }
    batches
}

/// Starts the deleter; it runs until every sender of `jobs` is dropped. It takes what was
/// queued so far together: whole callers' batches, until one pass holds [`BATCH`] jobs.
pub fn spawn_deleter(
    jobs: Receiver<Vec<DeleteJob>>,
    storages: Arc<StorageTable>,
    feed: ChangeFeed,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("kvcm-deleter".into())
        .spawn(move || {
            super::background::lower_priority();
            while let Ok(mut batch) = jobs.recv() {
                while batch.len() < BATCH {
                    let Ok(more) = jobs.try_recv() else { break };
                    batch.extend(more);
                }
                delete_now(&batch, &storages, &feed);
            }
        })
}

/// Queues one caller's jobs for the deleter, in pieces of at most [`BATCH`] that it takes
/// whole (no-op once it stopped).
pub fn enqueue(sender: &Sender<Vec<DeleteJob>>, jobs: Vec<DeleteJob>) {
    let mut jobs = jobs.into_iter();
    loop {
        let piece: Vec<DeleteJob> = jobs.by_ref().take(BATCH).collect();
        if piece.is_empty() || sender.send(piece).is_err() {
            return;
        }
    }
}

/// Frees DELETING locations' bytes and removes them from the index, on this thread: per
/// instance, in [`background_batches`].
pub(crate) fn delete_now(jobs: &[DeleteJob], storages: &StorageTable, feed: &ChangeFeed) {
    for job in jobs {
        free_bytes(job, storages);
    }
    // By the instance object, not its id: a re-registered instance of the same id is
    // another key space.
    let mut by_instance: HashMap<*const Instance, (&Arc<Instance>, JobsByKey<'_>)> = HashMap::new();
    for job in jobs {
        let (_, keys) = by_instance
            .entry(Arc::as_ptr(&job.instance))
            .or_insert_with(|| (&job.instance, BTreeMap::new()));
        keys.entry(job.key).or_default().push(job);
    }
    for (instance, jobs) in by_instance.into_values() {
        let keys: Vec<BlockKey> = jobs.keys().copied().collect();
        remove_from_index(
            instance,
            &background_batches(instance, keys),
            &jobs,
            storages,
            feed,
        );
    }
}

/// Removes the location of each job of `batches` from its key's entry if it is still
/// DELETING (a key left without locations is removed), batch by batch with one wait for the
/// journal after the last, and takes the removed ones out of the usage. A batch that fails
/// is skipped (its locations stay DELETING until a restart recovers them); the others go on.
fn remove_from_index(
    instance: &Arc<Instance>,
    batches: &[Vec<BlockKey>],
    jobs: &JobsByKey<'_>,
    storages: &StorageTable,
    feed: &ChangeFeed,
) {
    // Per key, what its last run of the closure removed (a backend may run it again).
    let removed: RefCell<HashMap<BlockKey, Vec<&DeleteJob>>> = RefCell::default();
    let mut remove = |key, current: Option<&Entry>| {
        let mut removed = removed.borrow_mut();
        let removed_here = removed.entry(key).or_default();
        removed_here.clear();
        let Some(entry) = current else {
            return Modify::Keep;
        };
        let mut rest = entry.to_locations();
        for job in jobs.get(&key).into_iter().flatten() {
            let id = job.location.as_ref().id();
            let Some(remaining) = without_deleting(&rest, id) else {
                continue;
            };
            rest = remaining;
            removed_here.push(job);
            feed.publish(StateChange {
                instance_id: instance.id().clone(),
                key,
                location_id: id,
                from: Some(LocationState::Deleting),
                to: None,
            });
        }
        match (rest.len() == entry.locations().count(), rest.is_empty()) {
            (true, _) => Modify::Keep,
            (false, true) => Modify::Delete,
            (false, false) => Modify::Put(Entry::new(rest)),
        }
    };
    let mut left = batches;
    while !left.is_empty() {
        let applied = match instance.index.read_modify_write_batches(left, &mut remove) {
            Ok(()) => left.len(),
            Err(BatchesStopped { applied, error, .. }) => {
                let keys = left[applied].len();
                tracing::warn!(%error, instance = %instance.id(), keys, "removing deleted locations failed");
                applied
            }
        };
        for key in left[..applied].iter().flatten() {
            let jobs = removed.borrow_mut().remove(key).unwrap_or_default();
            uncount_removed(instance, &jobs, storages);
        }
        left = &left[(applied + 1).min(left.len())..];
    }
}

/// Takes the locations of `jobs`, removed from the index, out of the instance's usage.
fn uncount_removed(instance: &Instance, jobs: &[&DeleteJob], storages: &StorageTable) {
    let incarnations = storages.incarnations();
    for job in jobs {
        let bytes = instance.location_bytes(&job.location.as_ref());
        if let Some(incarnation) = incarnations.get(job.location.storage) {
            instance.usage().add(incarnation.storage_type, -bytes);
        }
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
