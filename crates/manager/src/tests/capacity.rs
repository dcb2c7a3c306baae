//! Quota tests (docs/capacity.md): the group quota, type quotas and the key cap are exact at
//! the boundary, a full type passes blocks to the next candidate type, and oversized specs
//! are refused at registration.

use super::*;

/// Starts a write of `keys` and commits every block that got a location.
pub(super) fn write_all(fx: &Fixture, instance: &Arc<Instance>, keys: Vec<BlockKey>) -> WriteStart {
    let started = fx
        .manager
        .start_write(instance, keys, &[], 30)
        .expect("start");
    fx.manager
        .finish_write(
            instance,
            &started.session_id,
            &BlockMask::Offset(started.locations.len()),
        )
        .expect("finish");
    started
}

#[test]
fn the_block_that_would_exceed_the_group_quota_is_refused_and_the_one_before_accepted() {
    let (fx, instance) = fixture(350, PREFER_3FS);
    let started = write_all(&fx, &instance, vec![1, 2, 3, 4]);
    assert_eq!(
        started.locations.len(),
        3,
        "300 of 350 bytes fit, 400 do not"
    );
    assert_eq!(
        started.mask,
        BlockMask::Bools(vec![false, false, false, true]),
        "the refused block gets no location"
    );
    let why = started.refused.expect("the answer says why");
    assert!(why.contains("quota of group \"g\""), "{why}");
    assert_eq!(instance.usage().total(), 300);
    let refused = fx.manager.start_write(&instance, vec![4], &[], 30);
    assert!(
        matches!(&refused, Err(ManagerError::NoSpace(why)) if why.contains("50 bytes left")),
        "{refused:?}"
    );
    assert_eq!(instance.index.len().expect("len"), 3, "nothing inserted");
}

#[test]
fn a_full_type_passes_blocks_to_the_next_candidate_type() {
    let (fx, instance) = fixture(i64::MAX, PREFER_3FS);
    let three_fs = three_fs(fx.dir.path());
    fx.manager.add_storage(three_fs).expect("3FS storage");
    let mut group = GroupConfig::clone(&fx.manager.group("g").expect("group"));
    group.version = 2;
    group.storage_candidates = vec!["s".into(), "w".into()];
    group.quota = Some(GroupQuota {
        capacity: 500,
        per_type: vec![TypeQuota {
            storage_type: StorageType::ThreeFs,
            capacity: 200,
        }],
    });
    fx.manager.update_group(group, 1).expect("update");
    let started = write_all(&fx, &instance, vec![1, 2, 3, 4, 5, 6]);
    let types: Vec<StorageType> = started.locations.iter().map(|l| l.storage_type).collect();
    use StorageType::{Nfs, ThreeFs};
    assert_eq!(
        types,
        [ThreeFs, ThreeFs, Nfs, Nfs, Nfs],
        "3FS preferred until its 200 bytes are used, then NFS up to the group's 500"
    );
    assert_eq!(
        (instance.usage().of(ThreeFs), instance.usage().of(Nfs)),
        (200, 300)
    );
    assert!(
        started.refused.is_some(),
        "the sixth block is over the group quota"
    );
}

/// Instance `i` of a group with no byte quota and `max_key_count` = `cap`.
fn key_capped(cap: i64) -> (Fixture, Arc<Instance>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let manager = Manager::new(test_deps()).expect("manager");
    manager
        .add_storage(storage("s", dir.path()))
        .expect("storage");
    let mut config = group(i64::MAX, PREFER_3FS);
    config.cache.indexer.max_key_count = cap;
    manager.create_group(config).expect("group");
    manager
        .register_instance(instance_info())
        .expect("register");
    let instance = manager.instance("i").expect("registered");
    (Fixture { manager, dir }, instance)
}

#[test]
fn max_key_count_refuses_the_key_past_the_cap() {
    let (fx, instance) = key_capped(16);
    let started = write_all(&fx, &instance, (1..=15).collect());
    assert_eq!(started.locations.len(), 15);
    let started = write_all(&fx, &instance, vec![16, 17]);
    assert_eq!(
        started.locations.len(),
        1,
        "the 16th key fits, the 17th not"
    );
    assert!(
        started
            .refused
            .as_deref()
            .is_some_and(|why| why.contains("max_key_count")),
        "{started:?}"
    );
    let refused = fx.manager.start_write(&instance, vec![17], &[], 30);
    assert!(
        matches!(&refused, Err(ManagerError::NoSpace(why)) if why.contains("16 keys")),
        "{refused:?}"
    );
    assert_eq!(instance.index.len().expect("len"), 16);
}

#[test]
fn spec_sizes_whose_sum_could_overflow_usage_are_refused_at_registration() {
    let (fx, _) = fixture(i64::MAX, PREFER_3FS);
    let mut info = instance_info();
    info.instance_id = "big".into();
    info.specs[0].size = (1 << 60) - 1;
    let refused = fx.manager.register_instance(info.clone());
    assert!(
        matches!(
            &refused,
            Err(ManagerError::InvalidField {
                field: "location_spec_infos.size",
                ..
            })
        ),
        "{refused:?}"
    );
    info.specs = vec![
        BlockSpec {
            name: "a".into(),
            size: crate::registration::MAX_BLOCK_BYTES,
        },
        BlockSpec {
            name: "b".into(),
            size: 1,
        },
    ];
    assert!(
        fx.manager.register_instance(info.clone()).is_err(),
        "the bound is on the sum of the specs"
    );
    info.specs.truncate(1);
    fx.manager
        .register_instance(info)
        .expect("a block of exactly MAX_BLOCK_BYTES is accepted");
    assert!(fx.manager.instance("big").is_some());
}

#[test]
fn quota_arithmetic_at_i64_limits_refuses_instead_of_wrapping() {
    let (fx, instance) = fixture(i64::MAX, PREFER_3FS);
    instance.usage().add(StorageType::Nfs, i64::MAX - 50);
    let refused = fx.manager.start_write(&instance, vec![1], &[], 30);
    assert!(
        matches!(&refused, Err(ManagerError::NoSpace(why)) if why.contains("50 bytes left")),
        "{refused:?}"
    );
    instance.usage().add(StorageType::Nfs, i64::MAX);
    assert_eq!(instance.usage().total(), i64::MAX, "saturates, never wraps");
    let mut other = instance_info();
    other.instance_id = "j".into();
    fx.manager.register_instance(other).expect("register j");
    let j = fx.manager.instance("j").expect("j");
    j.usage().add(StorageType::Nfs, 1);
    let refused = fx.manager.start_write(&j, vec![1], &[], 30);
    assert!(
        matches!(&refused, Err(ManagerError::NoSpace(why)) if why.contains("more than i64::MAX")),
        "a group sum past i64::MAX reads as full: {refused:?}"
    );
    instance.usage().add(StorageType::Nfs, -i64::MAX);
    assert_eq!(instance.usage().total(), 0);
    fx.manager
        .start_write(&j, vec![1], &[], 30)
        .expect("room again once the usage is back");
}

/// Writes keys `keys` one StartWriteCache each from `threads` threads at once (thread `t`
/// takes every `threads`-th key); returns how many got a location.
fn write_concurrently(
    fx: &Fixture,
    instance: &Arc<Instance>,
    keys: Vec<BlockKey>,
    threads: usize,
) -> usize {
    let barrier = std::sync::Barrier::new(threads);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, keys) = (&barrier, &keys);
                scope.spawn(move || {
                    barrier.wait();
                    keys.iter()
                        .skip(t)
                        .step_by(threads)
                        .filter(|&&key| {
                            fx.manager
                                .start_write(instance, vec![key], &[], 30)
                                .is_ok_and(|started| started.locations.len() == 1)
                        })
                        .count()
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("writer")).sum()
    })
}

#[test]
fn concurrent_writes_never_take_a_group_past_its_quota() {
    for _ in 0..20 {
        let (fx, instance) = fixture(50 * 100, PREFER_3FS);
        let placed = write_concurrently(&fx, &instance, (1..=200).collect(), 8);
        assert_eq!(placed, 50, "exactly the 50 blocks of 100 bytes that fit");
        assert_eq!(instance.usage().total(), 5_000);
        assert_eq!(instance.index.len().expect("len"), 50);
    }
}

#[test]
fn concurrent_writes_never_take_an_instance_past_its_key_cap() {
    for _ in 0..20 {
        let (fx, instance) = key_capped(30);
        let placed = write_concurrently(&fx, &instance, (1..=120).collect(), 8);
        assert!(placed <= 30, "{placed} keys placed past a cap of 30");
        assert_eq!(instance.index.len().expect("len"), placed as u64);
        // Nothing stays counted once the writers are done: the cap fills up to 30 exactly.
        let more = write_concurrently(&fx, &instance, (1_000..1_100).collect(), 1);
        assert_eq!(placed + more, 30);
        assert_eq!(
            instance
                .pending_keys
                .load(std::sync::atomic::Ordering::Acquire),
            0
        );
    }
}
