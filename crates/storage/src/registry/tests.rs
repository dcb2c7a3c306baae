//! Registry operations and health probing on real directories.

use std::path::Path;
use std::time::{Duration, Instant};

use super::*;
use crate::StorageSpec;

fn nfs_config(name: &str, root: &Path) -> StorageConfig {
    StorageConfig {
        global_unique_name: name.to_string(),
        spec: StorageSpec::Nfs {
            root_path: format!("{}/", root.display()),
            key_count_per_file: 4,
        },
        check_storage_available_when_open: false,
    }
}

/// Polls `condition` until it holds, failing after 20 s.
fn wait_until(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn add_get_list_enable_disable_remove() {
    let root = tempfile::tempdir().expect("tempdir");
    let registry = StorageRegistry::new();
    registry.add(nfs_config("b", root.path())).expect("add b");
    registry.add(nfs_config("a", root.path())).expect("add a");
    let duplicate = registry.add(nfs_config("a", root.path()));
    assert!(matches!(duplicate, Err(StorageError::DuplicateStorage(ref n)) if n == "a"));
    let names: Vec<String> = registry
        .list()
        .iter()
        .map(|status| status.storage.config().global_unique_name.clone())
        .collect();
    assert_eq!(names, ["a", "b"]);
    assert!(
        registry.is_available("a"),
        "new storages are available at once"
    );

    registry.disable("a").expect("disable");
    assert!(!registry.is_available("a"));
    assert!(
        registry.get("a").is_some(),
        "disabled storages stay registered"
    );
    registry.enable("a").expect("enable");
    assert!(registry.is_available("a"));

    registry.remove("a").expect("remove");
    assert!(registry.get("a").is_none() && !registry.is_available("a"));
    for result in [
        registry.remove("a").map(drop),
        registry.enable("x"),
        registry.disable("x"),
    ] {
        assert!(
            matches!(result, Err(StorageError::UnknownStorage(_))),
            "{result:?}"
        );
    }
}

#[test]
fn a_bad_config_is_refused_and_nothing_is_registered() {
    let registry = StorageRegistry::new();
    let mut bad = nfs_config("n", Path::new("/tmp"));
    bad.spec = StorageSpec::Nfs {
        root_path: "relative/".to_string(),
        key_count_per_file: 1,
    };
    assert!(matches!(
        registry.add(bad),
        Err(StorageError::InvalidConfig(_))
    ));
    assert!(registry.list().is_empty());
}

#[test]
fn probes_follow_the_directory_and_respect_disable() {
    let parent = tempfile::tempdir().expect("tempdir");
    let root = parent.path().join("store");
    std::fs::create_dir(&root).expect("mkdir");
    let registry = StorageRegistry::with_health_probes(Duration::from_millis(10)).expect("start");
    registry.add(nfs_config("n", &root)).expect("add");

    std::fs::remove_dir(&root).expect("rmdir");
    wait_until("the probe marks the storage unavailable", || {
        !registry.is_available("n")
    });
    let status = &registry.list()[0];
    assert!(status.enabled && !status.healthy);
    assert!(
        status
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("store")),
        "{status:?}"
    );

    std::fs::create_dir(&root).expect("mkdir again");
    wait_until("the probe marks the storage available again", || {
        registry.is_available("n")
    });
    assert_eq!(registry.list()[0].last_error, None);

    registry.disable("n").expect("disable");
    registry.probe_now();
    assert!(
        !registry.is_available("n"),
        "a healthy disabled storage is not available"
    );
}

#[test]
fn manual_probe_without_a_thread() {
    let parent = tempfile::tempdir().expect("tempdir");
    let root = parent.path().join("store");
    let registry = StorageRegistry::new();
    registry
        .add(nfs_config("n", &root))
        .expect("add without probing at open");
    assert!(registry.is_available("n"));
    registry.probe_now();
    assert!(!registry.is_available("n"), "the directory does not exist");
}

#[test]
fn the_listener_hears_each_flip_once() {
    let parent = tempfile::tempdir().expect("tempdir");
    let root = parent.path().join("store");
    let registry = StorageRegistry::new();
    let heard: Arc<Mutex<Vec<(String, bool)>>> = Arc::default();
    let log = heard.clone();
    registry.set_health_listener(Box::new(move |name, health| {
        if let Err(error) = health {
            assert!(error.contains("store"), "the error names the root: {error}");
        }
        log.lock().unwrap().push((name.to_string(), health.is_ok()));
    }));
    registry.add(nfs_config("n", &root)).expect("add");
    registry.probe_now();
    registry.probe("n");
    std::fs::create_dir_all(&root).expect("mkdir");
    registry.probe("n");
    registry.probe_now();
    let flips = heard.lock().unwrap().clone();
    assert_eq!(flips, [("n".to_string(), false), ("n".to_string(), true)]);
}

#[test]
fn stopping_or_dropping_joins_the_probe_thread() {
    let registry = StorageRegistry::with_health_probes(Duration::from_secs(3600)).expect("start");
    let entries = Arc::downgrade(&registry.entries);
    registry.stop_health_probes();
    registry.stop_health_probes();
    assert_eq!(
        entries.strong_count(),
        1,
        "the stopped thread released the registry"
    );

    let registry = StorageRegistry::with_health_probes(Duration::from_secs(3600)).expect("start");
    let entries = Arc::downgrade(&registry.entries);
    drop(registry);
    assert!(
        entries.upgrade().is_none(),
        "drop joined the thread, which held the last reference"
    );
}
