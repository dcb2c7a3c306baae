//! One instance's published table: its header memory, its current generation and the
//! generations being retired, kept in step with the manager (single writer: every change
//! runs under this table's lock).
//!
//! Invariants:
//! - the table holds exactly the SERVING locations the index holds, as of the last change
//!   the manager reported (each report re-reads the keys' entries under the lock, so racing
//!   reports converge on the latest state);
//! - a generation that was replaced is retired (readers refuse every block of it) before
//!   the replacing change is reported done, and its registrations are dropped after
//!   [`GRACE`]; its memory is never reused for other table data while registered;
//! - every registration of the table is in the instance's own protection domains (one per
//!   wire, [`InstanceTable::domain`]): only queue pairs created in them can read it.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use kvcm_index::{BlockKey, ScanCursor};
use kvcm_lookup::avail::{Availability, StorageWeight};
use kvcm_lookup::generation::{Generation, Layout, PublishedLocation};
use kvcm_lookup::header::{layout_version, HEADER_BLOCK, WIRES};
use kvcm_lookup::strings::Template;
use kvcm_lookup::{seqlock, FormatError, Full};
use kvcm_manager::{Entry, Instance, Manager};
use kvcm_storage::UriTemplate;
use kvcm_transport::any::{AnyDomain, AnyRegion};
use kvcm_transport::{Access, Domain, HostMemory, Memory, Region};

use super::LookupError;
use crate::service::storage_type_number;

/// Bytes of the header memory (one page holds the header block).
const HEADER_MEMORY: usize = 4096;
const _: () = assert!(HEADER_BLOCK <= HEADER_MEMORY);

/// How long a replaced generation stays registered (readers that fetched the old header
/// finish their reads, see the retired blocks and re-read the header).
pub const GRACE: Duration = Duration::from_secs(2);
/// Keys read from the index per page when a generation is built.
const SCAN_PAGE: usize = 1024;
/// Smallest bucket array.
const MIN_BUCKETS: u64 = 64;
/// Smallest string heap.
const MIN_HEAP: usize = 64 << 10;

/// One generation with its registrations (one per wire).
struct Published {
    generation: Generation<HostMemory>,
    /// (wire index, registration).
    regions: Vec<(usize, AnyRegion)>,
}

/// What the table's lock guards.
struct State {
    current: Published,
    /// The current generation's sizes.
    sizes: Sizes,
    epoch: u64,
    retiring: Vec<(Instant, Published)>,
    availability: Availability,
    /// Whether the table was filled and its header written ([`InstanceTable::ensure_published`]).
    published: bool,
    /// Whether the table was retired (never published again).
    retired: bool,
}

/// The published table of one instance.
pub struct InstanceTable {
    instance_id: String,
    /// (wire index, the instance's protection domain on that wire).
    domains: Vec<(usize, AnyDomain)>,
    header: HostMemory,
    /// (wire index, registration).
    header_regions: Vec<(usize, AnyRegion)>,
    specs: Vec<(String, i64)>,
    block_size: i64,
    incarnation: u64,
    state: Mutex<State>,
}

/// What a reader needs to find a table: per wire, the header's address and rkey.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableAddress {
    /// Header address.
    pub addr: u64,
    /// Header rkey per wire (index as in the header's rkeys).
    pub rkeys: Vec<(usize, u32)>,
    /// Spec layout version.
    pub layout_version: u32,
}

impl std::fmt::Debug for InstanceTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstanceTable")
            .field("instance_id", &self.instance_id)
            .finish_non_exhaustive()
    }
}

impl InstanceTable {
    /// Builds the table of `instance` from its index and registers it in new protection
    /// domains of `wires` (`(wire index, domain)`).
    pub fn create(
        manager: &Manager,
        instance: &Instance,
        wires: &[(usize, AnyDomain)],
        incarnation: u64,
    ) -> Result<InstanceTable, LookupError> {
        let domains = wires
            .iter()
            .map(|(wire, domain)| Ok((*wire, domain.new_pd()?)))
            .collect::<Result<Vec<_>, LookupError>>()?;
        let domains = domains.as_slice();
        let specs: Vec<(String, i64)> = instance
            .specs()
            .iter()
            .map(|s| (s.name.clone(), s.size))
            .collect();
        let anchor = &domains.first().ok_or(LookupError::NoWire)?.1;
        let header = anchor.alloc(HEADER_MEMORY)?;
        let header_regions = register_all(domains, &header, HEADER_MEMORY)?;
        let availability = availability(manager, instance);
        let sizes = Sizes::for_keys(specs.len(), 0, availability.storages.len())?;
        let current = empty(domains, &specs, &availability, sizes)?;
        Ok(InstanceTable {
            instance_id: instance.id().to_string(),
            domains: domains.to_vec(),
            header,
            header_regions,
            block_size: i64::from(instance.info().block_size),
            specs,
            incarnation,
            state: Mutex::new(State {
                current,
                sizes,
                epoch: 1,
                retiring: Vec::new(),
                availability,
                published: false,
                retired: false,
            }),
        })
    }

    /// Fills the table from the index and writes its header, once (later calls return at
    /// once; a concurrent call waits for the first). Until then the header is not valid, so
    /// no reader can use the table, and changes reported meanwhile are left to the fill
    /// (which reads the index after them).
    pub fn ensure_published(
        &self,
        manager: &Manager,
        instance: &Instance,
    ) -> Result<(), LookupError> {
        let mut state = self.lock();
        if state.retired {
            return Err(LookupError::UnknownInstance(self.instance_id.clone()));
        }
        if state.published {
            return Ok(());
        }
        state.availability = availability(manager, instance);
        let keys = instance.index.len()?;
        let handles = state.availability.storages.len();
        let sizes = Sizes::for_keys(self.specs.len(), keys, handles)?;
        let (current, sizes) = build(
            manager,
            instance,
            &self.domains,
            &self.specs,
            &state.availability,
            sizes,
        )?;
        state.current = current;
        state.sizes = sizes;
        self.write_header(&state, true)?;
        state.published = true;
        Ok(())
    }

    /// The instance's protection domain on `wire`, where its readers' queue pairs are
    /// created.
    pub fn domain(&self, wire: usize) -> Option<&AnyDomain> {
        self.domains
            .iter()
            .find_map(|(w, domain)| (*w == wire).then_some(domain))
    }

    /// Where readers find the table.
    pub fn address(&self) -> TableAddress {
        TableAddress {
            addr: self.header.addr(),
            rkeys: self
                .header_regions
                .iter()
                .map(|(wire, region)| (*wire, region.rkey()))
                .collect(),
            layout_version: layout_version(&self.specs),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Re-publishes `keys` from their current entries.
    pub fn refresh(
        &self,
        manager: &Manager,
        instance: &Instance,
        keys: &[BlockKey],
    ) -> Result<(), LookupError> {
        let mut state = self.lock();
        if !state.published {
            return Ok(()); // the fill reads these keys later
        }
        let entries = instance.index.get(keys)?;
        for (key, entry) in keys.iter().zip(entries) {
            let locations = entry.map_or_else(Vec::new, |e| published(manager, instance, *key, &e));
            match state.current.generation.publish(*key, &locations) {
                Ok(()) => {}
                // A rebuild reads every key's current entry, these included.
                Err(FormatError::Full(full)) => {
                    return self.rebuild(&mut state, manager, instance, full)
                }
                Err(other) => return Err(other.into()),
            }
        }
        self.expire_retired(&mut state);
        Ok(())
    }

    /// Re-publishes the availability block if the weights changed.
    pub fn refresh_availability(
        &self,
        manager: &Manager,
        instance: &Instance,
    ) -> Result<(), LookupError> {
        let mut state = self.lock();
        let availability = availability(manager, instance);
        if !state.published || availability == state.availability {
            return Ok(());
        }
        state.availability = availability.clone();
        match state.current.generation.set_availability(&availability) {
            Ok(()) => Ok(()),
            Err(FormatError::Full(full)) => self.rebuild(&mut state, manager, instance, full),
            Err(other) => Err(other.into()),
        }
    }

    /// Replaces the current generation, in which `full` ran out, by one built from the
    /// index with room for it (a heap that is mostly dead is compacted at its size); flips
    /// the header and retires the old generation.
    fn rebuild(
        &self,
        state: &mut State,
        manager: &Manager,
        instance: &Instance,
        full: Full,
    ) -> Result<(), LookupError> {
        let (used, dead) = state.current.generation.heap_bytes();
        let sizes = if full == Full::Heap && dead * 2 >= used {
            state.sizes
        } else {
            state.sizes.grown(full)
        };
        let availability = &state.availability;
        let (next, sizes) = build(
            manager,
            instance,
            &self.domains,
            &self.specs,
            availability,
            sizes,
        )?;
        state.sizes = sizes;
        let old = std::mem::replace(&mut state.current, next);
        state.epoch += 1;
        self.write_header(state, false)?;
        old.generation.retire()?;
        state.retiring.push((Instant::now() + GRACE, old));
        tracing::debug!(instance = %self.instance_id, epoch = state.epoch, "lookup table rebuilt");
        Ok(())
    }

    /// Drops the registrations of generations whose grace passed.
    fn expire_retired(&self, state: &mut State) {
        let now = Instant::now();
        state.retiring.retain(|(deadline, _)| *deadline > now);
    }

    fn write_header(&self, state: &State, fresh: bool) -> Result<(), LookupError> {
        let mut rkeys = [0u32; WIRES];
        for (wire, region) in &state.current.regions {
            rkeys[*wire] = region.rkey();
        }
        let header = state.current.generation.header(
            state.epoch,
            self.incarnation,
            layout_version(&self.specs),
            self.block_size,
            rkeys,
        );
        if fresh {
            self.header.write(0, &seqlock::seal(header.to_body(), 0))?;
        } else {
            seqlock::rewrite(&self.header, 0, header.to_body())?;
        }
        Ok(())
    }

    /// Retires the whole table (the instance was removed): readers refuse it from now on.
    pub fn retire(&self) -> Result<(), LookupError> {
        let mut state = self.lock();
        state.retired = true;
        state.published = false;
        seqlock::retire(&self.header, 0, HEADER_BLOCK)?;
        state.current.generation.retire()?;
        Ok(())
    }
}

/// Registers `len` bytes of `memory` for remote reads on every domain.
fn register_all(
    domains: &[(usize, AnyDomain)],
    memory: &HostMemory,
    len: usize,
) -> Result<Vec<(usize, AnyRegion)>, LookupError> {
    let register = |(wire, domain): &(usize, AnyDomain)| {
        let region = domain.register(memory, 0, len, Access::REMOTE_READ)?;
        Ok((*wire, region))
    };
    domains.iter().map(register).collect()
}

/// How large a generation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sizes {
    /// Records per slot: the spec count, doubled once checksums are published.
    slot_records: usize,
    buckets: u64,
    heap: usize,
    handles: usize,
}

impl Sizes {
    /// First sizes for about `keys` keys: buckets at most half full on average, heap room
    /// for 32 bytes per part (file-tier parts share one template per file; Mooncake parts
    /// have one each, and grow the heap).
    fn for_keys(specs: usize, keys: u64, handles: usize) -> Result<Sizes, LookupError> {
        let probe = Layout::new(specs, 2, 0, 0)?;
        let per_bucket = probe.geometry.slots_per_bucket as u64;
        Ok(Sizes {
            slot_records: specs,
            buckets: (2 * keys).div_ceil(per_bucket).max(MIN_BUCKETS),
            heap: (keys as usize).saturating_mul(32 * specs).max(MIN_HEAP),
            handles: (handles + 16).next_power_of_two(),
        })
    }

    /// Twice the room for what ran out.
    fn grown(self, full: Full) -> Sizes {
        match full {
            Full::Buckets => Sizes {
                buckets: self.buckets * 2,
                ..self
            },
            Full::Heap => Sizes {
                heap: self.heap * 2,
                ..self
            },
            Full::Handles => Sizes {
                handles: self.handles * 2,
                ..self
            },
            // Room for a checksum per part (the generation refuses with `Parts` only while
            // twice the records still fit a slot).
            Full::Parts => Sizes {
                slot_records: (self.slot_records * 2).min(kvcm_lookup::header::MAX_PARTS),
                ..self
            },
        }
    }

    fn layout(&self) -> Result<Layout, LookupError> {
        Ok(Layout::new(
            self.slot_records,
            self.buckets,
            self.handles,
            self.heap,
        )?)
    }
}

/// An empty generation of `sizes`, registered (the placeholder until the first fill).
fn empty(
    domains: &[(usize, AnyDomain)],
    specs: &[(String, i64)],
    availability: &Availability,
    sizes: Sizes,
) -> Result<Published, LookupError> {
    let layout = sizes.layout()?;
    let anchor = &domains.first().ok_or(LookupError::NoWire)?.1;
    let len = layout.total_len().next_multiple_of(4096);
    let memory = anchor.alloc(len)?;
    let generation = Generation::create(memory, layout, fastrand::u64(..), specs, availability)?;
    let regions = register_all(domains, generation.memory(), len)?;
    Ok(Published {
        generation,
        regions,
    })
}

/// A generation of `sizes` (grown while something runs out), filled from the index.
fn build(
    manager: &Manager,
    instance: &Instance,
    domains: &[(usize, AnyDomain)],
    specs: &[(String, i64)],
    availability: &Availability,
    mut sizes: Sizes,
) -> Result<(Published, Sizes), LookupError> {
    loop {
        let layout = sizes.layout()?;
        let anchor = &domains.first().ok_or(LookupError::NoWire)?.1;
        let len = layout.total_len().next_multiple_of(4096);
        let memory = anchor.alloc(len)?;
        let created = Generation::create(memory, layout, fastrand::u64(..), specs, availability);
        let mut generation = match created {
            Ok(generation) => generation,
            Err(FormatError::Full(full)) => {
                sizes = sizes.grown(full);
                continue;
            }
            Err(other) => return Err(other.into()),
        };
        match fill(&mut generation, manager, instance) {
            Ok(()) => {
                let regions = register_all(domains, generation.memory(), len)?;
                return Ok((
                    Published {
                        generation,
                        regions,
                    },
                    sizes,
                ));
            }
            Err(LookupError::Format(FormatError::Full(full))) => sizes = sizes.grown(full),
            Err(other) => return Err(other),
        }
    }
}

/// Publishes every key of the instance's index.
fn fill(
    generation: &mut Generation<HostMemory>,
    manager: &Manager,
    instance: &Instance,
) -> Result<(), LookupError> {
    let mut cursor = Some(ScanCursor::START);
    while let Some(position) = cursor {
        let page = instance.index.scan(position, SCAN_PAGE)?;
        let entries = instance.index.get(&page.keys)?;
        for (key, entry) in page.keys.iter().zip(entries) {
            let Some(entry) = entry else { continue };
            let locations = published(manager, instance, *key, &entry);
            if !locations.is_empty() {
                generation.publish(*key, &locations)?;
            }
        }
        cursor = page.next;
    }
    Ok(())
}

/// The table's form of the SERVING locations of `key`'s entry (templates moved, not copied).
fn published(
    manager: &Manager,
    instance: &Instance,
    key: BlockKey,
    entry: &Entry,
) -> Vec<PublishedLocation> {
    let part = |(spec, template): (u16, Option<UriTemplate>)| {
        // A part the backend no longer knows keeps its spec and renders empty.
        let UriTemplate {
            head,
            block,
            block_shift,
            tail,
        } = template.unwrap_or_else(|| UriTemplate::whole(String::new()));
        let has_block = block.is_some();
        (
            Template {
                spec,
                head,
                has_block,
                block_shift,
                tail,
            },
            block.unwrap_or(0),
        )
    };
    manager
        .serving_locations(instance, key, entry)
        .into_iter()
        .map(|location| PublishedLocation {
            nonce: location.nonce,
            storage: location.storage.0,
            parts: location.parts.into_iter().map(part).collect(),
            checksums: location.checksums,
        })
        .collect()
}

/// The instance's availability block.
fn availability(manager: &Manager, instance: &Instance) -> Availability {
    let weights = manager.storage_weights(instance);
    Availability {
        no_storage: weights.no_storage,
        reported: weights.reported,
        storages: weights
            .by_handle
            .iter()
            .map(|(weight, storage_type)| StorageWeight {
                weight: (*weight).min(255) as u8,
                storage_type: storage_type_number(*storage_type) as u8,
            })
            .collect(),
    }
}
