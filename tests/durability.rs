//! Crash durability of `kvcm serve` on its embedded default (journal on, fsync `always`):
//! clients stream StartWriteCache → bytes into the block file → FinishWriteCache, and
//! RemoveCache, over real gRPC; the server is SIGKILLed at a random moment and restarted on
//! the same data directory. Every acknowledged finish must read back at the same URI with
//! its bytes, every acknowledged remove must stay removed, and no WRITING entry may remain.
//!
//! `KVCM_KILL_POINTS` sets the number of kill points (default 3 in the test command; the
//! long run in docs/durability.md uses 25).
//!
//! The same on the shared store (`kvcm.registry_storage.uri=redis://…` on a private
//! redis-server): two nodes, the leader SIGKILLed while clients stream, the other takes over
//! and serves every acknowledged write; a paused leader that resumes after losing its lease
//! restarts itself and comes back as a follower.

mod common;
#[path = "../crates/index/tests/redis_support/mod.rs"]
mod redis_support;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{grpc_code, TestServer};
use kvcm::proto::admin::admin_service_client::AdminServiceClient;
use kvcm::proto::meta::meta_service_client::MetaServiceClient;
use kvcm::proto::{admin, meta};
use tonic::transport::Channel;

const INSTANCE: &str = "crash";
/// Registered size of the one spec (`common::registration`).
const BLOCK_BYTES: usize = 1024;
/// Keys per StartWriteCache.
const KEYS_PER_WRITE: i64 = 4;
/// Concurrent clients.
const WRITERS: i64 = 2;

/// What the clients were told.
#[derive(Debug, Default)]
struct Book {
    /// Acknowledged finishes: key → URI.
    written: BTreeMap<i64, String>,
    /// Acknowledged removes.
    removed: BTreeSet<i64>,
    /// Keys whose last call failed (the crash): either outcome is right.
    uncertain: BTreeSet<i64>,
    /// Every key a write was started for.
    started: BTreeSet<i64>,
}

impl Book {
    fn merge(&mut self, other: Book) {
        self.written.extend(other.written);
        self.removed.extend(other.removed);
        self.uncertain.extend(other.uncertain);
        self.started.extend(other.started);
    }
}

/// The bytes a key's block holds.
fn pattern(key: i64) -> Vec<u8> {
    (0..BLOCK_BYTES)
        .map(|i| (key as usize).wrapping_mul(31).wrapping_add(i) as u8)
        .collect()
}

fn ok(header: &Option<meta::CommonResponseHeader>) -> bool {
    grpc_code(header) == meta::ErrorCode::Ok
}

/// Writes the key's bytes where its URI says (the engine's part of a write).
fn store_bytes(uri: &str, key: i64) {
    let place = kvcm_data::parse_block_uri(uri).expect("a file URI");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&place.path)
        .expect("open the block file");
    file.write_all_at(&pattern(key), place.offset)
        .expect("write the block");
}

fn read_bytes(uri: &str) -> Vec<u8> {
    let place = kvcm_data::parse_block_uri(uri).expect("a file URI");
    let file = std::fs::File::open(&place.path).expect("the block file exists");
    let mut bytes = vec![0; BLOCK_BYTES];
    file.read_exact_at(&mut bytes, place.offset)
        .expect("read the block");
    bytes
}

/// One client: writes batches of new keys and removes every third batch's first key, until
/// `stop` or a failed call.
async fn stream(
    mut grpc: MetaServiceClient<Channel>,
    first_key: i64,
    stop: Arc<AtomicBool>,
) -> Book {
    let mut book = Book::default();
    let mut next = first_key;
    for round in 0.. {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let keys: Vec<i64> = (next..next + KEYS_PER_WRITE).collect();
        next += KEYS_PER_WRITE;
        book.started.extend(&keys);
        let request = meta::StartWriteCacheRequest {
            instance_id: INSTANCE.into(),
            block_keys: keys.clone(),
            write_timeout_seconds: 30,
            ..Default::default()
        };
        let Ok(started) = grpc
            .start_write_cache(request)
            .await
            .map(|r| r.into_inner())
        else {
            break;
        };
        if !ok(&started.header) {
            break;
        }
        let uris: Vec<String> = started
            .locations
            .iter()
            .map(|l| l.location_specs[0].uri.clone())
            .collect();
        assert_eq!(uris.len(), keys.len(), "new keys get a location each");
        for (key, uri) in keys.iter().zip(&uris) {
            store_bytes(uri, *key);
        }
        let finish = meta::FinishWriteCacheRequest {
            instance_id: INSTANCE.into(),
            write_session_id: started.write_session_id,
            success_blocks: Some(meta::BlockMask {
                info: Some(meta::block_mask::Info::Offset(KEYS_PER_WRITE as i32)),
            }),
            ..Default::default()
        };
        match grpc
            .finish_write_cache(finish)
            .await
            .map(|r| r.into_inner())
        {
            Ok(answer) if ok(&answer.header) => book.written.extend(keys.iter().copied().zip(uris)),
            _ => {
                book.uncertain.extend(&keys);
                break;
            }
        }
        if round % 3 == 2 {
            let key = keys[0];
            let remove = meta::RemoveCacheRequest {
                instance_id: INSTANCE.into(),
                block_keys: vec![key],
                ..Default::default()
            };
            match grpc.remove_cache(remove).await.map(|r| r.into_inner()) {
                Ok(answer) if ok(&answer.header) => {
                    book.written.remove(&key);
                    book.removed.insert(key);
                }
                _ => {
                    book.uncertain.insert(key);
                    break;
                }
            }
        }
    }
    book
}

/// Per key, the URI a batch get answers (empty: not readable).
async fn batch_get(server: &TestServer, keys: &[i64]) -> Vec<String> {
    let mut grpc = server.meta().await;
    let mut uris = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(256) {
        let request = meta::GetCacheLocationRequest {
            instance_id: INSTANCE.into(),
            query_type: meta::QueryType::QtBatchGet as i32,
            block_keys: chunk.to_vec(),
            ..Default::default()
        };
        let answer = grpc
            .get_cache_location(request)
            .await
            .expect("get")
            .into_inner();
        assert!(ok(&answer.header), "{:?}", answer.header);
        let found = answer.locations.iter().map(|l| {
            l.location_specs
                .first()
                .map_or(String::new(), |s| s.uri.clone())
        });
        uris.extend(found);
    }
    uris
}

/// Checks the restarted server against what the clients were told.
async fn verify(server: &TestServer, book: &Book) {
    let certain = |key: &i64| !book.uncertain.contains(key);
    let written: Vec<(i64, &String)> = book
        .written
        .iter()
        .filter(|(k, _)| certain(k))
        .map(|(k, u)| (*k, u))
        .collect();
    let keys: Vec<i64> = written.iter().map(|(k, _)| *k).collect();
    let found = batch_get(server, &keys).await;
    for ((key, uri), now) in written.iter().zip(&found) {
        assert_eq!(
            now, *uri,
            "key {key}: an acknowledged write reads at its URI"
        );
        assert_eq!(read_bytes(uri), pattern(*key), "key {key}: its bytes");
    }
    let removed: Vec<i64> = book.removed.iter().copied().filter(certain).collect();
    let found = batch_get(server, &removed).await;
    for (key, now) in removed.iter().zip(&found) {
        assert!(
            now.is_empty(),
            "key {key}: an acknowledged remove stays removed ({now})"
        );
    }
    let started: Vec<i64> = book.started.iter().copied().collect();
    for chunk in started.chunks(256) {
        let statuses = server.statuses(INSTANCE, chunk).await;
        for (key, status) in chunk.iter().zip(statuses) {
            assert_ne!(
                status, "CLS_WRITING",
                "key {key}: no WRITING entry after a restart"
            );
        }
    }
}

/// SIGKILL keeps the page cache, so surviving it does not show that acknowledgements waited
/// for fdatasync: the journal's own bookkeeping does. Under `fsync = always` no write may have
/// been acknowledged before its record was synced.
async fn check_bookkeeping(server: &TestServer) {
    let (status, body) =
        common::http_request(server.address("admin_http"), "GET", "/metrics", b"").await;
    assert_eq!(status, 200);
    let text = String::from_utf8(body).expect("text");
    let counter = |name: &str| -> u64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("kvcm_journal_{name} ")))
            .unwrap_or_else(|| panic!("kvcm_journal_{name} in {text}"));
        line.rsplit(' ').next().unwrap().parse().expect("a number")
    };
    assert_eq!(counter("early_acknowledgements"), 0, "{text}");
    assert!(counter("records_acknowledged") > 0, "{text}");
    assert!(
        counter("records_synced") >= counter("records_acknowledged"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_and_removes_survive_sigkill_at_random_moments() {
    let kill_points: i64 = std::env::var("KVCM_KILL_POINTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let began = Instant::now();
    let mut server = TestServer::start().await;
    let registered = server.register(INSTANCE, 64).await;
    assert_eq!(common::code(&registered), "OK", "{registered}");
    let mut book = Book::default();
    for point in 0..kill_points {
        let stop = Arc::new(AtomicBool::new(false));
        let mut writers = Vec::new();
        for writer in 0..WRITERS {
            let first_key = 1 + (point * WRITERS + writer) * 1_000_000;
            let grpc = server.meta().await;
            writers.push(tokio::spawn(stream(grpc, first_key, stop.clone())));
        }
        // The kill moment is chosen at random: this sleep is the experiment, not a wait.
        tokio::time::sleep(Duration::from_millis(fastrand::u64(200..1500))).await;
        check_bookkeeping(&server).await;
        stop.store(true, Ordering::SeqCst);
        server = server.kill_and_restart().await;
        for writer in writers {
            book.merge(writer.await.expect("writer"));
        }
        verify(&server, &book).await;
        eprintln!(
            "kill point {point}: {} acknowledged writes, {} removes, {} uncertain so far",
            book.written.len(),
            book.removed.len(),
            book.uncertain.len()
        );
    }
    assert!(
        book.written.len() as i64 >= kill_points,
        "the clients got writes in: {book:?}"
    );
    eprintln!(
        "{kill_points} kill points in {:.1} s",
        began.elapsed().as_secs_f64()
    );
}

/// Lease of the shared-store nodes (longer than a promotion of the test's ~1.5k entries on a
/// loaded 2-core machine, ~3 s at worst seen).
const LEASE: Duration = Duration::from_secs(4);
/// How long a takeover may take: a lease, the promotion, and a second.
const TAKEOVER: Duration = Duration::from_secs(8);

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
    eprintln!(
        "{} acknowledged writes, {} removes, {} uncertain",
        book.written.len(),
        book.removed.len(),
        book.uncertain.len()
    );
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
        let restarted = c.log().contains("restarting the process");
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
