//! Journal tests on real files: a manager writes, a new manager on the same directory
//! recovers; torn, flipped and refused records; snapshots; group commit.

use std::path::Path;
use std::sync::Arc;

use super::files;
use super::record::Record;
use super::*;
use crate::mask::BlockMask;
use crate::query::QueryKind;
use crate::tests::{group, instance_info, storage, test_deps, OwnedLookup, PREFER_3FS};
use crate::{Instance, Manager};

fn manager() -> Arc<Manager> {
    Manager::new(test_deps()).expect("manager")
}

fn config(dir: &Path) -> JournalConfig {
    JournalConfig {
        dir: dir.join("meta"),
        fsync: FsyncPolicy::Always,
        snapshot_bytes: 64 << 20,
    }
}

/// A manager on the journal of `dir` (recovered), with its report.
fn reopen(dir: &Path) -> (Arc<Manager>, RecoveryReport) {
    reopen_with(config(dir))
}

fn reopen_with(config: JournalConfig) -> (Arc<Manager>, RecoveryReport) {
    let manager = manager();
    let report = manager.open_journal(config).expect("open journal");
    (manager, report)
}

/// A journaled manager with storage `s` (files under `dir/blocks`), group `g`, instance `i`.
fn registered(dir: &Path) -> Arc<Manager> {
    let (manager, report) = reopen(dir);
    assert_eq!(report.records, 0, "a new journal");
    std::fs::create_dir_all(dir.join("blocks")).unwrap();
    manager
        .add_storage(storage("s", &dir.join("blocks")))
        .unwrap();
    manager.create_group(group(i64::MAX, PREFER_3FS)).unwrap();
    manager.register_instance(instance_info()).unwrap();
    manager
}

pub(super) fn write(manager: &Manager, instance: &Arc<Instance>, keys: &[i64]) {
    let started = manager
        .start_write(instance, keys.to_vec(), &[], 30)
        .expect("start");
    manager
        .finish_write(
            instance,
            &started.session_id,
            &BlockMask::Offset(keys.len()),
        )
        .expect("finish");
}

/// Per key: the URI it reads at, or `None`.
pub(super) fn uris(manager: &Manager, keys: &[i64]) -> Vec<Option<String>> {
    let instance = manager.instance("i").expect("instance i");
    let mask = BlockMask::default();
    keys.iter()
        .map(|&key| {
            let found = manager
                .get_cache_location(&instance, QueryKind::BatchGet, &[key], &mask, &[])
                .expect("query");
            let uri = found
                .first()
                .and_then(|l| l.parts.first())
                .map(|p| p.uri.clone());
            uri.filter(|uri| !uri.is_empty())
        })
        .collect()
}

#[test]
fn every_record_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let manager = registered(dir.path());
    let instance = manager.instance("i").unwrap();
    write(&manager, &instance, &[1, 2, 3]);
    let incarnations = manager.storages.incarnations();
    let entry = instance.index.get(&[1]).unwrap()[0].clone().unwrap();
    let durable = super::sink::durable_entry(&entry, &incarnations).expect("a file-tier entry");
    assert_eq!(durable.names.len(), 1, "the file of the part is named");
    let records = [
        Record::Storage {
            handle: crate::StorageHandle(3),
            config: storage("s", dir.path()),
        },
        Record::Incarnation {
            handle: crate::StorageHandle(2),
            config: storage("old", dir.path()),
        },
        Record::StorageRemoved("s".into()),
        Record::StorageAvailability {
            name: "s".into(),
            available: false,
        },
        Record::Group(group(5, PREFER_3FS)),
        Record::GroupRemoved("g".into()),
        Record::Instance(instance_info()),
        Record::InstanceRemoved("i".into()),
        Record::Account(crate::Account {
            user_name: "u".into(),
            password: crate::password::StoredPassword::Clear("p".into()),
            role: crate::AccountRole::Admin,
        }),
        Record::AccountRemoved("u".into()),
        Record::ApiKey(crate::ApiKey {
            id: "0123456789abcdef".into(),
            user_name: "u".into(),
            digest: [7; 32],
            instances: vec!["i".into()],
            created_ms: 1,
            expires_ms: 0,
        }),
        Record::ApiKeyRevoked("0123456789abcdef".into()),
        Record::Entries {
            instance_id: "i".into(),
            changes: vec![(1, Some(durable)), (-9, None)],
        },
        Record::End(7),
    ];
    for record in records {
        let bytes = record.encode();
        assert_eq!(Record::decode(&bytes).expect("decodes"), record);
        for cut in 0..bytes.len() {
            assert!(Record::decode(&bytes[..cut]).is_err(), "a cut record fails");
        }
    }
    assert!(Record::decode(&[200]).is_err(), "an unknown tag");
}

#[test]
fn a_reopened_manager_serves_what_was_acknowledged_and_cleans_open_writes() {
    let dir = tempfile::tempdir().unwrap();
    let manager = registered(dir.path());
    let instance = manager.instance("i").unwrap();
    let keys: Vec<i64> = (1..=20).collect();
    write(&manager, &instance, &keys);
    manager.remove_cache(&instance, &[5]).unwrap();
    // The deleter removes key 5's DELETING location in the background: await it, so that
    // recovery's clean-up count below is only the open write's.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while instance.index.get(&[5]).unwrap()[0].is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "the deleter removed key 5"
        );
        std::thread::yield_now();
    }
    let open = manager
        .start_write(&instance, vec![100, 101], &[], 30)
        .expect("an open session");
    let open_uri = open.locations[0].parts[0].uri.clone();
    let before = uris(&manager, &keys);
    assert_eq!(before.iter().flatten().count(), 19);
    drop((instance, manager));

    let (manager, report) = reopen(dir.path());
    assert_eq!(
        uris(&manager, &keys),
        before,
        "the same blocks at the same URIs"
    );
    assert_eq!(
        uris(&manager, &[100, 101]),
        [None, None],
        "the open write is gone"
    );
    assert_eq!(report.cleaned_locations, 2, "{report:?}");
    let open_file = open_uri
        .strip_prefix("file://s")
        .and_then(|rest| rest.split('?').next())
        .expect("a file URI");
    assert!(
        !Path::new(open_file).exists(),
        "the open write's file was freed: {open_file}"
    );
    assert_eq!(
        report.registry_objects, 3,
        "storage, group, instance: {report:?}"
    );
    assert!(
        report.cut.is_empty() && report.skipped.is_empty(),
        "{report:?}"
    );
    let instance = manager.instance("i").unwrap();
    assert_eq!(
        instance.index.len().unwrap(),
        19,
        "no WRITING entry remains"
    );
    // A new write after recovery gets a location id above every restored one.
    let old_ids: Vec<_> = (1..=20)
        .filter(|k| *k != 5)
        .map(|k| meta_id(&manager, &instance, k))
        .collect();
    write(&manager, &instance, &[100]);
    let new_uri = uris(&manager, &[100])[0]
        .clone()
        .expect("written after recovery");
    assert!(
        !old_ids.contains(&meta_id(&manager, &instance, 100)),
        "nonces continue"
    );
    drop((instance, manager));
    let (manager, _) = reopen(dir.path());
    assert_eq!(uris(&manager, &[100])[0], Some(new_uri));
}

/// The regular files below `dir/blocks`.
fn block_files(dir: &Path) -> Vec<std::path::PathBuf> {
    fn walk(at: &Path, found: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(at).unwrap().map(Result::unwrap) {
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                walk(&entry.path(), found);
            } else if kind.is_file() {
                found.push(entry.path());
            }
        }
    }
    let mut found = Vec::new();
    walk(&dir.join("blocks"), &mut found);
    found.sort();
    found
}

/// Creates the files of `keys`' URIs, as the engine that wrote them would have.
fn write_files(manager: &Manager, keys: &[i64]) {
    for uri in uris(manager, keys) {
        let uri = uri.expect("written");
        let path = uri
            .strip_prefix("file://s")
            .and_then(|rest| rest.split('?').next())
            .expect("a file URI");
        let path = Path::new(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, FILE_BYTES).unwrap();
    }
}

/// What [`write_files`] puts in every file (two blocks of up to 500 bytes).
const FILE_BYTES: [u8; 1000] = [7; 1000];

/// Polls `done` until it holds (background deletion); panics naming `what` after 10 s.
fn await_that(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "not within 10 s: {what}"
        );
        std::thread::yield_now();
    }
}

/// Awaits the block files below `dir/blocks` numbering `count` (the background deletion of
/// a removed instance's blocks).
fn await_block_files(dir: &Path, count: usize) -> Vec<std::path::PathBuf> {
    await_that(&format!("{count} block files"), || {
        block_files(dir).len() == count
    });
    block_files(dir)
}

/// Awaits every removal's blocks being deleted (index entries included).
fn await_unfinished_removals(manager: &Manager) {
    await_that("removals finished", || {
        manager.prune_unfinished();
        manager.unfinished_removals().is_empty()
    });
}

/// Awaits the deleter emptying `instance`'s index.
fn await_deleted(instance: &Instance) {
    await_that("the deleter finished", || {
        instance.index.len().unwrap() == 0
    });
}

/// A manager whose instance `i` holds keys 1..=20 in files, then is removed durably and
/// "crashes" before deleting anything (its clean-up is not logged); with `snapshot`, a
/// snapshot is taken after the removal (its sequence returned).
fn removed_before_its_deletion(
    dir: &Path,
    snapshot: bool,
) -> (Arc<Manager>, Vec<std::path::PathBuf>, Option<u64>) {
    let manager = registered(dir);
    let instance = manager.instance("i").unwrap();
    let keys: Vec<i64> = (1..=20).collect();
    write(&manager, &instance, &keys);
    write_files(&manager, &keys);
    let files = block_files(dir);
    assert_eq!(files.len(), 10, "two blocks per file: {files:?}");
    let (removed, ticket) = manager.record_removal("i").unwrap();
    manager.journal_wait(ticket).unwrap();
    let sequence = snapshot.then(|| {
        let journal = files_journal(&manager);
        manager.take_snapshot(&journal).unwrap()
    });
    drop((instance, removed));
    (manager, files, sequence)
}

#[test]
fn a_removal_a_crash_left_unfinished_is_finished_at_restart() {
    for snapshot in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let (manager, files, sequence) = removed_before_its_deletion(dir.path(), snapshot);
        drop(manager);
        let (manager, report) = reopen(dir.path());
        assert!(manager.instance("i").is_none(), "still removed");
        if sequence.is_some() {
            assert_eq!(
                report.snapshot, sequence,
                "recovered from the snapshot alone"
            );
        }
        assert_eq!(report.removed_locations, 20, "{report:?}");
        assert!(report.skipped.is_empty(), "{report:?}");
        assert_eq!(files.len(), 10);
        // Every file of the removed instance is deleted, in the background.
        await_block_files(dir.path(), 0);
        assert_eq!(manager.removals_pending(), 0);
    }
}

#[test]
fn a_new_instance_of_a_removed_id_keeps_its_blocks_while_the_removal_is_finished_at_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (manager, _, _) = removed_before_its_deletion(dir.path(), false);
    // An instance of the same id writes keys whose objects the removed one also named.
    manager.register_instance(instance_info()).unwrap();
    let instance = manager.instance("i").unwrap();
    write(&manager, &instance, &[1, 2, 3, 4]);
    write_files(&manager, &[1, 2, 3, 4]);
    let before = uris(&manager, &[1, 2, 3, 4]);
    assert!(before.iter().all(Option::is_some), "{before:?}");
    // A snapshot now records the unfinished removal before the new instance.
    let journal = files_journal(&manager);
    manager.take_snapshot(&journal).unwrap();
    drop((instance, journal, manager));
    for round in 0..2 {
        let (manager, report) = reopen(dir.path());
        assert_eq!(uris(&manager, &[1, 2, 3, 4]), before, "round {round}");
        assert_eq!(uris(&manager, &[5, 20]), [None, None], "round {round}");
        let instance = manager.instance("i").unwrap();
        assert_eq!(instance.index.len().unwrap(), 4, "round {round}");
        // Only the new instance's files stay, whole.
        for file in await_block_files(dir.path(), 2) {
            assert_eq!(std::fs::read(&file).unwrap(), FILE_BYTES, "{file:?}");
        }
        await_unfinished_removals(&manager);
        assert!(report.skipped.is_empty(), "round {round}: {report:?}");
        let expected = if round == 0 { 20 } else { 0 };
        assert_eq!(
            report.removed_locations, expected,
            "round {round}: {report:?}"
        );
        // The next snapshot no longer holds the removed instance.
        let journal = files_journal(&manager);
        manager.take_snapshot(&journal).unwrap();
        drop((instance, journal, manager));
    }
}

#[test]
fn a_removal_finished_before_the_restart_is_released_again_without_harm() {
    let dir = tempfile::tempdir().unwrap();
    let manager = registered(dir.path());
    let old = manager.instance("i").unwrap();
    let keys: Vec<i64> = (1..=20).collect();
    write(&manager, &old, &keys);
    write_files(&manager, &keys);
    manager.remove_instance("i").unwrap();
    await_deleted(&old);
    assert!(block_files(dir.path()).is_empty());
    manager.register_instance(instance_info()).unwrap();
    let instance = manager.instance("i").unwrap();
    write(&manager, &instance, &[1, 2, 3, 4]);
    write_files(&manager, &[1, 2, 3, 4]);
    let before = uris(&manager, &[1, 2, 3, 4]);
    drop((old, instance, manager));
    let (manager, report) = reopen(dir.path());
    assert_eq!(uris(&manager, &[1, 2, 3, 4]), before);
    await_unfinished_removals(&manager);
    for file in await_block_files(dir.path(), 2) {
        assert_eq!(std::fs::read(&file).unwrap(), FILE_BYTES, "{file:?}");
    }
    assert!(report.skipped.is_empty(), "{report:?}");
}

#[test]
fn an_instance_whose_group_an_older_build_removed_has_its_blocks_deleted_at_restart() {
    let dir = tempfile::tempdir().unwrap();
    let manager = registered(dir.path());
    let instance = manager.instance("i").unwrap();
    write(&manager, &instance, &[1, 2, 3, 4]);
    write_files(&manager, &[1, 2, 3, 4]);
    // As an earlier build let it: the group removed while its instance stays.
    let ticket = manager
        .journal_append(&Record::GroupRemoved("g".into()))
        .unwrap();
    manager.journal_wait(ticket).unwrap();
    drop((instance, manager));
    let (manager, report) = reopen(dir.path());
    assert!(manager.instance("i").is_none());
    assert!(
        report.skipped.iter().any(|s| s.contains("instance \"i\"")),
        "{report:?}"
    );
    assert_eq!(report.removed_locations, 4, "{report:?}");
    await_block_files(dir.path(), 0);
}

#[test]
fn a_removed_instances_blocks_of_another_size_never_punch_a_later_instances_block() {
    let dir = tempfile::tempdir().unwrap();
    let manager = registered(dir.path());
    let old = manager.instance("i").unwrap();
    write(&manager, &old, &[1, 2]);
    manager.remove_instance("i").unwrap();
    await_deleted(&old);
    // The same id again, its spec twice as large: keys 1 and 2 name the same file, whose
    // block 0 now spans the bytes the removed instance's blocks 0 and 1 had.
    let mut larger = instance_info();
    larger.specs[0].size = 200;
    manager.register_instance(larger).unwrap();
    let instance = manager.instance("i").unwrap();
    write(&manager, &instance, &[1, 2]);
    write_files(&manager, &[1]);
    manager.remove_cache(&instance, &[2]).unwrap();
    await_that("the deleter removed key 2", || {
        instance.index.get(&[2]).unwrap()[0].is_none()
    });
    let uri = uris(&manager, &[1])[0].clone().expect("key 1");
    let path = uri
        .strip_prefix("file://s")
        .and_then(|r| r.split('?').next())
        .unwrap()
        .to_string();
    drop((old, instance, manager));
    // Recovery releases the removed instance's blocks 0 and 1 (100 bytes each) again: its
    // adoptions are refused (another block size), so no hole is punched in key 1's block.
    let (manager, report) = reopen(dir.path());
    assert_eq!(uris(&manager, &[1])[0].as_deref(), Some(uri.as_str()));
    let bytes = std::fs::read(&path).unwrap();
    assert!(
        bytes[..200].iter().all(|&b| b == 7),
        "key 1's block is whole"
    );
    assert_eq!(report.removed_locations, 0, "{report:?}");
    assert_eq!(report.dropped_locations, 2, "{report:?}");
}

#[test]
fn a_pool_part_freed_and_placed_again_before_a_crash_is_restored_for_its_new_block() {
    let dir = tempfile::tempdir().unwrap();
    let manager = registered(dir.path());
    let pool = kvcm_storage::StorageConfig {
        global_unique_name: "pool".into(),
        spec: kvcm_storage::StorageSpec::TairMemPool {
            domain: "pool.domain".into(),
            timeout: 100,
            enable_vipserver: false,
            service_discovery_url: String::new(),
            media_type: 0,
        },
        check_storage_available_when_open: false,
    };
    manager.add_storage(pool).unwrap();
    let handle = manager
        .storages
        .current_handle("pool")
        .expect("pool handle");
    let location = |state, nonce, granule: u32| {
        let address = kvcm_storage::PartAddress {
            object: 0,
            block: granule,
            generation: 0,
        };
        let parts = vec![crate::entry::Part { spec: 0, address }];
        crate::entry::Location {
            storage: handle,
            state,
            nonce,
            parts,
            checksums: Vec::new(),
        }
    };
    let named = |location| super::record::DurableEntry {
        entry: crate::entry::Entry::new(vec![location]),
        names: vec![super::record::ObjectName {
            storage: handle,
            object: 0,
            generation: 0,
            name: format!("{:016x}/node-a", 7),
        }],
    };
    // 32 granules each freed by a deletion whose removal record never became durable, and
    // placed again for a block whose write was acknowledged.
    let changes: Vec<_> = (0..32u32)
        .flat_map(|granule| {
            let deleted = location(crate::entry::LocationState::Deleting, 1 + granule, granule);
            let serving = location(crate::entry::LocationState::Serving, 100 + granule, granule);
            [
                (1000 + i64::from(granule), Some(named(deleted))),
                (2000 + i64::from(granule), Some(named(serving))),
            ]
        })
        .collect();
    let record = Record::Entries {
        instance_id: "i".into(),
        changes,
    };
    let ticket = manager.journal_append(&record).unwrap();
    manager.journal_wait(ticket).unwrap();
    drop(manager);
    let (manager, report) = reopen(dir.path());
    let instance = manager.instance("i").unwrap();
    let restored: Vec<bool> = (0..32)
        .map(|g| instance.index.get(&[2000 + g]).unwrap()[0].is_some())
        .collect();
    assert!(
        restored.iter().all(|r| *r),
        "every acknowledged block: {restored:?}"
    );
    assert_eq!(report.entries, 32, "{report:?}");
    assert_eq!(report.dropped_locations, 32, "the freed parts: {report:?}");
}

#[test]
fn a_storage_whose_probe_fails_at_restart_keeps_its_blocks_unhealthy() {
    let dir = tempfile::tempdir().unwrap();
    let (manager, _) = reopen(dir.path());
    let root = dir.path().join("blocks");
    std::fs::create_dir_all(&root).unwrap();
    let mut probed = storage("s", &root);
    probed.check_storage_available_when_open = true;
    manager.add_storage(probed).unwrap();
    manager.create_group(group(i64::MAX, PREFER_3FS)).unwrap();
    manager.register_instance(instance_info()).unwrap();
    let instance = manager.instance("i").unwrap();
    write(&manager, &instance, &[1, 2, 3]);
    let before = uris(&manager, &[1, 2, 3]);
    drop((instance, manager));
    // The mount is not up when the server restarts.
    std::fs::rename(&root, dir.path().join("unmounted")).unwrap();
    let (manager, report) = reopen(dir.path());
    assert!(report.skipped.is_empty(), "{report:?}");
    assert_eq!(report.entries, 3, "{report:?}");
    let health = manager.storage_health();
    let s = health
        .iter()
        .find(|h| h.name == "s")
        .expect("the storage is kept");
    assert!(!s.healthy && s.last_error.is_some(), "{health:?}");
    drop(manager);
    // Mounted again: the blocks are where they were, after another restart too.
    std::fs::rename(dir.path().join("unmounted"), &root).unwrap();
    let (manager, _) = reopen(dir.path());
    assert_eq!(uris(&manager, &[1, 2, 3]), before);
}

#[test]
fn usage_is_recomputed_from_the_recovered_index() {
    let dir = tempfile::tempdir().unwrap();
    let manager = registered(dir.path());
    let instance = manager.instance("i").unwrap();
    write(&manager, &instance, &[1, 2, 3, 4, 5]);
    manager
        .start_write(&instance, vec![6, 7], &[], 30)
        .expect("an open session");
    assert_eq!(
        instance.usage().total(),
        700,
        "WRITING blocks count while open"
    );
    drop((instance, manager));
    let (manager, _) = reopen(dir.path());
    let instance = manager.instance("i").unwrap();
    assert_eq!(
        instance.usage().total(),
        500,
        "the five SERVING blocks of 100 bytes; the open write was cleaned"
    );
}

#[test]
fn entries_over_a_lowered_key_cap_are_freed_at_restart_and_the_rest_restored() {
    let dir = tempfile::tempdir().unwrap();
    let manager = registered(dir.path());
    let instance = manager.instance("i").unwrap();
    let keys: Vec<i64> = (1..=10).collect();
    write(&manager, &instance, &keys);
    write_files(&manager, &keys);
    let mut lowered = group(i64::MAX, PREFER_3FS);
    lowered.cache.indexer.max_key_count = 4;
    lowered.version += 1;
    manager.update_group(lowered, 1).expect("lower the cap");
    drop((instance, manager));

    let (manager, report) = reopen(dir.path());
    assert_eq!(
        (report.entries, report.over_cap_entries),
        (4, 6),
        "{report:?}"
    );
    let instance = manager.instance("i").unwrap();
    assert_eq!(instance.index.len().unwrap(), 4);
    assert_eq!(instance.usage().total(), 400, "only the kept blocks count");
    let readable: Vec<String> = uris(&manager, &keys).into_iter().flatten().collect();
    assert_eq!(readable.len(), 4);
    // The files of the kept blocks stay (several blocks share a file); every other file
    // is freed, not left to no one.
    let kept: std::collections::BTreeSet<std::path::PathBuf> = readable
        .iter()
        .map(|uri| {
            let path = uri
                .strip_prefix("file://s")
                .and_then(|r| r.split('?').next());
            std::path::PathBuf::from(path.expect("a file URI"))
        })
        .collect();
    let left: std::collections::BTreeSet<std::path::PathBuf> =
        block_files(dir.path()).into_iter().collect();
    assert_eq!(left, kept);
}

#[test]
fn a_record_of_many_deletions_replays() {
    let deletions = Record::Entries {
        instance_id: "i".into(),
        changes: (0..4096).map(|key| (key, None)).collect(),
    };
    let decoded = Record::decode(&deletions.encode()).expect("decodes");
    assert_eq!(decoded, deletions);

    // End to end: the deleter's records of a large removal replay, nothing is skipped.
    let dir = tempfile::tempdir().unwrap();
    let manager = registered(dir.path());
    let instance = manager.instance("i").unwrap();
    let keys: Vec<i64> = (1..=3000).collect();
    write(&manager, &instance, &keys);
    manager.remove_cache(&instance, &keys).expect("remove");
    await_deleted(&instance);
    drop((instance, manager));
    let (manager, report) = reopen(dir.path());
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    assert_eq!(
        report.cleaned_locations, 0,
        "no deletion is done twice: {report:?}"
    );
    assert!(uris(&manager, &keys).iter().all(Option::is_none));
}

fn meta_id(manager: &Manager, instance: &Arc<Instance>, key: i64) -> String {
    let meta = manager
        .get_cache_meta(instance, &[key], &BlockMask::default())
        .expect("meta");
    format!("{:?}", meta[0])
}

/// A journal in `dir` that logged the writes of `keys` (instance `i`), its manager gone.
fn wrote_and_stopped(dir: &Path, keys: &[i64]) {
    let manager = registered(dir);
    let instance = manager.instance("i").unwrap();
    write(&manager, &instance, keys);
}

/// The newest log segment of a journal.
fn last_segment(dir: &Path) -> std::path::PathBuf {
    let listing = files::list(&dir.join("meta")).unwrap();
    listing.segments.last().expect("a segment").1.clone()
}

#[test]
fn a_torn_or_flipped_tail_is_cut_at_the_last_valid_record_and_reported() {
    for damage in ["torn", "flipped"] {
        let dir = tempfile::tempdir().unwrap();
        let manager = registered(dir.path());
        let instance = manager.instance("i").unwrap();
        write(&manager, &instance, &[1]);
        write(&manager, &instance, &[2]);
        drop((instance, manager));
        let segment = last_segment(dir.path());
        let mut bytes = std::fs::read(&segment).unwrap();
        // The records end before the zeros written ahead of them.
        let end = files::read_records(&segment, files::LOG_MAGIC, |_| {}).unwrap();
        let len = end.valid_bytes as usize;
        match damage {
            "torn" => bytes.truncate(len - 3),
            _ => bytes[len - 3] ^= 0x10,
        }
        std::fs::write(&segment, &bytes).unwrap();
        let (manager, report) = reopen(dir.path());
        assert_eq!(report.cut.len(), 1, "{damage}: {report:?}");
        let got = uris(&manager, &[1, 2]);
        assert!(
            got[0].is_some(),
            "{damage}: the write before the damage serves"
        );
        assert!(got[1].is_none(), "{damage}: the damaged commit is dropped");
        drop(manager);
        let (_, again) = reopen(dir.path());
        assert!(
            again.cut.is_empty(),
            "{damage}: the cut is durable: {again:?}"
        );
    }
}

#[test]
fn a_registry_record_refused_on_recovery_is_skipped_and_the_rest_serves() {
    let dir = tempfile::tempdir().unwrap();
    let manager = registered(dir.path());
    let instance = manager.instance("i").unwrap();
    write(&manager, &instance, &[1]);
    let mut orphan = instance_info();
    orphan.instance_id = "orphan".into();
    orphan.instance_group_name = "no-such-group".into();
    manager.journal_log(&Record::Instance(orphan)).unwrap();
    let journal = files_journal(&manager);
    let ticket = journal.writer.append(b"\xff not a record").unwrap();
    journal.wait(ticket).unwrap();
    drop((instance, journal, manager));
    let (manager, report) = reopen(dir.path());
    assert_eq!(report.skipped.len(), 2, "{report:?}");
    assert!(
        report.skipped.iter().any(|s| s.contains("orphan")),
        "{report:?}"
    );
    assert!(uris(&manager, &[1])[0].is_some());
    assert!(manager.instance("orphan").is_none());
}

#[test]
fn a_disabled_storage_stays_disabled_after_a_restart_from_the_log_and_from_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let manager = registered(dir.path());
    manager.set_storage_available("s", false).unwrap();
    drop(manager);
    let (manager, _) = reopen(dir.path());
    assert_eq!(manager.storages.disabled(), ["s"], "from the log");
    // Recovery wrote a snapshot; enabling is logged after it.
    manager.set_storage_available("s", true).unwrap();
    drop(manager);
    let (manager, report) = reopen(dir.path());
    assert!(report.snapshot.is_some(), "recovered from a snapshot");
    assert!(manager.storages.disabled().is_empty(), "enabled again");
    manager.set_storage_available("s", false).unwrap();
    let journal = files_journal(&manager);
    manager.take_snapshot(&journal).unwrap();
    drop((journal, manager));
    let (manager, _) = reopen(dir.path());
    assert_eq!(manager.storages.disabled(), ["s"], "from the snapshot");
}

#[test]
fn snapshots_replace_the_log_and_recover_the_same_state() {
    let dir = tempfile::tempdir().unwrap();
    let manager = registered(dir.path());
    let instance = manager.instance("i").unwrap();
    let keys: Vec<i64> = (1..=3000).collect();
    for chunk in keys.chunks(100) {
        write(&manager, &instance, chunk);
    }
    let journal = files_journal(&manager);
    let sequence = manager.take_snapshot(&journal).unwrap();
    write(&manager, &instance, &[5000]);
    let listing = files::list(&dir.path().join("meta")).unwrap();
    assert_eq!(listing.snapshots.len(), 1);
    assert_eq!(listing.snapshots[0].0, sequence);
    assert!(
        listing.segments.iter().all(|(s, _)| *s >= sequence),
        "{listing:?}"
    );
    let before = uris(&manager, &[1, 1500, 3000, 5000]);
    drop((instance, journal, manager));
    let (manager, report) = reopen(dir.path());
    assert_eq!(report.snapshot, Some(sequence));
    assert_eq!(report.entries, 3001);
    assert_eq!(uris(&manager, &[1, 1500, 3000, 5000]), before);
}

#[test]
fn an_incomplete_snapshot_is_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let manager = registered(dir.path());
    let instance = manager.instance("i").unwrap();
    write(&manager, &instance, &[1]);
    drop((instance, manager));
    let listing = files::list(&dir.path().join("meta")).unwrap();
    let (sequence, _) = listing.segments.last().unwrap();
    // A snapshot that claims a later sequence but has no end record (a crash while writing
    // it would have left a .tmp file; this one was renamed by hand).
    let fake = files::snapshot_path(&dir.path().join("meta"), sequence + 1);
    std::fs::write(&fake, files::header(files::SNAPSHOT_MAGIC, sequence + 1)).unwrap();
    let interrupted = fake.with_extension("snap.tmp");
    std::fs::write(&interrupted, b"half a snapshot").unwrap();
    let (manager, report) = reopen(dir.path());
    assert!(!interrupted.exists(), "an interrupted snapshot is removed");
    assert!(
        report.cut.iter().any(|c| c.contains("incomplete")),
        "{report:?}"
    );
    assert!(
        uris(&manager, &[1])[0].is_some(),
        "replayed from the older snapshot"
    );
}

#[test]
fn without_a_readable_snapshot_recovery_refuses_rather_than_replay_a_log_suffix() {
    let dir = tempfile::tempdir().unwrap();
    let first = registered(dir.path());
    let instance = first.instance("i").unwrap();
    write(&first, &instance, &[1]);
    let journal = files_journal(&first);
    first.take_snapshot(&journal).unwrap();
    write(&first, &instance, &[2]);
    drop((instance, journal, first));
    let meta = dir.path().join("meta");
    let listing = files::list(&meta).unwrap();
    assert_eq!(listing.snapshots.len(), 1, "{listing:?}");
    let snapshot = listing.snapshots[0].1.clone();
    let mut bytes = std::fs::read(&snapshot).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&snapshot, &bytes).unwrap();
    let error = manager().open_journal(config(dir.path())).unwrap_err();
    assert!(
        error.to_string().contains("no snapshot is readable"),
        "{error}"
    );
    assert!(
        snapshot.exists(),
        "the damaged snapshot is left for the operator"
    );
    assert_eq!(
        files::list(&meta).unwrap().segments,
        listing.segments,
        "nothing removed"
    );
}

#[test]
fn a_newer_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(registered(dir.path()));
    let segment = last_segment(dir.path());
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[8] = 99;
    std::fs::write(&segment, &bytes).unwrap();
    let error = manager().open_journal(config(dir.path())).unwrap_err();
    assert!(error.to_string().contains("downgrade"), "{error}");
}

#[test]
fn zeros_ending_a_segment_that_is_not_the_newest_are_damage() {
    let dir = tempfile::tempdir().unwrap();
    wrote_and_stopped(dir.path(), &[1, 2]);
    // The newest segment still ends in the zeros written ahead (no rotation cut them); a
    // later segment beside it can only mean its records were lost.
    let (sequence, _) = *files::list(&dir.path().join("meta"))
        .unwrap()
        .segments
        .last()
        .unwrap();
    let later = files::segment_path(&dir.path().join("meta"), sequence + 1);
    std::fs::write(&later, files::header(files::LOG_MAGIC, sequence + 1)).unwrap();
    let (manager, report) = reopen(dir.path());
    assert_eq!(report.cut.len(), 2, "{report:?}");
    assert!(
        report.cut[0].contains("zeros before the end of a segment that is not the last"),
        "{report:?}"
    );
    assert!(report.cut[1].contains("set aside"), "{report:?}");
    assert!(later.with_extension("log.discarded").exists());
    assert!(
        uris(&manager, &[1, 2]).iter().all(Option::is_some),
        "the records before the zeros are restored"
    );
}

#[test]
fn a_version_1_segment_without_zeros_written_ahead_is_read() {
    let dir = tempfile::tempdir().unwrap();
    wrote_and_stopped(dir.path(), &[1, 2]);
    let segment = last_segment(dir.path());
    let end = files::read_records(&segment, files::LOG_MAGIC, |_| {}).unwrap();
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes.truncate(end.valid_bytes as usize);
    bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
    std::fs::write(&segment, &bytes).unwrap();
    let (manager, report) = reopen(dir.path());
    assert!(report.cut.is_empty(), "{report:?}");
    assert!(uris(&manager, &[1, 2]).iter().all(Option::is_some));
}

#[test]
fn concurrent_writers_share_flushes_and_every_ack_follows_its_sync() {
    let dir = tempfile::tempdir().unwrap();
    let manager = registered(dir.path());
    let instance = manager.instance("i").unwrap();
    let before = manager.journal_stats().unwrap();
    std::thread::scope(|scope| {
        for writer in 0..8i64 {
            let (manager, instance) = (&manager, &instance);
            scope.spawn(move || {
                for round in 0..25 {
                    write(manager, instance, &[writer * 1000 + round]);
                }
            });
        }
    });
    let after = manager.journal_stats().unwrap();
    let records = after.appended - before.appended;
    let flushes = after.flushes - before.flushes;
    assert!(records >= 400, "start + finish per write: {records}");
    assert!(
        flushes < records,
        "group commit: {flushes} flushes for {records} records"
    );
    assert_eq!(after.durable, after.appended);
}

#[test]
fn the_deleter_waits_for_the_journal_once_per_pass() {
    let dir = tempfile::tempdir().unwrap();
    let manager = registered(dir.path());
    let instance = manager.instance("i").unwrap();
    let keys: Vec<i64> = (0..4096).collect();
    write(&manager, &instance, &keys);
    let batches = crate::deleter::background_batches(&instance, keys.clone()).len();
    assert!(
        batches >= 64,
        "the keys span many lock groups: {batches} batches"
    );
    let before = manager.journal_stats().unwrap();
    manager.remove_cache(&instance, &keys).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let done = || {
        let stats = manager.journal_stats().unwrap();
        instance.index.is_empty().unwrap() && stats.acknowledged == stats.appended
    };
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "the deleter removes every key and is acknowledged"
        );
        std::thread::yield_now();
    }
    let after = manager.journal_stats().unwrap();
    let records = after.appended - before.appended;
    let waits = after.waits - before.waits;
    assert!(
        records >= batches as u64,
        "a record per batch: {records} for {batches}"
    );
    assert_eq!(
        waits, 2,
        "RemoveCache waits once, and the deleter once for {records} records"
    );
    assert_eq!(after.synced, after.appended);
}

#[test]
fn an_eviction_pass_waits_for_the_journal_once() {
    let dir = tempfile::tempdir().unwrap();
    let manager = registered(dir.path());
    let instance = manager.instance("i").unwrap();
    let keys: Vec<i64> = (0..4096).collect();
    write(&manager, &instance, &keys);
    let batches = crate::deleter::background_batches(&instance, keys.clone());
    assert!(batches.len() >= 64, "{} batches", batches.len());
    let before = manager.journal_stats().unwrap();
    let (moved, result) = manager.move_locations_in_batches(
        &instance,
        &batches,
        crate::entry::LocationState::Deleting,
        &mut |_, _| true,
    );
    result.unwrap();
    assert_eq!(moved.len(), keys.len(), "every location moved");
    let after = manager.journal_stats().unwrap();
    let records = after.appended - before.appended;
    assert!(
        records >= batches.len() as u64,
        "a record per batch: {records} for {}",
        batches.len()
    );
    assert_eq!(
        after.waits - before.waits,
        1,
        "one wait for {records} records"
    );
    assert_eq!(after.durable, after.appended, "durable when it returns");
}

#[test]
fn fsync_policies_parse() {
    assert_eq!("always".parse(), Ok(FsyncPolicy::Always));
    assert_eq!("never".parse(), Ok(FsyncPolicy::Never));
    assert_eq!(
        "10ms".parse(),
        Ok(FsyncPolicy::Every(std::time::Duration::from_millis(10)))
    );
    for bad in ["", "0ms", "10", "sometimes", "-5ms"] {
        assert!(bad.parse::<FsyncPolicy>().is_err(), "{bad:?}");
    }
}

#[test]
fn an_interval_policy_journal_recovers_too() {
    let dir = tempfile::tempdir().unwrap();
    let interval = JournalConfig {
        fsync: FsyncPolicy::Every(std::time::Duration::from_millis(5)),
        ..config(dir.path())
    };
    let (manager, _) = reopen_with(interval.clone());
    std::fs::create_dir_all(dir.path().join("blocks")).unwrap();
    manager
        .add_storage(storage("s", &dir.path().join("blocks")))
        .unwrap();
    manager.create_group(group(i64::MAX, PREFER_3FS)).unwrap();
    manager.register_instance(instance_info()).unwrap();
    let instance = manager.instance("i").unwrap();
    write(&manager, &instance, &[1, 2]);
    drop((instance, manager));
    let (manager, _) = reopen_with(interval);
    assert!(uris(&manager, &[1, 2]).iter().all(Option::is_some));
}

#[test]
fn a_full_disk_refuses_writes_with_a_clear_error_and_reads_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let manager = registered(dir.path());
    let instance = manager.instance("i").unwrap();
    write(&manager, &instance, &[1]);
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    files_journal(&manager).writer.replace_file(full);
    let refused = manager
        .start_write(&instance, vec![2], &[], 30)
        .unwrap_err();
    assert!(
        refused.to_string().contains("writes are refused"),
        "{refused}"
    );
    let again = manager
        .start_write(&instance, vec![3], &[], 30)
        .unwrap_err();
    assert!(again.to_string().contains("No space left"), "{again}");
    assert!(uris(&manager, &[1])[0].is_some(), "reads are served");
    // A storage whose record cannot be logged is not added: no write could be placed on it
    // before its record.
    let other = storage("t", &dir.path().join("blocks"));
    assert!(manager.add_storage(other).is_err());
    let names: Vec<String> = manager
        .list_storages()
        .into_iter()
        .map(|c| c.global_unique_name)
        .collect();
    assert_eq!(names, ["s"], "the unlogged storage is not registered");
    let stats = manager.journal_stats().unwrap();
    assert!(stats.failure.is_some(), "{stats:?}");
    drop((instance, manager));
    let (manager, _) = reopen(dir.path());
    assert!(uris(&manager, &[1])[0].is_some());
    assert_eq!(
        uris(&manager, &[2, 3]),
        [None, None],
        "nothing refused came back"
    );
}

#[test]
fn blocks_of_a_moved_storage_are_reported_stale_and_their_bytes_left() {
    let dir = tempfile::tempdir().unwrap();
    let manager = registered(dir.path());
    let instance = manager.instance("i").unwrap();
    write(&manager, &instance, &[1, 2]);
    let old_uri = uris(&manager, &[1])[0].clone().unwrap();
    let old_file = old_uri
        .strip_prefix("file://s")
        .unwrap()
        .split('?')
        .next()
        .unwrap()
        .to_string();
    std::fs::write(&old_file, b"bytes").unwrap();
    std::fs::create_dir_all(dir.path().join("moved")).unwrap();
    manager
        .update_storage(storage("s", &dir.path().join("moved")))
        .unwrap();
    write(&manager, &instance, &[3]);
    drop((instance, manager));
    let (manager, report) = reopen(dir.path());
    assert_eq!(report.stale_locations, 2, "{report:?}");
    let now = uris(&manager, &[1, 2, 3]);
    assert_eq!(
        now[..2],
        [None, None],
        "the old root's blocks are not served"
    );
    assert!(
        now[2].as_deref().is_some_and(|u| u.contains("/moved/")),
        "{now:?}"
    );
    assert_eq!(
        std::fs::read(&old_file).unwrap(),
        b"bytes",
        "left where they are"
    );
    drop(manager);
    let (_, again) = reopen(dir.path());
    assert_eq!(
        again.stale_locations, 0,
        "reported once: the snapshot no longer holds them"
    );
}

#[test]
fn api_keys_survive_a_restart_and_revocations_and_deletions_do_too() {
    let dir = tempfile::tempdir().unwrap();
    let (manager, _) = reopen(dir.path());
    let account = |user_name: &str, role| crate::Account {
        user_name: user_name.into(),
        password: crate::password::StoredPassword::Clear("p".into()),
        role,
    };
    manager
        .add_account(account("eng", crate::AccountRole::User))
        .unwrap();
    manager
        .add_account(account("ops", crate::AccountRole::Operator))
        .unwrap();
    let new_key = |user_name: &str, instances: &[&str]| crate::NewApiKey {
        user_name: user_name.into(),
        instances: instances.iter().map(|i| i.to_string()).collect(),
        expires_ms: 0,
    };
    let (kept, kept_text) = manager.create_api_key(new_key("eng", &["i"])).unwrap();
    let (revoked, revoked_text) = manager.create_api_key(new_key("eng", &["i"])).unwrap();
    let (_, ops_text) = manager.create_api_key(new_key("ops", &[])).unwrap();
    assert!(
        manager.create_api_key(new_key("eng", &[])).is_err(),
        "user keys name instances"
    );
    assert!(manager.create_api_key(new_key("nobody", &["i"])).is_err());
    manager.revoke_api_key(&revoked.id).unwrap();
    assert_eq!(
        manager.verify_api_key(revoked_text.as_bytes()),
        Err(crate::KeyRefusal::Unknown),
        "revoked at once"
    );
    manager.delete_account("ops").unwrap();
    assert_eq!(
        manager.verify_api_key(ops_text.as_bytes()),
        Err(crate::KeyRefusal::Unknown),
        "deleting an account revokes its keys"
    );
    drop(manager);

    let (manager, report) = reopen(dir.path());
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    let grant = manager
        .verify_api_key(kept_text.as_bytes())
        .expect("kept key");
    assert_eq!(grant.key_id, kept.id);
    assert_eq!(
        (grant.role, grant.instances),
        (crate::AccountRole::User, vec!["i".to_string()])
    );
    let ids: Vec<String> = manager.list_api_keys().into_iter().map(|k| k.id).collect();
    assert_eq!(ids, vec![kept.id.clone()]);
    for gone in [&revoked_text, &ops_text] {
        assert_eq!(
            manager.verify_api_key(gone.as_bytes()),
            Err(crate::KeyRefusal::Unknown)
        );
    }
    let mut wrong_secret = kept_text.clone();
    let last = wrong_secret.pop().unwrap();
    wrong_secret.push(if last == '0' { '1' } else { '0' });
    assert_eq!(
        manager.verify_api_key(wrong_secret.as_bytes()),
        Err(crate::KeyRefusal::Unknown)
    );
    // Nothing of the secret is kept at rest.
    let secret = kept_text.rsplit('_').next().unwrap();
    for file in std::fs::read_dir(dir.path().join("meta")).unwrap() {
        let bytes = std::fs::read(file.unwrap().path()).unwrap();
        let found = bytes.windows(secret.len()).any(|w| w == secret.as_bytes());
        assert!(!found, "a secret was written to the journal");
    }
}

/// The password [`log_as_an_older_build`] records in clear.
pub(super) const LEGACY_SECRET: &[u8] = b"legacy-secret";

/// Records account `old` as a build before password hashing did: with its password in
/// clear, as is (not through `add_account`, which hashes).
pub(super) fn log_as_an_older_build(manager: &Manager) {
    let older = crate::Account {
        user_name: "old".into(),
        password: crate::password::StoredPassword::Clear("legacy-secret".into()),
        role: crate::AccountRole::User,
    };
    manager.journal_log(&Record::Account(older)).unwrap();
}

/// Whether `bytes` hold `needle`.
pub(super) fn holds(bytes: &[u8], needle: &[u8]) -> bool {
    bytes.windows(needle.len()).any(|w| w == needle)
}

/// An account an older build journaled with its password in clear is replayed with the
/// password hashed, and the next journal (a restart's snapshot and log) no longer holds it.
#[test]
fn a_clear_password_from_an_older_build_is_hashed_on_replay() {
    let dir = tempfile::tempdir().unwrap();
    let (manager, _) = reopen(dir.path());
    log_as_an_older_build(&manager);
    let holds_clear = |dir: &Path| {
        let files = std::fs::read_dir(dir.join("meta")).unwrap().flatten();
        files
            .map(|file| std::fs::read(file.path()).unwrap_or_default())
            .any(|bytes| holds(&bytes, LEGACY_SECRET))
    };
    assert!(holds_clear(dir.path()), "the older record, as written");
    drop(manager);

    let (manager, _) = reopen(dir.path());
    let accounts = crate::sync::lock(&manager.accounts);
    let crate::password::StoredPassword::Hash(hash) = &accounts["old"].password else {
        panic!("replayed in clear");
    };
    assert!(hash.matches("legacy-secret"));
    drop(accounts);
    drop(manager);
    assert!(
        !holds_clear(dir.path()),
        "recovery's snapshot replaced the older log"
    );
}

#[test]
fn an_expired_key_is_refused() {
    let manager = manager();
    manager
        .add_account(crate::Account {
            user_name: "eng".into(),
            password: crate::password::StoredPassword::Clear("p".into()),
            role: crate::AccountRole::User,
        })
        .unwrap();
    let now = crate::leader::now_ms();
    let request = crate::NewApiKey {
        user_name: "eng".into(),
        instances: vec!["i".into()],
        expires_ms: now + 50,
    };
    let (_, text) = manager.create_api_key(request).unwrap();
    assert!(manager.verify_api_key(text.as_bytes()).is_ok());
    while crate::leader::now_ms() <= now + 50 {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(
        manager.verify_api_key(text.as_bytes()),
        Err(crate::KeyRefusal::Expired)
    );
}

/// The manager's local journal (the tests here open one).
fn files_journal(manager: &Manager) -> Arc<Journal> {
    match manager.journal.get() {
        Some(Durable::Files(journal)) => journal.clone(),
        other => panic!("expected a local journal, found {other:?}"),
    }
}
