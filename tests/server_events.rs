//! The event log of a real `kvcm serve`: traffic over HTTP and gRPC, a SIGTERM stop, then the
//! log read back with `kvcm_optimizer` and replayed by `kvcm optimize`; rotation with a tiny
//! file size; the event-log settings' errors.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{code, grpc_code, TestServer};
use kvcm::manager::keys::block_keys_from_tokens;
use kvcm::proto::meta;
use kvcm_optimizer::trace::events::{Event, EventLogWriter, EventType};
use kvcm_optimizer::trace::{expand_paths, Request, TraceFormat, TraceReader};
use serde_json::{json, Value};

const BLOCK_SIZE: i64 = 4;

/// The requests the optimizer reads from the event log in `dir`, in replay order.
fn replayed(dir: &Path) -> Vec<Request> {
    let files = expand_paths(&[dir.to_path_buf()]).expect("event log files");
    files
        .iter()
        .flat_map(|file| TraceReader::open(file, Some(TraceFormat::Events)).expect("open"))
        .map(|request| request.expect("valid event line"))
        .collect()
}

/// Every line of the event log in `dir`, oldest first.
fn events(dir: &Path) -> Vec<Event> {
    EventLogWriter::files_oldest_first(dir)
        .iter()
        .flat_map(|file| {
            let text = std::fs::read_to_string(file).expect("read log");
            text.lines()
                .map(|line| serde_json::from_str::<Event>(line).expect("schema v1"))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// A prefix-match GetCacheLocation over HTTP; returns how many blocks were found.
async fn lookup_http(server: &TestServer, keys: &[i64]) -> usize {
    let answer = server
        .meta_http(
            "getCacheLocation",
            json!({"instance_id": "inst", "query_type": "QT_PREFIX_MATCH", "block_keys": keys}),
        )
        .await;
    assert_eq!(code(&answer), "OK", "{answer}");
    answer["locations"].as_array().map_or(0, Vec::len)
}

fn events_dir(server: &TestServer) -> PathBuf {
    server.dir.path().join("events")
}

/// `kvcm optimize --trace <dir> --format events --capacity 100%`: (block, token) hit rate.
fn optimize_hit_rates(dir: &Path) -> (f64, f64) {
    let out = tempfile::tempdir().expect("tempdir");
    let output = Command::new(env!("CARGO_BIN_EXE_kvcm"))
        .args(["optimize", "--format", "events", "--policy", "lru"])
        .args(["--capacity", "100%", "--threads", "1", "--trace"])
        .arg(dir)
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("run kvcm optimize");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let csv = std::fs::read_to_string(out.path().join("results.csv")).expect("results.csv");
    let row: Vec<&str> = csv
        .lines()
        .nth(1)
        .expect("one result row")
        .split(',')
        .collect();
    let rate = |cell: &str| cell.parse::<f64>().expect("rate");
    (rate(row[2]), rate(row[3]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_calls_are_logged_and_replay_to_the_traffic_hit_rate() {
    let mut server = TestServer::start().await;
    server.register("inst", BLOCK_SIZE).await;
    let mut client = server.meta().await;

    let mut found = lookup_http(&server, &[1, 2, 3]).await;
    server.write_keys("inst", &[1, 2, 3]).await;
    // A GetCacheLocationLen reads nothing: it is not logged (the replay below has no entry).
    let len = server
        .meta_http(
            "getCacheLocationLen",
            json!({"instance_id": "inst", "query_type": "QT_PREFIX_MATCH", "block_keys": [1, 2]}),
        )
        .await;
    assert_eq!(code(&len), "OK", "{len}");
    let tokens: Vec<i64> = (100..110).collect();
    let answer = client
        .get_cache_location(meta::GetCacheLocationRequest {
            instance_id: "inst".into(),
            query_type: meta::QueryType::QtPrefixMatch as i32,
            token_ids: tokens.clone(),
            ..Default::default()
        })
        .await
        .expect("grpc lookup")
        .into_inner();
    assert_eq!(grpc_code(&answer.header), meta::ErrorCode::Ok);
    found += answer.locations.len();
    found += lookup_http(&server, &[1, 2, 4]).await;
    let session = start_and_finish_partly(&server).await;
    found += lookup_http(&server, &[1, 2, 3]).await;
    assert_eq!(found, 5, "the server found 0 + 0 + 2 + 3 blocks");
    failed_calls_are_not_logged(&server).await;

    // The stop waits for open connections: close the gRPC one first.
    drop(client);
    let status = server.signal_and_wait("TERM");
    assert!(status.success(), "{status:?}");

    let dir = events_dir(&server);
    let token_keys: Vec<u64> = block_keys_from_tokens(&tokens, BLOCK_SIZE as usize)
        .into_iter()
        .map(|k| k as u64)
        .collect();
    let requests = replayed(&dir);
    let blocks: Vec<Vec<u64>> = requests.iter().map(|r| r.blocks.clone()).collect();
    assert_eq!(
        blocks,
        [vec![1, 2, 3], token_keys, vec![1, 2, 4], vec![1, 2, 3]]
    );
    let input_tokens: Vec<u64> = requests.iter().map(|r| r.input_tokens).collect();
    assert_eq!(input_tokens, [12, 10, 12, 12], "tokens sent, else keys × 4");
    assert!(requests.iter().all(|r| r.instance == "inst"));

    let writes: Vec<(EventType, Vec<u64>, Option<String>)> = events(&dir)
        .into_iter()
        .filter(|e| e.event != EventType::GetCacheLocation)
        .map(|e| (e.event, e.keys, e.write_session))
        .collect();
    assert_eq!(writes.len(), 4, "{writes:?}");
    assert_eq!(writes[0].1, [1, 2, 3]);
    assert_eq!(writes[1].1, [1, 2, 3]);
    assert_eq!(
        writes[2],
        (
            EventType::StartWriteCache,
            vec![5, 6, 7],
            Some(session.clone())
        )
    );
    assert_eq!(
        writes[3],
        (EventType::FinishWriteCache, vec![5, 7], Some(session))
    );

    // 11 blocks asked, 5 prefix hits (as the server answered); tokens: 20 of 46.
    let (block_rate, token_rate) = optimize_hit_rates(&dir);
    assert!((block_rate - 5.0 / 11.0).abs() < 1e-3, "{block_rate}");
    assert!((token_rate - 20.0 / 46.0).abs() < 1e-3, "{token_rate}");
}

/// StartWriteCache of [1, 2, 5, 6, 7] (1 and 2 present), then commits blocks 0 and 2 of the
/// session (keys 5 and 7); returns the session id.
async fn start_and_finish_partly(server: &TestServer) -> String {
    let start = server
        .meta_http(
            "startWriteCache",
            json!({"instance_id": "inst", "block_keys": [1, 2, 5, 6, 7], "write_timeout_seconds": 30}),
        )
        .await;
    assert_eq!(code(&start), "OK", "{start}");
    let session = start["write_session_id"]
        .as_str()
        .expect("session")
        .to_string();
    let finish = server
        .meta_http(
            "finishWriteCache",
            json!({"instance_id": "inst", "write_session_id": session,
                   "success_blocks": {"bool_masks": {"values": [true, false, true]}}}),
        )
        .await;
    assert_eq!(code(&finish), "OK", "{finish}");
    session
}

/// Calls that fail write nothing: unknown instance, no keys, unknown session.
async fn failed_calls_are_not_logged(server: &TestServer) {
    let failures: [(&str, Value); 3] = [
        (
            "getCacheLocation",
            json!({"instance_id": "nobody", "query_type": "QT_PREFIX_MATCH", "block_keys": [1]}),
        ),
        (
            "startWriteCache",
            json!({"instance_id": "inst", "write_timeout_seconds": 30}),
        ),
        (
            "finishWriteCache",
            json!({"instance_id": "inst", "write_session_id": "none", "success_blocks": {"offset": 0}}),
        ),
    ];
    for (rpc, body) in failures {
        let answer = server.meta_http(rpc, body).await;
        assert_ne!(code(&answer), "OK", "{rpc}: {answer}");
    }
    let (status, metrics) =
        common::http_request(server.address("admin_http"), "GET", "/metrics", b"").await;
    assert_eq!(status, 200);
    let text = String::from_utf8_lossy(&metrics);
    assert!(text.contains("event_log_dropped 0"), "{text}");
}

#[tokio::test]
async fn a_tiny_file_size_rotates_and_keeps_the_newest_files_in_order() {
    let mut server = TestServer::start_with(&[
        "kvcm.event_log.max_file_bytes=300",
        "kvcm.event_log.keep_files=3",
    ])
    .await;
    server.register("inst", BLOCK_SIZE).await;
    let issued: Vec<Vec<i64>> = (0..40).map(|i| vec![i, i + 1000]).collect();
    for keys in &issued {
        lookup_http(&server, keys).await;
    }
    assert!(server.signal_and_wait("TERM").success());

    let dir = events_dir(&server);
    let files = EventLogWriter::files_oldest_first(&dir);
    assert_eq!(files.len(), 4, "current + 3 kept: {files:?}");
    for file in &files {
        let bytes = std::fs::metadata(file).expect("metadata").len();
        assert!(bytes > 0 && bytes <= 300, "{file:?}: {bytes} bytes");
    }
    let blocks: Vec<Vec<u64>> = replayed(&dir).into_iter().map(|r| r.blocks).collect();
    assert!(
        blocks.len() >= 4 && blocks.len() < issued.len(),
        "{}",
        blocks.len()
    );
    let newest: Vec<Vec<u64>> = issued[issued.len() - blocks.len()..]
        .iter()
        .map(|keys| keys.iter().map(|&k| k as u64).collect())
        .collect();
    assert_eq!(blocks, newest, "the newest lookups survive, oldest first");
}

#[tokio::test]
async fn a_disabled_log_writes_nothing_and_a_moved_log_writes_there() {
    let mut server = TestServer::start_with(&["kvcm.event_log.enabled=false"]).await;
    server.register("inst", BLOCK_SIZE).await;
    lookup_http(&server, &[1]).await;
    assert!(server.signal_and_wait("TERM").success());
    assert!(!events_dir(&server).exists());

    let elsewhere = tempfile::tempdir().expect("tempdir");
    let setting = format!("kvcm.event_log.dir={}", elsewhere.path().display());
    let mut server = TestServer::start_with(&[&setting]).await;
    server.register("inst", BLOCK_SIZE).await;
    lookup_http(&server, &[1]).await;
    assert!(server.signal_and_wait("TERM").success());
    assert_eq!(replayed(elsewhere.path()).len(), 1);
}

#[test]
fn bad_event_and_access_log_settings_stop_the_start_with_the_key_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let not_a_dir = dir.path().join("file");
    std::fs::write(&not_a_dir, b"x").expect("write");
    let moved = format!("kvcm.event_log.dir={}", not_a_dir.display());
    let access_moved = format!("kvcm.access_log.dir={}", not_a_dir.display());
    let cases = [
        (access_moved.as_str(), "access log"),
        (
            "kvcm.access_log.max_file_bytes=0",
            "kvcm.access_log.max_file_bytes",
        ),
        ("kvcm.access_log.bodies=maybe", "kvcm.access_log.bodies"),
        (
            "kvcm.access_log.max_body_bytes=-1",
            "kvcm.access_log.max_body_bytes",
        ),
        (
            "kvcm.event_log.max_file_bytes=0",
            "kvcm.event_log.max_file_bytes",
        ),
        ("kvcm.event_log.keep_files=-2", "kvcm.event_log.keep_files"),
        ("kvcm.event_log.enabled=maybe", "kvcm.event_log.enabled"),
        (moved.as_str(), "event log"),
    ];
    for (setting, named) in cases {
        let output = Command::new(env!("CARGO_BIN_EXE_kvcm"))
            .arg("serve")
            .arg("--data-dir")
            .arg(dir.path())
            .args([
                "--env",
                "kvcm.service.rpc_port=0",
                "--env",
                "kvcm.service.http_port=0",
            ])
            .args(["--env", "kvcm.service.admin_http_port=0", "--env", setting])
            .output()
            .expect("run kvcm");
        assert!(!output.status.success(), "{setting} must fail");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(named), "{setting}: {stderr}");
    }
}
