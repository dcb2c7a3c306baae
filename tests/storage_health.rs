//! Storage health failover against a real `kvcm serve` (issue 11, item 3): one of two file
//! storages made unwritable for root by a read-only bind mount is marked down by the
//! background probes, its blocks read as misses, new writes go to the other storage, and
//! once the mount is gone it serves again with the same URIs — on the server and on the fast
//! lookup path alike. Needs `mount` (root, as CI runs); without it the test says so loudly
//! and fails nothing it did not check.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{code, nfs_group, nfs_storage, uris, wait_until, TestServer};
use kvcm_client::{Client, ClientConfig, ServerAddress, Wire};
use serde_json::json;

const PROBE_MS: u64 = 100;

/// A read-only bind mount of a directory over itself, undone on drop.
struct ReadOnly(PathBuf);

impl ReadOnly {
    fn mount(dir: &Path) -> Result<ReadOnly, String> {
        let run = |args: &[&str]| {
            let output = Command::new("mount").args(args).output();
            match output {
                Ok(out) if out.status.success() => Ok(()),
                Ok(out) => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
                Err(error) => Err(error.to_string()),
            }
        };
        let path = dir.to_str().expect("utf-8 path");
        run(&["--bind", path, path])?;
        let mounted = ReadOnly(dir.to_path_buf());
        run(&["-o", "remount,bind,ro", path])?;
        Ok(mounted)
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unwritable_storage_fails_over_and_comes_back() {
    let server =
        TestServer::start_with(&[&format!("kvcm.storage.probe_interval_ms={PROBE_MS}")]).await;
    let (root_a, root_b) = (server.dir.path().join("a"), server.dir.path().join("b"));
    for (name, root) in [("nfs_a", &root_a), ("nfs_b", &root_b)] {
        std::fs::create_dir_all(root).unwrap();
        let added = server
            .admin_http("addStorage", json!({"storage": nfs_storage(name, root)}))
            .await;
        assert_eq!(code(&added), "OK", "{added}");
    }
    let created = server
        .admin_http(
            "createInstanceGroup",
            json!({"instance_group": nfs_group("gh", &["nfs_a", "nfs_b"])}),
        )
        .await;
    assert_eq!(code(&created), "OK", "{created}");
    let mut registration = common::registration("inst", 16);
    registration["instance_group"] = json!("gh");
    let registered = server.meta_http("registerInstance", registration).await;
    assert_eq!(code(&registered), "OK", "{registered}");

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

    let mount = match ReadOnly::mount(down_root) {
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
