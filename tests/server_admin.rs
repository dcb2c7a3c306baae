//! AdminService and DebugService acceptance: storage / group / instance / account CRUD,
//! leadership, metrics and /metrics, over HTTP and gRPC against a real `kvcm serve`.

mod common;

use std::time::Duration;

use common::{admin_code, code, grpc_code, wait_until, TestServer};
use kvcm::proto::admin;
use serde_json::{json, Value};

fn nfs_storage(name: &str, root: &std::path::Path) -> Value {
    json!({"global_unique_name": name,
           "nfs": {"root_path": format!("{}/", root.display()), "key_count_per_file": 4}})
}

fn group(name: &str, storage: &str, version: i64) -> Value {
    json!({"name": name, "storage_candidates": [storage], "global_quota_group_name": "q",
           "quota": {"capacity": "1000000000"},
           "cache_config": {"reclaim_strategy": {"storage_unique_name": storage},
                            "data_storage_strategy": "CPS_PREFER_3FS",
                            "meta_indexer_config": {"mutex_shard_num": 16,
                                "meta_cache_policy_config": {"type": "lru"},
                                "meta_storage_backend_config": {"storage_type": "local"}}},
           "version": version})
}

#[tokio::test]
async fn storage_crud_and_availability() {
    let server = TestServer::start().await;
    let root = server.dir.path().join("nfs2");
    let added = server
        .admin_http(
            "addStorage",
            json!({"storage": nfs_storage("nfs_02", &root)}),
        )
        .await;
    assert_eq!(code(&added), "OK", "{added}");
    let duplicate = server
        .admin_http(
            "addStorage",
            json!({"storage": nfs_storage("nfs_02", &root)}),
        )
        .await;
    assert_eq!(code(&duplicate), "INTERNAL_ERROR");
    let invalid = server
        .admin_http(
            "addStorage",
            json!({"storage": {"global_unique_name": "x", "nfs": {}}}),
        )
        .await;
    assert_eq!(code(&invalid), "INVALID_ARGUMENT", "{invalid}");
    let listed = server.admin_http("listStorage", json!({})).await;
    let names: Vec<&str> = listed["storage"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["global_unique_name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["default_file", "nfs_02"]);

    // Disabling the group's only storage stops reads and writes; enabling restores them.
    server.register("inst", 16).await;
    server.write_keys("inst", &[1]).await;
    let disabled = server
        .admin_http(
            "disableStorage",
            json!({"storage_unique_name": "default_file"}),
        )
        .await;
    assert_eq!(code(&disabled), "OK");
    let read = json!({"instance_id": "inst", "query_type": "QT_PREFIX_MATCH", "block_keys": [1]});
    assert_eq!(
        code(&server.meta_http("getCacheLocation", read.clone()).await),
        "INTERNAL_ERROR"
    );
    let write = json!({"instance_id": "inst", "block_keys": [2], "write_timeout_seconds": 5});
    assert_eq!(
        code(&server.meta_http("startWriteCache", write).await),
        "INTERNAL_ERROR"
    );
    server
        .admin_http(
            "enableStorage",
            json!({"storage_unique_name": "default_file"}),
        )
        .await;
    let found = server.meta_http("getCacheLocation", read).await;
    assert_eq!(found["locations"].as_array().unwrap().len(), 1);
    let unknown = server
        .admin_http("enableStorage", json!({"storage_unique_name": "nope"}))
        .await;
    assert_eq!(code(&unknown), "INTERNAL_ERROR");

    let mut updated = nfs_storage("nfs_02", &root);
    updated["nfs"]["key_count_per_file"] = json!(1);
    assert_eq!(
        code(
            &server
                .admin_http("updateStorage", json!({"storage": updated}))
                .await
        ),
        "OK"
    );
    let removed = server
        .admin_http("removeStorage", json!({"storage_unique_name": "nfs_02"}))
        .await;
    assert_eq!(code(&removed), "OK");
    let listed = server.admin_http("listStorage", json!({})).await;
    assert_eq!(listed["storage"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn group_and_instance_crud() {
    let server = TestServer::start().await;
    let root = server.dir.path().join("nfs3");
    server
        .admin_http(
            "addStorage",
            json!({"storage": nfs_storage("nfs_03", &root)}),
        )
        .await;
    let created = server
        .admin_http(
            "createInstanceGroup",
            json!({"instance_group": group("g2", "nfs_03", 1)}),
        )
        .await;
    assert_eq!(code(&created), "OK", "{created}");
    let again = server
        .admin_http(
            "createInstanceGroup",
            json!({"instance_group": group("g2", "nfs_03", 1)}),
        )
        .await;
    assert_eq!(code(&again), "INTERNAL_ERROR");
    let mut incomplete = group("g3", "nfs_03", 1);
    incomplete["cache_config"]["data_storage_strategy"] = json!("CPS_UNSPECIFIED");
    let rejected = server
        .admin_http("createInstanceGroup", json!({"instance_group": incomplete}))
        .await;
    assert_eq!(code(&rejected), "INVALID_ARGUMENT");

    let fetched = server
        .admin_http("getInstanceGroup", json!({"name": "g2"}))
        .await;
    assert_eq!(
        fetched["instance_group"]["storage_candidates"],
        json!(["nfs_03"])
    );
    assert_eq!(fetched["instance_group"]["version"], "1");
    let stale = server
        .admin_http(
            "updateInstanceGroup",
            json!({"instance_group": group("g2", "nfs_03", 2), "current_version": 5}),
        )
        .await;
    assert_eq!(code(&stale), "INTERNAL_ERROR", "a version conflict");
    let fresh = server
        .admin_http(
            "updateInstanceGroup",
            json!({"instance_group": group("g2", "nfs_03", 2), "current_version": 1}),
        )
        .await;
    assert_eq!(code(&fresh), "OK", "{fresh}");

    let mut registration = common::registration("inst2", 16);
    registration["instance_group"] = json!("g2");
    let registered = server.admin_http("registerInstance", registration).await;
    assert_eq!(code(&registered), "OK");
    assert!(
        registered.get("storage_configs").is_none(),
        "admin answers CommonResponse"
    );
    let start = server.write_keys("inst2", &[5]).await;
    let uri = start["locations"][0]["location_specs"][0]["uri"]
        .as_str()
        .unwrap();
    assert!(
        uri.starts_with("file://nfs_03/"),
        "writes go to the group's storage: {uri}"
    );

    let info = server
        .admin_http("getInstanceInfo", json!({"instance_id": "inst2"}))
        .await;
    assert_eq!(info["instance_info"]["instance_group_name"], "g2");
    let listed = server
        .admin_http("listInstanceInfo", json!({"instance_group_name": "g2"}))
        .await;
    assert_eq!(listed["instance_info"].as_array().unwrap().len(), 1);
    let empty_name = server.admin_http("listInstanceInfo", json!({})).await;
    assert_eq!(code(&empty_name), "INVALID_ARGUMENT");
    let unknown_group = server
        .admin_http("listInstanceInfo", json!({"instance_group_name": "none"}))
        .await;
    assert_eq!(
        (code(&unknown_group), &unknown_group["instance_info"]),
        ("OK", &json!([]))
    );

    let removed = server
        .admin_http("removeInstance", json!({"instance_id": "inst2"}))
        .await;
    assert_eq!(code(&removed), "OK");
    let gone = server
        .admin_http("getInstanceInfo", json!({"instance_id": "inst2"}))
        .await;
    assert_eq!(
        code(&gone),
        "INSTANCE_NOT_EXIST",
        "trunk: not INTERNAL_ERROR"
    );
    assert_eq!(
        code(
            &server
                .admin_http("removeInstanceGroup", json!({"name": "g2"}))
                .await
        ),
        "OK"
    );
    let missing = server
        .admin_http("getInstanceGroup", json!({"name": "g2"}))
        .await;
    assert_eq!(code(&missing), "INTERNAL_ERROR");
}

#[tokio::test]
async fn account_crud() {
    let server = TestServer::start().await;
    let add = |name: &str| json!({"user_name": name, "password": "secret", "role": "ROLE_ADMIN"});
    assert_eq!(
        code(&server.admin_http("addAccount", add("alice")).await),
        "OK"
    );
    assert_eq!(
        code(&server.admin_http("addAccount", add("alice")).await),
        "INTERNAL_ERROR"
    );
    assert_eq!(
        code(&server.admin_http("addAccount", add("")).await),
        "INVALID_ARGUMENT"
    );
    let listed = server.admin_http("listAccount", json!({})).await;
    assert_eq!(
        listed["accounts"],
        json!([{"user_name": "alice", "role": "ROLE_ADMIN"}])
    );
    assert_eq!(
        code(
            &server
                .admin_http("deleteAccount", json!({"user_name": "alice"}))
                .await
        ),
        "OK"
    );
    let unknown = server
        .admin_http("deleteAccount", json!({"user_name": "alice"}))
        .await;
    assert_eq!(code(&unknown), "INTERNAL_ERROR");
    assert_eq!(
        server.admin_http("listAccount", json!({})).await["accounts"],
        json!([])
    );
}

/// Every file under `dir` that holds `needle`.
fn files_holding(dir: &std::path::Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_holding(&path, needle));
        } else if let Ok(bytes) = std::fs::read(&path) {
            if bytes.windows(needle.len()).any(|w| w == needle) {
                found.push(path);
            }
        }
    }
    found
}

/// A password never reaches the disk in clear (journal, snapshots): the account is kept with
/// a salted hash, and survives a SIGKILL and a restart.
#[tokio::test]
async fn passwords_are_kept_hashed_at_rest() {
    let server = TestServer::start().await;
    let password = "correct horse battery staple";
    let account = json!({"user_name": "carol", "password": password, "role": "ROLE_USER"});
    assert_eq!(code(&server.admin_http("addAccount", account).await), "OK");
    let data_dir = server.dir.path();
    let hashed = files_holding(data_dir, b"pbkdf2-sha256$");
    assert!(!hashed.is_empty(), "the account's record holds its hash");
    let in_clear = files_holding(data_dir, password.as_bytes());
    assert!(in_clear.is_empty(), "{in_clear:?}");

    let server = server.kill_and_restart().await;
    assert_eq!(
        server.admin_http("listAccount", json!({})).await["accounts"],
        json!([{"user_name": "carol", "role": "ROLE_USER"}])
    );
    let in_clear = files_holding(server.dir.path(), password.as_bytes());
    assert!(in_clear.is_empty(), "after recovery: {in_clear:?}");
    assert!(!server.log().contains(password), "nor in the log");
}

#[tokio::test]
async fn metrics_count_every_api_over_rpc_and_prometheus() {
    let server = TestServer::start().await;
    let root = server.dir.path().join("nfs4");
    server
        .admin_http(
            "addStorage",
            json!({"storage": nfs_storage("nfs_04", &root)}),
        )
        .await;
    server.admin_http("listStorage", json!({})).await;
    server.register("inst", 16).await;
    let query = json!({"instance_id": "inst", "query_type": "QT_BATCH_GET", "block_keys": [1]});
    server.meta_http("getCacheLocation", query).await;
    let unknown = json!({"instance_id": "nobody", "block_keys": [1]});
    let answer = server.meta_http("getCacheMeta", unknown).await;
    assert_eq!(code(&answer), "INSTANCE_NOT_EXIST");
    let metrics = server.admin_http("getMetrics", json!({})).await;
    assert_eq!(code(&metrics), "OK");
    let per_instance = metrics["metrics"].as_array().unwrap().iter().any(|m| {
        m["metric_name"] == "service.query_counter"
            && m["metric_tags"]
                == json!([{"tag_key": "api_name", "tag_value": "GetCacheLocation"},
                          {"tag_key": "instance_group", "tag_value": "default"},
                          {"tag_key": "instance_id", "tag_value": "inst"}])
    });
    assert!(per_instance, "per-instance series: {metrics}");
    assert!(
        metrics["timestamp"].is_string(),
        "int64 printed as a string"
    );
    let find = |name: &str, api: &str| -> Value {
        metrics["metrics"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["metric_name"] == name && m["metric_tags"][0]["tag_value"] == api)
            .unwrap_or_else(|| panic!("{name} for {api} in {metrics}"))["metric_value"]
            .clone()
    };
    for api in ["AddStorage", "ListStorage", "GetCacheMeta"] {
        let count: i64 = find("service.query_counter", api)["int_value"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(count, 1);
        let rt_us = find("service.query_rt_us", api)["float_value"]
            .as_f64()
            .unwrap();
        assert!(rt_us > 1.0, "{api}: the whole call is timed, {rt_us} µs");
    }
    let (status, text) =
        common::http_request(server.address("admin_http"), "GET", "/metrics", b"").await;
    let text = String::from_utf8(text).unwrap();
    assert_eq!(status, 200);
    assert!(
        text.contains("service_query_counter{api_name=\"AddStorage\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("service_query_rt_us{api_name=\"GetMetrics\"}"),
        "{text}"
    );
}

/// The `instance_id` tags of GetMetrics and of `GET /metrics` on the admin port.
async fn instances_in_metrics(server: &TestServer) -> (Vec<String>, String) {
    let metrics = server.admin_http("getMetrics", json!({})).await;
    assert_eq!(code(&metrics), "OK", "{metrics}");
    let mut ids: Vec<String> = metrics["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["metric_tags"].as_array().unwrap().clone())
        .filter(|tag| tag["tag_key"] == "instance_id")
        .map(|tag| tag["tag_value"].as_str().unwrap().to_string())
        .collect();
    // Several metric families carry an instance's tags (service and capacity series).
    ids.sort();
    ids.dedup();
    let (status, text) =
        common::http_request(server.address("admin_http"), "GET", "/metrics", b"").await;
    assert_eq!(status, 200);
    (ids, String::from_utf8(text).unwrap())
}

#[tokio::test]
async fn a_removed_instance_takes_its_metric_series_with_it() {
    let server = TestServer::start().await;
    let lookup = |instance: &str| json!({"instance_id": instance, "query_type": "QT_BATCH_GET", "block_keys": [1]});
    server.register("gone", 16).await;
    server.meta_http("getCacheLocation", lookup("gone")).await;
    let (ids, text) = instances_in_metrics(&server).await;
    assert_eq!(ids, ["gone"]);
    assert!(text.contains(r#"instance_id="gone"} 1"#), "{text}");

    let removed = server
        .admin_http("removeInstance", json!({"instance_id": "gone"}))
        .await;
    assert_eq!(code(&removed), "OK", "{removed}");
    let (ids, text) = instances_in_metrics(&server).await;
    assert!(ids.is_empty(), "{ids:?}");
    assert!(!text.contains("instance_id="), "{text}");
    let unknown = server.meta_http("getCacheLocation", lookup("gone")).await;
    assert_eq!(code(&unknown), "INSTANCE_NOT_EXIST");
    assert!(instances_in_metrics(&server).await.0.is_empty());

    server.register("fresh", 16).await;
    server.register("gone", 16).await;
    server.meta_http("getCacheLocation", lookup("fresh")).await;
    server.meta_http("getCacheLocation", lookup("gone")).await;
    let (ids, text) = instances_in_metrics(&server).await;
    assert_eq!(ids, ["fresh", "gone"]);
    let series = |id: &str| {
        format!(
            r#"service_query_counter{{api_name="GetCacheLocation",instance_group="default",instance_id="{id}"}} 1"#
        )
    };
    assert!(text.contains(&series("fresh")), "{text}");
    assert!(text.contains(&series("gone")), "counted afresh: {text}");
}

#[tokio::test]
async fn demotion_rejects_leader_only_calls_fails_sessions_and_recovers() {
    let server = TestServer::start().await;
    server.register("inst", 16).await;
    let health = server.admin_http("checkHealth", json!({})).await;
    assert_eq!(
        (health["is_leader"].clone(), health["is_health"].clone()),
        (json!(true), json!(true))
    );
    let cluster = server.admin_http("getManagerClusterInfo", json!({})).await;
    assert!(!cluster["self_node_id"].as_str().unwrap().is_empty());
    assert_eq!(cluster["leader_node_id"], cluster["self_node_id"]);

    let start = server
        .meta_http(
            "startWriteCache",
            json!({"instance_id": "inst", "block_keys": [3], "write_timeout_seconds": 600}),
        )
        .await;
    assert_eq!(code(&start), "OK");
    let config = json!({"campaign_delay_time_ms": 400});
    assert_eq!(
        code(&server.admin_http("updateLeaderElectorConfig", config).await),
        "OK"
    );
    let elector = server.admin_http("getLeaderElectorConfig", json!({})).await;
    assert_eq!(elector["campaign_delay_time_ms"], "400");
    assert_eq!(
        code(&server.admin_http("leaderDemote", json!({})).await),
        "OK"
    );
    let health = server.admin_http("checkHealth", json!({})).await;
    assert_eq!(health["is_leader"], json!(false), "printed even when false");
    let refused = server.register("other", 16).await;
    assert_eq!(code(&refused), "SERVER_NOT_LEADER");
    assert_eq!(
        code(&server.admin_http("listStorage", json!({})).await),
        "SERVER_NOT_LEADER"
    );
    assert_eq!(
        code(&server.admin_http("leaderDemote", json!({})).await),
        "SERVER_NOT_LEADER"
    );

    let back = wait_until(Duration::from_secs(5), async || {
        let health = server.admin_http("checkHealth", json!({})).await;
        (health["is_leader"] == json!(true)).then_some(())
    })
    .await;
    assert!(back.is_some(), "the node campaigns again after the delay");
    let cleaned = wait_until(Duration::from_secs(5), async || {
        (server.statuses("inst", &[3]).await == ["CLS_NOT_FOUND"]).then_some(())
    })
    .await;
    assert!(cleaned.is_some(), "demotion failed the open session");
}

#[tokio::test]
async fn demotion_with_the_default_campaign_delay_lasts_an_elector_period() {
    let server = TestServer::start().await;
    let elector = server.admin_http("getLeaderElectorConfig", json!({})).await;
    assert_eq!(elector["campaign_delay_time_ms"], "0");
    let demote = server.admin_http("leaderDemote", json!({})).await;
    assert_eq!(code(&demote), "OK");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let health = server.admin_http("checkHealth", json!({})).await;
    assert_eq!(health["is_leader"], json!(false));
    assert_eq!(
        code(&server.admin_http("leaderDemote", json!({})).await),
        "SERVER_NOT_LEADER"
    );
    let back = wait_until(Duration::from_secs(5), async || {
        let health = server.admin_http("checkHealth", json!({})).await;
        (health["is_leader"] == json!(true)).then_some(())
    })
    .await;
    assert!(
        back.is_some(),
        "the node campaigns again after one loop period"
    );
}

#[tokio::test]
async fn a_follower_answers_not_leader_before_checking_the_instance() {
    let server = TestServer::start().await;
    server.register("known", 16).await;
    let config = json!({"campaign_delay_time_ms": 60_000});
    assert_eq!(
        code(&server.admin_http("updateLeaderElectorConfig", config).await),
        "OK"
    );
    assert_eq!(
        code(&server.admin_http("leaderDemote", json!({})).await),
        "OK"
    );
    let apis = [
        "getCacheMeta",
        "getCacheLocation",
        "startWriteCache",
        "finishWriteCache",
        "removeCache",
        "trimCache",
    ];
    for api in apis {
        for instance_id in ["unknown", "known"] {
            let body = json!({"instance_id": instance_id, "block_keys": [1]});
            let answer = server.meta_http(api, body).await;
            assert_eq!(code(&answer), "SERVER_NOT_LEADER", "{api} {instance_id}");
        }
    }
    let request = kvcm::proto::meta::GetCacheLocationRequest {
        instance_id: "unknown".into(),
        block_keys: vec![1],
        ..Default::default()
    };
    let answer = server.meta().await.get_cache_location(request).await;
    let header = answer.expect("grpc ok").into_inner().header;
    assert_eq!(
        grpc_code(&header),
        kvcm::proto::meta::ErrorCode::ServerNotLeader
    );
}

#[tokio::test]
async fn unimplemented_and_logger_calls_answer_documented_codes() {
    let server = TestServer::start().await;
    assert_eq!(
        code(&server.admin_http("genConfigSnapshot", json!({})).await),
        "INTERNAL_ERROR"
    );
    assert_eq!(
        code(&server.admin_http("loadConfigSnapshot", json!({})).await),
        "INTERNAL_ERROR"
    );
    assert_eq!(
        code(
            &server
                .admin_http("updateLogger", json!({"log_level": "debug"}))
                .await
        ),
        "OK"
    );
    let bad = server
        .admin_http("updateLogger", json!({"log_level": "loud"}))
        .await;
    assert_eq!(code(&bad), "INVALID_ARGUMENT");
}

#[tokio::test]
async fn update_logger_changes_the_level_of_the_running_server() {
    let server = TestServer::start().await;
    server.admin_http("listAccount", json!({})).await;
    assert!(server.log().contains("listening grpc on"));
    assert!(
        !server.log().contains("served"),
        "INFO hides per-request lines"
    );
    let updated = server
        .admin_http("updateLogger", json!({"log_level": "debug"}))
        .await;
    assert_eq!(code(&updated), "OK");
    server.admin_http("listAccount", json!({})).await;
    let logged = wait_until(Duration::from_secs(5), async || {
        let log = server.log();
        (log.contains("served") && log.contains("ListAccount")).then_some(())
    })
    .await;
    assert!(logged.is_some(), "DEBUG shows them: {}", server.log());
}

#[tokio::test]
async fn admin_and_debug_grpc_share_the_main_port() {
    let server = TestServer::start().await;
    let mut client = server.admin().await;
    let listed = client
        .list_storage(admin::ListStorageRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(admin_code(&listed.header), admin::ErrorCode::Ok);
    assert_eq!(listed.storage[0].global_unique_name, "default_file");
    let health = client
        .check_health(admin::CheckHealthRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(health.is_leader && health.is_health);
    let channel =
        tonic::transport::Channel::from_shared(format!("http://{}", server.address("grpc")))
            .unwrap()
            .connect()
            .await
            .unwrap();
    let mut debug = kvcm::proto::debug::debug_service_client::DebugServiceClient::new(channel);
    let cleared = debug
        .clear_faults(kvcm::proto::debug::ClearFaultsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cleared.header.unwrap().status.unwrap().code, 1);
}

#[tokio::test]
async fn a_separate_admin_rpc_port_serves_admin_but_not_meta() {
    // 0 means "share the main port", so a free port is picked here (released just before).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let setting = format!("kvcm.service.admin_rpc_port={port}");
    let server = TestServer::start_with(&[setting.as_str()]).await;
    let admin_address = format!("http://{}", server.address("admin_grpc"));
    assert_eq!(server.address("admin_grpc").port(), port);
    let mut client =
        admin::admin_service_client::AdminServiceClient::connect(admin_address.clone())
            .await
            .unwrap();
    let health = client
        .check_health(admin::CheckHealthRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(health.is_leader);
    let mut meta_on_admin =
        kvcm::proto::meta::meta_service_client::MetaServiceClient::connect(admin_address)
            .await
            .unwrap();
    let status = meta_on_admin
        .get_instance_info(kvcm::proto::meta::GetInstanceInfoRequest::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unimplemented);
    let status = server
        .admin()
        .await
        .check_health(admin::CheckHealthRequest::default())
        .await
        .unwrap_err();
    assert_eq!(
        status.code(),
        tonic::Code::Unimplemented,
        "admin left the main port"
    );
}
