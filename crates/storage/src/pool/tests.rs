//! The pool backend on its own: membership, placement, URIs, frees, death and the ramp.

use std::time::{Duration, Instant};

use super::nodes::Nodes;
use super::*;
use crate::{BlockSpec, BlockToAllocate, StorageSpec};

fn pool() -> MemPool {
    MemPool::new(StorageConfig {
        global_unique_name: "pool_01".into(),
        spec: StorageSpec::TairMemPool {
            domain: "d".into(),
            timeout: 0,
            enable_vipserver: false,
            service_discovery_url: String::new(),
            media_type: 0,
        },
        check_storage_available_when_open: false,
    })
}

fn join(node_id: &str, capacity: u64) -> PoolNodeJoin {
    PoolNodeJoin {
        node_id: node_id.into(),
        endpoint: format!("{node_id}:1"),
        capacity,
        resume_range_id: None,
        isolated: false,
    }
}

fn specs() -> Vec<BlockSpec> {
    vec![
        BlockSpec {
            name: "tp0".into(),
            size: 16 << 10,
        },
        BlockSpec {
            name: "tp1".into(),
            size: 16 << 10,
        },
    ]
}

fn blocks(keys: std::ops::Range<i64>) -> Vec<BlockToAllocate> {
    keys.map(|key| BlockToAllocate {
        key,
        spec_indexes: vec![0, 1],
    })
    .collect()
}

fn place(
    pool: &MemPool,
    keys: std::ops::Range<i64>,
) -> Result<Vec<Vec<AllocatedSpec>>, StorageError> {
    place_for(pool, "inst", keys)
}

fn place_for(
    pool: &MemPool,
    instance_id: &str,
    keys: std::ops::Range<i64>,
) -> Result<Vec<Vec<AllocatedSpec>>, StorageError> {
    let specs = specs();
    let blocks = blocks(keys);
    pool.allocate(&AllocationRequest {
        instance_id,
        specs: &specs,
        blocks: &blocks,
    })
}

#[test]
fn an_isolating_node_learns_who_owns_what_and_a_given_up_run_waits_for_it() {
    use crate::allocator::{OwnedRun, OwnershipChange, SLAB_BYTES};
    let open = pool();
    let range_id = open.join(join("open", 1 << 20)).unwrap().0.range_id;
    let answer = open
        .heartbeat(("open", range_id), Applied::default())
        .unwrap();
    assert!(
        answer.is_none(),
        "a node that does not isolate is told nothing"
    );
    let pool = pool();
    let node = PoolNodeJoin {
        isolated: true,
        ..join("n1", 4 * SLAB_BYTES)
    };
    let range_id = pool.join(node).unwrap().0.range_id;
    let beat_in = |feed, version| {
        let applied = Applied { feed, version };
        pool.heartbeat(("n1", range_id), applied).unwrap().unwrap()
    };
    let nothing = beat_in(0, 0);
    assert!(
        nothing.snapshot,
        "a node that applied nothing gets a snapshot"
    );
    assert_eq!((nothing.version, nothing.changes.len()), (0, 0));
    let beat = |version| beat_in(nothing.feed, version);
    // 64 blocks of two 16 KiB parts fill one slab.
    let a = place_for(&pool, "a", 0..64).unwrap();
    place_for(&pool, "b", 0..64).unwrap();
    let run = |tenant, slab| OwnedRun {
        tenant,
        offset: slab * SLAB_BYTES,
        len: SLAB_BYTES,
    };
    let granted = beat(0);
    assert_eq!(granted.version, 2);
    assert!(!granted.snapshot);
    let expected = [run(0, 0), run(1, 1)].map(OwnershipChange::Granted);
    assert_eq!(granted.changes, expected, "the tenants of a then b");
    let uris: Vec<String> = a.iter().flatten().map(|p| p.uri.clone()).collect();
    pool.delete(&uris).unwrap();
    let released = beat(2);
    assert_eq!(released.version, 3);
    assert_eq!(released.changes, [OwnershipChange::Released(run(0, 0))]);
    // Until the node applied version 3, slab 0 is placed for no one: b fills the two
    // free slabs and then finds no room.
    place_for(&pool, "b", 64..192).unwrap();
    assert!(matches!(
        place_for(&pool, "b", 192..193),
        Err(StorageError::Full(_))
    ));
    let caught_up = beat(3);
    assert_eq!(
        caught_up.changes,
        [2, 3].map(|slab| OwnershipChange::Granted(run(1, slab)))
    );
    place_for(&pool, "b", 192..193).expect("slab 0 is b's once the node applied its release");
    assert_eq!(beat(5).changes, [OwnershipChange::Granted(run(1, 0))]);
    // A node that names a version this feed never had gets a snapshot.
    let snapshot = beat(99);
    assert!(snapshot.snapshot);
    assert_eq!(snapshot.version, 6);
    let every = [0, 1, 2, 3].map(|slab| OwnershipChange::Granted(run(1, slab)));
    assert_eq!(snapshot.changes, every);
}

#[test]
fn an_adopted_part_in_a_slab_of_another_instance_is_refused_and_the_rest_resume() {
    let after = pool();
    let name = incarnation_name(7, "n1");
    let adopt_for = |instance_id, block, size| {
        after.adopt(&NamedPart {
            instance_id,
            name: &name,
            block,
            size,
        })
    };
    adopt_for("a", 0, 16 << 10).expect("a's part in slab 0");
    let refused = adopt_for("b", 64, 16 << 10);
    assert!(
        matches!(&refused, Err(StorageError::InvalidRequest(why)) if why.contains("shares a slab")),
        "{refused:?}"
    );
    adopt_for("b", 4096, 16 << 10).expect("b's part in slab 1");
    let resume = PoolNodeJoin {
        resume_range_id: Some(7),
        ..join("n1", 8 << 20)
    };
    let (membership, _) = after.join(resume).unwrap();
    assert_eq!(membership.range_id, 7, "the node resumes its incarnation");
    assert_eq!(after.nodes()[0].used, 2 * (16 << 10));
}

#[test]
fn instances_never_share_a_slab_of_a_node() {
    let pool = pool();
    pool.join(join("n1", 16 << 20)).unwrap();
    let mut slabs_of = std::collections::HashMap::<&str, Vec<u64>>::new();
    for round in 0..32 {
        for instance in ["a", "b", "c"] {
            let placed = place_for(&pool, instance, round * 4..round * 4 + 4).expect("room");
            for part in placed.iter().flatten() {
                let uri = PoolPartUri::parse(&part.uri).expect("pace uri");
                let first = uri.offset / crate::allocator::SLAB_BYTES;
                let last = (uri.offset + uri.size - 1) / crate::allocator::SLAB_BYTES;
                slabs_of.entry(instance).or_default().extend(first..=last);
            }
        }
    }
    let slabs = |instance: &str| -> std::collections::HashSet<u64> {
        slabs_of[instance].iter().copied().collect()
    };
    let (a, b, c) = (slabs("a"), slabs("b"), slabs("c"));
    assert!(a.is_disjoint(&b) && a.is_disjoint(&c) && b.is_disjoint(&c));
    assert_eq!(
        (a.len(), b.len(), c.len()),
        (2, 2, 2),
        "4 MiB each: 2 slabs"
    );
}

#[test]
fn blocks_land_on_a_live_node_without_overlap_and_render_the_same_uri_again() {
    let pool = pool();
    assert!(pool.check_health().is_err(), "no node yet");
    assert!(matches!(place(&pool, 0..1), Err(StorageError::Full(_))));
    let (membership, retired) = pool.join(join("n1", 1 << 20)).unwrap();
    assert!(retired.is_empty());
    pool.check_health().expect("a live node");
    let placed = place(&pool, 0..8).expect("room for 8 blocks of 32 KiB");
    let mut ranges = Vec::new();
    let mut templates = std::collections::HashSet::new();
    for (key, parts) in placed.iter().enumerate() {
        assert_eq!(parts.len(), 2);
        for (spec, part) in specs().iter().zip(parts) {
            let uri = PoolPartUri::parse(&part.uri).expect("pace uri");
            assert_eq!(uri.node_id, "n1");
            assert_eq!(uri.range_id, membership.range_id);
            assert_eq!(uri.size, 16 << 10);
            assert!(uri.offset + uri.size <= 1 << 20);
            ranges.push((uri.offset, uri.offset + uri.size));
            let mut again = String::new();
            let reference = PartRef {
                instance_id: "inst",
                key: key as i64,
                spec,
                address: part.address,
            };
            assert!(pool.write_uri(&reference, &mut again));
            assert_eq!(again, part.uri);
            assert!(pool.holds(&part.address));
            let template = pool.uri_template(&reference).expect("a template");
            let mut rendered = String::new();
            template.render(&mut rendered);
            assert_eq!(rendered, part.uri, "the template renders the same URI");
            templates.insert((template.head, template.block_shift, template.tail));
        }
    }
    assert_eq!(
        templates.len(),
        1,
        "every part of one size on one node shares its head and tail: {templates:?}"
    );
    ranges.sort_unstable();
    assert!(
        ranges.windows(2).all(|pair| pair[0].1 <= pair[1].0),
        "{ranges:?}"
    );
    assert_eq!(pool.nodes()[0].used, 8 * (32 << 10));
}

#[test]
fn a_full_pool_refuses_the_whole_request_and_deletes_free_the_bytes() {
    let pool = pool();
    pool.join(join("n1", 128 << 10)).unwrap();
    let first = place(&pool, 0..4).expect("4 blocks of 32 KiB fit in 128 KiB");
    assert!(matches!(place(&pool, 10..11), Err(StorageError::Full(_))));
    assert_eq!(
        pool.nodes()[0].used,
        128 << 10,
        "the refused request placed nothing"
    );
    let uris: Vec<String> = first[0].iter().map(|p| p.uri.clone()).collect();
    pool.delete(&uris).expect("our uris");
    assert_eq!(pool.nodes()[0].used, 96 << 10);
    assert!(pool.delete(&uris[..1]).is_err(), "double free refused");
    assert_eq!(pool.nodes()[0].used, 96 << 10);
    place(&pool, 10..11).expect("room again");
    let foreign = "pace://other/0?media_type=2&node_id=n1&range_id=1&size=1".to_string();
    assert!(matches!(
        pool.delete(&[foreign]),
        Err(StorageError::InvalidUri { .. })
    ));
}

#[test]
fn a_node_that_misses_heartbeats_dies_and_takes_nothing_more() {
    let pool = pool();
    pool.set_timing(PoolTiming {
        heartbeat: Duration::from_millis(1),
        rejoin_ramp: Duration::ZERO,
        ..PoolTiming::default()
    });
    let (membership, _) = pool.join(join("n1", 1 << 20)).unwrap();
    let placed = place(&pool, 0..1).unwrap();
    let address = placed[0][0].address;
    pool.heartbeat(("n1", membership.range_id), Applied::default())
        .expect("live");
    std::thread::sleep(Duration::from_millis(10)); // 10 ms > 3 missed 1-ms heartbeats
    assert_eq!(pool.reap(), vec![0]);
    assert!(pool.reap().is_empty(), "dies once");
    assert!(!pool.holds(&address));
    assert!(pool.check_health().is_err());
    assert!(matches!(
        pool.heartbeat(("n1", membership.range_id), Applied::default()),
        Err(StorageError::UnknownPoolNode(_))
    ));
    assert!(matches!(place(&pool, 1..2), Err(StorageError::Full(_))));
    let uris: Vec<String> = placed[0].iter().map(|p| p.uri.clone()).collect();
    pool.delete(&uris)
        .expect("freeing on a dead node does nothing");
}

#[test]
fn a_rejoin_retires_the_earlier_incarnation() {
    let pool = pool();
    let (first, _) = pool.join(join("n1", 1 << 20)).unwrap();
    let old = place(&pool, 0..1).unwrap()[0][0].address;
    let (second, retired) = pool.join(join("n1", 1 << 20)).unwrap();
    assert_eq!(retired, vec![0]);
    assert_ne!(first.range_id, second.range_id);
    assert!(!pool.holds(&old));
    let new = PoolPartUri::parse(&place(&pool, 1..2).unwrap()[0][0].uri).unwrap();
    assert_eq!(new.range_id, second.range_id);
    let statuses = pool.nodes();
    assert_eq!(statuses.iter().filter(|s| s.live).count(), 1);
}

#[test]
fn joins_with_bad_ids_endpoints_or_capacities_are_refused() {
    let pool = pool();
    for bad in [
        join("", 1 << 20),
        join("a/b", 1 << 20),
        join("a b", 1 << 20),
        join(&"x".repeat(300), 1 << 20),
        join("n", 0),
        join("n", MAX_NODE_CAPACITY + 1),
        PoolNodeJoin {
            node_id: "n".into(),
            endpoint: String::new(),
            capacity: 1 << 20,
            resume_range_id: None,
            isolated: false,
        },
    ] {
        assert!(
            matches!(pool.join(bad.clone()), Err(StorageError::InvalidRequest(_))),
            "{bad:?}"
        );
    }
    assert!(pool.nodes().is_empty(), "nothing joined");
}

/// Share of `draws` placements that land on slot `slot`.
fn share(nodes: &Nodes, slot: usize, now: Instant, draws: usize) -> f64 {
    let hits = (0..draws)
        .filter(|_| nodes.choose(now, &[]) == Some(slot))
        .count();
    hits as f64 / draws as f64
}

#[test]
fn a_rejoining_node_ramps_up_linearly() {
    let ramp = Duration::from_secs(100);
    let mut nodes = Nodes {
        timing: PoolTiming {
            heartbeat: Duration::from_secs(1),
            rejoin_ramp: ramp,
            ..PoolTiming::default()
        },
        ..Nodes::default()
    };
    let start = Instant::now();
    nodes.join(join("steady", 1 << 20), start).unwrap();
    nodes.join(join("back", 1 << 20), start).unwrap();
    let (_, retired) = nodes.join(join("back", 1 << 20), start).unwrap();
    assert_eq!(retired, vec![1]);
    // Slot 2 is the rejoined node; at a quarter of the ramp its weight is 0.25 against 1.
    let quarter = share(&nodes, 2, start + ramp / 4, 20_000);
    assert!(
        quarter <= 0.25 && quarter > 0.12,
        "share at 1/4 of the ramp: {quarter}"
    );
    let early = share(&nodes, 2, start + ramp / 100, 20_000);
    assert!(early < 0.03, "share at 1/100 of the ramp: {early}");
    let done = share(&nodes, 2, start + ramp, 20_000);
    assert!((0.45..0.55).contains(&done), "share after the ramp: {done}");
    let fresh = share(&nodes, 0, start, 20_000);
    assert!(
        fresh > 0.97,
        "a first join does not ramp; the rejoined one starts at 0: {fresh}"
    );
}

/// The durable names of the parts of `placed` (one per block, as the journal keeps them)
/// and each part's block and size.
/// Adopts a part of instance "inst" (the instance `place` writes for).
fn adopt(pool: &MemPool, name: &str, block: u32, size: u64) -> Result<PartAddress, StorageError> {
    pool.adopt(&NamedPart {
        instance_id: "inst",
        name,
        block,
        size,
    })
}

fn durable_parts(pool: &MemPool, placed: &[Vec<AllocatedSpec>]) -> Vec<(String, u32, u64)> {
    placed
        .iter()
        .flatten()
        .map(|part| match pool.durable_address(part.address) {
            crate::DurableAddress::Named(name) => (name, part.address.block, 16 << 10),
            other => panic!("a live node's part must be named: {other:?}"),
        })
        .collect()
}

#[test]
fn a_restarted_manager_finds_a_resumed_nodes_blocks_again() {
    let before = pool();
    let (membership, _) = before.join(join("n1", 8 << 20)).unwrap();
    let placed = place(&before, 0..4).unwrap();
    let uris: Vec<String> = placed.iter().flatten().map(|p| p.uri.clone()).collect();
    let parts = durable_parts(&before, &placed);

    // The next process adopts the parts: they await their node, not live, not placeable.
    let after = pool();
    let adopted: Vec<PartAddress> = parts
        .iter()
        .map(|(name, block, size)| adopt(&after, name, *block, *size).expect("adopt"))
        .collect();
    assert!(
        adopted.iter().all(|a| !after.holds(a)),
        "awaiting is not live"
    );
    assert!(after.check_health().is_err(), "no live node yet");
    assert_eq!(after.nodes()[0].used, 8 * (16 << 10));
    assert!(
        adopt(&after, &parts[0].0, parts[0].1, parts[0].2).is_err(),
        "twice"
    );
    for bad in [
        "",
        "n1",
        "xyz/n1",
        "00000000000000zz/n1",
        "0000000000000001/",
    ] {
        assert!(adopt(&after, bad, 0, 512).is_err(), "{bad:?}");
    }

    // The node resumes its incarnation: same range id, the same URIs, its blocks held.
    let resume = PoolNodeJoin {
        resume_range_id: Some(membership.range_id),
        ..join("n1", 8 << 20)
    };
    let (resumed, retired) = after.join(resume).unwrap();
    assert_eq!((resumed.range_id, retired), (membership.range_id, vec![]));
    for ((address, part), uri) in adopted.iter().zip(placed.iter().flatten()).zip(&uris) {
        assert!(after.holds(address));
        let reference = PartRef {
            instance_id: "inst",
            key: 0,
            spec: &specs()[0],
            address: *address,
        };
        let mut again = String::new();
        assert!(after.write_uri(&reference, &mut again));
        assert_eq!(&again, uri, "part {:?}", part.address);
    }
    // New blocks never land on the adopted ones (nor in their slab, until it empties);
    // deletes free them.
    let more = place(&after, 10..20).unwrap();
    let mut ranges: Vec<(u64, u64)> = placed
        .iter()
        .chain(&more)
        .flatten()
        .map(|p| {
            let uri = PoolPartUri::parse(&p.uri).unwrap();
            (uri.offset, uri.offset + uri.size)
        })
        .collect();
    ranges.sort_unstable();
    assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0), "{ranges:?}");
    after.delete(&uris).expect("adopted parts free");
    assert_eq!(after.nodes()[0].used, 10 * (32 << 10));
}

#[test]
fn awaiting_blocks_die_when_their_node_comes_back_new_or_not_at_all() {
    let before = pool();
    let (membership, _) = before.join(join("n1", 1 << 20)).unwrap();
    before.join(join("n2", 1 << 20)).unwrap();
    let placed = place(&before, 0..8).unwrap();
    let parts = durable_parts(&before, &placed);

    let after = pool();
    after.set_timing(PoolTiming {
        resume_window: Duration::from_millis(1),
        ..PoolTiming::default()
    });
    for (name, block, size) in &parts {
        adopt(&after, name, *block, *size).unwrap();
    }
    let slot_of = |node: &str| {
        let nodes = after.nodes();
        nodes
            .iter()
            .position(|n| n.node_id == node)
            .map(|i| i as u32)
    };
    let (n1, n2) = (slot_of("n1"), slot_of("n2"));
    // n1 restarted (no resume): its earlier incarnation's blocks die at its join.
    let (fresh, retired) = after.join(join("n1", 1 << 20)).unwrap();
    assert_ne!(fresh.range_id, membership.range_id);
    assert_eq!(retired, n1.into_iter().collect::<Vec<_>>());
    // A resume naming a dead incarnation makes a new one instead.
    let stale = PoolNodeJoin {
        resume_range_id: Some(membership.range_id),
        ..join("n1", 1 << 20)
    };
    assert_ne!(after.join(stale).unwrap().0.range_id, membership.range_id);
    // n2 never comes back: its blocks die once the resume window, opened by the first
    // reap (the reaper starts after recovery), has passed.
    std::thread::sleep(Duration::from_millis(5));
    assert!(after.reap().is_empty(), "the first reap opens the window");
    std::thread::sleep(Duration::from_millis(5)); // 5 ms > the 1 ms window
    assert_eq!(after.reap(), n2.into_iter().collect::<Vec<_>>());
    assert!(after
        .nodes()
        .iter()
        .all(|n| n.node_id != "n2" || (!n.live && n.used == 0)));
}
