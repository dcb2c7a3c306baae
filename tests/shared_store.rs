//! The shared store (`kvcm.registry_storage.uri=redis://…`, with the leader lock on the same
//! private redis-server): two `kvcm serve` nodes, the leader SIGKILLed while clients stream;
//! the other takes over and serves every acknowledged write; a node started after names it;
//! a paused leader that resumes after losing its lease restarts itself and follows;
//! LeaderDemote is answered, then the demoted node restarts (keeping its campaign pause) and
//! follows; SIGTERM stops a
//! leader without a restart. (In a test binary of its own: it times leases, and the local
//! crash test's fsync storm beside it starved a leader's renewals on 2 cores.)

mod common;
#[path = "../crates/index/tests/redis_support/mod.rs"]
mod redis_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::crash::{batch_get, stream, verify, Book, INSTANCE, WRITERS};
use common::TestServer;
use kvcm::proto::admin;
use kvcm::proto::admin::admin_service_client::AdminServiceClient;
use tonic::transport::Channel;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_shared_redis_store_the_next_leader_serves_every_acknowledged_write() {
    if !redis_support::redis_available("on_a_shared_redis_store") {
        return;
    }
    let redis_dir = tempfile::tempdir().expect("redis dir");
    // The kvcm processes are killed here, not Redis: its fsync policy is not under test, and
    // `always` stalls its main thread (the lock's renewals too) on a busy disk.
    let redis =
        redis_support::RedisServer::start_with_args(redis_dir.path(), &["--appendfsync", "no"]);
    let a = shared_node(&redis.uri(), "a").await;
    wait_leads(&a, TAKEOVER).await;
    let mut b = shared_node(&redis.uri(), "b").await;
    assert!(!leads(&b).await, "one leader");
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
