//! Manager-level tests on real parts: LocalIndex key spaces and a `file` storage in a temp
//! directory.

use std::sync::Arc;
use std::time::{Duration, Instant};

/// Private `redis-server` processes for the tests (shared with the index's Redis tests).
#[path = "../../index/tests/redis_support/mod.rs"]
pub(crate) mod redis_support;

use super::*;
use crate::group_config::{
    CacheConfig, GroupQuota, IndexBackend, IndexerConfig, PreferStrategy, ReclaimPolicy,
    ReclaimStrategy, SearchCachePolicy, TypeQuota,
};
use crate::mask::BlockMask;
use crate::query::QueryKind;
use crate::read::BlockLocation;
use crate::registration::ModelDeployment;
use kvcm_index::{BlockKey, IndexError};
use kvcm_storage::{AllocationRequest, BlockSpec, BlockToAllocate, StorageConfig, StorageSpec};

struct Fixture {
    manager: Arc<Manager>,
    dir: tempfile::TempDir,
}

pub(crate) fn storage(name: &str, root: &std::path::Path) -> StorageConfig {
    StorageConfig {
        global_unique_name: name.into(),
        spec: StorageSpec::Nfs {
            root_path: format!("{}/", root.display()),
            key_count_per_file: 2,
        },
        check_storage_available_when_open: false,
    }
}

/// Dependencies of a test manager: no probes, local indexes, no reclaimer, default limits.
pub(crate) fn test_deps() -> ManagerDeps {
    ManagerDeps {
        storage_probe_interval: None,
        open_index: local_index_factory(),
        node_id: "test".into(),
        pool_timing: Default::default(),
        reclaim_period: None,
        reclaim_policy: LivePolicy::Lru,
        limits: Default::default(),
        allowed_roots: Default::default(),
    }
}

/// A 3FS storage `w` with its mount point under `dir` (one key per file).
pub(crate) fn three_fs(dir: &std::path::Path) -> StorageConfig {
    StorageConfig {
        global_unique_name: "w".into(),
        spec: StorageSpec::ThreeFs {
            cluster_name: "c".into(),
            mountpoint: dir.join("w").display().to_string(),
            root_dir: "kv".into(),
            key_count_per_file: 1,
            touch_file_when_create: false,
        },
        check_storage_available_when_open: false,
    }
}

pub(crate) fn group(capacity: i64, prefer: PreferStrategy) -> GroupConfig {
    GroupConfig {
        name: "g".into(),
        storage_candidates: vec!["s".into()],
        quota_group_name: "q".into(),
        max_instance_count: 0,
        quota: Some(GroupQuota {
            capacity,
            per_type: Vec::new(),
        }),
        cache: CacheConfig {
            reclaim: ReclaimStrategy {
                storage_unique_name: "s".into(),
                policy: ReclaimPolicy::Unspecified,
                trigger: None,
                trigger_period_seconds: 0,
                step_size: 0,
                step_percentage: 0,
                delay_before_delete_ms: 0,
            },
            prefer,
            indexer: IndexerConfig {
                mutex_shard_num: 4,
                backend: IndexBackend {
                    storage_type: "local".into(),
                    storage_uri: String::new(),
                },
                cache_policy: SearchCachePolicy {
                    kind: "lru".into(),
                    ..Default::default()
                },
                ..Default::default()
            },
        },
        user_data: String::new(),
        version: 1,
        extra_info: String::new(),
        revisit_interval_buckets: String::new(),
        event_report_storage_candidates: Vec::new(),
    }
}

pub(crate) const PREFER_3FS: PreferStrategy = PreferStrategy::Prefer(StorageType::ThreeFs);

fn fixture(capacity: i64, prefer: PreferStrategy) -> (Fixture, Arc<Instance>) {
    fixture_with(capacity, prefer, local_index_factory())
}

fn fixture_with(
    capacity: i64,
    prefer: PreferStrategy,
    open_index: IndexFactory,
) -> (Fixture, Arc<Instance>) {
    let deps = ManagerDeps {
        open_index,
        ..test_deps()
    };
    fixture_with_deps(capacity, prefer, deps)
}

fn fixture_with_deps(
    capacity: i64,
    prefer: PreferStrategy,
    deps: ManagerDeps,
) -> (Fixture, Arc<Instance>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let manager = Manager::new(deps).expect("manager");
    manager
        .add_storage(storage("s", dir.path()))
        .expect("storage");
    manager
        .create_group(group(capacity, prefer))
        .expect("group");
    manager
        .register_instance(instance_info())
        .expect("register");
    let instance = manager.instance("i").expect("registered");
    (Fixture { manager, dir }, instance)
}

/// The registration of instance `i` of group `g`: one spec `tp0` of 100 bytes.
pub(crate) fn instance_info() -> InstanceInfo {
    InstanceInfo {
        quota_group_name: String::new(),
        instance_group_name: "g".into(),
        instance_id: "i".into(),
        block_size: 4,
        specs: vec![BlockSpec {
            name: "tp0".into(),
            size: 100,
        }],
        model: ModelDeployment {
            model_name: "m".into(),
            dtype: "fp8".into(),
            ..Default::default()
        },
        spec_groups: Vec::new(),
        default_query: Default::default(),
    }
}

/// GetCacheLocation's answer as owned locations (what the service edge renders).
pub(crate) trait OwnedLookup {
    fn get_cache_location(
        &self,
        instance: &Instance,
        kind: QueryKind,
        keys: &[BlockKey],
        mask: &BlockMask,
        spec_names: &[String],
    ) -> ManagerResult<Vec<BlockLocation>>;
}

impl OwnedLookup for Manager {
    fn get_cache_location(
        &self,
        instance: &Instance,
        kind: QueryKind,
        keys: &[BlockKey],
        mask: &BlockMask,
        spec_names: &[String],
    ) -> ManagerResult<Vec<BlockLocation>> {
        let lookup = self.lookup_cache_locations(instance, kind, keys, mask, spec_names)?;
        Ok(lookup.to_locations())
    }
}

/// The URI of the first part of a location.
pub(crate) fn first_uri(location: &BlockLocation) -> &str {
    &location.parts[0].uri
}

fn prefix(manager: &Manager, instance: &Instance, keys: &[i64]) -> usize {
    manager
        .get_cache_location(
            instance,
            QueryKind::PrefixMatch,
            keys,
            &BlockMask::default(),
            &[],
        )
        .expect("query")
        .len()
}

/// Location nonces skip 0 (an empty lookup-table slot) when the lifetime counter wraps: a
/// SERVING location with nonce 0 once made every table build of its instance fail.
#[test]
fn location_nonces_skip_zero_when_the_counter_wraps() {
    let (fx, instance) = fixture(i64::MAX, PREFER_3FS);
    fx.manager
        .nonces
        .store(u32::MAX - 1, std::sync::atomic::Ordering::Relaxed);
    let started = fx
        .manager
        .start_write(&instance, vec![1, 2, 3], &[], 60)
        .expect("start");
    let nonces: Vec<u32> = instance
        .index
        .get(&[1, 2, 3])
        .expect("get")
        .into_iter()
        .map(|entry| {
            entry
                .expect("written")
                .locations()
                .next()
                .expect("one")
                .nonce
        })
        .collect();
    assert_eq!(nonces, [u32::MAX - 1, u32::MAX, 1], "{started:?}");
}

#[test]
fn an_expired_session_fails_within_100ms_of_its_deadline() {
    let (fx, instance) = fixture(i64::MAX, PREFER_3FS);
    let feed = fx.manager.subscribe();
    let started = Instant::now();
    fx.manager
        .start_write(&instance, vec![1, 2], &[], 1)
        .expect("start");
    let mut failed_at = None;
    while failed_at.is_none() {
        let change = feed.recv().expect("feed");
        if change.to == Some(LocationState::Deleting) {
            failed_at = Some(started.elapsed());
        }
    }
    let elapsed = failed_at.expect("expired");
    assert!(elapsed >= Duration::from_secs(1), "{elapsed:?}");
    assert!(
        elapsed <= Duration::from_millis(1100),
        "expiry lagged: {elapsed:?}"
    );
}

#[test]
fn a_session_due_before_every_open_one_expires_on_time() {
    // The expiry thread sleeps until the first deadline; only a session that becomes the
    // first wakes it, and this one must.
    let (fx, instance) = fixture(i64::MAX, PREFER_3FS);
    let feed = fx.manager.subscribe();
    fx.manager
        .start_write(&instance, vec![1], &[], 30)
        .expect("start a late session");
    let started = Instant::now();
    fx.manager
        .start_write(&instance, vec![2], &[], 1)
        .expect("start an early session");
    let failed = loop {
        let change = feed.recv().expect("feed");
        if change.to == Some(LocationState::Deleting) {
            break change;
        }
    };
    let elapsed = started.elapsed();
    assert_eq!(failed.key, 2);
    assert!(elapsed >= Duration::from_secs(1), "{elapsed:?}");
    // Not woken, the thread would sleep until the 30 s session's deadline.
    assert!(
        elapsed <= Duration::from_secs(5),
        "expiry lagged: {elapsed:?}"
    );
}

#[test]
fn the_change_feed_follows_a_block_through_its_life() {
    let (fx, instance) = fixture(i64::MAX, PREFER_3FS);
    let feed = fx.manager.subscribe();
    let started = fx
        .manager
        .start_write(&instance, vec![7], &[], 30)
        .expect("start");
    let committed = fx
        .manager
        .finish_write(&instance, &started.session_id, &BlockMask::Offset(1))
        .expect("finish");
    assert_eq!(committed, [7], "finish reports the keys it committed");
    assert_eq!(prefix(&fx.manager, &instance, &[7]), 1);
    fx.manager.remove_cache(&instance, &[7]).expect("remove");
    assert_eq!(
        prefix(&fx.manager, &instance, &[7]),
        0,
        "unreadable at once"
    );
    let transitions: Vec<_> = (0..4)
        .map(|_| {
            let change = feed.recv().expect("feed");
            assert_eq!((change.key, &*change.instance_id), (7, "i"));
            (change.from, change.to)
        })
        .collect();
    use LocationState::*;
    assert_eq!(
        transitions,
        [
            (None, Some(Writing)),
            (Some(Writing), Some(Serving)),
            (Some(Serving), Some(Deleting)),
            (Some(Deleting), None)
        ]
    );
    // The last change is published inside the deleter's compare-and-set, just before the
    // index applies it: await the removal rather than race it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while instance.index.len().expect("len") != 0 {
        assert!(Instant::now() < deadline, "the deleter removed the key");
        std::thread::yield_now();
    }
}

#[test]
fn concurrent_writers_of_one_key_both_commit_replicas() {
    let (fx, instance) = fixture(i64::MAX, PREFER_3FS);
    let first = fx
        .manager
        .start_write(&instance, vec![5], &[], 30)
        .expect("first");
    let second = fx
        .manager
        .start_write(&instance, vec![5], &[], 30)
        .expect("second");
    assert_eq!(first.locations.len(), 1);
    assert!(
        second.locations.is_empty(),
        "present (WRITING) keys are not rewritten"
    );
    assert_eq!(second.mask, BlockMask::Offset(1));
    fx.manager
        .finish_write(&instance, &first.session_id, &BlockMask::Offset(1))
        .expect("finish");
    let found = fx
        .manager
        .get_cache_location(
            &instance,
            QueryKind::BatchGet,
            &[5],
            &BlockMask::default(),
            &[],
        )
        .expect("query");
    assert_eq!(found, first.locations);
}

#[test]
fn the_group_quota_stops_writes_at_capacity() {
    let (fx, instance) = fixture(300, PREFER_3FS);
    fx.manager
        .start_write(&instance, vec![1, 2, 3], &[], 30)
        .expect("300 bytes fit an empty group");
    let refused = fx.manager.start_write(&instance, vec![4], &[], 30);
    assert!(
        matches!(refused, Err(ManagerError::NoSpace(_))),
        "{refused:?}"
    );
    let (fx, instance) = fixture(0, PREFER_3FS);
    let refused = fx.manager.start_write(&instance, vec![1], &[], 30);
    assert!(
        matches!(refused, Err(ManagerError::NoSpace(_))),
        "capacity 0 = no writes"
    );
}

#[test]
fn a_type_quota_excludes_its_type_until_deletes_free_room() {
    let (fx, instance) = fixture(i64::MAX, PREFER_3FS);
    let mut group = GroupConfig::clone(&fx.manager.group("g").expect("group"));
    group.version = 2;
    group.quota = Some(GroupQuota {
        capacity: i64::MAX,
        per_type: vec![TypeQuota {
            storage_type: StorageType::Nfs,
            capacity: 200,
        }],
    });
    fx.manager.update_group(group, 1).expect("update");
    let first = fx
        .manager
        .start_write(&instance, vec![1, 2], &[], 30)
        .expect("200 bytes");
    let refused = fx.manager.start_write(&instance, vec![3], &[], 30);
    assert!(
        matches!(refused, Err(ManagerError::NoSpace(_))),
        "{refused:?}"
    );
    // The capacity report (metrics) carries the type's quota and usage.
    let report = fx.manager.capacity_report();
    let per_type = &report.iter().find(|g| g.name == "g").expect("g").per_type;
    assert_eq!(
        per_type.as_slice(),
        [crate::TypeCapacity {
            storage_type: StorageType::Nfs,
            quota_bytes: Some(200),
            used_bytes: Some(200),
        }]
    );
    fx.manager
        .finish_write(&instance, &first.session_id, &BlockMask::Offset(0))
        .expect("fail both blocks");
    let deadline = Instant::now() + Duration::from_secs(5);
    while fx.manager.start_write(&instance, vec![3], &[], 30).is_err() {
        assert!(
            Instant::now() < deadline,
            "the deleter never released the bytes"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn replicas_are_chosen_among_available_storages_only() {
    let (fx, instance) = fixture(i64::MAX, PREFER_3FS);
    fx.manager
        .add_storage(storage("t", &fx.dir.path().join("t")))
        .expect("second storage");
    let mut group = GroupConfig::clone(&fx.manager.group("g").expect("group"));
    group.storage_candidates.push("t".into());
    group.version = 2;
    fx.manager.update_group(group, 1).expect("update");
    let s = allocated(&fx, &instance, 9, "s");
    let t = allocated(&fx, &instance, 9, "t");
    let t_uri = t.1.clone();
    instance
        .index
        .put(vec![(9, Entry::new(vec![s.0, t.0]))])
        .expect("put");
    let uri_of_choice = || {
        let found = fx
            .manager
            .get_cache_location(
                &instance,
                QueryKind::BatchGet,
                &[9],
                &BlockMask::default(),
                &[],
            )
            .expect("query");
        first_uri(&found[0]).to_string()
    };
    let seen: std::collections::HashSet<String> = (0..200).map(|_| uri_of_choice()).collect();
    assert_eq!(
        seen.len(),
        2,
        "both replicas are drawn while both storages are available"
    );
    fx.manager
        .set_storage_available("s", false)
        .expect("disable");
    assert!(
        (0..50).all(|_| uri_of_choice() == t_uri),
        "weight 0 on a disabled storage"
    );
    fx.manager
        .set_storage_available("t", false)
        .expect("disable");
    let none = fx.manager.get_cache_location(
        &instance,
        QueryKind::BatchGet,
        &[9],
        &BlockMask::default(),
        &[],
    );
    assert!(
        matches!(none, Err(ManagerError::NoSpace(_))),
        "no storage available: {none:?}"
    );
}

#[test]
fn an_always_strategy_without_a_matching_storage_refuses_writes() {
    let (fx, instance) = fixture(i64::MAX, PreferStrategy::Always(StorageType::Mooncake));
    let refused = fx.manager.start_write(&instance, vec![1], &[], 30);
    assert!(
        matches!(refused, Err(ManagerError::NoSpace(_))),
        "{refused:?}"
    );
    assert_eq!(
        instance.index.len().expect("len"),
        0,
        "nothing was inserted"
    );
}

#[test]
fn demotion_fails_open_sessions() {
    let (fx, instance) = fixture(i64::MAX, PREFER_3FS);
    fx.manager
        .start_write(&instance, vec![1], &[], 600)
        .expect("start");
    assert_eq!(fx.manager.open_sessions(), 1);
    fx.manager.leadership().set_campaign_delay_ms(60_000);
    assert!(fx.manager.demote());
    assert_eq!(fx.manager.open_sessions(), 0);
    assert!(!fx.manager.leadership().is_leader());
}

#[test]
fn a_write_that_passed_the_gate_before_a_demotion_opens_no_session() {
    let (fx, instance) = fixture(i64::MAX, PREFER_3FS);
    fx.manager.leadership().set_campaign_delay_ms(60_000);
    assert!(fx.manager.demote());
    let refused = fx.manager.start_write(&instance, vec![1, 2], &[], 600);
    assert!(
        matches!(refused, Err(ManagerError::NotLeader)),
        "{refused:?}"
    );
    assert_eq!(fx.manager.open_sessions(), 0);
    let entries = instance.index.get(&[1, 2]).expect("get");
    let states: Vec<Vec<LocationState>> = entries
        .iter()
        .map(|e| {
            e.iter()
                .flat_map(|e| e.locations())
                .map(|l| l.state)
                .collect()
        })
        .collect();
    assert!(
        states
            .iter()
            .flatten()
            .all(|s| *s == LocationState::Deleting),
        "the allocated blocks were failed at once: {states:?}"
    );
}

/// A hook run inside every `get` of a [`FlakyIndex`], once installed.
type GetHook = Arc<std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>>;

/// A local index whose next `failures` read-modify-writes fail (a backend outage) and whose
/// lookups run a hook first.
struct FlakyIndex {
    inner: Arc<dyn MetaIndex<Entry>>,
    failures: Arc<std::sync::atomic::AtomicUsize>,
    on_get: GetHook,
}

/// A fixture whose instance index is a [`FlakyIndex`].
fn flaky_fixture() -> (
    Fixture,
    Arc<Instance>,
    Arc<std::sync::atomic::AtomicUsize>,
    GetHook,
) {
    flaky_fixture_with(test_deps())
}

/// A [`flaky_fixture`] on `deps` (their index factory is replaced).
fn flaky_fixture_with(
    deps: ManagerDeps,
) -> (
    Fixture,
    Arc<Instance>,
    Arc<std::sync::atomic::AtomicUsize>,
    GetHook,
) {
    let failures = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let on_get = GetHook::default();
    let local = local_index_factory();
    let (shared_failures, shared_hook) = (failures.clone(), on_get.clone());
    let flaky: IndexFactory = Arc::new(move |config, log| {
        let index: Arc<dyn MetaIndex<Entry>> = Arc::new(FlakyIndex {
            inner: local(config, log)?,
            failures: shared_failures.clone(),
            on_get: shared_hook.clone(),
        });
        Ok(index)
    });
    let deps = ManagerDeps {
        open_index: flaky,
        ..deps
    };
    let (fx, instance) = fixture_with_deps(i64::MAX, PREFER_3FS, deps);
    (fx, instance, failures, on_get)
}

/// A [`flaky_fixture`] whose keys 0..512 are written and committed (SERVING).
fn flaky_with_512_served() -> (
    Fixture,
    Arc<Instance>,
    Arc<std::sync::atomic::AtomicUsize>,
    Vec<BlockKey>,
) {
    let (fx, instance, failures, _) = flaky_fixture();
    let keys: Vec<BlockKey> = (0..512).collect();
    write_and_commit(&fx.manager, &instance, &keys);
    (fx, instance, failures, keys)
}

/// StartWriteCache + FinishWriteCache of every key of `keys`.
fn write_and_commit(manager: &Manager, instance: &Arc<Instance>, keys: &[BlockKey]) {
    let started = manager
        .start_write(instance, keys.to_vec(), &[], 600)
        .expect("start");
    let all = BlockMask::Offset(keys.len());
    manager
        .finish_write(instance, &started.session_id, &all)
        .expect("finish");
}

impl MetaIndex<Entry> for FlakyIndex {
    fn get(&self, keys: &[BlockKey]) -> Result<Vec<Option<Entry>>, IndexError> {
        if let Some(hook) = self.on_get.get() {
            hook();
        }
        self.inner.get(keys)
    }
    fn put(&self, entries: Vec<(BlockKey, Entry)>) -> Result<(), IndexError> {
        self.inner.put(entries)
    }
    fn delete(&self, keys: &[BlockKey]) -> Result<usize, IndexError> {
        self.inner.delete(keys)
    }
    fn read_modify_write(
        &self,
        keys: &[BlockKey],
        f: &mut dyn FnMut(BlockKey, Option<&Entry>) -> kvcm_index::Modify<Entry>,
    ) -> Result<(), IndexError> {
        use std::sync::atomic::Ordering;
        let fail = self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if fail {
            // As a backend whose write fails after its read: the closure runs, nothing is
            // applied.
            self.inner.read_modify_write(keys, &mut |key, current| {
                f(key, current);
                kvcm_index::Modify::Keep
            })?;
            return Err(IndexError::Backend("injected outage".into()));
        }
        self.inner.read_modify_write(keys, f)
    }
    fn scan(
        &self,
        cursor: kvcm_index::ScanCursor,
        limit: usize,
    ) -> Result<kvcm_index::ScanPage, IndexError> {
        self.inner.scan(cursor, limit)
    }
    fn sample(&self, count: usize) -> Result<Vec<BlockKey>, IndexError> {
        self.inner.sample(count)
    }
    fn len(&self) -> Result<u64, IndexError> {
        self.inner.len()
    }
}

#[test]
fn a_batched_move_that_fails_keeps_and_returns_what_the_batches_before_it_moved() {
    let (fx, instance, failures, keys) = flaky_with_512_served();
    let batches = crate::deleter::background_batches(&instance, keys.clone());
    assert!(batches.len() >= 3, "{} batches", batches.len());
    let mut first = batches[0].clone();
    first.sort_unstable();
    let (moved, result) = fx.manager.move_locations_in_batches(
        &instance,
        &batches,
        LocationState::Deleting,
        &mut |key, _| {
            // While the first batch is written, an outage is injected: the second fails.
            if first.binary_search(&key).is_ok() {
                failures.store(1, std::sync::atomic::Ordering::SeqCst);
            }
            true
        },
    );
    assert!(result.is_err(), "the second batch's outage is reported");
    let mut moved_keys: Vec<BlockKey> = moved.iter().map(|(key, _)| *key).collect();
    moved_keys.sort_unstable();
    assert_eq!(moved_keys, first, "the first batch's moves, and only those");
    for key in keys {
        let entry = instance.index.get(&[key]).expect("get")[0]
            .clone()
            .expect("kept");
        let states: Vec<LocationState> = entry.locations().map(|l| l.state).collect();
        let expected = match first.binary_search(&key) {
            Ok(_) => LocationState::Deleting,
            Err(_) => LocationState::Serving,
        };
        assert_eq!(states, vec![expected], "key {key}");
    }
}

#[test]
fn a_removed_instance_whose_cache_deletion_fails_is_deleted_in_the_background() {
    let (fx, instance, failures, _) = flaky_with_512_served();
    // An outage that lasts until the test ends it (background retries fail too).
    failures.store(usize::MAX, std::sync::atomic::Ordering::SeqCst);
    fx.manager
        .remove_instance(instance.id())
        .expect("removed: its record is written");
    assert!(fx.manager.require_instance(instance.id()).is_err());
    assert_eq!(fx.manager.removals_pending(), 1, "the outage left blocks");
    assert!(instance.index.len().expect("len") > 0);
    failures.store(0, std::sync::atomic::Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(10);
    while (fx.manager.removals_pending() > 0 || instance.index.len().expect("len") > 0)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(fx.manager.removals_pending(), 0, "retried");
    assert_eq!(instance.index.len().expect("len"), 0, "every block deleted");
}

/// A dead pool node's sweep that fails (an index outage) is kept and done by a later reap:
/// the node's locations do not stay SERVING, and the reap that found the death is not
/// failed for it.
#[test]
fn a_failed_sweep_of_a_dead_pool_node_is_done_by_a_later_reap() {
    use kvcm_storage::pool::{PoolNodeJoin, PoolTiming};
    let deps = ManagerDeps {
        pool_timing: PoolTiming {
            heartbeat: Duration::from_millis(1),
            ..Default::default()
        },
        ..test_deps()
    };
    let (fx, instance, failures, _) = flaky_fixture_with(deps);
    let pool = StorageConfig {
        global_unique_name: "p".into(),
        spec: StorageSpec::TairMemPool {
            domain: "d".into(),
            timeout: 100,
            enable_vipserver: false,
            service_discovery_url: String::new(),
            media_type: 0,
        },
        check_storage_available_when_open: false,
    };
    fx.manager.add_storage(pool).expect("pool storage");
    let mut on_pool = group(i64::MAX, PreferStrategy::Always(StorageType::TairMemPool));
    on_pool.storage_candidates = vec!["p".into()];
    on_pool.version = 2;
    fx.manager
        .update_group(on_pool, 1)
        .expect("group on the pool");
    let join = PoolNodeJoin {
        node_id: "n".into(),
        endpoint: "127.0.0.1:9".into(),
        capacity: 1 << 20,
        resume_range_id: None,
        isolated: false,
    };
    fx.manager.pool_join("p", join).expect("join");
    let keys: Vec<BlockKey> = (1000..1008).collect();
    write_and_commit(&fx.manager, &instance, &keys);
    let states = || -> Vec<LocationState> {
        let entries = instance.index.get(&keys).expect("get");
        let entries = entries.into_iter().flatten();
        entries
            .flat_map(|e| e.locations().map(|l| l.state).collect::<Vec<_>>())
            .collect()
    };
    assert_eq!(states(), vec![LocationState::Serving; keys.len()]);

    // The node never heartbeats: dead after 3 missed 1-ms beats, swept during an outage.
    std::thread::sleep(Duration::from_millis(20));
    failures.store(usize::MAX, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(fx.manager.reap_pool_nodes(), 1, "the node died");
    assert_eq!(
        fx.manager.pool_sweeps_pending(),
        1,
        "the failed sweep is kept"
    );
    assert_eq!(fx.manager.reap_pool_nodes(), 0, "a retry during the outage");
    assert_eq!(fx.manager.pool_sweeps_pending(), 1, "kept once, not twice");
    assert!(
        states().contains(&LocationState::Serving),
        "the outage held"
    );
    failures.store(0, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(fx.manager.reap_pool_nodes(), 0, "nothing more died");
    assert_eq!(fx.manager.pool_sweeps_pending(), 0);
    assert!(
        !states().contains(&LocationState::Serving),
        "the dead node's locations were swept: {:?}",
        states()
    );
}

#[test]
fn a_session_of_a_removed_instance_does_not_commit_into_a_later_instance_of_its_id() {
    let (fx, old) = fixture(i64::MAX, PREFER_3FS);
    let open = fx
        .manager
        .start_write(&old, vec![1], &[], 600)
        .expect("start");
    fx.manager.remove_instance(old.id()).expect("removed");
    fx.manager
        .register_instance(old.info().clone())
        .expect("registered again");
    let new = fx.manager.instance(old.id()).expect("the new instance");
    let refused = fx
        .manager
        .finish_write(&new, &open.session_id, &BlockMask::Offset(1));
    let error = refused
        .expect_err("an earlier instance's session")
        .to_string();
    assert!(error.contains("earlier instance"), "{error}");
    assert!(
        new.index.get(&[1]).expect("get")[0].is_none(),
        "nothing committed"
    );
}

#[test]
fn sessions_of_a_removed_instance_do_not_count_against_a_later_instance_of_its_id() {
    let limits = crate::ManagerLimits {
        max_sessions_per_instance: 1,
        ..Default::default()
    };
    let deps = ManagerDeps {
        limits,
        ..test_deps()
    };
    let (fx, old) = fixture_with_deps(i64::MAX, PREFER_3FS, deps);
    fx.manager
        .start_write(&old, vec![1], &[], 600)
        .expect("the old instance's one session");
    fx.manager.remove_instance(old.id()).expect("removed");
    fx.manager
        .register_instance(old.info().clone())
        .expect("registered again");
    let new = fx.manager.instance(old.id()).expect("the new instance");
    fx.manager
        .start_write(&new, vec![2], &[], 600)
        .expect("the new instance's own first session");
    let refused = fx
        .manager
        .start_write(&new, vec![3], &[], 600)
        .expect_err("its second is over the limit");
    assert!(
        refused.to_string().contains("max_sessions_per_instance"),
        "{refused}"
    );
}

#[test]
fn an_abandoned_session_of_more_keys_than_one_unwrite_batch_leaves_nothing() {
    let (fx, instance) = fixture(i64::MAX, PREFER_3FS);
    let keys: Vec<i64> = (0..2500).collect();
    let started = fx
        .manager
        .start_write(&instance, keys, &[], 30)
        .expect("start");
    assert_eq!(started.locations.len(), 2500);
    fx.manager
        .abandon_write(&instance, &started.session_id)
        .expect("abandoned");
    assert_eq!(
        instance.index.len().unwrap(),
        0,
        "every batch failed and deleted"
    );
    assert_eq!(instance.usage().total(), 0);
}

#[test]
fn a_group_with_registered_instances_is_not_removed() {
    let (fx, instance) = fixture(i64::MAX, PREFER_3FS);
    let refused = fx
        .manager
        .remove_group(instance.group())
        .expect_err("in use");
    assert!(
        matches!(refused, ManagerError::InvalidField { field: "name", .. }),
        "{refused:?}"
    );
    assert!(
        refused.to_string().contains(instance.id().as_ref()),
        "{refused}"
    );
    assert!(
        fx.manager.group(instance.group()).is_ok(),
        "the group stays"
    );
    fx.manager.remove_instance(instance.id()).expect("removed");
    fx.manager
        .remove_group(instance.group())
        .expect("no instance left");
}

/// A publisher that records which instance object each key change came from.
#[derive(Default)]
struct RecordedPublication {
    changes: Mutex<Vec<(usize, Vec<BlockKey>)>>,
}

impl crate::publication::Publication for RecordedPublication {
    fn keys_changed(&self, instance: &Instance, keys: &[BlockKey]) {
        let from = instance as *const Instance as usize;
        self.changes.lock().unwrap().push((from, keys.to_vec()));
    }
    fn storages_changed(&self) {}
    fn instance_removed(&self, _instance: &Instance) {}
}

#[test]
fn a_removed_instances_clean_up_publishes_nothing_for_a_later_instance_of_its_id() {
    let (fx, old) = fixture(i64::MAX, PREFER_3FS);
    let written = fx
        .manager
        .start_write(&old, vec![1, 2], &[], 600)
        .expect("start");
    let all = BlockMask::Offset(2);
    fx.manager
        .finish_write(&old, &written.session_id, &all)
        .expect("finish");
    // Removed, its deletion not run yet; the id registered again.
    let (removed, _) = fx.manager.record_removal(old.id()).expect("removed");
    fx.manager
        .register_instance(old.info().clone())
        .expect("registered again");
    let new = fx.manager.instance(old.id()).expect("the new instance");
    let recorded = Arc::new(RecordedPublication::default());
    assert!(fx.manager.set_publication(recorded.clone()));
    fx.manager.delete_removed(removed);
    let started = fx
        .manager
        .start_write(&new, vec![1], &[], 600)
        .expect("start");
    let one = BlockMask::Offset(1);
    fx.manager
        .finish_write(&new, &started.session_id, &one)
        .expect("finish");
    let deadline = Instant::now() + Duration::from_secs(10);
    while old.index.len().expect("len") > 0 {
        assert!(
            Instant::now() < deadline,
            "the removed instance's blocks are deleted"
        );
        std::thread::yield_now();
    }
    let changes = recorded.changes.lock().unwrap().clone();
    let new_ptr = Arc::as_ptr(&new) as usize;
    assert!(!changes.is_empty(), "the new instance's write is published");
    assert!(
        changes.iter().all(|(from, _)| *from == new_ptr),
        "only the registered instance publishes: {changes:?}"
    );
}

#[test]
fn enqueue_hands_the_deleter_one_callers_jobs_in_order_in_pieces_of_at_most_a_pass() {
    let (fx, instance) = fixture(i64::MAX, PREFER_3FS);
    let started = fx
        .manager
        .start_write(&instance, vec![1], &[], 600)
        .expect("start");
    let all = BlockMask::Offset(1);
    fx.manager
        .finish_write(&instance, &started.session_id, &all)
        .expect("finish");
    let location = instance.index.get(&[1]).expect("get")[0]
        .clone()
        .expect("written")
        .to_locations()
        .remove(0);
    let batch = crate::deleter::BATCH;
    let jobs: Vec<crate::deleter::DeleteJob> = (0..2 * batch as BlockKey + 1)
        .map(|key| crate::deleter::DeleteJob {
            instance: instance.clone(),
            key,
            location: location.clone(),
        })
        .collect();
    let (sender, receiver) = std::sync::mpsc::channel();
    crate::deleter::enqueue(&sender, jobs);
    drop(sender);
    let pieces: Vec<Vec<crate::deleter::DeleteJob>> = receiver.iter().collect();
    let sizes: Vec<usize> = pieces.iter().map(Vec::len).collect();
    assert_eq!(sizes, vec![batch, batch, 1]);
    let keys: Vec<BlockKey> = pieces.iter().flatten().map(|job| job.key).collect();
    assert_eq!(
        keys,
        (0..2 * 4096 + 1).collect::<Vec<BlockKey>>(),
        "in order"
    );
}

#[test]
fn blocks_of_a_session_whose_failing_failed_are_failed_again_later() {
    let (fx, instance, failures, _) = flaky_fixture();
    let started = fx
        .manager
        .start_write(&instance, vec![1, 2], &[], 600)
        .expect("start");
    failures.store(1, std::sync::atomic::Ordering::SeqCst);
    let finished = fx
        .manager
        .finish_write(&instance, &started.session_id, &BlockMask::Offset(0));
    assert!(finished.is_err(), "the outage fails the finish");
    let deadline = Instant::now() + Duration::from_secs(5);
    while instance.index.len().expect("len") > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        instance.index.len().expect("len"),
        0,
        "the blocks were failed on a retry and deleted"
    );
    assert_eq!(fx.manager.open_sessions(), 0);
}

/// A SERVING location of `key` allocated on storage `storage_name`, and its URI.
fn allocated(
    fx: &Fixture,
    instance: &Instance,
    key: i64,
    storage_name: &str,
) -> (Location, String) {
    let storages = &fx.manager.storages;
    let handle = storages.current_handle(storage_name).expect("registered");
    let incarnations = storages.incarnations();
    let incarnation = incarnations.get(handle).expect("incarnation");
    let blocks = [BlockToAllocate {
        key,
        spec_indexes: vec![0],
    }];
    let request = AllocationRequest {
        instance_id: instance.id(),
        specs: instance.specs(),
        blocks: &blocks,
    };
    let placed = incarnation.backend.allocate(&request).expect("allocate");
    let part = &placed[0][0];
    let location = Location {
        storage: handle,
        state: LocationState::Serving,
        nonce: crate::write::next_nonce(&fx.manager.nonces),
        parts: vec![Part {
            spec: 0,
            address: part.address,
        }],
        checksums: Vec::new(),
    };
    (location, part.uri.clone())
}

/// Stores a SERVING location of `key` on storage `storage_name`.
fn put_serving(fx: &Fixture, instance: &Instance, key: i64, storage_name: &str) {
    let (location, _) = allocated(fx, instance, key, storage_name);
    instance
        .index
        .put(vec![(key, Entry::new(vec![location]))])
        .expect("put");
}

fn batch_hit(manager: &Manager, instance: &Instance, key: i64) -> bool {
    let found = manager
        .get_cache_location(
            instance,
            QueryKind::BatchGet,
            &[key],
            &BlockMask::default(),
            &[],
        )
        .expect("query");
    found[0].storage_type != StorageType::Unspecified
}

#[test]
fn with_one_storage_per_type_an_unavailable_storage_weighs_by_its_type() {
    let (fx, instance) = fixture(i64::MAX, PREFER_3FS);
    fx.manager
        .add_storage(storage("u", &fx.dir.path().join("u")))
        .expect("a storage outside the group");
    fx.manager
        .set_storage_available("u", false)
        .expect("disable");
    let three_fs = three_fs(fx.dir.path());
    fx.manager
        .add_storage(three_fs)
        .expect("a 3FS outside the group");
    fx.manager
        .set_storage_available("w", false)
        .expect("disable");
    put_serving(&fx, &instance, 1, "u");
    put_serving(&fx, &instance, 2, "w");
    assert!(
        batch_hit(&fx.manager, &instance, 1),
        "NFS is available in the group: weight 1"
    );
    assert!(
        !batch_hit(&fx.manager, &instance, 2),
        "the group has no available 3FS: weight 0"
    );
    let start = fx
        .manager
        .start_write(&instance, vec![2, 3], &[], 30)
        .expect("start");
    assert_eq!(
        start.mask,
        BlockMask::Bools(vec![true, false]),
        "a present block of weight 0 is no prefix"
    );
}

#[test]
fn with_several_storages_of_a_type_only_available_candidates_weigh() {
    let (fx, instance) = fixture(i64::MAX, PREFER_3FS);
    for name in ["t", "u"] {
        fx.manager
            .add_storage(storage(name, &fx.dir.path().join(name)))
            .expect("storage");
    }
    let mut group = GroupConfig::clone(&fx.manager.group("g").expect("group"));
    group.storage_candidates.push("t".into());
    group.version = 2;
    fx.manager.update_group(group, 1).expect("update");
    fx.manager
        .set_storage_available("t", false)
        .expect("disable");
    put_serving(&fx, &instance, 1, "s");
    put_serving(&fx, &instance, 2, "u");
    assert!(batch_hit(&fx.manager, &instance, 1));
    assert!(
        !batch_hit(&fx.manager, &instance, 2),
        "an available storage outside the candidates weighs 0"
    );
}

#[test]
fn an_update_that_cannot_open_its_storage_changes_nothing() {
    let (fx, _instance) = fixture(i64::MAX, PREFER_3FS);
    fx.manager
        .set_storage_available("s", false)
        .expect("disable");
    let listed = fx.manager.list_storages();
    let blocker = fx.dir.path().join("a-file");
    std::fs::write(&blocker, b"not a directory").expect("file");
    let probed = StorageConfig {
        check_storage_available_when_open: true,
        ..storage("s", &blocker)
    };
    let refused = fx.manager.update_storage(probed);
    assert!(refused.is_err(), "a root below a file cannot be opened");
    assert_eq!(fx.manager.list_storages(), listed);
    assert!(
        fx.manager.storages.available(&["s".into()]).is_empty(),
        "the old storage stays registered and disabled"
    );
}

#[test]
fn a_group_update_proceeds_while_a_read_is_inside_the_index() {
    let (fx, instance, _, on_get) = flaky_fixture();
    let (updated_tx, updated_rx) = std::sync::mpsc::channel();
    let manager = Arc::downgrade(&fx.manager);
    let hook: Box<dyn Fn() + Send + Sync> = Box::new(move || {
        // Runs inside the lookup: a groups lock still held here would block this update.
        let Some(manager) = manager.upgrade() else {
            return;
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let writer = std::thread::spawn(move || {
            let mut group = GroupConfig::clone(&manager.group("g").expect("group"));
            group.version += 1;
            let current = group.version - 1;
            tx.send(manager.update_group(group, current).is_ok()).ok();
        });
        let updated = rx.recv_timeout(Duration::from_secs(5)).unwrap_or(false);
        updated_tx.send(updated).ok();
        if updated {
            writer.join().expect("writer");
        }
    });
    assert!(on_get.set(hook).is_ok());
    prefix(&fx.manager, &instance, &[1]);
    assert_eq!(
        updated_rx.try_recv(),
        Ok(true),
        "the update finished during the lookup"
    );
}

/// The (key, location) → state picture the index holds for `keys`.
fn index_picture(
    instance: &Instance,
    keys: &[i64],
) -> std::collections::HashMap<(i64, LocationId), LocationState> {
    let entries = instance.index.get(keys).expect("get");
    let mut picture = std::collections::HashMap::new();
    for (key, entry) in keys.iter().zip(entries) {
        for location in entry.iter().flat_map(|e| e.locations()) {
            picture.insert((*key, location.id()), location.state);
        }
    }
    picture
}

/// Applies one change to a picture; it must start from the state the picture holds.
fn apply(
    picture: &mut std::collections::HashMap<(i64, LocationId), LocationState>,
    change: StateChange,
) {
    let slot = (change.key, change.location_id);
    assert_eq!(picture.get(&slot).copied(), change.from, "{change:?}");
    match change.to {
        Some(state) => picture.insert(slot, state),
        None => picture.remove(&slot),
    };
}

#[test]
fn the_change_feed_is_lossless_and_ordered_per_key_under_concurrent_writers() {
    let (fx, instance) = fixture(i64::MAX, PREFER_3FS);
    let feed = fx.manager.subscribe();
    // Enough keys that starts keep finding absent ones while removed keys wait, DELETING
    // (present to StartWriteCache), for a deleter a loaded machine may starve.
    let keys: Vec<i64> = (0..64).collect();
    std::thread::scope(|scope| {
        for _ in 0..4 {
            let (manager, instance, keys) = (&fx.manager, &instance, &keys);
            scope.spawn(move || {
                for _ in 0..150 {
                    let start = fastrand::usize(..keys.len());
                    let run = keys[start..fastrand::usize(start + 1..=keys.len())].to_vec();
                    match fastrand::u8(..3) {
                        0 => drop(manager.remove_cache(instance, &run)),
                        _ => {
                            let Ok(started) = manager.start_write(instance, run, &[], 30) else {
                                continue;
                            };
                            let count = started.locations.len();
                            let mask =
                                BlockMask::Bools((0..count).map(|_| fastrand::bool()).collect());
                            drop(manager.finish_write(instance, &started.session_id, &mask));
                        }
                    }
                }
            });
        }
    });
    // Replay the feed: every change must start from the state the previous one left.
    let mut picture = std::collections::HashMap::new();
    let mut applied = 0usize;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        while let Ok(change) = feed.try_recv() {
            apply(&mut picture, change);
            applied += 1;
        }
        let stored = index_picture(&instance, &keys);
        let settled = !stored.values().any(|s| *s == LocationState::Deleting);
        if settled && stored == picture {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the feed never caught up with the index"
        );
        // Wait for the next change (the deleter is still working) instead of spinning.
        if let Ok(change) = feed.recv_timeout(Duration::from_secs(5)) {
            apply(&mut picture, change);
            applied += 1;
        }
    }
    assert!(applied > 100, "only {applied} changes were published");
}

#[test]
fn storage_handles_run_out_with_a_clear_refusal_that_changes_nothing() {
    let (fx, instance) = fixture(i64::MAX, PREFER_3FS);
    let mooncake = || StorageConfig {
        global_unique_name: "m".into(),
        spec: StorageSpec::Mooncake {
            local_hostname: "h".into(),
            metadata_connstring: "c".into(),
            protocol: "tcp".into(),
            rdma_device: String::new(),
            master_service_entry: "e".into(),
        },
        check_storage_available_when_open: false,
    };
    fx.manager.add_storage(mooncake()).expect("second storage");
    // Handles 0 ("s") and 1 ("m") are taken; every update makes a new incarnation.
    let mut updates = 0;
    let refused = loop {
        match fx.manager.update_storage(mooncake()) {
            Ok(()) => updates += 1,
            Err(error) => break error,
        }
    };
    assert_eq!(updates, 65_536 - 2, "every 16-bit handle was used once");
    assert!(
        matches!(&refused, ManagerError::Refused(m) if m.contains("storage handle")),
        "{refused:?}"
    );
    assert_eq!(
        fx.manager.list_storages().len(),
        2,
        "both storages still registered"
    );
    let written = fx.manager.start_write(&instance, vec![1], &[], 30);
    assert!(written.is_ok(), "the old storages still serve: {written:?}");
}

/// A manager with storages `s` (in `dir/s`) and `t` (at `t_root`) and instance `i` of a
/// group whose candidates are `[s, t]`, in that order.
fn two_storages(t_root: &std::path::Path) -> (Fixture, Arc<Instance>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let manager = Manager::new(test_deps()).expect("manager");
    let s_root = dir.path().join("s");
    manager.add_storage(storage("s", &s_root)).expect("s");
    manager.add_storage(storage("t", t_root)).expect("t");
    let group = GroupConfig {
        storage_candidates: vec!["s".into(), "t".into()],
        ..group(i64::MAX, PREFER_3FS)
    };
    manager.create_group(group).expect("group");
    manager
        .register_instance(instance_info())
        .expect("register");
    let instance = manager.instance("i").expect("registered");
    (Fixture { manager, dir }, instance)
}

/// Writes and commits `keys` asking for `min_replicas`; returns the storages' names of the
/// new locations, in request order.
fn write_replicas(fx: &Fixture, instance: &Arc<Instance>, keys: &[i64], min: usize) -> Vec<String> {
    let started = fx
        .manager
        .start_write_replicas(instance, keys.to_vec(), &[], 30, min)
        .expect("start");
    let count = started.locations.len();
    fx.manager
        .finish_write(instance, &started.session_id, &BlockMask::Offset(count))
        .expect("finish");
    started
        .locations
        .iter()
        .map(|l| {
            first_uri(l)
                .trim_start_matches("file://")
                .split('/')
                .next()
                .unwrap()
                .to_string()
        })
        .collect()
}

fn serving_count(instance: &Instance, key: i64) -> usize {
    let entry = instance.index.get(&[key]).expect("get").remove(0);
    entry.map_or(0, |e| {
        e.locations()
            .filter(|l| l.state == LocationState::Serving)
            .count()
    })
}

#[test]
fn min_replicas_place_each_new_replica_on_a_storage_without_one() {
    let t_root = tempfile::tempdir().expect("tempdir");
    let (fx, instance) = two_storages(t_root.path());
    assert_eq!(write_replicas(&fx, &instance, &[1], 1), ["s"]);
    assert_eq!(write_replicas(&fx, &instance, &[1, 2], 2), ["t", "s"]);
    assert_eq!(
        write_replicas(&fx, &instance, &[1, 2], 2),
        ["t"],
        "2 has one, 1 two"
    );
    assert_eq!(
        (serving_count(&instance, 1), serving_count(&instance, 2)),
        (2, 2)
    );
    assert!(
        write_replicas(&fx, &instance, &[1, 2], 3).is_empty(),
        "no third storage"
    );
    assert!(
        write_replicas(&fx, &instance, &[1, 2], 0).is_empty(),
        "0 reads as 1"
    );
}

#[test]
fn a_failed_replica_allocation_fails_the_whole_start_and_changes_nothing() {
    // `t` lies below a regular file: any allocation on it fails (not for lack of room).
    let t_parent = tempfile::tempdir().expect("tempdir");
    let blocker = t_parent.path().join("file");
    std::fs::write(&blocker, b"x").expect("blocker");
    let (fx, instance) = two_storages(&blocker.join("t"));
    assert_eq!(write_replicas(&fx, &instance, &[1], 1), ["s"]);
    // Key 2 is placed on `s` first, then key 1's replica fails on `t`: the call fails and
    // no key, location or session is left behind.
    let refused = fx
        .manager
        .start_write_replicas(&instance, vec![1, 2], &[], 30, 2);
    assert!(
        matches!(refused, Err(ManagerError::Storage(_))),
        "{refused:?}"
    );
    assert_eq!(fx.manager.open_sessions(), 0);
    assert_eq!(serving_count(&instance, 1), 1);
    let entry = instance.index.get(&[1]).expect("get").remove(0).expect("1");
    assert_eq!(entry.locations().count(), 1, "no WRITING replica of 1");
    assert!(
        instance.index.get(&[2]).expect("get")[0].is_none(),
        "2 was not kept"
    );
    // Without the replica the same keys are written on `s` alone.
    assert_eq!(write_replicas(&fx, &instance, &[1, 2], 1), ["s"]);
}

mod capacity;
mod reclaim;

#[test]
fn a_deleter_batch_that_fails_is_skipped_and_the_others_are_removed_and_uncounted() {
    let (fx, instance, failures, keys) = flaky_with_512_served();
    let per_block = instance.usage().total() / keys.len() as i64;
    assert!(per_block > 0, "the blocks are counted");
    let moved = fx
        .manager
        .move_locations(&instance, &keys, LocationState::Deleting, &mut |_, _| true)
        .expect("to DELETING");
    let batches = crate::deleter::background_batches(&instance, keys.clone());
    assert!(batches.len() >= 3, "{} batches", batches.len());
    let jobs: Vec<crate::deleter::DeleteJob> = moved
        .into_iter()
        .map(|(key, location)| crate::deleter::DeleteJob {
            instance: instance.clone(),
            key,
            location,
        })
        .collect();
    // The first batch fails (a backend outage); the deleter goes on with the rest.
    failures.store(1, std::sync::atomic::Ordering::SeqCst);
    crate::deleter::delete_now(&jobs, &fx.manager.storages, &fx.manager.feed);
    let left: Vec<BlockKey> = keys
        .iter()
        .copied()
        .filter(|&key| instance.index.get(&[key]).unwrap()[0].is_some())
        .collect();
    let mut failed = batches[0].clone();
    failed.sort_unstable();
    assert_eq!(left, failed, "only the failed batch's keys stay (DELETING)");
    assert_eq!(
        instance.usage().total(),
        per_block * failed.len() as i64,
        "every removed block is uncounted, the failed batch's are not"
    );
}
