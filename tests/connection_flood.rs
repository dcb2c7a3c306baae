//! Issue 14's descriptor-exhaustion attack at full size: 20,000 idle TCP connections from
//! two client processes (10,000 each, against meta HTTP and gRPC) on a server with the
//! default limits. While they are held, admin HTTP and debug HTTP answer within 1 s and
//! the server's RSS stays within 256 MiB of idle; once the clients go, the flooded
//! listeners answer again. (Before per-listener admission, ~20,100 idle connections took
//! every listener down.)
//!
//! The clients are `python3` processes (one process may hold 20,000 descriptors here, so
//! two are needed), each binding its sockets to a loopback address of its own (127.0.0.2,
//! 127.0.0.3), so that their ephemeral ports never compete with each other's or with the
//! rest of the test suite's loopback connections.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::TestServer;

/// Opens `count` non-blocking connections from `source` to `host:port`, waits until the
/// kernel settles them (each established, queued or still in SYN_SENT), prints
/// `ready <opened>` and holds them until its stdin closes.
const CLIENT: &str = r#"
import selectors, socket, sys, time
source, host, port, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
held = []
for _ in range(count):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    s.bind((source, 0))
    try:
        s.connect((host, port))
    except BlockingIOError:
        pass
    held.append(s)
time.sleep(1.0)
print("ready", len(held), flush=True)
sys.stdin.read()
"#;

/// Connections each client holds.
const PER_CLIENT: usize = 10_000;

/// A client holding [`PER_CLIENT`] connections from `source` to `address`.
fn flood(source: &str, address: SocketAddr) -> Child {
    let mut child = Command::new("python3")
        .args(["-c", CLIENT, source, "127.0.0.1"])
        .arg(address.port().to_string())
        .arg(PER_CLIENT.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3 runs the flood client");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("the client reports");
    assert_eq!(
        line.trim(),
        format!("ready {PER_CLIENT}"),
        "the client opened its connections"
    );
    child
}

/// Whether `listener` answers an HTTP probe within 1 s.
async fn http_answers(server: &TestServer, listener: &str, route: &str) -> bool {
    let probe = common::http_request(server.address(listener), "POST", route, b"{}");
    let answer = tokio::time::timeout(Duration::from_secs(1), probe).await;
    matches!(answer, Ok((200, _)))
}

/// Whether meta gRPC answers GetClusterInfo within 1 s (connecting included).
async fn grpc_answers(server: &TestServer) -> bool {
    let call = async {
        let mut client = server.meta().await;
        let request = kvcm::proto::meta::GetClusterInfoRequest::default();
        client.get_cluster_info(request).await.is_ok()
    };
    tokio::time::timeout(Duration::from_secs(1), call)
        .await
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_idle_connections_leave_the_other_listeners_answering() {
    let server = TestServer::start().await;
    assert!(http_answers(&server, "admin_http", "/api/listStorage").await);
    let idle_rss = common::rss_bytes(server.pid());

    let clients = [
        flood("127.0.0.2", server.address("http")),
        flood("127.0.0.3", server.address("grpc")),
    ];
    for (listener, route) in [
        ("admin_http", "/api/listStorage"),
        ("debug_http", "/api/clearFaults"),
    ] {
        assert!(
            http_answers(&server, listener, route).await,
            "{listener} answers within 1 s under 20,000 idle connections"
        );
    }
    let flooded_rss = common::rss_bytes(server.pid());
    assert!(
        flooded_rss <= idle_rss + (256 << 20),
        "RSS grew from {idle_rss} to {flooded_rss} bytes"
    );

    for mut client in clients {
        drop(client.stdin.take());
        client.wait().expect("the client exits");
    }
    let limit = Duration::from_secs(30);
    let meta = common::wait_until(limit, async || {
        http_answers(&server, "http", "/api/getClusterInfo")
            .await
            .then_some(())
    });
    assert!(
        meta.await.is_some(),
        "meta HTTP answers once the clients are gone"
    );
    let grpc = common::wait_until(limit, async || grpc_answers(&server).await.then_some(()));
    assert!(
        grpc.await.is_some(),
        "gRPC answers once the clients are gone"
    );
}
