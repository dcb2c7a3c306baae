//! Storage health failover against a real `kvcm serve` (issue 11, item 3): one of two file
//! storages made unwritable for root by a read-only bind mount is marked down by the
//! background probes, its blocks read as misses, new writes go to the other storage, and
//! once the mount is gone it serves again with the same URIs — on the server and on the fast
//! lookup path alike; and a storage whose mount goes away is marked down and frees nothing
//! until it is back. Needs `mount` (root, as CI runs); without it the tests say so loudly
//! and fail nothing they did not check.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{code, nfs_group, nfs_storage, uris, wait_until, TestServer};
use kvcm_client::{Client, ClientConfig, ServerAddress, Wire};
use serde_json::json;

const PROBE_MS: u64 = 100;

/// A bind mount, undone on drop.
struct Mount(PathBuf);

impl Mount {
    /// `source` bound over `target`.
    fn bind(source: &Path, target: &Path) -> Result<Mount, String> {
        let (source, target) = (utf8(source), utf8(target));
        run_mount(&["--bind", source, target])?;
        Ok(Mount(PathBuf::from(target)))
    }

    /// `dir` bound over itself, read-only.
    fn read_only(dir: &Path) -> Result<Mount, String> {
        let mounted = Mount::bind(dir, dir)?;
        run_mount(&["-o", "remount,bind,ro", utf8(dir)])?;
        Ok(mounted)
    }
}

fn utf8(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

fn run_mount(args: &[&str]) -> Result<(), String> {
    let output = Command::new("mount").args(args).output();
    match output {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
        Err(error) => Err(error.to_string()),
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        // Lazily: a probe file open at this instant must not keep the mount (EBUSY).
        let output = Command::new("umount").arg("-l").arg(&self.0).output();
        if !output.as_ref().is_ok_and(|out| out.status.success()) {
            eprintln!("umount {}: {output:?}", self.0.display());
        }
    }
}

/// The `kvcm_storage_healthy` gauge of `storage` in `GET /metrics`.
async fn healthy(server: &TestServer, storage: &str) -> Option<bool> {
    let (status, body) =
        common::http_request(server.address("admin_http"), "GET", "/metrics", b"").await;
    assert_eq!(status, 200);
    let text = String::from_utf8(body).expect("utf-8");
    let series = format!("kvcm_storage_healthy{{storage=\"{storage}\"}} ");
    let line = text.lines().find(|line| line.starts_with(&series))?;
    Some(line.ends_with(" 1"))
}

/// Awaits the probes' verdict on `storage`; how long it took.
async fn await_health(server: &TestServer, storage: &str, want: bool) -> Duration {
    let begun = Instant::now();
    let seen = wait_until(Duration::from_secs(10), async || {
        (healthy(server, storage).await == Some(want)).then_some(())
    })
    .await;
    assert!(seen.is_some(), "{storage} never became healthy={want}");
    begun.elapsed()
}

/// Batch-get URIs of `keys` (empty for a miss).
async fn batch_uris(server: &TestServer, keys: &[i64]) -> Vec<String> {
    let answer = server
        .meta_http(
            "getCacheLocation",
            json!({"instance_id": "inst", "query_type": "QT_BATCH_GET", "block_keys": keys}),
        )
        .await;
    assert_eq!(code(&answer), "OK", "{answer}");
    uris(&answer["locations"])
}

/// A soft-shm fast-path client of `inst` (connected off the async runtime).
async fn fast_client(server: &TestServer) -> Arc<Client> {
    let config = ClientConfig {
        servers: vec![ServerAddress {
            grpc: format!("http://{}", server.address("grpc")),
            http: server.address("http"),
        }],
        instance_id: "inst".into(),
        wire: Some(Wire::Shm),
        api_key: None,
        tls: None,
    };
    let client = tokio::task::spawn_blocking(move || Client::connect(config).expect("client"))
        .await
        .expect("connect");
    assert!(client.fast_path_up(), "the fast path connected");
    Arc::new(client)
}

/// The fast path's batch-get URIs of `keys` (empty for a miss).
async fn fast_uris(client: &Arc<Client>, keys: &[i64]) -> Vec<String> {
    let (client, keys) = (client.clone(), keys.to_vec());
    tokio::task::spawn_blocking(move || {
        let answer = client.batch_get(&keys).expect("fast path");
        let first =
            |l: &kvcm::proto::meta::CacheLocation| l.location_specs.first().map(|s| s.uri.clone());
        answer
            .iter()
            .map(|l| first(l).unwrap_or_default())
            .collect()
    })
    .await
    .expect("lookup")
}

/// Awaits the fast path answering `keys` as the server does; how long that took.
async fn await_fast_path(server: &TestServer, client: &Arc<Client>, keys: &[i64]) -> Duration {
    let begun = Instant::now();
    let agreed = wait_until(Duration::from_secs(5), async || {
        let slow = batch_uris(server, keys).await;
        (fast_uris(client, keys).await == slow).then_some(())
    })
    .await;
    assert!(
        agreed.is_some(),
        "the fast path never agreed with the server"
    );
    begun.elapsed()
}

/// Adds file storages `storages` (name, root), a group `g` over them, and registers `inst`
/// in it.
async fn register_on(server: &TestServer, storages: &[(&str, &Path)]) {
    for (name, root) in storages {
        let added = server
            .admin_http("addStorage", json!({"storage": nfs_storage(name, root)}))
            .await;
        assert_eq!(code(&added), "OK", "{added}");
    }
    let names: Vec<&str> = storages.iter().map(|(name, _)| *name).collect();
    let created = server
        .admin_http(
            "createInstanceGroup",
            json!({"instance_group": nfs_group("g", &names)}),
        )
        .await;
    assert_eq!(code(&created), "OK", "{created}");
    let mut registration = common::registration("inst", 16);
    registration["instance_group"] = json!("g");
    let registered = server.meta_http("registerInstance", registration).await;
    assert_eq!(code(&registered), "OK", "{registered}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unwritable_storage_fails_over_and_comes_back() {
    let server =
        TestServer::start_with(&[&format!("kvcm.storage.probe_interval_ms={PROBE_MS}")]).await;
    let (root_a, root_b) = (server.dir.path().join("a"), server.dir.path().join("b"));
    for root in [&root_a, &root_b] {
        std::fs::create_dir_all(root).unwrap();
    }
    register_on(&server, &[("nfs_a", &root_a), ("nfs_b", &root_b)]).await;

    let old_keys: Vec<i64> = (1..=8).collect();
    let written = uris(&server.write_keys("inst", &old_keys).await["locations"]);
    let on = |uri: &str, root: &Path| uri.contains(&format!("{}/", root.display()));
    let (down, down_root, other_root) = if on(&written[0], &root_a) {
        ("nfs_a", &root_a, &root_b)
    } else {
        ("nfs_b", &root_b, &root_a)
    };
    assert_eq!(batch_uris(&server, &old_keys).await, written);
    let client = fast_client(&server).await;
    assert_eq!(fast_uris(&client, &old_keys).await, written);

    let mount = match Mount::read_only(down_root) {
        Ok(mount) => mount,
        Err(why) => {
            eprintln!("*** SKIPPED: a read-only bind mount is not possible here ({why}) ***");
            return;
        }
    };
    let took = await_health(&server, down, false).await;
    eprintln!("{down} marked down {took:?} after the mount (probe period {PROBE_MS} ms)");
    // Its blocks are misses; the other storage's still answer.
    let answered = batch_uris(&server, &old_keys).await;
    for (before, now) in written.iter().zip(&answered) {
        let expected = if on(before, down_root) { "" } else { before };
        assert_eq!(now, expected, "{answered:?}");
    }
    let took = await_fast_path(&server, &client, &old_keys).await;
    eprintln!("the fast path agreed {took:?} after the server marked {down} down");
    // New writes go to the other storage.
    let new_keys: Vec<i64> = (100..108).collect();
    let fresh = uris(&server.write_keys("inst", &new_keys).await["locations"]);
    assert!(fresh.iter().all(|uri| on(uri, other_root)), "{fresh:?}");

    drop(mount);
    let took = await_health(&server, down, true).await;
    eprintln!("{down} back in service {took:?} after the unmount");
    assert_eq!(batch_uris(&server, &old_keys).await, written);
    assert_eq!(batch_uris(&server, &new_keys).await, fresh);
    await_fast_path(&server, &client, &old_keys).await;
    assert_eq!(fast_uris(&client, &old_keys).await, written);
    // The client owns a runtime: it must not be dropped on this one's threads.
    tokio::task::spawn_blocking(move || drop(client))
        .await
        .expect("drop");
}

/// A storage's file system is unmounted under a running `kvcm serve` (a bind mount stands in
/// for NFS): the bare mount point left behind fails the probes, the blocks removed meanwhile
/// are not taken as freed because their files are missing there, and once it is mounted
/// again the files are unlinked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unmounted_storage_is_down_and_its_files_are_freed_once_it_is_back() {
    let server =
        TestServer::start_with(&[&format!("kvcm.storage.probe_interval_ms={PROBE_MS}")]).await;
    let (backing, root) = (server.dir.path().join("nfs"), server.dir.path().join("mnt"));
    std::fs::create_dir_all(&backing).unwrap();
    std::fs::create_dir_all(&root).unwrap();
    let mount = match Mount::bind(&backing, &root) {
        Ok(mount) => mount,
        Err(why) => {
            eprintln!("*** SKIPPED: a bind mount is not possible here ({why}) ***");
            return;
        }
    };
    register_on(&server, &[("nfs_m", &root)]).await;
    // A probe wrote the storage's identity on the mounted file system.
    let probed = wait_until(Duration::from_secs(10), async || {
        backing.join(".kvcm/id").is_file().then_some(())
    })
    .await;
    assert!(probed.is_some(), "no probe of nfs_m ran");
    await_health(&server, "nfs_m", true).await;

    let keys: Vec<i64> = (1..=4).collect();
    let written = uris(&server.write_keys("inst", &keys).await["locations"]);
    // What the client would write: each block's file (the URI's path, before its query),
    // through the mount, seen in the backing directory.
    let through_mount: Vec<&Path> = written
        .iter()
        .map(|uri| {
            let rest = uri
                .strip_prefix("file://nfs_m")
                .expect("a file URI of nfs_m");
            Path::new(rest.split('?').next().unwrap())
        })
        .collect();
    let on_backing: Vec<PathBuf> = through_mount
        .iter()
        .map(|path| backing.join(path.strip_prefix(&root).expect("below the root")))
        .collect();
    for (path, backed) in through_mount.iter().zip(&on_backing) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, vec![7u8; 1024]).unwrap();
        assert!(backed.exists(), "{backed:?} written through the mount");
    }

    drop(mount);
    let took = await_health(&server, "nfs_m", false).await;
    eprintln!("nfs_m marked down {took:?} after the unmount (probe period {PROBE_MS} ms)");
    let removed = server
        .meta_http(
            "removeCache",
            json!({"instance_id": "inst", "block_keys": keys}),
        )
        .await;
    assert_eq!(code(&removed), "OK", "{removed}");
    // The deleter tried to free each block, and failed: its file is missing from the bare
    // mount point, which is not taken as freed.
    let tried = wait_until(Duration::from_secs(10), async || {
        let log = server.log();
        let failed = log.matches("freeing block bytes failed").count();
        (failed >= keys.len()).then_some(())
    })
    .await;
    assert!(tried.is_some(), "the deleter never tried: {}", server.log());
    assert!(
        !root.join(".kvcm").exists(),
        "the probes did not take the bare mount point for the storage"
    );

    let _mount = Mount::bind(&backing, &root).expect("mount again");
    let took = await_health(&server, "nfs_m", true).await;
    eprintln!("nfs_m back {took:?} after the mount");
    let freed = wait_until(Duration::from_secs(10), async || {
        on_backing.iter().all(|path| !path.exists()).then_some(())
    })
    .await;
    assert!(
        freed.is_some(),
        "the files are unlinked once the storage is back"
    );
}
