//! The JSON mapping of the HTTP edge (wire fact sheet §2.2): a golden response of every meta
//! RPC compared field by field, and the request parsing rules.

mod common;

use common::{code, TestServer};
use serde_json::{json, Value};

/// Replaces the fields that differ per run with markers after checking their shape.
fn normalise(mut answer: Value, trace_id: &str) -> Value {
    let request_id = answer["header"]["request_id"]
        .as_str()
        .expect("request_id")
        .to_string();
    let suffix = request_id
        .strip_prefix(&format!("{trace_id}_"))
        .unwrap_or_else(|| panic!("request_id {request_id:?} starts with the trace id"));
    assert!(
        suffix.len() >= 16 && suffix.bytes().all(|b| b.is_ascii_digit()),
        "{request_id}"
    );
    answer["header"]["request_id"] = json!("<rid>");
    if let Some(session) = answer.get_mut("write_session_id") {
        assert_eq!(session.as_str().expect("session id").len(), 32);
        *session = json!("<sid>");
    }
    for location in answer
        .get_mut("locations")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        for spec in location["location_specs"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            let uri = spec["uri"].as_str().expect("uri");
            if !uri.is_empty() {
                assert!(uri.starts_with("file://default_file/"), "{uri}");
                spec["uri"] = json!("<uri>");
            }
        }
    }
    for meta in answer
        .get_mut("metas")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        let mut parsed: Value = serde_json::from_str(meta.as_str().expect("meta")).expect("json");
        if parsed.get("id").is_some() {
            parsed["id"] = json!("<id>");
        }
        *meta = parsed;
    }
    answer
}

async fn golden(server: &TestServer, rpc: &str, body: Value) -> Value {
    golden_and_raw(server, rpc, body).await.0
}

/// The normalised answer and the answer as received.
async fn golden_and_raw(server: &TestServer, rpc: &str, body: Value) -> (Value, Value) {
    let trace_id = body["trace_id"].as_str().expect("trace_id").to_string();
    let (status, raw) = server
        .post_raw("http", &format!("/api/{rpc}"), body.to_string().as_bytes())
        .await;
    assert_eq!(status, 200);
    let text = String::from_utf8(raw).expect("utf-8");
    assert!(
        !text.contains('\n') && !text.contains("\": "),
        "compact output: {text}"
    );
    let raw: Value = serde_json::from_str(&text).expect("json");
    (normalise(raw.clone(), &trace_id), raw)
}

fn header(code: &str, message: &str) -> Value {
    json!({"status": {"code": code, "message": message}, "request_id": "<rid>", "tracer_result": ""})
}

#[tokio::test]
async fn every_meta_rpc_answers_the_canonical_json() {
    let server = TestServer::start().await;
    let registered = golden(&server, "registerInstance", {
        let mut body = common::registration("inst", 2);
        body["trace_id"] = json!("g1");
        body
    })
    .await;
    let configs = registered["storage_configs"]
        .as_str()
        .expect("string")
        .to_string();
    assert!(
        configs.starts_with("[{") && configs.contains("\"type\":\"file\""),
        "{configs}"
    );
    assert_eq!(
        registered,
        json!({"header": header("OK", "Instance registered successfully"), "storage_configs": configs})
    );

    let info = golden(
        &server,
        "getInstanceInfo",
        json!({"trace_id": "g2", "instance_id": "inst"}),
    )
    .await;
    assert_eq!(
        info,
        json!({"header": header("OK", ""), "instance_group": "default", "instance_info": {
            "quota_group_name": "default", "instance_group_name": "default", "instance_id": "inst",
            "block_size": 2, "location_spec_infos": [{"name": "tp0", "size": "1024"}],
            "model_deployment": {"model_name": "model", "dtype": "FP8", "use_mla": false,
                "tp_size": 1, "dp_size": 0, "lora_name": "", "pp_size": 0, "extra": "", "user_data": ""},
            "location_spec_groups": []}})
    );

    let (start, raw_start) = golden_and_raw(
        &server,
        "startWriteCache",
        json!({"trace_id": "g3", "instance_id": "inst", "token_ids": [1, 2, 3, 4], "write_timeout_seconds": 30}),
    )
    .await;
    let written = json!({"type": "ST_NFS", "spec_size": 1, "location_specs": [{"name": "tp0", "uri": "<uri>"}]});
    assert_eq!(
        start,
        json!({"header": header("OK", "Write session started successfully"), "write_session_id": "<sid>",
               "block_mask": {"offset": 0}, "locations": [written, written]})
    );
    let session = raw_start["write_session_id"].clone();
    let finish = golden(
        &server,
        "finishWriteCache",
        json!({"trace_id": "g4", "instance_id": "inst", "write_session_id": session,
               "success_blocks": {"bool_masks": {"values": [true, false]}}}),
    )
    .await;
    assert_eq!(
        finish,
        json!({"header": header("OK", "Write session finished successfully")})
    );

    let location = golden(
        &server,
        "getCacheLocation",
        json!({"trace_id": "g5", "instance_id": "inst", "query_type": "QT_BATCH_GET", "block_keys": [-8366447769517741626i64, 1]}),
    )
    .await;
    let placeholder = json!({"type": "ST_UNSPECIFIED", "spec_size": 1, "location_specs": [{"name": "tp0", "uri": ""}]});
    assert_eq!(
        location,
        json!({"header": header("OK", "Cache locations retrieved successfully"),
               "locations": [written, placeholder]})
    );

    let meta = golden(
        &server,
        "getCacheMeta",
        json!({"trace_id": "g6", "instance_id": "inst", "block_keys": [-8366447769517741626i64, 1]}),
    )
    .await;
    assert_eq!(
        meta,
        json!({"header": header("OK", "Cache meta retrieved successfully"),
               "locations": [written, {"type": "ST_UNSPECIFIED", "spec_size": 0, "location_specs": []}],
               "metas": [{"id": "<id>", "status": "CLS_SERVING"}, {"status": "CLS_NOT_FOUND"}]})
    );

    let removed = golden(
        &server,
        "removeCache",
        json!({"trace_id": "g7", "instance_id": "inst", "block_keys": [1]}),
    )
    .await;
    assert_eq!(
        removed,
        json!({"header": header("OK", "Cache removed successfully")})
    );

    let trimmed = golden(
        &server,
        "trimCache",
        json!({"trace_id": "g8", "instance_id": "inst", "strategy": "TS_REMOVE_ALL_CACHE"}),
    )
    .await;
    assert_eq!(
        trimmed,
        json!({"header": header("OK", "Cache trimmed successfully")})
    );
}

#[tokio::test]
async fn a_span_tracer_trace_id_gets_the_timings_in_tracer_result() {
    let server = TestServer::start().await;
    server.register("inst", 16).await;
    let answer = server
        .meta_http(
            "getCacheLocation",
            json!({"trace_id": "t1__kvcm_need_span_tracer", "instance_id": "inst",
                   "query_type": "QT_BATCH_GET", "block_keys": [1]}),
        )
        .await;
    let spans: Value =
        serde_json::from_str(answer["header"]["tracer_result"].as_str().unwrap()).unwrap();
    assert_eq!(spans["name"], "GetCacheLocation");
    assert!(spans["duration_us"].is_u64(), "{spans}");
}

#[tokio::test]
async fn unknown_instance_answers_instance_not_exist_with_an_empty_request_id() {
    let server = TestServer::start().await;
    let (status, raw) = server
        .post_raw(
            "http",
            "/api/getCacheLocation",
            br#"{"trace_id":"t","instance_id":"nobody","query_type":"QT_PREFIX_MATCH","block_keys":[1]}"#,
        )
        .await;
    assert_eq!(status, 200);
    let answer: Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(
        answer,
        json!({"header": {"status": {"code": "INSTANCE_NOT_EXIST", "message": "get GetCacheLocation metrics collector failed"},
                          "request_id": "", "tracer_result": ""}, "locations": []})
    );
}

#[tokio::test]
async fn requests_accept_both_names_exact_int64_numbers_strings_nulls_and_unknowns() {
    let server = TestServer::start().await;
    server.register("inst", 16).await;
    server
        .write_keys("inst", &[i64::MAX, i64::MIN, 9007199254740993])
        .await;
    let raw_query = format!(
        r#"{{"instanceId":"inst","queryType":2,"blockKeys":[{},"{}",9007199254740993],
            "block_mask":null,"bool_masks":{{"offset":0}},"no_such_field":[1,{{"a":null}}]}}"#,
        i64::MAX,
        i64::MIN
    );
    let (status, raw) = server
        .post_raw("http", "/api/getCacheLocation", raw_query.as_bytes())
        .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&raw));
    let answer: Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(code(&answer), "OK", "{answer}");
    assert_eq!(
        answer["locations"].as_array().unwrap().len(),
        3,
        "keys parsed exactly"
    );
    let off_by_one = server
        .meta_http(
            "getCacheLocation",
            json!({"instance_id": "inst", "query_type": "QT_PREFIX_MATCH", "block_keys": [9007199254740992i64]}),
        )
        .await;
    assert_eq!(
        off_by_one["locations"],
        json!([]),
        "2^53+1 was not rounded to 2^53"
    );
}

#[tokio::test]
async fn malformed_bodies_get_400_and_oversized_bodies_413_with_an_empty_object() {
    let server = TestServer::start().await;
    server.register("inst", 16).await;
    let bad_bodies: [&[u8]; 6] = [
        b"not json",
        b"[1,2]",
        b"{\"instance_id\": 5}",
        b"{\"block_keys\": [1.5]}",
        b"{\"instance_id\": \"\xff\xfe\"}",
        b"",
    ];
    for body in bad_bodies {
        let (status, raw) = server.post_raw("http", "/api/getCacheLocation", body).await;
        assert_eq!(
            (status, raw.as_slice()),
            (400, &b"{}"[..]),
            "{}",
            String::from_utf8_lossy(body)
        );
    }
    let huge = vec![b' '; 10 << 20];
    let (status, raw) = server
        .post_raw("http", "/api/getCacheLocation", &huge)
        .await;
    assert_eq!((status, raw.as_slice()), (413, &b"{}"[..]));
    let (status, _) =
        common::http_request(server.address("http"), "GET", "/api/getCacheLocation", b"").await;
    assert_eq!(status, 405, "only POST routes");
    let (status, _) = server.post_raw("http", "/api/noSuchRpc", b"{}").await;
    assert_eq!(status, 404);
    // The server is still up and its state unchanged.
    assert_eq!(server.statuses("inst", &[1]).await, vec!["CLS_NOT_FOUND"]);
}

#[tokio::test]
async fn the_body_limit_is_configurable() {
    let server = TestServer::start_with(&["kvcm.service.http_max_body_bytes=1000"]).await;
    server.register("inst", 16).await;
    let keys: Vec<i64> = (0..300).collect();
    let body = json!({"instance_id": "inst", "query_type": "QT_BATCH_GET", "block_keys": keys});
    let body = body.to_string();
    assert!(body.len() > 1000);
    let (status, raw) = server
        .post_raw("http", "/api/getCacheLocation", body.as_bytes())
        .await;
    assert_eq!((status, raw.as_slice()), (413, &b"{}"[..]));
    let small = json!({"instance_id": "inst", "query_type": "QT_BATCH_GET", "block_keys": [1]});
    let answer = server.meta_http("getCacheLocation", small).await;
    assert_eq!(code(&answer), "OK");
}

#[tokio::test]
async fn integral_floats_are_accepted_for_integer_fields_as_protobuf_does() {
    let server = TestServer::start().await;
    server.register("inst", 16).await;
    let body = br#"{"instance_id":"inst","block_keys":[5.0,6e0],"write_timeout_seconds":7.0}"#;
    let (status, raw) = server.post_raw("http", "/api/startWriteCache", body).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&raw));
    let answer: Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(code(&answer), "OK", "{answer}");
    assert_eq!(answer["locations"].as_array().unwrap().len(), 2);
    let fraction = br#"{"instance_id":"inst","block_keys":[5],"write_timeout_seconds":7.5}"#;
    let (status, _) = server
        .post_raw("http", "/api/startWriteCache", fraction)
        .await;
    assert_eq!(status, 400, "a fraction is no integer");
}
