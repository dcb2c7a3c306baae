//! Cache subscribers (upstream trunk's ReportEvent and GetHostCacheState, wire delta §3.5 –
//! §3.6) against a real `kvcm serve`, over HTTP and gRPC: event-report storages and group
//! candidates, reporter lifecycles, generations, snapshots, rate limits, per-item results,
//! host counts, and the refusals of bad input.

mod common;

use std::time::Duration;

use common::{code, grpc_code, TestServer};
use kvcm::proto::meta;
use serde_json::{json, Value};

/// Timings of the event-report storages of most tests: long enough that nothing expires
/// while a test runs, snapshots rate-limited for a minute.
fn steady_timings() -> Value {
    json!({"heartbeat_timeout_ms": 60_000, "cleanup_grace_ms": 60_000,
           "snapshot_min_interval_ms": 60_000})
}

fn report_storage(name: &str, storage_type: &str, timings: Value) -> Value {
    json!({"global_unique_name": name, "storage_type": storage_type, "event_report": timings})
}

/// A group over the default file storage whose reporters report to `candidates`.
fn reporting_group(name: &str, candidates: &[&str]) -> Value {
    json!({"name": name, "storage_candidates": ["default_file"], "global_quota_group_name": name,
           "quota": {"capacity": "1000000000"},
           "cache_config": {"reclaim_strategy": {"storage_unique_name": "default_file"},
                            "data_storage_strategy": "CPS_PREFER_3FS",
                            "meta_indexer_config": {"mutex_shard_num": 16,
                                "meta_cache_policy_config": {"type": "lru"},
                                "meta_storage_backend_config": {"storage_type": "local"}}},
           "version": 1, "extra_info": "{\"tier\":\"gold\"}",
           "event_report_storage_candidates": candidates})
}

/// Adds event-report storages `er_l1p5` and `er_l2` with `timings`, a group `rg` listing
/// both, and registers `inst` there with specs `F0` and `L1`.
async fn reporting_instance(server: &TestServer, timings: Value) {
    for (name, storage_type) in [
        ("er_l1p5", "ST_EVENT_REPORT_L1P5"),
        ("er_l2", "ST_EVENT_REPORT_L2"),
    ] {
        let storage = report_storage(name, storage_type, timings.clone());
        let added = server
            .admin_http("addStorage", json!({"storage": storage}))
            .await;
        assert_eq!(code(&added), "OK", "{added}");
    }
    let group = reporting_group("rg", &["er_l1p5", "er_l2"]);
    let created = server
        .admin_http("createInstanceGroup", json!({"instance_group": group}))
        .await;
    assert_eq!(code(&created), "OK", "{created}");
    let mut registration = common::registration("inst", 4);
    registration["instance_group"] = json!("rg");
    registration["location_spec_infos"] =
        json!([{"name": "F0", "size": 64}, {"name": "L1", "size": 64}]);
    let registered = server.meta_http("registerInstance", registration).await;
    assert_eq!(code(&registered), "OK", "{registered}");
    assert_eq!(
        registered["extra_info"], "{\"tier\":\"gold\"}",
        "the group's"
    );
}

fn specs(host: &str, medium: &str, key: i64, names: &[&str]) -> Value {
    let specs = names.iter().map(|name| {
        json!({"name": name, "uri": format!("event_report://{host}/{medium}/{key}?size=64")})
    });
    Value::Array(specs.collect())
}

fn add(host: &str, medium: &str, key: i64) -> Value {
    json!({"event_type": "EVENT_BLOCK_ADD",
           "block_add": {"block_key": key.to_string(), "medium": medium,
                         "specs": specs(host, medium, key, &["F0"])}})
}

fn delete(medium: &str, key: i64, names: &[&str]) -> Value {
    json!({"event_type": "EVENT_BLOCK_DELETE",
           "block_delete": {"block_key": key.to_string(), "medium": medium, "spec_names": names}})
}

fn snapshot(host: &str, blocks: &[(i64, &str)]) -> Value {
    let blocks = blocks.iter().map(|(key, medium)| {
        json!({"block_key": key.to_string(), "medium": medium,
               "specs": specs(host, medium, *key, &["F0", "L1"])})
    });
    json!({"event_type": "EVENT_BLOCK_SNAPSHOT", "block_snapshot": {"blocks": blocks.collect::<Vec<_>>()}})
}

fn register(mediums: &[&str]) -> Value {
    json!({"event_type": "EVENT_NODE_REGISTER", "node_register": {"mediums": mediums}})
}

fn heartbeat() -> Value {
    json!({"event_type": "EVENT_HEARTBEAT", "heartbeat": {"system_status": {"load": "0.4"}}})
}

fn host_down() -> Value {
    json!({"event_type": "EVENT_HOST_DOWN", "host_down": {}})
}

async fn report(server: &TestServer, host: &str, tier: &str, events: Vec<Value>) -> Value {
    let body = json!({"trace_id": "rep", "instance_id": "inst", "host_ip_port": host,
                      "storage_type": tier, "events": events});
    server.meta_http("reportEvent", body).await
}

async fn l1(server: &TestServer, host: &str, events: Vec<Value>) -> Value {
    report(server, host, "ST_EVENT_REPORT_L1P5", events).await
}

/// `body` with the members of `extra` set (replacing those of the same name).
fn with_fields(mut body: Value, extra: &Value) -> Value {
    for (name, value) in extra.as_object().into_iter().flatten() {
        body[name] = value.clone();
    }
    body
}

/// `(host, local, global)` of every answered host.
async fn host_state(server: &TestServer, keys: &[i64], extra: Value) -> Vec<(String, i64, i64)> {
    let body = json!({"trace_id": "hs", "instance_id": "inst", "query_type": "QT_PREFIX_MATCH",
                      "block_cache_keys": keys});
    let body = with_fields(body, &extra);
    let answer = server.meta_http("getHostCacheState", body).await;
    assert_eq!(code(&answer), "OK", "{answer}");
    let number = |v: &Value| {
        v.as_str()
            .expect("int64 as a string")
            .parse::<i64>()
            .expect("number")
    };
    let hosts = answer["hosts"].as_array().expect("hosts").iter();
    hosts
        .map(|h| {
            (
                h["host_ip_port"].as_str().expect("host").to_string(),
                number(&h["local"]),
                number(&h["global"]),
            )
        })
        .collect()
}

fn owned(hosts: &[(&str, i64, i64)]) -> Vec<(String, i64, i64)> {
    hosts
        .iter()
        .map(|(h, l, g)| (h.to_string(), *l, *g))
        .collect()
}

fn item_results(answer: &Value) -> Vec<&str> {
    let results = answer["item_results"].as_array().expect("item_results");
    results
        .iter()
        .map(|r| r.as_str().expect("a code name"))
        .collect()
}

fn version(answer: &Value) -> &str {
    answer["committed_snapshot_version"]
        .as_str()
        .expect("version")
}

#[tokio::test]
async fn hosts_count_their_reported_prefix_by_tier_medium_and_order() {
    let server = TestServer::start().await;
    reporting_instance(&server, steady_timings()).await;
    // a: keys 1, 2 on L1.5 (gpu) and 3 on L2 (memory) — one host, both tiers; b: 1, 2;
    // c: 2, 3 (misses the first key: not answered); d: 1 on disk.
    let answered = l1(
        &server,
        "a:1",
        vec![add("a:1", "gpu", 1), add("a:1", "gpu", 2)],
    )
    .await;
    assert_eq!(code(&answered), "OK", "{answered}");
    let l2 = report(
        &server,
        "a:1",
        "ST_EVENT_REPORT_L2",
        vec![add("a:1", "memory", 3)],
    )
    .await;
    assert_eq!(code(&l2), "OK", "{l2}");
    l1(
        &server,
        "b:1",
        vec![add("b:1", "gpu", 1), add("b:1", "gpu", 2)],
    )
    .await;
    l1(
        &server,
        "c:1",
        vec![add("c:1", "gpu", 2), add("c:1", "gpu", 3)],
    )
    .await;
    l1(&server, "d:1", vec![add("d:1", "disk", 1)]).await;

    let keys = [1, 2, 3, 4];
    let all = owned(&[("a:1", 3, 3), ("b:1", 2, 2), ("d:1", 1, 1)]);
    assert_eq!(host_state(&server, &keys, json!({})).await, all);
    // QT_UNSPECIFIED reads as prefix match.
    assert_eq!(
        host_state(&server, &keys, json!({"query_type": "QT_UNSPECIFIED"})).await,
        all
    );
    let gpu_only = owned(&[("a:1", 2, 2), ("b:1", 2, 2)]);
    assert_eq!(
        host_state(&server, &keys, json!({"medium": ["gpu"]})).await,
        gpu_only
    );
    // At most 64 mediums named.
    let mediums: Vec<String> = (0..65).map(|m| format!("m{m}")).collect();
    let body = json!({"trace_id": "hs", "instance_id": "inst", "query_type": "QT_PREFIX_MATCH",
                      "block_cache_keys": keys, "medium": mediums});
    let refused = server.meta_http("getHostCacheState", body).await;
    assert_eq!(code(&refused), "INVALID_ARGUMENT", "{refused}");
    assert!(refused.to_string().contains("65 mediums"), "{refused}");
    // Order matters: a prefix starts at the first key.
    assert_eq!(
        host_state(&server, &[2, 1], json!({})).await,
        owned(&[("a:1", 2, 2), ("b:1", 2, 2), ("c:1", 1, 1)])
    );
    assert!(host_state(&server, &[9], json!({})).await.is_empty());

    // DELETE removes only the named spec; a missing block or spec is fine.
    let deleted = l1(
        &server,
        "b:1",
        vec![delete("gpu", 2, &["F0"]), delete("gpu", 77, &["L1"])],
    )
    .await;
    assert_eq!(code(&deleted), "OK", "{deleted}");
    assert!(item_results(&deleted).is_empty());
    let hosts = host_state(&server, &keys, json!({})).await;
    assert_eq!(hosts, owned(&[("a:1", 3, 3), ("b:1", 1, 1), ("d:1", 1, 1)]));

    // gRPC answers the same.
    let mut client = server.meta().await;
    let answer = client
        .get_host_cache_state(meta::GetHostCacheStateRequest {
            trace_id: "g".into(),
            instance_id: "inst".into(),
            query_type: meta::QueryType::QtPrefixMatch as i32,
            block_cache_keys: keys.to_vec(),
            ..Default::default()
        })
        .await
        .expect("grpc")
        .into_inner();
    assert_eq!(grpc_code(&answer.header), meta::ErrorCode::Ok);
    let over_grpc: Vec<(String, i64, i64)> = answer
        .hosts
        .into_iter()
        .map(|h| (h.host_ip_port, h.local, h.global))
        .collect();
    assert_eq!(over_grpc, hosts);
}

#[tokio::test]
async fn generations_are_created_by_the_first_delta_and_kept_until_unregister() {
    let server = TestServer::start().await;
    reporting_instance(&server, steady_timings()).await;
    // REGISTER / HEARTBEAT only: no generation, a snapshot is suggested.
    let registered = l1(&server, "a:1", vec![register(&["gpu"]), heartbeat()]).await;
    assert_eq!(code(&registered), "OK", "{registered}");
    assert_eq!(
        (
            version(&registered),
            registered["snapshot_required"].as_bool()
        ),
        ("", Some(true))
    );
    assert_eq!(registered["extra_info"], "{\"tier\":\"gold\"}");
    // The first ADD creates it (and still says snapshot_required); the next reuses it.
    let first = l1(&server, "a:1", vec![add("a:1", "gpu", 1)]).await;
    let generation = version(&first).to_string();
    assert_eq!(generation.len(), 32, "{first}");
    assert!(generation
        .bytes()
        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    assert_eq!(first["snapshot_required"], true);
    let second = l1(&server, "a:1", vec![delete("gpu", 1, &["F0"])]).await;
    assert_eq!(
        (version(&second), second["snapshot_required"].as_bool()),
        (generation.as_str(), Some(false))
    );
    // The other tier of the same host is another reporter.
    let other_tier = report(&server, "a:1", "ST_EVENT_REPORT_L2", vec![heartbeat()]).await;
    assert_eq!(version(&other_tier), "");
    // A delete on a fresh reporter creates a generation even when it deletes nothing.
    let fresh = l1(&server, "b:1", vec![delete("gpu", 5, &["F0"])]).await;
    assert_eq!(version(&fresh).len(), 32, "{fresh}");
    assert_ne!(version(&fresh), generation);
    // An invalid-only first batch creates none.
    let invalid = l1(&server, "c:1", vec![delete("gpu", 5, &["nope"])]).await;
    assert_eq!(code(&invalid), "INVALID_ARGUMENT", "{invalid}");
    assert_eq!(
        (version(&invalid), invalid["snapshot_required"].as_bool()),
        ("", Some(true))
    );
    // HOST_DOWN forgets it.
    let down = l1(&server, "a:1", vec![host_down()]).await;
    assert_eq!(code(&down), "OK", "{down}");
    assert_eq!(version(&down), "");
    // Empty events: a pure no-op with default fields.
    let noop = l1(&server, "a:1", vec![]).await;
    assert_eq!(code(&noop), "OK", "{noop}");
    assert_eq!(
        (
            version(&noop),
            noop["snapshot_required"].as_bool(),
            noop["extra_info"].as_str()
        ),
        ("", Some(false), Some(""))
    );
}

#[tokio::test]
async fn a_tombstoned_reporter_needs_register_and_events_apply_in_order() {
    let server = TestServer::start().await;
    reporting_instance(&server, steady_timings()).await;
    l1(
        &server,
        "a:1",
        vec![register(&["gpu"]), add("a:1", "gpu", 1)],
    )
    .await;
    assert_eq!(
        host_state(&server, &[1], json!({})).await,
        owned(&[("a:1", 1, 1)])
    );
    let down = l1(&server, "a:1", vec![host_down()]).await;
    assert_eq!(code(&down), "OK");
    assert!(
        host_state(&server, &[1], json!({})).await.is_empty(),
        "hidden at once"
    );
    assert_eq!(
        code(&l1(&server, "a:1", vec![host_down()]).await),
        "OK",
        "idempotent"
    );
    for refused in [
        heartbeat(),
        add("a:1", "gpu", 2),
        delete("gpu", 1, &["F0"]),
        snapshot("a:1", &[]),
    ] {
        let answer = l1(&server, "a:1", vec![refused]).await;
        assert_eq!(code(&answer), "NODE_NOT_REGISTERED", "{answer}");
        assert_eq!(item_results(&answer), ["NODE_NOT_REGISTERED"]);
    }
    // A later REGISTER does not make an earlier ADD succeed.
    let mixed = l1(
        &server,
        "a:1",
        vec![
            add("a:1", "gpu", 2),
            register(&["gpu"]),
            add("a:1", "gpu", 3),
        ],
    )
    .await;
    assert_eq!(code(&mixed), "NODE_NOT_REGISTERED", "{mixed}");
    assert_eq!(item_results(&mixed), ["NODE_NOT_REGISTERED", "OK", "OK"]);
    assert!(
        mixed["header"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("event 0"),
        "{mixed}"
    );
    // The old metadata was cleaned: only key 3 is back.
    assert!(host_state(&server, &[1], json!({})).await.is_empty());
    assert_eq!(
        host_state(&server, &[3], json!({})).await,
        owned(&[("a:1", 1, 1)])
    );
    // A fresh reporter may put REGISTER after its first mutation.
    let fresh = l1(
        &server,
        "b:1",
        vec![add("b:1", "gpu", 3), register(&["gpu"]), heartbeat()],
    )
    .await;
    assert_eq!(code(&fresh), "OK", "{fresh}");
    assert!(item_results(&fresh).is_empty());
    // Within one request the last operation on a spec wins.
    let folded = l1(
        &server,
        "b:1",
        vec![delete("gpu", 3, &["F0"]), add("b:1", "gpu", 3)],
    )
    .await;
    assert_eq!(code(&folded), "OK", "{folded}");
    assert_eq!(
        host_state(&server, &[3], json!({})).await,
        owned(&[("a:1", 1, 1), ("b:1", 1, 1)])
    );
}

#[tokio::test]
async fn reporters_past_the_heartbeat_timeout_are_hidden_and_past_the_grace_unregistered() {
    let server = TestServer::start().await;
    let timings = json!({"heartbeat_timeout_ms": 1_000, "cleanup_grace_ms": 1_000});
    reporting_instance(&server, timings).await;
    l1(&server, "a:1", vec![add("a:1", "gpu", 1)]).await;
    assert_eq!(
        host_state(&server, &[1], json!({})).await,
        owned(&[("a:1", 1, 1)])
    );
    // Mutations do not refresh liveness: the reporter disappears after the timeout.
    let hidden = common::wait_until(Duration::from_secs(10), || async {
        l1(&server, "a:1", vec![add("a:1", "gpu", 2)]).await;
        host_state(&server, &[1], json!({}))
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    assert!(hidden.is_some(), "hidden after the heartbeat timeout");
    // A heartbeat within the grace brings it back with its blocks.
    let back = l1(&server, "a:1", vec![heartbeat()]).await;
    assert_eq!(code(&back), "OK", "{back}");
    assert_eq!(
        host_state(&server, &[1, 2], json!({})).await,
        owned(&[("a:1", 2, 2)])
    );
    // Past timeout + grace without a heartbeat it is unregistered: REGISTER is needed.
    tokio::time::sleep(Duration::from_millis(2_300)).await;
    let late = l1(&server, "a:1", vec![heartbeat()]).await;
    assert_eq!(code(&late), "NODE_NOT_REGISTERED", "{late}");
    let revived = l1(&server, "a:1", vec![register(&["gpu"])]).await;
    assert_eq!(code(&revived), "OK", "{revived}");
    assert!(
        host_state(&server, &[1], json!({})).await.is_empty(),
        "its blocks were cleaned"
    );
}

#[tokio::test]
async fn a_snapshot_replaces_every_block_and_successful_ones_are_rate_limited() {
    let server = TestServer::start().await;
    reporting_instance(&server, steady_timings()).await;
    let delta = l1(
        &server,
        "a:1",
        vec![
            add("a:1", "gpu", 1),
            add("a:1", "gpu", 2),
            add("a:1", "gpu", 3),
        ],
    )
    .await;
    let before = version(&delta).to_string();
    // Refused as a whole, before any effect.
    let shapes = [
        vec![snapshot("a:1", &[]), add("a:1", "gpu", 9)],
        vec![snapshot("a:1", &[]), snapshot("a:1", &[])],
        vec![host_down(), heartbeat()],
    ];
    for events in shapes {
        let answer = l1(&server, "a:1", events).await;
        assert_eq!(code(&answer), "INVALID_ARGUMENT", "{answer}");
        assert!(item_results(&answer).is_empty(), "{answer}");
    }
    assert_eq!(
        host_state(&server, &[1, 2, 3], json!({})).await,
        owned(&[("a:1", 3, 3)])
    );

    let replaced = l1(
        &server,
        "a:1",
        vec![
            register(&["gpu"]),
            snapshot("a:1", &[(1, "gpu"), (5, "memory")]),
            heartbeat(),
        ],
    )
    .await;
    assert_eq!(code(&replaced), "OK", "{replaced}");
    assert_eq!(replaced["snapshot_required"], false);
    assert_ne!(version(&replaced), before);
    assert_eq!(version(&replaced).len(), 32);
    assert_eq!(
        host_state(&server, &[1, 2], json!({})).await,
        owned(&[("a:1", 1, 1)]),
        "key 2 omitted: cleaned"
    );
    assert_eq!(
        host_state(&server, &[5], json!({"medium": ["memory"]})).await,
        owned(&[("a:1", 1, 1)])
    );

    let limited = l1(&server, "a:1", vec![snapshot("a:1", &[])]).await;
    assert_eq!(code(&limited), "SNAPSHOT_RATE_LIMITED", "{limited}");
    assert_eq!(item_results(&limited), ["SNAPSHOT_RATE_LIMITED"]);
    let retry: u64 = limited["retry_after_ms"]
        .as_str()
        .expect("uint64 string")
        .parse()
        .expect("number");
    assert!((1..=60_000).contains(&retry), "{limited}");
    assert_eq!(version(&limited), version(&replaced), "unchanged");
    // Deltas are not rate limited.
    assert_eq!(
        code(&l1(&server, "a:1", vec![add("a:1", "gpu", 2)]).await),
        "OK"
    );

    // A failed snapshot does not start the cooldown.
    let duplicate = l1(
        &server,
        "b:1",
        vec![snapshot("b:1", &[(1, "gpu"), (1, "gpu")])],
    )
    .await;
    assert_eq!(code(&duplicate), "INVALID_ARGUMENT", "{duplicate}");
    assert_eq!(item_results(&duplicate), ["INVALID_ARGUMENT"]);
    let first = l1(
        &server,
        "b:1",
        vec![snapshot("b:1", &[(1, "gpu"), (1, "disk")])],
    )
    .await;
    assert_eq!(code(&first), "OK", "{first}");
    // An empty snapshot clears the reporter.
    let other = l1(&server, "c:1", vec![add("c:1", "gpu", 1)]).await;
    assert_eq!(code(&other), "OK");
    assert_eq!(
        code(&l1(&server, "c:1", vec![snapshot("c:1", &[])]).await),
        "OK"
    );
    let hosts = host_state(&server, &[1], json!({})).await;
    assert_eq!(hosts, owned(&[("a:1", 1, 1), ("b:1", 1, 1)]));
}

#[tokio::test]
async fn global_counts_fill_gaps_from_kvcm_storages_and_one_l2_peer() {
    let server = TestServer::start().await;
    reporting_instance(&server, steady_timings()).await;
    // a holds 1, 2; kvcm's file storage holds 3; peers b (L2) hold 4, 5 and c (L2) 4; d holds 1.
    l1(
        &server,
        "a:1",
        vec![add("a:1", "gpu", 1), add("a:1", "gpu", 2)],
    )
    .await;
    server.write_keys("inst", &[3]).await;
    let l2 = |host: &'static str, keys: &'static [i64]| {
        let events = keys.iter().map(|k| add(host, "memory", *k)).collect();
        report(&server, host, "ST_EVENT_REPORT_L2", events)
    };
    assert_eq!(code(&l2("b:1", &[4, 5]).await), "OK");
    assert_eq!(code(&l2("c:1", &[4]).await), "OK");
    l1(&server, "d:1", vec![add("d:1", "gpu", 1)]).await;
    let keys = [1, 2, 3, 4, 5, 6];
    let local_only = owned(&[("a:1", 2, 2), ("d:1", 1, 1)]);
    assert_eq!(host_state(&server, &keys, json!({})).await, local_only);
    let remote = json!({"global_kvs_host_count": 1});
    assert_eq!(
        host_state(&server, &keys, remote).await,
        owned(&[("a:1", 2, 3), ("d:1", 1, 1)])
    );
    let p2p = json!({"global_kvs_host_count": 1, "enable_p2p": true});
    assert_eq!(
        host_state(&server, &keys, p2p).await,
        owned(&[("a:1", 2, 5), ("d:1", 1, 1)])
    );
    // d is selected too: key 2 is neither kvcm's nor a peer's, so it stays at 1.
    let both = json!({"global_kvs_host_count": 4, "enable_p2p": true});
    assert_eq!(
        host_state(&server, &keys, both).await,
        owned(&[("a:1", 2, 5), ("d:1", 1, 1)])
    );
    // The medium filter applies to the peers' reports too.
    let gpu = json!({"global_kvs_host_count": 1, "enable_p2p": true, "medium": ["gpu"]});
    assert_eq!(
        host_state(&server, &keys, gpu).await,
        owned(&[("a:1", 2, 3), ("d:1", 1, 1)])
    );
}

#[tokio::test]
async fn bad_reports_get_their_codes_and_change_nothing() {
    let server = TestServer::start().await;
    reporting_instance(&server, steady_timings()).await;
    l1(&server, "a:1", vec![add("a:1", "gpu", 1)]).await;
    let bad_add = |block: Value| json!({"event_type": "EVENT_BLOCK_ADD", "block_add": block});
    let uri = "event_report://a:1/gpu/2";
    let items = [
        // event type and payload disagree
        json!({"event_type": "EVENT_BLOCK_DELETE", "block_add": {"block_key": "2", "medium": "gpu",
               "specs": [{"name": "F0", "uri": uri}]}}),
        json!({"event_type": "EVENT_HEARTBEAT"}),
        bad_add(json!({"block_key": "+2", "medium": "gpu", "specs": [{"name": "F0", "uri": uri}]})),
        bad_add(json!({"block_key": "2", "medium": "g#pu", "specs": [{"name": "F0", "uri": uri}]})),
        bad_add(json!({"block_key": "2", "medium": "gpu", "specs": []})),
        bad_add(json!({"block_key": "2", "medium": "gpu", "specs": [{"name": "tp9", "uri": uri}]})),
        bad_add(json!({"block_key": "2", "medium": "gpu",
                       "specs": [{"name": "F0", "uri": uri}, {"name": "F0", "uri": uri}]})),
        bad_add(json!({"block_key": "2", "medium": "gpu",
                       "specs": [{"name": "F0", "uri": format!("{uri}?s_version=0123")}]})),
        bad_add(
            json!({"block_key": "2", "medium": "gpu", "specs": [{"name": "F0", "uri": "not a uri"}]}),
        ),
        json!({"event_type": "EVENT_BLOCK_DELETE", "block_delete": {"block_key": "1", "medium": "gpu"}}),
        json!({"event_type": "EVENT_NODE_REGISTER", "node_register": {"mediums": ["a#b"]}}),
    ];
    let count = items.len();
    let answer = l1(&server, "a:1", items.to_vec()).await;
    assert_eq!(code(&answer), "INVALID_ARGUMENT", "{answer}");
    assert_eq!(item_results(&answer), vec!["INVALID_ARGUMENT"; count]);
    assert_eq!(
        host_state(&server, &[1, 2], json!({})).await,
        owned(&[("a:1", 1, 1)]),
        "unchanged"
    );

    // Whole-request refusals.
    for (host, tier) in [
        ("a#1", "ST_EVENT_REPORT_L1P5"),
        ("", "ST_EVENT_REPORT_L1P5"),
        ("a:1", "ST_NFS"),
        ("a:1", "ST_UNSPECIFIED"),
    ] {
        let refused = report(&server, host, tier, vec![add("a:1", "gpu", 2)]).await;
        assert_eq!(
            code(&refused),
            "INVALID_ARGUMENT",
            "{host} {tier}: {refused}"
        );
    }
    let unknown = server
        .meta_http("reportEvent", json!({"instance_id": "nobody", "host_ip_port": "a:1",
                                         "storage_type": "ST_EVENT_REPORT_L1P5", "events": [heartbeat()]}))
        .await;
    assert_eq!(code(&unknown), "INSTANCE_NOT_EXIST", "{unknown}");
    server.register("plain", 4).await;
    let unlisted = server
        .meta_http("reportEvent", json!({"instance_id": "plain", "host_ip_port": "a:1",
                                         "storage_type": "ST_EVENT_REPORT_L1P5", "events": [heartbeat()]}))
        .await;
    assert_eq!(code(&unlisted), "INSTANCE_NOT_EXIST", "{unlisted}");
    assert!(unlisted["header"]["status"]["message"]
        .as_str()
        .unwrap()
        .contains("event_report_storage_candidates"));
    assert_eq!(
        host_state(&server, &[1, 2], json!({})).await,
        owned(&[("a:1", 1, 1)]),
        "unchanged"
    );

    // GetHostCacheState refusals.
    for extra in [
        json!({"query_type": "QT_BATCH_GET"}),
        json!({"query_type": 4}),
        json!({"global_kvs_host_count": -1}),
    ] {
        let body = json!({"instance_id": "inst", "query_type": "QT_PREFIX_MATCH", "block_cache_keys": [1]});
        let body = with_fields(body, &extra);
        let refused = server.meta_http("getHostCacheState", body).await;
        assert_eq!(code(&refused), "INVALID_ARGUMENT", "{extra}: {refused}");
    }

    // Over gRPC: a type mismatch is the item's INVALID_ARGUMENT; an unknown number too.
    let mut client = server.meta().await;
    let item = |event_type: i32| meta::EventItem {
        event_type,
        event_params: Some(meta::event_item::EventParams::Heartbeat(
            meta::HeartbeatEventParams::default(),
        )),
    };
    let answer = client
        .report_event(meta::ReportEventRequest {
            trace_id: "g".into(),
            instance_id: "inst".into(),
            host_ip_port: "a:1".into(),
            events: vec![
                item(meta::ReportEventType::EventHeartbeat as i32),
                item(meta::ReportEventType::EventHostDown as i32),
                item(42),
            ],
            storage_type: meta::StorageType::StEventReportL1p5 as i32,
        })
        .await
        .expect("grpc")
        .into_inner();
    assert_eq!(grpc_code(&answer.header), meta::ErrorCode::InvalidArgument);
    let expected = [
        meta::ErrorCode::Ok,
        meta::ErrorCode::InvalidArgument,
        meta::ErrorCode::InvalidArgument,
    ];
    assert_eq!(answer.item_results, expected.map(|c| c as i32).to_vec());
}

#[tokio::test]
async fn event_report_storages_and_candidates_are_admin_objects_that_survive_a_restart() {
    let server = TestServer::start().await;
    let timings = json!({"heartbeat_timeout_ms": 5_000});
    reporting_instance(&server, timings).await;
    let listed = server.admin_http("listStorage", json!({})).await;
    let storages = listed["storage"].as_array().expect("storages");
    let l2 = storages
        .iter()
        .find(|s| s["global_unique_name"] == "er_l2")
        .expect("listed");
    assert_eq!(
        l2,
        &json!({"global_unique_name": "er_l2", "check_storage_available_when_open": false,
                "storage_type": "ST_EVENT_REPORT_L2",
                "event_report": {"heartbeat_timeout_ms": "5000", "cleanup_grace_ms": "300000",
                                 "liveness_check_interval_ms": "1000",
                                 "snapshot_min_interval_ms": "30000",
                                 "snapshot_delta_drain_timeout_ms": "10000"}}),
        "0 reads as the default"
    );
    let nfs = storages
        .iter()
        .find(|s| s["global_unique_name"] == "default_file")
        .expect("listed");
    assert!(
        nfs.get("storage_type").is_none(),
        "printed for event-report storages only: {nfs}"
    );
    let group = server
        .admin_http("getInstanceGroup", json!({"name": "rg"}))
        .await;
    assert_eq!(
        group["instance_group"]["event_report_storage_candidates"],
        json!(["er_l1p5", "er_l2"])
    );
    let default_group = server
        .admin_http("getInstanceGroup", json!({"name": "default"}))
        .await;
    assert!(
        default_group["instance_group"]
            .get("event_report_storage_candidates")
            .is_none(),
        "{default_group}"
    );

    // Refusals name the field.
    for (rpc, body, field) in [
        (
            "addStorage",
            json!({"storage": {"global_unique_name": "x", "event_report": {}}}),
            "storage_type",
        ),
        (
            "addStorage",
            json!({"storage": report_storage("x", "ST_EVENT_REPORT_L2", json!({"cleanup_grace_ms": -1}))}),
            "cleanup_grace_ms",
        ),
        (
            "addStorage",
            json!({"storage": {"global_unique_name": "x", "storage_type": "ST_EVENT_REPORT_L2",
                                          "nfs": {"root_path": "/tmp/x/"}}}),
            "storage_type",
        ),
    ] {
        let answer = server.admin_http(rpc, body).await;
        assert_eq!(code(&answer), "INVALID_ARGUMENT", "{answer}");
        assert!(
            answer["header"]["status"]["message"]
                .as_str()
                .unwrap()
                .contains(field),
            "{answer}"
        );
    }
    let mut writes_to_reports = reporting_group("w", &[]);
    writes_to_reports["storage_candidates"] = json!(["er_l2"]);
    let mut reports_to_files = reporting_group("f", &["default_file"]);
    let mut two_of_a_tier = reporting_group("t", &["er_l2", "er_l2b"]);
    let second = report_storage("er_l2b", "ST_EVENT_REPORT_L2", json!({}));
    assert_eq!(
        code(
            &server
                .admin_http("addStorage", json!({"storage": second}))
                .await
        ),
        "OK"
    );
    for (group, field) in [
        (&mut writes_to_reports, "storage_candidates"),
        (&mut reports_to_files, "event_report_storage_candidates"),
        (&mut two_of_a_tier, "event_report_storage_candidates"),
    ] {
        let answer = server
            .admin_http(
                "createInstanceGroup",
                json!({"instance_group": group.clone()}),
            )
            .await;
        assert_eq!(code(&answer), "INVALID_ARGUMENT", "{answer}");
        assert!(
            answer["header"]["status"]["message"]
                .as_str()
                .unwrap()
                .contains(field),
            "{answer}"
        );
    }

    // A restart keeps the storages and the group, and forgets the reporters: the next
    // event starts each anew.
    l1(&server, "a:1", vec![add("a:1", "gpu", 1)]).await;
    let before = server.admin_http("listStorage", json!({})).await;
    let server = server.kill_and_restart().await;
    let after = server.admin_http("listStorage", json!({})).await;
    assert_eq!(after["storage"], before["storage"]);
    let regrouped = server
        .admin_http("getInstanceGroup", json!({"name": "rg"}))
        .await;
    assert_eq!(regrouped["instance_group"], group["instance_group"]);
    assert!(host_state(&server, &[1], json!({})).await.is_empty());
    let again = l1(&server, "a:1", vec![heartbeat()]).await;
    assert_eq!(
        (
            code(&again),
            version(&again),
            again["snapshot_required"].as_bool()
        ),
        ("OK", "", Some(true))
    );
}

/// A JSON answer with its request id checked and replaced by `<rid>`.
fn golden(mut answer: Value) -> Value {
    let request_id = answer["header"]["request_id"].as_str().expect("request_id");
    assert!(request_id.starts_with("gold_"), "{request_id}");
    answer["header"]["request_id"] = json!("<rid>");
    answer
}

#[tokio::test]
async fn the_new_responses_answer_the_canonical_json() {
    let server = TestServer::start().await;
    reporting_instance(&server, steady_timings()).await;
    let body = |events: Vec<Value>| {
        json!({"trace_id": "gold", "instance_id": "inst", "host_ip_port": "a:1",
               "storage_type": "ST_EVENT_REPORT_L1P5", "events": events})
    };
    let mut added = golden(
        server
            .meta_http("reportEvent", body(vec![add("a:1", "gpu", 1)]))
            .await,
    );
    assert_eq!(version(&added).len(), 32);
    added["committed_snapshot_version"] = json!("<version>");
    let header = |code: &str, message: &str| json!({"status": {"code": code, "message": message}, "request_id": "<rid>", "tracer_result": ""});
    assert_eq!(
        added,
        json!({"header": header("OK", "Events reported successfully"), "item_results": [],
               "committed_snapshot_version": "<version>", "retry_after_ms": "0",
               "snapshot_required": true, "extra_info": "{\"tier\":\"gold\"}"})
    );
    let mut partial = golden(
        server
            .meta_http(
                "reportEvent",
                body(vec![heartbeat(), delete("gpu", 1, &[])]),
            )
            .await,
    );
    partial["committed_snapshot_version"] = json!("<version>");
    assert_eq!(
        partial,
        json!({"header": header("INVALID_ARGUMENT", "ReportEvent partially failed: event 1: no spec names"),
               "item_results": ["OK", "INVALID_ARGUMENT"],
               "committed_snapshot_version": "<version>", "retry_after_ms": "0",
               "snapshot_required": false, "extra_info": "{\"tier\":\"gold\"}"})
    );
    let state = server
        .meta_http("getHostCacheState", json!({"trace_id": "gold", "instance_id": "inst",
                                               "query_type": "QT_PREFIX_MATCH", "block_cache_keys": [1, 2]}))
        .await;
    assert_eq!(
        golden(state),
        json!({"header": header("OK", "Host cache state retrieved successfully"),
               "hosts": [{"host_ip_port": "a:1", "local": "1", "global": "1"}]})
    );
    let chosen = server
        .meta_http("getCacheLocationsByBackend", json!({"trace_id": "gold", "instance_id": "inst",
            "query_type": "QT_BATCH_GET", "block_keys": [1, 2],
            "backend_selectors": [{"backend_type": "ST_EVENT_REPORT_L1P5", "strategy": "LSS_V6D_PREFIX"}]}))
        .await;
    let mut chosen = golden(chosen);
    let uri = chosen["key_locations"][0]["locations"][0]["location_specs"][0]["uri"].take();
    let (stem, generation) = uri
        .as_str()
        .expect("uri")
        .split_once("&s_version=")
        .expect("versioned");
    assert_eq!(
        (stem, generation.len()),
        ("event_report://a:1/gpu/1?size=64", 32)
    );
    assert_eq!(
        chosen,
        json!({"header": header("OK", "Cache locations retrieved successfully"),
               "key_locations": [
                   {"locations": [{"type": "ST_EVENT_REPORT_L1P5", "spec_size": 1,
                                   "location_specs": [{"name": "F0", "uri": null}]}]},
                   {"locations": []}]})
    );
    let located = server
        .meta_http(
            "getCacheLocation",
            json!({"trace_id": "gold", "instance_id": "inst",
            "query_type": "QT_PREFIX_MATCH", "block_keys": [1, 2]}),
        )
        .await;
    let mut located = golden(located);
    let uri = located["locations"][0]["location_specs"][0]["uri"].take();
    assert_eq!(
        uri.as_str()
            .and_then(|uri| uri.split_once("&s_version="))
            .map(|(stem, _)| stem),
        Some("event_report://a:1/gpu/1?size=64")
    );
    assert_eq!(
        located,
        json!({"header": header("OK", "Cache locations retrieved successfully"),
               "locations": [{"type": "ST_EVENT_REPORT_L1P5", "spec_size": 1,
                              "location_specs": [{"name": "F0", "uri": null}]}]})
    );
}

#[tokio::test]
async fn the_default_query_type_is_registered_answered_and_read_by_host_state() {
    let server = TestServer::start().await;
    reporting_instance(&server, steady_timings()).await;
    l1(&server, "a:1", vec![add("a:1", "gpu", 1)]).await;
    let info = server
        .meta_http("getInstanceInfo", json!({"instance_id": "inst"}))
        .await;
    assert!(
        info["instance_info"].get("default_query_type").is_none(),
        "unset: not printed: {info}"
    );
    for (instance, query_type) in [("batch", "QT_BATCH_GET"), ("prefix", "QT_PREFIX_MATCH")] {
        let mut registration = common::registration(instance, 4);
        registration["instance_group"] = json!("rg");
        registration["default_query_type"] = json!(query_type);
        let registered = server.meta_http("registerInstance", registration).await;
        assert_eq!(code(&registered), "OK", "{registered}");
        let info = server
            .meta_http("getInstanceInfo", json!({"instance_id": instance}))
            .await;
        assert_eq!(
            info["instance_info"]["default_query_type"], query_type,
            "{info}"
        );
        let state = server
            .meta_http(
                "getHostCacheState",
                json!({"instance_id": instance, "block_cache_keys": [1]}),
            )
            .await;
        let expected = if instance == "batch" {
            "INVALID_ARGUMENT"
        } else {
            "OK"
        };
        assert_eq!(code(&state), expected, "{state}");
    }
    let mut bad = common::registration("bad", 4);
    bad["default_query_type"] = json!(9);
    let refused = server.meta_http("registerInstance", bad).await;
    assert_eq!(code(&refused), "INVALID_ARGUMENT", "{refused}");
    assert!(refused["header"]["status"]["message"]
        .as_str()
        .unwrap()
        .contains("default_query_type"));
    let server = server.kill_and_restart().await;
    let info = server
        .meta_http("getInstanceInfo", json!({"instance_id": "batch"}))
        .await;
    assert_eq!(
        info["instance_info"]["default_query_type"], "QT_BATCH_GET",
        "{info}"
    );
}

/// An instance registered with `use_eagle_pop` (upstream trunk's EaglePop mode) gets every
/// host's prefix one block shorter, a host left with none unanswered; the flag is echoed only
/// when set and survives a restart.
#[tokio::test]
async fn eagle_pop_instances_get_each_host_prefix_one_block_shorter() {
    let server = TestServer::start().await;
    reporting_instance(&server, steady_timings()).await;
    let mut registration = common::registration("eagle", 4);
    registration["instance_group"] = json!("rg");
    registration["model_deployment"]["use_eagle_pop"] = json!(true);
    registration["location_spec_infos"] =
        json!([{"name": "F0", "size": 64}, {"name": "L1", "size": 64}]);
    let registered = server
        .meta_http("registerInstance", registration.clone())
        .await;
    assert_eq!(code(&registered), "OK", "{registered}");
    registration["model_deployment"]["use_eagle_pop"] = json!(false);
    let other = server.meta_http("registerInstance", registration).await;
    assert_ne!(code(&other), "OK", "another identity: {other}");
    assert!(other.to_string().contains("model_deployment"), "{other}");
    for instance in ["inst", "eagle"] {
        for (host, keys) in [("a:1", &[1, 2, 3][..]), ("b:1", &[1][..])] {
            let events = keys
                .iter()
                .map(|&key| add(host, "gpu", key))
                .collect::<Vec<_>>();
            let body = json!({"trace_id": "rep", "instance_id": instance, "host_ip_port": host,
                              "storage_type": "ST_EVENT_REPORT_L1P5", "events": events});
            let reported = server.meta_http("reportEvent", body).await;
            assert_eq!(code(&reported), "OK", "{reported}");
        }
    }
    let keys = [1, 2, 3, 4];
    assert_eq!(
        host_state(&server, &keys, json!({})).await,
        owned(&[("a:1", 3, 3), ("b:1", 1, 1)])
    );
    assert_eq!(
        host_state(&server, &keys, json!({"instance_id": "eagle"})).await,
        owned(&[("a:1", 2, 2)])
    );
    let info = |instance: &'static str| {
        let server = &server;
        async move {
            let info = server
                .meta_http("getInstanceInfo", json!({"instance_id": instance}))
                .await;
            info["instance_info"]["model_deployment"].clone()
        }
    };
    assert!(
        info("inst").await.get("use_eagle_pop").is_none(),
        "unset: not printed"
    );
    assert_eq!(info("eagle").await["use_eagle_pop"], true);
    let server = server.kill_and_restart().await;
    let info = server
        .meta_http("getInstanceInfo", json!({"instance_id": "eagle"}))
        .await;
    assert_eq!(
        info["instance_info"]["model_deployment"]["use_eagle_pop"], true,
        "{info}"
    );
}

fn add_specs(host: &str, medium: &str, key: i64, names: &[&str]) -> Value {
    json!({"event_type": "EVENT_BLOCK_ADD",
           "block_add": {"block_key": key.to_string(), "medium": medium,
                         "specs": specs(host, medium, key, names)}})
}

/// Per key, `(type, [(spec name, uri)])` of each answered location.
type KeyAnswer = Vec<(String, Vec<(String, String)>)>;

async fn by_backend(
    server: &TestServer,
    keys: &[i64],
    names: &[&str],
    selectors: Value,
) -> Vec<KeyAnswer> {
    let body = json!({"trace_id": "bb", "instance_id": "inst", "query_type": "QT_BATCH_GET",
                      "block_keys": keys, "location_spec_names": names,
                      "backend_selectors": selectors});
    let answer = server.meta_http("getCacheLocationsByBackend", body).await;
    assert_eq!(code(&answer), "OK", "{answer}");
    let vectors = answer["key_locations"].as_array().expect("key_locations");
    assert_eq!(vectors.len(), keys.len(), "one vector per key: {answer}");
    vectors
        .iter()
        .map(|vector| {
            let locations = vector["locations"].as_array().expect("locations").iter();
            locations
                .map(|location| {
                    let specs = location["location_specs"].as_array().expect("specs");
                    assert_eq!(
                        location["spec_size"],
                        specs.len(),
                        "spec_size counts the answered specs"
                    );
                    let specs = specs.iter().map(|s| {
                        (
                            s["name"].as_str().unwrap().to_string(),
                            s["uri"].as_str().unwrap().to_string(),
                        )
                    });
                    (
                        location["type"].as_str().unwrap().to_string(),
                        specs.collect(),
                    )
                })
                .collect()
        })
        .collect()
}

/// The `host:port` of each key's answered locations (`-` for a key without one), reporters
/// only.
fn peers(answers: &[KeyAnswer]) -> Vec<String> {
    answers
        .iter()
        .map(|locations| match locations.first() {
            Some((_, specs)) => {
                let uri = &specs[0].1;
                assert_eq!(uri.matches("s_version=").count(), 1, "{uri}");
                let rest = uri.strip_prefix("event_report://").expect("a reported uri");
                rest.split('/').next().unwrap().to_string()
            }
            None => "-".to_string(),
        })
        .collect()
}

#[tokio::test]
async fn by_backend_chooses_per_key_by_prefix_coverage_and_weight() {
    let server = TestServer::start().await;
    reporting_instance(&server, steady_timings()).await;
    server.write_keys("inst", &[1, 2, 3]).await;
    let l2 = |host: &'static str, events: Vec<Value>| {
        report(&server, host, "ST_EVENT_REPORT_L2", events)
    };
    // b: 1 {F0}, 2 {F0, L1}; c: 1 and 2 {F0, L1}; d: 1, 3, 4 {F0}; e (L1.5): everything.
    l2(
        "b:1",
        vec![
            add_specs("b:1", "gpu", 1, &["F0"]),
            add_specs("b:1", "gpu", 2, &["F0", "L1"]),
        ],
    )
    .await;
    l2(
        "c:1",
        vec![
            add_specs("c:1", "gpu", 1, &["F0", "L1"]),
            add_specs("c:1", "gpu", 2, &["F0", "L1"]),
        ],
    )
    .await;
    l2(
        "d:1",
        vec![
            add("d:1", "gpu", 1),
            add("d:1", "gpu", 3),
            add("d:1", "gpu", 4),
        ],
    )
    .await;
    l1(
        &server,
        "e:1",
        vec![add("e:1", "gpu", 1), add("e:1", "gpu", 2)],
    )
    .await;
    let keys = [1, 2, 3, 4];
    let l2_by =
        |strategy: &str| json!([{"backend_type": "ST_EVENT_REPORT_L2", "strategy": strategy}]);

    // Prefix: b and c tie at 2 — the endpoint decides (b); coverage: d holds 3 keys.
    let prefix = by_backend(&server, &keys, &[], l2_by("LSS_V6D_PREFIX")).await;
    assert_eq!(peers(&prefix), ["b:1", "b:1", "-", "-"]);
    assert_eq!(prefix[0][0].0, "ST_EVENT_REPORT_L2");
    assert_eq!(
        prefix[1][0]
            .1
            .iter()
            .map(|s| s.0.as_str())
            .collect::<Vec<_>>(),
        ["F0", "L1"]
    );
    let coverage = by_backend(&server, &keys, &[], l2_by("LSS_V6D_COVERAGE")).await;
    assert_eq!(peers(&coverage), ["d:1", "-", "d:1", "d:1"]);
    // Per-key spec names filter before the choice: only c holds L1 of key 1.
    let named = by_backend(&server, &[1, 2], &["L1", "L1"], l2_by("LSS_V6D_PREFIX")).await;
    assert_eq!(peers(&named), ["c:1", "c:1"]);
    assert_eq!(named[0][0].1.len(), 1, "only the asked spec");
    assert_eq!(named[0][0].1[0].0, "L1");
    // An unregistered spec: nothing for that key (and a prefix from it is empty).
    let unknown = by_backend(&server, &[1, 2], &["zz", "F0"], l2_by("LSS_V6D_COVERAGE")).await;
    assert_eq!(peers(&unknown), ["-", "b:1"]);
    let unknown = by_backend(&server, &[1, 2], &["zz", "F0"], l2_by("LSS_V6D_PREFIX")).await;
    assert_eq!(peers(&unknown), ["-", "-"]);
    // Weighted random draws among the holders of each key, one tier only.
    let random = by_backend(&server, &keys, &[], l2_by("LSS_WEIGHTED_RANDOM")).await;
    let drawn = peers(&random);
    assert!(
        ["b:1", "c:1", "d:1"].contains(&drawn[0].as_str()),
        "{drawn:?}"
    );
    assert!(["b:1", "c:1"].contains(&drawn[1].as_str()), "{drawn:?}");
    assert_eq!(&drawn[2..], ["d:1", "d:1"]);
    // kvcm's own storage type beside a reported one, in selector order.
    let both = json!([{"backend_type": "ST_NFS", "strategy": "LSS_WEIGHTED_RANDOM"},
                      {"backend_type": "ST_EVENT_REPORT_L1P5", "strategy": "LSS_V6D_PREFIX"}]);
    let mixed = by_backend(&server, &keys, &[], both).await;
    let types: Vec<Vec<&str>> = mixed
        .iter()
        .map(|l| l.iter().map(|(t, _)| t.as_str()).collect())
        .collect();
    assert_eq!(
        types,
        [
            vec!["ST_NFS", "ST_EVENT_REPORT_L1P5"],
            vec!["ST_NFS", "ST_EVENT_REPORT_L1P5"],
            vec!["ST_NFS"],
            vec![]
        ]
    );
    assert!(
        mixed[0][0].1[0].1.starts_with("file://default_file/"),
        "{mixed:?}"
    );
    // A reporter that went down is not chosen.
    l2("b:1", vec![host_down()]).await;
    let after = by_backend(&server, &keys, &[], l2_by("LSS_V6D_PREFIX")).await;
    assert_eq!(peers(&after), ["c:1", "c:1", "-", "-"]);

    // gRPC answers the same choice.
    let mut client = server.meta().await;
    let answer = client
        .get_cache_locations_by_backend(meta::GetCacheLocationsByBackendRequest {
            trace_id: "g".into(),
            instance_id: "inst".into(),
            query_type: meta::QueryType::QtBatchGet as i32,
            block_keys: keys.to_vec(),
            backend_selectors: vec![meta::BackendLocationSelector {
                backend_type: meta::StorageType::StEventReportL2 as i32,
                strategy: meta::LocationSelectStrategy::LssV6dCoverage as i32,
            }],
            ..Default::default()
        })
        .await
        .expect("grpc")
        .into_inner();
    assert_eq!(grpc_code(&answer.header), meta::ErrorCode::Ok);
    let counts: Vec<usize> = answer
        .key_locations
        .iter()
        .map(|v| v.locations.len())
        .collect();
    assert_eq!(counts, [1, 0, 1, 1]);

    // Bad requests.
    let refused = [
        json!({"query_type": "QT_PREFIX_MATCH"}),
        json!({"location_spec_names": ["F0"]}),
        json!({"location_spec_names": ["F0", "", "F0", "F0"]}),
        json!({"backend_selectors": [{"backend_type": 42}]}),
        json!({"backend_selectors": [{"backend_type": "ST_UNSPECIFIED"}]}),
        json!({"backend_selectors": [{"backend_type": "ST_NFS", "strategy": "LSS_V6D_PREFIX"}]}),
        json!({"backend_selectors": [{"backend_type": "ST_NFS", "strategy": 9}]}),
        json!({"backend_selectors": []}),
        // Each selector may add a location per key: a long list would multiply the answer.
        json!({"backend_selectors": vec![json!({"backend_type": "ST_NFS"}); 17]}),
    ];
    for extra in refused {
        let body = json!({"instance_id": "inst", "query_type": "QT_BATCH_GET", "block_keys": keys,
                          "backend_selectors": [{"backend_type": "ST_NFS"}]});
        let body = with_fields(body, &extra);
        let answer = server.meta_http("getCacheLocationsByBackend", body).await;
        assert_eq!(code(&answer), "INVALID_ARGUMENT", "{extra}: {answer}");
    }
    let most = json!({"instance_id": "inst", "query_type": "QT_BATCH_GET", "block_keys": keys,
                      "backend_selectors": vec![json!({"backend_type": "ST_NFS"}); 16]});
    let answer = server.meta_http("getCacheLocationsByBackend", most).await;
    assert_eq!(code(&answer), "OK", "16 selectors: {answer}");
}

#[tokio::test]
async fn reporters_per_instance_are_capped_and_known_ones_keep_reporting() {
    let server = TestServer::start_with(&["kvcm.service.max_reporters_per_instance=2"]).await;
    reporting_instance(&server, steady_timings()).await;
    assert_eq!(code(&l1(&server, "a:1", vec![heartbeat()]).await), "OK");
    let other_tier = report(&server, "a:1", "ST_EVENT_REPORT_L2", vec![heartbeat()]).await;
    assert_eq!(code(&other_tier), "OK", "{other_tier}");
    let third = l1(&server, "b:1", vec![add("b:1", "gpu", 1)]).await;
    assert_eq!(code(&third), "REACH_MAX_ENTITY_CAPACITY", "{third}");
    let message = third["header"]["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("kvcm.service.max_reporters_per_instance"),
        "{message}"
    );
    assert!(
        host_state(&server, &[1], json!({})).await.is_empty(),
        "nothing stored"
    );
    assert_eq!(
        code(&l1(&server, "a:1", vec![add("a:1", "gpu", 1)]).await),
        "OK"
    );
}

/// A GetCacheLocation over HTTP: its locations as `(type, spec_size, [(name, uri without
/// s_version)])`.
async fn cache_locations(
    server: &TestServer,
    query_type: &str,
    keys: &[i64],
    spec_names: &[&str],
) -> Vec<(String, i64, Vec<(String, String)>)> {
    let body = json!({"trace_id": "loc", "instance_id": "inst", "query_type": query_type,
                      "block_keys": keys, "location_spec_names": spec_names});
    let answer = server.meta_http("getCacheLocation", body).await;
    assert_eq!(code(&answer), "OK", "{answer}");
    let locations = answer["locations"].as_array().expect("locations");
    let unversioned = |uri: &str| uri.split("&s_version=").next().unwrap_or("").to_string();
    locations
        .iter()
        .map(|location| {
            let specs = location["location_specs"].as_array().expect("specs");
            let specs = specs.iter().map(|spec| {
                let uri = spec["uri"].as_str().unwrap_or("");
                (spec["name"].as_str().unwrap().to_string(), unversioned(uri))
            });
            (
                location["type"].as_str().unwrap().to_string(),
                location["spec_size"].as_i64().unwrap(),
                specs.collect(),
            )
        })
        .collect()
}

fn reported_uri(host: &str, medium: &str, key: i64) -> String {
    format!("event_report://{host}/{medium}/{key}?size=64")
}

#[tokio::test]
async fn get_cache_location_answers_the_visible_reported_locations() {
    let server = TestServer::start().await;
    reporting_instance(&server, steady_timings()).await;
    let both = add_specs("a:1", "memory", 1, &["F0", "L1"]);
    let added = l1(&server, "a:1", vec![add("a:1", "gpu", 2), both]).await;
    assert_eq!(code(&added), "OK", "{added}");
    let l2 = report(
        &server,
        "v:1",
        "ST_EVENT_REPORT_L2",
        vec![add("v:1", "gpu", 3)],
    )
    .await;
    assert_eq!(code(&l2), "OK", "{l2}");

    // Prefix match runs over reported keys and stops at the first key nobody holds.
    let l1p5 = |specs: &[(&str, &str, i64)]| {
        let specs = specs
            .iter()
            .map(|(name, medium, key)| (name.to_string(), reported_uri("a:1", medium, *key)));
        (
            "ST_EVENT_REPORT_L1P5".to_string(),
            specs.len() as i64,
            specs.collect::<Vec<_>>(),
        )
    };
    let found = cache_locations(&server, "QT_PREFIX_MATCH", &[1, 2, 3, 4, 5], &[]).await;
    assert_eq!(found.len(), 3, "{found:?}");
    assert_eq!(found[0], l1p5(&[("F0", "memory", 1), ("L1", "memory", 1)]));
    assert_eq!(found[1], l1p5(&[("F0", "gpu", 2)]));
    let l2_location = (
        "ST_EVENT_REPORT_L2".to_string(),
        1,
        vec![("F0".to_string(), reported_uri("v:1", "gpu", 3))],
    );
    assert_eq!(found[2], l2_location);
    let len = server
        .meta_http(
            "getCacheLocationLen",
            json!({"instance_id": "inst",
            "query_type": "QT_PREFIX_MATCH", "block_keys": [1, 2, 3, 4, 5]}),
        )
        .await;
    assert_eq!(len["cache_location_len"], "3", "{len}");

    // A spec-name filter keeps spec_size; a batch get answers misses with placeholders.
    let filtered = cache_locations(&server, "QT_BATCH_GET", &[1, 9], &["L1"]).await;
    let placeholder = (
        "ST_UNSPECIFIED".to_string(),
        2,
        vec![("L1".into(), String::new())],
    );
    assert_eq!(
        filtered,
        vec![
            (
                "ST_EVENT_REPORT_L1P5".to_string(),
                2,
                vec![("L1".into(), reported_uri("a:1", "memory", 1))]
            ),
            placeholder
        ]
    );

    // A reporter's mediums holding a key answer as one location: the drawn medium's specs
    // first, then the others' not answered yet.
    assert_eq!(
        code(&l1(&server, "a:1", vec![add("a:1", "gpu", 1)]).await),
        "OK"
    );
    let mut f0_mediums = std::collections::BTreeSet::new();
    for _ in 0..40 {
        let found = cache_locations(&server, "QT_BATCH_GET", &[1], &[]).await;
        let (_, spec_size, specs) = &found[0];
        assert_eq!((*spec_size, specs.len()), (2, 2), "{found:?}");
        assert_eq!(specs[1], ("L1".into(), reported_uri("a:1", "memory", 1)));
        assert_eq!(specs[0].0, "F0");
        f0_mediums.insert(specs[0].1.clone());
    }
    let both_mediums = [
        reported_uri("a:1", "gpu", 1),
        reported_uri("a:1", "memory", 1),
    ];
    assert_eq!(f0_mediums, both_mediums.into_iter().collect());

    // gRPC answers the same.
    let mut meta = server.meta().await;
    let answer = meta
        .get_cache_location(meta::GetCacheLocationRequest {
            trace_id: "loc".into(),
            instance_id: "inst".into(),
            query_type: meta::QueryType::QtPrefixMatch as i32,
            block_keys: vec![2, 3, 4],
            ..Default::default()
        })
        .await
        .expect("grpc")
        .into_inner();
    assert_eq!(grpc_code(&answer.header), meta::ErrorCode::Ok);
    let types: Vec<i32> = answer.locations.iter().map(|l| l.r#type).collect();
    assert_eq!(
        types,
        vec![
            meta::StorageType::StEventReportL1p5 as i32,
            meta::StorageType::StEventReportL2 as i32
        ]
    );
    assert!(answer.locations[0].location_specs[0]
        .uri
        .starts_with(&format!("{}&s_version=", reported_uri("a:1", "gpu", 2))));

    // A reporter that went down is no longer answered; kvcm's own copy still is.
    server.write_keys("inst", &[2]).await;
    assert_eq!(code(&l1(&server, "a:1", vec![host_down()]).await), "OK");
    let after = cache_locations(&server, "QT_PREFIX_MATCH", &[1, 2], &[]).await;
    assert!(after.is_empty(), "key 1 was a:1's only: {after:?}");
    let own = cache_locations(&server, "QT_BATCH_GET", &[2], &[]).await;
    assert_eq!(own[0].0, "ST_NFS", "{own:?}");
}

#[tokio::test]
async fn reported_and_own_locations_are_drawn_by_weight() {
    let server = TestServer::start().await;
    reporting_instance(&server, steady_timings()).await;
    server.write_keys("inst", &[7]).await;
    assert_eq!(
        code(&l1(&server, "a:1", vec![add("a:1", "gpu", 7)]).await),
        "OK"
    );
    let mut reported = 0;
    const DRAWS: usize = 300;
    for _ in 0..DRAWS {
        let found = cache_locations(&server, "QT_BATCH_GET", &[7], &[]).await;
        match found[0].0.as_str() {
            "ST_EVENT_REPORT_L1P5" => reported += 1,
            "ST_NFS" => {}
            other => panic!("{other}: {found:?}"),
        }
    }
    // NFS weighs 5, a reported location 1: 1/6 of the draws (50 ± 6.5) are reported.
    assert!(
        (15..=100).contains(&reported),
        "{reported} of {DRAWS} reported"
    );
}

/// ReportEvent for instance `hyb`.
async fn hybrid_report(server: &TestServer, host: &str, tier: &str, events: Vec<Value>) {
    let body = json!({"instance_id": "hyb", "host_ip_port": host, "storage_type": tier,
                      "events": events});
    let answer = server.meta_http("reportEvent", body).await;
    assert_eq!(code(&answer), "OK", "{answer}");
}

/// GetHostCacheState of `hyb` with `extra` fields.
async fn hybrid_state(server: &TestServer, extra: Value) -> Value {
    let body = json!({"instance_id": "hyb", "block_cache_keys": [1, 2, 3, 4, 5, 6]});
    server
        .meta_http("getHostCacheState", with_fields(body, &extra))
        .await
}

fn hosts_of(answer: &Value) -> Vec<(String, i64, i64)> {
    assert_eq!(code(answer), "OK", "{answer}");
    let number = |v: &Value| v.as_str().unwrap().parse::<i64>().unwrap();
    let hosts = answer["hosts"].as_array().expect("hosts").iter();
    let host = |h: &Value| {
        let name = h["host_ip_port"].as_str().unwrap().to_string();
        (name, number(&h["local"]), number(&h["global"]))
    };
    hosts.map(host).collect()
}

#[tokio::test]
async fn mamba_matching_reuses_full_attention_prefixes_up_to_a_state_snapshot() {
    let server = TestServer::start().await;
    reporting_instance(&server, steady_timings()).await;
    let mut registration = common::registration("hyb", 4);
    registration["instance_group"] = json!("rg");
    registration["default_query_type"] = json!("QT_PREFIX_MATCH_WITH_MAMBA");
    registration["location_spec_infos"] =
        json!([{"name": "F0", "size": 64}, {"name": "L1", "size": 64}]);
    registration["location_spec_groups"] = json!([
        {"name": "F_full", "spec_names": ["F0"]}, {"name": "L_state", "spec_names": ["L1"]}]);
    let registered = server.meta_http("registerInstance", registration).await;
    assert_eq!(code(&registered), "OK", "{registered}");
    let l1p5 = "ST_EVENT_REPORT_L1P5";
    // a:1 holds full attention for keys 1-5 and state for keys 2 and 4: reusable up to 4.
    let mut events: Vec<Value> = (1..=5)
        .map(|k| add_specs("a:1", "gpu", k, &["F0"]))
        .collect();
    events.extend([2, 4].map(|k| add_specs("a:1", "gpu", k, &["F0", "L1"])));
    hybrid_report(&server, "a:1", l1p5, events).await;
    // b:1 holds full attention for 1-3 on gpu and the state of 3 on another medium.
    let mut events: Vec<Value> = (1..=3)
        .map(|k| add_specs("b:1", "gpu", k, &["F0"]))
        .collect();
    events.push(add_specs("b:1", "memory", 3, &["L1"]));
    hybrid_report(&server, "b:1", l1p5, events).await;
    // c:1 holds full attention everywhere but no state: nothing is reusable.
    let events = (1..=6)
        .map(|k| add_specs("c:1", "gpu", k, &["F0"]))
        .collect();
    hybrid_report(&server, "c:1", l1p5, events).await;

    let expected = owned(&[("a:1", 4, 4), ("b:1", 3, 3)]);
    let mamba = json!({"query_type": "QT_PREFIX_MATCH_WITH_MAMBA"});
    assert_eq!(
        hosts_of(&hybrid_state(&server, mamba.clone()).await),
        expected
    );
    assert_eq!(
        hosts_of(&hybrid_state(&server, json!({})).await),
        expected,
        "QT_UNSPECIFIED reads the instance's default"
    );
    let prefix = json!({"query_type": "QT_PREFIX_MATCH"});
    assert_eq!(
        hosts_of(&hybrid_state(&server, prefix).await),
        owned(&[("c:1", 6, 6), ("a:1", 5, 5), ("b:1", 3, 3)]),
        "plain prefix match counts any location"
    );
    let gpu_only = json!({"query_type": "QT_PREFIX_MATCH_WITH_MAMBA", "medium": ["gpu"]});
    assert_eq!(
        hosts_of(&hybrid_state(&server, gpu_only).await),
        owned(&[("a:1", 4, 4)]),
        "b:1's state is on another medium"
    );

    // An L2 peer holding the state of key 5 makes a:1's whole full run reusable.
    let peer = vec![add_specs("p:1", "dram", 5, &["L1"])];
    hybrid_report(&server, "p:1", "ST_EVENT_REPORT_L2", peer).await;
    let remote = json!({"query_type": "QT_PREFIX_MATCH_WITH_MAMBA", "global_kvs_host_count": 1,
                        "enable_p2p": true});
    assert_eq!(
        hosts_of(&hybrid_state(&server, remote.clone()).await),
        owned(&[("a:1", 4, 5), ("b:1", 3, 3)])
    );
    // kvcm's own copy of key 6 (every spec) extends it to the end.
    server.write_keys("hyb", &[6]).await;
    assert_eq!(
        hosts_of(&hybrid_state(&server, remote).await),
        owned(&[("a:1", 4, 6), ("b:1", 3, 3)])
    );

    // An instance without full-attention and mamba-state groups cannot be matched so.
    let refused = server
        .meta_http(
            "getHostCacheState",
            json!({"instance_id": "inst",
            "query_type": "QT_PREFIX_MATCH_WITH_MAMBA", "block_cache_keys": [1]}),
        )
        .await;
    assert_eq!(code(&refused), "INVALID_ARGUMENT", "{refused}");
    let message = refused["header"]["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("no full-attention (F…) location spec group"),
        "{message}"
    );
    let mut other = common::registration("sliding", 4);
    other["instance_group"] = json!("rg");
    other["location_spec_infos"] = json!([{"name": "F0", "size": 64}, {"name": "W0", "size": 64}]);
    other["location_spec_groups"] = json!([
        {"name": "F_full", "spec_names": ["F0"]}, {"name": "W_window", "spec_names": ["W0"]}]);
    assert_eq!(
        code(&server.meta_http("registerInstance", other).await),
        "OK"
    );
    let refused = server
        .meta_http(
            "getHostCacheState",
            json!({"instance_id": "sliding",
            "query_type": "QT_PREFIX_MATCH_WITH_MAMBA", "block_cache_keys": [1]}),
        )
        .await;
    assert_eq!(code(&refused), "INVALID_ARGUMENT", "{refused}");
    let message = refused["header"]["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("\"W_window\" is of category W"),
        "{message}"
    );
}
