//! Security against a real `kvcm serve` (docs/security.md): admin bearer tokens on admin
//! and debug HTTP (and, when asked, admin gRPC), the loopback default of the admin
//! listeners, and the request limits, each refusal naming its limit.

mod common;

use std::net::SocketAddr;

use common::{code, http_exchange, nfs_group, nfs_storage, TestServer};
use serde_json::{json, Value};

const TOKENS: &str = "kvcm.service.admin_auth_token= first-secret , second-secret ";

/// A GET or POST on `listener` with these header lines: status, head, body.
async fn request(
    server: &TestServer,
    listener: &str,
    method: &str,
    path: &str,
    headers: &[&str],
) -> (u16, String, String) {
    let address = server.address(listener);
    let body: &[u8] = if method == "POST" { b"{}" } else { b"" };
    let (status, head, body) = http_exchange(address, method, path, headers, body).await;
    (
        status,
        head.to_ascii_lowercase(),
        String::from_utf8_lossy(&body).into(),
    )
}

/// Asserts a 401 with the trunk's body and this `WWW-Authenticate` value.
fn assert_refused(answer: &(u16, String, String), challenge: &str, what: &str) {
    let (status, head, body) = answer;
    assert_eq!(*status, 401, "{what}: {body}");
    assert_eq!(body, r#"{"error":"unauthorized"}"#, "{what}");
    let expected = format!("www-authenticate: {}", challenge.to_ascii_lowercase());
    assert!(head.contains(&expected), "{what}: {head}");
}

#[tokio::test]
async fn admin_and_debug_http_demand_a_configured_bearer_token() {
    let server = TestServer::start_with(&[TOKENS]).await;
    let routes = [
        ("admin_http", "POST", "/api/listStorage"),
        ("admin_http", "GET", "/metrics"),
        ("admin_http", "GET", "/api/healthy"),
        ("debug_http", "POST", "/api/clearFaults"),
    ];
    for (listener, method, path) in routes {
        let what = format!("{listener} {method} {path}");
        let call =
            |headers: &'static [&'static str]| request(&server, listener, method, path, headers);
        assert_refused(&call(&[]).await, r#"Bearer realm="kvcm""#, &what);
        let malformed = r#"Bearer realm="kvcm", error="invalid_request""#;
        assert_refused(
            &call(&["Authorization: Basic Zmlyc3Q="]).await,
            malformed,
            &what,
        );
        assert_refused(
            &call(&["Authorization: Bearer first secret"]).await,
            malformed,
            &what,
        );
        let unknown = r#"Bearer realm="kvcm", error="invalid_token""#;
        assert_refused(
            &call(&["Authorization: Bearer first-secre"]).await,
            unknown,
            &what,
        );
        for good in [
            "Authorization: Bearer first-secret",
            "authorization: bEaReR \tsecond-secret",
        ] {
            let (status, _, body) = request(&server, listener, method, path, &[good]).await;
            assert_eq!(status, 200, "{what} with {good:?}: {body}");
        }
    }
    // Meta HTTP and gRPC stay open (upstream: the token guards admin and debug HTTP only).
    let info = server.meta_http("getClusterInfo", json!({})).await;
    assert_eq!(code(&info), "OK");
    let mut admin = server.admin().await;
    let storages = admin
        .list_storage(kvcm::proto::admin::ListStorageRequest::default())
        .await
        .expect("admin gRPC stays open by default");
    assert!(!storages.into_inner().storage.is_empty());
    let log = server.log();
    assert!(
        !log.contains("first-secret") && !log.contains("second-secret"),
        "{log}"
    );
}

#[tokio::test]
async fn admin_grpc_demands_the_token_as_metadata_when_asked() {
    let server = TestServer::start_with(&[TOKENS, "kvcm.service.admin_auth_grpc=true"]).await;
    let mut admin = server.admin().await;
    let list = || kvcm::proto::admin::ListStorageRequest::default();
    let refusal = admin.list_storage(list()).await.expect_err("no token");
    assert_eq!(refusal.code(), tonic::Code::Unauthenticated);
    assert!(
        !refusal.message().contains("secret"),
        "{}",
        refusal.message()
    );
    let mut wrong = tonic::Request::new(list());
    let value = "Bearer nope".parse().expect("metadata");
    wrong.metadata_mut().insert("authorization", value);
    let refusal = admin.list_storage(wrong).await.expect_err("unknown token");
    assert_eq!(refusal.code(), tonic::Code::Unauthenticated);
    let mut right = tonic::Request::new(list());
    let value = "Bearer second-secret".parse().expect("metadata");
    right.metadata_mut().insert("authorization", value);
    admin.list_storage(right).await.expect("a configured token");
    // MetaService on the same port stays open.
    let mut meta = server.meta().await;
    let info = meta
        .get_cluster_info(kvcm::proto::meta::GetClusterInfoRequest::default())
        .await
        .expect("meta gRPC is open");
    assert!(info.into_inner().header.is_some());
}

fn is_loopback(address: &SocketAddr) -> bool {
    address.ip().is_loopback()
}

#[tokio::test]
async fn admin_listeners_bind_loopback_unless_a_token_or_bind_host_is_set() {
    let open = TestServer::start().await;
    let bound = open.bound_addresses();
    assert!(is_loopback(&bound["admin_http"]), "{bound:?}");
    assert!(is_loopback(&bound["debug_http"]), "{bound:?}");
    assert!(bound["http"].ip().is_unspecified(), "{bound:?}");
    assert!(bound["grpc"].ip().is_unspecified(), "{bound:?}");
    let log = open.log();
    assert!(
        log.contains("admin and debug listeners bind 127.0.0.1 only"),
        "{log}"
    );
    assert!(
        log.contains("kvcm.service.admin_auth_token is not set"),
        "{log}"
    );
    // Still served over loopback, open.
    let storages = open.admin_http("listStorage", json!({})).await;
    assert_eq!(code(&storages), "OK");

    for setting in [TOKENS, "kvcm.service.bind_host=0.0.0.0"] {
        let server = TestServer::start_with(&[setting]).await;
        let bound = server.bound_addresses();
        assert!(
            bound["admin_http"].ip().is_unspecified(),
            "{setting}: {bound:?}"
        );
        assert!(
            bound["debug_http"].ip().is_unspecified(),
            "{setting}: {bound:?}"
        );
        assert!(!server.log().contains("bind 127.0.0.1 only"), "{setting}");
    }
    let server = TestServer::start_with(&["kvcm.service.bind_host=127.0.0.1"]).await;
    let bound = server.bound_addresses();
    assert!(
        bound.values().all(is_loopback),
        "bind_host applies to every listener: {bound:?}"
    );
}

/// A registration of `id` in `group` with these spec names (1 KiB each).
fn registration(group: &str, id: &str, specs: &[String]) -> Value {
    let specs: Vec<Value> = specs
        .iter()
        .map(|n| json!({"name": n, "size": 1024}))
        .collect();
    json!({
        "instance_group": group, "instance_id": id, "block_size": 16,
        "model_deployment": {"model_name": "m", "dtype": "fp16"},
        "location_spec_infos": specs,
    })
}

/// `(code, message)` of a JSON answer.
fn status(answer: &Value) -> (String, String) {
    let message = answer["header"]["status"]["message"].as_str().unwrap_or("");
    (code(answer).to_string(), message.to_string())
}

/// Asserts INVALID_ARGUMENT with a message containing `naming`.
fn assert_invalid(answer: &Value, naming: &str, what: &str) {
    let (code, message) = status(answer);
    assert_eq!(code, "INVALID_ARGUMENT", "{what}: {answer}");
    assert!(
        message.contains(naming),
        "{what}: {message:?} should name {naming}"
    );
}

/// A request of `rpc` for `count` keys of instance `id`.
fn keys_body(rpc: &str, id: &str, count: i64) -> Value {
    let mut body = json!({"instance_id": id, "block_keys": (0..count).collect::<Vec<i64>>()});
    match rpc {
        "getCacheLocation" | "getCacheLocationLen" => body["query_type"] = json!("QT_PREFIX_MATCH"),
        "startWriteCache" => body["write_timeout_seconds"] = json!(30),
        _ => {}
    }
    body
}

#[tokio::test]
async fn keys_per_request_are_bounded_on_every_keyed_rpc() {
    let server = TestServer::start_with(&["kvcm.service.max_keys_per_request=1000"]).await;
    server.register("inst", 16).await;
    for rpc in [
        "getCacheLocation",
        "getCacheLocationLen",
        "getCacheMeta",
        "startWriteCache",
        "removeCache",
    ] {
        let refused = server.meta_http(rpc, keys_body(rpc, "inst", 1001)).await;
        assert_invalid(&refused, "kvcm.service.max_keys_per_request = 1000", rpc);
        let served = server.meta_http(rpc, keys_body(rpc, "inst", 1000)).await;
        assert_eq!(code(&served), "OK", "{rpc}: {served}");
    }
    // Keys derived from token ids count as well: 1001 blocks of 16 tokens.
    let tokens: Vec<i64> = (0..16 * 1001).collect();
    let body = json!({"instance_id": "inst", "token_ids": tokens, "query_type": "QT_PREFIX_MATCH"});
    let refused = server.meta_http("getCacheLocation", body).await;
    assert_invalid(&refused, "max_keys_per_request", "token ids");
    // A refused StartWriteCache opened nothing: key 1000 was never written.
    assert_eq!(server.statuses("inst", &[1000]).await, ["CLS_NOT_FOUND"]);
}

/// The issue's 615k-key GetCacheLocation on an instance with 8 spec names of 255 bytes.
async fn issue_request(server: &TestServer) -> Value {
    let specs: Vec<String> = (0..8).map(|i| format!("{i}").repeat(255)).collect();
    let registered = server
        .meta_http("registerInstance", registration("default", "wide", &specs))
        .await;
    assert_eq!(code(&registered), "OK", "{registered}");
    server
        .meta_http(
            "getCacheLocation",
            keys_body("getCacheLocation", "wide", 615_000),
        )
        .await
}

#[tokio::test]
async fn the_issues_615k_missing_keys_are_refused_by_default() {
    let server = TestServer::start_with(&["kvcm.service.http_max_body_bytes=8388608"]).await;
    let idle = common::rss_bytes(server.pid());
    let refused = issue_request(&server).await;
    assert_invalid(
        &refused,
        "kvcm.service.max_keys_per_request = 131072",
        "615k keys",
    );
    let after = common::rss_bytes(server.pid());
    assert!(
        after < idle + (256 << 20),
        "RSS grew from {idle} to {after} bytes"
    );
}

/// Resident set size of process `pid` (Linux `/proc/<pid>/status`).

#[tokio::test]
async fn an_answer_estimated_beyond_max_response_bytes_is_refused() {
    let settings = [
        "kvcm.service.http_max_body_bytes=8388608",
        "kvcm.service.max_keys_per_request=1000000",
    ];
    let server = TestServer::start_with(&settings).await;
    let refused = issue_request(&server).await;
    assert_invalid(
        &refused,
        "kvcm.service.max_response_bytes",
        "615k keys x 8 specs",
    );
    // A request whose answer fits is served, placeholders and all.
    let served = server
        .meta_http(
            "getCacheLocation",
            keys_body("getCacheLocation", "wide", 1000),
        )
        .await;
    assert_eq!(code(&served), "OK", "{served}");
}

#[tokio::test]
async fn names_longer_than_a_path_component_are_refused_naming_the_field() {
    let server = TestServer::start().await;
    let long = |n: usize| "n".repeat(n);
    let one_spec = [String::from("tp0")];
    let huge_id = server
        .meta_http(
            "registerInstance",
            registration("default", &long(1 << 20), &one_spec),
        )
        .await;
    assert_invalid(&huge_id, "instance_id", "1 MiB instance id");
    assert!(
        status(&huge_id).1.len() < 1024,
        "the message does not echo the name"
    );
    let spec = server
        .meta_http(
            "registerInstance",
            registration("default", "ok", &[long(256)]),
        )
        .await;
    assert_invalid(&spec, "location_spec_infos.name", "256-byte spec name");
    let longest = server
        .meta_http(
            "registerInstance",
            registration("default", &long(255), &[long(255)]),
        )
        .await;
    assert_eq!(code(&longest), "OK", "255 bytes fit: {longest}");

    let root = server.dir.path().join("long");
    let storage = server
        .admin_http(
            "addStorage",
            json!({"storage": nfs_storage(&long(256), &root)}),
        )
        .await;
    assert_invalid(&storage, "global_unique_name", "256-byte storage name");
    let created = server
        .admin_http(
            "createInstanceGroup",
            json!({"instance_group": nfs_group(&long(256), &["default_file"])}),
        )
        .await;
    assert_invalid(&created, "instance_group.name", "256-byte group name");
    let listed = server
        .admin_http(
            "listInstanceInfo",
            json!({"instance_group_name": "default"}),
        )
        .await;
    let ids: Vec<&str> = listed["instance_info"]
        .as_array()
        .expect("instances")
        .iter()
        .filter_map(|i| i["instance_id"].as_str())
        .collect();
    assert_eq!(
        ids,
        [long(255)],
        "only the registration that fits was stored"
    );
}

#[tokio::test]
async fn storage_roots_in_system_directories_are_refused() {
    let server = TestServer::start().await;
    let absent = "/etc/kvcm-security-test/";
    for root in [
        "/",
        "/dev/",
        "/etc/passwd",
        absent,
        "/usr/lib/kvcm/",
        "/proc/1/",
        "/lib64/x/",
    ] {
        let storage = json!({"global_unique_name": "sys",
                             "nfs": {"root_path": root, "key_count_per_file": 1}});
        let refused = server
            .admin_http("addStorage", json!({"storage": storage}))
            .await;
        assert_invalid(&refused, "storage_spec.root_path", root);
    }
    assert!(
        !std::path::Path::new(absent).exists(),
        "nothing was created"
    );
    let storages = server.admin_http("listStorage", json!({})).await;
    let names: Vec<&str> = storages["storage"]
        .as_array()
        .expect("storages")
        .iter()
        .filter_map(|s| s["global_unique_name"].as_str())
        .collect();
    assert!(!names.contains(&"sys"), "{names:?}");
    // A temporary directory stays allowed.
    let root = server.dir.path().join("tmp-root");
    let added = server
        .admin_http("addStorage", json!({"storage": nfs_storage("tmp", &root)}))
        .await;
    assert_eq!(code(&added), "OK", "{added}");
}

#[tokio::test]
async fn storage_roots_outside_the_allow_list_are_refused() {
    // The server's data dir and `allowed` lie in the temporary directory; `outside` does not.
    let temp = std::env::temp_dir().canonicalize().expect("temp dir");
    // The build's own temporary directory, or /var/tmp when the checkout itself lies in the
    // temporary directory.
    let base = [env!("CARGO_TARGET_TMPDIR"), "/var/tmp"]
        .into_iter()
        .map(|dir| std::path::Path::new(dir).canonicalize().expect("dir"))
        .find(|dir| !dir.starts_with(&temp))
        .expect("a directory outside the temporary directory");
    let outside = tempfile::tempdir_in(base).expect("outside dir");
    let setting = format!("kvcm.service.storage_root_allow_list={}", temp.display());
    let server = TestServer::start_with(&[&setting]).await;
    let target = outside.path().join("kv");
    let refused = server
        .admin_http(
            "addStorage",
            json!({"storage": nfs_storage("out", &target)}),
        )
        .await;
    assert_invalid(
        &refused,
        "kvcm.service.storage_root_allow_list",
        "outside root",
    );
    assert!(!target.exists(), "nothing was created outside the list");
    let allowed = server.dir.path().join("allowed");
    let added = server
        .admin_http(
            "addStorage",
            json!({"storage": nfs_storage("in", &allowed)}),
        )
        .await;
    assert_eq!(code(&added), "OK", "{added}");
    // An update may not move a storage out of the list either.
    let moved = server
        .admin_http(
            "updateStorage",
            json!({"storage": nfs_storage("in", &target)}),
        )
        .await;
    assert_invalid(&moved, "kvcm.service.storage_root_allow_list", "update");
    assert!(!target.exists(), "nothing was created outside the list");
}

/// Every file under `dir`, recursively.
fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_under(&path));
        } else {
            found.push(path);
        }
    }
    found
}

#[tokio::test]
async fn client_names_never_make_files_outside_the_storage_root() {
    let server = TestServer::start().await;
    let outer = tempfile::tempdir().expect("temp dir");
    let root = outer.path().join("a").join("root");
    let added = server
        .admin_http("addStorage", json!({"storage": nfs_storage("walk", &root)}))
        .await;
    assert_eq!(code(&added), "OK", "{added}");
    let created = server
        .admin_http(
            "createInstanceGroup",
            json!({"instance_group": nfs_group("walk", &["walk"])}),
        )
        .await;
    assert_eq!(code(&created), "OK", "{created}");
    let hostile = ["../../x", "/abs", "a/../../b", "a\0b", "..", ".", ""];
    let tp0 = [String::from("tp0")];
    for name in hostile {
        let as_id = server
            .meta_http("registerInstance", registration("walk", name, &tp0))
            .await;
        assert_invalid(&as_id, "instance_id", name);
        let as_spec = [name.to_string()];
        let as_spec = server
            .meta_http("registerInstance", registration("walk", "ok", &as_spec))
            .await;
        assert_invalid(&as_spec, "location_spec_infos", name);
        let write = json!({"instance_id": name, "block_keys": [1], "write_timeout_seconds": 30});
        let write = server.meta_http("startWriteCache", write).await;
        assert_eq!(code(&write), "INSTANCE_NOT_EXIST", "{name:?}: {write}");
    }
    // A legitimate instance writes, and every file lies under the root.
    let registered = server
        .meta_http("registerInstance", registration("walk", "ok", &tp0))
        .await;
    assert_eq!(code(&registered), "OK", "{registered}");
    // A client writes each block where its URI says (the file tier's own writes too).
    let start = server.write_keys("ok", &[1, 2]).await;
    let parts = start["locations"].as_array().expect("locations").iter();
    let specs = parts.flat_map(|l| l["location_specs"].as_array().expect("specs").iter());
    for uri in specs.filter_map(|spec| spec["uri"].as_str()) {
        let block = kvcm_data::parse_block_uri(uri).expect("a file URI");
        std::fs::create_dir_all(block.path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&block.path, b"block").expect("write the block");
    }
    let files = files_under(outer.path());
    assert!(!files.is_empty(), "the blocks were written");
    for file in &files {
        assert!(
            file.starts_with(&root),
            "{} lies outside {}",
            file.display(),
            root.display()
        );
    }
}

/// Reads until the server closes `stream` (EOF or reset); false if it stays open `limit`.
async fn closed_by_server(stream: &mut tokio::net::TcpStream, limit: std::time::Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut sink = [0u8; 256];
    let drain = async {
        while let Ok(read) = stream.read(&mut sink).await {
            if read == 0 {
                return;
            }
        }
    };
    tokio::time::timeout(limit, drain).await.is_ok()
}

#[tokio::test]
async fn a_listener_full_of_idle_connections_leaves_the_others_answering() {
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;
    let settings = [
        "kvcm.service.max_connections_per_listener=32",
        "kvcm.service.idle_timeout_ms=1500",
    ];
    let server = TestServer::start_with(&settings).await;
    let meta = server.address("http");
    let mut idle = Vec::new();
    for _ in 0..64 {
        idle.push(tokio::net::TcpStream::connect(meta).await.expect("connect"));
    }
    // One of them has sent half a request head, and stops.
    idle[0]
        .write_all(b"POST /api/getClusterInfo HTTP/1.1\r\nHost:")
        .await
        .expect("half a head");
    let full = tokio::time::timeout(
        Duration::from_millis(300),
        common::http_request(meta, "POST", "/api/getClusterInfo", b"{}"),
    );
    assert!(
        full.await.is_err(),
        "meta HTTP is full: 32 connections open, 32 queued"
    );
    // Every other listener answers within 1 s.
    let second = Duration::from_secs(1);
    let admin = common::http_request(
        server.address("admin_http"),
        "POST",
        "/api/listStorage",
        b"{}",
    );
    let (status, _) = tokio::time::timeout(second, admin)
        .await
        .expect("admin HTTP in 1 s");
    assert_eq!(status, 200);
    let debug = common::http_request(
        server.address("debug_http"),
        "POST",
        "/api/clearFaults",
        b"{}",
    );
    let (status, _) = tokio::time::timeout(second, debug)
        .await
        .expect("debug HTTP in 1 s");
    assert_eq!(status, 200);
    let grpc = async {
        let mut client = server.meta().await;
        client
            .get_cluster_info(kvcm::proto::meta::GetClusterInfoRequest::default())
            .await
    };
    let answer = tokio::time::timeout(second, grpc)
        .await
        .expect("gRPC in 1 s");
    assert!(answer.is_ok(), "{answer:?}");
    // The idle timeout closes the silent and the half-sent connections; meta HTTP answers again.
    let limit = Duration::from_secs(15);
    assert!(
        closed_by_server(&mut idle[0], limit).await,
        "half a head is timed out"
    );
    assert!(
        closed_by_server(&mut idle[1], limit).await,
        "an idle connection is timed out"
    );
    let info = common::wait_until(limit, async || {
        let probe = common::http_request(meta, "POST", "/api/getClusterInfo", b"{}");
        let answered = tokio::time::timeout(Duration::from_millis(500), probe).await;
        answered.ok().filter(|(status, _)| *status == 200)
    })
    .await;
    assert!(
        info.is_some(),
        "meta HTTP answers once idle connections are closed"
    );
}

/// Sends `bytes` one at a time, `every` apart (each before the idle timeout), until the
/// server closes the connection; what the server sent, or `None` if every byte went out
/// and the connection stayed open `grace` after the last.
async fn trickle(
    stream: &mut tokio::net::TcpStream,
    bytes: &[u8],
    every: std::time::Duration,
    grace: std::time::Duration,
) -> Option<Vec<u8>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut answer = Vec::new();
    for byte in bytes {
        tokio::select! {
            _ = stream.read_to_end(&mut answer) => return Some(answer),
            _ = tokio::time::sleep(every) => {}
        }
        if stream.write_all(std::slice::from_ref(byte)).await.is_err() {
            return Some(answer);
        }
    }
    let closed = tokio::time::timeout(grace, stream.read_to_end(&mut answer)).await;
    closed.is_ok().then_some(answer)
}

/// Every listener's HTTP routes, kvcm's own (pool membership, lookup bootstrap) included.
#[tokio::test]
async fn a_trickled_request_head_or_body_meets_its_deadline() {
    use std::time::{Duration, Instant};
    use tokio::io::AsyncWriteExt;
    let settings = [
        "kvcm.service.idle_timeout_ms=60000",
        "kvcm.service.header_timeout_ms=1000",
        "kvcm.service.body_timeout_ms=1000",
    ];
    let server = TestServer::start_with(&settings).await;
    let every = Duration::from_millis(100);
    let too_slow = r#"{"error":"the body is too large or too slow"}"#;
    let routes = [
        ("http", "/api/getClusterInfo", "{}"),
        ("admin_http", "/api/listStorage", "{}"),
        ("debug_http", "/api/clearFaults", "{}"),
        ("http", "/kvcm/v1/poolJoin", too_slow),
        ("http", "/kvcm/v1/lookupBootstrap", too_slow),
    ];
    for (listener, route, refusal) in routes {
        // A head that never ends, one byte per 100 ms: closed at the header deadline.
        let mut stream = tokio::net::TcpStream::connect(server.address(listener))
            .await
            .expect("connect");
        let started = Instant::now();
        let head = [b"POST /api/x HTTP/1.1\r\nX: ".as_slice(), &[b'a'; 100]].concat();
        let closed = trickle(&mut stream, &head, every, Duration::from_secs(5)).await;
        assert!(closed.is_some(), "{listener}: a 10 s head is cut");
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(5),
            "{listener}: closed after {took:?}"
        );

        // A whole head, then a body of 100 bytes, one per 100 ms: 408 at the body deadline.
        let mut stream = tokio::net::TcpStream::connect(server.address(listener))
            .await
            .expect("connect");
        let head = format!("POST {route} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n");
        stream.write_all(head.as_bytes()).await.expect("head");
        let answer = trickle(&mut stream, &[b' '; 100], every, Duration::from_secs(5)).await;
        let answer =
            String::from_utf8_lossy(&answer.expect("the server answers and closes")).into_owned();
        assert!(answer.starts_with("HTTP/1.1 408"), "{listener}: {answer:?}");
        assert!(answer.ends_with(refusal), "{listener} {route}: {answer:?}");
    }
    // A request that keeps to both deadlines is served as before.
    let (status, _) =
        common::http_request(server.address("http"), "POST", "/api/getClusterInfo", b"{}").await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn open_sessions_per_instance_and_instances_per_group_are_bounded() {
    let settings = [
        "kvcm.service.max_sessions_per_instance=2",
        "kvcm.service.max_instances_per_group=3",
    ];
    let server = TestServer::start_with(&settings).await;
    for id in ["a", "b"] {
        assert_eq!(code(&server.register(id, 16).await), "OK");
    }
    let start = |id: &str, key: i64| json!({"instance_id": id, "block_keys": [key], "write_timeout_seconds": 600});
    let first = server.meta_http("startWriteCache", start("a", 1)).await;
    assert_eq!(code(&first), "OK", "{first}");
    let second = server.meta_http("startWriteCache", start("a", 2)).await;
    assert_eq!(code(&second), "OK", "{second}");
    let third = server.meta_http("startWriteCache", start("a", 3)).await;
    let (code_3, message) = status(&third);
    assert_eq!(code_3, "REACH_MAX_ENTITY_CAPACITY", "{third}");
    assert!(
        message.contains("kvcm.service.max_sessions_per_instance"),
        "{message}"
    );
    let other = server.meta_http("startWriteCache", start("b", 3)).await;
    assert_eq!(code(&other), "OK", "the limit is per instance: {other}");
    // The refused session left nothing behind: key 3 of `a` is unknown once its
    // allocation is undone.
    let cleaned = common::wait_until(std::time::Duration::from_secs(10), async || {
        let statuses = server.statuses("a", &[3]).await;
        (statuses == ["CLS_NOT_FOUND"]).then_some(())
    })
    .await;
    assert!(cleaned.is_some(), "key 3 of a was left allocated");
    let finish = json!({"instance_id": "a", "write_session_id": first["write_session_id"],
                        "success_blocks": {"offset": 1}});
    assert_eq!(
        code(&server.meta_http("finishWriteCache", finish).await),
        "OK"
    );
    let fourth = server.meta_http("startWriteCache", start("a", 4)).await;
    assert_eq!(
        code(&fourth),
        "OK",
        "a finished session frees its slot: {fourth}"
    );

    assert_eq!(code(&server.register("c", 16).await), "OK");
    let refused = server.register("d", 16).await;
    let (code_d, message) = status(&refused);
    assert_eq!(code_d, "REACH_MAX_ENTITY_CAPACITY", "{refused}");
    assert!(
        message.contains("kvcm.service.max_instances_per_group"),
        "{message}"
    );
    assert_eq!(
        code(&server.register("a", 16).await),
        "OK",
        "re-registering stays idempotent"
    );
    let info = server
        .meta_http("getInstanceInfo", json!({"instance_id": "d"}))
        .await;
    assert_eq!(code(&info), "INSTANCE_NOT_EXIST", "{info}");
}

#[tokio::test]
async fn a_body_over_http_max_body_bytes_is_refused_on_every_http_listener() {
    let server = TestServer::start_with(&["kvcm.service.http_max_body_bytes=65536"]).await;
    let body = vec![b' '; 10 << 20];
    for (listener, path) in [
        ("http", "/api/getCacheLocation"),
        ("admin_http", "/api/listStorage"),
        ("debug_http", "/api/clearFaults"),
    ] {
        let (status, _) = server.post_raw(listener, path, &body).await;
        assert_eq!(status, 413, "{listener}: a 10 MiB body");
    }
    let info = server.meta_http("getClusterInfo", json!({})).await;
    assert_eq!(code(&info), "OK", "the server still answers");
}

/// An admin HTTP call with these header lines; asserts 200 and returns the JSON.
async fn admin_with(server: &TestServer, rpc: &str, body: Value, headers: &[&str]) -> Value {
    let path = format!("/api/{rpc}");
    let address = server.address("admin_http");
    let bytes = body.to_string();
    let (status, _, answer) =
        http_exchange(address, "POST", &path, headers, bytes.as_bytes()).await;
    let text = String::from_utf8_lossy(&answer).to_string();
    assert_eq!(status, 200, "{rpc}: {text}");
    serde_json::from_str(&text).expect("JSON answer")
}

#[tokio::test]
async fn admin_tokens_are_listed_by_fingerprint_rotated_and_replaced_at_run_time() {
    let server = TestServer::start_with(&[TOKENS]).await;
    let first = ["Authorization: Bearer first-secret"];
    let listed = admin_with(&server, "listAdminAuthTokens", json!({}), &first).await;
    assert_eq!(listed["enforcing"], true, "{listed}");
    assert_eq!(listed["token_count"], 2, "{listed}");
    let prints: Vec<String> = serde_json::from_value(listed["fingerprints"].clone()).expect("list");
    assert_eq!(prints.len(), 2);
    let hex = |p: &String| p.len() == 8 && p.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'));
    assert!(
        prints.iter().all(hex) && prints[0] != prints[1],
        "{prints:?}"
    );
    assert!(
        !listed.to_string().contains("secret"),
        "never the tokens: {listed}"
    );

    let unknown = json!({"old_token": "no-such", "new_token": "third-secret"});
    let refused = admin_with(&server, "rotateAdminAuthToken", unknown, &first).await;
    assert_invalid(&refused, "old_token", "unknown old token");
    assert!(!refused.to_string().contains("no-such"), "{refused}");
    let empty = json!({"old_token": "first-secret", "new_token": ""});
    let refused = admin_with(&server, "rotateAdminAuthToken", empty, &first).await;
    assert_invalid(&refused, "new_token", "empty new token");
    let rotate = json!({"old_token": "first-secret", "new_token": "third-secret"});
    let rotated = admin_with(&server, "rotateAdminAuthToken", rotate, &first).await;
    assert_eq!(code(&rotated), "OK", "{rotated}");
    // The old token stops working on the very next request; the new one works.
    let old = request(&server, "admin_http", "POST", "/api/listStorage", &first).await;
    assert_refused(
        &old,
        r#"Bearer realm="kvcm", error="invalid_token""#,
        "rotated out",
    );
    let third = ["Authorization: Bearer third-secret"];
    let listed = admin_with(&server, "listAdminAuthTokens", json!({}), &third).await;
    let after: Vec<String> = serde_json::from_value(listed["fingerprints"].clone()).expect("list");
    assert_eq!(after.len(), 2, "{listed}");
    assert!(
        after.contains(&prints[1]) && !after.contains(&prints[0]),
        "{prints:?} → {after:?}"
    );

    let cleared = admin_with(&server, "setAdminAuthTokens", json!({"tokens": []}), &third).await;
    assert_eq!(code(&cleared), "OK", "{cleared}");
    let open = admin_with(&server, "listAdminAuthTokens", json!({}), &[]).await;
    assert_eq!(
        (open["enforcing"].clone(), open["token_count"].clone()),
        (json!(false), json!(0))
    );
    let set = admin_with(
        &server,
        "setAdminAuthTokens",
        json!({"tokens": ["", "fourth"]}),
        &[],
    )
    .await;
    assert_eq!(code(&set), "OK", "{set}");
    let none = request(&server, "debug_http", "POST", "/api/clearFaults", &[]).await;
    assert_refused(&none, r#"Bearer realm="kvcm""#, "enforced again after Set");
    let log = server.log();
    assert!(
        !log.contains("third-secret") && !log.contains("fourth"),
        "{log}"
    );
}

#[tokio::test]
async fn a_grpc_call_whose_message_never_completes_is_cancelled_at_its_deadline() {
    use std::time::{Duration, Instant};
    let server = TestServer::start_with(&["kvcm.service.grpc_request_timeout_ms=1000"]).await;
    let tcp = tokio::net::TcpStream::connect(server.address("grpc"))
        .await
        .expect("connect");
    let (mut client, connection) = h2::client::handshake(tcp).await.expect("HTTP/2");
    tokio::spawn(connection);
    let service = kvcm::proto::meta::meta_service_server::SERVICE_NAME;
    let request = axum::http::Request::post(format!("http://kvcm/{service}/GetCacheLocation"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request");
    let (response, mut message) = client.send_request(request, false).expect("stream");
    // The length prefix of a 100-byte message, and then nothing more.
    let prefix = axum::body::Bytes::from_static(&[0, 0, 0, 0, 100]);
    message.send_data(prefix, false).expect("prefix");
    let started = Instant::now();
    let response = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("the server answers within its deadline")
        .expect("a response");
    let took = started.elapsed();
    let status = match response.headers().get("grpc-status") {
        Some(status) => status.clone(),
        None => {
            let mut body = response.into_body();
            let trailers = body.trailers().await.expect("trailers").expect("some");
            trailers["grpc-status"].clone()
        }
    };
    assert_eq!(status, "1", "CANCELLED (tonic's \"Timeout expired\")");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "answered after {took:?}"
    );
    // An ordinary call on a new connection is served.
    let mut meta = server.meta().await;
    let info = meta.get_cluster_info(kvcm::proto::meta::GetClusterInfoRequest::default());
    assert!(info.await.expect("served").into_inner().header.is_some());
}

/// Starts `kvcm serve` as uid/gid 65534 (a user without a home) with `extra` settings;
/// the child and its data directory.
fn serve_as_nobody(extra: &[&str]) -> (std::process::Child, tempfile::TempDir) {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().expect("temp dir");
    std::os::unix::fs::chown(dir.path(), Some(NOBODY), Some(NOBODY)).expect("chown");
    let ready = dir.path().join("ready.json");
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_kvcm"));
    command
        .arg("serve")
        .arg("--data-dir")
        .arg(dir.path())
        .arg("--ready-file")
        .arg(&ready);
    for setting in [
        "kvcm.service.rpc_port=0",
        "kvcm.service.http_port=0",
        "kvcm.service.admin_http_port=0",
    ]
    .iter()
    .chain(extra)
    {
        command.arg("--env").arg(setting);
    }
    let mut child = command
        .uid(NOBODY)
        .gid(NOBODY)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn kvcm serve");
    let started = common::wait_until_blocking(std::time::Duration::from_secs(30), || {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("kvcm serve as uid {NOBODY} exited: {status}");
        }
        ready.exists().then_some(())
    });
    assert!(started.is_some(), "no ready file within 30 s");
    (child, dir)
}

const NOBODY: u32 = 65534;

/// Whether a process of uid 65534 (the server's own user here) can list the server's
/// descriptors.
fn fds_open_to_its_user(pid: u32) -> bool {
    use std::os::unix::process::CommandExt;
    std::process::Command::new("ls")
        .arg(format!("/proc/{pid}/fd"))
        .uid(NOBODY)
        .gid(NOBODY)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("run ls")
        .success()
}

#[test]
fn the_server_is_not_dumpable_unless_asked() {
    let euid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").expect("stat"));
    if euid != 0 {
        common::shout("SKIPPED the_server_is_not_dumpable_unless_asked: it must run as root to start the server as another user");
        return;
    }
    let (mut protected, _dir) = serve_as_nobody(&[]);
    let (mut open, _open_dir) = serve_as_nobody(&["kvcm.service.dumpable=true"]);
    let owner = |pid: u32| {
        std::os::unix::fs::MetadataExt::uid(
            &std::fs::metadata(format!("/proc/{pid}/fd")).expect("stat"),
        )
    };
    assert_eq!(
        owner(open.id()),
        NOBODY,
        "a dumpable process owns its /proc"
    );
    assert!(fds_open_to_its_user(open.id()), "the control case: open");
    assert_eq!(owner(protected.id()), 0, "not dumpable: /proc is root's");
    assert!(
        !fds_open_to_its_user(protected.id()),
        "the server's own user cannot open its descriptors"
    );
    for child in [&mut protected, &mut open] {
        child.kill().expect("kill");
        child.wait().expect("wait");
    }
}

/// AddStorage of an NFS storage whose `root_path` is `root` as written (no '/' added:
/// without a trailing '/' the root is a prefix of file names in its parent).
async fn add_prefix_storage(server: &TestServer, name: &str, root: &str) -> Value {
    let storage = json!({"global_unique_name": name,
                         "nfs": {"root_path": root, "key_count_per_file": 1}});
    server
        .admin_http("addStorage", json!({ "storage": storage }))
        .await
}

#[tokio::test]
async fn an_nfs_prefix_root_is_checked_where_its_files_land_and_kept_at_restore() {
    // Refused where its files would land in "/" or a system directory: "/e" with an
    // instance "tc" would write under /etc/.
    let server = TestServer::start().await;
    for root in ["/e", "/us", "/kvcm-prefix-test"] {
        let refused = add_prefix_storage(&server, "p", root).await;
        assert_invalid(&refused, "trailing '/'", root);
    }
    // Accepted before a list that its files' directory lies outside of; kept (with a
    // warning) when the server restarts under that list, and refused when added anew.
    let outer = tempfile::tempdir().expect("temp dir");
    let listed = outer.path().join("kv").display().to_string();
    let before = add_prefix_storage(&server, "pre", &listed).await;
    assert_eq!(code(&before), "OK", "{before}");
    let list = format!(
        "kvcm.service.storage_root_allow_list={},{listed}",
        server.dir.path().display()
    );
    let server = server.kill_and_restart_with(&[&list]).await;
    let storages = server.admin_http("listStorage", json!({})).await;
    assert!(storages.to_string().contains("\"pre\""), "kept: {storages}");
    assert!(
        server.log().contains("AddStorage would refuse today"),
        "the restore warns"
    );
    let anew = add_prefix_storage(&server, "new", &listed).await;
    assert_invalid(
        &anew,
        "kvcm.service.storage_root_allow_list",
        "a prefix root anew",
    );
    let inside = format!("{listed}/prefix_");
    let ok = add_prefix_storage(&server, "in", &inside).await;
    assert_eq!(
        code(&ok),
        "OK",
        "a prefix root whose files lie in the list: {ok}"
    );
}
