//! The access log of a real `kvcm serve`: one line per gRPC and HTTP call, refusals
//! included, with the trace id, status and peer of each; bodies only when asked for, with
//! secrets and prompts redacted; rotation by size; no log when disabled.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{wait_until, TestServer};
use kvcm::proto::meta;
use kvcm_optimizer::trace::events::RotatingLog;
use serde_json::{json, Value};

/// Every line of the log of file stem `stem` in `dir`, oldest first.
fn log_lines(dir: &Path, stem: &str) -> Vec<Value> {
    RotatingLog::files_oldest_first(dir, stem)
        .iter()
        .flat_map(|path| {
            // A file renamed away since the listing is read on the next poll.
            let text = std::fs::read_to_string(path).unwrap_or_default();
            // A line still being written has no newline yet.
            let complete = &text[..text.rfind('\n').map_or(0, |end| end + 1)];
            complete
                .lines()
                .map(|line| serde_json::from_str(line).expect("a line is one JSON object"))
                .collect::<Vec<Value>>()
        })
        .collect()
}

/// The access log's lines once one with `trace_id` has been written (the writer flushes
/// within ~20 ms).
async fn lines_through(dir: &Path, trace_id: &str) -> Vec<Value> {
    stem_lines_through(dir, "access", trace_id).await
}

/// The lines of the log of stem `stem` once one with `trace_id` has been written.
///
/// A read that races a rotation can miss the file being renamed, so the lines
/// returned come from a second read begun after the line was seen: the
/// rotation that preceded its write is complete by then.
async fn stem_lines_through(dir: &Path, stem: &str, trace_id: &str) -> Vec<Value> {
    let written = wait_until(Duration::from_secs(10), async || {
        let lines = log_lines(dir, stem);
        lines
            .iter()
            .any(|line| line["trace_id"] == trace_id)
            .then_some(())
    })
    .await;
    if written.is_none() {
        panic!("no {stem} line for {trace_id}: {:?}", log_lines(dir, stem));
    }
    log_lines(dir, stem)
}

/// The one line of `api` with `trace_id`.
fn line<'a>(lines: &'a [Value], api: &str, trace_id: &str) -> &'a Value {
    let found: Vec<&Value> = lines
        .iter()
        .filter(|line| line["api_name"] == api && line["trace_id"] == trace_id)
        .collect();
    assert_eq!(found.len(), 1, "{api} {trace_id}: {lines:?}");
    found[0]
}

#[tokio::test]
async fn every_call_gets_a_line_with_its_status_peer_and_redacted_bodies() {
    let logs = tempfile::tempdir().expect("temp dir");
    let server = TestServer::start_with(&[
        &format!("kvcm.access_log.dir={}", logs.path().display()),
        "kvcm.access_log.bodies=true",
        "kvcm.service.http_max_body_bytes=2000",
    ])
    .await;
    server.register("inst", 16).await;
    let mut meta = server.meta().await;
    let lookup = |trace_id: &str, instance_id: &str| meta::GetCacheLocationRequest {
        trace_id: trace_id.into(),
        instance_id: instance_id.into(),
        query_type: meta::QueryType::QtPrefixMatch as i32,
        token_ids: (0..32).collect(),
        ..Default::default()
    };
    let found = meta.get_cache_location(lookup("grpc-lookup", "inst")).await;
    assert_eq!(
        common::grpc_code(&found.unwrap().into_inner().header),
        meta::ErrorCode::Ok
    );
    let ghost = meta.get_cache_location(lookup("ghost", "nobody")).await;
    let ghost_code = common::grpc_code(&ghost.unwrap().into_inner().header);
    assert_eq!(ghost_code, meta::ErrorCode::InstanceNotExist);
    let account = json!({"trace_id": "acct", "user_name": "alice",
        "password": "hunter2-secret", "role": "ROLE_ADMIN"});
    assert_eq!(
        common::code(&server.admin_http("addAccount", account).await),
        "OK"
    );
    let (status, _) = server
        .post_raw("http", "/api/getCacheLocation", b"{not json")
        .await;
    assert_eq!(status, 400);
    let (status, _) = server
        .post_raw("http", "/api/getCacheLocation", &[b' '; 3000])
        .await;
    assert_eq!(status, 413);
    let last = json!({"trace_id": "last", "instance_id": "inst"});
    server.meta_http("getInstanceInfo", last).await;

    let lines = lines_through(logs.path(), "last").await;
    let register = line(&lines, "RegisterInstance", "reg");
    assert_eq!(register["transport"], "http");
    assert_eq!(register["service"], "meta");
    let ok = json!(meta::ErrorCode::Ok as i32);
    let statuses = (&register["status_code"], &register["http_status"]);
    assert_eq!(statuses, (&ok, &json!(200)));
    assert_eq!(register["client_ip"], "127.0.0.1");
    assert!(register["client_port"]
        .as_u64()
        .is_some_and(|port| port > 0));
    assert_eq!(register["request"]["instance_id"], "inst");
    assert_eq!(register["response"]["header"]["status"]["code"], "OK");
    let request_id = register["request_id"].as_str().unwrap();
    assert!(request_id.starts_with("reg_"), "{request_id}");
    let begin = register["request_begin_time"].as_str().unwrap();
    assert!(begin.len() == 27 && begin.ends_with('Z'), "{begin}");

    let grpc = line(&lines, "GetCacheLocation", "grpc-lookup");
    assert_eq!(grpc["transport"], "grpc");
    assert_eq!(grpc["http_status"], Value::Null);
    assert_eq!(grpc["client_ip"], "127.0.0.1");
    assert_eq!(grpc["status_code"], ok);
    assert_eq!(grpc["request"]["token_ids"], "<redacted: 32 token ids>");
    assert!(grpc["request_cost_time_us"].as_u64().is_some());

    let ghost = line(&lines, "GetCacheLocation", "ghost");
    assert_eq!(
        ghost["status_code"],
        meta::ErrorCode::InstanceNotExist as i32
    );

    let account = line(&lines, "AddAccount", "acct");
    assert_eq!(account["service"], "admin");
    assert_eq!(account["request"]["password"], "<redacted>");
    assert_eq!(account["request"]["user_name"], "alice");

    let refused: Vec<&Value> = lines.iter().filter(|l| l["trace_id"] == "").collect();
    let statuses: Vec<(&Value, &Value)> = refused
        .iter()
        .map(|l| (&l["http_status"], &l["status_code"]))
        .collect();
    assert_eq!(
        statuses,
        [(&json!(400), &Value::Null), (&json!(413), &Value::Null)],
        "{refused:?}"
    );
    assert_eq!(refused[0]["request"], json!({"kvcm_unparsed_bytes": 9}));
    assert_eq!(refused[0]["response"], json!({}));

    for path in RotatingLog::files_oldest_first(logs.path(), "access") {
        let text = std::fs::read_to_string(path).unwrap();
        assert!(
            !text.contains("hunter2-secret"),
            "a password reached the log"
        );
    }
    let (status, metrics) = server
        .post_raw("admin_http", "/api/getMetrics", b"{}")
        .await;
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&metrics).contains("access_log.dropped"));
}

#[tokio::test]
async fn bodies_are_off_by_default_and_the_log_rotates_by_size() {
    let server = TestServer::start_with(&[
        "kvcm.access_log.max_file_bytes=2000",
        "kvcm.access_log.keep_files=2",
    ])
    .await;
    server.register("inst", 16).await;
    for i in 0..40 {
        let body = json!({"trace_id": format!("info-{i}"), "instance_id": "inst"});
        server.meta_http("getInstanceInfo", body).await;
    }
    let dir = server.dir.path().join("access");
    let lines = lines_through(&dir, "info-39").await;
    let files = RotatingLog::files_oldest_first(&dir, "access");
    assert_eq!(files.len(), 3, "{files:?}");
    for file in &files {
        assert!(std::fs::metadata(file).unwrap().len() <= 2000, "{file:?}");
    }
    assert!(lines.len() < 41, "the oldest lines rotated out");
    let traces: Vec<&str> = lines
        .iter()
        .filter(|line| line["api_name"] == "GetInstanceInfo")
        .map(|line| line["trace_id"].as_str().unwrap())
        .collect();
    let first: usize = traces[0].trim_start_matches("info-").parse().unwrap();
    let expected: Vec<String> = (first..40).map(|i| format!("info-{i}")).collect();
    assert_eq!(
        traces, expected,
        "lines are written in order, none lost in between"
    );
    for line in &lines {
        assert_eq!(
            (&line["request"], &line["response"]),
            (&json!({}), &json!({}))
        );
    }
    let prometheus = common::http_request(server.address("admin_http"), "GET", "/metrics", b"");
    let (_, text) = prometheus.await;
    assert!(String::from_utf8_lossy(&text).contains("\nkvcm_access_log_dropped 0"));
}

#[tokio::test]
async fn a_disabled_access_log_writes_nothing() {
    let server = TestServer::start_with(&["kvcm.access_log.enabled=false"]).await;
    server.register("inst", 16).await;
    // The directory is created when the log opens, before the server reports ready.
    assert!(!server.dir.path().join("access").exists());
    assert!(server.dir.path().join("events").exists());
}

/// An admin HTTP call of `rpc` with these header lines; returns the status.
async fn admin_post(server: &TestServer, rpc: &str, headers: &[&str], body: Value) -> u16 {
    let path = format!("/api/{rpc}");
    let address = server.address("admin_http");
    let body = body.to_string();
    let (status, _, _) =
        common::http_exchange(address, "POST", &path, headers, body.as_bytes()).await;
    status
}

#[tokio::test]
async fn the_audit_log_holds_state_changing_admin_calls_and_token_refusals_with_their_caller() {
    const TOKEN: &str = "audit-token-7f3";
    let server = TestServer::start_with(&[
        &format!("kvcm.service.admin_auth_token={TOKEN}"),
        "kvcm.service.admin_auth_grpc=true",
    ])
    .await;
    let bearer = format!("Authorization: Bearer {TOKEN}");
    let account = json!({"trace_id": "acct", "user_name": "bob",
        "password": "pw-9a8b", "role": "ROLE_ADMIN"});
    assert_eq!(
        admin_post(&server, "addAccount", &[&bearer], account.clone()).await,
        200
    );
    let list = json!({"trace_id": "list"});
    assert_eq!(
        admin_post(&server, "listStorage", &[&bearer], list).await,
        200
    );
    assert_eq!(
        admin_post(&server, "addAccount", &[], account.clone()).await,
        401
    );
    let wrong = ["Authorization: Bearer not-it"];
    assert_eq!(
        admin_post(&server, "removeStorage", &wrong, json!({})).await,
        401
    );
    let mut admin = server.admin().await;
    let refused = admin.list_storage(kvcm::proto::admin::ListStorageRequest::default());
    assert_eq!(
        refused.await.unwrap_err().code(),
        tonic::Code::Unauthenticated
    );
    server
        .meta_http("getClusterInfo", json!({"trace_id": "meta"}))
        .await;
    let last =
        json!({"trace_id": "last", "user_name": "carol", "password": "x", "role": "ROLE_ADMIN"});
    assert_eq!(
        admin_post(&server, "addAccount", &[&bearer], last).await,
        200
    );

    let audit_dir = server.dir.path().join("audit");
    let audit = stem_lines_through(&audit_dir, "audit", "last").await;
    let summary: Vec<(&str, &str, &Value, &Value)> = audit
        .iter()
        .map(|line| {
            let api = line["api_name"].as_str().unwrap();
            let transport = line["transport"].as_str().unwrap();
            (api, transport, &line["http_status"], &line["caller"])
        })
        .collect();
    let caller = json!(format!("{:08x}", fnv1a(TOKEN.as_bytes())));
    let (ok, refused) = (json!(200), json!(401));
    assert_eq!(
        summary,
        [
            ("AddAccount", "http", &ok, &caller),
            ("AddAccount", "http", &refused, &Value::Null),
            ("RemoveStorage", "http", &refused, &Value::Null),
            ("AdminService", "grpc", &Value::Null, &Value::Null),
            ("AddAccount", "http", &ok, &caller),
        ],
        "read-only and meta calls are not audited: {audit:?}"
    );
    assert_eq!(audit[0]["request"]["password"], "<redacted>");
    assert_eq!(audit[0]["request"]["user_name"], "bob");
    assert_eq!(audit[0]["response"]["header"]["status"]["code"], "OK");
    let reasons: Vec<&Value> = audit[1..4]
        .iter()
        .map(|l| &l["response"]["kvcm_reason"])
        .collect();
    assert_eq!(
        reasons,
        [
            "a bearer token (admin token or API key) is required",
            "the bearer token is not valid",
            "a bearer token (admin token or API key) is required",
        ]
    );

    let access = lines_through(&server.dir.path().join("access"), "last").await;
    let listed = line(&access, "ListStorage", "list");
    assert_eq!(
        (&listed["caller"], &listed["request"]),
        (&caller, &json!({}))
    );
    assert_eq!(access.iter().filter(|l| l["http_status"] == 401).count(), 2);
    for dir in [audit_dir, server.dir.path().join("access")] {
        for path in
            RotatingLog::files_oldest_first(&dir, dir.file_name().unwrap().to_str().unwrap())
        {
            let text = std::fs::read_to_string(path).unwrap();
            assert!(
                !text.contains(TOKEN) && !text.contains("pw-9a8b"),
                "a secret reached a log"
            );
        }
    }
}

/// 32-bit FNV-1a: the token fingerprint ListAdminAuthTokens answers.
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |hash, &b| {
        (hash ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}
