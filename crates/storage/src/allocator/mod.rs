//! The memory-pool allocator: places KV-cache block parts in the registered memory region of
//! a memory pool node (bytes `0..capacity`). It hands out offsets only; it never touches the
//! region's bytes.
//!
//! # Design
//!
//! * Everything is counted in granules of [`GRANULE`] bytes: offsets and reserved sizes are
//!   multiples of it, and the capacity is rounded down to it.
//! * The region is cut into slabs of [`SLAB_BYTES`] (2 MiB, a huge page); the last slab holds
//!   what is left and may be shorter. A region smaller than one slab is one partial slab.
//! * A request of at most one slab is rounded up to a size class: exact up to 8 granules
//!   (4 KiB), then 8 classes per power of two, so a class exceeds its request by less than
//!   1/8 (12.5%) of it. Powers of two (16 KiB, 64 KiB, 1 MiB, 2 MiB) are classes themselves.
//! * A class places its slots in spans: runs of slabs. Its preferred span length (1..=5
//!   slabs) is the shortest whose tail slack (bytes too few for one more slot) is at most
//!   1/8 of the span; for power-of-two classes that is one slab with no slack. A class that
//!   owns fewer spans than its preferred length opens one-slab spans, so a rarely used class
//!   pins little memory. A class allocates from its fullest open span, so that the emptiest
//!   spans drain; a span goes back to the free slab pool as soon as its last slot is freed.
//! * Every part is placed for a [`Tenant`] (the pool storage numbers its instances), and a
//!   span or run of slabs holds the parts of one tenant only: a class allocates from its
//!   fullest open span *of that tenant*. So a node can give each tenant access to its own
//!   slabs and no other's ([`PoolAllocator::owned_runs`] lists who owns what).
//! * Reporting ownership ([`PoolAllocator::report_ownership`], for a node that isolates
//!   its tenants): every run a tenant gets and every run it gives up is recorded as an
//!   [`OwnershipChange`] for the caller to pass on ([`PoolAllocator::take_changes`]), and a
//!   run given up is *held* — placed for no one — until the caller reclaims it
//!   ([`PoolAllocator::reclaim`]), once the node said its old tenant can no longer reach it.
//! * A request larger than a slab, or one no class span has room for, takes a run of whole
//!   slabs (best fit over the free runs, lowest start among equals); freeing it merges the
//!   run with its free neighbours. Its reserved bytes are the whole run, so a request just
//!   over a slab boundary wastes up to one slab (4 MiB parts waste nothing).
//! * Every operation is O(log n) in the number of spans, runs and free runs: owners are
//!   found by slab index in a `BTreeMap`, free slots by a per-span stack, open spans by a
//!   set ordered by tenant and class, free runs by start and by length.
//! * An allocator can start over a region that already holds parts placed by an earlier
//!   process ([`PoolAllocator::with_adopted`]: a restarted manager whose pool node kept its
//!   memory): the slabs those parts touch become adopted runs, which hold exactly those parts
//!   (nothing new is placed there) and go back to the free slab pool when their last part is
//!   freed. Parts of two tenants that touch one slab are refused.
//!
//! # Invariants
//!
//! * Live allocations never overlap and lie inside `0..capacity`; every offset is a multiple
//!   of `GRANULE`, and so is every reserved size.
//! * Every live allocation lies in a run of slabs owned by the tenant it was placed for.
//! * Every slab is in exactly one of: a free run, a class span, a whole-slab run, an
//!   adopted run, a held run; hence `reserved + class_free + free + held == capacity` (see
//!   [`AllocatorStats`]).
//! * While reporting, the recorded changes replayed in order give exactly
//!   [`PoolAllocator::owned_runs`].
//! * `used_bytes` is the exact sum of the requested sizes of live allocations, and
//!   `reserved_bytes` the sum of their slot or run sizes.
//! * A failed operation changes nothing.
//!
//! # Fragmentation
//!
//! The fragmentation test (`allocator::tests`) measures it for a workload whose requests
//! are mostly a few fixed block part sizes `s`, with weights `p(s)` (summing to 1 over the
//! fixed sizes). `usable(s)` is what a stream of `s` requests could take right now: the free
//! slots of `s`'s class plus the slots or runs of `s` that fit in the free slab runs, in
//! reserved bytes. With `free = capacity - reserved_bytes`, the stranded bytes are
//! `sum over s of p(s) * (free - usable(s))`: the free bytes the next fixed-size request
//! can on average not use (other classes' free slots, tail slack, free runs too short).
//! External fragmentation is stranded bytes over capacity (asserted at most 10%, and
//! tighter); stranded bytes over free bytes is reported too. Figures and the command that
//! runs the 10^6-operation version are in `docs/pool-allocator.md`.

mod adopted;
mod size_class;
mod slab_pool;
mod span;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};

pub use adopted::AdoptedPart;
use adopted::{adopted_runs, AdoptedRun};
use size_class::{preferred_span_slabs, size_class_for, SizeClass};
use slab_pool::{SlabGeometry, SlabPool, SlabRun};
use span::Span;

/// Offsets and sizes handed out are multiples of this.
pub const GRANULE: u64 = 1 << GRANULE_SHIFT;
/// `log2(GRANULE)`.
pub const GRANULE_SHIFT: u8 = 9;

/// Bytes of one slab (2 MiB, a huge page): the unit the region is handed to classes in.
pub const SLAB_BYTES: u64 = 2 * 1024 * 1024;

/// Whom a part is placed for: the pool storage numbers its instances. Two tenants' parts
/// never share a slab.
pub type Tenant = u32;

/// A run of slabs that is not free, as bytes of the region, and the tenant whose parts it
/// holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnedRun {
    /// The tenant.
    pub tenant: Tenant,
    /// Offset of its first byte (a multiple of `SLAB_BYTES`).
    pub offset: u64,
    /// Its bytes (whole slabs, the last slab of the region possibly shorter).
    pub len: u64,
}

/// A change of who holds a run of slabs, recorded while the allocator reports ownership.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnershipChange {
    /// The run holds the tenant's parts from now on.
    Granted(OwnedRun),
    /// The run holds no part of the tenant any more; it is held (placed for no one) until
    /// [`PoolAllocator::reclaim`].
    Released(OwnedRun),
}

/// Why an allocator operation failed; a failed operation changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// A request for 0 bytes.
    #[error("cannot allocate 0 bytes")]
    ZeroSize,
    /// A request larger than the whole region.
    #[error("{size} bytes requested, the region holds {capacity}")]
    TooLarge {
        /// Bytes requested.
        size: u64,
        /// Bytes of the region.
        capacity: u64,
    },
    /// No free room for the request now; freeing may make some.
    #[error("no room for {size} bytes")]
    Full {
        /// Bytes requested.
        size: u64,
    },
    /// Parts to adopt that overlap, are empty, unaligned, outside the region or share a
    /// slab with another tenant's.
    #[error("cannot adopt {size} bytes at offset {offset}: {reason}")]
    BadAdoption {
        /// Offset of the refused part.
        offset: u64,
        /// Its size.
        size: u64,
        /// Why.
        reason: &'static str,
    },
    /// No live allocation starts at this offset (never allocated, or already freed).
    #[error("no live allocation at offset {offset}")]
    UnknownAllocation {
        /// The offset given to `free`.
        offset: u64,
    },
    /// A region smaller than one granule.
    #[error("a region of {capacity} bytes is smaller than one granule ({GRANULE} bytes)")]
    CapacityTooSmall {
        /// The capacity given to `new`.
        capacity: u64,
    },
}

/// A snapshot of the allocator's accounting. `reserved_bytes + class_free_bytes + free_bytes
/// + held_bytes` always equals `capacity`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocatorStats {
    /// Bytes of the region (rounded down to `GRANULE`).
    pub capacity: u64,
    /// Exact sum of the requested sizes of live allocations.
    pub used_bytes: u64,
    /// Bytes held by live allocations after rounding to their class or slab run.
    pub reserved_bytes: u64,
    /// Bytes owned by class spans but in no live slot (free slots and tail slack): usable
    /// only by requests of the span's class.
    pub class_free_bytes: u64,
    /// Bytes in free slab runs, usable by any request.
    pub free_bytes: u64,
    /// Bytes of runs given up by their tenant and not reclaimed yet (only while reporting
    /// ownership).
    pub held_bytes: u64,
    /// Bytes of the longest free slab run: the largest request sure to succeed.
    pub largest_free_run_bytes: u64,
    /// Number of live allocations.
    pub live_allocations: usize,
    /// Number of class spans.
    pub class_spans: usize,
    /// Number of live allocations holding a run of whole slabs.
    pub whole_slab_runs: usize,
    /// Number of free slab runs.
    pub free_runs: usize,
}

/// A live allocation holding a run of whole slabs.
#[derive(Debug)]
struct WholeRun {
    run: SlabRun,
    /// Bytes of the run (the reserved size).
    run_bytes: u64,
    /// Bytes the caller asked for.
    requested: u64,
}

/// A run of slabs that is not free: what holds it, for which tenant.
#[derive(Debug)]
struct Owned {
    tenant: Tenant,
    owner: Owner,
}

/// What holds a run of slabs that is not free.
#[derive(Debug)]
enum Owner {
    /// A class span with slots.
    Span(Span),
    /// One allocation of whole slabs.
    Whole(WholeRun),
    /// Parts placed by an earlier process.
    Adopted(AdoptedRun),
}

/// Places allocations in a region of `capacity` bytes. Single-threaded (`&mut self`); a
/// caller shared between threads wraps it in a `Mutex`.
#[derive(Debug)]
pub struct PoolAllocator {
    slab_pool: SlabPool,
    /// Slab runs not free, by their first slab.
    owners: BTreeMap<u64, Owned>,
    /// Spans with a free slot, per tenant and class, fullest first.
    open_spans: BTreeSet<OpenSpan>,
    /// How many spans each (tenant, class index) owns (absent: none).
    spans_per_class: HashMap<(Tenant, usize), u64>,
    used_bytes: u64,
    slot_reserved_bytes: u64,
    whole_reserved_bytes: u64,
    /// Bytes of the adopted runs (reserved whole until their last part is freed).
    adopted_reserved_bytes: u64,
    span_bytes: u64,
    live_allocations: usize,
    class_spans: usize,
    whole_slab_runs: usize,
    /// Ownership is reported: changes recorded, released runs held.
    reporting: bool,
    /// Changes recorded and not taken yet.
    changes: Vec<OwnershipChange>,
    /// Runs released while reporting, not reclaimed yet, by first slab.
    held: BTreeMap<u64, SlabRun>,
    held_bytes: u64,
}

impl PoolAllocator {
    /// An allocator for a region of `capacity` bytes, rounded down to a multiple of
    /// `GRANULE`; refuses a region smaller than one granule.
    pub fn new(capacity: u64) -> Result<Self, AllocError> {
        let usable = capacity - capacity % GRANULE;
        if usable == 0 {
            return Err(AllocError::CapacityTooSmall { capacity });
        }
        Ok(PoolAllocator {
            slab_pool: SlabPool::new(SlabGeometry::new(usable)),
            owners: BTreeMap::new(),
            open_spans: BTreeSet::new(),
            spans_per_class: HashMap::new(),
            used_bytes: 0,
            slot_reserved_bytes: 0,
            whole_reserved_bytes: 0,
            adopted_reserved_bytes: 0,
            span_bytes: 0,
            live_allocations: 0,
            class_spans: 0,
            whole_slab_runs: 0,
            reporting: false,
            changes: Vec::new(),
            held: BTreeMap::new(),
            held_bytes: 0,
        })
    }

    /// An allocator for a region of `capacity` bytes that already holds `parts`, placed by
    /// an earlier process: they count as live allocations (one `free` each), the slabs they
    /// touch hold nothing else until all their parts are freed. Refuses parts that are
    /// empty, not granule-aligned, outside the region, overlapping or sharing a slab with
    /// another tenant's; nothing is built then.
    pub fn with_adopted(capacity: u64, parts: &[AdoptedPart]) -> Result<Self, AllocError> {
        let mut pool = Self::new(capacity)?;
        for (tenant, run) in adopted_runs(pool.capacity(), parts)? {
            let taken = pool.slab_pool.take_exact(run.run);
            debug_assert!(taken, "adopted runs are disjoint and inside the region");
            pool.used_bytes += run.used_bytes();
            pool.live_allocations += run.part_count();
            let run_bytes = pool.slab_pool.geometry().run_bytes(run.run);
            pool.adopted_reserved_bytes += run_bytes;
            let run_start = run.run.start;
            let owner = Owner::Adopted(run);
            pool.owners.insert(run_start, Owned { tenant, owner });
        }
        Ok(pool)
    }

    /// Places `size` bytes for `tenant`, in slabs holding only its parts; returns the offset
    /// of `[offset, offset + size)`, which lies inside the region and is a multiple of
    /// `GRANULE`.
    pub fn allocate(&mut self, tenant: Tenant, size: u64) -> Result<u64, AllocError> {
        let capacity = self.capacity();
        if size == 0 {
            return Err(AllocError::ZeroSize);
        }
        if size > capacity {
            return Err(AllocError::TooLarge { size, capacity });
        }
        let in_slot = slot_request(size).and_then(|wanted| self.allocate_slot(tenant, wanted));
        let offset = in_slot.or_else(|| self.allocate_whole_run(tenant, size));
        let offset = offset.ok_or(AllocError::Full { size })?;
        self.used_bytes += size;
        self.live_allocations += 1;
        Ok(offset)
    }

    /// Frees the allocation starting at `offset`; returns the size that was requested for
    /// it. An offset where no live allocation starts is refused and changes nothing.
    pub fn free(&mut self, offset: u64) -> Result<u64, AllocError> {
        let slab = offset / SLAB_BYTES;
        let owner_start = self
            .owners
            .range(..=slab)
            .next_back()
            .map(|(&start, _)| start);
        let released = owner_start.and_then(|start| match self.owners.get(&start) {
            Some(Owned {
                owner: Owner::Span(_),
                ..
            }) => self.free_slot(start, offset),
            Some(Owned {
                owner: Owner::Whole(_),
                ..
            }) => self.free_whole_run(start, offset),
            Some(Owned {
                owner: Owner::Adopted(_),
                ..
            }) => self.free_adopted(start, offset),
            None => None,
        });
        let requested = released.ok_or(AllocError::UnknownAllocation { offset })?;
        self.used_bytes -= requested;
        self.live_allocations -= 1;
        Ok(requested)
    }

    /// From now on records every change of ownership and holds released runs until they are
    /// reclaimed; the first changes grant every run owned now. Calling it again does
    /// nothing.
    pub fn report_ownership(&mut self) {
        if self.reporting {
            return;
        }
        self.reporting = true;
        let owned: Vec<OwnedRun> = self.owned_runs().collect();
        let granted = owned.into_iter().map(OwnershipChange::Granted);
        self.changes.extend(granted);
    }

    /// The changes recorded since the last call, oldest first.
    pub fn take_changes(&mut self) -> Vec<OwnershipChange> {
        std::mem::take(&mut self.changes)
    }

    /// Gives the held run starting at byte `offset` back to the free slabs; false (nothing
    /// changed) when no held run starts there.
    pub fn reclaim(&mut self, offset: u64) -> bool {
        let start = offset / SLAB_BYTES;
        if offset % SLAB_BYTES != 0 {
            return false;
        }
        let Some(run) = self.held.remove(&start) else {
            return false;
        };
        self.held_bytes -= self.slab_pool.geometry().run_bytes(run);
        self.slab_pool.give_back(run);
        true
    }

    /// Every run of slabs that is not free, lowest first, with its tenant.
    pub fn owned_runs(&self) -> impl Iterator<Item = OwnedRun> + '_ {
        let geometry = self.slab_pool.geometry();
        self.owners.iter().map(move |(&start, owned)| {
            let run = match &owned.owner {
                Owner::Span(span) => span.run,
                Owner::Whole(whole) => whole.run,
                Owner::Adopted(adopted) => adopted.run,
            };
            OwnedRun {
                tenant: owned.tenant,
                offset: geometry.slab_offset(start),
                len: geometry.run_bytes(run),
            }
        })
    }

    /// Bytes of the region (rounded down to `GRANULE`).
    pub fn capacity(&self) -> u64 {
        self.slab_pool.geometry().capacity
    }

    /// Exact sum of the requested sizes of live allocations.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    /// Bytes held by live allocations after rounding to their class or slab run (adopted
    /// runs count whole).
    pub fn reserved_bytes(&self) -> u64 {
        self.slot_reserved_bytes + self.whole_reserved_bytes + self.adopted_reserved_bytes
    }

    /// Number of live allocations.
    pub fn live_allocations(&self) -> usize {
        self.live_allocations
    }

    /// A snapshot of the accounting.
    pub fn stats(&self) -> AllocatorStats {
        AllocatorStats {
            capacity: self.capacity(),
            used_bytes: self.used_bytes,
            reserved_bytes: self.reserved_bytes(),
            class_free_bytes: self.span_bytes - self.slot_reserved_bytes,
            free_bytes: self.slab_pool.free_bytes(),
            held_bytes: self.held_bytes,
            largest_free_run_bytes: self.slab_pool.largest_run_bytes(),
            live_allocations: self.live_allocations,
            class_spans: self.class_spans,
            whole_slab_runs: self.whole_slab_runs,
            free_runs: self.slab_pool.free_run_count(),
        }
    }

    /// Bytes a request of `size` reserves when it is placed in a class slot or a run
    /// (`None` for 0 or more than the capacity). A run at the partial last slab may reserve
    /// less than this says.
    pub fn reserved_size_for(&self, size: u64) -> Option<u64> {
        if size == 0 || size > self.capacity() {
            return None;
        }
        match slot_request(size) {
            Some(_) => Some(size_class_for(size).slot_bytes),
            None => Some(size.div_ceil(SLAB_BYTES).saturating_mul(SLAB_BYTES)),
        }
    }

    /// Places `requested` bytes for `tenant` in a slot of its class: in the tenant's fullest
    /// open span of the class, or in a new span when none is open.
    fn allocate_slot(&mut self, tenant: Tenant, requested: u32) -> Option<u64> {
        let class = size_class_for(u64::from(requested));
        let fullest = OpenSpan::of(tenant, class.index, 0, 0)..;
        let fullest = self.open_spans.range(fullest).next();
        let fullest = fullest.filter(|open| open.tenant == tenant && open.class == class.index);
        let start = match fullest {
            Some(open) => open.start,
            None => self.open_span(tenant, class)?,
        };
        let span = self.span_mut(start)?;
        let free_before = span.free_slot_count();
        let offset = span.take_slot(requested)?;
        let open = OpenSpan::of(tenant, class.index, free_before, start);
        self.open_spans.remove(&open);
        if free_before > 1 {
            self.open_spans.insert(OpenSpan {
                free: free_before - 1,
                ..open
            });
        }
        self.slot_reserved_bytes += class.slot_bytes;
        Some(offset)
    }

    /// Takes slabs for a new span of `class` for `tenant`; returns the span's first slab. A
    /// class owning fewer spans (of this tenant) than its preferred span length takes one
    /// slab (a rare class then pins little memory), a busier one its preferred length (less
    /// tail slack); when that many contiguous slabs are not free, one slab.
    fn open_span(&mut self, tenant: Tenant, class: SizeClass) -> Option<u64> {
        let preferred = preferred_span_slabs(class.slot_bytes);
        let owned = self.spans_per_class.get(&(tenant, class.index));
        let slabs = if owned.copied().unwrap_or(0) >= preferred {
            preferred
        } else {
            1
        };
        let run = self
            .slab_pool
            .take(slabs, class.slot_bytes)
            .or_else(|| self.slab_pool.take(1, class.slot_bytes))?;
        let geometry = self.slab_pool.geometry();
        let run_bytes = geometry.run_bytes(run);
        let span = Span::new(class, run, geometry.slab_offset(run.start), run_bytes);
        let open = OpenSpan::of(tenant, class.index, span.slot_count(), run.start);
        self.open_spans.insert(open);
        let owner = Owner::Span(span);
        self.owners.insert(run.start, Owned { tenant, owner });
        self.record(OwnershipChange::Granted, tenant, run);
        self.span_bytes += run_bytes;
        self.class_spans += 1;
        *self
            .spans_per_class
            .entry((tenant, class.index))
            .or_insert(0) += 1;
        Some(run.start)
    }

    /// Places `size` bytes for `tenant` in a run of whole slabs.
    fn allocate_whole_run(&mut self, tenant: Tenant, size: u64) -> Option<u64> {
        let run = self.slab_pool.take(size.div_ceil(SLAB_BYTES), size)?;
        let geometry = self.slab_pool.geometry();
        let run_bytes = geometry.run_bytes(run);
        let whole = WholeRun {
            run,
            run_bytes,
            requested: size,
        };
        let owner = Owner::Whole(whole);
        self.owners.insert(run.start, Owned { tenant, owner });
        self.record(OwnershipChange::Granted, tenant, run);
        self.whole_reserved_bytes += run_bytes;
        self.whole_slab_runs += 1;
        Some(geometry.slab_offset(run.start))
    }

    /// Frees the slot at `offset` of the span starting at slab `start`; gives the span back
    /// to the slab pool when it becomes empty.
    fn free_slot(&mut self, start: u64, offset: u64) -> Option<u64> {
        let tenant = self.owners.get(&start)?.tenant;
        let span = self.span_mut(start)?;
        let free_before = span.free_slot_count();
        let requested = span.release_slot(offset)?;
        let class = span.class;
        let now_empty = span.is_empty();
        let open = OpenSpan::of(tenant, class.index, free_before, start);
        self.open_spans.remove(&open);
        self.slot_reserved_bytes -= class.slot_bytes;
        if now_empty {
            self.close_span(start);
        } else {
            self.open_spans.insert(OpenSpan {
                free: free_before + 1,
                ..open
            });
        }
        Some(requested)
    }

    /// The span starting at slab `start`.
    fn span_mut(&mut self, start: u64) -> Option<&mut Span> {
        match self.owners.get_mut(&start) {
            Some(Owned {
                owner: Owner::Span(span),
                ..
            }) => Some(span),
            _ => None,
        }
    }

    /// Gives the (empty) span starting at slab `start` back to the slab pool.
    fn close_span(&mut self, start: u64) {
        let Some(Owned {
            tenant,
            owner: Owner::Span(span),
        }) = self.owners.remove(&start)
        else {
            return;
        };
        self.span_bytes -= self.slab_pool.geometry().run_bytes(span.run);
        self.class_spans -= 1;
        let key = (tenant, span.class.index);
        if let Some(count) = self.spans_per_class.get_mut(&key) {
            *count -= 1;
            if *count == 0 {
                self.spans_per_class.remove(&key);
            }
        }
        self.release(tenant, span.run);
    }

    /// Records `change` of `run` for `tenant` while reporting.
    fn record(&mut self, change: fn(OwnedRun) -> OwnershipChange, tenant: Tenant, run: SlabRun) {
        if self.reporting {
            let geometry = self.slab_pool.geometry();
            self.changes.push(change(OwnedRun {
                tenant,
                offset: geometry.slab_offset(run.start),
                len: geometry.run_bytes(run),
            }));
        }
    }

    /// `tenant` gave `run` up: back to the free slabs, or, while reporting, held until
    /// reclaimed.
    fn release(&mut self, tenant: Tenant, run: SlabRun) {
        self.record(OwnershipChange::Released, tenant, run);
        if self.reporting {
            self.held_bytes += self.slab_pool.geometry().run_bytes(run);
            self.held.insert(run.start, run);
        } else {
            self.slab_pool.give_back(run);
        }
    }

    /// Frees the adopted part at `offset` of the adopted run starting at slab `start`; gives
    /// the run back to the slab pool when it holds no part any more.
    fn free_adopted(&mut self, start: u64, offset: u64) -> Option<u64> {
        let Some(Owned {
            tenant,
            owner: Owner::Adopted(run),
        }) = self.owners.get_mut(&start)
        else {
            return None;
        };
        let (tenant, requested) = (*tenant, run.release(offset)?);
        if run.part_count() == 0 {
            let slabs = run.run;
            self.owners.remove(&start);
            self.adopted_reserved_bytes -= self.slab_pool.geometry().run_bytes(slabs);
            self.release(tenant, slabs);
        }
        Some(requested)
    }

    /// Frees the whole-slab run starting at slab `start` if `offset` is its first byte.
    fn free_whole_run(&mut self, start: u64, offset: u64) -> Option<u64> {
        if offset != self.slab_pool.geometry().slab_offset(start) {
            return None;
        }
        let Some(Owned {
            tenant,
            owner: Owner::Whole(whole),
        }) = self.owners.remove(&start)
        else {
            return None;
        };
        self.whole_reserved_bytes -= whole.run_bytes;
        self.whole_slab_runs -= 1;
        self.release(tenant, whole.run);
        Some(whole.requested)
    }
}

/// A span with a free slot, ordered by tenant, class, then fullest (fewest free slots)
/// first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct OpenSpan {
    tenant: Tenant,
    class: usize,
    free: usize,
    start: u64,
}

impl OpenSpan {
    fn of(tenant: Tenant, class: usize, free: usize, start: u64) -> OpenSpan {
        OpenSpan {
            tenant,
            class,
            free,
            start,
        }
    }
}

/// The requested size as a slot request when it fits in one slab (and so in a `u32`).
fn slot_request(size: u64) -> Option<u32> {
    if size > SLAB_BYTES {
        return None;
    }
    u32::try_from(size).ok()
}
