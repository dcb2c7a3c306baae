//! The shared store on a private `redis-server`: a new leader serves what the old one
//! acknowledged, cleans up its open sessions, and fences it out; damaged values are reported
//! and skipped.

use std::path::Path;
use std::sync::Arc;

use crate::tests::redis_support::{raw_command, redis_available, RedisCluster, RedisServer};
use kvcm_index::redis::resp::Reply;
use kvcm_index::{IndexError, MetaIndex};

use super::SharedStore;
use crate::error::ManagerError;
use crate::journal::tests::{holds, log_as_an_older_build, uris, write, LEGACY_SECRET};
use crate::journal::JournalError;
use crate::tests::{group, instance_info, storage, test_deps, PREFER_3FS};
use crate::Manager;

/// A manager leading on the store at `uri` with fencing token `token`.
fn leader(uri: &str, token: u64) -> (Arc<Manager>, Arc<SharedStore>, super::RecoveryReport) {
    let manager = Manager::new(test_deps()).expect("manager");
    let store = manager.connect_shared_store(uri).expect("connect");
    let report = manager.promote_shared(&store, token).expect("promote");
    (manager, store, report)
}

/// A private redis-server in a temporary directory, and `<dir>/blocks` (created) for the
/// file storage.
fn on_redis() -> (tempfile::TempDir, RedisServer, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start(dir.path());
    let root = dir.path().join("blocks");
    std::fs::create_dir_all(&root).unwrap();
    (dir, redis, root)
}

/// Storage `s` under `root`, group `g`, instance `i`, registered through `manager`.
fn register(manager: &Manager, root: &Path) {
    manager.add_storage(storage("s", root)).unwrap();
    manager.create_group(group(i64::MAX, PREFER_3FS)).unwrap();
    manager.register_instance(instance_info()).unwrap();
}

/// Waits up to 10 s for `done`; fails the test after.
fn wait_for(mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "not within 10 s");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

fn is_fenced(error: &ManagerError) -> bool {
    matches!(
        error,
        ManagerError::Journal(JournalError::Fenced { .. })
            | ManagerError::Index(IndexError::Fenced { .. })
    )
}

#[test]
fn a_new_leader_serves_what_the_old_one_acknowledged_and_fences_it_out() {
    if !redis_available("a_new_leader_serves_what_the_old_one_acknowledged") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start(dir.path());
    take_over_and_fence(&redis.uri(), &dir.path().join("blocks"));
}

#[test]
fn on_a_redis_cluster_a_new_leader_serves_what_the_old_one_acknowledged() {
    if !redis_available("on_a_redis_cluster_a_new_leader_serves") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cluster = RedisCluster::start(dir.path());
    take_over_and_fence(&cluster.uri(), &dir.path().join("blocks"));
}

/// Two leaders one after the other on the store at `uri`, blocks under `root`.
fn take_over_and_fence(uri: &str, root: &Path) {
    std::fs::create_dir_all(root).unwrap();
    let (old, _, report) = leader(uri, 1);
    assert_eq!(report.records, 0, "an empty store");
    register(&old, root);
    let instance = old.instance("i").unwrap();
    write(&old, &instance, &[1, 2, 3]);
    old.remove_cache(&instance, &[2]).unwrap();
    // The deleter drops the removed entry in the background; it is gone before the takeover
    // (so the one cleaned location below is the open session's).
    wait_for(|| instance.index.get(&[2]).unwrap()[0].is_none());
    let open = old.start_write(&instance, vec![4], &[], 30).unwrap();
    assert_eq!(open.locations.len(), 1, "key 4 is being written");
    let served = uris(&old, &[1, 2, 3, 4]);
    assert!(served[0].is_some() && served[2].is_some(), "{served:?}");
    assert_eq!(served[1], None, "removed");

    let (new, store, report) = leader(uri, 2);
    assert_eq!(report.registry_objects, 3, "{report:?}");
    assert_eq!(report.entries, 2, "{report:?}");
    assert_eq!(
        report.cleaned_locations, 1,
        "the open session's block: {report:?}"
    );
    assert!(report.skipped.is_empty(), "{report:?}");
    assert_eq!(
        uris(&new, &[1, 2, 3, 4]),
        [served[0].clone(), None, served[2].clone(), None]
    );
    let entries = store.entries("i").unwrap();
    assert_eq!(
        entries.len().unwrap(),
        2,
        "the WRITING entry was written back as removed"
    );

    let refused = old.finish_write(
        &instance,
        &open.session_id,
        &crate::mask::BlockMask::Offset(1),
    );
    assert!(refused.as_ref().is_err_and(is_fenced), "{refused:?}");
    let refused = old.start_write(&instance, vec![5], &[], 30).unwrap_err();
    assert!(is_fenced(&refused), "{refused:?}");
    let mut other = instance_info();
    other.instance_id = "j".into();
    let refused = old.register_instance(other).unwrap_err();
    assert!(is_fenced(&refused), "{refused:?}");
    let refused = old.remove_cache(&instance, &[1]).unwrap_err();
    assert!(is_fenced(&refused), "{refused:?}");

    let (third, _, report) = leader(uri, 3);
    assert_eq!(
        report.entries, 2,
        "nothing the fenced leader sent landed: {report:?}"
    );
    assert_eq!(report.registry_objects, 3, "{report:?}");
    assert_eq!(
        uris(&third, &[1, 3]),
        [served[0].clone(), served[2].clone()]
    );
}

#[test]
fn damaged_values_are_reported_and_skipped_and_the_rest_is_served() {
    if !redis_available("damaged_values_are_reported_and_skipped") {
        return;
    }
    let (_dir, redis, root) = on_redis();
    let (old, store, _) = leader(&redis.uri(), 1);
    register(&old, &root);
    let instance = old.instance("i").unwrap();
    write(&old, &instance, &[1, 2]);
    let served = uris(&old, &[1, 2]);
    let [values, _] = store.entries("i").unwrap().redis_keys().map(str::to_string);
    // The index's field of a key: its bits with the sign flipped, big-endian.
    let field_of_2 = (2u64 ^ (1 << 63)).to_be_bytes();
    let hset = |args: &[&[u8]]| raw_command(&redis.address(), args).unwrap();
    let set = hset(&[b"HSET", values.as_bytes(), &field_of_2, b"\x07junk"]);
    assert_eq!(set, Reply::Int(0), "overwrote key 2's value");
    let set = hset(&[b"HSET", b"kvcm:{kvcm-registry}:groups", b"bad", b"\x01junk"]);
    assert_eq!(set, Reply::Int(1));

    let (new, _, report) = leader(&redis.uri(), 2);
    assert_eq!(report.entries, 1, "{report:?}");
    assert_eq!(report.skipped.len(), 2, "{report:?}");
    assert!(
        report.skipped.iter().any(|s| s.contains("entry 2")),
        "{report:?}"
    );
    assert!(
        report.skipped.iter().any(|s| s.contains("\"bad\"")),
        "{report:?}"
    );
    assert_eq!(uris(&new, &[1, 2]), [served[0].clone(), None]);
}

#[test]
fn a_node_that_never_led_writes_nothing() {
    if !redis_available("a_node_that_never_led_writes_nothing") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start(dir.path());
    let manager = Manager::new(test_deps()).expect("manager");
    let store = manager.connect_shared_store(&redis.uri()).expect("connect");
    let refused = store.append(&crate::journal::Record::GroupRemoved("g".into()));
    assert!(
        matches!(refused, Err(JournalError::Fenced { token: 0 })),
        "{refused:?}"
    );
    let bad = manager
        .connect_shared_store("redis://127.0.0.1:1")
        .unwrap_err();
    assert!(
        bad.to_string().contains("shared store redis://127.0.0.1:1"),
        "{bad}"
    );
}

#[test]
fn a_removed_instance_leaves_nothing_a_new_one_of_its_id_would_find() {
    if !redis_available("a_removed_instance_leaves_nothing") {
        return;
    }
    let (_dir, redis, root) = on_redis();
    let (old, store, _) = leader(&redis.uri(), 1);
    register(&old, &root);
    let instance = old.instance("i").unwrap();
    write(&old, &instance, &[1, 2, 3]);
    old.remove_instance("i").unwrap();
    old.register_instance(instance_info()).unwrap();
    // The removed instance's clean-up (its deleter) runs on; none of it may reach the store.
    wait_for(|| instance.index.len().unwrap() == 0);
    assert_eq!(store.entries("i").unwrap().len().unwrap(), 0);
    let (new, _, report) = leader(&redis.uri(), 2);
    assert_eq!(report.entries, 0, "{report:?}");
    assert_eq!(uris(&new, &[1, 2, 3]), [None, None, None]);
}

#[test]
fn a_restarted_redis_fails_writes_meanwhile_and_serves_again_without_a_new_manager() {
    if !redis_available("a_restarted_redis_fails_writes_meanwhile") {
        return;
    }
    let (_dir, mut redis, root) = on_redis();
    let (manager, _, _) = leader(&redis.uri(), 1);
    register(&manager, &root);
    let instance = manager.instance("i").unwrap();
    write(&manager, &instance, &[1]);
    redis.kill();
    let refused = manager
        .start_write(&instance, vec![2], &[], 30)
        .unwrap_err();
    assert!(refused.to_string().contains("shared store"), "{refused}");
    assert_eq!(
        uris(&manager, &[2]),
        [None],
        "a refused write changed nothing"
    );
    redis.restart();
    write(&manager, &instance, &[3]);
    let (next, _, report) = leader(&redis.uri(), 2);
    assert_eq!(
        report.entries, 2,
        "keys 1 and 3 survived the Redis restart: {report:?}"
    );
    assert_eq!(uris(&next, &[1, 2, 3])[1], None);
}

#[test]
fn entries_of_a_storage_whose_spec_changed_are_stale_and_other_updates_keep_them() {
    if !redis_available("entries_of_a_storage_whose_spec_changed_are_stale") {
        return;
    }
    let (dir, redis, root) = on_redis();
    let moved = dir.path().join("moved");
    std::fs::create_dir_all(&moved).unwrap();
    let (first, _, _) = leader(&redis.uri(), 1);
    register(&first, &root);
    let instance = first.instance("i").unwrap();
    write(&first, &instance, &[1, 2]);
    let mut same_spec = storage("s", &root);
    same_spec.check_storage_available_when_open = true;
    first.update_storage(same_spec).unwrap();
    write(&first, &instance, &[3]);

    let (second, _, report) = leader(&redis.uri(), 2);
    assert_eq!(
        report.entries, 3,
        "an update that kept the spec kept them: {report:?}"
    );
    assert_eq!(report.stale_locations, 0, "{report:?}");
    second.update_storage(storage("s", &moved)).unwrap();
    let instance = second.instance("i").unwrap();
    write(&second, &instance, &[4]);

    let (third, _, report) = leader(&redis.uri(), 3);
    assert_eq!(
        report.stale_locations, 3,
        "keys 1-3 were written under the old root: {report:?}"
    );
    assert_eq!(report.entries, 1, "{report:?}");
    let served = uris(&third, &[1, 4]);
    assert_eq!(served[0], None);
    assert!(
        served[1]
            .as_deref()
            .is_some_and(|uri| uri.contains("moved")),
        "{served:?}"
    );
}

/// An account an older build stored with its password in clear: the next leader restores
/// it hashed and writes the hash back, so the store no longer holds the password.
#[test]
fn a_clear_password_an_older_build_stored_is_replaced_by_its_hash_at_promotion() {
    if !redis_available("a_clear_password_an_older_build_stored") {
        return;
    }
    let (_dir, redis, _root) = on_redis();
    let (old, _, _) = leader(&redis.uri(), 1);
    log_as_an_older_build(&old);
    let stored = || {
        let accounts = b"kvcm:{kvcm-registry}:accounts";
        match raw_command(&redis.address(), &[b"HGET", accounts, b"old"]).unwrap() {
            Reply::Bulk(Some(bytes)) => bytes,
            other => panic!("{other:?}"),
        }
    };
    assert!(
        holds(&stored(), LEGACY_SECRET),
        "the older record, as written"
    );

    let (new, _, report) = leader(&redis.uri(), 2);
    assert!(report.skipped.is_empty(), "{report:?}");
    let crate::password::StoredPassword::Hash(hash) =
        &crate::sync::lock(&new.accounts)["old"].password
    else {
        panic!("restored in clear");
    };
    assert!(hash.matches("legacy-secret"));
    let rewritten = stored();
    assert!(
        !holds(&rewritten, LEGACY_SECRET),
        "the store keeps the hash only"
    );
    assert!(holds(&rewritten, b"pbkdf2-sha256$"));
}
