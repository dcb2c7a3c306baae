//! Issue 14's hostile clients, one attack at a time against a real `kvcm serve` with the
//! default limits: slow headers, slow bodies, 10 MiB bodies, 100k-key requests over HTTP
//! and gRPC. During each, every listener (meta, admin and debug HTTP, gRPC) answers a probe
//! within 1 s of being connected to, several times, and the server's RSS stays within
//! 256 MiB of idle. (The
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

/// How long an attack may take to be under way.
const ATTACK_START_LIMIT: Duration = Duration::from_secs(30);

/// How long each probe may take.
const PROBE_LIMIT: Duration = Duration::from_secs(1);

/// How long a probe's connection may take to be established: the attacks' own bursts of
/// connections trip the kernel's SYN-flood defence ("Possible SYN flooding ... Sending
/// cookies"), which may drop a probe's first SYN — retransmitted after 1 s.
const CONNECT_LIMIT: Duration = Duration::from_secs(5);

/// `Ok` when `listener`, once connected to, answers `route` with 200 within
/// [`PROBE_LIMIT`]; else what it did.
async fn http_answers(server: &TestServer, listener: &str, route: &str) -> Result<(), String> {
    use tokio::io::AsyncReadExt;
    let connect = TcpStream::connect(server.address(listener));
    let mut stream = match tokio::time::timeout(CONNECT_LIMIT, connect).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => return Err(format!("refused the connection: {error}")),
        Err(_) => return Err(format!("did not accept within {CONNECT_LIMIT:?}")),
    };
    let request = format!(
        "POST {route} HTTP/1.1\r\nHost: probe\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    );
    let exchange = async {
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        std::io::Result::Ok(answer)
    };
    match tokio::time::timeout(PROBE_LIMIT, exchange).await {
        Ok(Ok(answer)) if answer.starts_with(b"HTTP/1.1 200") => Ok(()),
        Ok(Ok(answer)) => Err(format!("answered {:?}", String::from_utf8_lossy(&answer))),
        Ok(Err(error)) => Err(format!("failed: {error}")),
        Err(_) => Err(format!("did not answer within {PROBE_LIMIT:?}")),
    }
}

/// Whether meta gRPC, once connected to, answers GetClusterInfo within [`PROBE_LIMIT`].
async fn grpc_answers(server: &TestServer) -> bool {
    let Ok(mut client) = tokio::time::timeout(CONNECT_LIMIT, server.meta()).await else {
        return false;
    };
    let call = client.get_cluster_info(meta::GetClusterInfoRequest::default());
    matches!(tokio::time::timeout(PROBE_LIMIT, call).await, Ok(Ok(_)))
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
            if let Err(what) = http_answers(server, listener, route).await {
                panic!("{attack}: {listener} {what} (round {round})");
            }
        }
        assert!(
            grpc_answers(server).await,
            "{attack}: gRPC did not answer within {PROBE_LIMIT:?} (round {round})"
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
            let stream = match TcpStream::connect(address).await {
                Ok(mut stream) => stream.write_all(&first).await.is_ok().then_some(stream),
                Err(_) => None,
            };
            // Counted whether or not it got through: the probes then show what it cost.
            if started.fetch_add(1, Ordering::SeqCst) + 1 == TRICKLERS {
                let _ = tell.send(()).await;
            }
            let Some(mut stream) = stream else {
                return;
            };
            for byte in rest {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if stream.write_all(&[byte]).await.is_err() {
                    return;
                }
            }
        });
    }
    let on = tokio::time::timeout(ATTACK_START_LIMIT, all_started.recv()).await;
    assert!(
        on.is_ok(),
        "the tricklers did not all connect within {ATTACK_START_LIMIT:?}"
    );
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
                // A request that fails at once (the server gone at the end) must still
                // let the task be aborted.
                tokio::task::yield_now().await;
            }
        });
    }
    let on = tokio::time::timeout(ATTACK_START_LIMIT, first.recv()).await;
    assert!(
        on.is_ok(),
        "no flooding request came back within {ATTACK_START_LIMIT:?}"
    );
    Flood {
        _clients: clients,
        unexpected,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_listener_answers_within_a_second_during_each_attack() {
    let server = TestServer::start().await;
    assert_eq!(common::code(&server.register("inst", 16).await), "OK");
    assert_eq!(
        http_answers(&server, "admin_http", "/api/listStorage").await,
        Ok(())
    );
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
