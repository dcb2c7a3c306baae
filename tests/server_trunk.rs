//! Wire parity with upstream trunk (issue 13, trunk line "M" of the wire delta): the newer
//! RPCs, fields, codes and ops routes, over HTTP and gRPC against a real `kvcm serve`.

mod common;

use common::{admin_code, code, grpc_code, new_keys, nfs_group, nfs_storage, TestServer};
use kvcm::proto::{admin, meta};
use serde_json::{json, Value};

/// Adds NFS storages `names` (in their own directories) and a group `g` over them, in
/// that order, and registers `inst` in it.
async fn instance_over_storages(server: &TestServer, names: &[&str]) {
    for name in names {
        let root = server.dir.path().join(name);
        let added = server
            .admin_http("addStorage", json!({"storage": nfs_storage(name, &root)}))
            .await;
        assert_eq!(code(&added), "OK", "{added}");
    }
    let created = server
        .admin_http(
            "createInstanceGroup",
            json!({"instance_group": nfs_group("g", names)}),
        )
        .await;
    assert_eq!(code(&created), "OK", "{created}");
    let mut registration = common::registration("inst", 16);
    registration["instance_group"] = json!("g");
    let registered = server.meta_http("registerInstance", registration).await;
    assert_eq!(code(&registered), "OK", "{registered}");
}

/// The storage name of every spec URI of a JSON `locations` array (`file://<name>/...`).
fn storages_of(locations: &Value) -> Vec<String> {
    common::uris(locations)
        .iter()
        .map(|uri| {
            let rest = uri.strip_prefix("file://").expect("a file URI");
            rest.split('/').next().expect("a storage name").to_string()
        })
        .collect()
}

async fn location_len(server: &TestServer, body: Value) -> Value {
    server.meta_http("getCacheLocationLen", body).await
}

#[tokio::test]
async fn get_cache_location_len_counts_the_hits_of_each_query_type() {
    let server = TestServer::start().await;
    server.register("inst", 16).await;
    server.write_keys("inst", &[1, 2, 3]).await;
    let len = |query_type: &str, keys: &[i64], sw_size: i32| {
        json!({"trace_id": "t", "instance_id": "inst", "query_type": query_type,
               "block_keys": keys, "sw_size": sw_size})
    };
    let cases = [
        ("QT_PREFIX_MATCH", vec![1, 2, 3, 4], 0, "3"),
        ("QT_PREFIX_MATCH", vec![5, 1, 2], 0, "0"),
        ("QT_BATCH_GET", vec![1, 5, 3, 6], 0, "2"),
        ("QT_REVERSE_ROLL_SW_MATCH", vec![1, 2, 5, 3], 2, "2"),
        ("QT_REVERSE_ROLL_SW_MATCH", vec![1, 5, 2, 6], 2, "0"),
    ];
    for (query_type, keys, sw_size, expected) in &cases {
        let answer = location_len(&server, len(query_type, keys, *sw_size)).await;
        assert_eq!(code(&answer), "OK", "{answer}");
        assert_eq!(
            answer["cache_location_len"].as_str().unwrap_or("0"),
            *expected,
            "{query_type} {keys:?}: {answer}"
        );
    }

    // The same over gRPC, tokens hashed with the instance's block size like GetCacheLocation.
    let mut client = server.meta().await;
    let answer = client
        .get_cache_location_len(meta::GetCacheLocationLenRequest {
            trace_id: "t".into(),
            instance_id: "inst".into(),
            query_type: meta::QueryType::QtBatchGet as i32,
            block_keys: vec![3, 2, 9],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grpc_code(&answer.header), meta::ErrorCode::Ok);
    assert_eq!(answer.cache_location_len, 2);

    // Bad input: the documented codes, as GetCacheLocation answers them.
    let unknown = location_len(
        &server,
        json!({"instance_id": "nobody", "query_type": "QT_BATCH_GET", "block_keys": [1]}),
    )
    .await;
    assert_eq!(code(&unknown), "INSTANCE_NOT_EXIST", "{unknown}");
    let no_keys = location_len(
        &server,
        json!({"instance_id": "inst", "query_type": "QT_BATCH_GET"}),
    )
    .await;
    assert_eq!(code(&no_keys), "INVALID_ARGUMENT", "{no_keys}");
    let window = location_len(&server, len("QT_REVERSE_ROLL_SW_MATCH", &[1, 2], 3)).await;
    assert_eq!(code(&window), "INVALID_ARGUMENT", "{window}");
    let answer = client
        .get_cache_location_len(meta::GetCacheLocationLenRequest {
            instance_id: "inst".into(),
            query_type: 77,
            block_keys: vec![1],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        grpc_code(&answer.header),
        meta::ErrorCode::InvalidArgument,
        "an unknown numeric query type"
    );
}

#[tokio::test]
async fn min_replica_count_adds_a_replica_on_another_storage_until_enough() {
    let server = TestServer::start().await;
    instance_over_storages(&server, &["nfs_a", "nfs_b"]).await;
    let first = server.write_keys("inst", &[1]).await;
    assert_eq!(storages_of(&first["locations"]), ["nfs_a"]);

    // Default (and 1): key 1 is present, key 2 gets its first location.
    let start = |keys: &[i64], min: i32| {
        json!({"instance_id": "inst", "block_keys": keys, "write_timeout_seconds": 30,
               "min_replica_count": min})
    };
    let plain = server.meta_http("startWriteCache", start(&[1, 2], 1)).await;
    assert_eq!(code(&plain), "OK", "{plain}");
    assert_eq!(plain["block_mask"], json!({"offset": 1}), "{plain}");
    assert_eq!(storages_of(&plain["locations"]), ["nfs_a"]);
    let finish = |session: &Value, count: usize| {
        json!({"instance_id": "inst", "write_session_id": session,
               "success_blocks": {"offset": count}})
    };
    let done = server
        .meta_http("finishWriteCache", finish(&plain["write_session_id"], 1))
        .await;
    assert_eq!(code(&done), "OK", "{done}");

    // Two replicas asked: both keys have one, each gets a second one on the storage that
    // does not hold it yet.
    let twice = server.meta_http("startWriteCache", start(&[1, 2], 2)).await;
    assert_eq!(code(&twice), "OK", "{twice}");
    assert_eq!(twice["block_mask"], json!({"offset": 0}), "{twice}");
    assert_eq!(storages_of(&twice["locations"]), ["nfs_b", "nfs_b"]);
    // While they are written, the in-flight replicas count: nothing more is allocated.
    let again = server.meta_http("startWriteCache", start(&[1, 2], 2)).await;
    assert_eq!(again["block_mask"], json!({"offset": 2}), "{again}");
    assert_eq!(again["locations"], json!([]));
    let done = server
        .meta_http("finishWriteCache", finish(&twice["write_session_id"], 2))
        .await;
    assert_eq!(code(&done), "OK", "{done}");

    // Enough replicas (gRPC): keys 1 and 2 are skipped, the absent key 3 gets its first
    // location on the first storage.
    let mut client = server.meta().await;
    let answer = client
        .start_write_cache(meta::StartWriteCacheRequest {
            instance_id: "inst".into(),
            block_keys: vec![1, 2, 3],
            write_timeout_seconds: 30,
            min_replica_count: 2,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grpc_code(&answer.header), meta::ErrorCode::Ok);
    assert_eq!(new_keys(&[1, 2, 3], answer.block_mask), [3]);
    let uri = &answer.locations[0].location_specs[0].uri;
    assert!(uri.starts_with("file://nfs_a/"), "{uri}");

    // More replicas than storages: a key that every storage holds is skipped.
    let three = server.meta_http("startWriteCache", start(&[1, 2], 3)).await;
    assert_eq!(code(&three), "OK", "{three}");
    assert_eq!(three["block_mask"], json!({"offset": 2}), "{three}");
    assert_eq!(three["locations"], json!([]));

    let negative = server.meta_http("startWriteCache", start(&[4], -1)).await;
    assert_eq!(code(&negative), "INVALID_ARGUMENT", "{negative}");
    let message = negative["header"]["status"]["message"].as_str().unwrap();
    assert!(message.contains("min_replica_count"), "{message}");
}

#[tokio::test]
async fn group_trunk_fields_are_stored_listed_and_survive_a_restart() {
    let server = TestServer::start().await;
    let root = server.dir.path().join("nfs_t");
    let added = server
        .admin_http(
            "addStorage",
            json!({"storage": nfs_storage("nfs_t", &root)}),
        )
        .await;
    assert_eq!(code(&added), "OK", "{added}");
    let mut trunk = nfs_group("trunk", &["nfs_t"]);
    trunk["extra_info"] = json!("{\"tier\":\"gold\"}");
    trunk["revisit_interval_buckets"] = json!("1,5,30,60");
    trunk["cache_config"]["meta_indexer_config"]["mutex_enabled"] = json!(false);
    let created = server
        .admin_http("createInstanceGroup", json!({"instance_group": trunk}))
        .await;
    assert_eq!(code(&created), "OK", "{created}");

    // Bad buckets: INVALID_ARGUMENT naming the field; nothing created or changed.
    for bad in ["1,,5", "5,1", "0,3", "a", "-1"] {
        let mut refused = nfs_group("refused", &["nfs_t"]);
        refused["revisit_interval_buckets"] = json!(bad);
        let answer = server
            .admin_http("createInstanceGroup", json!({"instance_group": refused}))
            .await;
        assert_eq!(code(&answer), "INVALID_ARGUMENT", "{bad}: {answer}");
        let message = answer["header"]["status"]["message"].as_str().unwrap();
        assert!(message.contains("revisit_interval_buckets"), "{message}");
    }
    let mut stale = nfs_group("trunk", &["nfs_t"]);
    stale["revisit_interval_buckets"] = json!("3,2");
    stale["version"] = json!(2);
    let answer = server
        .admin_http(
            "updateInstanceGroup",
            json!({"instance_group": stale, "current_version": 1}),
        )
        .await;
    assert_eq!(code(&answer), "INVALID_ARGUMENT", "{answer}");

    let check = |group: &Value| {
        assert_eq!(group["extra_info"], "{\"tier\":\"gold\"}", "{group}");
        assert_eq!(group["revisit_interval_buckets"], "1,5,30,60", "{group}");
        assert_eq!(group["version"], "1", "{group}");
        let indexer = &group["cache_config"]["meta_indexer_config"];
        assert_eq!(indexer["mutex_enabled"], false, "{group}");
    };
    let fetched = server
        .admin_http("getInstanceGroup", json!({"name": "trunk"}))
        .await;
    check(&fetched["instance_group"]);

    // ListInstanceGroup: every group, by name, over HTTP and gRPC.
    let listed = server.admin_http("listInstanceGroup", json!({})).await;
    assert_eq!(code(&listed), "OK", "{listed}");
    let groups = listed["instance_group"].as_array().expect("groups");
    let names: Vec<&str> = groups.iter().map(|g| g["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["default", "trunk"]);
    check(&groups[1]);
    assert_eq!(groups[0]["extra_info"], "", "a group without one");
    let default_indexer = &groups[0]["cache_config"]["meta_indexer_config"];
    assert!(
        default_indexer.get("mutex_enabled").is_none(),
        "absent = enabled: {default_indexer}"
    );
    let mut client = server.admin().await;
    let answer = client
        .list_instance_group(admin::ListInstanceGroupRequest {
            trace_id: "t".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(admin_code(&answer.header), admin::ErrorCode::Ok);
    let fetched = client
        .get_instance_group(admin::GetInstanceGroupRequest {
            trace_id: "t".into(),
            name: "trunk".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.instance_group.len(), 2);
    assert_eq!(answer.instance_group[1], fetched.instance_group.unwrap());
    assert_eq!(
        answer.instance_group[1].revisit_interval_buckets,
        "1,5,30,60"
    );
    let indexer = answer.instance_group[1].cache_config.as_ref().unwrap();
    let indexer = indexer.meta_indexer_config.as_ref().unwrap();
    assert_eq!(indexer.mutex_enabled, Some(false));

    // The registry's encoding carries them through a restart (journal recovery).
    let server = server.kill_and_restart().await;
    let fetched = server
        .admin_http("getInstanceGroup", json!({"name": "trunk"}))
        .await;
    assert_eq!(code(&fetched), "OK", "{fetched}");
    check(&fetched["instance_group"]);
}

async fn instance_info(server: &TestServer) -> Value {
    let body = json!({"instance_id": "inst"});
    server.meta_http("getInstanceInfo", body).await["instance_info"].clone()
}

fn message(answer: &Value) -> &str {
    answer["header"]["status"]["message"].as_str().unwrap_or("")
}

#[tokio::test]
async fn registration_conflicts_unknown_instances_and_block_size_get_trunk_codes() {
    let server = TestServer::start().await;
    assert_eq!(code(&server.register("inst", 16).await), "OK");
    let before = instance_info(&server).await;

    // A changed re-registration: DUPLICATE_ENTITY naming the instance and the field, on
    // both services and both transports; the stored registration is unchanged.
    let mut bigger_blocks = common::registration("inst", 32);
    let mut other_model = common::registration("inst", 16);
    other_model["model_deployment"]["model_name"] = json!("other");
    let mut other_specs = common::registration("inst", 16);
    other_specs["location_spec_infos"] = json!([{"name": "tp0", "size": 2048}]);
    let cases = [
        (&mut bigger_blocks, "block_size"),
        (&mut other_model, "model_deployment"),
        (&mut other_specs, "location_spec_infos"),
    ];
    for (body, field) in cases {
        for rpc in ["meta", "admin"] {
            let answer = match rpc {
                "meta" => server.meta_http("registerInstance", body.clone()).await,
                _ => server.admin_http("registerInstance", body.clone()).await,
            };
            assert_eq!(code(&answer), "DUPLICATE_ENTITY", "{rpc}: {answer}");
            let text = message(&answer);
            assert!(text.contains("\"inst\"") && text.contains(field), "{text}");
        }
    }
    let mut admin = server.admin().await;
    let changed: admin::RegisterInstanceRequest =
        serde_json::from_value(bigger_blocks.clone()).expect("a registration");
    let answer = admin.register_instance(changed).await.unwrap().into_inner();
    assert_eq!(
        admin_code(&answer.header),
        admin::ErrorCode::DuplicateEntity
    );
    let mut meta_client = server.meta().await;
    let answer = meta_client
        .register_instance(common::registration_grpc("inst", 8))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grpc_code(&answer.header), meta::ErrorCode::DuplicateEntity);
    assert!(answer
        .header
        .unwrap()
        .status
        .unwrap()
        .message
        .contains("block_size"));
    // user_data is not identity: the same registration with other user data is accepted.
    let mut user_data = common::registration("inst", 16);
    user_data["model_deployment"]["user_data"] = json!("anything");
    let same = server.admin_http("registerInstance", user_data).await;
    assert_eq!(code(&same), "OK", "{same}");
    assert_eq!(instance_info(&server).await, before, "nothing changed");

    // block_size ≤ 0 on the admin service: INVALID_ARGUMENT naming the field.
    for block_size in [0, -4] {
        let body = common::registration("fresh", block_size);
        let answer = server.admin_http("registerInstance", body.clone()).await;
        assert_eq!(code(&answer), "INVALID_ARGUMENT", "{answer}");
        assert!(message(&answer).contains("block_size"), "{answer}");
        let request: admin::RegisterInstanceRequest = serde_json::from_value(body).unwrap();
        let answer = admin.register_instance(request).await.unwrap().into_inner();
        assert_eq!(
            admin_code(&answer.header),
            admin::ErrorCode::InvalidArgument
        );
    }
    let fresh = server
        .meta_http("getInstanceInfo", json!({"instance_id": "fresh"}))
        .await;
    assert_eq!(code(&fresh), "INSTANCE_NOT_EXIST", "nothing registered");

    // An unknown instance on the admin service: INSTANCE_NOT_EXIST naming it.
    let unknown = [
        ("removeInstance", json!({"instance_id": "ghost"})),
        ("getInstanceInfo", json!({"instance_id": "ghost"})),
        (
            "getCacheMeta",
            json!({"instance_id": "ghost", "block_keys": [1]}),
        ),
        (
            "removeCache",
            json!({"instance_id": "ghost", "block_keys": [1]}),
        ),
    ];
    for (rpc, body) in unknown {
        let answer = server.admin_http(rpc, body).await;
        assert_eq!(code(&answer), "INSTANCE_NOT_EXIST", "{rpc}: {answer}");
        assert!(message(&answer).contains("\"ghost\""), "{rpc}: {answer}");
    }
    let answer = admin
        .remove_instance(admin::RemoveInstanceRequest {
            trace_id: "t".into(),
            instance_id: "ghost".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        admin_code(&answer.header),
        admin::ErrorCode::InstanceNotExist
    );
    assert!(answer
        .header
        .unwrap()
        .status
        .unwrap()
        .message
        .contains("ghost"));
    // An unknown group stays a non-OK answer naming the group.
    let mut body = common::registration("fresh", 16);
    body["instance_group"] = json!("no-such-group");
    let answer = server.admin_http("registerInstance", body).await;
    assert_eq!(code(&answer), "INTERNAL_ERROR", "{answer}");
    assert!(message(&answer).contains("no-such-group"), "{answer}");
}

async fn healthy(server: &TestServer) -> (u16, Value) {
    let address = server.address("admin_http");
    let (status, body) = common::http_request(address, "GET", "/api/healthy", b"").await;
    (status, serde_json::from_slice(&body).expect("JSON"))
}

#[tokio::test]
async fn api_healthy_is_200_on_the_leader_and_503_with_the_health_answer_otherwise() {
    let server = TestServer::start().await;
    assert_eq!(healthy(&server).await, (200, json!({"status": "OK"})));

    // Demoted, with a long campaign delay: not the leader, 503 with CheckHealth's answer.
    let delay = json!({"campaign_delay_time_ms": 60_000});
    let answer = server.admin_http("updateLeaderElectorConfig", delay).await;
    assert_eq!(code(&answer), "OK", "{answer}");
    assert_eq!(
        code(&server.admin_http("leaderDemote", json!({})).await),
        "OK"
    );
    let (status, body) = healthy(&server).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["is_leader"], false, "{body}");
    assert_eq!(body["is_health"], true, "{body}");
    assert_eq!(code(&body), "OK", "{body}");

    // Campaigning again: healthy once it leads.
    let delay = json!({"campaign_delay_time_ms": 0});
    let answer = server.admin_http("updateLeaderElectorConfig", delay).await;
    assert_eq!(code(&answer), "OK", "{answer}");
    let back = common::wait_until(std::time::Duration::from_secs(10), async || {
        (healthy(&server).await.0 == 200).then_some(())
    })
    .await;
    assert!(back.is_some(), "the node leads again and is healthy");
    let (status, _) =
        common::http_request(server.address("admin_http"), "POST", "/api/healthy", b"{}").await;
    assert_eq!(status, 405, "GET only");
}

#[tokio::test]
async fn prometheus_names_take_the_configured_prefix_and_the_exposition_can_be_off() {
    let server = TestServer::start().await;
    assert_eq!(code(&server.register("inst", 16).await), "OK");
    let (status, text) = server.prometheus().await;
    assert_eq!(status, 200);
    let lines: Vec<&str> = text.lines().collect();
    for expected in [
        "# TYPE kvcm_service_query_counter counter",
        "kvcm_service_query_counter{api_name=\"RegisterInstance\"} 1",
        "# TYPE kvcm_service_query_rt_us gauge",
        "# TYPE kvcm_event_log_dropped counter",
        "# TYPE kvcm_journal_failed gauge",
        "kvcm_journal_failed 0",
        "# TYPE kvcm_lookup_queue_pairs gauge",
        "kvcm_lookup_queue_pairs 0",
    ] {
        assert!(lines.contains(&expected), "{expected:?} in {text}");
    }
    let unprefixed = lines
        .iter()
        .filter(|line| !line.starts_with('#'))
        .find(|line| !line.starts_with("kvcm_"));
    assert_eq!(unprefixed, None, "every name has the default prefix");
    drop(server);

    // TOML < --env < environment variable.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("kvcm.toml");
    std::fs::write(&file, "[kvcm.metrics]\nprometheus_prefix = \"from_file\"\n").unwrap();
    let file = file.display().to_string();
    let args = [
        "--config",
        &file,
        "--env",
        "kvcm.metrics.prometheus_prefix=from_env",
    ];
    let server = TestServer::start_custom(&args, &[]).await;
    server.register("inst", 16).await;
    let (_, text) = server.prometheus().await;
    assert!(text.contains("\nfrom_env_service_query_counter{"), "{text}");
    drop(server);
    let variable = [("KVCM_METRICS_PROMETHEUS_PREFIX", "from_var")];
    let server = TestServer::start_custom(&args, &variable).await;
    let (_, text) = server.prometheus().await;
    assert!(
        text.contains("# TYPE from_var_journal_failed gauge"),
        "{text}"
    );
    assert!(!text.contains("from_env"), "{text}");
    drop(server);

    // With the lookup path off, no lookup series.
    let server = TestServer::start_with(&["kvcm.lookup.enabled=false"]).await;
    let (_, text) = server.prometheus().await;
    assert!(text.contains("kvcm_journal_failed 0"), "{text}");
    assert!(!text.contains("kvcm_lookup_"), "{text}");
    drop(server);

    // Off: no /metrics route; the admin RPCs and GetMetrics are still served.
    let server = TestServer::start_with(&["kvcm.metrics.enable_prometheus=false"]).await;
    assert_eq!(server.prometheus().await.0, 404);
    let metrics = server.admin_http("getMetrics", json!({})).await;
    assert_eq!(code(&metrics), "OK", "{metrics}");
    drop(server);

    // A prefix that cannot start a metric name stops the start, naming the key.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_kvcm"))
        .arg("serve")
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--env", "kvcm.metrics.prometheus_prefix=9-lives"])
        .output()
        .expect("run kvcm");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("kvcm.metrics.prometheus_prefix"),
        "{stderr}"
    );
}

/// A JSON answer with its request id checked (`<trace id>_<µs>`) and replaced by `<rid>`.
fn golden(mut answer: Value, trace_id: &str) -> Value {
    let request_id = answer["header"]["request_id"].as_str().expect("request_id");
    let micros = request_id
        .strip_prefix(&format!("{trace_id}_"))
        .expect("the trace id first");
    assert!(micros.bytes().all(|b| b.is_ascii_digit()), "{request_id}");
    answer["header"]["request_id"] = json!("<rid>");
    answer
}

#[tokio::test]
async fn the_new_responses_answer_the_canonical_json() {
    let server = TestServer::start().await;
    server.register("inst", 16).await;
    server.write_keys("inst", &[7]).await;
    let len = server
        .meta_http(
            "getCacheLocationLen",
            json!({"trace_id": "len", "instance_id": "inst", "query_type": "QT_BATCH_GET",
                   "block_keys": [7, 8]}),
        )
        .await;
    assert_eq!(
        golden(len, "len"),
        json!({"header": {"status": {"code": "OK",
                                     "message": "Cache locations retrieved successfully"},
                          "request_id": "<rid>", "tracer_result": ""},
               "cache_location_len": "1"})
    );
    let listed = server
        .admin_http("listInstanceGroup", json!({"trace_id": "list"}))
        .await;
    let default_group = json!({
        "name": "default", "storage_candidates": ["default_file"],
        "global_quota_group_name": "default", "max_instance_count": "0",
        "quota": {"capacity": "9223372036854775807", "quota_config": []},
        "cache_config": {
            "reclaim_strategy": {"storage_unique_name": "default_file",
                                 "reclaim_policy": "POLICY_LRU", "trigger_period_seconds": 0,
                                 "reclaim_step_size": 0, "reclaim_step_percentage": 0,
                                 "delay_before_delete_ms": 0},
            "data_storage_strategy": "CPS_PREFER_3FS",
            "meta_indexer_config": {
                "max_key_count": "0", "mutex_shard_num": "256", "batch_key_size": "64",
                "meta_storage_backend_config": {"storage_type": "local", "storage_uri": ""},
                "meta_cache_policy_config": {"capacity": "0", "type": "lru",
                                             "cache_shard_bits": 0,
                                             "high_pri_pool_ratio": 0.0}}},
        "user_data": "", "version": "1", "extra_info": "", "revisit_interval_buckets": ""});
    assert_eq!(
        golden(listed, "list"),
        json!({"header": {"status": {"code": "OK", "message": ""}, "request_id": "<rid>"},
               "instance_group": [default_group]})
    );
}

/// The pool spec of `name` as ListStorage answers it.
async fn listed_pool(server: &TestServer, name: &str) -> Value {
    let listed = server.admin_http("listStorage", json!({})).await;
    assert_eq!(code(&listed), "OK", "{listed}");
    let storages = listed["storage"].as_array().expect("storages");
    let found = storages.iter().find(|s| s["global_unique_name"] == name);
    found.expect("listed")["tair_mem_pool"].clone()
}

#[tokio::test]
async fn pool_discovery_url_and_media_type_are_checked_stored_and_survive_a_restart() {
    let server = TestServer::start().await;
    let pool = |name: &str, url: &str, media_type: i32| {
        json!({"global_unique_name": name,
               "tair_mem_pool": {"domain": "d", "timeout": 100,
                                 "service_discovery_url": url, "media_type": media_type}})
    };
    let added = server
        .admin_http(
            "addStorage",
            json!({"storage": pool("mp", "static://10.0.0.1:7000,10.0.0.2:7000", 2)}),
        )
        .await;
    assert_eq!(code(&added), "OK", "{added}");
    let plain = server
        .admin_http("addStorage", json!({"storage": pool("plain", "", 0)}))
        .await;
    assert_eq!(code(&plain), "OK", "{plain}");
    for (url, media_type, field) in [
        ("", 5, "media_type"),
        ("", 3, "media_type"),
        ("http://x", 0, "service_discovery_url"),
        ("static://h", 0, "service_discovery_url"),
    ] {
        let refused = server
            .admin_http(
                "addStorage",
                json!({"storage": pool("bad", url, media_type)}),
            )
            .await;
        assert_eq!(code(&refused), "INVALID_ARGUMENT", "{refused}");
        let message = refused["header"]["status"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{message}");
    }
    let check = |spec: &Value| {
        assert_eq!(
            spec["service_discovery_url"], "static://10.0.0.1:7000,10.0.0.2:7000",
            "{spec}"
        );
        assert_eq!(spec["media_type"], 2, "{spec}");
    };
    check(&listed_pool(&server, "mp").await);
    let unset = listed_pool(&server, "plain").await;
    assert!(
        unset.get("service_discovery_url").is_none() && unset.get("media_type").is_none(),
        "unset fields are not printed: {unset}"
    );
    let server = server.kill_and_restart().await;
    check(&listed_pool(&server, "mp").await);
}

#[tokio::test]
async fn a_dummy_storage_places_locations_holds_no_bytes_and_survives_a_restart() {
    let server = TestServer::start().await;
    let root = server.dir.path().join("dummy_root");
    let dummy = |root: &str| json!({"global_unique_name": "dm", "dummy": {"root_path": root, "key_count_per_file": 2}});
    for (bad, why) in [
        ("", "storage_spec.root_path is empty"),
        ("relative/dir", "is not an absolute path"),
        ("/a?b", "contains the character '?'"),
        ("/a/../b", "contains \"..\""),
    ] {
        let refused = server
            .admin_http("addStorage", json!({"storage": dummy(bad)}))
            .await;
        assert_eq!(code(&refused), "INVALID_ARGUMENT", "{refused}");
        let message = refused["header"]["status"]["message"].as_str().unwrap();
        assert!(message.contains(why), "{bad:?}: {message}");
    }
    let root_text = root.display().to_string();
    let added = server
        .admin_http("addStorage", json!({"storage": dummy(&root_text)}))
        .await;
    assert_eq!(code(&added), "OK", "{added}");
    let group = common::nfs_group("dg", &["dm"]);
    let created = server
        .admin_http("createInstanceGroup", json!({"instance_group": group}))
        .await;
    assert_eq!(code(&created), "OK", "{created}");
    let mut registration = common::registration("dinst", 4);
    registration["instance_group"] = json!("dg");
    let registered = server.meta_http("registerInstance", registration).await;
    assert_eq!(code(&registered), "OK", "{registered}");
    assert_eq!(
        registered["storage_configs"], "[]",
        "dummy storages are server-internal, as upstream"
    );

    let started = server.write_keys("dinst", &[1, 255]).await;
    let expected: Vec<String> = ["1", "ff"]
        .iter()
        .map(|hex| format!("dummy://dm{root_text}/dinst/tp0/{hex}?size=1024"))
        .collect();
    assert_eq!(common::uris(&started["locations"]), expected);
    assert!(!root.exists(), "nothing is created under a dummy root");
    let lookup = json!({"instance_id": "dinst", "query_type": "QT_PREFIX_MATCH",
                        "block_keys": [1, 255]});
    let found = server.meta_http("getCacheLocation", lookup.clone()).await;
    assert_eq!(found["locations"][0]["type"], "ST_DUMMY", "{found}");
    assert_eq!(common::uris(&found["locations"]), expected);

    let server = server.kill_and_restart().await;
    let listed = server.admin_http("listStorage", json!({})).await;
    let storages = listed["storage"].as_array().expect("storages");
    let spec = storages
        .iter()
        .find(|s| s["global_unique_name"] == "dm")
        .map(|s| s["dummy"].clone());
    assert_eq!(
        spec,
        Some(json!({"root_path": root_text, "key_count_per_file": 2}))
    );
    let found = server.meta_http("getCacheLocation", lookup).await;
    assert_eq!(common::uris(&found["locations"]), expected, "{found}");
    let removed = server
        .meta_http(
            "removeCache",
            json!({"instance_id": "dinst", "block_keys": [1, 255]}),
        )
        .await;
    assert_eq!(code(&removed), "OK", "{removed}");
}

#[tokio::test]
async fn the_tairmempool_ssd_type_and_strategies_are_refused_naming_why() {
    let server = TestServer::start().await;
    let root = server.dir.path().join("nfs_ssd");
    let added = server
        .admin_http(
            "addStorage",
            json!({"storage": nfs_storage("nfs_ssd", &root)}),
        )
        .await;
    assert_eq!(code(&added), "OK", "{added}");
    let mut by_strategy =
        common::group_preferring("g_ssd", &["nfs_ssd"], "CPS_PREFER_TAIR_MEMPOOL_SSD", "1000");
    let mut by_quota = nfs_group("g_quota", &["nfs_ssd"]);
    by_quota["quota"]["quota_config"] =
        json!([{"storage_type": "ST_TAIRMEMPOOL_SSD", "capacity": "10"}]);
    for (group, field) in [
        (&mut by_strategy, "cache_config.data_storage_strategy"),
        (&mut by_quota, "quota.quota_config.storage_type"),
    ] {
        let refused = server
            .admin_http(
                "createInstanceGroup",
                json!({"instance_group": group.clone()}),
            )
            .await;
        assert_eq!(code(&refused), "INVALID_ARGUMENT", "{refused}");
        let message = refused["header"]["status"]["message"].as_str().unwrap();
        assert!(
            message.contains(field) && message.contains("no SSD medium"),
            "{message}"
        );
    }
    let listed = server.admin_http("listInstanceGroup", json!({})).await;
    let groups = listed["instance_group"].as_array().expect("groups");
    let names: Vec<&str> = groups.iter().filter_map(|g| g["name"].as_str()).collect();
    assert_eq!(names, ["default"], "nothing was created");
    server.register("inst", 4).await;
    let refused = server
        .meta_http(
            "getCacheLocationsByBackend",
            json!({"instance_id": "inst",
            "query_type": "QT_BATCH_GET", "block_keys": [1],
            "backend_selectors": [{"backend_type": "ST_TAIRMEMPOOL_SSD"}]}),
        )
        .await;
    assert_eq!(code(&refused), "INVALID_ARGUMENT", "{refused}");
}
