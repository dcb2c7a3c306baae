//! Reclaimer tests (docs/capacity.md): a watermark lowered on a live group frees room within
//! 2 s, WRITING blocks are never evicted, eviction follows real access (a read prefix
//! outlives one-shot writes), and deletion waits `delay_before_delete_ms`.

use std::sync::Mutex;

use super::capacity::write_all;
use super::*;
use crate::group_config::ReclaimTrigger;

/// How long a lowered watermark may take to free room.
const TAKES_EFFECT: Duration = Duration::from_secs(2);

/// A manager whose LRU reclaimer runs every 20 ms, with instance `i` of group `g` (16 keys
/// at most, watermark 1.0: nothing is reclaimed before it is lowered).
fn capped() -> (Fixture, Arc<Instance>) {
    capped_with(LivePolicy::Lru)
}

/// As [`capped`], with the reclaimer running `policy`.
fn capped_with(policy: LivePolicy) -> (Fixture, Arc<Instance>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let manager = Manager::new(ManagerDeps {
        reclaim_period: Some(Duration::from_millis(20)),
        reclaim_policy: policy,
        ..test_deps()
    })
    .expect("manager");
    manager
        .add_storage(storage("s", dir.path()))
        .expect("storage");
    let mut config = group(i64::MAX, PREFER_3FS);
    config.cache.indexer.max_key_count = 16;
    config.cache.reclaim.trigger = Some(ReclaimTrigger {
        used_size: 0,
        used_percentage: 1.0,
    });
    manager.create_group(config).expect("group");
    manager
        .register_instance(instance_info())
        .expect("register");
    let instance = manager.instance("i").expect("registered");
    (Fixture { manager, dir }, instance)
}

/// Sets the group's watermark (and delete delay) through an ordinary update.
fn set_watermark(fx: &Fixture, used_percentage: f64, delay_ms: i32) {
    let mut config = GroupConfig::clone(&fx.manager.group("g").expect("group"));
    let version = config.version;
    config.version += 1;
    config.cache.reclaim.trigger = Some(ReclaimTrigger {
        used_size: 0,
        used_percentage,
    });
    config.cache.reclaim.delay_before_delete_ms = delay_ms;
    fx.manager.update_group(config, version).expect("update");
}

/// Polls `done` until it holds; panics after `within`. Returns the time it took.
fn await_that(within: Duration, what: &str, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < within, "not within {within:?}: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
    start.elapsed()
}

/// Writes and commits one block; false when it got no location.
fn write_one(fx: &Fixture, instance: &Arc<Instance>, key: BlockKey) -> bool {
    let Ok(started) = fx.manager.start_write(instance, vec![key], &[], 30) else {
        return false;
    };
    if started.locations.is_empty() {
        return false;
    }
    fx.manager
        .finish_write(instance, &started.session_id, &BlockMask::Offset(1))
        .expect("finish");
    true
}

fn can_write(fx: &Fixture, instance: &Arc<Instance>, key: BlockKey) -> bool {
    fx.manager.start_write(instance, vec![key], &[], 30).is_ok()
}

#[test]
fn a_lowered_watermark_frees_room_for_the_17th_block_within_2_s() {
    let (fx, instance) = capped();
    let evictions = Arc::new(Mutex::new(Vec::new()));
    let seen = evictions.clone();
    fx.manager.set_reclaim_listener(Arc::new(move |_, keys| {
        seen.lock().expect("lock").extend_from_slice(keys)
    }));
    write_all(&fx, &instance, (1..=16).collect());
    let passes = fx.manager.reclaim_stats().passes();
    await_that(TAKES_EFFECT, "two passes", || {
        fx.manager.reclaim_stats().passes() >= passes + 2
    });
    assert!(
        !can_write(&fx, &instance, 17),
        "16 of 16 keys, watermark 1.0"
    );
    assert_eq!(fx.manager.reclaim_stats().evicted(), 0);
    set_watermark(&fx, 0.1, 0);
    await_that(TAKES_EFFECT, "the 17th write succeeds", || {
        can_write(&fx, &instance, 17)
    });
    // 15 evictions take 16 keys down to 10% (1 key); the WRITING 17th then makes 2, so a
    // later pass may take the last SERVING one too.
    let evicted = fx.manager.reclaim_stats().evicted();
    assert!((15..=16).contains(&evicted), "{evicted}");
    let reported = evictions.lock().expect("lock").clone();
    assert!(reported.len() >= 15, "every eviction reaches the listener");
    assert!(reported.iter().all(|key| (1..=16).contains(key)));
}

#[test]
fn nothing_is_evicted_while_a_recovery_restores_state() {
    let (fx, instance) = capped();
    write_all(&fx, &instance, (1..=16).collect());
    let recovering = crate::sync::write_lock(&fx.manager.recovery_gate);
    set_watermark(&fx, 0.1, 0);
    let held_back = fx.manager.reclaim_stats().held_back();
    await_that(TAKES_EFFECT, "three passes held back", || {
        fx.manager.reclaim_stats().held_back() >= held_back + 3
    });
    assert_eq!(fx.manager.reclaim_stats().evicted(), 0);
    drop(recovering);
    await_that(TAKES_EFFECT, "evictions once recovered", || {
        fx.manager.reclaim_stats().evicted() >= 15
    });
}

#[test]
fn writing_blocks_are_never_evicted() {
    let (fx, instance) = capped();
    let open = fx
        .manager
        .start_write(&instance, (1..=16).collect(), &[], 60)
        .expect("start");
    set_watermark(&fx, 0.1, 0);
    let passes = fx.manager.reclaim_stats().passes();
    await_that(TAKES_EFFECT, "three passes", || {
        fx.manager.reclaim_stats().passes() >= passes + 3
    });
    assert!(!can_write(&fx, &instance, 17), "16 WRITING blocks stay");
    assert_eq!(fx.manager.reclaim_stats().evicted(), 0);
    fx.manager
        .finish_write(&instance, &open.session_id, &BlockMask::Offset(16))
        .expect("finish");
    await_that(TAKES_EFFECT, "room once they are SERVING", || {
        can_write(&fx, &instance, 17)
    });
}

#[test]
fn a_frequently_read_prefix_survives_a_flood_of_one_shot_writes() {
    for policy in [LivePolicy::Lru, LivePolicy::Sieve, LivePolicy::S3Fifo] {
        a_read_prefix_survives_a_flood_under(policy);
    }
}

fn a_read_prefix_survives_a_flood_under(policy: LivePolicy) {
    let (fx, instance) = capped_with(policy);
    let prefix: Vec<BlockKey> = (1..=4).collect();
    write_all(&fx, &instance, prefix.clone());
    set_watermark(&fx, 0.5, 0);
    let read_prefix = || {
        fx.manager
            .get_cache_location(
                &instance,
                QueryKind::PrefixMatch,
                &prefix,
                &BlockMask::default(),
                &[],
            )
            .expect("read")
            .len()
    };
    for key in 100..160 {
        // Every one-shot block is written after the prefix: eviction by write time would
        // take the prefix first.
        await_that(TAKES_EFFECT, "room for a one-shot block", || {
            write_one(&fx, &instance, key)
        });
        assert_eq!(
            read_prefix(),
            4,
            "{policy:?}: the prefix is whole after block {key}"
        );
    }
    assert!(
        fx.manager.reclaim_stats().evicted() >= 40,
        "the flood was reclaimed"
    );
    assert_eq!(read_prefix(), 4, "{policy:?}: the read prefix survived");
}

#[test]
fn deletion_waits_delay_before_delete_ms_after_unpublishing() {
    let (fx, instance) = capped();
    write_all(&fx, &instance, (1..=16).collect());
    let lowered = Instant::now();
    set_watermark(&fx, 0.5, 300);
    await_that(TAKES_EFFECT, "evictions", || {
        fx.manager.reclaim_stats().evicted() == 8
    });
    let readable = (1..=16)
        .filter(|&key| batch_hit(&fx.manager, &instance, key))
        .count();
    assert_eq!(readable, 8, "evicted blocks are unreadable at once");
    await_that(TAKES_EFFECT, "the deleter removed them", || {
        instance.index.len().expect("len") == 8
    });
    assert!(
        lowered.elapsed() >= Duration::from_millis(300),
        "removed no earlier than the delay"
    );
    assert_eq!(instance.usage().total(), 800, "their bytes are released");
}

#[test]
fn a_group_over_its_byte_watermark_is_reclaimed_evenly_from_its_instances() {
    let (fx, i) = capped();
    let mut config = GroupConfig::clone(&fx.manager.group("g").expect("group"));
    config.version += 1;
    config.quota = Some(GroupQuota {
        capacity: 1600,
        per_type: Vec::new(),
    });
    fx.manager.update_group(config, 1).expect("update");
    let mut other = instance_info();
    other.instance_id = "j".into();
    fx.manager.register_instance(other).expect("register j");
    let j = fx.manager.instance("j").expect("j");
    write_all(&fx, &i, (1..=8).collect());
    write_all(&fx, &j, (1..=8).collect());
    assert!(!can_write(&fx, &i, 9), "1600 of 1600 bytes");
    set_watermark(&fx, 0.5, 0);
    await_that(TAKES_EFFECT, "down to 800 bytes", || {
        i.usage().total() + j.usage().total() == 800
    });
    assert_eq!(
        (i.usage().total(), j.usage().total()),
        (400, 400),
        "each instance gives up half of the excess"
    );
    assert_eq!(fx.manager.reclaim_stats().evicted(), 8);
}

#[test]
fn a_watermark_outside_0_to_1_or_a_negative_delay_is_refused_and_changes_nothing() {
    let (fx, _) = capped();
    let stored = fx.manager.group("g").expect("group");
    for bad in [1.5, -0.1, f64::NAN] {
        let mut config = GroupConfig::clone(&stored);
        config.version += 1;
        config.cache.reclaim.trigger = Some(ReclaimTrigger {
            used_size: 0,
            used_percentage: bad,
        });
        let refused = fx.manager.update_group(config, 1);
        assert!(
            matches!(&refused, Err(ManagerError::InvalidField { field, .. })
                if field.ends_with("trigger_strategy.used_percentage")),
            "{bad}: {refused:?}"
        );
    }
    let mut config = GroupConfig::clone(&stored);
    config.version += 1;
    config.cache.reclaim.delay_before_delete_ms = -1;
    let refused = fx.manager.update_group(config, 1);
    assert!(
        matches!(&refused, Err(ManagerError::InvalidField { field, .. })
            if field.ends_with("delay_before_delete_ms")),
        "{refused:?}"
    );
    assert_eq!(*fx.manager.group("g").expect("group"), *stored, "unchanged");
}

#[test]
fn among_blocks_of_one_request_the_suffix_goes_before_its_prefix() {
    let (fx, instance) = capped();
    write_all(&fx, &instance, vec![1, 2, 3, 4]);
    // 3/16 of the key cap: one of the four keys must go.
    set_watermark(&fx, 3.0 / 16.0, 0);
    await_that(TAKES_EFFECT, "one eviction", || {
        instance.index.len().expect("len") == 3
    });
    let kept: Vec<bool> = [1, 2, 3, 4]
        .iter()
        .map(|&key| batch_hit(&fx.manager, &instance, key))
        .collect();
    assert_eq!(
        kept,
        [true, true, true, false],
        "the last block of the request went"
    );
}

#[test]
fn a_type_over_its_watermark_loses_blocks_of_that_type_only() {
    let (fx, instance) = capped();
    let three_fs = three_fs(fx.dir.path());
    fx.manager.add_storage(three_fs).expect("3FS storage");
    let mut config = GroupConfig::clone(&fx.manager.group("g").expect("group"));
    config.version += 1;
    config.storage_candidates = vec!["s".into(), "w".into()];
    config.quota = Some(GroupQuota {
        capacity: i64::MAX,
        per_type: vec![TypeQuota {
            storage_type: StorageType::ThreeFs,
            capacity: 400,
        }],
    });
    fx.manager.update_group(config, 1).expect("update");
    write_all(&fx, &instance, (1..=6).collect());
    let usage = || {
        let usage = instance.usage();
        (usage.of(StorageType::ThreeFs), usage.of(StorageType::Nfs))
    };
    assert_eq!(usage(), (400, 200), "3FS first, NFS once 3FS is full");
    set_watermark(&fx, 0.5, 0);
    await_that(TAKES_EFFECT, "3FS down to half its quota", || {
        usage() == (200, 200)
    });
    assert_eq!(fx.manager.reclaim_stats().evicted(), 2);
    assert!(can_write(&fx, &instance, 7), "3FS has room again");
}

#[test]
fn background_batches_hold_one_lock_group_and_at_most_64_keys() {
    let (_fx, instance) = capped();
    let keys: Vec<BlockKey> = (0..1000).collect();
    let groups: std::collections::HashSet<usize> =
        keys.iter().map(|&k| instance.index.lock_group(k)).collect();
    assert!(groups.len() > 1, "the index has several shards");
    let batches = crate::deleter::background_batches(&instance, keys.clone());
    let mut all: Vec<BlockKey> = batches.iter().flatten().copied().collect();
    all.sort_unstable();
    assert_eq!(all, keys, "every key once");
    for batch in &batches {
        assert!(!batch.is_empty() && batch.len() <= 64, "{}", batch.len());
        let group = instance.index.lock_group(batch[0]);
        assert!(batch.iter().all(|&k| instance.index.lock_group(k) == group));
    }
}
