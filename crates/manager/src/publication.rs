//! What the lookup-table publisher (in the `kvcm` crate) is told, and what it may ask.
//!
//! Ordering rule: a location that leaves SERVING is unpublished before the request that
//! moved it is answered and before its bytes are freed. So [`Publication::keys_changed`] is
//! called synchronously, after the index committed the change and before the manager call
//! returns or queues a deletion; the publisher then reads the keys' current entries itself
//! (under its own lock), so calls for one key may race and still leave the latest state.

use std::sync::Arc;

use kvcm_index::BlockKey;
use kvcm_storage::{PartRef, UriTemplate};

use super::entry::{Entry, LocationState, StorageHandle};
use super::instance::Instance;
use super::storage_type::StorageType;
use super::Manager;

/// Keys per call when a new publisher is told the stored keys.
const PUBLISH_PAGE: usize = 1024;

/// The receiver of publication events.
pub trait Publication: Send + Sync {
    /// Locations of `keys` entered or left SERVING. May block for as long as a lookup
    /// table build (a change that finds its table full waits for the table's growth, which
    /// reads the index and the storages from another thread), so the manager calls it with
    /// no index, registry or storage lock held.
    fn keys_changed(&self, instance: &Instance, keys: &[BlockKey]);
    /// Storages, their availability or groups' candidates may have changed.
    fn storages_changed(&self);
    /// `instance` was removed (a later instance of its id, registered since, is another).
    fn instance_removed(&self, instance: &Instance);
}

/// A SERVING location as the lookup table publishes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServingLocation {
    /// The location's nonce.
    pub nonce: u32,
    /// Its storage incarnation.
    pub storage: StorageHandle,
    /// Its parts in spec order: spec index and URI template (`None`: the backend no longer
    /// knows the part, whose URI is then empty).
    pub parts: Vec<(u16, Option<UriTemplate>)>,
    /// The writer's checksums of its parts: empty, or one per part.
    pub checksums: Vec<u64>,
}

/// How locations of each storage handle read for one instance (wire fact sheet §11).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageWeights {
    /// None of the group's storages is available: every query fails.
    pub no_storage: bool,
    /// Reporters report for the instance: queries must see their locations, which only the
    /// server does.
    pub reported: bool,
    /// Per handle (index = handle): read weight and storage type.
    pub by_handle: Vec<(u32, StorageType)>,
}

impl Manager {
    /// Installs the publisher (once; later calls are ignored and return false) and tells it
    /// every key already stored (a recovered manager holds entries before any publisher).
    pub fn set_publication(&self, publication: Arc<dyn Publication>) -> bool {
        if self.publication.set(publication).is_err() {
            return false;
        }
        for instance in self.all_instances() {
            let mut cursor = Some(kvcm_index::ScanCursor::START);
            while let Some(position) = cursor {
                let page = match instance.index.scan(position, PUBLISH_PAGE) {
                    Ok(page) => page,
                    Err(error) => {
                        let instance = instance.id();
                        tracing::warn!(%error, %instance, "publishing the stored keys");
                        break;
                    }
                };
                self.published_keys_changed(&instance, &page.keys);
                cursor = page.next;
            }
        }
        true
    }

    /// Tells the publisher that `keys` changed (no-op without one). Only the registered
    /// instance of an id publishes: a removed one's clean-up (its table went with its
    /// removal) must not change what readers of a later instance of the same id see.
    pub(crate) fn published_keys_changed(&self, instance: &Instance, keys: &[BlockKey]) {
        let Some(publication) = self.publication.get() else {
            return;
        };
        // No Arc clone: this runs for every committed write batch.
        let registered = crate::sync::read_lock(&self.instances)
            .get(instance.id().as_ref())
            .is_some_and(|kept| std::ptr::eq(Arc::as_ptr(kept), instance));
        if registered && !keys.is_empty() {
            publication.keys_changed(instance, keys);
        }
    }

    /// Tells the publisher that storages changed (no-op without one).
    pub(crate) fn published_storages_changed(&self) {
        if let Some(publication) = self.publication.get() {
            publication.storages_changed();
        }
    }

    /// The SERVING locations of `entry` (of `key`) as published.
    pub fn serving_locations(
        &self,
        instance: &Instance,
        key: BlockKey,
        entry: &Entry,
    ) -> Vec<ServingLocation> {
        let incarnations = self.storages.incarnations();
        let serving = entry
            .locations()
            .filter(|l| l.state == LocationState::Serving);
        serving
            .map(|location| {
                let backend = incarnations.get(location.storage).map(|i| &i.backend);
                let parts = location
                    .parts
                    .iter()
                    .filter_map(|part| {
                        let spec = instance.specs().get(usize::from(part.spec))?;
                        let reference = PartRef {
                            instance_id: instance.id(),
                            key,
                            spec,
                            address: part.address,
                        };
                        let template = backend.and_then(|b| b.uri_template(&reference));
                        Some((part.spec, template))
                    })
                    .collect();
                ServingLocation {
                    nonce: location.nonce,
                    storage: location.storage,
                    parts,
                    checksums: location.checksums.to_vec(),
                }
            })
            .collect()
    }

    /// The read weight of every storage handle for `instance`'s queries.
    pub fn storage_weights(&self, instance: &Instance) -> StorageWeights {
        let reported = self.has_reporters(instance);
        let group = self.shared_group(instance.group());
        let candidates = group
            .as_deref()
            .map_or(&[][..], |g| g.storage_candidates.as_slice());
        // The only refusal: none of the group's storages is available.
        let Ok(weights) = self.storages.read_weights(candidates) else {
            return StorageWeights {
                no_storage: true,
                reported,
                by_handle: Vec::new(),
            };
        };
        let incarnations = weights.incarnations.clone();
        let by_handle = (0..incarnations.len())
            .map(|handle| {
                let handle = StorageHandle(handle as u16);
                let storage_type = incarnations
                    .get(handle)
                    .map_or(StorageType::Unspecified, |i| i.storage_type);
                (weights.handle_weight(handle), storage_type)
            })
            .collect();
        StorageWeights {
            no_storage: false,
            reported,
            by_handle,
        }
    }
}
