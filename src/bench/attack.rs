//! `kvcm bench --attack`: GetCacheLocation (prefix match of 16 keys) over gRPC and meta HTTP,
//! idle and then during each of issue 14's attacks on the same in-process server, each beside
//! the idle figure of the same run. The attackers run on a runtime and thread of their own:
//! slow request heads and slow bodies (connections sending one byte per 200 ms), 10 MiB
//! bodies sent again and again (each refused 413), 100k-key batch gets again and again (each
//! answered), and thousands of idle connections on the meta HTTP listener. On a 2-core
//! machine server, client and attackers share the cores: the figures say what an attack
//! costs a well-behaved client here, not on a production host.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use super::measure::{paired_latency, Figures, Target};
use super::{bench_config, prefix_request, runtimes, start_seeded, BenchArgs};

/// Connections of a trickling attack, and of the idle flood.
const TRICKLERS: usize = 400;
/// Idle connections of the flood (below the listener's default 4,096).
const IDLE_CONNECTIONS: usize = 3_000;
/// Clients of a repeating attack.
const FLOODERS: usize = 4;
/// Keys of one batch get of the 100k-key attack.
const KEYS: i64 = 100_000;

/// One attack: a name and what starts its clients (on the attack runtime).
struct Attack {
    name: &'static str,
    start: fn(SocketAddr) -> JoinSet<()>,
}

const ATTACKS: [Attack; 5] = [
    Attack {
        name: "slow heads (400 conns)",
        start: slow_heads,
    },
    Attack {
        name: "slow bodies (400 conns)",
        start: slow_bodies,
    },
    Attack {
        name: "10 MiB bodies (4 clients)",
        start: big_bodies,
    },
    Attack {
        name: "100k-key gets (4 clients)",
        start: many_keys,
    },
    Attack {
        name: "3000 idle conns",
        start: idle_connections,
    },
];

/// Runs the attack benchmark and prints its table.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let (server_runtime, client_runtime) = runtimes()?;
    let attack_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let data_dir = std::env::temp_dir().join(format!("kvcm-attack-{}", std::process::id()));
    let config = bench_config(&data_dir)?;
    let (grpc, http, _) =
        server_runtime.block_on(start_seeded(&config, kvcm::service::LogSinks::default()))?;
    let request = prefix_request(16);
    let targets = client_runtime.block_on(async {
        let grpc = Target::grpc(grpc).await?;
        let http = Target::http(http, "/api/getCacheLocation").await?;
        anyhow::Ok([grpc, http])
    })?;
    let measure = || {
        client_runtime.block_on(async {
            let targets: Vec<&Target> = targets.iter().collect();
            paired_latency(args, &targets, &request).await
        })
    };
    let idle = measure()?;
    println!("attack                        gRPC p50  p99 µs   / idle   HTTP p50  p99 µs   / idle");
    print_row("none (idle)", &idle, &idle);
    for attack in &ATTACKS {
        let clients = attack_runtime.block_on(async { (attack.start)(http) });
        // Let the attack reach its steady state (connections open, first requests in).
        std::thread::sleep(Duration::from_millis(500));
        let during = measure()?;
        print_row(attack.name, &during, &idle);
        attack_runtime.block_on(async { drop(clients) });
    }
    let _ = std::fs::remove_dir_all(&data_dir);
    Ok(())
}

fn print_row(name: &str, during: &[Figures], idle: &[Figures]) {
    let (grpc, http) = (during[0], during[1]);
    println!(
        "{name:<28} {:>9.1} {:>7.1} {:>7.2}x {:>9.1} {:>7.1} {:>7.2}x",
        grpc.p50_us,
        grpc.p99_us,
        grpc.p50_us / idle[0].p50_us,
        http.p50_us,
        http.p99_us,
        http.p50_us / idle[1].p50_us
    );
}

/// [`TRICKLERS`] connections that send `first`, then `rest` one byte per 200 ms.
fn trickle(address: SocketAddr, first: &'static [u8], rest: u8) -> JoinSet<()> {
    let mut clients = JoinSet::new();
    for _ in 0..TRICKLERS {
        clients.spawn(async move {
            let Ok(mut stream) = TcpStream::connect(address).await else {
                return;
            };
            if stream.write_all(first).await.is_err() {
                return;
            }
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if stream.write_all(&[rest]).await.is_err() {
                    return;
                }
            }
        });
    }
    clients
}

fn slow_heads(address: SocketAddr) -> JoinSet<()> {
    trickle(
        address,
        b"POST /api/getClusterInfo HTTP/1.1\r\nX-Slow: ",
        b'a',
    )
}

fn slow_bodies(address: SocketAddr) -> JoinSet<()> {
    let head = b"POST /api/getCacheLocation HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n";
    trickle(address, head, b' ')
}

/// [`FLOODERS`] clients each sending `request` (a whole HTTP/1.1 request with `Connection:
/// close`) on a new connection and reading the answer, again and again.
fn repeat(address: SocketAddr, request: Vec<u8>) -> JoinSet<()> {
    let request = Arc::new(request);
    let mut clients = JoinSet::new();
    for _ in 0..FLOODERS {
        let request = request.clone();
        clients.spawn(async move {
            loop {
                let Ok(mut stream) = TcpStream::connect(address).await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                // The server may answer (413) and close before the whole body is read.
                let _ = stream.write_all(&request).await;
                let mut answer = Vec::new();
                let _ = stream.read_to_end(&mut answer).await;
            }
        });
    }
    clients
}

/// A whole POST of `body` to `path`, closing the connection after the answer.
fn post(path: &str, body: &[u8]) -> Vec<u8> {
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    [head.as_bytes(), body].concat()
}

fn big_bodies(address: SocketAddr) -> JoinSet<()> {
    repeat(
        address,
        post("/api/getCacheLocation", &vec![b' '; 10 << 20]),
    )
}

fn many_keys(address: SocketAddr) -> JoinSet<()> {
    let keys: Vec<i64> = (0..KEYS).collect();
    let body = serde_json::json!({"instance_id": "bench", "query_type": "QT_BATCH_GET",
        "block_keys": keys});
    repeat(
        address,
        post("/api/getCacheLocation", body.to_string().as_bytes()),
    )
}

fn idle_connections(address: SocketAddr) -> JoinSet<()> {
    let mut clients = JoinSet::new();
    for _ in 0..IDLE_CONNECTIONS {
        clients.spawn(async move {
            if let Ok(stream) = TcpStream::connect(address).await {
                // Held until the attack is dropped (or the idle timeout closes it).
                std::future::pending::<()>().await;
                drop(stream);
            }
        });
    }
    clients
}
