//! The read paths: GetCacheLocation (three query types, masks, replica choice) and
//! GetCacheMeta. Lookups are one batch `get` on the index; the chosen locations' URIs are
//! rendered by the backends that allocated them.

use kvcm_index::BlockKey;
use kvcm_storage::PartRef;

use super::entry::{Entry, LocationId, LocationRef, LocationState};
use super::error::{ManagerError, ManagerResult};
use super::instance::Instance;
use super::mask::BlockMask;
use super::query::{self, QueryKind};
use super::storage_type::StorageType;
use super::storages::{render_uri, Incarnation, ReadWeights};
use super::Manager;

/// One part of a location as handed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedPart {
    /// Index of the spec in the instance's registration.
    pub spec: u16,
    /// Its URI (empty when the backend no longer knows the part).
    pub uri: String,
}

/// A location as handed out: its storage type and the URIs of its parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockLocation {
    /// The storage type.
    pub storage_type: StorageType,
    /// How many parts the location has (before any spec-name filter).
    pub spec_count: usize,
    /// The parts, in spec order (filtered by spec name when asked).
    pub parts: Vec<RenderedPart>,
}

/// GetCacheMeta's answer for one key: its first location in any state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheMeta {
    /// The location.
    pub location: BlockLocation,
    /// Its id.
    pub id: LocationId,
    /// Its state.
    pub state: LocationState,
}

impl Manager {
    /// Readable locations of `keys` (wire fact sheet §11), one per key for batch and window
    /// queries (a miss is [`Renderer::miss`]'s placeholder), the leading run of hits for
    /// prefix match. The mask applies to
    /// prefix match only; `spec_names`, when non-empty, filters the parts of every result.
    pub fn get_cache_location(
        &self,
        instance: &Instance,
        kind: QueryKind,
        keys: &[BlockKey],
        mask: &BlockMask,
        spec_names: &[String],
    ) -> ManagerResult<Vec<BlockLocation>> {
        if let QueryKind::SlidingWindow { sw_size } = kind {
            if sw_size == 0 || sw_size > keys.len() {
                return Err(ManagerError::invalid("sw_size"));
            }
        }
        let group = self.shared_group(instance.group());
        let candidates = group
            .as_deref()
            .map_or(&[][..], |g| g.storage_candidates.as_slice());
        let weights = self.storages.read_weights(candidates)?;
        let render = Renderer::new(instance, &weights.incarnations, spec_names);
        let readable_at = |(key, entry): (&BlockKey, &Option<Entry>)| {
            readable(entry.as_ref(), &weights).map(|l| render.location(*key, &l))
        };
        Ok(match kind {
            QueryKind::PrefixMatch => {
                let unmasked: Vec<BlockKey> = unmasked_keys(keys, mask);
                let entries = instance.index.get(&unmasked)?;
                query::prefix_match(unmasked.iter().zip(&entries).map(readable_at))
            }
            QueryKind::BatchGet => {
                let entries = instance.index.get(keys)?;
                let found = keys.iter().zip(&entries).map(readable_at);
                found
                    .map(|hit| hit.unwrap_or_else(|| render.miss()))
                    .collect()
            }
            QueryKind::SlidingWindow { sw_size } => {
                let entries = instance.index.get(keys)?;
                let found = keys.iter().zip(&entries).map(readable_at).collect();
                let window = query::sliding_window(found, sw_size).into_iter();
                window
                    .map(|hit| hit.unwrap_or_else(|| render.miss()))
                    .collect()
            }
        })
    }

    /// The first location (any state) of every unmasked key, in order; `None` when absent.
    pub fn get_cache_meta(
        &self,
        instance: &Instance,
        keys: &[BlockKey],
        mask: &BlockMask,
    ) -> ManagerResult<Vec<Option<CacheMeta>>> {
        let unmasked = unmasked_keys(keys, mask);
        let entries = instance.index.get(&unmasked)?;
        let incarnations = self.storages.incarnations();
        let render = Renderer::new(instance, &incarnations, &[]);
        Ok(unmasked
            .iter()
            .zip(&entries)
            .map(|(key, entry)| {
                let location = entry.as_ref()?.locations().next()?;
                Some(CacheMeta {
                    location: render.location(*key, &location),
                    id: location.id(),
                    state: location.state,
                })
            })
            .collect())
    }
}

/// Renders the locations of one instance for one request.
pub(crate) struct Renderer<'r> {
    instance: &'r Instance,
    incarnations: &'r [Incarnation],
    /// Spec indexes to keep (`None` = all).
    kept_specs: Option<Vec<u16>>,
}

impl<'r> Renderer<'r> {
    pub(crate) fn new(
        instance: &'r Instance,
        incarnations: &'r [Incarnation],
        spec_names: &[String],
    ) -> Self {
        let kept_specs = (!spec_names.is_empty()).then(|| {
            let specs = instance.specs().iter().enumerate();
            specs
                .filter(|(_, spec)| spec_names.contains(&spec.name))
                .map(|(i, _)| i as u16)
                .collect()
        });
        Renderer {
            instance,
            incarnations,
            kept_specs,
        }
    }

    /// The placeholder of a miss: no storage type, every (kept) spec with an empty URI.
    pub(crate) fn miss(&self) -> BlockLocation {
        let specs = 0..self.instance.specs().len() as u16;
        let kept = |spec: &u16| self.kept_specs.as_ref().is_none_or(|k| k.contains(spec));
        BlockLocation {
            storage_type: StorageType::Unspecified,
            spec_count: self.instance.specs().len(),
            parts: specs
                .filter(kept)
                .map(|spec| RenderedPart {
                    spec,
                    uri: String::new(),
                })
                .collect(),
        }
    }

    /// The location of `key` as handed out.
    pub(crate) fn location(&self, key: BlockKey, location: &LocationRef<'_>) -> BlockLocation {
        let storage_type = self
            .incarnations
            .get(usize::from(location.storage.0))
            .map_or(StorageType::Unspecified, |i| i.storage_type);
        let kept = |spec: &u16| self.kept_specs.as_ref().is_none_or(|k| k.contains(spec));
        let specs = self.instance.specs();
        let parts = location
            .parts
            .iter()
            .filter(|part| kept(&part.spec))
            .filter_map(|part| {
                let spec = specs.get(usize::from(part.spec))?;
                let reference = PartRef {
                    instance_id: self.instance.id(),
                    key,
                    spec,
                    address: part.address,
                };
                let uri = render_uri(self.incarnations, location.storage, &reference);
                Some(RenderedPart {
                    spec: part.spec,
                    uri: uri.unwrap_or_default(),
                })
            })
            .collect();
        BlockLocation {
            storage_type,
            spec_count: location.parts.len(),
            parts,
        }
    }
}

/// The keys whose positions are not in the mask, in order.
fn unmasked_keys(keys: &[BlockKey], mask: &BlockMask) -> Vec<BlockKey> {
    keys.iter()
        .enumerate()
        .filter(|(i, _)| !mask.contains(*i))
        .map(|(_, &key)| key)
        .collect()
}

/// The readable location chosen for a key: among SERVING locations of positive weight, one
/// drawn at random in proportion to its weight.
fn readable<'e>(entry: Option<&'e Entry>, weights: &ReadWeights<'_>) -> Option<LocationRef<'e>> {
    let entry = entry?;
    let weighted = entry
        .locations()
        .filter(|l| l.state == LocationState::Serving)
        .map(|l| {
            let weight = weights.weight(&l);
            (l, weight)
        })
        .filter(|(_, w)| *w > 0);
    let mut chosen = None;
    let mut total = 0u32;
    for (location, weight) in weighted {
        // Weighted reservoir sampling: keep this one with probability weight / total.
        total += weight;
        if fastrand::u32(..total) < weight {
            chosen = Some(location);
        }
    }
    chosen
}
