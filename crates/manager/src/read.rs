//! The read paths: GetCacheLocation (three query types, masks, replica choice) and
//! GetCacheMeta. Lookups are one batch `get` on the index; the chosen locations' URIs are
//! rendered by the backends that allocated them. GetCacheLocation also draws among the
//! locations visible reporters hold ([`crate::reports`]), whose URIs are stored as reported.

use std::time::Instant;

use kvcm_index::BlockKey;
use kvcm_storage::{BlockSpec, PartAddress, PartRef};

use super::entry::{Entry, LocationId, LocationRef, LocationState, Part, StorageHandle};
use super::error::{ManagerError, ManagerResult};
use super::instance::Instance;
use super::mask::BlockMask;
use super::query::{self, QueryKind};
use super::reports::{ReportedChoice, ReportedLocation, ReportedSources};
use super::storage_type::StorageType;
use super::storages::{Incarnations, ReadWeights};
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

/// The answer of a GetCacheLocation lookup: one slot per answered position, rendered on
/// demand (URIs are written straight into the caller's buffer, never stored).
pub struct CacheLookup<'a> {
    render: Renderer<'a>,
    /// A hit or a miss.
    slots: Vec<Option<Hit>>,
}

/// The chosen location of one key.
enum Hit {
    /// On one of kvcm's storages: the entry and the position of the location in it.
    Own {
        key: BlockKey,
        entry: Entry,
        position: usize,
    },
    /// A reporter's.
    Reported(ReportedLocation),
}

/// What a draw among a key's readable locations chose.
#[derive(Clone, Copy)]
enum Choice {
    /// The location at this position of the key's entry.
    Own(usize),
    /// A reported location.
    Reported(ReportedChoice),
}

impl CacheLookup<'_> {
    /// Number of answered positions.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether nothing is answered.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Number of answered positions that are hits (GetCacheLocationLen): the prefix length
    /// for prefix match, the readable keys for batch get, the window (or 0) for a sliding
    /// window query.
    pub fn hit_count(&self) -> usize {
        self.slots.iter().filter(|slot| slot.is_some()).count()
    }

    /// The answered locations, in order (a miss is the reference's placeholder: no storage
    /// type, every kept spec with an empty URI).
    pub fn locations(&self) -> impl Iterator<Item = LocationView<'_>> {
        self.slots.iter().map(|slot| {
            let found = slot.as_ref().and_then(|hit| match hit {
                Hit::Own {
                    key,
                    entry,
                    position,
                } => entry
                    .locations()
                    .nth(*position)
                    .map(|location| Found::Own(*key, location)),
                Hit::Reported(location) => Some(Found::Reported(location)),
            });
            LocationView {
                render: &self.render,
                found,
            }
        })
    }

    /// Owned copies of the answered locations.
    #[cfg(test)]
    pub(crate) fn to_locations(&self) -> Vec<BlockLocation> {
        self.locations().map(|view| view.to_owned()).collect()
    }
}

/// One answered location, borrowed from a [`CacheLookup`].
pub struct LocationView<'v> {
    render: &'v Renderer<'v>,
    /// The chosen location; `None` for a miss.
    found: Option<Found<'v>>,
}

/// A location found for a key.
#[derive(Clone, Copy)]
enum Found<'v> {
    /// A stored location of this key.
    Own(BlockKey, LocationRef<'v>),
    /// A reported one.
    Reported(&'v ReportedLocation),
}

impl<'v> LocationView<'v> {
    /// The storage type (`Unspecified` for a miss).
    pub fn storage_type(&self) -> StorageType {
        match &self.found {
            Some(Found::Own(_, location)) => self.render.storage_type(location),
            Some(Found::Reported(location)) => location.storage_type,
            None => StorageType::Unspecified,
        }
    }

    /// How many parts the location has (before any spec-name filter).
    pub fn spec_count(&self) -> usize {
        match &self.found {
            Some(Found::Own(_, location)) => location.parts.len(),
            Some(Found::Reported(location)) => location.parts.len(),
            None => self.render.instance.specs().len(),
        }
    }

    /// The parts, in spec order (filtered by spec name when asked).
    pub fn parts(&self) -> impl Iterator<Item = PartView<'_>> {
        let parts = match self.found {
            Some(Found::Own(key, location)) => PartsOf::Stored {
                key,
                storage: location.storage,
                parts: location.parts.iter().enumerate(),
                checksums: location.checksums,
            },
            Some(Found::Reported(location)) => PartsOf::Reported(location.parts.iter()),
            None => PartsOf::Placeholder(0..self.render.instance.specs().len()),
        };
        parts
            .filter(|(spec, ..)| self.render.keeps(*spec))
            .filter_map(move |(spec, source, checksum)| {
                Some(PartView {
                    render: self.render,
                    spec_index: spec,
                    spec: self.render.instance.specs().get(usize::from(spec))?,
                    checksum,
                    source,
                })
            })
    }

    /// An owned copy, URIs rendered.
    pub fn to_owned(&self) -> BlockLocation {
        BlockLocation {
            storage_type: self.storage_type(),
            spec_count: self.spec_count(),
            parts: self
                .parts()
                .map(|part| {
                    let mut uri = String::new();
                    part.write_uri(&mut uri);
                    RenderedPart {
                        spec: part.spec_index,
                        uri,
                    }
                })
                .collect(),
        }
    }
}

/// The parts of a stored location with its checksums, of a reported location, or the
/// specs of a placeholder.
enum PartsOf<'p> {
    Stored {
        key: BlockKey,
        storage: StorageHandle,
        parts: std::iter::Enumerate<std::slice::Iter<'p, Part>>,
        checksums: &'p [u64],
    },
    Reported(std::slice::Iter<'p, (u16, String)>),
    Placeholder(std::ops::Range<usize>),
}

impl<'p> Iterator for PartsOf<'p> {
    /// Spec index, where the URI comes from, checksum.
    type Item = (u16, PartSource<'p>, Option<u64>);

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            PartsOf::Stored {
                key,
                storage,
                parts,
                checksums,
            } => parts.next().map(|(i, p)| {
                let source = PartSource::Stored(*key, *storage, p.address);
                (p.spec, source, checksums.get(i).copied())
            }),
            PartsOf::Reported(parts) => parts
                .next()
                .map(|(spec, uri)| (*spec, PartSource::Reported(uri), None)),
            PartsOf::Placeholder(specs) => specs
                .next()
                .map(|spec| (spec as u16, PartSource::Placeholder, None)),
        }
    }
}

/// Where a part's URI comes from.
#[derive(Clone, Copy)]
enum PartSource<'p> {
    /// Rendered by the backend of the storage the part is stored on.
    Stored(BlockKey, StorageHandle, PartAddress),
    /// As a reporter reported it.
    Reported(&'p str),
    /// None: a placeholder's URI is empty.
    Placeholder,
}

/// One part of an answered location.
pub struct PartView<'p> {
    render: &'p Renderer<'p>,
    /// Index of the spec in the instance's registration.
    pub spec_index: u16,
    /// The spec as registered.
    pub spec: &'p BlockSpec,
    /// The writer's checksum of the part's bytes, when it gave one.
    pub checksum: Option<u64>,
    /// Where its URI comes from.
    source: PartSource<'p>,
}

impl PartView<'_> {
    /// Appends the part's URI to `out` (nothing for a placeholder or a part whose backend no
    /// longer knows it, whose URI is empty).
    pub fn write_uri(&self, out: &mut String) {
        let (key, storage, address) = match self.source {
            PartSource::Stored(key, storage, address) => (key, storage, address),
            PartSource::Reported(uri) => return out.push_str(uri),
            PartSource::Placeholder => return,
        };
        let reference = PartRef {
            instance_id: self.render.instance.id(),
            key,
            spec: self.spec,
            address,
        };
        if let Some(incarnation) = self.render.incarnations.get(storage) {
            incarnation.backend.write_uri(&reference, out);
        }
    }
}

impl Manager {
    /// Readable locations of `keys` (wire fact sheet §11): one per key for batch and window
    /// queries (misses are placeholders), the leading run of hits for prefix match. The mask
    /// applies to prefix match only; `spec_names`, when non-empty, filters the parts of
    /// every result.
    pub fn lookup_cache_locations<'a>(
        &self,
        instance: &'a Instance,
        kind: QueryKind,
        keys: &[BlockKey],
        mask: &BlockMask,
        spec_names: &[String],
    ) -> ManagerResult<CacheLookup<'a>> {
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
        instance.access().touch(keys);
        let reporters = self.reporters_of(instance);
        let reported = ReportedSources::lock(self, instance, &reporters, Instant::now());
        let hit_at = |(key, entry): (&BlockKey, Option<Entry>)| {
            let mut draw = Draw::default();
            if let Some(entry) = &entry {
                let own = |position, weight| draw.offer(Choice::Own(position), weight);
                offer_readable(entry, &weights, |_| true, own);
            }
            reported.offer(*key, |choice, weight| {
                draw.offer(Choice::Reported(choice), weight)
            });
            match draw.chosen? {
                Choice::Own(position) => Some(Hit::Own {
                    key: *key,
                    entry: entry?,
                    position,
                }),
                Choice::Reported(choice) => {
                    reported.location(instance, *key, choice).map(Hit::Reported)
                }
            }
        };
        let slots = match kind {
            QueryKind::PrefixMatch => {
                let unmasked: Vec<BlockKey> = unmasked_keys(keys, mask);
                let entries = instance.index.get(&unmasked)?;
                let hits = query::prefix_match(unmasked.iter().zip(entries).map(hit_at));
                hits.into_iter().map(Some).collect()
            }
            QueryKind::BatchGet => {
                let entries = instance.index.get(keys)?;
                keys.iter().zip(entries).map(hit_at).collect()
            }
            QueryKind::SlidingWindow { sw_size } => {
                let entries = instance.index.get(keys)?;
                let found = keys.iter().zip(entries).map(hit_at).collect();
                query::sliding_window(found, sw_size)
            }
        };
        let render = Renderer::new(instance, weights.incarnations.clone(), spec_names);
        Ok(CacheLookup { render, slots })
    }

    /// Per key, whether kvcm's own storages hold a readable (SERVING, weight > 0) location
    /// of it: the remote sources of GetHostCacheState. Not an access (nothing is touched);
    /// all false when no candidate storage is available.
    pub(crate) fn own_readable(
        &self,
        instance: &Instance,
        keys: &[BlockKey],
    ) -> ManagerResult<Vec<bool>> {
        self.per_own_entry(instance, keys, |entry, weights| {
            entry.is_some_and(|e| readable(e, weights).is_some())
        })
    }

    /// Per key, the spec indexes of kvcm's own readable locations of it (all of them, for a
    /// hybrid model's GetHostCacheState); as [`Manager::own_readable`] otherwise.
    pub(crate) fn own_readable_specs(
        &self,
        instance: &Instance,
        keys: &[BlockKey],
    ) -> ManagerResult<Vec<Vec<u16>>> {
        self.per_own_entry(instance, keys, |entry, weights| {
            let mut specs = Vec::new();
            if let Some(entry) = entry {
                offer_readable(
                    entry,
                    weights,
                    |_| true,
                    |position, _| {
                        let parts = entry.locations().nth(position).map(|l| l.parts);
                        specs.extend(parts.into_iter().flatten().map(|part| part.spec));
                    },
                );
            }
            specs
        })
    }

    /// `answer` of each key's entry under the group's read weights; the default answer for
    /// every key when no candidate storage is available.
    fn per_own_entry<T: Default + Clone>(
        &self,
        instance: &Instance,
        keys: &[BlockKey],
        answer: impl Fn(Option<&Entry>, &ReadWeights<'_>) -> T,
    ) -> ManagerResult<Vec<T>> {
        let group = self.shared_group(instance.group());
        let candidates = group
            .as_deref()
            .map_or(&[][..], |g| g.storage_candidates.as_slice());
        let Ok(weights) = self.storages.read_weights(candidates) else {
            return Ok(vec![T::default(); keys.len()]);
        };
        let entries = instance.index.get(keys)?;
        let answers = entries.iter().map(|entry| answer(entry.as_ref(), &weights));
        Ok(answers.collect())
    }

    /// Per key, a readable location on a storage of `storage_type` (weighted as GetCacheLocation
    /// draws), its parts rendered, only the spec `spec_names[i]` kept when given
    /// (GetCacheLocationsByBackend's WEIGHTED_RANDOM). All `None` when no candidate storage is
    /// available.
    pub(crate) fn readable_of_type(
        &self,
        instance: &Instance,
        storage_type: StorageType,
        keys: &[BlockKey],
        spec_names: &[String],
    ) -> ManagerResult<Vec<Option<BlockLocation>>> {
        let group = self.shared_group(instance.group());
        let candidates = group
            .as_deref()
            .map_or(&[][..], |g| g.storage_candidates.as_slice());
        let Ok(weights) = self.storages.read_weights(candidates) else {
            return Ok(vec![None; keys.len()]);
        };
        let entries = instance.index.get(keys)?;
        let all_specs = Renderer::new(instance, weights.incarnations.clone(), &[]);
        let mut found = Vec::with_capacity(keys.len());
        for (i, (key, entry)) in keys.iter().zip(entries).enumerate() {
            // A renderer of its own only for a key whose spec is asked.
            let asked = spec_names.get(i).map(std::slice::from_ref);
            let own = asked.map(|kept| Renderer::new(instance, weights.incarnations.clone(), kept));
            let render = own.as_ref().unwrap_or(&all_specs);
            let location = entry.and_then(|entry| {
                let of_type = |l: &LocationRef<'_>| render.storage_type(l) == storage_type;
                let position = readable_where(&entry, &weights, of_type)?;
                let location = entry.locations().nth(position)?;
                let view = LocationView {
                    render,
                    found: Some(Found::Own(*key, location)),
                };
                Some(view.to_owned()).filter(|owned| !owned.parts.is_empty())
            });
            found.push(location);
        }
        Ok(found)
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
        let render = Renderer::new(instance, self.storages.incarnations(), &[]);
        Ok(unmasked
            .iter()
            .zip(entries)
            .map(|(key, entry)| {
                let entry = entry?;
                let location = entry.locations().next()?;
                let view = LocationView {
                    render: &render,
                    found: Some(Found::Own(*key, location)),
                };
                Some(CacheMeta {
                    location: view.to_owned(),
                    id: location.id(),
                    state: location.state,
                })
            })
            .collect())
    }
}

/// The URIs of a stored location's parts that its backend still knows (what deleting it
/// must free).
pub(crate) fn stored_uris(
    instance: &Instance,
    incarnations: Incarnations,
    key: BlockKey,
    location: &LocationRef<'_>,
) -> Vec<String> {
    let render = Renderer::new(instance, incarnations, &[]);
    let view = LocationView {
        render: &render,
        found: Some(Found::Own(key, *location)),
    };
    let mut uris = Vec::with_capacity(location.parts.len());
    for part in view.parts() {
        let mut uri = String::new();
        part.write_uri(&mut uri);
        if !uri.is_empty() {
            uris.push(uri);
        }
    }
    uris
}

/// What rendering the locations of one instance for one request needs.
pub(crate) struct Renderer<'r> {
    instance: &'r Instance,
    incarnations: Incarnations,
    /// Spec indexes to keep (`None` = all).
    kept_specs: Option<Vec<u16>>,
}

impl<'r> Renderer<'r> {
    pub(crate) fn new(
        instance: &'r Instance,
        incarnations: Incarnations,
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

    fn keeps(&self, spec: u16) -> bool {
        self.kept_specs.as_ref().is_none_or(|k| k.contains(&spec))
    }

    fn storage_type(&self, location: &LocationRef<'_>) -> StorageType {
        self.incarnations
            .get(location.storage)
            .map_or(StorageType::Unspecified, |i| i.storage_type)
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

/// The position in `entry` of the readable location chosen for its key: among SERVING
/// locations of positive weight, one drawn at random in proportion to its weight.
fn readable(entry: &Entry, weights: &ReadWeights<'_>) -> Option<usize> {
    readable_where(entry, weights, |_| true)
}

/// As [`readable`], among the locations `wanted` accepts.
pub(crate) fn readable_where(
    entry: &Entry,
    weights: &ReadWeights<'_>,
    wanted: impl Fn(&LocationRef<'_>) -> bool,
) -> Option<usize> {
    let mut draw = Draw::default();
    offer_readable(entry, weights, wanted, |position, weight| {
        draw.offer(position, weight)
    });
    draw.chosen
}

/// Offers each readable location of `entry` that `wanted` accepts — SERVING, of positive
/// weight — to `offer`, with its position and weight.
fn offer_readable(
    entry: &Entry,
    weights: &ReadWeights<'_>,
    wanted: impl Fn(&LocationRef<'_>) -> bool,
    mut offer: impl FnMut(usize, u32),
) {
    for (position, location) in entry.locations().enumerate() {
        if location.state == LocationState::Serving && wanted(&location) {
            let weight = weights.weight(&location);
            if weight > 0 {
                offer(position, weight);
            }
        }
    }
}

/// A weighted draw by reservoir sampling: each offer replaces the choice with probability
/// weight / total weight offered so far, so each is chosen in proportion to its weight.
struct Draw<T> {
    total: u32,
    chosen: Option<T>,
}

impl<T> Default for Draw<T> {
    fn default() -> Self {
        Draw {
            total: 0,
            chosen: None,
        }
    }
}

impl<T> Draw<T> {
    fn offer(&mut self, choice: T, weight: u32) {
        self.total = self.total.saturating_add(weight);
        if fastrand::u32(..self.total) < weight {
            self.chosen = Some(choice);
        }
    }
}
