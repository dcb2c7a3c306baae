//! Memory-pool nodes end to end: real `kvcm serve` and `kvcm pool` processes, membership
//! over HTTP, placement of blocks in node regions (`pace://` URIs), death by SIGKILL (its
//! blocks become misses, commits on it are refused, writes go elsewhere) and rejoin.

mod common;

use std::time::Duration;

use common::pool::{group, live_range, members, pool_storage, PoolProcess};
use common::{code, uris, wait_until, TestServer};
use kvcm_storage::pool::PoolPartUri;
use serde_json::{json, Value};

async fn register(server: &TestServer, instance: &str, group: &str) {
    let body = json!({"instance_group": group, "instance_id": instance, "block_size": 16,
                      "location_spec_infos": [{"name": "tp0", "size": 16384}],
                      "model_deployment": {"model_name": "m", "dtype": "FP8", "tp_size": 1}});
    let answer = server.meta_http("registerInstance", body).await;
    assert_eq!(code(&answer), "OK", "{answer}");
}

async fn start_write(server: &TestServer, instance: &str, keys: &[i64]) -> Value {
    let body = json!({"instance_id": instance, "block_keys": keys, "write_timeout_seconds": 30});
    let start = server.meta_http("startWriteCache", body).await;
    assert_eq!(code(&start), "OK", "{start}");
    start
}

async fn finish(server: &TestServer, instance: &str, start: &Value) -> Value {
    let count = start["locations"].as_array().expect("locations").len();
    let body = json!({"instance_id": instance, "write_session_id": start["write_session_id"],
                      "success_blocks": {"offset": count}});
    server.meta_http("finishWriteCache", body).await
}

async fn batch_get(server: &TestServer, instance: &str, keys: &[i64]) -> Vec<String> {
    let body = json!({"instance_id": instance, "query_type": "QT_BATCH_GET", "block_keys": keys});
    let answer = server.meta_http("getCacheLocation", body).await;
    assert_eq!(code(&answer), "OK", "{answer}");
    uris(&answer["locations"])
}

/// Adds pool storage `pool_a` and group `g` preferring it over the default file storage.
async fn add_pool_and_group(server: &TestServer) {
    let added = server
        .admin_http("addStorage", json!({"storage": pool_storage("pool_a")}))
        .await;
    assert_eq!(code(&added), "OK", "{added}");
    let created = server
        .admin_http(
            "createInstanceGroup",
            json!({"instance_group": group("g", &["pool_a", "default_file"])}),
        )
        .await;
    assert_eq!(code(&created), "OK", "{created}");
}

#[tokio::test]
async fn a_killed_node_takes_its_blocks_and_a_rejoined_one_starts_empty() {
    let server = TestServer::start_with(&["kvcm.pool.heartbeat_ms=100"]).await;
    add_pool_and_group(&server).await;
    let mut node = PoolProcess::start(&server, "pool_a", "node-1", "4M").await;
    let first_range = live_range(&server, "pool_a", Some("node-1"), 1).await;
    register(&server, "inst", "g").await;

    let committed = start_write(&server, "inst", &[1, 2, 3, 4]).await;
    assert_eq!(code(&finish(&server, "inst", &committed).await), "OK");
    let placed = batch_get(&server, "inst", &[1, 2, 3, 4]).await;
    for uri in &placed {
        let part = PoolPartUri::parse(uri).expect("a pool location");
        assert_eq!(
            (part.node_id.as_str(), part.range_id),
            ("node-1", first_range)
        );
    }
    let open = start_write(&server, "inst", &[5, 6]).await;

    node.kill();
    // Dead after 3 missed 100-ms heartbeats: its blocks become misses within a second.
    let gone = wait_until(Duration::from_secs(3), async || {
        batch_get(&server, "inst", &[1, 2, 3, 4])
            .await
            .iter()
            .all(String::is_empty)
            .then_some(())
    })
    .await;
    assert!(gone.is_some(), "blocks of the dead node still answered");
    let refused = finish(&server, "inst", &open).await;
    assert_ne!(code(&refused), "OK", "a commit on a dead node: {refused}");
    assert!(batch_get(&server, "inst", &[5, 6])
        .await
        .iter()
        .all(String::is_empty));
    // New writes go to the group's other storage.
    let elsewhere = start_write(&server, "inst", &[7]).await;
    let uri = uris(&elsewhere["locations"]).remove(0);
    assert!(uri.starts_with("file://default_file/"), "{uri}");

    let _back = PoolProcess::start(&server, "pool_a", "node-1", "4M").await;
    let second_range = live_range(&server, "pool_a", Some("node-1"), 2).await;
    assert_ne!(first_range, second_range);
    let again = start_write(&server, "inst", &[1]).await;
    let part = PoolPartUri::parse(&uris(&again["locations"])[0]).expect("back on the pool");
    assert_eq!(
        part.range_id, second_range,
        "a rejoined node gets a fresh incarnation"
    );
}

/// Replacing a pool storage (UpdateStorage) retires the node incarnations of its old
/// backend at once, as if they had died: their blocks become misses, a write session opened
/// on them cannot commit, and the node joins the new backend afresh. Removing the storage
/// then does the same to the new backend's incarnation.
#[tokio::test]
async fn a_replaced_or_removed_pool_storage_takes_its_blocks_with_it() {
    let server = TestServer::start_with(&["kvcm.pool.heartbeat_ms=100"]).await;
    add_pool_and_group(&server).await;
    let _node = PoolProcess::start(&server, "pool_a", "node-u", "4M").await;
    let first_range = live_range(&server, "pool_a", Some("node-u"), 1).await;
    register(&server, "inst", "g").await;
    let on_pool = |uris: &[String]| uris.iter().all(|uri| uri.starts_with("pace://pool_a/"));
    let committed = start_write(&server, "inst", &[1, 2]).await;
    assert_eq!(code(&finish(&server, "inst", &committed).await), "OK");
    assert!(on_pool(&batch_get(&server, "inst", &[1, 2]).await));
    let open = start_write(&server, "inst", &[3]).await;
    assert!(on_pool(&uris(&open["locations"])), "{open}");

    let updated = server
        .admin_http("updateStorage", json!({"storage": pool_storage("pool_a")}))
        .await;
    assert_eq!(code(&updated), "OK", "{updated}");
    let after = batch_get(&server, "inst", &[1, 2]).await;
    assert!(
        after.iter().all(String::is_empty),
        "old incarnation's blocks: {after:?}"
    );
    let refused = finish(&server, "inst", &open).await;
    assert_ne!(
        code(&refused),
        "OK",
        "a commit on a retired incarnation: {refused}"
    );
    let second_range = live_range(&server, "pool_a", Some("node-u"), 1).await;
    assert_ne!(
        first_range, second_range,
        "the node joined the new backend afresh"
    );

    let again = start_write(&server, "inst", &[4]).await;
    assert_eq!(code(&finish(&server, "inst", &again).await), "OK");
    assert!(on_pool(&batch_get(&server, "inst", &[4]).await));
    let removed = server
        .admin_http("removeStorage", json!({"storage_unique_name": "pool_a"}))
        .await;
    assert_eq!(code(&removed), "OK", "{removed}");
    let gone = batch_get(&server, "inst", &[4]).await;
    assert!(
        gone.iter().all(String::is_empty),
        "removed storage's blocks: {gone:?}"
    );
}

/// A node that knows two servers stays with the one that issued its incarnation through a
/// passing failure (a heartbeat timed out while that server was stopped). It used to turn
/// to the other server at once, whose "unknown incarnation" made it drop the incarnation
/// and join there: the issuer then declared it dead and swept its blocks.
#[tokio::test]
async fn a_passing_heartbeat_failure_keeps_the_incarnation_of_a_node_that_knows_two_servers() {
    let server = TestServer::start_with(&["kvcm.pool.heartbeat_ms=2000"]).await;
    let other = TestServer::start().await;
    // Both servers have the storage (the same configuration), each its own registry.
    for each in [&server, &other] {
        let added = each
            .admin_http("addStorage", json!({"storage": pool_storage("pool_a")}))
            .await;
        assert_eq!(code(&added), "OK", "{added}");
    }
    let second = other.address("http").to_string();
    let _node =
        PoolProcess::start_with(&server, "pool_a", "node-2", "4M", &["--server", &second]).await;
    let range = live_range(&server, "pool_a", Some("node-2"), 1).await;
    let signal = |name: &str| {
        let status = std::process::Command::new("kill")
            .args([name, &server.pid().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {name}");
    };
    // A heartbeat times out (a membership request waits 2 s; one goes every 2 s) while the
    // server is stopped for 4.5 s, under the 6 s after which it declares the node dead. How
    // long it stays stopped, and how long the node is watched after (two more heartbeats),
    // are the measurement.
    signal("-STOP");
    tokio::time::sleep(Duration::from_millis(4500)).await;
    signal("-CONT");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let elsewhere = members(&other, "pool_a").await;
    assert!(
        elsewhere.is_empty(),
        "the node joined the other server: {elsewhere:?}"
    );
    let nodes = members(&server, "pool_a").await;
    assert_eq!(nodes.len(), 1, "no second incarnation: {nodes:?}");
    assert_eq!(nodes[0]["range_id"], range, "{nodes:?}");
    assert_eq!(nodes[0]["live"], true, "{nodes:?}");
}

#[tokio::test]
async fn the_embedded_pool_takes_writes_first_and_a_full_one_passes_them_to_the_file_storage() {
    let server = TestServer::start_custom(&["--pool-size", "64K"], &[]).await;
    live_range(&server, kvcm::server::DEFAULT_POOL, None, 1).await;
    let answer = server.register("inst", 16).await;
    assert_eq!(code(&answer), "OK", "{answer}");
    let configs: Value = serde_json::from_str(answer["storage_configs"].as_str().unwrap()).unwrap();
    let names: Vec<&str> = configs
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["global_unique_name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["default_file", "default_pool"]);
    let small = start_write(&server, "inst", &[1, 2]).await;
    for uri in uris(&small["locations"]) {
        assert!(uri.starts_with("pace://default_pool/"), "{uri}");
    }
    // 100 blocks of 1 KiB do not fit in what is left of 64 KiB: the whole call goes to file.
    let keys: Vec<i64> = (10..110).collect();
    let large = start_write(&server, "inst", &keys).await;
    for uri in uris(&large["locations"]) {
        assert!(uri.starts_with("file://default_file/"), "{uri}");
    }
}

#[tokio::test]
async fn membership_requests_with_bad_bodies_or_names_are_refused() {
    let server = TestServer::start().await;
    let cases = [
        (kvcm::pool::JOIN_ROUTE, "not json".to_string(), 400),
        (
            kvcm::pool::JOIN_ROUTE,
            json!({"storage": "nope", "node_id": "n", "endpoint": "h:1", "capacity": 4096})
                .to_string(),
            404,
        ),
        (
            kvcm::pool::JOIN_ROUTE,
            json!({"storage": "default_file", "node_id": "n", "endpoint": "h:1", "capacity": 4096})
                .to_string(),
            400,
        ),
        (
            kvcm::pool::HEARTBEAT_ROUTE,
            json!({"storage": "default_file", "node_id": "n", "range_id": 1}).to_string(),
            400,
        ),
        (
            kvcm::pool::NODES_ROUTE,
            json!({"storage": 5}).to_string(),
            400,
        ),
    ];
    for (route, body, status) in cases {
        let (got, answer) = server.post_raw("http", route, body.as_bytes()).await;
        let text = String::from_utf8_lossy(&answer);
        assert_eq!(got, status, "{route} {body}: {text}");
        assert!(text.contains("error"), "{text}");
    }
    let added = server
        .admin_http("addStorage", json!({"storage": pool_storage("pool_b")}))
        .await;
    assert_eq!(code(&added), "OK");
    let bad_name =
        json!({"storage": "pool_b", "node_id": "a/../b", "endpoint": "h:1", "capacity": 4096});
    let (got, _) = server
        .post_raw(
            "http",
            kvcm::pool::JOIN_ROUTE,
            bad_name.to_string().as_bytes(),
        )
        .await;
    assert_eq!(got, 400);
    let stale = json!({"storage": "pool_b", "node_id": "n", "range_id": 42});
    let (got, _) = server
        .post_raw(
            "http",
            kvcm::pool::HEARTBEAT_ROUTE,
            stale.to_string().as_bytes(),
        )
        .await;
    assert_eq!(got, 404, "an unknown incarnation must join again");
    assert!(
        members(&server, "pool_b").await.is_empty(),
        "nothing joined"
    );
}
