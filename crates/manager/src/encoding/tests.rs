//! Encoding tests: round trips over random objects, hostile inputs (bit flips, truncation,
//! edited lengths) that must fail cleanly within the allocation budget, and the committed v1
//! fixtures that every later decoder must read.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::PathBuf;

use kvcm_storage::{BlockSpec, PartAddress, StorageConfig, StorageSpec};
use proptest::prelude::*;

use super::{DecodeError, Encode, ALLOCATION_FACTOR, VERSION};
use crate::accounts::{Account, AccountRole};
use crate::api_keys::ApiKey;
use crate::entry::{Entry, Location, LocationState, Part, StorageHandle};
use crate::group_config::{
    CacheConfig, GroupConfig, GroupQuota, IndexBackend, IndexerConfig, PreferStrategy,
    ReclaimPolicy, ReclaimStrategy, ReclaimTrigger, SearchCachePolicy, TypeQuota,
};
use crate::password::StoredPassword;
use crate::registration::{InstanceInfo, ModelDeployment, SpecGroup};
use crate::storage_type::StorageType;

/// Counts the bytes the current thread allocates while counting is on.
struct CountingAllocator;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATED: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded unchanged to the system allocator; the counters are
// thread-local cells that never allocate.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATED.with(|a| a.set(a.get() + layout.size()));
        }
        // SAFETY: the caller's layout is passed on as given.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with this layout (see `alloc`).
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Decodes `bytes` as `T` and reports how many bytes the decode allocated.
fn decode_counted<T: Encode>(bytes: &[u8]) -> (Result<T, DecodeError>, usize) {
    ALLOCATED.with(|a| a.set(0));
    COUNTING.with(|c| c.set(true));
    let decoded = T::decode(bytes);
    COUNTING.with(|c| c.set(false));
    (decoded, ALLOCATED.with(Cell::get))
}

fn location_strategy() -> impl Strategy<Value = Location> {
    let address = (any::<u32>(), any::<u32>(), any::<u16>());
    let part = (any::<u16>(), address).prop_map(|(spec, (object, block, generation))| Part {
        spec,
        address: PartAddress {
            object,
            block,
            generation,
        },
    });
    let state = prop_oneof![
        Just(LocationState::Writing),
        Just(LocationState::Serving),
        Just(LocationState::Deleting)
    ];
    let parts = prop::collection::vec(part, 1..10).prop_map(|mut parts| {
        parts.sort_by_key(|part| part.spec);
        parts.dedup_by_key(|part| part.spec);
        parts
    });
    (
        any::<u16>(),
        state,
        any::<u32>(),
        parts,
        any::<Option<u64>>(),
    )
        .prop_map(|(storage, state, nonce, parts, seed)| Location {
            storage: StorageHandle(storage),
            state,
            nonce,
            // No checksums, or one per part.
            checksums: seed.map_or_else(Vec::new, |seed| {
                (0..parts.len() as u64).map(|i| seed ^ i).collect()
            }),
            parts,
        })
}

fn entry_strategy() -> impl Strategy<Value = Entry> {
    prop::collection::vec(location_strategy(), 1..4).prop_map(Entry::new)
}

/// Every way of damaging an encoding the tests try: each bit flipped, each truncation, and
/// each 4-byte window overwritten with lengths that lie.
fn mutations(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut damaged = Vec::new();
    for bit in 0..bytes.len() * 8 {
        let mut flipped = bytes.to_vec();
        flipped[bit / 8] ^= 1 << (bit % 8);
        damaged.push(flipped);
    }
    for len in 0..bytes.len() {
        damaged.push(bytes[..len].to_vec());
    }
    for at in 0..bytes.len().saturating_sub(3) {
        for lie in [0u32, 1, 0xff, 0xffff, u32::MAX / 2, u32::MAX] {
            let mut edited = bytes.to_vec();
            edited[at..at + 4].copy_from_slice(&lie.to_le_bytes());
            damaged.push(edited);
        }
    }
    damaged
}

/// Decoding every damaged copy either fails or yields some object, never panics, and never
/// allocates more than the budget.
/// `value` re-headed as `version` with `padding` zero bytes appended (a shape no build
/// writes) decodes as `Invalid`: each value is written in the oldest version that holds it.
fn assert_reheaded_is_invalid<T: Encode + std::fmt::Debug>(value: &T, version: u8, padding: usize) {
    let mut bytes = value.encode();
    bytes[2] = version;
    bytes.extend(std::iter::repeat_n(0, padding));
    assert!(
        matches!(T::decode(&bytes), Err(DecodeError::Invalid(_))),
        "{value:?} as v{version}"
    );
}

fn assert_hostile_inputs_are_safe<T: Encode>(bytes: &[u8]) {
    for damaged in mutations(bytes) {
        let (_, allocated) = decode_counted::<T>(&damaged);
        assert!(
            allocated <= damaged.len() * ALLOCATION_FACTOR,
            "{allocated} bytes allocated for an input of {}",
            damaged.len()
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn entries_round_trip(entry in entry_strategy()) {
        let bytes = entry.encode();
        let (decoded, allocated) = decode_counted::<Entry>(&bytes);
        prop_assert_eq!(decoded, Ok(entry));
        prop_assert!(allocated <= bytes.len() * ALLOCATION_FACTOR);
    }

    #[test]
    fn damaged_entries_fail_within_budget(entry in entry_strategy()) {
        assert_hostile_inputs_are_safe::<Entry>(&entry.encode());
    }
}

fn storage_nfs() -> StorageConfig {
    StorageConfig {
        global_unique_name: "nfs_01".into(),
        spec: StorageSpec::Nfs {
            root_path: "/tmp/nfs/".into(),
            key_count_per_file: 8,
        },
        check_storage_available_when_open: true,
    }
}

fn storage_3fs() -> StorageConfig {
    StorageConfig {
        global_unique_name: "3fs_01".into(),
        spec: StorageSpec::ThreeFs {
            cluster_name: "c1".into(),
            mountpoint: "/mnt/3fs".into(),
            root_dir: "kv".into(),
            key_count_per_file: 4,
            touch_file_when_create: true,
        },
        check_storage_available_when_open: false,
    }
}

fn group() -> GroupConfig {
    GroupConfig {
        name: "default".into(),
        storage_candidates: vec!["nfs_01".into(), "3fs_01".into()],
        quota_group_name: "default".into(),
        max_instance_count: 16,
        quota: Some(GroupQuota {
            capacity: 1 << 40,
            per_type: vec![TypeQuota {
                storage_type: StorageType::Nfs,
                capacity: 1 << 30,
            }],
        }),
        cache: CacheConfig {
            reclaim: ReclaimStrategy {
                storage_unique_name: "nfs_01".into(),
                policy: ReclaimPolicy::Lru,
                trigger: Some(ReclaimTrigger {
                    used_size: 1 << 20,
                    used_percentage: 0.8,
                }),
                trigger_period_seconds: 60,
                step_size: 128,
                step_percentage: 5,
                delay_before_delete_ms: 1000,
            },
            prefer: PreferStrategy::Prefer(StorageType::ThreeFs),
            indexer: IndexerConfig {
                max_key_count: 1_000_000,
                mutex_shard_num: 256,
                batch_key_size: 64,
                backend: IndexBackend {
                    storage_type: "local".into(),
                    storage_uri: String::new(),
                },
                cache_policy: SearchCachePolicy {
                    capacity: 64,
                    kind: "lru".into(),
                    cache_shard_bits: 4,
                    high_pri_pool_ratio: 0.5,
                },
                mutex_disabled: false,
            },
        },
        user_data: "{\"team\":\"serving\"}".into(),
        version: 3,
        extra_info: String::new(),
        revisit_interval_buckets: String::new(),
        event_report_storage_candidates: Vec::new(),
    }
}

fn instance() -> InstanceInfo {
    InstanceInfo {
        quota_group_name: "default".into(),
        instance_group_name: "default".into(),
        instance_id: "qwen-0".into(),
        block_size: 16,
        specs: vec![
            BlockSpec {
                name: "tp0".into(),
                size: 4096,
            },
            BlockSpec {
                name: "tp1".into(),
                size: 4096,
            },
        ],
        model: ModelDeployment {
            model_name: "qwen".into(),
            dtype: "FP8".into(),
            use_mla: true,
            tp_size: 2,
            dp_size: 1,
            lora_name: "none".into(),
            pp_size: 1,
            extra: "x".into(),
            user_data: "u".into(),
            use_eagle_pop: false,
        },
        spec_groups: vec![SpecGroup {
            name: "first".into(),
            spec_names: vec!["tp0".into()],
        }],
        default_query: Default::default(),
    }
}

/// PBKDF2-HMAC-SHA256 of "secret", 100,000 rounds, salt 00 01 … 0f (fixed, so that the
/// fixture's bytes are too).
const SECRET_HASH: &str = "pbkdf2-sha256$100000$000102030405060708090a0b0c0d0e0f$\
                           9fb9dd3c8e2944366b788c7e795a5a6350d58845b2a3d21ad65f07b55181f837";

fn account() -> Account {
    Account {
        user_name: "ops".into(),
        password: StoredPassword::parse(SECRET_HASH.into()),
        role: AccountRole::Admin,
    }
}

/// An account an older build recorded with its password "secret" in clear decodes as it
/// was written; hashed (as replay does), it writes the hash and not the password.
fn check_legacy_account(version: u8, name: &str, role: AccountRole) {
    let bytes = std::fs::read(fixture_path(version, name)).expect("fixture");
    let mut decoded = Account::decode(&bytes).expect("decodes");
    assert_eq!((decoded.user_name.as_str(), decoded.role), ("ops", role));
    assert_eq!(decoded.password, StoredPassword::Clear("secret".into()));
    assert_eq!(
        decoded.encode(),
        bytes,
        "kept as read until replay hashes it"
    );
    decoded.password = decoded.password.hashed();
    let StoredPassword::Hash(hash) = &decoded.password else {
        panic!("{name}: not hashed");
    };
    assert!(hash.matches("secret"), "{name}");
    let written = decoded.encode();
    assert!(!written.windows(6).any(|w| w == b"secret"), "{name}");
}

fn one_part_entry() -> Entry {
    Entry::new(vec![Location {
        storage: StorageHandle(0),
        state: LocationState::Serving,
        nonce: 42,
        parts: vec![Part {
            spec: 0,
            address: PartAddress {
                object: 7,
                block: 3,
                generation: 1,
            },
        }],
        checksums: Vec::new(),
    }])
}

fn replicated_entry() -> Entry {
    let location = |storage, state, parts: u16| Location {
        storage: StorageHandle(storage),
        state,
        nonce: 7 + u32::from(storage),
        parts: (0..parts)
            .map(|spec| Part {
                spec,
                address: PartAddress {
                    object: 100 + u32::from(spec),
                    block: u32::from(spec),
                    generation: spec,
                },
            })
            .collect(),
        checksums: Vec::new(),
    };
    Entry::new(vec![
        location(1, LocationState::Serving, 8),
        location(2, LocationState::Deleting, 2),
    ])
}

/// An entry whose first location carries checksums (a v2 feature).
fn checksummed_entry() -> Entry {
    let mut locations = replicated_entry().to_locations();
    locations[0].checksums = (0..8).map(|i| 0x9e37_79b9_7f4a_7c15 ^ i).collect();
    Entry::new(locations)
}

fn fixture_path(version: u8, name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../../fixtures/encoding/v{version}"))
        .join(name)
}

/// The committed bytes of `value` in `version` decode to it and equal what this build
/// writes. `KVCM_WRITE_FIXTURES=1` writes them instead (only when the format is deliberately
/// new).
fn check_fixture<T: Encode + PartialEq + std::fmt::Debug>(version: u8, name: &str, value: T) {
    assert_eq!(value.version(), version, "{name} is a v{version} value");
    let path = fixture_path(version, name);
    if std::env::var_os("KVCM_WRITE_FIXTURES").is_some() {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, value.encode()).expect("write fixture");
    }
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(T::decode(&bytes).as_ref(), Ok(&value), "{name} decodes");
    assert_eq!(
        value.encode(),
        bytes,
        "{name}: this build writes v{version} unchanged"
    );
    assert_hostile_inputs_are_safe::<T>(&bytes);
}

#[test]
fn the_v1_fixtures_decode() {
    check_fixture(1, "entry_one_part.bin", one_part_entry());
    check_fixture(1, "entry_replicated.bin", replicated_entry());
    check_fixture(1, "storage_nfs.bin", storage_nfs());
    check_fixture(1, "storage_3fs.bin", storage_3fs());
    check_fixture(1, "group.bin", group());
    check_fixture(1, "instance.bin", instance());
    check_fixture(1, "account_hashed.bin", account());
    check_legacy_account(1, "account.bin", AccountRole::Admin);
}

#[test]
fn the_v2_fixtures_decode() {
    check_fixture(2, "entry_checksums.bin", checksummed_entry());
    check_fixture(2, "group_trunk.bin", trunk_group());
}

#[test]
fn an_entry_is_written_in_the_oldest_version_that_holds_it() {
    assert_eq!(replicated_entry().encode()[2], 1, "no checksums: v1");
    assert_eq!(checksummed_entry().encode()[2], 2, "checksums: v2");
    let mut lying = checksummed_entry().encode();
    lying[2] = 1;
    assert!(
        Entry::decode(&lying).is_err(),
        "v2 bytes read as v1 do not decode"
    );
}

#[test]
fn a_newer_version_or_another_kind_is_refused() {
    let mut bytes = account().encode();
    bytes[2] = VERSION + 1;
    assert_eq!(
        Account::decode(&bytes),
        Err(DecodeError::NewerVersion {
            found: VERSION + 1,
            newest: VERSION
        })
    );
    let entry = one_part_entry().encode();
    assert!(matches!(
        GroupConfig::decode(&entry),
        Err(DecodeError::WrongKind { .. })
    ));
    let mut trailing = account().encode();
    trailing.push(0);
    assert_eq!(Account::decode(&trailing), Err(DecodeError::Trailing(1)));
}

/// A group with upstream trunk's fields (a v2 feature).
fn trunk_group() -> GroupConfig {
    GroupConfig {
        extra_info: "{\"tier\":\"gold\"}".into(),
        revisit_interval_buckets: "1,5,30,60".into(),
        ..group()
    }
}

#[test]
fn a_group_with_trunk_fields_is_v2_and_round_trips() {
    let trunk = trunk_group();
    let bytes = trunk.encode();
    assert_eq!(bytes[2], 2, "the oldest version holding the trunk fields");
    assert_eq!(GroupConfig::decode(&bytes).as_ref(), Ok(&trunk));
    assert_hostile_inputs_are_safe::<GroupConfig>(&bytes);
    assert_eq!(group().encode()[2], 1, "a group without them stays v1");

    let mut newer = bytes.clone();
    newer[2] = VERSION + 1;
    assert_eq!(
        GroupConfig::decode(&newer),
        Err(DecodeError::NewerVersion {
            found: VERSION + 1,
            newest: VERSION
        })
    );
    // A v2 header on a group whose trunk fields are empty is not what any build writes.
    assert_reheaded_is_invalid(&group(), 2, 8);
}

/// A group with event-report candidates (a v3 feature).
fn reported_group() -> GroupConfig {
    GroupConfig {
        event_report_storage_candidates: vec!["l2".into(), "l1p5".into()],
        ..trunk_group()
    }
}

/// An event-report storage (a v3 feature).
fn storage_event_report() -> StorageConfig {
    StorageConfig {
        global_unique_name: "l2".into(),
        spec: StorageSpec::EventReport {
            tier: kvcm_storage::ReportTier::L2,
            timings: kvcm_storage::ReportTimings {
                heartbeat_timeout_ms: 1,
                cleanup_grace_ms: 2,
                liveness_check_interval_ms: 3,
                snapshot_min_interval_ms: 4,
                snapshot_delta_drain_timeout_ms: 5,
            },
        },
        check_storage_available_when_open: false,
    }
}

#[test]
fn the_v3_fixtures_decode() {
    check_fixture(3, "group_event_report.bin", reported_group());
    check_fixture(3, "storage_event_report.bin", storage_event_report());
    check_fixture(3, "instance_default_query.bin", defaulted_instance());
}

/// An instance with a default query type (a v3 feature).
fn defaulted_instance() -> InstanceInfo {
    InstanceInfo {
        default_query: crate::registration::DefaultQuery::PrefixMatch,
        ..instance()
    }
}

#[test]
fn v3_headers_carry_only_v3_values() {
    // A v3 header on a group without candidates is not what any build writes.
    assert_reheaded_is_invalid(&trunk_group(), 3, 4);
    assert_reheaded_is_invalid(&instance(), 3, 1);
    assert_eq!(instance().encode()[2], 1, "no default query type: v1");
    // An older header cannot carry the event-report spec.
    assert_reheaded_is_invalid(&storage_event_report(), 2, 0);
}

/// An instance in upstream trunk's EaglePop mode (a v4 feature), with a default query type.
fn eagle_pop_instance() -> InstanceInfo {
    let mut info = defaulted_instance();
    info.model.use_eagle_pop = true;
    info
}

/// A group with upstream trunk's `mutex_enabled = false` (a v4 feature).
fn unlocked_group() -> GroupConfig {
    let mut group = reported_group();
    group.cache.indexer.mutex_disabled = true;
    group
}

/// A pool with upstream trunk's discovery URL and media type (a v4 feature), or without.
fn pool(service_discovery_url: &str, media_type: i32) -> StorageConfig {
    StorageConfig {
        global_unique_name: "pool".into(),
        spec: StorageSpec::TairMemPool {
            domain: "pool.domain".into(),
            timeout: 100,
            enable_vipserver: false,
            service_discovery_url: service_discovery_url.into(),
            media_type,
        },
        check_storage_available_when_open: false,
    }
}

#[test]
fn the_v4_fixtures_decode() {
    check_fixture(4, "instance_eagle_pop.bin", eagle_pop_instance());
    check_fixture(4, "group_mutex_disabled.bin", unlocked_group());
    let discovered = pool("static://10.0.0.1:7000,10.0.0.2:7000", 2);
    check_fixture(4, "storage_pool_discovery.bin", discovered);
}

fn operator() -> Account {
    Account {
        role: AccountRole::Operator,
        ..account()
    }
}

fn api_key() -> ApiKey {
    ApiKey {
        id: "00112233445566ff".into(),
        user_name: "ops".into(),
        digest: std::array::from_fn(|i| i as u8),
        instances: vec!["engine-a".into(), "engine-b".into()],
        created_ms: 1_764_000_000_000,
        expires_ms: 1_800_000_000_000,
    }
}

#[test]
fn the_v6_fixtures_decode() {
    check_fixture(6, "account_operator_hashed.bin", operator());
    check_legacy_account(6, "account_operator.bin", AccountRole::Operator);
    check_fixture(6, "api_key.bin", api_key());
}

#[test]
fn v6_headers_carry_only_v6_values() {
    assert_eq!(account().encode()[2], 1, "a v1 role stays v1");
    assert_reheaded_is_invalid(&operator(), 1, 0);
    assert_reheaded_is_invalid(&account(), 6, 0);
    let mut older = api_key().encode();
    older[2] = 5;
    assert!(ApiKey::decode(&older).is_err(), "no API key before v6");
}

#[test]
fn v4_headers_carry_only_v4_values() {
    assert_eq!(defaulted_instance().encode()[2], 3);
    assert_eq!(pool("", 0).encode()[2], 1, "a pool without them stays v1");
    assert_reheaded_is_invalid(&defaulted_instance(), 4, 1);
    assert_reheaded_is_invalid(&reported_group(), 4, 1);
    assert_reheaded_is_invalid(&pool("", 0), 4, 8);
    // Nor is a v3 header on a v4 value (its flag would be a trailing byte).
    let mut older = eagle_pop_instance().encode();
    older[2] = 3;
    assert!(InstanceInfo::decode(&older).is_err());
}
