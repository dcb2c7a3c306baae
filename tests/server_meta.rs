//! MetaService acceptance over real sockets against a real `kvcm serve` process.

mod common;

use std::time::Duration;

use common::{code, grpc_code, registration_grpc, uris, wait_until, TestServer};
use kvcm::proto::meta;
use serde_json::json;

const VECTOR_KEYS: [i64; 2] = [-8366447769517741626, 455111481605203084];

#[tokio::test]
async fn register_is_idempotent_conflicts_on_change_and_needs_a_group() {
    let server = TestServer::start().await;
    let first = server.register("inst", 16).await;
    assert_eq!(code(&first), "OK", "{first}");
    let configs: serde_json::Value =
        serde_json::from_str(first["storage_configs"].as_str().unwrap()).unwrap();
    assert_eq!(configs[0]["type"], "file");
    assert_eq!(configs[0]["global_unique_name"], "default_file");
    assert_eq!(configs[0]["is_available"], true);

    let again = server.register("inst", 16).await;
    assert_eq!(code(&again), "OK", "identical registration is idempotent");

    let changed = server.register("inst", 32).await;
    assert_eq!(code(&changed), "DUPLICATE_ENTITY", "{changed}");
    assert_eq!(
        changed["storage_configs"], "",
        "storage_configs printed on errors"
    );

    let mut body = common::registration("other", 16);
    body["instance_group"] = json!("no-such-group");
    let unknown = server.meta_http("registerInstance", body).await;
    assert_eq!(code(&unknown), "INTERNAL_ERROR", "{unknown}");

    // Over gRPC: same rules.
    let mut client = server.meta().await;
    let answer = client
        .register_instance(registration_grpc("inst", 16))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grpc_code(&answer.header), meta::ErrorCode::Ok);
    let answer = client
        .register_instance(registration_grpc("inst", 8))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grpc_code(&answer.header), meta::ErrorCode::DuplicateEntity);

    let info = server
        .meta_http("getInstanceInfo", json!({"instance_id": "inst"}))
        .await;
    assert_eq!(code(&info), "OK");
    assert_eq!(info["instance_group"], "default");
    assert_eq!(info["instance_info"]["block_size"], 16);
    assert_eq!(info["instance_info"]["quota_group_name"], "default");
}

#[tokio::test]
async fn written_blocks_are_found_by_prefix_match_with_identical_uris_http() {
    let server = TestServer::start().await;
    server.register("inst", 16).await;
    let keys = [11, 12, 13];
    let start = server.write_keys("inst", &keys).await;
    assert_eq!(start["block_mask"], json!({"offset": 0}));
    let written = uris(&start["locations"]);
    assert_eq!(written.len(), 3);
    assert!(
        written[0].starts_with("file://default_file/"),
        "{}",
        written[0]
    );
    assert!(written[0].contains("/inst/tp0/"), "{}", written[0]);

    let found = server
        .meta_http(
            "getCacheLocation",
            json!({"instance_id": "inst", "query_type": "QT_PREFIX_MATCH", "block_keys": [11, 12, 13, 14]}),
        )
        .await;
    assert_eq!(code(&found), "OK");
    assert_eq!(uris(&found["locations"]), written);
    assert_eq!(found["locations"][0]["type"], "ST_NFS");
    assert_eq!(found["locations"][0]["spec_size"], 1);
}

#[tokio::test]
async fn written_blocks_are_found_by_prefix_match_with_identical_uris_grpc() {
    let server = TestServer::start().await;
    let mut client = server.meta().await;
    client
        .register_instance(registration_grpc("inst", 2))
        .await
        .unwrap();
    let start = client
        .start_write_cache(meta::StartWriteCacheRequest {
            instance_id: "inst".into(),
            token_ids: vec![1, 2, 3, 4, 5],
            write_timeout_seconds: 30,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grpc_code(&start.header), meta::ErrorCode::Ok);
    assert_eq!(start.write_session_id.len(), 32);
    assert!(start
        .write_session_id
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()));
    assert_eq!(
        start.locations.len(),
        2,
        "5 tokens at block size 2 = 2 keys"
    );
    let finish = client
        .finish_write_cache(meta::FinishWriteCacheRequest {
            instance_id: "inst".into(),
            write_session_id: start.write_session_id.clone(),
            success_blocks: Some(meta::BlockMask {
                info: Some(meta::block_mask::Info::Offset(2)),
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grpc_code(&finish.header), meta::ErrorCode::Ok);

    // The fact sheet's §9 vectors, over the wire: the token-derived keys are exactly these.
    let found = client
        .get_cache_location(meta::GetCacheLocationRequest {
            instance_id: "inst".into(),
            query_type: meta::QueryType::QtPrefixMatch as i32,
            block_keys: VECTOR_KEYS.to_vec(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grpc_code(&found.header), meta::ErrorCode::Ok);
    assert_eq!(found.locations, start.locations);
}

#[tokio::test]
async fn token_ids_hash_to_the_fact_sheet_vectors() {
    let server = TestServer::start().await;
    server.register("b4", 4).await;
    let tokens: Vec<i64> = (0..16).collect();
    let start = server
        .meta_http(
            "startWriteCache",
            json!({"instance_id": "b4", "token_ids": tokens, "write_timeout_seconds": 30}),
        )
        .await;
    assert_eq!(start["locations"].as_array().unwrap().len(), 4);
    let expected = [
        455111276453135508i64,
        6713779586671547074,
        -1712794477054135035,
        6556265598806870907,
    ];
    // The session's blocks are WRITING under exactly the vector keys.
    assert_eq!(
        server.statuses("b4", &expected).await,
        vec!["CLS_WRITING"; 4]
    );

    server.register("b2", 2).await;
    let start = server
        .meta_http(
            "startWriteCache",
            json!({"instance_id": "b2", "token_ids": [-5, 7, 1i64 << 62, i64::MIN], "write_timeout_seconds": 30}),
        )
        .await;
    assert_eq!(code(&start), "OK");
    let keys = [-8366447769517782587i64, 5066797075115955342];
    assert_eq!(server.statuses("b2", &keys).await, vec!["CLS_WRITING"; 2]);

    server.register("b1", 1).await;
    for tokens in [vec![456], vec![100, 101, 102]] {
        let start = server
            .meta_http(
                "startWriteCache",
                json!({"instance_id": "b1", "token_ids": tokens, "write_timeout_seconds": 30}),
            )
            .await;
        assert_eq!(code(&start), "OK");
    }
    let keys = [
        -7046029254386352675i64,
        -7046029254386353031,
        -8366447769518081462,
        8024479186331664069,
    ];
    assert_eq!(server.statuses("b1", &keys).await, vec!["CLS_WRITING"; 4]);
}

#[tokio::test]
async fn batch_get_and_sliding_window_pad_misses_with_placeholders() {
    let server = TestServer::start().await;
    server.register("inst", 16).await;
    let written = uris(&server.write_keys("inst", &[1, 2, 4]).await["locations"]);

    let batch = server
        .meta_http(
            "getCacheLocation",
            json!({"instance_id": "inst", "query_type": "QT_BATCH_GET", "block_keys": [1, 3, 4],
                   "block_mask": {"offset": 3}}),
        )
        .await;
    assert_eq!(code(&batch), "OK");
    assert_eq!(
        uris(&batch["locations"]),
        vec![written[0].clone(), String::new(), written[2].clone()]
    );
    let placeholder = &batch["locations"][1];
    assert_eq!(placeholder["type"], "ST_UNSPECIFIED");
    assert_eq!(placeholder["spec_size"], 1);
    assert_eq!(placeholder["location_specs"][0]["name"], "tp0");

    // keys 1 2 3(miss) 4: the right-most full window of 2 is [1, 2].
    let window = server
        .meta_http(
            "getCacheLocation",
            json!({"instance_id": "inst", "query_type": "QT_REVERSE_ROLL_SW_MATCH",
                   "block_keys": [1, 2, 3, 4], "sw_size": 2}),
        )
        .await;
    assert_eq!(code(&window), "OK", "{window}");
    assert_eq!(
        uris(&window["locations"]),
        vec![
            written[0].clone(),
            written[1].clone(),
            String::new(),
            String::new()
        ]
    );
    let none = server
        .meta_http(
            "getCacheLocation",
            json!({"instance_id": "inst", "query_type": "QT_REVERSE_ROLL_SW_MATCH",
                   "block_keys": [1, 3, 4], "sw_size": 3}),
        )
        .await;
    assert_eq!(uris(&none["locations"]), vec![String::new(); 3]);
}

#[tokio::test]
async fn prefix_match_skips_masked_positions_in_offset_and_bool_form() {
    let server = TestServer::start().await;
    server.register("inst", 16).await;
    let written = uris(&server.write_keys("inst", &[2, 3]).await["locations"]);
    let query = |mask: serde_json::Value| {
        json!({"instance_id": "inst", "query_type": "QT_PREFIX_MATCH",
               "block_keys": [1, 2, 3, 9], "block_mask": mask})
    };
    let offset = server
        .meta_http("getCacheLocation", query(json!({"offset": 1})))
        .await;
    assert_eq!(uris(&offset["locations"]), written);
    let bools = server
        .meta_http(
            "getCacheLocation",
            query(json!({"bool_masks": {"values": [true]}})),
        )
        .await;
    assert_eq!(uris(&bools["locations"]), written);
    let unmasked = server.meta_http("getCacheLocation", query(json!({}))).await;
    assert_eq!(
        uris(&unmasked["locations"]),
        Vec::<String>::new(),
        "key 1 misses first"
    );
}

#[tokio::test]
async fn start_write_on_partly_present_keys_answers_the_presence_mask() {
    let server = TestServer::start().await;
    server.register("inst", 16).await;
    server.write_keys("inst", &[1, 2]).await;
    let prefix = server
        .meta_http(
            "startWriteCache",
            json!({"instance_id": "inst", "block_keys": [1, 2, 3], "write_timeout_seconds": 30}),
        )
        .await;
    assert_eq!(prefix["block_mask"], json!({"offset": 2}));
    assert_eq!(prefix["locations"].as_array().unwrap().len(), 1);

    let holes = server
        .meta_http(
            "startWriteCache",
            json!({"instance_id": "inst", "block_keys": [5, 1, 6, 2], "write_timeout_seconds": 30}),
        )
        .await;
    assert_eq!(
        holes["block_mask"],
        json!({"bool_masks": {"values": [false, true, false, true]}})
    );
    assert_eq!(holes["locations"].as_array().unwrap().len(), 2);

    let all = server
        .meta_http(
            "startWriteCache",
            json!({"instance_id": "inst", "block_keys": [1, 2], "write_timeout_seconds": 30}),
        )
        .await;
    assert_eq!(code(&all), "OK");
    assert_eq!(all["block_mask"], json!({"offset": 2}));
    assert_eq!(all["locations"], json!([]));
    assert_eq!(all["write_session_id"].as_str().unwrap().len(), 32);
}

#[tokio::test]
async fn repeated_keys_in_one_start_write_are_allocated_once() {
    let server = TestServer::start().await;
    server.register("inst", 16).await;
    let start = server
        .meta_http(
            "startWriteCache",
            json!({"instance_id": "inst", "block_keys": [7, 7, 8, 7], "write_timeout_seconds": 30}),
        )
        .await;
    assert_eq!(code(&start), "OK", "{start}");
    assert_eq!(
        start["block_mask"],
        json!({"bool_masks": {"values": [false, true, false, true]}})
    );
    assert_eq!(start["locations"].as_array().unwrap().len(), 2);
    let finish = server
        .meta_http(
            "finishWriteCache",
            json!({"instance_id": "inst", "write_session_id": start["write_session_id"],
                   "success_blocks": {"offset": 2}}),
        )
        .await;
    assert_eq!(code(&finish), "OK", "{finish}");
    let found = server
        .meta_http(
            "getCacheLocation",
            json!({"instance_id": "inst", "query_type": "QT_PREFIX_MATCH", "block_keys": [7, 8]}),
        )
        .await;
    assert_eq!(uris(&found["locations"]), uris(&start["locations"]));
}

#[tokio::test]
async fn finish_commits_successes_and_deletes_the_rest() {
    let server = TestServer::start().await;
    server.register("inst", 16).await;
    let start = server
        .meta_http(
            "startWriteCache",
            json!({"instance_id": "inst", "block_keys": [7, 8, 9], "write_timeout_seconds": 30}),
        )
        .await;
    let finish = server
        .meta_http(
            "finishWriteCache",
            json!({"instance_id": "inst", "write_session_id": start["write_session_id"],
                   "success_blocks": {"bool_masks": {"values": [true, false, true]}}}),
        )
        .await;
    assert_eq!(code(&finish), "OK", "{finish}");
    let gone = wait_until(Duration::from_secs(5), async || {
        let statuses = server.statuses("inst", &[7, 8, 9]).await;
        (statuses == ["CLS_SERVING", "CLS_NOT_FOUND", "CLS_SERVING"]).then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "the failed block is deleted, the others serve"
    );
    let again = server
        .meta_http(
            "finishWriteCache",
            json!({"instance_id": "inst", "write_session_id": start["write_session_id"],
                   "success_blocks": {"offset": 0}}),
        )
        .await;
    assert_eq!(code(&again), "INTERNAL_ERROR", "a session finishes once");
}

#[tokio::test]
async fn session_expiry_deletes_the_writing_blocks() {
    let server = TestServer::start().await;
    server.register("inst", 16).await;
    let start = server
        .meta_http(
            "startWriteCache",
            json!({"instance_id": "inst", "block_keys": [21, 22], "write_timeout_seconds": 1}),
        )
        .await;
    assert_eq!(
        server.statuses("inst", &[21, 22]).await,
        vec!["CLS_WRITING"; 2]
    );
    let expired = wait_until(Duration::from_secs(5), async || {
        let statuses = server.statuses("inst", &[21, 22]).await;
        (statuses == ["CLS_NOT_FOUND", "CLS_NOT_FOUND"]).then_some(())
    })
    .await;
    assert!(expired.is_some(), "expired WRITING blocks are deleted");
    let late = server
        .meta_http(
            "finishWriteCache",
            json!({"instance_id": "inst", "write_session_id": start["write_session_id"],
                   "success_blocks": {"offset": 2}}),
        )
        .await;
    assert_eq!(code(&late), "INTERNAL_ERROR");
    assert!(late["header"]["status"]["message"]
        .as_str()
        .unwrap()
        .contains("has been deleted"));
}

#[tokio::test]
async fn remove_cache_and_trim_cache_delete_blocks() {
    let server = TestServer::start().await;
    server.register("inst", 16).await;
    server.write_keys("inst", &[1, 2, 3, 4]).await;
    let removed = server
        .meta_http(
            "removeCache",
            json!({"instance_id": "inst", "block_keys": [2, 99]}),
        )
        .await;
    assert_eq!(code(&removed), "OK");
    let prefix = server
        .meta_http(
            "getCacheLocation",
            json!({"instance_id": "inst", "query_type": "QT_PREFIX_MATCH", "block_keys": [1, 2, 3]}),
        )
        .await;
    assert_eq!(
        prefix["locations"].as_array().unwrap().len(),
        1,
        "reads stop at once"
    );

    let unsupported = server
        .meta_http(
            "trimCache",
            json!({"instance_id": "inst", "strategy": "TS_TIMESTAMP"}),
        )
        .await;
    assert_eq!(code(&unsupported), "UNSUPPORTED");
    let trimmed = server
        .meta_http(
            "trimCache",
            json!({"instance_id": "inst", "strategy": "TS_REMOVE_ALL_CACHE"}),
        )
        .await;
    assert_eq!(code(&trimmed), "OK");
    let all_gone = wait_until(Duration::from_secs(5), async || {
        let statuses = server.statuses("inst", &[1, 2, 3, 4]).await;
        statuses.iter().all(|s| s == "CLS_NOT_FOUND").then_some(())
    })
    .await;
    assert!(all_gone.is_some());
}

#[tokio::test]
async fn spec_groups_restrict_allocation_and_spec_names_filter_results() {
    let server = TestServer::start().await;
    let registered = server
        .meta_http(
            "registerInstance",
            json!({"instance_group": "default", "instance_id": "hybrid", "block_size": 4,
                   "location_spec_infos": [{"name": "full", "size": 512}, {"name": "swa", "size": 256}],
                   "location_spec_groups": [{"name": "g_swa", "spec_names": ["swa"]},
                                            {"name": "g_all", "spec_names": ["swa", "full"]}],
                   "model_deployment": {"model_name": "m", "dtype": "bf16"}}),
        )
        .await;
    assert_eq!(code(&registered), "OK", "{registered}");
    let start = server
        .meta_http(
            "startWriteCache",
            json!({"instance_id": "hybrid", "block_keys": [1, 2],
                   "location_spec_group_names": ["g_all", "g_swa"], "write_timeout_seconds": 30}),
        )
        .await;
    assert_eq!(code(&start), "OK", "{start}");
    let names = |location: &serde_json::Value| -> Vec<String> {
        location["location_specs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names(&start["locations"][0]), ["full", "swa"]);
    assert_eq!(names(&start["locations"][1]), ["swa"]);
    assert_eq!(start["locations"][1]["spec_size"], 1);
    assert!(start["locations"][1]["location_specs"][0]["uri"]
        .as_str()
        .unwrap()
        .contains("size=256"));
    server
        .meta_http(
            "finishWriteCache",
            json!({"instance_id": "hybrid", "write_session_id": start["write_session_id"],
                   "success_blocks": {"offset": 2}}),
        )
        .await;
    let filtered = server
        .meta_http(
            "getCacheLocation",
            json!({"instance_id": "hybrid", "query_type": "QT_BATCH_GET", "block_keys": [1, 3],
                   "location_spec_names": ["swa"]}),
        )
        .await;
    assert_eq!(names(&filtered["locations"][0]), ["swa"]);
    assert_eq!(
        filtered["locations"][0]["spec_size"], 2,
        "spec_size is left as stored"
    );
    assert_eq!(
        names(&filtered["locations"][1]),
        ["swa"],
        "placeholders are filtered too"
    );
}

#[tokio::test]
async fn injected_faults_fail_the_named_api_until_removed() {
    let server = TestServer::start().await;
    server.register("inst", 16).await;
    let inject = server
        .call(
            "debug_http",
            "injectFault",
            json!({"api_name": "GetCacheLocation", "fault_type": "INTERNAL_ERROR"}),
        )
        .await;
    assert_eq!(
        code(&inject),
        "OK",
        "unknown enum names are ignored: {inject}"
    );
    let query = |trace: &str| json!({"trace_id": trace, "instance_id": "inst", "query_type": "QT_BATCH_GET", "block_keys": [1]});
    let failed = server.meta_http("getCacheLocation", query("t_1")).await;
    assert_eq!(code(&failed), "INTERNAL_ERROR");
    assert_eq!(
        failed["header"]["status"]["message"],
        "GetCacheLocation fail due to fault injection"
    );
    server
        .call(
            "debug_http",
            "injectFault",
            json!({"api_name": "GetCacheLocation", "fault_trigger_strategy": "ONCE", "trigger_at_call": 7}),
        )
        .await;
    assert_eq!(
        code(&server.meta_http("getCacheLocation", query("t_6")).await),
        "OK"
    );
    assert_eq!(
        code(&server.meta_http("getCacheLocation", query("t_7")).await),
        "INTERNAL_ERROR"
    );
    assert_eq!(
        code(&server.meta_http("getCacheLocation", query("t_x")).await),
        "OK"
    );
    let removed = server
        .call(
            "debug_http",
            "removeFault",
            json!({"api_name": "GetCacheLocation"}),
        )
        .await;
    assert_eq!(code(&removed), "OK");
    let unknown = server
        .call(
            "debug_http",
            "removeFault",
            json!({"api_name": "GetCacheLocation"}),
        )
        .await;
    assert_eq!(code(&unknown), "INVALID_ARGUMENT");
    assert_eq!(
        code(&server.call("debug_http", "clearFaults", json!({})).await),
        "OK"
    );
    assert_eq!(
        code(&server.meta_http("getCacheLocation", query("t_7")).await),
        "OK"
    );
}

#[tokio::test]
async fn sigterm_and_sigint_stop_the_server_cleanly() {
    for signal in ["TERM", "INT"] {
        let mut server = TestServer::start().await;
        assert!(server.is_running());
        let status = server.signal_and_wait(signal);
        assert!(status.success(), "SIG{signal}: exit status {status:?}");
        assert!(server.log().contains("shutting down"), "SIG{signal}");
    }
}

/// The file path, byte offset and length a `file://` URI names.
fn block_of(uri: &str) -> (std::path::PathBuf, u64, usize) {
    let rest = uri
        .strip_prefix("file://default_file")
        .expect("default storage URI");
    let (path, query) = rest.split_once('?').expect("query");
    let param = |name: &str| -> u64 {
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .expect("param")
            .parse()
            .expect("number")
    };
    let size = param("size");
    (path.into(), param("blkid") * size, size as usize)
}

#[tokio::test]
async fn removing_blocks_frees_their_bytes_on_the_file_tier() {
    use std::os::unix::fs::FileExt;
    let server = TestServer::start().await;
    // Whole 4 KiB pages per block, so that freeing is exact on every file system.
    let mut registration = common::registration("inst", 16);
    registration["location_spec_infos"] = json!([{"name": "tp0", "size": 1024}]);
    assert_eq!(
        code(&server.meta_http("registerInstance", registration).await),
        "OK"
    );
    let start = server
        .meta_http(
            "startWriteCache",
            json!({"instance_id": "inst", "block_keys": [41, 42], "write_timeout_seconds": 30}),
        )
        .await;
    let written = uris(&start["locations"]);
    let (path, offset_a, size) = block_of(&written[0]);
    let (path_b, offset_b, _) = block_of(&written[1]);
    assert_eq!(path, path_b, "one file holds both blocks");
    // The engine's part: write the bytes where the URIs say.
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .read(true)
        .open(&path)
        .expect("block file");
    file.write_all_at(&vec![0xaa; size], offset_a).unwrap();
    file.write_all_at(&vec![0xbb; size], offset_b).unwrap();
    drop(file);
    server
        .meta_http(
            "finishWriteCache",
            json!({"instance_id": "inst", "write_session_id": start["write_session_id"],
                   "success_blocks": {"offset": 2}}),
        )
        .await;

    server
        .meta_http(
            "removeCache",
            json!({"instance_id": "inst", "block_keys": [41]}),
        )
        .await;
    let read_block = |offset: u64| {
        let file = std::fs::File::open(&path).ok()?;
        let mut bytes = vec![0u8; size];
        file.read_exact_at(&mut bytes, offset).ok()?;
        Some(bytes)
    };
    let punched = wait_until(Duration::from_secs(5), async || {
        (read_block(offset_a)? == vec![0; size]).then_some(())
    })
    .await;
    assert!(punched.is_some(), "the removed block's bytes are freed");
    assert_eq!(
        read_block(offset_b),
        Some(vec![0xbb; size]),
        "its neighbour is intact"
    );

    server
        .meta_http(
            "removeCache",
            json!({"instance_id": "inst", "block_keys": [42]}),
        )
        .await;
    let unlinked = wait_until(Duration::from_secs(5), async || {
        (!path.exists()).then_some(())
    })
    .await;
    assert!(unlinked.is_some(), "the file goes with its last block");
}

/// FinishWriteCache over HTTP with this mask and `locations`; returns the answer.
async fn finish_with(
    server: &TestServer,
    session: &serde_json::Value,
    mask: serde_json::Value,
    locations: serde_json::Value,
) -> serde_json::Value {
    server
        .meta_http(
            "finishWriteCache",
            json!({"instance_id": "sums", "write_session_id": session,
                   "success_blocks": mask, "locations": locations}),
        )
        .await
}

/// A location of FinishWriteCache's `locations` with these checksums (`None`: absent).
fn sums(checksums: &[Option<u64>]) -> serde_json::Value {
    let specs: Vec<_> = checksums
        .iter()
        .map(|c| match c {
            Some(c) => json!({"name": "", "uri": "", "checksum": c.to_string()}),
            None => json!({"name": "", "uri": ""}),
        })
        .collect();
    json!({ "location_specs": specs })
}

#[tokio::test]
async fn finish_stores_the_writers_checksums_and_lookups_return_them_until_a_restart_and_after() {
    let server = TestServer::start().await;
    let registered = server
        .meta_http(
            "registerInstance",
            json!({"instance_group": "default", "instance_id": "sums", "block_size": 4,
                   "location_spec_infos": [{"name": "tp0", "size": 64}, {"name": "tp1", "size": 64}],
                   "model_deployment": {"model_name": "m", "dtype": "FP8", "tp_size": 2}}),
        )
        .await;
    assert_eq!(code(&registered), "OK", "{registered}");
    let start = server
        .meta_http(
            "startWriteCache",
            json!({"instance_id": "sums", "block_keys": [1, 2, 3], "write_timeout_seconds": 30}),
        )
        .await;
    assert_eq!(code(&start), "OK", "{start}");
    let session = &start["write_session_id"];
    let all = json!({"offset": 3});
    // Bad shapes are refused naming the field, and the session stays open.
    let short = finish_with(
        &server,
        session,
        all.clone(),
        json!([sums(&[Some(1), Some(2)])]),
    )
    .await;
    assert_eq!(code(&short), "INVALID_ARGUMENT", "{short}");
    assert!(short.to_string().contains("locations"), "{short}");
    let ragged = [sums(&[Some(1), None]), sums(&[]), sums(&[])];
    let ragged = finish_with(&server, session, all.clone(), json!(ragged)).await;
    assert_eq!(code(&ragged), "INVALID_ARGUMENT", "{ragged}");
    let three = [sums(&[Some(1)]), sums(&[]), sums(&[])];
    let three = finish_with(&server, session, all.clone(), json!(three)).await;
    assert_eq!(
        code(&three),
        "INVALID_ARGUMENT",
        "one checksum for two parts: {three}"
    );
    // Checksums for blocks 1 and 3 (the largest value and 0), none for block 2.
    let good = [
        sums(&[Some(u64::MAX), Some(0)]),
        sums(&[]),
        sums(&[Some(5), Some(6)]),
    ];
    let finished = finish_with(&server, session, all, json!(good)).await;
    assert_eq!(code(&finished), "OK", "{finished}");

    let expected = [Some([u64::MAX, 0]), None, Some([5, 6])];
    let check = async |server: &TestServer| {
        let http = server
            .meta_http(
                "getCacheLocation",
                json!({"instance_id": "sums", "query_type": "QT_BATCH_GET", "block_keys": [1, 2, 3]}),
            )
            .await;
        assert_eq!(code(&http), "OK", "{http}");
        let mut grpc = server.meta().await;
        let answer = grpc
            .get_cache_location(meta::GetCacheLocationRequest {
                instance_id: "sums".into(),
                query_type: meta::QueryType::QtBatchGet as i32,
                block_keys: vec![1, 2, 3],
                ..Default::default()
            })
            .await
            .expect("grpc")
            .into_inner();
        for (i, want) in expected.iter().enumerate() {
            let specs = &answer.locations[i].location_specs;
            let got: Vec<Option<u64>> = specs.iter().map(|s| s.checksum).collect();
            let want: Vec<Option<u64>> = match want {
                Some(values) => values.iter().copied().map(Some).collect(),
                None => vec![None, None],
            };
            assert_eq!(got, want, "grpc, block {}", i + 1);
            let json_specs = http["locations"][i]["location_specs"]
                .as_array()
                .expect("specs");
            let got: Vec<Option<u64>> = json_specs
                .iter()
                .map(|s| s["checksum"].as_str().map(|c| c.parse().expect("decimal")))
                .collect();
            assert_eq!(got, want, "http, block {}", i + 1);
        }
    };
    check(&server).await;
    let server = server.kill_and_restart().await;
    check(&server).await;
}

#[tokio::test]
async fn a_reference_clients_locations_without_checksums_are_ignored() {
    let server = TestServer::start().await;
    server.register("inst", 16).await;
    let start = server
        .meta_http(
            "startWriteCache",
            json!({"instance_id": "inst", "block_keys": [4, 5], "write_timeout_seconds": 30}),
        )
        .await;
    // Echoing the answer's locations (fewer than the session has) changes nothing.
    let echoed = json!([start["locations"][0]]);
    let finish = server
        .meta_http(
            "finishWriteCache",
            json!({"instance_id": "inst", "write_session_id": start["write_session_id"],
                   "success_blocks": {"offset": 2}, "locations": echoed}),
        )
        .await;
    assert_eq!(code(&finish), "OK", "{finish}");
    assert_eq!(
        server.statuses("inst", &[4, 5]).await,
        ["CLS_SERVING", "CLS_SERVING"]
    );
}
