//! The shared store (`kvcm.registry_storage.uri=redis://…`, with the leader lock on the same
//! private redis-server): two `kvcm serve` nodes, the leader SIGKILLed while clients stream;
//! the other takes over and serves every acknowledged write; a node started after names it;
//! a paused leader that resumes after losing its lease restarts itself and follows;
//! LeaderDemote is answered, then the demoted node restarts (keeping its campaign pause) and
//! follows; SIGTERM stops a
//! leader without a restart; pool blocks survive a leader change when their node resumes.
//! (In a test binary of its own, its tests one at a time: they time leases, and the local
//! crash test's fsync storm beside it starved a leader's renewals on 2 cores.)

mod common;
#[path = "../crates/index/tests/redis_support/mod.rs"]
mod redis_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::crash::{batch_get, stream, verify, Book, INSTANCE, WRITERS};
use common::pool::{group, live_range, members, pool_storage, PoolProcess};
use common::TestServer;
use kvcm::proto::admin;
use kvcm::proto::admin::admin_service_client::AdminServiceClient;
use kvcm_client::{
    ClientConfig, GetOutcome, PutOutcome, ServerAddress, TransferConfig, TransferEngine,
    TransferPath, Wire,
};
use serde_json::json;
use tonic::transport::Channel;

/// Held by each test for its whole run: they time leases, so they run one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Lease of the shared-store nodes (longer than a promotion of the test's ~1.5k entries on a
/// loaded 2-core machine, ~3 s at worst seen).
const LEASE: Duration = Duration::from_secs(4);
/// How long the test waits for a takeover (a lease and the promotion; generous for loaded
/// machines — the measured time is printed; election.rs asserts lease + 1 s).
const TAKEOVER: Duration = Duration::from_secs(20);

/// A node `id` whose metadata and lock are on the redis at `uri`, on free ports pinned for
/// its whole life (a node that restarts itself binds them again).
async fn shared_node(uri: &str, id: &str) -> TestServer {
    // Below the ephemeral range (32768 on): a port the OS picked for some other test's
    // outgoing connection meanwhile cannot collide with these; debug HTTP is http + 3000.
    let port = || loop {
        let port = fastrand::u16(20_000..29_000);
        let free = |port| std::net::TcpListener::bind(("0.0.0.0", port)).is_ok();
        if free(port) && free(port + 3000) {
            return port;
        }
    };
    let settings = [
        format!("kvcm.coordination.uri={uri}"),
        format!("kvcm.registry_storage.uri={uri}"),
        format!("kvcm.leader_elector.lease_ms={}", LEASE.as_millis()),
        format!("kvcm.leader_elector.node_id={id}"),
        format!("kvcm.service.rpc_port={}", port()),
        format!("kvcm.service.http_port={}", port()),
        format!("kvcm.service.admin_http_port={}", port()),
    ];
    let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
    TestServer::start_with(&settings).await
}

/// An AdminService client of `server`, when it accepts connections now.
async fn admin_of(server: &TestServer) -> Option<AdminServiceClient<Channel>> {
    let url = format!("http://{}", server.address("grpc"));
    let connect = AdminServiceClient::connect(url);
    tokio::time::timeout(Duration::from_secs(1), connect)
        .await
        .ok()?
        .ok()
}

/// Whether `server` answers as leader now (an unreachable server is not).
async fn leads(server: &TestServer) -> bool {
    let Some(mut admin) = admin_of(server).await else {
        return false;
    };
    let request = admin::CheckHealthRequest::default();
    admin
        .check_health(request)
        .await
        .is_ok_and(|answer| answer.into_inner().is_leader)
}

/// The leader `server` names in GetManagerClusterInfo (`None` while it does not answer).
async fn named_leader(server: &TestServer) -> Option<String> {
    let mut admin = admin_of(server).await?;
    let request = admin::GetManagerClusterInfoRequest::default();
    let answer = admin.get_manager_cluster_info(request).await.ok()?;
    Some(answer.into_inner().leader_node_id)
}

async fn wait_leads(server: &TestServer, limit: Duration) {
    let started = Instant::now();
    let led = common::wait_until(limit, async || leads(server).await.then_some(())).await;
    assert!(led.is_some(), "no lead within {limit:?}: {}", server.log());
    eprintln!("took the lead in {:?}", started.elapsed());
}

/// A test's private store and its first two nodes: `a` leading, `b` following.
struct TwoNodes {
    /// Held for the test's whole run (see [`ONE_AT_A_TIME`]).
    _alone: tokio::sync::MutexGuard<'static, ()>,
    _redis_dir: tempfile::TempDir,
    redis: redis_support::RedisServer,
    a: TestServer,
    b: TestServer,
}

/// [`TwoNodes`] for `test`, or `None` after a loud skip where redis-server is missing.
async fn two_nodes(test: &str) -> Option<TwoNodes> {
    if !redis_support::redis_available(test) {
        return None;
    }
    let alone = ONE_AT_A_TIME.lock().await;
    let redis_dir = tempfile::tempdir().expect("redis dir");
    // The kvcm processes are killed here, not Redis: its fsync policy is not under test, and
    // `always` stalls its main thread (the lock's renewals too) on a busy disk.
    let redis =
        redis_support::RedisServer::start_with_args(redis_dir.path(), &["--appendfsync", "no"]);
    let a = shared_node(&redis.uri(), "a").await;
    wait_leads(&a, TAKEOVER).await;
    let b = shared_node(&redis.uri(), "b").await;
    assert!(!leads(&b).await, "one leader");
    Some(TwoNodes {
        _alone: alone,
        _redis_dir: redis_dir,
        redis,
        a,
        b,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_shared_redis_store_the_next_leader_serves_every_acknowledged_write() {
    let Some(TwoNodes {
        _alone,
        _redis_dir,
        redis,
        a,
        mut b,
    }) = two_nodes("on_a_shared_redis_store").await
    else {
        return;
    };
    let registered = a.register(INSTANCE, 64).await;
    assert_eq!(common::code(&registered), "OK", "{registered}");

    // Clients stream on the leader; it is SIGKILLed at a random moment.
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let grpc = a.meta().await;
        writers.push(tokio::spawn(stream(
            grpc,
            1 + writer * 1_000_000,
            stop.clone(),
        )));
    }
    // The kill moment is chosen at random: this sleep is the experiment, not a wait.
    tokio::time::sleep(Duration::from_millis(fastrand::u64(300..1500))).await;
    stop.store(true, Ordering::SeqCst);
    // `a` stays in scope: its data directory holds the default storage's block files.
    signal(a.pid(), "KILL");
    let mut book = Book::default();
    for writer in writers {
        book.merge(writer.await.expect("writer"));
    }
    assert!(!book.written.is_empty(), "the clients got writes in");

    // The other node takes over and serves every acknowledged write; a node started after
    // names it.
    wait_leads(&b, TAKEOVER).await;
    verify(&b, &book).await;
    eprintln!("{}", book.summary());
    let c = shared_node(&redis.uri(), "c").await;
    assert_eq!(named_leader(&c).await.as_deref(), Some("b"));
    assert!(!leads(&c).await);

    // The leader is paused past its lease: the follower takes over; resumed, the old leader
    // restarts itself (same process id) and follows, and nothing it held came back.
    signal(b.pid(), "STOP");
    wait_leads(&c, LEASE + TAKEOVER).await;
    let written = c.write_keys(INSTANCE, &[-7]).await;
    assert_eq!(common::code(&written), "OK", "{written}");
    signal(b.pid(), "CONT");
    let restarted = common::wait_until(Duration::from_secs(30), async || {
        let restarted = b.log().contains("restarting the process");
        let follows = named_leader(&b).await.as_deref() == Some("c");
        (restarted && follows).then_some(())
    })
    .await;
    assert!(
        restarted.is_some(),
        "the resumed node restarts and follows: {}",
        b.log()
    );
    assert!(!leads(&b).await);
    verify(&c, &book).await;
    let uris = batch_get(&c, &[-7]).await;
    assert!(!uris[0].is_empty(), "the new leader's write is served");

    // LeaderDemote: answered, then the demoted node restarts and follows the next leader.
    let mut admin = admin_of(&c).await.expect("the leader answers");
    let demoted = admin
        .leader_demote(admin::LeaderDemoteRequest::default())
        .await
        .expect("LeaderDemote is answered before the restart")
        .into_inner();
    assert_eq!(common::admin_code(&demoted.header), admin::ErrorCode::Ok);
    wait_leads(&b, LEASE + TAKEOVER).await;
    let follows = common::wait_until(Duration::from_secs(30), async || {
        // The restarted process keeps the demotion's campaign pause, so the demotion holds.
        let restarted = c.log().contains("restarted after a demotion");
        (restarted && named_leader(&c).await.as_deref() == Some("b")).then_some(())
    })
    .await;
    assert!(
        follows.is_some(),
        "the demoted node restarts and follows: {}",
        c.log()
    );
    verify(&b, &book).await;

    // SIGTERM stops a leader for good (its resignation is no lost lead to restart after).
    let restarts = |log: String| log.matches("restarting the process").count();
    let before = restarts(b.log());
    signal(b.pid(), "TERM");
    let exited = common::wait_until(Duration::from_secs(20), async || {
        (!b.is_running()).then_some(())
    })
    .await;
    assert!(exited.is_some(), "SIGTERM stops the leader: {}", b.log());
    assert_eq!(restarts(b.log()), before, "{}", b.log());
}

/// Sends `kill -<name>` to `pid`.
fn signal(pid: u32, name: &str) {
    let sent = std::process::Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .status()
        .expect("kill");
    assert!(sent.success(), "kill -{name} {pid}");
}

/// Bytes of one block's part: distinct for every key.
const PART_BYTES: usize = 16 << 10;

fn part_of(key: i64) -> Vec<u8> {
    let seed = (key as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (0..PART_BYTES as u64)
        .map(|i| (seed.wrapping_add(i.wrapping_mul(0x2545_f491)) >> 24) as u8)
        .collect()
}

/// A transfer engine for instance `on_pool` that knows every one of `servers` (it fails
/// over between them), its lookups on soft-TCP.
fn pool_engine(servers: &[&TestServer]) -> TransferEngine {
    let client = ClientConfig {
        servers: servers
            .iter()
            .map(|server| ServerAddress {
                grpc: format!("http://{}", server.address("grpc")),
                http: server.address("http"),
            })
            .collect(),
        instance_id: "on_pool".into(),
        wire: Some(Wire::Tcp),
        api_key: None,
        tls: None,
    };
    TransferEngine::connect(client, TransferConfig::default()).expect("engine")
}

/// Pool blocks survive a leader change on the shared store: the follower that takes over
/// finds the pool parts in the store and holds them for the node's incarnation; the node
/// (alive, its memory kept) passes to the next server, rejoins naming that incarnation and
/// gets it back; every block then reads back byte-exact through the new leader, and new
/// writes go to the node beside them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_blocks_survive_a_leader_change_when_their_node_resumes() {
    // Every field bound: the store and its directory live as long as the test.
    let Some(TwoNodes {
        _alone,
        _redis_dir,
        redis: _redis,
        a,
        b,
    }) = two_nodes("pool_blocks_survive_a_leader_change").await
    else {
        return;
    };
    assert!(
        a.log().contains("promoted to leader"),
        "the leader announces its lead: {}",
        a.log()
    );
    assert!(
        !b.log().contains("promoted to leader"),
        "a follower announces no lead (its provisional local one included): {}",
        b.log()
    );
    let added = a
        .admin_http("addStorage", json!({"storage": pool_storage("pool_a")}))
        .await;
    assert_eq!(common::code(&added), "OK", "{added}");
    let created = a
        .admin_http(
            "createInstanceGroup",
            json!({"instance_group": group("gp", &["pool_a"])}),
        )
        .await;
    assert_eq!(common::code(&created), "OK", "{created}");
    let registration = json!({"instance_group": "gp", "instance_id": "on_pool", "block_size": 16,
        "location_spec_infos": [{"name": "tp0", "size": PART_BYTES}],
        "model_deployment": {"model_name": "m", "dtype": "FP8", "tp_size": 1}});
    let registered = a.meta_http("registerInstance", registration).await;
    assert_eq!(common::code(&registered), "OK", "{registered}");
    let b_http = b.address("http").to_string();
    let _node =
        PoolProcess::start_with(&a, "pool_a", "node-1", "32M", &["--server", &b_http]).await;
    let range = live_range(&a, "pool_a", Some("node-1"), 1).await;

    let keys: Vec<i64> = (1..=40).collect();
    let parts: Vec<Vec<u8>> = keys.iter().map(|&k| part_of(k)).collect();
    let blocks: Vec<Vec<&[u8]>> = parts.iter().map(|p| vec![p.as_slice()]).collect();
    let put = tokio::task::block_in_place(|| pool_engine(&[&a, &b]).put_blocks(&keys, &blocks))
        .expect("put");
    assert_eq!(
        put,
        vec![PutOutcome::Written(TransferPath::PoolSoftTcp); keys.len()]
    );

    signal(a.pid(), "KILL");
    wait_leads(&b, TAKEOVER).await;
    let resumed = common::wait_until(Duration::from_secs(30), async || {
        let nodes = members(&b, "pool_a").await;
        let node = nodes
            .iter()
            .find(|n| n["node_id"] == "node-1" && n["live"] == true)?;
        Some((nodes.len(), node["range_id"].as_u64()))
    })
    .await;
    assert_eq!(
        resumed,
        Some((1, Some(range))),
        "the node resumed its incarnation on the new leader: {}",
        b.log()
    );

    let more: Vec<i64> = (100..=120).collect();
    let more_parts: Vec<Vec<u8>> = more.iter().map(|&k| part_of(k)).collect();
    let more_blocks: Vec<Vec<&[u8]>> = more_parts.iter().map(|p| vec![p.as_slice()]).collect();
    let all: Vec<i64> = keys.iter().chain(&more).copied().collect();
    let mut read: Vec<Vec<u8>> = vec![vec![0u8; PART_BYTES]; all.len()];
    let (put_more, got) = tokio::task::block_in_place(|| {
        let mut engine = pool_engine(&[&a, &b]);
        let put_more = engine.put_blocks(&more, &more_blocks).expect("put after");
        let mut outs: Vec<Vec<&mut [u8]>> =
            read.iter_mut().map(|p| vec![p.as_mut_slice()]).collect();
        (put_more, engine.get_blocks(&all, &mut outs).expect("get"))
    });
    assert_eq!(
        put_more,
        vec![PutOutcome::Written(TransferPath::PoolSoftTcp); more.len()]
    );
    assert_eq!(
        got,
        vec![GetOutcome::Hit(TransferPath::PoolSoftTcp); all.len()]
    );
    for (key, bytes) in all.iter().zip(&read) {
        assert!(*bytes == part_of(*key), "block {key} reads back byte-exact");
    }
}
