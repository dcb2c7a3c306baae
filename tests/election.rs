//! Leader election across real `kvcm serve` processes sharing a `file://` lock directory
//! (lease 2 s): one leader, the same leader seen by both, failover on LeaderDemote, SIGTERM,
//! SIGSTOP and SIGKILL within lease + 1 s, a restarted node back as a follower, a resumed
//! paused leader fenced, followers refusing leader-only calls, and leader discovery
//! (GetClusterInfo, GetManagerClusterInfo).

mod common;
#[path = "../crates/index/tests/redis_support/mod.rs"]
mod redis_support;

use std::time::{Duration, Instant};

use common::{code, grpc_code, wait_until, TestServer};
use kvcm::proto::meta;
use serde_json::{json, Value};

const LEASE: Duration = Duration::from_secs(2);
/// How long a failover may take: one lease plus a second.
const FAILOVER: Duration = Duration::from_secs(3);

/// A node `id` on the lock at `lock_uri`.
async fn start_node(lock_uri: &str, id: &str) -> TestServer {
    let settings = [
        format!("kvcm.coordination.uri={lock_uri}"),
        format!("kvcm.leader_elector.lease_ms={}", LEASE.as_millis()),
        format!("kvcm.leader_elector.node_id={id}"),
        format!("kvcm.service.custom_info=zone-{id}"),
    ];
    let args: Vec<String> = settings
        .iter()
        .flat_map(|setting| ["--env".to_string(), setting.clone()])
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    TestServer::start_custom(&args, &[]).await
}

async fn is_leader(server: &TestServer) -> bool {
    let health = server.admin_http("checkHealth", json!({})).await;
    assert_eq!(code(&health), "OK", "{health}");
    health["is_leader"] == json!(true)
}

async fn cluster_info(server: &TestServer) -> Value {
    let info = server.admin_http("getManagerClusterInfo", json!({})).await;
    assert_eq!(code(&info), "OK", "{info}");
    info
}

/// The leader both nodes agree on, once exactly one of them leads; `None` until then.
async fn agreed_leader(nodes: [(&TestServer, &str); 2]) -> Option<String> {
    let mut leaders = Vec::new();
    let mut named = Vec::new();
    for (server, id) in nodes {
        if is_leader(server).await {
            leaders.push(id.to_string());
        }
        named.push(cluster_info(server).await["leader_node_id"].clone());
    }
    let agreed = named[0] == named[1] && leaders.len() == 1;
    (agreed && named[0] == json!(leaders[0])).then(|| leaders.remove(0))
}

/// Waits until `server` leads; returns how long that took.
async fn leads_within(server: &TestServer, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    let took = wait_until(limit, async || {
        is_leader(server).await.then(|| started.elapsed())
    })
    .await;
    eprintln!("failover took {took:?}");
    took
}

/// A follower refuses leader-only calls over HTTP (meta and admin) and gRPC.
async fn refuses_leader_only_calls(follower: &TestServer) {
    let registered = follower.register("inst", 16).await;
    assert_eq!(code(&registered), "SERVER_NOT_LEADER", "{registered}");
    let listed = follower.admin_http("listStorage", json!({})).await;
    assert_eq!(code(&listed), "SERVER_NOT_LEADER", "{listed}");
    let start = meta::StartWriteCacheRequest {
        instance_id: "inst".into(),
        block_keys: vec![1],
        write_timeout_seconds: 30,
        ..Default::default()
    };
    let answer = follower
        .meta()
        .await
        .start_write_cache(start)
        .await
        .unwrap();
    let header = answer.into_inner().header;
    assert_eq!(grpc_code(&header), meta::ErrorCode::ServerNotLeader);
}

/// Both nodes name the leader's published endpoint on the meta port (HTTP and gRPC) and in
/// GetManagerClusterInfo.
async fn discover_leader(nodes: [&TestServer; 2], leader: &TestServer, leader_id: &str) {
    let expected = json!({
        "node_id": leader_id,
        "host": "127.0.0.1",
        "meta_rpc_port": leader.address("grpc").port(),
        "meta_http_port": leader.address("http").port(),
        "custom_info": format!("zone-{leader_id}"),
    });
    for server in nodes {
        let published = wait_until(Duration::from_secs(5), async || {
            let info = server.meta_http("getClusterInfo", json!({})).await;
            (info["leader_endpoint"] == expected).then_some(info)
        })
        .await;
        let info = published.expect("GetClusterInfo names the leader's bound endpoint");
        assert_eq!(code(&info), "OK");
        assert_eq!(info["leader_node_id"], json!(leader_id));
        let admin = cluster_info(server).await;
        let endpoint = &admin["leader_endpoint"];
        assert_eq!(
            endpoint["meta_http_port"], expected["meta_http_port"],
            "{admin}"
        );
        assert_eq!(
            endpoint["admin_http_port"],
            json!(leader.address("admin_http").port())
        );
    }
    let request = meta::GetClusterInfoRequest::default();
    let answer = nodes[0]
        .meta()
        .await
        .get_cluster_info(request)
        .await
        .unwrap();
    let answer = answer.into_inner();
    assert_eq!(answer.leader_node_id, leader_id);
    let endpoint = answer.leader_endpoint.expect("leader endpoint over gRPC");
    assert_eq!(
        endpoint.meta_rpc_port,
        i32::from(leader.address("grpc").port())
    );
}

#[tokio::test]
async fn two_nodes_on_a_file_lock_elect_one_leader_and_fail_over() {
    let lock_dir = tempfile::tempdir().expect("lock dir");
    elect_and_fail_over(&format!("file://{}", lock_dir.path().display())).await;
}

#[tokio::test]
async fn two_nodes_on_a_redis_lock_elect_one_leader_and_fail_over() {
    if !redis_support::redis_available("two_nodes_on_a_redis_lock") {
        return;
    }
    let dir = tempfile::tempdir().expect("redis dir");
    let redis = redis_support::RedisServer::start(dir.path());
    elect_and_fail_over(&redis.uri()).await;
}

/// The election acceptance run on one lock: one leader named by both, LeaderDemote, SIGTERM,
/// a restarted follower, SIGSTOP past the lease, SIGKILL.
async fn elect_and_fail_over(lock_uri: &str) {
    let mut a = start_node(lock_uri, "node-a").await;
    let mut b = start_node(lock_uri, "node-b").await;

    let first = wait_until(Duration::from_secs(10), async || {
        agreed_leader([(&a, "node-a"), (&b, "node-b")]).await
    })
    .await
    .expect("exactly one leader within 10 s, named by both");
    if first != "node-a" {
        std::mem::swap(&mut a, &mut b);
    }
    // From here `a` leads and `b` follows.
    let (a_id, b_id) = if first == "node-a" {
        ("node-a", "node-b")
    } else {
        ("node-b", "node-a")
    };
    refuses_leader_only_calls(&b).await;
    assert_eq!(code(&a.register("inst", 16).await), "OK");
    let info = cluster_info(&a).await;
    assert!(
        info["self_leader_expiration_time"]
            .as_str()
            .unwrap()
            .parse::<i64>()
            .unwrap()
            > 0
    );
    assert_eq!(cluster_info(&b).await["self_leader_expiration_time"], "-1");
    discover_leader([&a, &b], &a, a_id).await;

    // A long campaign delay keeps the demoted node out of the race for the lock.
    let delay = json!({"campaign_delay_time_ms": 60_000});
    assert_eq!(
        code(&a.admin_http("updateLeaderElectorConfig", delay).await),
        "OK"
    );
    let demoted = a.admin_http("leaderDemote", json!({})).await;
    assert_eq!(code(&demoted), "OK", "{demoted}");
    assert!(
        !is_leader(&a).await,
        "not leader once LeaderDemote answered"
    );
    let took = leads_within(&b, FAILOVER).await;
    assert!(
        took.is_some(),
        "the follower leads within lease + 1 s of a LeaderDemote"
    );
    assert_eq!(cluster_info(&a).await["leader_node_id"], json!(b_id));
    refuses_leader_only_calls(&a).await;
    // Setting the delay back takes effect at once: `a` may campaign again.
    let delay = json!({"campaign_delay_time_ms": 0});
    assert_eq!(
        code(&a.admin_http("updateLeaderElectorConfig", delay).await),
        "OK"
    );

    // `b` leads now: stop it gracefully.
    let status = b.signal_and_wait("TERM");
    assert!(status.success(), "clean exit on SIGTERM: {status}");
    let took = leads_within(&a, FAILOVER).await;
    assert!(
        took.is_some(),
        "the follower leads within lease + 1 s of the leader's SIGTERM"
    );

    let b = start_node(lock_uri, b_id).await;
    assert!(
        !is_leader(&b).await,
        "a restarted node comes back as a follower"
    );
    assert_eq!(cluster_info(&b).await["leader_node_id"], json!(a_id));
    discover_leader([&a, &b], &a, a_id).await;

    // A leader paused past its lease is fenced by its own clock: once resumed it refuses
    // leader-only calls at once, before its elector notices the lost lease.
    signal(&a, "STOP");
    let took = leads_within(&b, FAILOVER).await;
    signal(&a, "CONT");
    assert!(
        took.is_some(),
        "the follower leads within lease + 1 s of the leader's SIGSTOP"
    );
    refuses_leader_only_calls(&a).await;
    assert!(!is_leader(&a).await);
    assert_eq!(cluster_info(&a).await["leader_node_id"], json!(b_id));

    // A crash releases nothing: the follower takes over once the lease runs out.
    drop(b);
    let took = leads_within(&a, FAILOVER).await;
    assert!(
        took.is_some(),
        "the follower leads within lease + 1 s of the leader's SIGKILL"
    );
    assert_eq!(cluster_info(&a).await["leader_node_id"], json!(a_id));
}

/// Sends `kill -<name>` to the server's process.
fn signal(server: &TestServer, name: &str) {
    let status = std::process::Command::new("kill")
        .args([format!("-{name}"), server.pid().to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{name}");
}

#[tokio::test]
async fn a_bad_lock_uri_fails_at_start_naming_the_key() {
    let dir = tempfile::tempdir().expect("dir");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_kvcm"))
        .args(["serve", "--data-dir"])
        .arg(dir.path())
        .args(["--env", "kvcm.distributed_lock.uri=rediss://127.0.0.1:1"])
        .output()
        .expect("run kvcm serve");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("kvcm.distributed_lock.uri"), "{stderr}");
    assert!(stderr.contains("TLS"), "{stderr}");
}
