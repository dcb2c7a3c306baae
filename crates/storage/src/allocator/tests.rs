//! Tests of the pool allocator: size classes, edge cases, a model-based property test and a
//! fragmentation test under a mixed KV workload.
//!
//! The 10^6-operation fragmentation run is ignored in the default (debug) run; run it with
//! `cargo test --release -p kvcm-storage allocator -- --ignored --nocapture`.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::size_class::{preferred_span_slabs, size_class_for, CLASS_COUNT};
use super::*;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;

/// The block part sizes KV workloads use most.
const KV_PART_SIZES: [u64; 4] = [16 * KIB, 64 * KIB, MIB, 4 * MIB];

fn allocator(capacity: u64) -> PoolAllocator {
    PoolAllocator::new(capacity).expect("capacity of at least one granule")
}

/// The accounting identity every state must satisfy.
fn assert_accounting_adds_up(stats: &AllocatorStats) {
    assert_eq!(
        stats.reserved_bytes + stats.class_free_bytes + stats.free_bytes + stats.held_bytes,
        stats.capacity,
        "{stats:?}"
    );
    assert!(stats.used_bytes <= stats.reserved_bytes, "{stats:?}");
    assert!(
        stats.largest_free_run_bytes <= stats.free_bytes,
        "{stats:?}"
    );
}

fn assert_empty(pool: &PoolAllocator) {
    let stats = pool.stats();
    let capacity = pool.capacity();
    let empty = AllocatorStats {
        capacity,
        used_bytes: 0,
        reserved_bytes: 0,
        class_free_bytes: 0,
        free_bytes: capacity,
        held_bytes: 0,
        largest_free_run_bytes: capacity,
        live_allocations: 0,
        class_spans: 0,
        whole_slab_runs: 0,
        free_runs: 1,
    };
    assert_eq!(stats, empty);
    assert!(pool.owners.is_empty() && pool.held.is_empty());
    assert!(pool.open_spans.is_empty() && pool.spans_per_class.is_empty());
}

// ---- size classes ----

#[test]
fn classes_waste_less_than_an_eighth_and_cover_the_ladder() {
    let mut seen = [false; CLASS_COUNT];
    for granules in 1..=SLAB_BYTES / GRANULE {
        let size = granules * GRANULE;
        let class = size_class_for(size);
        assert!(class.slot_bytes >= size);
        assert_eq!(class.slot_bytes % GRANULE, 0);
        assert!(
            (class.slot_bytes - size) * 8 < size.max(8 * GRANULE),
            "{size}"
        );
        seen[class.index] = true;
        // A class is its own class, and the index orders the classes.
        assert_eq!(size_class_for(class.slot_bytes), class);
    }
    assert!(seen.iter().all(|&hit| hit));
    assert_eq!(size_class_for(1).slot_bytes, GRANULE);
    assert_eq!(size_class_for(SLAB_BYTES).index, CLASS_COUNT - 1);
}

#[test]
fn every_class_finds_a_span_with_at_most_an_eighth_of_slack() {
    for granules in 1..=SLAB_BYTES / GRANULE {
        let slot_bytes = size_class_for(granules * GRANULE).slot_bytes;
        let slabs = preferred_span_slabs(slot_bytes);
        let span_bytes = slabs * SLAB_BYTES;
        assert!((span_bytes % slot_bytes) * 8 <= span_bytes, "{slot_bytes}");
        assert!(slabs <= 5, "{slot_bytes} takes {slabs} slabs");
    }
    assert_eq!(preferred_span_slabs(16 * KIB), 1);
    assert_eq!(preferred_span_slabs(MIB), 1);
}

#[test]
fn kv_part_sizes_have_no_internal_waste() {
    let mut pool = allocator(GIB);
    for size in KV_PART_SIZES {
        pool.allocate(0, size).unwrap();
    }
    assert_eq!(pool.used_bytes(), pool.reserved_bytes());
    assert_eq!(
        pool.stats().class_free_bytes,
        3 * SLAB_BYTES - 16 * KIB - 64 * KIB - MIB
    );
}

// ---- edge cases ----

#[test]
fn zero_size_is_refused() {
    let mut pool = allocator(64 * MIB);
    assert_eq!(pool.allocate(0, 0), Err(AllocError::ZeroSize));
    assert_empty(&pool);
}

#[test]
fn larger_than_capacity_is_refused_up_to_u64_max() {
    let mut pool = allocator(64 * MIB + 100);
    let capacity = 64 * MIB;
    for size in [capacity + 1, capacity + GRANULE, u64::MAX - 1, u64::MAX] {
        assert_eq!(
            pool.allocate(0, size),
            Err(AllocError::TooLarge { size, capacity })
        );
    }
    assert_empty(&pool);
}

#[test]
fn capacity_is_rounded_down_and_must_hold_a_granule() {
    assert_eq!(allocator(10 * GRANULE + 511).capacity(), 10 * GRANULE);
    assert_eq!(allocator(GRANULE).capacity(), GRANULE);
    for capacity in [0, 1, GRANULE - 1] {
        assert_eq!(
            PoolAllocator::new(capacity).unwrap_err(),
            AllocError::CapacityTooSmall { capacity }
        );
    }
    let huge = allocator(u64::MAX);
    assert_eq!(huge.capacity(), u64::MAX - 511);
    assert_empty(&huge);
}

#[test]
fn huge_region_serves_and_refuses_without_overflow() {
    let mut pool = allocator(u64::MAX);
    let capacity = pool.capacity();
    let offset = pool.allocate(0, capacity).unwrap();
    assert_eq!(offset, 0);
    assert_eq!(pool.reserved_bytes(), capacity);
    assert_eq!(pool.allocate(0, 1), Err(AllocError::Full { size: 1 }));
    assert_eq!(pool.free(0), Ok(capacity));
    let near_end = pool.allocate(0, capacity - SLAB_BYTES).unwrap();
    let last = pool.allocate(0, SLAB_BYTES - GRANULE).unwrap();
    assert!(last >= near_end + capacity - SLAB_BYTES);
    assert_eq!(
        pool.free(u64::MAX),
        Err(AllocError::UnknownAllocation { offset: u64::MAX })
    );
}

#[test]
fn exactly_capacity_allocation_succeeds_for_any_capacity() {
    let capacities = [
        GRANULE,
        1000 * GRANULE,
        SLAB_BYTES,
        SLAB_BYTES + GRANULE,
        3 * MIB,
        64 * MIB,
        64 * MIB + 700,
    ];
    for capacity in capacities {
        let mut pool = allocator(capacity);
        let whole = pool.capacity();
        assert_eq!(pool.allocate(0, whole), Ok(0), "capacity {capacity}");
        assert_eq!(pool.allocate(0, 1), Err(AllocError::Full { size: 1 }));
        assert_eq!(pool.free(0), Ok(whole));
        assert_empty(&pool);
    }
}

#[test]
fn region_smaller_than_a_slab_fills_its_partial_slab() {
    let mut pool = allocator(700 * KIB + 123);
    let mut offsets = Vec::new();
    while let Ok(offset) = pool.allocate(0, 16 * KIB) {
        assert!(offset + 16 * KIB <= pool.capacity());
        offsets.push(offset);
    }
    assert_eq!(offsets.len(), 43);
    assert_eq!(
        pool.allocate(0, 16 * KIB),
        Err(AllocError::Full { size: 16 * KIB })
    );
    // What is left (700 KiB - 43 * 16 KiB = 12 KiB) is the span's tail slack.
    assert_eq!(pool.stats().class_free_bytes, 12 * KIB);
    assert_eq!(pool.free(offsets[7]), Ok(16 * KIB));
    assert_eq!(pool.allocate(0, 16 * KIB), Ok(offsets[7]));
}

#[test]
fn full_refuses_then_a_free_makes_room() {
    let mut pool = allocator(8 * MIB);
    let first = pool.allocate(0, 4 * MIB).unwrap();
    let second = pool.allocate(0, 4 * MIB).unwrap();
    assert_eq!(
        pool.allocate(0, GRANULE),
        Err(AllocError::Full { size: GRANULE })
    );
    let before = pool.stats();
    assert_eq!(
        pool.allocate(0, 4 * MIB),
        Err(AllocError::Full { size: 4 * MIB })
    );
    assert_eq!(pool.stats(), before);
    assert_eq!(pool.free(second), Ok(4 * MIB));
    assert_eq!(pool.allocate(0, 3 * MIB + 1), Ok(second));
    assert_eq!(pool.free(first), Ok(4 * MIB));
    assert_eq!(pool.allocate(0, 64 * KIB), Ok(first));
}

#[test]
fn bogus_and_double_frees_change_nothing() {
    let mut pool = allocator(16 * MIB);
    let small = pool.allocate(0, 16 * KIB).unwrap();
    let large = pool.allocate(0, 5 * MIB).unwrap();
    let before = pool.stats();
    let bogus = [
        small + GRANULE,
        small + 1,
        small + 16 * KIB * 5,
        large + SLAB_BYTES,
        large + GRANULE,
        15 * MIB,
        16 * MIB,
        u64::MAX,
    ];
    for offset in bogus {
        assert_eq!(
            pool.free(offset),
            Err(AllocError::UnknownAllocation { offset })
        );
        assert_eq!(pool.stats(), before);
    }
    assert_eq!(pool.free(small), Ok(16 * KIB));
    assert_eq!(
        pool.free(small),
        Err(AllocError::UnknownAllocation { offset: small })
    );
    assert_eq!(pool.free(large), Ok(5 * MIB));
    assert_eq!(
        pool.free(large),
        Err(AllocError::UnknownAllocation { offset: large })
    );
    assert_empty(&pool);
}

#[test]
fn empty_spans_go_back_and_runs_coalesce() {
    let mut pool = allocator(32 * MIB);
    let blocks: Vec<u64> = (0..200)
        .map(|_| pool.allocate(0, 64 * KIB).unwrap())
        .collect();
    let large = pool.allocate(0, 9 * MIB).unwrap();
    assert_eq!(pool.stats().class_spans, 7);
    for offset in blocks.iter().rev() {
        pool.free(*offset).unwrap();
    }
    let stats = pool.stats();
    assert_eq!(stats.class_spans, 0);
    assert_eq!(stats.free_runs, 2);
    pool.free(large).unwrap();
    assert_empty(&pool);
}

#[test]
fn a_rare_class_uses_one_slab_spans_a_busy_one_its_preferred_length() {
    let slot = 1152 * KIB;
    assert_eq!(preferred_span_slabs(slot), 3);
    let mut pool = allocator(64 * MIB);
    for _ in 0..4 {
        pool.allocate(0, slot).unwrap();
    }
    // Three one-slab spans of one slot, then a three-slab span of five slots.
    let stats = pool.stats();
    assert_eq!(stats.class_spans, 4);
    assert_eq!(
        stats.class_free_bytes,
        3 * (SLAB_BYTES - slot) + 3 * SLAB_BYTES - slot
    );
    for _ in 0..4 {
        pool.allocate(0, slot).unwrap();
    }
    assert_eq!(pool.stats().class_spans, 4);
    assert_eq!(pool.stats().free_bytes, 64 * MIB - 6 * SLAB_BYTES);
}

// ---- model-based property test ----

#[derive(Debug, Clone)]
enum Op {
    Allocate(Tenant, u64),
    /// Frees the live allocation at this position (mod the number live).
    Free(usize),
    /// Frees again an offset freed before (mod the number freed).
    FreeAgain(usize),
    /// Frees an arbitrary offset.
    FreeBogus(u64),
}

fn request_size() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 1u64..=8 * KIB,
        3 => 8 * KIB..=512 * KIB,
        2 => 512 * KIB..=9 * MIB,
        1 => Just(16 * KIB),
        1 => Just(64 * KIB),
        1 => Just(MIB),
        1 => Just(4 * MIB),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..3 as Tenant, request_size()).prop_map(|(tenant, size)| Op::Allocate(tenant, size)),
        4 => any::<usize>().prop_map(Op::Free),
        1 => any::<usize>().prop_map(Op::FreeAgain),
        1 => prop_oneof![0u64..64 * MIB, any::<u64>()].prop_map(Op::FreeBogus),
    ]
}

fn region_capacity() -> impl Strategy<Value = u64> {
    prop_oneof![Just(64 * MIB + 1000), GRANULE..3 * MIB, 8 * MIB..40 * MIB,]
}

/// The live allocations as the allocator must see them: offset → requested size and tenant.
#[derive(Default)]
struct Model {
    live: BTreeMap<u64, (u64, Tenant)>,
    freed: Vec<u64>,
}

impl Model {
    fn assert_no_overlap(&self, offset: u64, size: u64) {
        if let Some((&before, &(before_size, _))) = self.live.range(..=offset).next_back() {
            assert!(
                before + before_size <= offset,
                "overlaps {before}+{before_size}"
            );
        }
        if let Some((&after, _)) = self.live.range(offset..).next() {
            assert!(offset + size <= after, "overlaps {after}");
        }
    }

    fn nth_live(&self, position: usize) -> Option<u64> {
        let count = self.live.len();
        (count > 0).then(|| *self.live.keys().nth(position % count).unwrap())
    }
}

fn apply(pool: &mut PoolAllocator, model: &mut Model, op: &Op) {
    match *op {
        Op::Allocate(tenant, size) => check_allocate(pool, model, tenant, size),
        Op::Free(position) => {
            if let Some(offset) = model.nth_live(position) {
                let (size, _) = model.live.remove(&offset).unwrap();
                assert_eq!(pool.free(offset), Ok(size));
                model.freed.push(offset);
            }
        }
        Op::FreeAgain(position) => {
            if !model.freed.is_empty() {
                let offset = model.freed[position % model.freed.len()];
                check_refused_free(pool, model, offset);
            }
        }
        Op::FreeBogus(offset) => check_refused_free(pool, model, offset),
    }
}

fn check_allocate(pool: &mut PoolAllocator, model: &mut Model, tenant: Tenant, size: u64) {
    let before = pool.stats();
    match pool.allocate(tenant, size) {
        Ok(offset) => {
            assert_eq!(offset % GRANULE, 0);
            assert!(offset.checked_add(size).unwrap() <= pool.capacity());
            model.assert_no_overlap(offset, size);
            model.live.insert(offset, (size, tenant));
        }
        Err(AllocError::TooLarge { .. }) => assert!(size > pool.capacity()),
        Err(AllocError::Full { size: refused }) => {
            assert_eq!(refused, size);
            assert!(size <= pool.capacity());
            assert_eq!(pool.stats(), before);
        }
        Err(other) => panic!("unexpected {other:?}"),
    }
}

/// Frees an offset where the model has no live allocation start, expecting a refusal that
/// changes nothing.
fn check_refused_free(pool: &mut PoolAllocator, model: &Model, offset: u64) {
    if model.live.contains_key(&offset) {
        return;
    }
    let before = pool.stats();
    assert_eq!(
        pool.free(offset),
        Err(AllocError::UnknownAllocation { offset })
    );
    assert_eq!(pool.stats(), before);
}

/// The allocator's accounting after an operation: it adds up, its usage and live count are
/// the model's, its owned runs are disjoint slab runs, and every live allocation lies in a
/// run of its own tenant.
fn check_against_model(pool: &PoolAllocator, model: &Model) -> Result<(), TestCaseError> {
    let stats = pool.stats();
    assert_accounting_adds_up(&stats);
    let used: u64 = model.live.values().map(|&(size, _)| size).sum();
    prop_assert_eq!(stats.used_bytes, used);
    prop_assert_eq!(stats.live_allocations, model.live.len());
    prop_assert_eq!(pool.live_allocations(), model.live.len());
    let runs: Vec<OwnedRun> = pool.owned_runs().collect();
    for pair in runs.windows(2) {
        prop_assert!(pair[0].offset + pair[0].len <= pair[1].offset, "{:?}", pair);
    }
    for (&offset, &(size, tenant)) in &model.live {
        let run = runs.iter().rev().find(|run| run.offset <= offset);
        let inside = run.is_some_and(|run| {
            run.offset % SLAB_BYTES == 0 && offset + size <= run.offset + run.len
        });
        prop_assert!(
            inside,
            "{size} bytes at {offset} outside an owned run: {run:?}"
        );
        prop_assert_eq!(run.map(|run| run.tenant), Some(tenant), "at {}", offset);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn random_operations_match_the_model(
        capacity in region_capacity(),
        ops in prop::collection::vec(op(), 1..300),
    ) {
        let mut pool = allocator(capacity);
        let mut model = Model::default();
        for op in &ops {
            apply(&mut pool, &mut model, op);
            check_against_model(&pool, &model)?;
        }
        free_all(&mut pool, &mut model)?;
    }
}

/// Frees every live allocation of the model, expecting its size back, and checks the
/// allocator is empty then.
fn free_all(pool: &mut PoolAllocator, model: &mut Model) -> Result<(), TestCaseError> {
    let offsets: Vec<u64> = model.live.keys().copied().collect();
    for offset in offsets {
        let (size, _) = model.live.remove(&offset).unwrap();
        prop_assert_eq!(pool.free(offset), Ok(size));
    }
    assert_empty(pool);
    prop_assert_eq!(pool.owned_runs().count(), 0);
    Ok(())
}

// ---- reporting ownership ----

/// Who holds what, as the reported changes say: owned runs and held runs, by offset.
#[derive(Default)]
struct Replayed {
    owned: BTreeMap<u64, OwnedRun>,
    held: BTreeMap<u64, u64>,
}

impl Replayed {
    /// Applies the changes `pool` recorded, checking that a granted run overlaps nothing
    /// owned or held and a released one was owned as recorded.
    fn apply(&mut self, pool: &mut PoolAllocator) -> Result<(), TestCaseError> {
        for change in pool.take_changes() {
            match change {
                OwnershipChange::Granted(run) => {
                    let end = run.offset + run.len;
                    let overlaps =
                        |(&offset, &len): (&u64, &u64)| offset < end && run.offset < offset + len;
                    prop_assert!(!self.held.iter().any(overlaps), "{run:?} was held");
                    let owned = self.owned.values().map(|r| (&r.offset, &r.len));
                    prop_assert!(!owned.into_iter().any(overlaps), "{run:?} overlaps");
                    self.owned.insert(run.offset, run);
                }
                OwnershipChange::Released(run) => {
                    prop_assert_eq!(self.owned.remove(&run.offset), Some(run));
                    self.held.insert(run.offset, run.len);
                }
            }
        }
        let reported: Vec<OwnedRun> = self.owned.values().copied().collect();
        prop_assert_eq!(reported, pool.owned_runs().collect::<Vec<_>>());
        prop_assert_eq!(self.held.values().sum::<u64>(), pool.stats().held_bytes);
        Ok(())
    }

    /// Reclaims the held run at this position (mod the number held).
    fn reclaim(&mut self, pool: &mut PoolAllocator, position: usize) -> Result<(), TestCaseError> {
        let Some(&offset) = self.held.keys().nth(position % self.held.len().max(1)) else {
            return Ok(());
        };
        prop_assert!(pool.reclaim(offset));
        prop_assert!(!pool.reclaim(offset), "twice");
        self.held.remove(&offset);
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(100))]

    /// While ownership is reported, the changes replayed give the owned runs exactly, a run
    /// is granted only when nothing owns or holds it, released runs stay out of use until
    /// reclaimed, and reclaiming them all empties the allocator.
    #[test]
    fn reported_changes_replay_to_the_owned_runs_and_held_runs_stay_unused(
        capacity in region_capacity(),
        before in prop::collection::vec(op(), 0..50),
        ops in prop::collection::vec((op(), any::<Option<usize>>()), 1..300),
    ) {
        let mut pool = allocator(capacity);
        let mut model = Model::default();
        for op in &before {
            apply(&mut pool, &mut model, op);
        }
        pool.report_ownership();
        let mut replayed = Replayed::default();
        for (op, reclaim) in &ops {
            apply(&mut pool, &mut model, op);
            check_against_model(&pool, &model)?;
            replayed.apply(&mut pool)?;
            if let Some(position) = reclaim {
                replayed.reclaim(&mut pool, *position)?;
            }
        }
        prop_assert!(!pool.reclaim(1), "an unaligned offset holds no run");
        let offsets: Vec<u64> = model.live.keys().copied().collect();
        for offset in offsets {
            let (size, _) = model.live.remove(&offset).unwrap();
            prop_assert_eq!(pool.free(offset), Ok(size));
        }
        replayed.apply(&mut pool)?;
        prop_assert!(replayed.owned.is_empty());
        while !replayed.held.is_empty() {
            replayed.reclaim(&mut pool, 0)?;
        }
        assert_empty(&pool);
    }
}

// ---- adopting an earlier process's parts ----

/// Adopted parts from (offset, size, tenant).
fn adopted(parts: &[(u64, u64, Tenant)]) -> Vec<AdoptedPart> {
    let part = |&(offset, size, tenant): &(u64, u64, Tenant)| AdoptedPart {
        offset,
        size,
        tenant,
    };
    parts.iter().map(part).collect()
}

#[test]
fn adopted_parts_are_live_until_freed_and_their_slabs_hold_nothing_else() {
    let capacity = 16 * MIB;
    // Two parts in slab 0, one straddling slabs 1 and 2, one whole-slab part at slab 5.
    let parts = adopted(&[
        (0, 16 * KIB, 1),
        (64 * KIB, 1000, 1),
        (4 * MIB - 512, 4 * KIB, 2),
        (10 * MIB, 2 * MIB, 1),
    ]);
    let mut pool = PoolAllocator::with_adopted(capacity, &parts).expect("adopt");
    let stats = pool.stats();
    assert_accounting_adds_up(&stats);
    assert_eq!(stats.live_allocations, 4);
    assert_eq!(stats.used_bytes, parts.iter().map(|p| p.size).sum::<u64>());
    let runs: Vec<(Tenant, u64, u64)> = pool
        .owned_runs()
        .map(|run| (run.tenant, run.offset, run.len))
        .collect();
    let expected = [
        (1, 0, 2 * MIB),
        (2, 2 * MIB, 4 * MIB),
        (1, 10 * MIB, 2 * MIB),
    ];
    assert_eq!(runs, expected, "the adopted runs keep their parts' tenants");
    assert_eq!(stats.reserved_bytes, 4 * SLAB_BYTES, "slabs 0, 1-2 and 5");
    // New parts never land on an adopted slab.
    let mut placed = Vec::new();
    while let Ok(offset) = pool.allocate(0, 64 * KIB) {
        let slab = offset / SLAB_BYTES;
        assert!(
            ![0, 1, 2, 5].contains(&slab),
            "placed at {offset} in an adopted slab"
        );
        placed.push(offset);
    }
    assert_eq!(
        placed.len() as u64,
        4 * SLAB_BYTES / (64 * KIB),
        "the 4 other slabs fill"
    );
    // Bogus frees inside an adopted run change nothing; real ones release the slabs.
    let before = pool.stats();
    assert_eq!(
        pool.free(512),
        Err(AllocError::UnknownAllocation { offset: 512 })
    );
    assert_eq!(pool.stats(), before);
    assert_eq!(pool.free(0), Ok(16 * KIB));
    assert_eq!(pool.free(64 * KIB), Ok(1000));
    assert_eq!(
        pool.free(0),
        Err(AllocError::UnknownAllocation { offset: 0 })
    );
    let slab_zero = pool.allocate(0, 64 * KIB).expect("slab 0 is free again");
    assert_eq!(slab_zero / SLAB_BYTES, 0);
    pool.free(slab_zero).unwrap();
    for offset in placed {
        pool.free(offset).unwrap();
    }
    assert_eq!(pool.free(4 * MIB - 512), Ok(4 * KIB));
    assert_eq!(pool.free(10 * MIB), Ok(2 * MIB));
    assert_empty(&pool);
}

#[test]
fn bad_adoptions_are_refused() {
    let refused = |parts: &[(u64, u64, Tenant)], why: &str| match PoolAllocator::with_adopted(
        8 * MIB,
        &adopted(parts),
    ) {
        Err(AllocError::BadAdoption { reason, .. }) => assert_eq!(reason, why),
        other => panic!("{parts:?}: {other:?}"),
    };
    refused(&[(0, 0, 0)], "empty");
    refused(&[(100, 8, 0)], "not granule-aligned");
    refused(&[(8 * MIB - 512, 1024, 0)], "outside the region");
    refused(&[(u64::MAX - 511, 1024, 0)], "outside the region");
    refused(&[(0, 4096, 0), (3584, 512, 0)], "overlaps another part");
    let shared = "shares a slab with another tenant's part";
    refused(&[(0, 4096, 0), (MIB, 512, 1)], shared);
    refused(&[(MIB, 2 * MIB, 0), (3 * MIB, 512, 1)], shared);
    let empty = PoolAllocator::with_adopted(8 * MIB, &[]).expect("nothing to adopt");
    assert_empty(&empty);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(100))]

    /// The live parts of one allocator, adopted by a fresh one, behave as if never moved:
    /// further random operations match the model, and freeing everything empties it.
    #[test]
    fn adopted_parts_and_new_operations_match_the_model(
        capacity in region_capacity(),
        before in prop::collection::vec(op(), 1..200),
        after in prop::collection::vec(op(), 1..200),
    ) {
        let mut earlier = allocator(capacity);
        let mut model = Model::default();
        for op in &before {
            apply(&mut earlier, &mut model, op);
        }
        let parts: Vec<AdoptedPart> = model.live.iter().map(AdoptedPart::from).collect();
        let mut pool = PoolAllocator::with_adopted(capacity, &parts).expect("adopt");
        check_against_model(&pool, &model)?;
        prop_assert_eq!(pool.used_bytes(), earlier.used_bytes());
        model.freed.clear();
        for op in &after {
            apply(&mut pool, &mut model, op);
            check_against_model(&pool, &model)?;
        }
        free_all(&mut pool, &mut model)?;
    }
}

// ---- fragmentation under a mixed KV workload ----

/// SplitMix64: a small deterministic generator, enough for workload draws.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}

/// A request mix: fixed block part sizes with weights, plus a weight of odd sizes drawn
/// uniformly from `1..=odd_max` bytes. Weights are per 100 requests.
struct Workload {
    fixed: &'static [(u64, u64)],
    odd_weight: u64,
    odd_max: u64,
}

/// A pool serving a few models: each model has its own fixed part sizes, and 5% of the
/// requests have sizes no model shares.
const SEVERAL_MODELS: Workload = Workload {
    fixed: &[
        (16 * KIB, 30),
        (64 * KIB, 20),
        (MIB, 10),
        (4 * MIB, 5),
        (24 * KIB, 10),
        (40 * KIB, 5),
        (320 * KIB, 5),
        (2560 * KIB, 5),
        (6 * MIB, 5),
    ],
    odd_weight: 5,
    odd_max: 6 * MIB,
};

/// A harsher mix: the four common part sizes and 20% odd sizes.
const MANY_ODD_SIZES: Workload = Workload {
    fixed: &[(16 * KIB, 40), (64 * KIB, 25), (MIB, 10), (4 * MIB, 5)],
    odd_weight: 20,
    odd_max: 6 * MIB,
};

impl Workload {
    fn draw(&self, rng: &mut Rng) -> u64 {
        let mut draw = rng.below(100);
        for &(size, weight) in self.fixed {
            if draw < weight {
                return size;
            }
            draw -= weight;
        }
        assert!(draw < self.odd_weight, "weights must add up to 100");
        1 + rng.below(self.odd_max)
    }

    fn fixed_weight(&self) -> u64 {
        self.fixed.iter().map(|&(_, weight)| weight).sum()
    }
}

/// Bytes a stream of `size` requests could take now: free slots of its class, plus the
/// slots or runs of it that fit in the free slab runs.
fn usable_bytes_for(pool: &PoolAllocator, size: u64) -> u64 {
    let unit = pool.reserved_size_for(size).unwrap();
    let geometry = pool.slab_pool.geometry();
    let in_runs: u64 = pool
        .slab_pool
        .free_runs()
        .map(|run| geometry.run_bytes(run) / unit * unit)
        .sum();
    let class_index = slot_request(size).map(|_| size_class_for(size).index);
    let in_open_slots: u64 = pool
        .owners
        .values()
        .filter_map(|owned| match &owned.owner {
            Owner::Span(span) if Some(span.class.index) == class_index => {
                Some(span.free_slot_count() as u64 * unit)
            }
            _ => None,
        })
        .sum();
    in_runs + in_open_slots
}

/// Free bytes the next fixed-size request of `workload` cannot use, expected over its
/// sizes (see the module doc).
fn stranded_bytes(pool: &PoolAllocator, workload: &Workload) -> f64 {
    let free = pool.capacity() - pool.reserved_bytes();
    let total_weight = workload.fixed_weight() as f64;
    workload
        .fixed
        .iter()
        .map(|&(size, weight)| {
            let unusable = free - usable_bytes_for(pool, size).min(free);
            weight as f64 / total_weight * unusable as f64
        })
        .sum()
}

/// Every fixed size of `workload` can be placed (and is freed again) when the free bytes
/// allow it.
fn assert_fixed_sizes_fit(pool: &mut PoolAllocator, workload: &Workload) {
    for &(size, _) in workload.fixed {
        let free = pool.capacity() - pool.reserved_bytes();
        if free < pool.reserved_size_for(size).unwrap() {
            continue;
        }
        let offset = pool
            .allocate(0, size)
            .unwrap_or_else(|error| panic!("{size} bytes with {free} free: {error}"));
        pool.free(offset).unwrap();
    }
}

/// What a fragmentation run measured, summed over its samples.
#[derive(Debug, Default)]
struct FragmentationReport {
    samples: u32,
    /// Stranded bytes over free bytes: sum and worst.
    of_free_sum: f64,
    of_free_worst: f64,
    /// Stranded bytes over capacity: sum and worst.
    of_capacity_sum: f64,
    of_capacity_worst: f64,
    class_slack_of_free_sum: f64,
    reserved_over_used_sum: f64,
    failed_allocations: u64,
}

impl FragmentationReport {
    fn add_sample(&mut self, pool: &PoolAllocator, workload: &Workload) {
        let stats = pool.stats();
        assert_accounting_adds_up(&stats);
        let stranded = stranded_bytes(pool, workload);
        let free = (stats.capacity - stats.reserved_bytes) as f64;
        let of_free = stranded / free;
        let of_capacity = stranded / stats.capacity as f64;
        self.samples += 1;
        self.of_free_sum += of_free;
        self.of_free_worst = self.of_free_worst.max(of_free);
        self.of_capacity_sum += of_capacity;
        self.of_capacity_worst = self.of_capacity_worst.max(of_capacity);
        self.class_slack_of_free_sum += stats.class_free_bytes as f64 / free;
        self.reserved_over_used_sum += stats.reserved_bytes as f64 / stats.used_bytes as f64;
    }

    fn print(&self, name: &str, capacity: u64, operations: u64) {
        let samples = f64::from(self.samples);
        println!(
            "{name}: {} GiB, {operations} ops, {} samples at 89-90% fill: stranded \
             {:.2}% of capacity (worst {:.2}%), {:.1}% of free bytes (worst {:.1}%); \
             class slack {:.1}% of free bytes; reserved/used {:.4}; {} refusals below the \
             fill target",
            capacity / GIB,
            self.samples,
            self.of_capacity_sum / samples * 100.0,
            self.of_capacity_worst * 100.0,
            self.of_free_sum / samples * 100.0,
            self.of_free_worst * 100.0,
            self.class_slack_of_free_sum / samples * 100.0,
            self.reserved_over_used_sum / samples,
            self.failed_allocations,
        );
    }
}

/// Runs `operations` random operations holding the region near 90% reserved: allocate while
/// below, free a random live allocation while above. Every 500 operations past the first
/// tenth, at 89-90% fill, samples the fragmentation and checks the fixed sizes still fit.
fn run_workload(workload: &Workload, capacity: u64, operations: u64) -> FragmentationReport {
    let mut pool = allocator(capacity);
    let mut rng = Rng(0x5EED);
    let mut live: Vec<u64> = Vec::new();
    let mut report = FragmentationReport::default();
    let target = capacity / 10 * 9;
    for operation in 0..operations {
        if pool.reserved_bytes() < target {
            match pool.allocate(0, workload.draw(&mut rng)) {
                Ok(offset) => live.push(offset),
                Err(_) => report.failed_allocations += 1,
            }
        } else {
            let victim = live.swap_remove(rng.below(live.len() as u64) as usize);
            pool.free(victim).unwrap();
        }
        let warmed_up = operation > operations / 10;
        let filled = pool.reserved_bytes() * 100 >= capacity * 89;
        if warmed_up && filled && operation % 500 == 0 {
            report.add_sample(&pool, workload);
            assert_fixed_sizes_fit(&mut pool, workload);
        }
    }
    report
}

fn check_fragmentation(capacity: u64, operations: u64) {
    let several = run_workload(&SEVERAL_MODELS, capacity, operations);
    several.print("several models", capacity, operations);
    let odd = run_workload(&MANY_ODD_SIZES, capacity, operations);
    odd.print("many odd sizes", capacity, operations);
    for report in [&several, &odd] {
        assert!(report.samples > 50, "{report:?}");
        assert_eq!(report.failed_allocations, 0, "{report:?}");
    }
    // The asserted definition: stranded bytes as a share of capacity, at most 10%. At 90%
    // fill that bound alone is nearly empty (free bytes are 10% of capacity), so tighter
    // bounds guard the measured figures (about 2-3% mean, 4% worst) against regressions.
    for report in [&several, &odd] {
        assert!(report.of_capacity_worst <= 0.10, "{report:?}");
    }
    assert!(several.of_capacity_worst <= 0.04, "{several:?}");
    assert!(odd.of_capacity_worst <= 0.06, "{odd:?}");
    // As a share of the free bytes the stranded bytes are far higher; bound them loosely.
    assert!(several.of_free_worst <= 0.35, "{several:?}");
    assert!(odd.of_free_worst <= 0.55, "{odd:?}");
}

#[test]
fn fragmentation_stays_low_at_ninety_percent_fill() {
    check_fragmentation(4 * GIB, 100_000);
}

#[test]
#[ignore = "10^6 operations; run with --release --ignored"]
fn fragmentation_stays_low_at_ninety_percent_fill_for_a_million_operations() {
    check_fragmentation(16 * GIB, 1_000_000);
}
