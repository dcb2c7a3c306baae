//! Shared by the lookup-path tests: a server with two file storages in one group, an
//! instance with two specs and a spec group, fast-path clients on either wire, and
//! blocking wrappers of the harness's async calls.

#![allow(dead_code)]

use serde_json::{json, Value};

use super::common::{code, TestServer};
use kvcm_client::{Client, ClientConfig, ServerAddress, Wire};

/// The instance of these tests.
pub const INSTANCE: &str = "lookup";
/// Its group.
pub const GROUP: &str = "two_storages";
/// The group's storages.
pub const STORAGES: [&str; 2] = ["nfs_a", "nfs_b"];

/// Adds the two storages and the group, and registers the instance (specs `tp0`, `tp1`;
/// spec group `only_tp1`).
pub async fn prepare(server: &TestServer) {
    for (name, kcpf) in STORAGES.iter().zip([4, 1]) {
        let root = server.dir.path().join(name);
        // As an operator's mount would: a missing root fails the storage's health probes
        // (a slow machine may probe it before the first write creates it).
        std::fs::create_dir_all(&root).expect("storage root");
        let storage = json!({"global_unique_name": name,
            "nfs": {"root_path": format!("{}/", root.display()), "key_count_per_file": kcpf}});
        let added = server
            .admin_http("addStorage", json!({ "storage": storage }))
            .await;
        assert_eq!(code(&added), "OK", "{added}");
    }
    let group = json!({"name": GROUP, "storage_candidates": STORAGES, "global_quota_group_name": "q",
        "quota": {"capacity": "100000000000"},
        "cache_config": {"reclaim_strategy": {"storage_unique_name": STORAGES[0]},
                         "data_storage_strategy": "CPS_PREFER_3FS",
                         "meta_indexer_config": {"mutex_shard_num": 16,
                             "meta_cache_policy_config": {"type": "lru"},
                             "meta_storage_backend_config": {"storage_type": "local"}}},
        "version": 1});
    let created = server
        .admin_http("createInstanceGroup", json!({ "instance_group": group }))
        .await;
    assert_eq!(code(&created), "OK", "{created}");
    let registered = server
        .meta_http(
            "registerInstance",
            json!({"instance_group": GROUP, "instance_id": INSTANCE, "block_size": 2,
                   "location_spec_infos": [{"name": "tp0", "size": 1024}, {"name": "tp1", "size": 1024}],
                   "location_spec_groups": [{"name": "only_tp1", "spec_names": ["tp1"]}],
                   "model_deployment": {"model_name": "m", "dtype": "FP8", "tp_size": 2}}),
        )
        .await;
    assert_eq!(code(&registered), "OK", "{registered}");
}

/// A client of the instance on `wire`, its fast path up.
pub fn client(server: &TestServer, wire: Wire) -> Client {
    let client = Client::connect(ClientConfig {
        servers: vec![ServerAddress {
            grpc: format!("http://{}", server.address("grpc")),
            http: server.address("http"),
        }],
        instance_id: INSTANCE.into(),
        wire: Some(wire),
        api_key: None,
        tls: None,
    })
    .expect("client");
    assert!(client.fast_path_up(), "the fast path connected on {wire:?}");
    client
}

/// Enables or disables a storage.
pub async fn set_available(server: &TestServer, storage: &str, available: bool) {
    let rpc = if available {
        "enableStorage"
    } else {
        "disableStorage"
    };
    let answer = server
        .admin_http(rpc, json!({ "storage_unique_name": storage }))
        .await;
    assert_eq!(code(&answer), "OK", "{answer}");
}

/// StartWriteCache over HTTP; returns the answer (asserted OK).
pub async fn start(server: &TestServer, keys: &[i64], spec_groups: &[&str], timeout: i64) -> Value {
    let mut body =
        json!({"instance_id": INSTANCE, "block_keys": keys, "write_timeout_seconds": timeout});
    if !spec_groups.is_empty() {
        body["location_spec_group_names"] = json!(spec_groups);
    }
    let answer = server.meta_http("startWriteCache", body).await;
    assert_eq!(
        code(&answer),
        "OK",
        "{answer}\nserver log:\n{}",
        server.log()
    );
    answer
}

/// FinishWriteCache over HTTP with these successes.
pub async fn finish(server: &TestServer, session: &Value, successes: Vec<bool>) {
    finish_checksummed(server, session, successes, Value::Null).await;
}

/// FinishWriteCache over HTTP with these successes and `locations` (the writer's checksums,
/// `null` for none).
pub async fn finish_checksummed(
    server: &TestServer,
    session: &Value,
    successes: Vec<bool>,
    locations: Value,
) {
    let mut body = json!({"instance_id": INSTANCE, "write_session_id": session,
                          "success_blocks": {"bool_masks": {"values": successes}}});
    if !locations.is_null() {
        body["locations"] = locations;
    }
    let answer = server.meta_http("finishWriteCache", body).await;
    assert_eq!(code(&answer), "OK", "{answer}");
}

/// RemoveCache over HTTP.
pub async fn remove(server: &TestServer, keys: &[i64]) {
    let answer = server
        .meta_http(
            "removeCache",
            json!({"instance_id": INSTANCE, "block_keys": keys}),
        )
        .await;
    assert_eq!(code(&answer), "OK", "{answer}");
}

/// Adds an event-report storage `er_l1p5` and lists it as the group's L1.5 reporters'.
pub async fn add_reporting(server: &TestServer) {
    let storage = json!({"global_unique_name": "er_l1p5", "storage_type": "ST_EVENT_REPORT_L1P5",
        "event_report": {"heartbeat_timeout_ms": 600_000, "cleanup_grace_ms": 600_000}});
    let added = server
        .admin_http("addStorage", json!({ "storage": storage }))
        .await;
    assert_eq!(code(&added), "OK", "{added}");
    super::common::update_group(server, GROUP, |group| {
        group["event_report_storage_candidates"] = json!(["er_l1p5"]);
    })
    .await;
}

/// A cache subscriber `host` reports that it holds `keys` (both specs, medium `gpu`).
pub async fn report_keys(server: &TestServer, host: &str, keys: &[i64]) {
    let events: Vec<Value> = keys
        .iter()
        .map(|key| {
            let specs: Vec<Value> = ["tp0", "tp1"]
                .iter()
                .map(|name| json!({"name": name, "uri": format!("event_report://{host}/gpu/{key}/{name}")}))
                .collect();
            json!({"event_type": "EVENT_BLOCK_ADD",
                   "block_add": {"block_key": key.to_string(), "medium": "gpu", "specs": specs}})
        })
        .collect();
    let body = json!({"instance_id": INSTANCE, "host_ip_port": host,
                      "storage_type": "ST_EVENT_REPORT_L1P5", "events": events});
    let answer = server.meta_http("reportEvent", body).await;
    assert_eq!(code(&answer), "OK", "{answer}");
}
