//! One instance's published table: its header memory, its current generation and the
//! generations being retired, kept in step with the manager (every change to a generation
//! is made under this table's lock; a change that waits for a growth releases the lock
//! meanwhile and then republishes its keys from the index, so nothing it did before the
//! wait is relied on).
//!
//! Growth: once 40% of the current generation's slots are in use ([`GROW_AT_SLOTS_PERCENT`];
//! 30% from the first time the table's writes outran a growth on,
//! [`EAGER_GROW_AT_SLOTS_PERCENT`]), or three quarters of its string heap
//! ([`GROW_AT_HEAP_PERCENT`]), the change that noticed it hands out a [`Growth`], and a
//! background thread builds the next, larger generation from the index without the lock
//! ([`InstanceTable::build_grown`]) while changes keep going to the current one and are
//! noted; [`InstanceTable::install_grown`] then republishes the noted keys into the new
//! generation from their entries of that moment and flips to it under the lock. A change
//! that runs out of room while a growth is under way waits for that growth's end (its keys
//! are noted, so the install publishes them) and then publishes into the grown generation:
//! it waits for the rest of one build, never does a second one beside it. A generation is
//! rebuilt inside a call only when a change runs out with no growth under way (one change
//! jumped past the threshold, or the growth ended without installing), when the build it
//! waits for stops advancing for [`GROWTH_STALL`], or when a new availability block does
//! not fit ([`InstanceTable::refresh_availability`]); such a rebuild supersedes the growth
//! under way, whose build then stops.
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

use std::collections::HashSet;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, TryLockError, Weak};
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
/// Percent of a generation's slots in use at which it grows in the background (with two
/// candidate buckets of two slots, the first key that finds both full comes at 46–60%).
const GROW_AT_SLOTS_PERCENT: u64 = 40;
/// The same for a table whose writes once outran a growth (a change ran out and waited):
/// more room to fill while the next generation is built.
const EAGER_GROW_AT_SLOTS_PERCENT: u64 = 30;
/// Percent of a generation's string heap written at which it grows in the background.
const GROW_AT_HEAP_PERCENT: usize = 75;
/// Longest a change that ran out waits for the growth under way while its build does not
/// advance by one page of keys (~3.5 ms of work); past it the change rebuilds in its call (a
/// guard against a stuck build: every growth ends by installing, being superseded or being
/// abandoned, and wakes its waiters). The table keeps it in [`InstanceTable::growth_stall`]
/// (a test shortens it).
const GROWTH_STALL: Duration = Duration::from_secs(10);

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
    /// The growth under way, if any.
    growing: Option<Growing>,
    /// Growths handed out so far (the last one's id).
    growths: u64,
    /// Generations built in a change's call because the current one ran out.
    rebuilt_in_call: u64,
    /// Changes that ran out and waited for the growth under way.
    waited_for_growth: u64,
    /// Their time waiting, in all.
    waited: Duration,
    /// Growths whose generation became the current one.
    growths_installed: u64,
    /// Growths whose generation ran out while catching up at install (a generation was
    /// built from the index there, under the lock).
    rebuilt_at_install: u64,
}

/// A growth under way: which one, the keys changed since it began, and how far its build
/// got.
struct Growing {
    id: u64,
    changed: HashSet<BlockKey>,
    /// Pages of keys its build has started.
    pages: u64,
}

impl State {
    /// Percent of slots in use at which the current generation grows:
    /// [`GROW_AT_SLOTS_PERCENT`], or [`EAGER_GROW_AT_SLOTS_PERCENT`] once a change waited.
    fn grow_at_slots_percent(&self) -> u64 {
        if self.waited_for_growth > 0 {
            EAGER_GROW_AT_SLOTS_PERCENT
        } else {
            GROW_AT_SLOTS_PERCENT
        }
    }

    /// How far growth `id` got, while it is the one under way.
    fn progress_of(&self, id: u64) -> Option<u64> {
        self.growing
            .as_ref()
            .filter(|g| g.id == id)
            .map(|g| g.pages)
    }

    /// Counts a step of growth `id`'s build (a page of keys, the end of its fill); false
    /// when that growth is no longer under way (the build stops).
    fn advance(&mut self, id: u64) -> bool {
        let growing = self.growing.as_mut().filter(|g| g.id == id);
        growing.map(|g| g.pages += 1).is_some()
    }
}

/// A growth to run outside the table's lock: build the next generation with
/// [`InstanceTable::build_grown`], then install it with [`InstanceTable::install_grown`].
#[derive(Debug, Clone, Copy)]
pub struct Growth {
    id: u64,
    sizes: Sizes,
}

/// A next generation built by [`InstanceTable::build_grown`], not yet installed.
pub struct Grown {
    id: u64,
    next: Published,
    sizes: Sizes,
    /// The availability it was built with.
    availability: Availability,
}

/// The published table of one instance.
pub struct InstanceTable {
    instance_id: String,
    /// The instance object it was built for: one of a later registration of the same id
    /// is another table's (see [`InstanceTable::is_of`]).
    instance: Weak<Instance>,
    /// (wire index, the instance's protection domain on that wire).
    domains: Vec<(usize, AnyDomain)>,
    header: HostMemory,
    /// (wire index, registration).
    header_regions: Vec<(usize, AnyRegion)>,
    specs: Vec<(String, i64)>,
    block_size: i64,
    incarnation: u64,
    state: Mutex<State>,
    /// Signalled when the growth under way ends (installed, superseded, abandoned).
    growth_ended: Condvar,
    /// [`GROWTH_STALL`].
    growth_stall: Duration,
    /// The figures [`InstanceTable::stats`] answered last.
    last_stats: Mutex<TableStats>,
}

/// A table's figures for the server's metrics (`kvcm_lookup_table_*`, docs/lookup-table.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableStats {
    /// The header's epoch (one more per generation replaced).
    pub epoch: u64,
    /// Bytes of the current generation.
    pub bytes: u64,
    /// Slots of the current generation, and those in use.
    pub slots: u64,
    /// See `slots`.
    pub slots_used: u64,
    /// Background growths begun, those installed, and those whose generation ran out while
    /// catching up at install and was replaced by one built there (the others were
    /// superseded by a rebuild in a call, or abandoned).
    pub growths_started: u64,
    /// See `growths_started`.
    pub growths_installed: u64,
    /// See `growths_started`.
    pub rebuilt_at_install: u64,
    /// Generations built inside a write call because the current one ran out.
    pub rebuilt_in_call: u64,
    /// Changes that ran out and waited for the growth under way, and their time waiting.
    pub waited_for_growth: u64,
    /// See `waited_for_growth`.
    pub waited: Duration,
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
        instance: &Arc<Instance>,
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
            instance: Arc::downgrade(instance),
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
                growing: None,
                growths: 0,
                rebuilt_in_call: 0,
                waited_for_growth: 0,
                waited: Duration::ZERO,
                growths_installed: 0,
                rebuilt_at_install: 0,
            }),
            last_stats: Mutex::new(TableStats::default()),
            growth_ended: Condvar::new(),
            growth_stall: GROWTH_STALL,
        })
    }

    /// Whether this is the table of `instance` (the object, not only its id): a removed
    /// instance's changes must not reach the table of a later instance of its id, nor may a
    /// later instance be answered from a removed one's table. (The weak reference keeps the
    /// allocation, so no other instance can take its address while the table lives.)
    pub fn is_of(&self, instance: &Instance) -> bool {
        std::ptr::eq(self.instance.as_ptr(), instance)
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
            &|| true,
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

    /// What the table reports in the server's metrics. Never waits for a build: while the
    /// table's lock is held (a rebuild inside a call holds it for O(keys)), the figures of
    /// the previous look are answered (counters never go back).
    pub fn stats(&self) -> TableStats {
        let mut last = self
            .last_stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let state = match self.state.try_lock() {
            Ok(state) => state,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return *last,
        };
        let generation = &state.current.generation;
        let layout = generation.layout();
        *last = TableStats {
            epoch: state.epoch,
            bytes: layout.total_len() as u64,
            slots: layout.bucket_count * layout.geometry.slots_per_bucket as u64,
            slots_used: generation.slots_used(),
            growths_started: state.growths,
            growths_installed: state.growths_installed,
            rebuilt_in_call: state.rebuilt_in_call,
            rebuilt_at_install: state.rebuilt_at_install,
            waited_for_growth: state.waited_for_growth,
            waited: state.waited,
        };
        *last
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Re-publishes `keys` from their current entries; a [`Growth`] to run when this change
    /// found the generation nearly full (whoever gets it must build and install it, or
    /// abandon it: changes that run out wait for it).
    #[must_use = "a growth handed out must be installed or abandoned"]
    pub fn refresh(
        &self,
        manager: &Manager,
        instance: &Instance,
        keys: &[BlockKey],
    ) -> Result<Option<Growth>, LookupError> {
        let mut state = self.lock();
        loop {
            if !state.published {
                return Ok(None); // the fill reads these keys later, or the table retired
            }
            if let Some(growing) = state.growing.as_mut() {
                growing.changed.extend(keys.iter().copied());
            }
            let full = match republish(&mut state.current.generation, manager, instance, keys) {
                Ok(()) => break,
                Err(LookupError::Format(FormatError::Full(full))) => full,
                Err(other) => return Err(other),
            };
            // The growth under way publishes these keys (noted above) at its install; then
            // they are published again into the grown generation. Writes outran a build:
            // this table's next growths start earlier.
            if let Some(id) = state.growing.as_ref().map(|g| g.id) {
                state.waited_for_growth += 1;
                let waits = state.waited_for_growth;
                tracing::debug!(instance = %self.instance_id, waits,
                    "lookup table ran out: waiting for its growth");
                let began = Instant::now();
                let (guard, ended) = self.wait_for_growth(state, id);
                state = guard;
                state.waited += began.elapsed();
                if ended {
                    continue;
                }
            }
            // A rebuild reads every key's current entry, these included.
            state.rebuilt_in_call += 1;
            let rebuilt_in_call = state.rebuilt_in_call;
            tracing::debug!(instance = %self.instance_id, ?full, rebuilt_in_call,
                "lookup table ran out: rebuilt in the call");
            self.rebuild(&mut state, manager, instance, full)?;
            return Ok(None);
        }
        self.expire_retired(&mut state);
        Ok(growth_due(&mut state))
    }

    /// Waits, with the lock released meanwhile, until growth `id` ended; false when its
    /// build stopped advancing (not one page of keys in [`GROWTH_STALL`]).
    fn wait_for_growth<'a>(
        &'a self,
        mut state: MutexGuard<'a, State>,
        id: u64,
    ) -> (MutexGuard<'a, State>, bool) {
        while let Some(before) = state.progress_of(id) {
            state = self
                .growth_ended
                .wait_timeout_while(state, self.growth_stall, |s| s.progress_of(id).is_some())
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            if state.progress_of(id) == Some(before) {
                tracing::warn!(instance = %self.instance_id, stall = ?self.growth_stall,
                    "lookup table growth stopped advancing: rebuilding in the call");
                return (state, false);
            }
        }
        (state, true)
    }

    /// Ends the growth under way, if any, and wakes the changes waiting for it.
    fn end_growth(&self, state: &mut State) {
        if state.growing.take().is_some() {
            self.growth_ended.notify_all();
        }
    }

    /// Builds the next generation of `growth` from the index, without the table's lock;
    /// stops with [`LookupError::GrowthSuperseded`] once the growth is no longer under way
    /// (looked at before each page of keys and after the last).
    pub fn build_grown(
        &self,
        manager: &Manager,
        instance: &Instance,
        growth: &Growth,
    ) -> Result<Grown, LookupError> {
        let availability = self.lock().availability.clone();
        let under_way = || self.lock().advance(growth.id);
        let (next, sizes) = build(
            manager,
            instance,
            &self.domains,
            &self.specs,
            &availability,
            growth.sizes,
            &under_way,
        )?;
        Ok(Grown {
            id: growth.id,
            next,
            sizes,
            availability,
        })
    }

    /// Brings `grown` up to date (the keys changed during its build, the availability) and
    /// makes it the current generation; false when its growth was superseded (a rebuild in a
    /// call, the table retired) and it was dropped. On an error the table is retired (the
    /// caller drops it).
    pub fn install_grown(
        &self,
        manager: &Manager,
        instance: &Instance,
        grown: Grown,
    ) -> Result<bool, LookupError> {
        let mut state = self.lock();
        let Some(growing) = state.growing.take_if(|g| g.id == grown.id) else {
            return Ok(false);
        };
        // Waiters wake once the lock is released below, whichever way this goes.
        self.growth_ended.notify_all();
        let Grown {
            mut next,
            sizes,
            availability,
            ..
        } = grown;
        let changed: Vec<BlockKey> = growing.changed.into_iter().collect();
        let mut caught_up = republish(&mut next.generation, manager, instance, &changed);
        if caught_up.is_ok() && availability != state.availability {
            caught_up = next
                .generation
                .set_availability(&state.availability)
                .map_err(LookupError::from);
        }
        let installed = match caught_up {
            Ok(()) => self
                .flip(&mut state, next, sizes)
                .map(|()| state.growths_installed += 1),
            Err(LookupError::Format(FormatError::Full(full))) => {
                let sizes = sizes.after_full(&next.generation, full);
                self.rebuild_at(&mut state, manager, instance, sizes)
                    .map(|()| state.rebuilt_at_install += 1)
            }
            Err(other) => Err(other),
        };
        if let Err(error) = installed {
            // The caller drops the table (and retires it again, logging a failure); retired
            // now, the woken waiters leave it as it is instead of rebuilding it.
            if let Err(also) = self.retire_locked(&mut state) {
                tracing::warn!(instance = %self.instance_id, error = %also,
                    "retiring a lookup table whose growth failed");
            }
            return Err(error);
        }
        Ok(true)
    }

    /// Forgets `growth` unless it was installed or superseded already (its build failed or
    /// never started; a later change hands out a new one).
    pub fn abandon_growth(&self, growth: &Growth) {
        let mut state = self.lock();
        if state.progress_of(growth.id).is_some() {
            self.end_growth(&mut state);
        }
    }

    /// Re-publishes the availability block if the weights changed (and releases the
    /// generations whose grace passed).
    pub fn refresh_availability(
        &self,
        manager: &Manager,
        instance: &Instance,
    ) -> Result<(), LookupError> {
        let mut state = self.lock();
        // This runs every tick of the availability thread: generations replaced by a growth
        // or a rebuild are released once their grace passed, writes or not.
        self.expire_retired(&mut state);
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
    /// index with room for it (see [`Sizes::after_full`]); flips the header and retires the
    /// old generation.
    fn rebuild(
        &self,
        state: &mut State,
        manager: &Manager,
        instance: &Instance,
        full: Full,
    ) -> Result<(), LookupError> {
        let sizes = state.sizes.after_full(&state.current.generation, full);
        self.rebuild_at(state, manager, instance, sizes)
    }

    /// Replaces the current generation by one of `sizes` (or larger) built from the index.
    fn rebuild_at(
        &self,
        state: &mut State,
        manager: &Manager,
        instance: &Instance,
        sizes: Sizes,
    ) -> Result<(), LookupError> {
        // A growth under way may be smaller than this generation: it is dropped at install.
        self.end_growth(state);
        let availability = &state.availability;
        let (next, sizes) = build(
            manager,
            instance,
            &self.domains,
            &self.specs,
            availability,
            sizes,
            &|| true,
        )?;
        self.flip(state, next, sizes)
    }

    /// Makes `next` (of `sizes`) the current generation: the header names it under a new
    /// epoch, then the old one is retired and kept registered for [`GRACE`].
    fn flip(&self, state: &mut State, next: Published, sizes: Sizes) -> Result<(), LookupError> {
        state.sizes = sizes;
        let old = std::mem::replace(&mut state.current, next);
        state.epoch += 1;
        self.write_header(state, false)?;
        old.generation.retire()?;
        state.retiring.push((Instant::now() + GRACE, old));
        tracing::debug!(instance = %self.instance_id, epoch = state.epoch, "lookup table replaced");
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
        self.retire_locked(&mut self.lock())
    }

    fn retire_locked(&self, state: &mut State) -> Result<(), LookupError> {
        state.retired = true;
        state.published = false;
        self.end_growth(state);
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
    /// First sizes for about `keys` keys: at most three quarters of the slots at which a
    /// generation grows ([`GROW_AT_SLOTS_PERCENT`]) in use, heap room for 32 bytes per
    /// part (file-tier parts share one template per file; Mooncake parts
    /// have one each, and grow the heap).
    fn for_keys(specs: usize, keys: u64, handles: usize) -> Result<Sizes, LookupError> {
        let probe = Layout::new(specs, 2, 0, 0)?;
        let per_bucket = probe.geometry.slots_per_bucket as u64;
        Ok(Sizes {
            slot_records: specs,
            // Slots for keys / (3/4 × GROW_AT_SLOTS_PERCENT%).
            buckets: keys
                .saturating_mul(4 * 100)
                .div_ceil(3 * GROW_AT_SLOTS_PERCENT * per_bucket)
                .max(MIN_BUCKETS),
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

    /// The sizes of the next generation once `generation` (of these sizes) has
    /// `slots_percent` of its slots or [`GROW_AT_HEAP_PERCENT`] of its string heap in use:
    /// twice the buckets, twice the heap unless compacting it is enough; `None` before.
    fn to_grow(self, generation: &Generation<HostMemory>, slots_percent: u64) -> Option<Sizes> {
        let layout = generation.layout();
        let slots = layout.bucket_count * layout.geometry.slots_per_bucket as u64;
        let (used, _) = generation.heap_bytes();
        let slots_due = generation.slots_used() * 100 >= slots * slots_percent;
        let heap_due = used * 100 >= layout.strings_len * GROW_AT_HEAP_PERCENT;
        let mut next = self;
        if slots_due {
            next = next.grown(Full::Buckets);
        }
        if heap_due {
            next = next.after_full(generation, Full::Heap);
        }
        (slots_due || heap_due).then_some(next)
    }

    /// The sizes of a generation replacing `generation` (of these sizes), in which `full`
    /// ran out: twice the room for it, except a heap at least half dead, compacted at its
    /// size.
    fn after_full(self, generation: &Generation<HostMemory>, full: Full) -> Sizes {
        let (used, dead) = generation.heap_bytes();
        if full == Full::Heap && dead * 2 >= used {
            self
        } else {
            self.grown(full)
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

/// A generation of `sizes` (grown while something runs out), filled from the index of
/// `instance` and registered in `domains`; stops with [`LookupError::GrowthSuperseded`]
/// when `wanted` says false (before each page of keys and after the last).
fn build(
    manager: &Manager,
    instance: &Instance,
    domains: &[(usize, AnyDomain)],
    specs: &[(String, i64)],
    availability: &Availability,
    mut sizes: Sizes,
    wanted: &dyn Fn() -> bool,
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
        match fill(&mut generation, manager, instance, wanted) {
            // A superseded build is not registered.
            Ok(()) if !wanted() => return Err(LookupError::GrowthSuperseded),
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

/// Publishes every key of the instance's index (see [`build`] for `wanted`).
fn fill(
    generation: &mut Generation<HostMemory>,
    manager: &Manager,
    instance: &Instance,
    wanted: &dyn Fn() -> bool,
) -> Result<(), LookupError> {
    let mut cursor = Some(ScanCursor::START);
    while let Some(position) = cursor {
        if !wanted() {
            return Err(LookupError::GrowthSuperseded);
        }
        let page = instance.index.scan(position, SCAN_PAGE)?;
        republish(generation, manager, instance, &page.keys)?;
        cursor = page.next;
    }
    Ok(())
}

/// Publishes in `generation` the SERVING locations `keys` have in the index now (none: the
/// key is unpublished, two bucket reads in a fresh generation); a full generation is
/// `LookupError::Format(FormatError::Full(_))`.
fn republish(
    generation: &mut Generation<HostMemory>,
    manager: &Manager,
    instance: &Instance,
    keys: &[BlockKey],
) -> Result<(), LookupError> {
    for chunk in keys.chunks(SCAN_PAGE) {
        let entries = instance.index.get(chunk)?;
        for (key, entry) in chunk.iter().zip(entries) {
            let locations = entry.map_or_else(Vec::new, |e| published(manager, instance, *key, &e));
            generation.publish(*key, &locations)?;
        }
    }
    Ok(())
}

/// A growth to start when the current generation is nearly full and none is under way.
fn growth_due(state: &mut State) -> Option<Growth> {
    if state.growing.is_some() {
        return None;
    }
    let grow_at = state.grow_at_slots_percent();
    let sizes = state.sizes.to_grow(&state.current.generation, grow_at)?;
    state.growths += 1;
    state.growing = Some(Growing {
        id: state.growths,
        changed: HashSet::new(),
        pages: 0,
    });
    Some(Growth {
        id: state.growths,
        sizes,
    })
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use kvcm_lookup::header::candidates;
    use kvcm_lookup::reader::{key_slots, Copy};
    use kvcm_manager::mask::BlockMask;
    use kvcm_transport::soft::{SoftConfig, SoftDomain};

    use super::*;
    use crate::config::ServerConfig;

    /// A manager with instance `i` (one spec), and that instance's published table.
    fn setup(dir: &std::path::Path) -> (Arc<Manager>, Arc<Instance>, InstanceTable) {
        let config = ServerConfig {
            data_dir: dir.to_path_buf(),
            ..ServerConfig::default()
        };
        let manager = crate::server::embedded_manager(&config).expect("manager");
        manager
            .register_instance(crate::lookup::tests::info())
            .expect("register");
        let instance = manager.instance("i").expect("registered");
        let domain = AnyDomain::Soft(SoftDomain::open(SoftConfig::default()).expect("domain"));
        let table = InstanceTable::create(&manager, &instance, &[(0, domain)], 7).expect("table");
        table
            .ensure_published(&manager, &instance)
            .expect("published");
        (manager, instance, table)
    }

    /// Writes `keys` (SERVING once this returns) and reports them to the table, as the
    /// manager's publication does; the growth the report handed out, if any.
    fn write(
        manager: &Manager,
        instance: &Arc<Instance>,
        table: &InstanceTable,
        keys: &[BlockKey],
    ) -> Option<Growth> {
        let started = manager
            .start_write(instance, keys.to_vec(), &[], 60)
            .expect("start");
        let mask = BlockMask::Offset(keys.len());
        manager
            .finish_write(instance, &started.session_id, &mask)
            .expect("finish");
        table.refresh(manager, instance, keys).expect("refresh")
    }

    /// Whether the current generation has a slot for `key` (read as a client reads it).
    fn is_published(table: &InstanceTable, key: BlockKey) -> bool {
        let state = table.lock();
        let generation = &state.current.generation;
        let header = generation.header(0, 0, 0, 0, [0; WIRES]);
        let geometry = header.geometry();
        candidates(key, header.hash_seed, header.bucket_count)
            .iter()
            .any(|&bucket| {
                let mut bytes = vec![0u8; geometry.bucket_bytes];
                let offset = header.bucket_at(bucket) as usize;
                generation.memory().read(offset, &mut bytes).expect("read");
                match key_slots(&bytes, &geometry, key) {
                    Copy::Good(mut slots) => slots.next().is_some(),
                    other => panic!("bucket of {key}: {other:?}"),
                }
            })
    }

    /// Writes batches of 8 new keys from `next` on until a report hands out a growth.
    fn write_until_growth(
        manager: &Manager,
        instance: &Arc<Instance>,
        table: &InstanceTable,
        next: &mut BlockKey,
    ) -> Growth {
        for _ in 0..10_000 {
            let keys: Vec<BlockKey> = (*next..*next + 8).collect();
            *next += 8;
            if let Some(growth) = write(manager, instance, table, &keys) {
                return growth;
            }
        }
        panic!("no growth after {next} keys");
    }

    /// A table written until a change handed out its first growth (not run): its data
    /// directory, manager, instance, table, the first key not written and that growth.
    type NearlyFull = (
        tempfile::TempDir,
        Arc<Manager>,
        Arc<Instance>,
        InstanceTable,
        BlockKey,
        Growth,
    );

    fn nearly_full() -> NearlyFull {
        let dir = tempfile::tempdir().expect("tempdir");
        let (manager, instance, table) = setup(dir.path());
        let mut next: BlockKey = 1;
        let growth = write_until_growth(&manager, &instance, &table, &mut next);
        (dir, manager, instance, table, next, growth)
    }

    #[test]
    fn a_nearly_full_table_grows_aside_and_keeps_the_changes_made_during_the_build() {
        let (_dir, manager, instance, table, next, growth) = nearly_full();
        let (epoch, sizes) = {
            let state = table.lock();
            (state.epoch, state.sizes)
        };
        let grown = table
            .build_grown(&manager, &instance, &growth)
            .expect("build");
        // Changes after the build read the index: new keys, removed keys. They reach the
        // current generation at once and the grown one at its install.
        let late: Vec<BlockKey> = (next..next + 8).collect();
        assert!(
            write(&manager, &instance, &table, &late).is_none(),
            "one growth at a time"
        );
        let removed: Vec<BlockKey> = (1..=4).collect();
        manager.remove_cache(&instance, &removed).expect("remove");
        table
            .refresh(&manager, &instance, &removed)
            .expect("refresh");
        for key in late.iter().chain(&removed) {
            assert_eq!(
                is_published(&table, *key),
                *key > 4,
                "before install: {key}"
            );
        }
        assert!(table
            .install_grown(&manager, &instance, grown)
            .expect("install"));
        let state = table.lock();
        assert_eq!(
            state.epoch,
            epoch + 1,
            "the header names the grown generation"
        );
        assert!(state.growing.is_none());
        let bigger = state.sizes.buckets > sizes.buckets || state.sizes.heap > sizes.heap;
        assert!(bigger, "{sizes:?} then {:?}", state.sizes);
        drop(state);
        for key in 1..next + 8 {
            assert_eq!(is_published(&table, key), key > 4, "after install: {key}");
        }
    }

    #[test]
    fn a_replaced_generation_is_released_after_its_grace_without_further_writes() {
        let (_dir, manager, instance, table, _next, growth) = nearly_full();
        let grown = table
            .build_grown(&manager, &instance, &growth)
            .expect("build");
        assert!(table
            .install_grown(&manager, &instance, grown)
            .expect("install"));
        assert_eq!(
            table.lock().retiring.len(),
            1,
            "kept registered for its grace"
        );
        // The grace has passed; no write comes, only the availability thread's tick (it
        // once waited for the next successful write, however long that took).
        table.lock().retiring[0].0 = Instant::now();
        table
            .refresh_availability(&manager, &instance)
            .expect("tick");
        assert!(table.lock().retiring.is_empty(), "released on the tick");
    }

    #[test]
    fn a_table_is_of_the_instance_object_it_was_built_for_not_of_a_later_one_of_its_id() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (manager, instance, table) = setup(dir.path());
        assert!(table.is_of(&instance));
        let info = instance.info().clone();
        manager.remove_instance("i").expect("remove");
        manager.register_instance(info).expect("register again");
        let again = manager.instance("i").expect("registered");
        assert!(
            !table.is_of(&again),
            "the removed instance's table is not the later instance's"
        );
        assert!(table.is_of(&instance));
    }

    #[test]
    fn figures_are_read_without_waiting_for_the_tables_lock() {
        let (_dir, manager, instance, table, next, growth) = nearly_full();
        table.abandon_growth(&growth);
        let before = table.stats();
        assert!(
            before.slots_used > 0 && before.growths_started == 1,
            "{before:?}"
        );
        let held = table.lock();
        // Answered at once, from the last look, while a build would hold the lock.
        assert_eq!(table.stats(), before);
        drop(held);
        let keys: Vec<BlockKey> = (next..next + 8).collect();
        if let Some(growth) = write(&manager, &instance, &table, &keys) {
            table.abandon_growth(&growth);
        }
        let after = table.stats();
        assert_eq!(after.slots_used, before.slots_used + 8, "{after:?}");
    }

    #[test]
    fn a_growth_superseded_by_a_rebuild_or_a_retirement_is_dropped() {
        let (_dir, manager, instance, table, mut next, growth) = nearly_full();
        let grown = table
            .build_grown(&manager, &instance, &growth)
            .expect("build");
        // A generation that ran out in a call: rebuilt there, possibly larger than `grown`.
        table
            .rebuild(&mut table.lock(), &manager, &instance, Full::Buckets)
            .expect("rebuild");
        let epoch = table.lock().epoch;
        assert!(!table
            .install_grown(&manager, &instance, grown)
            .expect("install"));
        assert_eq!(table.lock().epoch, epoch, "the rebuilt generation stays");
        // A build that starts (or goes on) after its growth was superseded stops.
        assert!(matches!(
            table.build_grown(&manager, &instance, &growth),
            Err(LookupError::GrowthSuperseded)
        ));
        let growth = write_until_growth(&manager, &instance, &table, &mut next);
        let grown = table
            .build_grown(&manager, &instance, &growth)
            .expect("build");
        table.retire().expect("retire");
        assert!(!table
            .install_grown(&manager, &instance, grown)
            .expect("install"));
        assert!(matches!(
            table.build_grown(&manager, &instance, &growth),
            Err(LookupError::GrowthSuperseded)
        ));
    }

    #[test]
    fn a_change_that_runs_out_during_a_growth_waits_for_it_instead_of_rebuilding() {
        let (_dir, manager, instance, table, next, growth) = nearly_full();
        let (epoch, slots) = {
            let state = table.lock();
            let layout = state.current.generation.layout();
            let slots = layout.bucket_count * layout.geometry.slots_per_bucket as u64;
            (state.epoch, BlockKey::try_from(slots).expect("slots"))
        };
        // As many keys as the generation has slots (a multiple of 8): it runs out before
        // they are all in.
        let last = next + slots;
        std::thread::scope(|scope| {
            let writer = scope.spawn(|| {
                let mut key = next;
                while key < last {
                    let keys: Vec<BlockKey> = (key..key + 8).collect();
                    key += 8;
                    // The grown generation may hand out a growth of its own: run at once.
                    if let Some(later) = write(&manager, &instance, &table, &keys) {
                        let built = table.build_grown(&manager, &instance, &later);
                        let installed =
                            table.install_grown(&manager, &instance, built.expect("build"));
                        assert!(installed.expect("install"));
                    }
                }
            });
            let grown = table
                .build_grown(&manager, &instance, &growth)
                .expect("build");
            // Install only once the writer ran out and waits (or, wrongly, finished).
            let deadline = Instant::now() + Duration::from_secs(60);
            while table.lock().waited_for_growth == 0 && !writer.is_finished() {
                assert!(
                    Instant::now() < deadline,
                    "the writer neither waits nor ends"
                );
                std::thread::yield_now();
            }
            assert!(table
                .install_grown(&manager, &instance, grown)
                .expect("install"));
            writer.join().expect("writer");
        });
        let stats = table.stats();
        assert_eq!(stats.rebuilt_in_call, 0, "no generation built in a call");
        assert_eq!(stats.waited_for_growth, 1, "the change that ran out waited");
        assert!(stats.waited > Duration::ZERO, "its wait is counted");
        assert!(stats.epoch > epoch, "a grown generation is current");
        assert!(stats.growths_installed >= 1, "{stats:?}");
        assert!(
            stats.growths_started >= stats.growths_installed,
            "{stats:?}"
        );
        assert!(stats.slots_used * 100 < stats.slots * GROW_AT_SLOTS_PERCENT);
        assert_eq!(
            table.lock().grow_at_slots_percent(),
            EAGER_GROW_AT_SLOTS_PERCENT,
            "writes outran a growth: the next ones start earlier"
        );
        for key in 1..=last {
            assert_eq!(is_published(&table, key), key < last, "key {key}");
        }
    }

    #[test]
    fn a_change_waiting_for_a_growth_whose_build_does_not_advance_rebuilds_in_its_call() {
        // Handed out and never built: the waiter sees no progress for the stall limit.
        let (_dir, manager, instance, mut table, mut next, stuck) = nearly_full();
        table.growth_stall = Duration::from_millis(200);
        let epoch = table.lock().epoch;
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut slowest = Duration::ZERO;
        while table.lock().rebuilt_in_call == 0 {
            assert!(Instant::now() < deadline, "no rebuild after {next} keys");
            let keys: Vec<BlockKey> = (next..next + 8).collect();
            next += 8;
            let began = Instant::now();
            assert!(write(&manager, &instance, &table, &keys).is_none());
            slowest = slowest.max(began.elapsed());
        }
        assert!(slowest >= table.growth_stall, "it waited: {slowest:?}");
        let stats = table.stats();
        assert_eq!(stats.waited_for_growth, 1, "it waited once, then rebuilt");
        assert!(stats.waited >= table.growth_stall, "{stats:?}");
        assert_eq!(stats.epoch, epoch + 1, "the rebuilt generation is current");
        assert_eq!((stats.growths_started, stats.growths_installed), (1, 0));
        assert!(matches!(
            table.build_grown(&manager, &instance, &stuck),
            Err(LookupError::GrowthSuperseded)
        ));
        for key in 1..next {
            assert!(is_published(&table, key), "key {key}");
        }
    }

    #[test]
    fn growing_in_the_background_spares_the_writes_nearly_every_rebuild() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (manager, instance, table) = setup(dir.path());
        let mut next: BlockKey = 1;
        let mut grown = 0;
        while next < 20_000 {
            let keys: Vec<BlockKey> = (next..next + 16).collect();
            next += 16;
            if let Some(growth) = write(&manager, &instance, &table, &keys) {
                let built = table.build_grown(&manager, &instance, &growth);
                grown += u64::from(
                    table
                        .install_grown(&manager, &instance, built.expect("build"))
                        .expect("install"),
                );
            }
        }
        let in_call = table.lock().rebuilt_in_call;
        eprintln!("{grown} growths installed, {in_call} rebuilds in a call");
        assert!(grown >= 5, "{grown}");
        assert!(in_call <= 1, "{in_call} rebuilds in a call");
    }
}
