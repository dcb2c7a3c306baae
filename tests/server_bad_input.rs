//! Bad input on every RPC: each gets the documented status code and a message, the server
//! stays up, and its state is unchanged (asserted on a snapshot taken through the API).

mod common;

use common::{code, TestServer};
use serde_json::{json, Value};

/// Everything observable through the API about the fixture's state.
async fn snapshot(server: &TestServer) -> Value {
    let mut keys_state = Vec::new();
    for instance in ["inst", "tokens"] {
        keys_state.push(server.statuses(instance, &[1, 2, 3, 4]).await);
    }
    json!({
        "storages": server.admin_http("listStorage", json!({})).await["storage"],
        "group": server.admin_http("getInstanceGroup", json!({"name": "default"})).await["instance_group"],
        "instances": server.admin_http("listInstanceInfo", json!({"instance_group_name": "default"})).await["instance_info"],
        "accounts": server.admin_http("listAccount", json!({})).await["accounts"],
        "keys": keys_state,
    })
}

/// A server with instance `inst` holding SERVING keys 1 and 2 and an open session on 3, and
/// instance `tokens` (block size 2) holding nothing.
async fn fixture() -> (TestServer, String) {
    let server = TestServer::start().await;
    server.register("inst", 16).await;
    server.register("tokens", 2).await;
    server.write_keys("inst", &[1, 2]).await;
    let open = server
        .meta_http(
            "startWriteCache",
            json!({"instance_id": "inst", "block_keys": [3], "write_timeout_seconds": 600}),
        )
        .await;
    let session = open["write_session_id"].as_str().unwrap().to_string();
    (server, session)
}

async fn expect(server: &TestServer, listener: &str, rpc: &str, body: Value, expected: &str) {
    let answer = server.call(listener, rpc, body.clone()).await;
    assert_eq!(code(&answer), expected, "{rpc} {body} -> {answer}");
    let message = answer["header"]["status"]["message"].as_str().unwrap_or("");
    assert!(
        !message.is_empty(),
        "{rpc} {body}: the error carries a message"
    );
}

#[tokio::test]
async fn bad_meta_requests_are_rejected_without_changing_state() {
    let (server, session) = fixture().await;
    let before = snapshot(&server).await;
    let model = json!({"model_name": "m", "dtype": "FP8"});
    let spec = json!([{"name": "tp0", "size": 1}]);
    let meta_cases = [
        (
            "registerInstance",
            json!({"instance_id": "n", "block_size": 4, "location_spec_infos": spec, "model_deployment": model}),
            "INVALID_ARGUMENT",
        ),
        (
            "registerInstance",
            json!({"instance_group": "default", "block_size": 4, "location_spec_infos": spec, "model_deployment": model}),
            "INVALID_ARGUMENT",
        ),
        (
            "registerInstance",
            json!({"instance_group": "default", "instance_id": "n", "block_size": 0, "location_spec_infos": spec, "model_deployment": model}),
            "INVALID_ARGUMENT",
        ),
        (
            "registerInstance",
            json!({"instance_group": "default", "instance_id": "n", "block_size": -2, "location_spec_infos": spec, "model_deployment": model}),
            "INVALID_ARGUMENT",
        ),
        (
            "registerInstance",
            json!({"instance_group": "default", "instance_id": "n", "block_size": 4, "location_spec_infos": spec}),
            "INVALID_ARGUMENT",
        ),
        (
            "registerInstance",
            json!({"instance_group": "default", "instance_id": "n", "block_size": 4, "location_spec_infos": spec, "model_deployment": {"dtype": "x"}}),
            "INVALID_ARGUMENT",
        ),
        (
            "registerInstance",
            json!({"instance_group": "default", "instance_id": "n", "block_size": 4, "location_spec_infos": [], "model_deployment": model}),
            "INVALID_ARGUMENT",
        ),
        (
            "registerInstance",
            json!({"instance_group": "default", "instance_id": "n", "block_size": 4, "location_spec_infos": [{"name": "", "size": 1}], "model_deployment": model}),
            "INVALID_ARGUMENT",
        ),
        (
            "registerInstance",
            json!({"instance_group": "default", "instance_id": "n", "block_size": 4, "location_spec_infos": spec, "model_deployment": model,
                                     "location_spec_groups": [{"name": "g", "spec_names": ["nope"]}]}),
            "INVALID_ARGUMENT",
        ),
        (
            "registerInstance",
            json!({"instance_group": "missing", "instance_id": "n", "block_size": 4, "location_spec_infos": spec, "model_deployment": model}),
            "INTERNAL_ERROR",
        ),
        ("getInstanceInfo", json!({}), "INVALID_ARGUMENT"),
        (
            "getInstanceInfo",
            json!({"instance_id": "nobody"}),
            "INSTANCE_NOT_EXIST",
        ),
        (
            "getCacheLocation",
            json!({"instance_id": "nobody", "query_type": "QT_BATCH_GET", "block_keys": [1]}),
            "INSTANCE_NOT_EXIST",
        ),
        (
            "getCacheLocation",
            json!({"instance_id": "inst", "query_type": "QT_BATCH_GET"}),
            "INVALID_ARGUMENT",
        ),
        (
            "getCacheLocation",
            json!({"instance_id": "inst", "block_keys": [1]}),
            "INTERNAL_ERROR",
        ),
        (
            "getCacheLocation",
            json!({"instance_id": "inst"}),
            "INVALID_ARGUMENT",
        ),
        (
            "getCacheLocation",
            json!({"instance_id": "inst", "query_type": "QT_NO_SUCH", "block_keys": [1]}),
            "INTERNAL_ERROR",
        ),
        (
            "getCacheLocation",
            json!({"instance_id": "inst", "query_type": "QT_REVERSE_ROLL_SW_MATCH", "block_keys": [1, 2], "sw_size": 0}),
            "INVALID_ARGUMENT",
        ),
        (
            "getCacheLocation",
            json!({"instance_id": "inst", "query_type": "QT_REVERSE_ROLL_SW_MATCH", "block_keys": [1, 2], "sw_size": 3}),
            "INVALID_ARGUMENT",
        ),
        (
            "getCacheLocation",
            json!({"instance_id": "inst", "query_type": "QT_REVERSE_ROLL_SW_MATCH", "block_keys": [1, 2], "sw_size": -1}),
            "INVALID_ARGUMENT",
        ),
        (
            "getCacheLocation",
            json!({"instance_id": "inst", "query_type": "QT_PREFIX_MATCH", "block_keys": [1], "block_mask": {"offset": -1}}),
            "INVALID_ARGUMENT",
        ),
        (
            "getCacheMeta",
            json!({"instance_id": "inst"}),
            "INVALID_ARGUMENT",
        ),
        (
            "getCacheMeta",
            json!({"instance_id": "nobody", "block_keys": [1]}),
            "INSTANCE_NOT_EXIST",
        ),
        (
            "startWriteCache",
            json!({"instance_id": "inst", "write_timeout_seconds": 5}),
            "INVALID_ARGUMENT",
        ),
        (
            "startWriteCache",
            json!({"instance_id": "nobody", "block_keys": [9]}),
            "INSTANCE_NOT_EXIST",
        ),
        (
            "startWriteCache",
            json!({"instance_id": "inst", "block_keys": [9, 10], "location_spec_group_names": ["a"]}),
            "INTERNAL_ERROR",
        ),
        (
            "startWriteCache",
            json!({"instance_id": "inst", "block_keys": [9], "location_spec_group_names": ["unknown"]}),
            "INTERNAL_ERROR",
        ),
        (
            "finishWriteCache",
            json!({"instance_id": "inst", "success_blocks": {"offset": 0}}),
            "INVALID_ARGUMENT",
        ),
        (
            "finishWriteCache",
            json!({"instance_id": "inst", "write_session_id": session}),
            "INVALID_ARGUMENT",
        ),
        (
            "finishWriteCache",
            json!({"instance_id": "inst", "write_session_id": "nosuchsession", "success_blocks": {"offset": 0}}),
            "INTERNAL_ERROR",
        ),
        (
            "finishWriteCache",
            json!({"instance_id": "inst", "write_session_id": session, "success_blocks": {"offset": 2}}),
            "INVALID_ARGUMENT",
        ),
        (
            "finishWriteCache",
            json!({"instance_id": "inst", "write_session_id": session, "success_blocks": {"bool_masks": {"values": [true, true]}}}),
            "INVALID_ARGUMENT",
        ),
        (
            "finishWriteCache",
            json!({"instance_id": "inst", "write_session_id": session, "success_blocks": {"bool_masks": {"values": []}}}),
            "INVALID_ARGUMENT",
        ),
        (
            "finishWriteCache",
            json!({"instance_id": "tokens", "write_session_id": session, "success_blocks": {"offset": 1}}),
            "INVALID_ARGUMENT",
        ),
        (
            "finishWriteCache",
            json!({"instance_id": "nobody", "write_session_id": session, "success_blocks": {"offset": 1}}),
            "INSTANCE_NOT_EXIST",
        ),
        (
            "removeCache",
            json!({"instance_id": "inst"}),
            "INVALID_ARGUMENT",
        ),
        (
            "removeCache",
            json!({"instance_id": "nobody", "block_keys": [1]}),
            "INSTANCE_NOT_EXIST",
        ),
        (
            "trimCache",
            json!({"instance_id": "inst"}),
            "INVALID_ARGUMENT",
        ),
        (
            "trimCache",
            json!({"instance_id": "inst", "strategy": "TS_REMOVE_ALL_META"}),
            "UNSUPPORTED",
        ),
        (
            "trimCache",
            json!({"instance_id": "nobody", "strategy": "TS_REMOVE_ALL_CACHE"}),
            "INSTANCE_NOT_EXIST",
        ),
    ];
    for (rpc, body, expected) in meta_cases {
        expect(&server, "http", rpc, body, expected).await;
    }
    assert_eq!(
        snapshot(&server).await,
        before,
        "bad requests changed nothing"
    );

    // The session survived every invalid finish (an invalid mask does not consume it).
    let finish = server
        .meta_http(
            "finishWriteCache",
            json!({"instance_id": "inst", "write_session_id": session, "success_blocks": {"offset": 1}}),
        )
        .await;
    assert_eq!(code(&finish), "OK", "{finish}");
}

#[tokio::test]
async fn bad_admin_and_debug_requests_are_rejected_without_changing_state() {
    let (server, _) = fixture().await;
    let before = snapshot(&server).await;
    let admin_cases = [
        ("addStorage", json!({}), "INVALID_ARGUMENT"),
        (
            "addStorage",
            json!({"storage": {"global_unique_name": "s"}}),
            "INVALID_ARGUMENT",
        ),
        (
            "addStorage",
            json!({"storage": {"nfs": {"root_path": "/tmp/x/"}}}),
            "INVALID_ARGUMENT",
        ),
        (
            "addStorage",
            json!({"storage": {"global_unique_name": "s", "local": {}}}),
            "INVALID_ARGUMENT",
        ),
        ("updateStorage", json!({}), "INVALID_ARGUMENT"),
        (
            "updateStorage",
            json!({"storage": {"global_unique_name": "nope", "nfs": {"root_path": "/tmp/x/"}}}),
            "INTERNAL_ERROR",
        ),
        (
            "enableStorage",
            json!({"storage_unique_name": "nope"}),
            "INTERNAL_ERROR",
        ),
        ("disableStorage", json!({}), "INTERNAL_ERROR"),
        (
            "removeStorage",
            json!({"storage_unique_name": "nope"}),
            "INTERNAL_ERROR",
        ),
        ("createInstanceGroup", json!({}), "INVALID_ARGUMENT"),
        (
            "createInstanceGroup",
            json!({"instance_group": {"name": "g"}}),
            "INVALID_ARGUMENT",
        ),
        ("updateInstanceGroup", json!({}), "INVALID_ARGUMENT"),
        (
            "removeInstanceGroup",
            json!({"name": "nope"}),
            "INTERNAL_ERROR",
        ),
        (
            "getInstanceGroup",
            json!({"name": "nope"}),
            "INTERNAL_ERROR",
        ),
        (
            "getCacheMeta",
            json!({"instance_id": "nobody", "block_keys": [1]}),
            "INSTANCE_NOT_EXIST",
        ),
        (
            "getCacheMeta",
            json!({"instance_id": "inst"}),
            "INVALID_ARGUMENT",
        ),
        (
            "removeCache",
            json!({"instance_id": "nobody", "block_keys": [1]}),
            "INSTANCE_NOT_EXIST",
        ),
        (
            "registerInstance",
            json!({"instance_id": "x"}),
            "INVALID_ARGUMENT",
        ),
        ("removeInstance", json!({}), "INVALID_ARGUMENT"),
        (
            "removeInstance",
            json!({"instance_id": "nobody"}),
            "INSTANCE_NOT_EXIST",
        ),
        (
            "getInstanceInfo",
            json!({"instance_id": "nobody"}),
            "INSTANCE_NOT_EXIST",
        ),
        ("listInstanceInfo", json!({}), "INVALID_ARGUMENT"),
        ("addAccount", json!({}), "INVALID_ARGUMENT"),
        (
            "deleteAccount",
            json!({"user_name": "nobody"}),
            "INTERNAL_ERROR",
        ),
        (
            "updateLeaderElectorConfig",
            json!({"campaign_delay_time_ms": -1}),
            "INVALID_ARGUMENT",
        ),
        ("updateLogger", json!({"log_level": ""}), "INVALID_ARGUMENT"),
    ];
    for (rpc, body, expected) in admin_cases {
        expect(&server, "admin_http", rpc, body, expected).await;
    }
    let debug_cases = [
        ("injectFault", json!({}), "INVALID_ARGUMENT"),
        (
            "removeFault",
            json!({"api_name": "never-set"}),
            "INVALID_ARGUMENT",
        ),
    ];
    for (rpc, body, expected) in debug_cases {
        expect(&server, "debug_http", rpc, body, expected).await;
    }
    for listener in ["http", "admin_http", "debug_http"] {
        let (status, body) = server
            .post_raw(listener, "/api/checkHealth", b"\xff{")
            .await;
        assert!(status == 400 || status == 404, "{listener}: {status}");
        assert!(status == 404 || body == b"{}");
    }
    assert_eq!(
        snapshot(&server).await,
        before,
        "bad requests changed nothing"
    );
}

#[tokio::test]
async fn bad_grpc_requests_answer_grpc_ok_with_the_status_in_the_header() {
    use common::{admin_code, grpc_code};
    use kvcm::proto::{admin, meta};
    let (server, _) = fixture().await;
    let before = snapshot(&server).await;
    let mut client = server.meta().await;
    let query = |instance: &str, sw_size: i32, keys: Vec<i64>| meta::GetCacheLocationRequest {
        instance_id: instance.into(),
        query_type: meta::QueryType::QtReverseRollSwMatch as i32,
        block_keys: keys,
        sw_size,
        ..Default::default()
    };
    let cases = [
        (
            query("inst", 0, vec![1, 2]),
            meta::ErrorCode::InvalidArgument,
        ),
        (
            query("inst", 3, vec![1, 2]),
            meta::ErrorCode::InvalidArgument,
        ),
        (query("inst", 1, vec![]), meta::ErrorCode::InvalidArgument),
        (
            query("nobody", 1, vec![1]),
            meta::ErrorCode::InstanceNotExist,
        ),
    ];
    for (request, expected) in cases {
        let answer = client
            .get_cache_location(request)
            .await
            .expect("grpc OK")
            .into_inner();
        assert_eq!(grpc_code(&answer.header), expected);
    }
    let finish = client
        .finish_write_cache(meta::FinishWriteCacheRequest {
            instance_id: "inst".into(),
            write_session_id: "unknown".into(),
            success_blocks: Some(meta::BlockMask::default()),
            ..Default::default()
        })
        .await
        .expect("grpc OK")
        .into_inner();
    assert_eq!(grpc_code(&finish.header), meta::ErrorCode::InternalError);
    let added = server
        .admin()
        .await
        .add_storage(admin::AddStorageRequest::default())
        .await
        .expect("grpc OK")
        .into_inner();
    assert_eq!(admin_code(&added.header), admin::ErrorCode::InvalidArgument);
    assert_eq!(
        snapshot(&server).await,
        before,
        "bad requests changed nothing"
    );
}

#[tokio::test]
async fn enum_numbers_without_a_name_are_rejected_and_stored_state_stays_readable() {
    use common::admin_code;
    use kvcm::proto::admin;
    let (server, _) = fixture().await;
    let before = snapshot(&server).await;
    let mut client = server.admin().await;
    let account = admin::AddAccountRequest {
        user_name: "u".into(),
        role: 5,
        ..Default::default()
    };
    let added = client.add_account(account).await.expect("grpc OK");
    let header = added.into_inner().header;
    assert_eq!(admin_code(&header), admin::ErrorCode::InvalidArgument);

    let stored = client
        .get_instance_group(admin::GetInstanceGroupRequest {
            name: "default".into(),
            ..Default::default()
        })
        .await
        .expect("grpc OK")
        .into_inner()
        .instance_group
        .expect("default group");
    let corruptions: [fn(&mut admin::InstanceGroup); 3] = [
        |g| g.cache_config.as_mut().unwrap().data_storage_strategy = 99,
        |g| {
            let cache = g.cache_config.as_mut().unwrap();
            cache.reclaim_strategy.as_mut().unwrap().reclaim_policy = 42;
        },
        |g| {
            let quota = g.quota.get_or_insert_with(Default::default);
            quota.quota_config.push(admin::QuotaConfig {
                storage_type: 77,
                capacity: 1,
            });
        },
    ];
    for corrupt in corruptions {
        let mut group = stored.clone();
        corrupt(&mut group);
        let updated = admin::UpdateInstanceGroupRequest {
            instance_group: Some(admin::InstanceGroup {
                version: stored.version + 1,
                ..group.clone()
            }),
            current_version: stored.version,
            ..Default::default()
        };
        let answer = client
            .update_instance_group(updated)
            .await
            .expect("grpc OK");
        let code = admin_code(&answer.into_inner().header);
        assert_eq!(code, admin::ErrorCode::InvalidArgument, "update {group:?}");
        group.name = "other".into();
        let created = admin::CreateInstanceGroupRequest {
            instance_group: Some(group),
            ..Default::default()
        };
        let answer = client
            .create_instance_group(created)
            .await
            .expect("grpc OK");
        let code = admin_code(&answer.into_inner().header);
        assert_eq!(code, admin::ErrorCode::InvalidArgument);
    }
    let other = server
        .admin_http("getInstanceGroup", json!({"name": "other"}))
        .await;
    assert_eq!(code(&other), "INTERNAL_ERROR", "nothing was created");
    assert_eq!(
        snapshot(&server).await,
        before,
        "state unchanged and readable"
    );
}

#[tokio::test]
async fn registrations_that_would_break_every_write_are_rejected() {
    let (server, _) = fixture().await;
    let before = snapshot(&server).await;
    let model = json!({"model_name": "m", "dtype": "FP8"});
    let register = |instance_id: &str, specs: Value| {
        json!({"instance_group": "default", "instance_id": instance_id, "block_size": 4,
               "location_spec_infos": specs, "model_deployment": model})
    };
    let spec = |name: &str, size: i64| json!({"name": name, "size": size});
    let mut cases = Vec::new();
    for bad in [
        "a/b", "a?b", "a#b", "a&b", "a=b", "a b", "a\tb", "a\u{1}b", ".", "..",
    ] {
        cases.push(register(bad, json!([spec("tp0", 1)])));
        cases.push(register("fresh", json!([spec(bad, 1)])));
    }
    cases.push(register("fresh", json!([spec("tp0", 0)])));
    cases.push(register("fresh", json!([spec("tp0", -5)])));
    cases.push(register("fresh", json!([spec("tp0", 1), spec("tp0", 2)])));
    for body in cases {
        expect(
            &server,
            "http",
            "registerInstance",
            body,
            "INVALID_ARGUMENT",
        )
        .await;
    }
    assert_eq!(snapshot(&server).await, before, "nothing was registered");
    let fine = register("fresh.one-2", json!([spec("tp0", 1), spec("tp1", 2)]));
    let answer = server.meta_http("registerInstance", fine).await;
    assert_eq!(code(&answer), "OK", "{answer}");
}

#[tokio::test]
async fn groups_whose_index_settings_cannot_open_an_index_are_refused() {
    let (server, _) = fixture().await;
    let before = snapshot(&server).await;
    let stored = &before["group"];
    let policy = &stored["cache_config"]["meta_indexer_config"]["meta_cache_policy_config"];
    assert_eq!(
        policy["type"], "lru",
        "the embedded default names its cache type"
    );
    let indexer = |change: Value| {
        let mut group = stored.clone();
        let config = &mut group["cache_config"]["meta_indexer_config"];
        for (field, value) in change.as_object().unwrap() {
            config[field] = value.clone();
        }
        group
    };
    let policy = |kind: &str, shard_bits: i64| json!({"meta_cache_policy_config": {"type": kind, "capacity": 1, "cache_shard_bits": shard_bits}});
    let bad_groups = [
        indexer(json!({"meta_cache_policy_config": null})),
        indexer(policy("", 0)),
        indexer(policy("lfu", 0)),
        indexer(policy("lru", 40)),
        indexer(json!({"mutex_shard_num": 12})),
    ];
    let version: i64 = stored["version"].as_str().unwrap().parse().unwrap();
    for group in bad_groups {
        let mut update = json!({"current_version": version});
        update["instance_group"] = group.clone();
        update["instance_group"]["version"] = json!(version + 1);
        expect(
            &server,
            "admin_http",
            "updateInstanceGroup",
            update,
            "INVALID_ARGUMENT",
        )
        .await;
        let mut created = group;
        created["name"] = json!("other");
        let body = json!({"instance_group": created});
        expect(
            &server,
            "admin_http",
            "createInstanceGroup",
            body,
            "INVALID_ARGUMENT",
        )
        .await;
    }
    assert_eq!(snapshot(&server).await, before, "nothing changed");
}

/// `header.status` (code name, message) of a JSON answer.
fn json_status(answer: &Value) -> (String, String) {
    let status = &answer["header"]["status"];
    let text = |v: &Value| v.as_str().unwrap_or("<missing>").to_string();
    (text(&status["code"]), text(&status["message"]))
}

/// `header.status` (code name, message) of an admin gRPC answer.
fn admin_status(header: Option<kvcm::proto::admin::CommonResponseHeader>) -> (String, String) {
    use kvcm::proto::admin::ErrorCode;
    let status = header.and_then(|h| h.status).unwrap_or_default();
    let code = ErrorCode::try_from(status.code).map_or("<unknown>", |c| c.as_str_name());
    (code.to_string(), status.message)
}

#[tokio::test]
async fn unknown_enum_numbers_over_http_get_the_grpc_answer() {
    use kvcm::proto::meta;
    let (server, _) = fixture().await;
    let before = snapshot(&server).await;
    let mut client = server.meta().await;
    for (query_type, body) in [
        (99, json!(99)),
        (99, json!(99.0)),
        (-3, json!(-3)),
        (0, json!("QT_NO_SUCH")),
    ] {
        let http = server
            .meta_http(
                "getCacheLocation",
                json!({"instance_id": "inst", "query_type": body, "block_keys": [1]}),
            )
            .await;
        let request = meta::GetCacheLocationRequest {
            instance_id: "inst".into(),
            query_type,
            block_keys: vec![1],
            ..Default::default()
        };
        let grpc = client.get_cache_location(request).await.expect("grpc OK");
        let status = grpc.into_inner().header.and_then(|h| h.status);
        let status = status.unwrap_or_default();
        let code = meta::ErrorCode::try_from(status.code).map_or("<unknown>", |c| c.as_str_name());
        let grpc = (code.to_string(), status.message);
        assert_eq!(json_status(&http), grpc, "query_type {body}");
        if query_type == 0 {
            // §8.3: an unspecified query type is a manager failure in the reference; an
            // unknown name reads as 0 (§2.2).
            assert_eq!(grpc.0, "INTERNAL_ERROR", "{body}");
        } else {
            assert_eq!(grpc.0, "INVALID_ARGUMENT", "{body}");
            let named = format!("{{GetCacheLocation: {{query_type}}}}: {query_type} is not");
            assert!(grpc.1.contains(&named), "{body}: {}", grpc.1);
        }
    }
    let http = server
        .meta_http("trimCache", json!({"instance_id": "inst", "strategy": 99}))
        .await;
    let (code, message) = json_status(&http);
    assert_eq!(code, "INVALID_ARGUMENT");
    assert!(message.contains("{TrimCache: {strategy}}: 99"), "{message}");
    assert_eq!(snapshot(&server).await, before, "nothing changed");
}

/// Puts an unnamed enum number into a group's JSON.
type Corruption = fn(&mut Value);

#[tokio::test]
async fn unknown_admin_enum_numbers_over_http_get_the_grpc_answer() {
    use kvcm::proto::admin;
    let (server, _) = fixture().await;
    let before = snapshot(&server).await;
    let mut client = server.admin().await;
    let http = server
        .admin_http("addAccount", json!({"user_name": "u", "role": 77}))
        .await;
    let request = admin::AddAccountRequest {
        user_name: "u".into(),
        role: 77,
        ..Default::default()
    };
    let grpc = client.add_account(request).await.expect("grpc OK");
    let grpc = admin_status(grpc.into_inner().header);
    assert_eq!(json_status(&http), grpc);
    assert_eq!(grpc.0, "INVALID_ARGUMENT");
    assert!(grpc.1.contains("{AddAccount: {role}}"), "{}", grpc.1);

    let stored = before["group"].clone();
    let version: i64 = stored["version"].as_str().unwrap().parse().unwrap();
    let nested: [(&str, Corruption); 3] = [
        ("cache_config.data_storage_strategy", |g| {
            g["cache_config"]["data_storage_strategy"] = json!(99)
        }),
        ("cache_config.reclaim_strategy.reclaim_policy", |g| {
            g["cache_config"]["reclaim_strategy"]["reclaim_policy"] = json!(42)
        }),
        ("quota.quota_config.storage_type", |g| {
            g["quota"]["quota_config"] = json!([{"storage_type": 77, "capacity": "1"}])
        }),
    ];
    for (field, corrupt) in nested {
        let mut group = stored.clone();
        corrupt(&mut group);
        group["version"] = json!(version + 1);
        let update = json!({"instance_group": group, "current_version": version});
        let http = server
            .admin_http("updateInstanceGroup", update.clone())
            .await;
        let request: admin::UpdateInstanceGroupRequest =
            serde_json::from_value(update).expect("the same request as a message");
        let grpc = client
            .update_instance_group(request)
            .await
            .expect("grpc OK");
        let grpc = admin_status(grpc.into_inner().header);
        assert_eq!(json_status(&http), grpc, "{field}");
        assert_eq!(grpc.0, "INVALID_ARGUMENT", "{field}");
        let named = format!("{{UpdateInstanceGroup: {{{field}}}}}");
        assert!(grpc.1.contains(&named), "{field}: {}", grpc.1);
        group["name"] = json!("other");
        let created = json!({"instance_group": group});
        expect(
            &server,
            "admin_http",
            "createInstanceGroup",
            created,
            "INVALID_ARGUMENT",
        )
        .await;
    }
    assert_eq!(snapshot(&server).await, before, "nothing changed");
}

#[tokio::test]
async fn unknown_enum_names_over_http_are_the_zero_value() {
    let (server, _) = fixture().await;
    let added = server
        .admin_http(
            "addAccount",
            json!({"user_name": "u", "role": "ROLE_NO_SUCH"}),
        )
        .await;
    assert_eq!(code(&added), "OK", "{added}");
    let listed = server.admin_http("listAccount", json!({})).await;
    let role = listed["accounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["user_name"] == "u")
        .map(|a| a["role"].clone());
    assert_eq!(role, Some(json!("ROLE_USER")), "{listed}");
}

#[tokio::test]
async fn unknown_debug_enum_numbers_are_refused_and_set_no_fault() {
    let (server, _) = fixture().await;
    for body in [
        json!({"api_name": "GetCacheLocation", "fault_trigger_strategy": 77}),
        json!({"api_name": "GetCacheLocation", "fault_type": 9}),
    ] {
        let answer = server.call("debug_http", "injectFault", body.clone()).await;
        assert_eq!(code(&answer), "INVALID_ARGUMENT", "{body}: {answer}");
        let message = answer["header"]["status"]["message"].as_str().unwrap_or("");
        assert!(message.contains("{InjectFault: {fault_"), "{message}");
    }
    let removed = server
        .call(
            "debug_http",
            "removeFault",
            json!({"api_name": "GetCacheLocation"}),
        )
        .await;
    assert_eq!(
        code(&removed),
        "INVALID_ARGUMENT",
        "no fault was set: {removed}"
    );
}

#[tokio::test]
async fn a_spec_group_without_specs_is_refused() {
    let (server, _) = fixture().await;
    let body = json!({"instance_group": "default", "instance_id": "empty_group", "block_size": 4,
                      "location_spec_infos": [{"name": "tp0", "size": 64}],
                      "model_deployment": {"model_name": "m", "dtype": "fp8"},
                      "location_spec_groups": [{"name": "g", "spec_names": []}]});
    let answer = server.meta_http("registerInstance", body).await;
    assert_eq!(code(&answer), "INVALID_ARGUMENT", "{answer}");
    let message = answer["header"]["status"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains("{RegisterInstance: {location_spec_groups}}"),
        "{message}"
    );
    let info = server
        .meta_http("getInstanceInfo", json!({"instance_id": "empty_group"}))
        .await;
    assert_eq!(
        code(&info),
        "INSTANCE_NOT_EXIST",
        "nothing was registered: {info}"
    );
}
