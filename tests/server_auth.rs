//! Accounts, API keys and `kvcm.auth.meta = required` against a real `kvcm serve`
//! (docs/security.md): the role × API matrix over HTTP and gRPC for every RPC of the table
//! and the lookup bootstrap, revocation and expiry within one request, keys across a
//! SIGKILL, and the client library with and without a key.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{code, http_exchange, registration, wait_until, TestServer};
use kvcm::service::rpcs::{Service, ALL};
use kvcm_client::Wire;
use kvcm_client::{Client, ClientConfig, ServerAddress};
use prost::bytes::{Buf, BufMut};
use serde_json::{json, Value};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Code;

const ROOT: &str = "root-token";
const SETTINGS: [&str; 2] = [
    "kvcm.service.admin_auth_token=root-token",
    "kvcm.auth.meta=required",
];
const MINE: &str = "inst-a";
const THEIRS: &str = "inst-b";

/// The admin-plane RPCs only ROLE_ADMIN (and a token) may call: accounts, keys, tokens and
/// config snapshots. Every other admin and debug RPC is open to operators too.
const ADMIN_ONLY: [&str; 11] = [
    "AddAccount",
    "DeleteAccount",
    "ListAccount",
    "SetAdminAuthTokens",
    "RotateAdminAuthToken",
    "ListAdminAuthTokens",
    "CreateApiKey",
    "RevokeApiKey",
    "ListApiKeys",
    "GenConfigSnapshot",
    "LoadConfigSnapshot",
];

/// What a call is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// The handler ran (HTTP 200 / gRPC OK, whatever the answer's header says).
    Served,
    /// HTTP 401 / UNAUTHENTICATED.
    Unauthenticated,
    /// HTTP 403 / PERMISSION_DENIED.
    Forbidden,
}

/// Who calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    Nobody,
    Token,
    Admin,
    Operator,
    /// A ROLE_USER key naming [`MINE`] only.
    Client,
}

/// What the matrix expects, written from the roles' definitions (docs/security.md), not from
/// the RPC table.
fn expected(who: Who, service: Service, name: &str, instance: Option<&str>) -> Outcome {
    match who {
        Who::Nobody => Outcome::Unauthenticated,
        Who::Token | Who::Admin => Outcome::Served,
        Who::Operator if ADMIN_ONLY.contains(&name) => Outcome::Forbidden,
        Who::Operator => Outcome::Served,
        Who::Client => match (service, instance) {
            (Service::Meta, None) => Outcome::Served,
            (Service::Meta, Some(id)) if id == MINE => Outcome::Served,
            _ => Outcome::Forbidden,
        },
    }
}

/// A POST of `body` to `route` on `listener` with `bearer`: status and JSON body.
async fn post(
    server: &TestServer,
    listener: &str,
    route: &str,
    body: Value,
    bearer: Option<&str>,
) -> (u16, Value) {
    server.post_as(listener, route, &body, bearer).await
}

/// An admin call with the root token that must succeed.
async fn admin_ok(server: &TestServer, route: &str, body: Value) -> Value {
    let (status, answer) = post(server, "admin_http", route, body, Some(ROOT)).await;
    assert_eq!((status, code(&answer)), (200, "OK"), "{route}: {answer}");
    answer
}

/// A new key of `user_name` on `instances`, by the root token: (id, text).
async fn create_key(
    server: &TestServer,
    user_name: &str,
    instances: &[&str],
    expires_at_ms: i64,
) -> (String, String) {
    let body =
        json!({"user_name": user_name, "instance_ids": instances, "expires_at_ms": expires_at_ms});
    let answer = admin_ok(server, "/api/createApiKey", body).await;
    let text = answer["api_key"].as_str().expect("api_key").to_string();
    (answer["key_id"].as_str().expect("key_id").to_string(), text)
}

/// The three accounts, their keys, and instances [`MINE`] and [`THEIRS`].
async fn populated(server: &TestServer) -> Vec<(Who, Option<String>)> {
    for (user, role) in [
        ("boss", "ROLE_ADMIN"),
        ("ops", "ROLE_OPERATOR"),
        ("eng", "ROLE_USER"),
    ] {
        let body = json!({"user_name": user, "password": "pw", "role": role});
        admin_ok(server, "/api/addAccount", body).await;
    }
    let (_, admin) = create_key(server, "boss", &[], 0).await;
    let (_, operator) = create_key(server, "ops", &[], 0).await;
    let (_, client) = create_key(server, "eng", &[MINE], 0).await;
    for instance in [MINE, THEIRS] {
        let (status, answer) = post(
            server,
            "http",
            "/api/registerInstance",
            registration(instance, 4),
            Some(ROOT),
        )
        .await;
        assert_eq!((status, code(&answer)), (200, "OK"), "{answer}");
    }
    vec![
        (Who::Nobody, None),
        (Who::Token, Some(ROOT.to_string())),
        (Who::Admin, Some(admin)),
        (Who::Operator, Some(operator)),
        (Who::Client, Some(client)),
    ]
}

fn listener_of(service: Service) -> &'static str {
    match service {
        Service::Meta => "http",
        Service::Admin => "admin_http",
        Service::Debug => "debug_http",
    }
}

/// Whether the RPC is a meta call of one instance (the request's `instance_id`).
fn scoped(service: Service, name: &str) -> bool {
    service == Service::Meta && name != "GetClusterInfo"
}

/// A body that reaches the handler and changes nothing a later call relies on.
fn json_body(name: &str, instance: Option<&str>) -> Value {
    match (name, instance) {
        ("SetAdminAuthTokens", _) => json!({"tokens": [ROOT]}),
        (_, Some(id)) => json!({"trace_id": "matrix", "instance_id": id}),
        _ => json!({"trace_id": "matrix"}),
    }
}

fn http_outcome(status: u16, what: &str) -> Outcome {
    match status {
        200 => Outcome::Served,
        401 => Outcome::Unauthenticated,
        403 => Outcome::Forbidden,
        other => panic!("{what}: answered {other}"),
    }
}

#[tokio::test]
async fn every_rpc_over_http_answers_each_role_as_its_definition_says() {
    let server = TestServer::start_with(&SETTINGS).await;
    let callers = populated(&server).await;
    // Routes of the admin plane that are no RPC: read access (asked first: the matrix
    // below demotes the leader, and /api/healthy then answers 503).
    for path in ["/metrics", "/api/healthy"] {
        for (who, bearer) in &callers {
            let header = bearer
                .as_ref()
                .map(|b| format!("Authorization: Bearer {b}"));
            let headers: Vec<&str> = header.iter().map(String::as_str).collect();
            let (status, _, _) =
                http_exchange(server.address("admin_http"), "GET", path, &headers, b"").await;
            let want = expected(*who, Service::Admin, "GetMetrics", None);
            assert_eq!(http_outcome(status, path), want, "{who:?} GET {path}");
        }
    }
    let mut checked = 0;
    for rpc in ALL {
        let instances: Vec<Option<&str>> = if scoped(rpc.service, rpc.name) {
            vec![Some(MINE), Some(THEIRS)]
        } else {
            vec![None]
        };
        for instance in instances {
            for (who, bearer) in &callers {
                let body = json_body(rpc.name, instance);
                let listener = listener_of(rpc.service);
                let (status, answer) =
                    post(&server, listener, rpc.route, body, bearer.as_deref()).await;
                let what = format!("{who:?} {} on {instance:?}: {answer}", rpc.name);
                let want = expected(*who, rpc.service, rpc.name, instance);
                assert_eq!(http_outcome(status, &what), want, "{what}");
                checked += 1;
            }
        }
    }
    assert!(checked >= ALL.len() * callers.len(), "{checked} calls");
}

#[tokio::test]
async fn the_lookup_bootstrap_needs_a_key_naming_the_instance() {
    let server = TestServer::start_with(&SETTINGS).await;
    let callers = populated(&server).await;
    for instance in [MINE, THEIRS] {
        for (who, bearer) in &callers {
            let body = json!({"instance_id": instance});
            let (status, answer) = post(
                &server,
                "http",
                "/kvcm/v1/lookupBootstrap",
                body,
                bearer.as_deref(),
            )
            .await;
            let served = expected(*who, Service::Meta, "GetCacheLocation", Some(instance))
                == Outcome::Served;
            let want = if served { 200 } else { 403 };
            assert_eq!(status, want, "{who:?} on {instance}: {answer}");
            if !served {
                assert!(
                    answer["error"].as_str().is_some_and(|e| !e.is_empty()),
                    "{answer}"
                );
            }
        }
    }
}

/// Passes protobuf bytes through unchanged (a gRPC call of any method).
#[derive(Debug, Clone, Copy, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;

    fn encoder(&mut self) -> Raw {
        Raw
    }

    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        let mut bytes = vec![0; src.remaining()];
        src.copy_to_slice(&mut bytes);
        Ok(Some(bytes))
    }
}

/// A protobuf string field.
fn string_field(field: u8, value: &str) -> Vec<u8> {
    let mut bytes = vec![(field << 3) | 2, value.len() as u8];
    bytes.extend_from_slice(value.as_bytes());
    bytes
}

/// The protobuf body of `name` (the same as [`json_body`]).
fn proto_body(name: &str, instance: Option<&str>) -> Vec<u8> {
    match (name, instance) {
        ("SetAdminAuthTokens", _) => string_field(2, ROOT),
        // RegisterInstanceRequest numbers instance_id 3, every other meta request 2.
        ("RegisterInstance", Some(id)) => string_field(3, id),
        (_, Some(id)) => string_field(2, id),
        _ => Vec::new(),
    }
}

async fn grpc_outcome(
    channel: &tonic::transport::Channel,
    path: String,
    body: Vec<u8>,
    bearer: Option<&str>,
) -> Outcome {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.expect("ready");
    let mut request = tonic::Request::new(body);
    if let Some(bearer) = bearer {
        let value = format!("Bearer {bearer}").parse().expect("metadata");
        request.metadata_mut().insert("authorization", value);
    }
    let uri = tonic::codegen::http::uri::PathAndQuery::try_from(path.as_str()).expect("path");
    match grpc.unary(request, uri, Raw).await {
        Ok(_) => Outcome::Served,
        Err(status) if status.code() == Code::Unauthenticated => Outcome::Unauthenticated,
        Err(status) if status.code() == Code::PermissionDenied => Outcome::Forbidden,
        Err(status) => panic!("{path}: {status}"),
    }
}

#[tokio::test]
async fn every_rpc_over_grpc_answers_each_role_as_its_definition_says() {
    let server = TestServer::start_with(&SETTINGS).await;
    let callers = populated(&server).await;
    let connect = |address: SocketAddr| async move {
        let endpoint =
            tonic::transport::Channel::from_shared(format!("http://{address}")).expect("uri");
        endpoint.connect().await.expect("connect")
    };
    let meta = connect(server.address("grpc")).await;
    let admin_listener = if server.has_listener("admin_grpc") {
        "admin_grpc"
    } else {
        "grpc"
    };
    let admin = connect(server.address(admin_listener)).await;
    for rpc in ALL {
        let (package, channel) = match rpc.service {
            Service::Meta => ("meta.MetaService", &meta),
            Service::Admin => ("admin.AdminService", &admin),
            Service::Debug => ("debug.DebugService", &admin),
        };
        let path = format!("/kv_cache_manager.proto.{package}/{}", rpc.name);
        let instances: Vec<Option<&str>> = if scoped(rpc.service, rpc.name) {
            vec![Some(MINE), Some(THEIRS)]
        } else {
            vec![None]
        };
        for instance in instances {
            for (who, bearer) in &callers {
                let body = proto_body(rpc.name, instance);
                let outcome = grpc_outcome(channel, path.clone(), body, bearer.as_deref()).await;
                let want = expected(*who, rpc.service, rpc.name, instance);
                assert_eq!(outcome, want, "{who:?} {} on {instance:?}", rpc.name);
            }
        }
    }
}

/// GetCacheLocation of [`MINE`] over HTTP with `bearer`: the HTTP status.
async fn look_up(server: &TestServer, bearer: &str) -> u16 {
    let body = json!({"instance_id": MINE, "query_type": "QT_PREFIX_MATCH", "block_keys": [1]});
    post(server, "http", "/api/getCacheLocation", body, Some(bearer))
        .await
        .0
}

#[tokio::test]
async fn revoked_expired_and_orphaned_keys_stop_at_the_next_request_and_keys_survive_sigkill() {
    let server = TestServer::start_with(&SETTINGS).await;
    populated(&server).await;
    let (revoked_id, revoked) = create_key(&server, "eng", &[MINE], 0).await;
    assert_eq!(look_up(&server, &revoked).await, 200);
    admin_ok(&server, "/api/revokeApiKey", json!({"key_id": revoked_id})).await;
    assert_eq!(
        look_up(&server, &revoked).await,
        401,
        "revoked: the very next request"
    );

    let soon = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        + 1_500;
    let (_, expiring) = create_key(&server, "eng", &[MINE], soon).await;
    assert_eq!(look_up(&server, &expiring).await, 200);
    let expired = wait_until(Duration::from_secs(10), async || {
        (look_up(&server, &expiring).await == 401).then_some(())
    })
    .await;
    assert!(expired.is_some(), "an expired key is refused");

    admin_ok(
        &server,
        "/api/addAccount",
        json!({"user_name": "temp", "password": "pw", "role": "ROLE_USER"}),
    )
    .await;
    let (_, orphaned) = create_key(&server, "temp", &[MINE], 0).await;
    assert_eq!(look_up(&server, &orphaned).await, 200);
    admin_ok(&server, "/api/deleteAccount", json!({"user_name": "temp"})).await;
    assert_eq!(
        look_up(&server, &orphaned).await,
        401,
        "deleting the account revokes its keys"
    );

    let (kept_id, kept) = create_key(&server, "eng", &[MINE], 0).await;
    // Bad requests change nothing and say why.
    for (body, field) in [
        (json!({"user_name": "eng"}), "instance_ids"),
        (
            json!({"user_name": "nobody", "instance_ids": [MINE]}),
            "nobody",
        ),
        (
            json!({"user_name": "eng", "instance_ids": [MINE], "expires_at_ms": -1}),
            "expires_at_ms",
        ),
        (
            json!({"user_name": "eng", "instance_ids": [""]}),
            "instance_ids",
        ),
    ] {
        let (status, answer) =
            post(&server, "admin_http", "/api/createApiKey", body, Some(ROOT)).await;
        assert_eq!(status, 200);
        assert_ne!(code(&answer), "OK", "{answer}");
        let message = answer["header"]["status"]["message"]
            .as_str()
            .unwrap_or_default();
        assert!(message.contains(field), "{message}");
    }
    let listed = admin_ok(&server, "/api/listApiKeys", json!({})).await;
    let ids: Vec<&str> = listed["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids.len(),
        5,
        "three of populated(), the expired one (listed until revoked) and the kept one: {listed}"
    );
    assert!(ids.contains(&kept_id.as_str()));
    assert!(
        !listed
            .to_string()
            .contains(kept.rsplit('_').next().unwrap()),
        "no secret is listed"
    );

    let server = server.kill_and_restart_with(&SETTINGS).await;
    assert_eq!(look_up(&server, &kept).await, 200, "keys survive a SIGKILL");
    assert_eq!(
        look_up(&server, &revoked).await,
        401,
        "and so do revocations"
    );
    let log = server.log();
    assert!(
        !log.contains(kept.rsplit('_').next().unwrap()),
        "no secret in the server's log"
    );
}

/// A Rust client of [`MINE`] on the soft-TCP fast path, calling with `api_key`.
fn rust_client(server: (SocketAddr, SocketAddr), api_key: Option<String>) -> Client {
    Client::connect(ClientConfig {
        servers: vec![ServerAddress {
            grpc: format!("http://{}", server.0),
            http: server.1,
        }],
        instance_id: MINE.into(),
        wire: Some(Wire::Tcp),
        api_key,
        tls: None,
    })
    .expect("client")
}

/// StartWriteCache + FinishWriteCache of `keys` (every block written).
fn write(client: &Client, keys: &[i64]) -> Result<(), kvcm_client::ClientError> {
    let started = client.start_write(kvcm::proto::meta::StartWriteCacheRequest {
        block_keys: keys.to_vec(),
        write_timeout_seconds: 30,
        ..Default::default()
    })?;
    let all = kvcm::proto::meta::block_mask::Info::Offset(keys.len() as i32);
    client.finish_write(kvcm::proto::meta::FinishWriteCacheRequest {
        write_session_id: started.write_session_id,
        success_blocks: Some(kvcm::proto::meta::BlockMask { info: Some(all) }),
        ..Default::default()
    })
}

#[tokio::test]
async fn the_client_library_writes_by_message_and_reads_the_table_with_its_key_and_nothing_without()
{
    let server = TestServer::start_with(&SETTINGS).await;
    let callers = populated(&server).await;
    let key = callers[4].1.clone().expect("the client's key");
    assert_eq!(callers[4].0, Who::Client);
    let addresses = (server.address("grpc"), server.address("http"));
    const KEYS: [i64; 4] = [11, 12, 13, 14];
    let (client, by_message, hits, anonymous) = tokio::task::spawn_blocking({
        let key = key.clone();
        move || {
            let client = rust_client(addresses, Some(key));
            assert!(client.fast_path_up(), "the bootstrap admitted the key");
            write(&client, &KEYS).expect("a write with the key");
            let by_message = client.metrics().writes_by_message;
            let hits = client.prefix_match(&KEYS).expect("lookup").len();
            let anonymous = rust_client(addresses, None);
            assert!(!anonymous.fast_path_up(), "no table without a key");
            let anonymous = anonymous.prefix_match(&KEYS).map(|h| h.len());
            (client, by_message, hits, anonymous)
        }
    })
    .await
    .expect("client thread");
    assert_eq!(
        by_message, 2,
        "Start and Finish went as messages, checked with the key"
    );
    assert_eq!(hits, KEYS.len());
    match anonymous {
        Err(kvcm_client::ClientError::Unauthorized(why)) => {
            assert!(why.contains("bearer"), "{why}")
        }
        other => panic!("a call without a key: {other:?}"),
    }
    // The same server over HTTP agrees with the fast path.
    let body = json!({"instance_id": MINE, "query_type": "QT_PREFIX_MATCH", "block_keys": KEYS});
    let (status, answer) = post(&server, "http", "/api/getCacheLocation", body, Some(&key)).await;
    assert_eq!((status, code(&answer)), (200, "OK"));
    assert_eq!(
        answer["locations"].as_array().map(Vec::len),
        Some(KEYS.len()),
        "{answer}"
    );

    // Revoked: the queue pair's next message is refused, and so is the gRPC fallback. The
    // server's sweep may tear the queue pair down first (a message in flight then ends
    // unanswered, and the client falls back to gRPC): that is the only other answer, and the
    // write is refused by the next attempt at the latest.
    let key_id = key.split('_').nth(1).expect("key id").to_string();
    admin_ok(&server, "/api/revokeApiKey", json!({"key_id": key_id})).await;
    let answers = tokio::task::spawn_blocking(move || {
        let mut answers = Vec::new();
        while answers.len() < 3 {
            let answer = write(&client, &[21, 22]);
            let refused = matches!(answer, Err(kvcm_client::ClientError::Unauthorized(_)));
            answers.push(answer);
            if refused {
                break;
            }
        }
        answers
    })
    .await
    .expect("client thread");
    let (last, torn_down) = answers.split_last().expect("an answer");
    assert!(
        matches!(last, Err(kvcm_client::ClientError::Unauthorized(_))),
        "{answers:?}"
    );
    for answer in torn_down {
        assert!(
            matches!(answer, Err(kvcm_client::ClientError::Unreachable(why)) if why.contains("not answered")),
            "{answers:?}"
        );
    }
}

#[tokio::test]
async fn meta_auth_without_an_admin_token_is_refused_at_start_naming_the_key() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_kvcm"))
        .args([
            "serve",
            "--env",
            "kvcm.auth.meta=required",
            "--env",
            "kvcm.service.rpc_port=0",
        ])
        .output()
        .expect("run kvcm");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("kvcm.auth.meta") && stderr.contains("admin_auth_token"),
        "{stderr}"
    );
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_kvcm"))
        .args(["serve", "--env", "kvcm.auth.meta=sometimes"])
        .output()
        .expect("run kvcm");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("kvcm.auth.meta"),
        "{stderr}"
    );
}
