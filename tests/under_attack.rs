//! Issue 14's hostile clients, one attack at a time against a real `kvcm serve` with the
//! default limits: slow headers, slow bodies, 10 MiB bodies, 100k-key requests over HTTP
//! and gRPC. During each, every listener (meta, admin and debug HTTP, gRPC) answers a probe
//! within 1 s, several times, and the server's RSS stays within 256 MiB of idle. (The
//! 20,000 idle connections are tests/connection_flood.rs, the 615k-key request
//! tests/server_security.rs.)

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::TestServer;
use kvcm::proto::meta;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::task::JoinSet;

/// Probe rounds per attack.
const ROUNDS: usize = 5;
/// Connections of a trickling attack.
const TRICKLERS: usize = 400;
/// Clients of a flooding attack.
const FLOODERS: usize = 4;
/// Keys of one flooding request.
const KEYS: i64 = 100_000;

/// How long each probe may take.
const PROBE_LIMIT: Duration = Duration::from_secs(1);

/// Whether `listener` answers `route` with 200 within [`PROBE_LIMIT`].
async fn http_answers(server: &TestServer, listener: &str, route: &str) -> bool {
    let probe = common::http_request(server.address(listener), "POST", route, b"{}");
    let answer = tokio::time::timeout(PROBE_LIMIT, probe).await;
    matches!(answer, Ok((200, _)))
}

/// Whether meta gRPC answers GetClusterInfo within [`PROBE_LIMIT`] (connecting included).
async fn grpc_answers(server: &TestServer) -> bool {
    let call = async {
        let mut client = server.meta().await;
        let request = meta::GetClusterInfoRequest::default();
        client.get_cluster_info(request).await.is_ok()
    };
    tokio::time::timeout(PROBE_LIMIT, call)
        .await
        .unwrap_or(false)
}

/// Probes every listener [`ROUNDS`] times; asserts each answered in time and RSS stayed
/// within 256 MiB of `idle_rss`.
async fn assert_served_during(server: &TestServer, attack: &str, idle_rss: u64) {
    for round in 0..ROUNDS {
        for (listener, route) in [
            ("http", "/api/getClusterInfo"),
            ("admin_http", "/api/listStorage"),
            ("debug_http", "/api/clearFaults"),
        ] {
            assert!(
                http_answers(server, listener, route).await,
                "{attack}: {listener} did not answer within 1 s (round {round})"
            );
        }
        assert!(
            grpc_answers(server).await,
            "{attack}: gRPC did not answer within 1 s (round {round})"
        );
        let rss = common::rss_bytes(server.pid());
        assert!(
            rss <= idle_rss + (256 << 20),
            "{attack}: RSS grew from {idle_rss} to {rss} bytes"
        );
    }
}

/// Opens [`TRICKLERS`] connections to `address`, sends each `first` whole, then `rest` one
/// byte per 200 ms; returns once every connection has sent `first` (the attack is on).
async fn trickle(address: SocketAddr, first: Vec<u8>, rest: Vec<u8>) -> JoinSet<()> {
    let started = Arc::new(AtomicUsize::new(0));
    let (tell, mut all_started) = tokio::sync::mpsc::channel::<()>(1);
    let mut attackers = JoinSet::new();
    for _ in 0..TRICKLERS {
        let (first, rest, started, tell) =
            (first.clone(), rest.clone(), started.clone(), tell.clone());
        attackers.spawn(async move {
            let Ok(mut stream) = TcpStream::connect(address).await else {
                return;
            };
            let sent = stream.write_all(&first).await.is_ok();
            if started.fetch_add(1, Ordering::SeqCst) + 1 == TRICKLERS {
                let _ = tell.send(()).await;
            }
            if !sent {
                return;
            }
            for byte in rest {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if stream.write_all(&[byte]).await.is_err() {
                    return;
                }
            }
        });
    }
    all_started.recv().await.expect("every trickler connected");
    attackers
}

/// One request of a flooding client: whether it got the answer the attack expects.
type Call = std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>>;

/// A flooding attack: its clients and the count of unexpected answers.
struct Flood {
    _clients: JoinSet<()>,
    unexpected: Arc<AtomicUsize>,
}

impl Flood {
    /// Stops the clients; asserts every answer was the expected one.
    fn stop(self, attack: &str) {
        let unexpected = self.unexpected.load(Ordering::SeqCst);
        assert_eq!(unexpected, 0, "{attack}: unexpected answers");
    }
}

/// Runs [`FLOODERS`] clients that send `request` again and again; returns once a first
/// answer (or refusal) has come back (the attack is on).
async fn flood(request: impl Fn() -> Call + Send + Sync + 'static) -> Flood {
    let request = Arc::new(request);
    let unexpected = Arc::new(AtomicUsize::new(0));
    let (tell, mut first) = tokio::sync::mpsc::channel::<()>(FLOODERS);
    let mut clients = JoinSet::new();
    for _ in 0..FLOODERS {
        let (request, tell, unexpected) = (request.clone(), tell.clone(), unexpected.clone());
        clients.spawn(async move {
            loop {
                if !request().await {
                    unexpected.fetch_add(1, Ordering::SeqCst);
                }
                let _ = tell.try_send(());
            }
        });
    }
    first.recv().await.expect("a flooding request came back");
    Flood {
        _clients: clients,
        unexpected,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_listener_answers_within_a_second_during_each_attack() {
    let server = TestServer::start().await;
    assert_eq!(common::code(&server.register("inst", 16).await), "OK");
    assert!(http_answers(&server, "admin_http", "/api/listStorage").await);
    let idle_rss = common::rss_bytes(server.pid());
    let meta_http = server.address("http");

    // Slow headers: a head that never ends, one byte per 200 ms.
    let head = b"POST /api/getClusterInfo HTTP/1.1\r\nHost: x\r\nX-Slow: ".to_vec();
    let attackers = trickle(meta_http, head, vec![b'a'; 10_000]).await;
    assert_served_during(&server, "slow headers", idle_rss).await;
    drop(attackers);

    // Slow bodies: a whole head announcing 1 MiB, the body one byte per 200 ms.
    let head = b"POST /api/getCacheLocation HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n";
    let attackers = trickle(meta_http, head.to_vec(), vec![b' '; 10_000]).await;
    assert_served_during(&server, "slow bodies", idle_rss).await;
    drop(attackers);

    // 10 MiB bodies (over the 4 MiB default: 413), sent again and again.
    let big = Arc::new(vec![b' '; 10 << 20]);
    let attack = flood(move || {
        let big = big.clone();
        Box::pin(async move {
            let route = "/api/getCacheLocation";
            common::http_request(meta_http, "POST", route, &big).await.0 == 413
        })
    })
    .await;
    assert_served_during(&server, "10 MiB bodies", idle_rss).await;
    attack.stop("10 MiB bodies");

    // 100k keys in one request, over HTTP (a batch get answers a location or placeholder
    // per key) and gRPC, again and again.
    let keys: Vec<i64> = (0..KEYS).collect();
    let body = serde_json::json!({"instance_id": "inst", "query_type": "QT_BATCH_GET",
        "block_keys": keys});
    let body = Arc::new(body.to_string().into_bytes());
    let attack = flood(move || {
        let body = body.clone();
        Box::pin(async move {
            // A 100k-key batch get is within the limits: answered.
            let route = "/api/getCacheLocation";
            common::http_request(meta_http, "POST", route, &body)
                .await
                .0
                == 200
        })
    })
    .await;
    assert_served_during(&server, "100k-key HTTP requests", idle_rss).await;
    attack.stop("100k-key HTTP requests");

    // A batch get answers a placeholder per missing key: ~10 MB, past tonic's 4 MB default.
    let grpc = server.meta().await.max_decoding_message_size(64 << 20);
    let attack = flood(move || {
        let mut grpc = grpc.clone();
        Box::pin(async move {
            let request = meta::GetCacheLocationRequest {
                instance_id: "inst".into(),
                query_type: meta::QueryType::QtBatchGet as i32,
                block_keys: (0..KEYS).collect(),
                ..Default::default()
            };
            let answer = grpc.get_cache_location(request).await;
            answer.is_ok_and(|answer| {
                common::grpc_code(&answer.into_inner().header) == meta::ErrorCode::Ok
            })
        })
    })
    .await;
    assert_served_during(&server, "100k-key gRPC requests", idle_rss).await;
    attack.stop("100k-key gRPC requests");
}
