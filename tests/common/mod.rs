//! Test harness: runs the real `kvcm serve` binary on OS-chosen ports in a temp data
//! directory and talks to it over real sockets (gRPC through the generated clients, HTTP
//! through a minimal HTTP/1.1 client, so that raw and malformed bodies can be sent).

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kvcm::proto::admin::admin_service_client::AdminServiceClient;
use kvcm::proto::meta::meta_service_client::MetaServiceClient;
use kvcm::proto::{admin, meta};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::transport::Channel;

pub mod crash;
pub mod other_user;
pub mod pool;

/// Asserts that the peer of `stream` (blocking) sends nothing for `window`: a queue-pair
/// listener that got a hello but not yet the client's endpoint must wait for it (it
/// connects its queue pair first, so the client's first message never reaches a queue pair
/// not yet ready). The read timeout is restored to none.
pub fn assert_waits_for_the_clients_endpoint(stream: &mut std::net::TcpStream, window: Duration) {
    use std::io::Read;
    stream.set_read_timeout(Some(window)).expect("timeout");
    let mut byte = [0u8; 1];
    let early = stream.read(&mut byte);
    assert!(
        early.as_ref().is_err_and(|e| matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        )),
        "the listener answered before the client's endpoint: {early:?}"
    );
    stream.set_read_timeout(None).expect("timeout");
}

/// A running `kvcm serve`, killed (SIGKILL) when dropped.
pub struct TestServer {
    child: Child,
    /// The data directory (removed on drop).
    pub dir: tempfile::TempDir,
    addresses: HashMap<String, SocketAddr>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `probe` every 10 ms until it yields a value or `limit` passes.
pub async fn wait_until<T>(
    limit: Duration,
    mut probe: impl AsyncFnMut() -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = probe().await {
            return Some(value);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// [`wait_until`] for blocking probes (polls every 10 ms).
pub fn wait_until_blocking<T>(limit: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = probe() {
            return Some(value);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl TestServer {
    /// Starts a server with every listener on port 0 and the debug service on.
    pub async fn start() -> TestServer {
        Self::start_with(&[]).await
    }

    /// Starts a server with extra `--env key=value` settings.
    pub async fn start_with(extra: &[&str]) -> TestServer {
        let settings: Vec<String> = extra
            .iter()
            .flat_map(|s| ["--env".to_string(), s.to_string()])
            .collect();
        let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
        Self::start_custom(&settings, &[]).await
    }

    /// Starts a server with extra command-line arguments and environment variables.
    pub async fn start_custom(args: &[&str], envs: &[(&str, &str)]) -> TestServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let defaults = [
            "kvcm.service.rpc_port=0",
            "kvcm.service.http_port=0",
            "kvcm.service.admin_http_port=0",
        ];
        let mut all: Vec<String> = defaults
            .iter()
            .flat_map(|setting| ["--env".to_string(), setting.to_string()])
            .collect();
        all.extend(args.iter().map(|a| a.to_string()));
        Self::launch(dir, &all, envs).await
    }

    /// SIGKILLs the server and starts it again on the same data directory and ports.
    pub async fn kill_and_restart(self) -> TestServer {
        self.kill_and_restart_with(&[]).await
    }

    /// As [`TestServer::kill_and_restart`], with extra `--env key=value` settings.
    pub async fn kill_and_restart_with(self, extra: &[&str]) -> TestServer {
        let port = |name: &str| self.address(name).port();
        let mut pinned = vec![
            format!("kvcm.service.rpc_port={}", port("grpc")),
            format!("kvcm.service.http_port={}", port("http")),
            format!("kvcm.service.admin_http_port={}", port("admin_http")),
        ];
        pinned.extend(extra.iter().map(|setting| setting.to_string()));
        let mut server = self;
        server.child.kill().expect("SIGKILL");
        server.child.wait().expect("wait");
        let dir = std::mem::replace(&mut server.dir, tempfile::tempdir().expect("temp dir"));
        let _ = std::fs::remove_file(dir.path().join("ready.json"));
        let args: Vec<String> = pinned
            .iter()
            .flat_map(|setting| ["--env".to_string(), setting.clone()])
            .collect();
        Self::launch(dir, &args, &[]).await
    }

    /// Runs `kvcm serve` on `dir` with the debug service on and these arguments; waits for
    /// its ready file.
    async fn launch(dir: tempfile::TempDir, args: &[String], envs: &[(&str, &str)]) -> TestServer {
        let ready = dir.path().join("ready.json");
        let mut command = Command::new(env!("CARGO_BIN_EXE_kvcm"));
        command
            .arg("serve")
            .arg("--data-dir")
            .arg(dir.path())
            .arg("--ready-file")
            .arg(&ready)
            .arg("--env")
            .arg("kvcm.service.enable_debug_service=true");
        command.args(args).envs(envs.iter().copied());
        let log_path = dir.path().join("stderr.log");
        let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
        // A restart pins its ports, and `debug_http` follows `http_port` (+3000): another
        // test may hold that port for a moment, so a start that finds a port taken is tried
        // again, for up to ~10 s.
        for attempt in 1.. {
            let stderr = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log_path)
                .expect("log file");
            let mut child = command
                .stdout(Stdio::null())
                .stderr(stderr)
                .spawn()
                .expect("spawn kvcm serve");
            // The ready file, or the server's exit (a failed start says why on stderr).
            let started = wait_until(Duration::from_secs(30), async || {
                if let Ok(Some(status)) = child.try_wait() {
                    return Some(Err(status));
                }
                std::fs::read_to_string(&ready).ok().map(Ok)
            })
            .await;
            let text = match started {
                Some(Ok(text)) => text,
                Some(Err(_)) if attempt < 50 && log().contains("Address already in use") => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                Some(Err(status)) => panic!("kvcm serve exited ({status}): {}", log()),
                None => panic!("no ready file within 30 s: {}", log()),
            };
            return TestServer::from_ready(child, dir, &text);
        }
        unreachable!("the loop returns or panics")
    }

    /// The server of `child`, at the addresses of its ready file `text`.
    fn from_ready(child: Child, dir: tempfile::TempDir, text: &str) -> TestServer {
        let map: HashMap<String, String> = serde_json::from_str(text).expect("ready json");
        let addresses = map
            .into_iter()
            .map(|(name, address)| {
                let address: SocketAddr = address.parse().expect("address");
                (name, SocketAddr::from(([127, 0, 0, 1], address.port())))
            })
            .collect();
        TestServer {
            child,
            dir,
            addresses,
        }
    }

    /// The address of a listener (`grpc`, `http`, `admin_http`, `debug_http`).
    pub fn address(&self, listener: &str) -> SocketAddr {
        self.addresses[listener]
    }

    /// The addresses the listeners bound, as the ready file lists them (the addresses of
    /// [`TestServer::address`] are their loopback forms).
    pub fn bound_addresses(&self) -> HashMap<String, SocketAddr> {
        let text = std::fs::read_to_string(self.dir.path().join("ready.json")).expect("ready");
        let map: HashMap<String, String> = serde_json::from_str(&text).expect("ready json");
        let parse = |(name, address): (String, String)| (name, address.parse().expect("address"));
        map.into_iter().map(parse).collect()
    }

    /// What the server logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default()
    }

    /// Whether a listener was started.
    pub fn has_listener(&self, listener: &str) -> bool {
        self.addresses.contains_key(listener)
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends a signal (`TERM`, `INT`, ...) and waits for the exit status.
    pub fn signal_and_wait(&mut self, signal: &str) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .expect("kill");
        self.child.wait().expect("wait")
    }

    /// A MetaService gRPC client.
    pub async fn meta(&self) -> MetaServiceClient<Channel> {
        MetaServiceClient::connect(format!("http://{}", self.address("grpc")))
            .await
            .expect("grpc connect")
    }

    /// An AdminService gRPC client (shares the main gRPC port).
    pub async fn admin(&self) -> AdminServiceClient<Channel> {
        AdminServiceClient::connect(format!("http://{}", self.address("grpc")))
            .await
            .expect("grpc connect")
    }

    /// The Prometheus text of `GET /metrics` on the admin port, and its status.
    pub async fn prometheus(&self) -> (u16, String) {
        let address = self.address("admin_http");
        let (status, body) = http_request(address, "GET", "/metrics", b"").await;
        (status, String::from_utf8(body).expect("UTF-8"))
    }

    /// The value of one series of `GET /metrics` (`name{labels}` exactly as written), if
    /// the exposition has it.
    pub async fn prometheus_value(&self, series: &str) -> Option<f64> {
        let (status, text) = self.prometheus().await;
        assert_eq!(status, 200, "GET /metrics");
        text.lines().find_map(|line| {
            let value = line.strip_prefix(series)?.strip_prefix(' ')?;
            Some(value.trim().parse().expect("a number"))
        })
    }

    /// POSTs raw bytes; returns the HTTP status and body.
    pub async fn post_raw(&self, listener: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
        http_request(self.address(listener), "POST", path, body).await
    }

    /// POSTs `body` to `path` on `listener` with `Authorization: Bearer <bearer>` when
    /// given; the status and the parsed body (`Null` when not JSON).
    pub async fn post_as(
        &self,
        listener: &str,
        path: &str,
        body: &Value,
        bearer: Option<&str>,
    ) -> (u16, Value) {
        let header = bearer.map(|b| format!("Authorization: Bearer {b}"));
        let headers: Vec<&str> = header.iter().map(String::as_str).collect();
        let bytes = body.to_string().into_bytes();
        let (status, _, answer) =
            http_exchange(self.address(listener), "POST", path, &headers, &bytes).await;
        (
            status,
            serde_json::from_slice(&answer).unwrap_or(Value::Null),
        )
    }

    /// POSTs JSON to `/api/<rpc>`; asserts 200 and returns the parsed body.
    pub async fn call(&self, listener: &str, rpc: &str, body: Value) -> Value {
        let (status, bytes) = self
            .post_raw(
                listener,
                &format!("/api/{rpc}"),
                body.to_string().as_bytes(),
            )
            .await;
        assert_eq!(status, 200, "{rpc}: {}", String::from_utf8_lossy(&bytes));
        serde_json::from_slice(&bytes).expect("response is JSON")
    }

    /// Meta HTTP call.
    pub async fn meta_http(&self, rpc: &str, body: Value) -> Value {
        self.call("http", rpc, body).await
    }

    /// Admin HTTP call.
    pub async fn admin_http(&self, rpc: &str, body: Value) -> Value {
        self.call("admin_http", rpc, body).await
    }

    /// Registers `instance_id` in group `default` (one spec `tp0` of 1024 bytes).
    pub async fn register(&self, instance_id: &str, block_size: i64) -> Value {
        self.meta_http("registerInstance", registration(instance_id, block_size))
            .await
    }

    /// StartWriteCache + FinishWriteCache (all succeed) over HTTP; returns the start answer.
    pub async fn write_keys(&self, instance_id: &str, keys: &[i64]) -> Value {
        let start = self
            .meta_http(
                "startWriteCache",
                json!({"instance_id": instance_id, "block_keys": keys, "write_timeout_seconds": 30}),
            )
            .await;
        assert_eq!(code(&start), "OK", "{start}");
        let count = start["locations"].as_array().expect("locations").len();
        let finish = self
            .meta_http(
                "finishWriteCache",
                json!({"instance_id": instance_id,
                       "write_session_id": start["write_session_id"],
                       "success_blocks": {"offset": count}}),
            )
            .await;
        assert_eq!(code(&finish), "OK", "{finish}");
        start
    }

    /// GetCacheMeta statuses of `keys` over HTTP.
    pub async fn statuses(&self, instance_id: &str, keys: &[i64]) -> Vec<String> {
        let answer = self
            .meta_http(
                "getCacheMeta",
                json!({"instance_id": instance_id, "block_keys": keys}),
            )
            .await;
        answer["metas"]
            .as_array()
            .expect("metas")
            .iter()
            .map(|m| {
                let meta: Value = serde_json::from_str(m.as_str().expect("string")).expect("json");
                meta["status"].as_str().expect("status").to_string()
            })
            .collect()
    }
}

/// An AddStorage body for an NFS storage at `root` (one block per file).
pub fn nfs_storage(name: &str, root: &std::path::Path) -> Value {
    json!({"global_unique_name": name,
           "nfs": {"root_path": format!("{}/", root.display()), "key_count_per_file": 1}})
}

/// Changes group `name` through UpdateInstanceGroup: `edit` changes its fetched config, whose
/// version is then raised by one; asserts both calls OK.
pub async fn update_group(server: &TestServer, name: &str, edit: impl FnOnce(&mut Value)) {
    let fetched = server
        .admin_http("getInstanceGroup", json!({ "name": name }))
        .await;
    assert_eq!(code(&fetched), "OK", "{fetched}");
    let mut group = fetched["instance_group"].clone();
    let version: i64 = group["version"]
        .as_str()
        .expect("version")
        .parse()
        .expect("int");
    edit(&mut group);
    group["version"] = json!(version + 1);
    let updated = server
        .admin_http(
            "updateInstanceGroup",
            json!({"instance_group": group, "current_version": version}),
        )
        .await;
    assert_eq!(code(&updated), "OK", "{updated}");
}

/// An instance group over `candidates` (reclaiming from the first), quota 1 GB, version 1.
pub fn nfs_group(name: &str, candidates: &[&str]) -> Value {
    group_preferring(name, candidates, "CPS_PREFER_3FS", "1000000000")
}

/// An instance group over `candidates` (reclaiming from the first) with prefer strategy
/// `strategy` and a `capacity`-byte quota, version 1.
pub fn group_preferring(name: &str, candidates: &[&str], strategy: &str, capacity: &str) -> Value {
    json!({"name": name, "storage_candidates": candidates, "global_quota_group_name": name,
           "quota": {"capacity": capacity},
           "cache_config": {"reclaim_strategy": {"storage_unique_name": candidates[0]},
                            "data_storage_strategy": strategy,
                            "meta_indexer_config": {"mutex_shard_num": 16,
                                "meta_cache_policy_config": {"type": "lru"},
                                "meta_storage_backend_config": {"storage_type": "local"}}},
           "version": 1})
}

/// A RegisterInstance body for group `default`.
pub fn registration(instance_id: &str, block_size: i64) -> Value {
    json!({
        "trace_id": "reg",
        "instance_group": "default",
        "instance_id": instance_id,
        "block_size": block_size,
        "location_spec_infos": [{"name": "tp0", "size": 1024}],
        "model_deployment": {"model_name": "model", "dtype": "FP8", "tp_size": 1}
    })
}

/// The same registration as a gRPC request.
pub fn registration_grpc(instance_id: &str, block_size: i32) -> meta::RegisterInstanceRequest {
    meta::RegisterInstanceRequest {
        trace_id: "reg".into(),
        instance_group: "default".into(),
        instance_id: instance_id.into(),
        block_size,
        location_spec_infos: vec![meta::LocationSpecInfo {
            name: "tp0".into(),
            size: 1024,
        }],
        model_deployment: Some(meta::ModelDeployment {
            model_name: "model".into(),
            dtype: "FP8".into(),
            tp_size: 1,
            ..Default::default()
        }),
        location_spec_groups: Vec::new(),
        default_query_type: 0,
    }
}

/// `header.status.code` of a JSON answer.
pub fn code(answer: &Value) -> &str {
    answer["header"]["status"]["code"]
        .as_str()
        .unwrap_or("<missing>")
}

/// The keys of a StartWriteCache request that its answer's mask says are new (to be written),
/// in request order.
pub fn new_keys(keys: &[i64], mask: Option<meta::BlockMask>) -> Vec<i64> {
    match mask.and_then(|m| m.info) {
        Some(meta::block_mask::Info::Offset(n)) => keys[n as usize..].to_vec(),
        Some(meta::block_mask::Info::BoolMasks(present)) => keys
            .iter()
            .zip(present.values)
            .filter(|(_, present)| !present)
            .map(|(key, _)| *key)
            .collect(),
        None => panic!("StartWriteCache always answers a mask"),
    }
}

/// `header.status.code` of a meta gRPC answer.
pub fn grpc_code(header: &Option<meta::CommonResponseHeader>) -> meta::ErrorCode {
    let code = header
        .as_ref()
        .and_then(|h| h.status.as_ref())
        .map_or(0, |s| s.code);
    meta::ErrorCode::try_from(code).expect("known code")
}

/// `header.status.code` of an admin gRPC answer.
pub fn admin_code(header: &Option<admin::CommonResponseHeader>) -> admin::ErrorCode {
    let code = header
        .as_ref()
        .and_then(|h| h.status.as_ref())
        .map_or(0, |s| s.code);
    admin::ErrorCode::try_from(code).expect("known code")
}

/// The URIs of a JSON `locations` array (first spec of each).
pub fn uris(locations: &Value) -> Vec<String> {
    locations
        .as_array()
        .expect("locations array")
        .iter()
        .map(|l| {
            l["location_specs"][0]["uri"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect()
}

/// One HTTP/1.1 request on a fresh connection; returns status and body.
pub async fn http_request(
    address: SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
) -> (u16, Vec<u8>) {
    let (status, _, body) = http_exchange(address, method, path, &[], body).await;
    (status, body)
}

/// One HTTP/1.1 request with extra header lines (`"Name: value"`) on a fresh connection;
/// returns status, response head and body.
pub async fn http_exchange(
    address: SocketAddr,
    method: &str,
    path: &str,
    headers: &[&str],
    body: &[u8],
) -> (u16, String, Vec<u8>) {
    let mut stream = TcpStream::connect(address).await.expect("connect");
    let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.expect("write head");
    // The server may answer (413) and close before reading a large body.
    let _ = stream.write_all(body).await;
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("complete response head");
    let head = String::from_utf8_lossy(&response[..split]).to_string();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    let mut body = response[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    (status, head, body)
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(line_end) = data.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(String::from_utf8_lossy(&data[..line_end]).trim(), 16)
            .unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = line_end + 2;
        out.extend_from_slice(&data[start..start + size]);
        data = &data[start + size + 2..];
    }
    out
}

/// The resident set size of process `pid`, in bytes.
pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .expect("VmRSS in kB");
    kib << 10
}

/// Writes straight to the terminal, past the test harness's output capture (a loud skip).
pub fn shout(message: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "\n*** {message} ***\n");
}

/// The server settings that serve the lookup tables on the RDMA device `KVCM_VERBS_DEVICE`
/// (GID index `KVCM_VERBS_GID_INDEX`, default 0), or `None` after a loud skip of `what`
/// when no device is named (unset or empty) or this build has no verbs provider (feature
/// `rdma`). A named
/// device that does not open fails the test (`.ci/rxe-verbs` names rxe0).
pub fn verbs_settings(what: &str) -> Option<Vec<String>> {
    let verbs = kvcm_transport::any::VerbsDevice::from_env().expect("KVCM_VERBS_GID_INDEX");
    if verbs.name.is_empty() {
        shout(&format!(
            "SKIPPED {what}: KVCM_VERBS_DEVICE names no RDMA device"
        ));
        return None;
    }
    if !kvcm_transport::ProviderKind::Verbs.is_built() {
        shout(&format!(
            "SKIPPED {what}: this build has no verbs provider (feature `rdma`)"
        ));
        return None;
    }
    if let Err(error) = kvcm_transport::any::AnyDomain::open_verbs(&verbs) {
        panic!(
            "KVCM_VERBS_DEVICE={}: the device does not open: {error}",
            verbs.name
        );
    }
    Some(vec![
        format!("kvcm.lookup.verbs_device={}", verbs.name),
        format!("kvcm.lookup.verbs_gid_index={}", verbs.gid_index),
    ])
}
