//! The data plane end to end: a real `kvcm serve`, real `kvcm pool` processes and real
//! files; the client's TransferEngine puts and gets blocks over soft-TCP and soft-shm (and
//! verbs where a device exists) and through the file tier, and survives the death of a pool node without ever returning
//! wrong bytes.

mod common;

use std::time::{Duration, Instant};

use common::pool::{group, live_range, members, pool_storage, HugePages, PoolProcess};
use common::{code, other_user, TestServer};
use kvcm::proto::meta;
use kvcm_client::{
    ClientConfig, GetOutcome, PutOutcome, ServerAddress, TransferConfig, TransferEngine,
    TransferPath, Wire,
};
use serde_json::json;

/// Specs per block and bytes per spec.
const SPECS: usize = 4;
const SPEC_BYTES: usize = 16 << 10;

/// The bytes of part `spec` of block `key`: distinct for every (key, spec).
fn pattern(key: i64, spec: usize) -> Vec<u8> {
    let seed = (key as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (spec as u64) << 56;
    (0..SPEC_BYTES as u64)
        .map(|i| (seed.wrapping_add(i.wrapping_mul(0x2545_f491)) >> 24) as u8)
        .collect()
}

async fn register(server: &TestServer, instance: &str, group: &str) {
    let specs: Vec<_> = (0..SPECS)
        .map(|i| json!({"name": format!("tp{i}"), "size": SPEC_BYTES}))
        .collect();
    let body = json!({"instance_group": group, "instance_id": instance, "block_size": 16,
                      "location_spec_infos": specs,
                      "model_deployment": {"model_name": "m", "dtype": "FP8", "tp_size": 4}});
    let answer = server.meta_http("registerInstance", body).await;
    assert_eq!(code(&answer), "OK", "{answer}");
}

/// A server with pool storage `pool_a` (group `gp`, pool first) and instances `on_pool`
/// (group `gp`) and `on_file` (group `default`, the file storage).
async fn prepare_async(heartbeat_ms: u64, settings: &[&str]) -> TestServer {
    let heartbeat = format!("kvcm.pool.heartbeat_ms={heartbeat_ms}");
    let mut all = vec![heartbeat.as_str()];
    all.extend_from_slice(settings);
    let server = TestServer::start_with(&all).await;
    let added = server
        .admin_http("addStorage", json!({"storage": pool_storage("pool_a")}))
        .await;
    assert_eq!(code(&added), "OK", "{added}");
    let created = server
        .admin_http(
            "createInstanceGroup",
            json!({"instance_group": group("gp", &["pool_a"])}),
        )
        .await;
    assert_eq!(code(&created), "OK", "{created}");
    register(&server, "on_pool", "gp").await;
    register(&server, "on_file", "default").await;
    server
}

/// A runtime for the harness's async helpers (the engine itself is blocking) and a
/// prepared server with pool node `node-1` of `size` joined.
fn prepare(heartbeat_ms: u64, size: &str) -> (tokio::runtime::Runtime, TestServer, PoolProcess) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (server, node) = runtime.block_on(async {
        let server = prepare_async(heartbeat_ms, &[]).await;
        let node = PoolProcess::start(&server, "pool_a", "node-1", size).await;
        live_range(&server, "pool_a", Some("node-1"), 1).await;
        (server, node)
    });
    (runtime, server, node)
}

fn engine(server: &TestServer, instance: &str, config: TransferConfig) -> TransferEngine {
    engine_on(server, instance, Wire::Tcp, config)
}

/// An engine whose lookups use `wire`.
fn engine_on(
    server: &TestServer,
    instance: &str,
    wire: Wire,
    config: TransferConfig,
) -> TransferEngine {
    engine_with_key(server, (instance, None), wire, config)
}

/// An engine of `instance` showing `api_key`, whose lookups use `wire`.
fn engine_with_key(
    server: &TestServer,
    (instance, api_key): (&str, Option<&str>),
    wire: Wire,
    config: TransferConfig,
) -> TransferEngine {
    let client = ClientConfig {
        servers: vec![ServerAddress {
            grpc: format!("http://{}", server.address("grpc")),
            http: server.address("http"),
        }],
        instance_id: instance.into(),
        wire: Some(wire),
        api_key: api_key.map(str::to_string),
        tls: None,
    };
    TransferEngine::connect(client, config).expect("engine")
}

/// Puts blocks `keys` (their patterns) and returns the outcomes.
fn put(engine: &mut TransferEngine, keys: &[i64]) -> Vec<PutOutcome> {
    try_put(engine, keys).expect("put_blocks")
}

/// Puts blocks `keys` (their patterns): the outcomes, or the call's error.
fn try_put(
    engine: &mut TransferEngine,
    keys: &[i64],
) -> Result<Vec<PutOutcome>, kvcm_client::ClientError> {
    let data: Vec<Vec<Vec<u8>>> = keys
        .iter()
        .map(|&k| (0..SPECS).map(|s| pattern(k, s)).collect())
        .collect();
    let blocks: Vec<Vec<&[u8]>> = data
        .iter()
        .map(|parts| parts.iter().map(Vec::as_slice).collect())
        .collect();
    engine.put_blocks(keys, &blocks)
}

/// Puts blocks `keys` through an engine whose pool wire is `wire` and gets them back:
/// every block must be written and hit by `path`, byte-exact. Returns the engine.
fn round_trip_by(
    server: &TestServer,
    (wire, path): (Wire, TransferPath),
    keys: &[i64],
) -> TransferEngine {
    let config = TransferConfig {
        pool_wire: wire,
        ..TransferConfig::default()
    };
    let mut engine = engine(server, "on_pool", config);
    assert_eq!(written_by(&put(&mut engine, keys)), vec![path; keys.len()]);
    let got = get_checked(&mut engine, keys);
    assert_eq!(got, vec![GetOutcome::Hit(path); keys.len()]);
    engine
}

/// Gets blocks `keys`; every hit must carry exactly its pattern. Returns the outcomes (an
/// error when the server refused the lookup).
fn try_get_checked(
    engine: &mut TransferEngine,
    keys: &[i64],
) -> Result<Vec<GetOutcome>, kvcm_client::ClientError> {
    let mut data = vec![vec![vec![0u8; SPEC_BYTES]; SPECS]; keys.len()];
    let mut blocks: Vec<Vec<&mut [u8]>> = data
        .iter_mut()
        .map(|parts| parts.iter_mut().map(Vec::as_mut_slice).collect())
        .collect();
    let outcomes = engine.get_blocks(keys, &mut blocks)?;
    drop(blocks);
    for ((key, outcome), parts) in keys.iter().zip(&outcomes).zip(&data) {
        if matches!(outcome, GetOutcome::Hit(_)) {
            for (spec, bytes) in parts.iter().enumerate() {
                assert!(
                    *bytes == pattern(*key, spec),
                    "block {key} spec {spec}: wrong bytes"
                );
            }
        }
    }
    Ok(outcomes)
}

/// [`try_get_checked`] that must get an answer.
fn get_checked(engine: &mut TransferEngine, keys: &[i64]) -> Vec<GetOutcome> {
    try_get_checked(engine, keys).expect("get_blocks")
}

fn written_by(outcomes: &[PutOutcome]) -> Vec<TransferPath> {
    outcomes
        .iter()
        .map(|o| match o {
            PutOutcome::Written(path) => *path,
            other => panic!("not written: {other:?}"),
        })
        .collect()
}

fn hits(outcomes: &[GetOutcome]) -> usize {
    outcomes
        .iter()
        .filter(|o| matches!(o, GetOutcome::Hit(_)))
        .count()
}

fn pool_used(runtime: &tokio::runtime::Runtime, server: &TestServer) -> u64 {
    let nodes = runtime.block_on(members(server, "pool_a"));
    nodes
        .iter()
        .filter(|n| n["live"] == true)
        .map(|n| n["used"].as_u64().unwrap())
        .sum()
}

/// On real verbs (a device named by `KVCM_VERBS_DEVICE`: `.ci/rxe-verbs` runs it on kernel
/// soft-RoCE in a VM): a `kvcm pool` given the device serves its region there too, and an
/// engine puts and gets blocks over verbs (lookups over verbs as well), byte-exact, staged
/// and zero-copy from registered memory; the same blocks read back over soft-TCP. Skips
/// loudly without a device or the `rdma` feature.
#[test]
fn blocks_round_trip_through_a_pool_node_over_verbs_or_loud_skip() {
    let Some((_runtime, server, _node)) = node_on_verbs("the data plane on verbs") else {
        return;
    };
    let keys: Vec<i64> = (1..=64).collect();
    let verbs = TransferConfig {
        pool_wire: Wire::Verbs,
        ..TransferConfig::default()
    };
    let mut on_verbs = engine_on(&server, "on_pool", Wire::Verbs, verbs);
    let put_outcomes = put(&mut on_verbs, &keys);
    assert!(
        written_by(&put_outcomes)
            .iter()
            .all(|p| *p == TransferPath::PoolVerbs),
        "{:?}",
        &put_outcomes[..2]
    );
    let got = get_checked(&mut on_verbs, &keys);
    assert!(
        got.iter()
            .all(|o| *o == GetOutcome::Hit(TransferPath::PoolVerbs)),
        "{:?}",
        &got[..2]
    );
    let metrics = on_verbs.client().metrics();
    assert!(
        metrics.hits > 0 && metrics.writes_by_message > 0,
        "lookups and the two-phase writes went over the verbs queue pair: {metrics:?}"
    );
    // The bytes the NIC wrote read back over the soft wire.
    let mut tcp = engine(&server, "on_pool", TransferConfig::default());
    let got = get_checked(&mut tcp, &keys);
    assert_eq!(hits(&got), keys.len());
    // Zero-copy: the NIC moves blocks straight from and into memory the caller registered.
    let more: Vec<i64> = (101..=116).collect();
    round_trip_in_registered_memory(&mut on_verbs, &more, TransferPath::PoolVerbsZeroCopy);
}

/// The node answers with its endpoint only once it has the client's and has connected its
/// queue pair to it (the handshake order docs/data-plane.md states).
#[test]
fn a_pool_node_sends_its_endpoint_only_after_the_clients() {
    use kvcm_transport::{Domain, QpConfig, QueuePair};
    use std::io::{Read, Write};
    let (_runtime, _server, node) = prepare(200, "16M");
    let endpoint = node.ready["listen"].as_str().expect("listen").to_string();
    let mut stream = std::net::TcpStream::connect(&endpoint).expect("connect");
    let mut hello = kvcm::pool::POOL_HELLO.to_vec();
    hello.push(Wire::Tcp.index() as u8);
    stream.write_all(&hello).expect("hello");
    common::assert_waits_for_the_clients_endpoint(&mut stream, Duration::from_millis(300));
    let domain = Wire::Tcp
        .open_domain(Duration::from_secs(2))
        .expect("domain");
    let cq = domain.create_cq().expect("cq");
    let qp = domain.create_qp(&cq, &cq, QpConfig::default()).expect("qp");
    kvcm_transport::write_endpoint(&mut stream, &qp.endpoint()).expect("our endpoint");
    let theirs = kvcm_transport::read_endpoint(&mut stream).expect("the node's endpoint");
    qp.connect(&theirs).expect("connected");
    let mut info = [0u8; kvcm::pool::RegionInfo::SIZE];
    stream.read_exact(&mut info).expect("the region's info");
    assert_eq!(kvcm::pool::RegionInfo::decode(&info).len, 16 << 20);
}

/// On real verbs: a client that said it keeps its handshake connection and then closes it
/// (as an engine's link does when dropped, or the kernel when its process dies) gets its
/// queue pair torn down by the node — a verbs responder would otherwise keep it for good —;
/// a client that keeps the connection, and one that never said it would (an earlier
/// release), keep theirs. Skips loudly without a device.
#[test]
fn a_pool_queue_pair_is_torn_down_when_its_client_hangs_up_on_verbs_or_loud_skip() {
    let Some((_runtime, _server, node)) = node_on_verbs("pool queue-pair hang-up on verbs") else {
        return;
    };
    let endpoint = node.ready["listen"].as_str().expect("listen").to_string();
    let open = |wire_byte: u8| {
        let mut hello = kvcm::pool::POOL_HELLO.to_vec();
        hello.push(wire_byte);
        RawPoolQp::open(&endpoint, &hello, Wire::Verbs).expect("a verbs queue pair")
    };
    let verbs = Wire::Verbs.index() as u8;
    let (mut leaving, staying) = (
        open(verbs | kvcm::pool::KEEPS_CONNECTION),
        open(verbs | kvcm::pool::KEEPS_CONNECTION),
    );
    // A client of an earlier release closes the connection after the handshake and keeps
    // its queue pair.
    let mut earlier = open(verbs);
    drop(earlier.hangup.take());
    assert!(
        leaving.reads(None) && staying.reads(None),
        "the watched clients read the region"
    );
    drop(leaving.hangup.take());
    let torn_down = common::wait_until_blocking(Duration::from_secs(30), || {
        (!leaving.reads(None)).then_some(())
    });
    assert!(
        torn_down.is_some(),
        "the hung-up client's queue pair is torn down"
    );
    assert!(staying.reads(None), "the other client's queue pair stays");
    assert!(
        earlier.reads(None),
        "an unwatched client's queue pair stays"
    );
}

#[test]
fn a_thousand_blocks_of_four_specs_round_trip_through_the_pool_on_both_wires_and_through_files() {
    let (runtime, server, _node) = prepare(200, "80M");
    let keys: Vec<i64> = (1..=1000).collect();
    for (wire, path, keys) in [
        (Wire::Tcp, TransferPath::PoolSoftTcp, &keys[..500]),
        (Wire::Shm, TransferPath::PoolSoftShm, &keys[500..]),
    ] {
        let mut engine = round_trip_by(&server, (wire, path), keys);
        let again = put(&mut engine, keys);
        assert!(
            again.iter().all(|o| *o == PutOutcome::Present),
            "a second put writes nothing"
        );
    }
    // Every block reads back on the other wire too (same bytes, other path).
    let shm = TransferConfig {
        pool_wire: Wire::Shm,
        ..TransferConfig::default()
    };
    let all = get_checked(&mut engine(&server, "on_pool", shm), &keys);
    assert_eq!(hits(&all), 1000);
    let expected_used = 1000 * (SPECS * SPEC_BYTES) as u64;
    assert_eq!(
        pool_used(&runtime, &server),
        expected_used,
        "exact pool usage"
    );

    let mut files = engine(&server, "on_file", TransferConfig::default());
    let put_outcomes = put(&mut files, &keys);
    assert!(written_by(&put_outcomes)
        .iter()
        .all(|p| matches!(p, TransferPath::File(_))));
    assert_eq!(hits(&get_checked(&mut files, &keys)), 1000);
    let misses = get_checked(&mut files, &[5000, 5001]);
    assert!(misses.iter().all(|o| *o == GetOutcome::Miss(None)));
}

#[test]
fn a_pool_node_killed_mid_transfer_gives_misses_in_time_and_never_wrong_bytes() {
    let (_runtime, server, mut node) = prepare(100, "80M");
    let keys: Vec<i64> = (1..=1000).collect();
    let timeout = Duration::from_secs(1);
    let config = TransferConfig {
        timeout,
        ..TransferConfig::default()
    };
    let mut engine = engine(&server, "on_pool", config);
    put(&mut engine, &keys);
    assert_eq!(
        hits(&get_checked(&mut engine, &keys)),
        1000,
        "all hits before the kill"
    );
    let completed = std::sync::atomic::AtomicUsize::new(0);
    let (rounds, killed_at) = std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            let mut rounds = Vec::new();
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(4) {
                let begun = Instant::now();
                // A refused lookup (no storage of the group available) counts as 0 hits.
                let found = try_get_checked(&mut engine, &keys).map_or(0, |o| hits(&o));
                rounds.push(Round {
                    begun,
                    took: begun.elapsed(),
                    found,
                });
                completed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            rounds
        });
        let one_round = common::wait_until_blocking(Duration::from_secs(10), || {
            (completed.load(std::sync::atomic::Ordering::SeqCst) > 0).then_some(())
        });
        assert!(one_round.is_some(), "a get round completed before the kill");
        let killed_at = Instant::now();
        node.kill();
        (reader.join().expect("reader"), killed_at)
    });
    // A round's own cost (1000 blocks, debug build, a loaded CI machine) is whatever the rounds before the
    // kill took; the kill may add at most the response timeout on top, plus 1 s of slack.
    let (before, after): (Vec<&Round>, Vec<&Round>) =
        rounds.iter().partition(|r| r.begun + r.took < killed_at);
    let usual = before
        .iter()
        .map(|r| r.took)
        .max()
        .expect("a round before the kill");
    let bound = usual + timeout + Duration::from_secs(1);
    let slowest = after
        .iter()
        .map(|r| r.took)
        .max()
        .expect("a round after the kill");
    assert!(
        slowest < bound,
        "a get overlapping the kill took {slowest:?}, more than a usual round ({usual:?}) + the response \
         timeout + 1 s; rounds: {rounds:?}"
    );
    assert!(
        before.iter().all(|r| r.found == 1000),
        "rounds before the kill hit all: {rounds:?}"
    );
    assert_eq!(
        rounds.last().unwrap().found,
        0,
        "all misses once the node is dead"
    );
}

/// One get round of the kill test: when it began, how long it took, how many blocks it hit.
#[derive(Debug)]
struct Round {
    begun: Instant,
    took: Duration,
    found: usize,
}

#[test]
fn a_session_that_expires_during_a_put_is_cleaned_up() {
    let (runtime, server, node) = prepare(1000, "8M");
    let config = TransferConfig {
        write_timeout_seconds: 1,
        timeout: Duration::from_secs(2),
        ..TransferConfig::default()
    };
    let mut engine = engine(&server, "on_pool", config);
    let keys: Vec<i64> = (1..=8).collect();
    put(&mut engine, &[100]); // the link to the node is up before it stops
                              // The node stops answering: the transfer waits 2 s, the session expires after 1 s and
                              // the node is not yet dead (3 heartbeats of 1 s).
    node.signal("STOP");
    let data: Vec<Vec<u8>> = (0..SPECS).map(|s| pattern(1, s)).collect();
    let blocks: Vec<Vec<&[u8]>> = keys
        .iter()
        .map(|_| data.iter().map(Vec::as_slice).collect())
        .collect();
    let outcome = engine.put_blocks(&keys, &blocks);
    node.signal("CONT");
    assert!(
        outcome.is_err(),
        "a commit of an expired session: {outcome:?}"
    );
    let block_bytes = (SPECS * SPEC_BYTES) as u64;
    let cleaned = common::wait_until_blocking(Duration::from_secs(5), || {
        (pool_used(&runtime, &server) == block_bytes).then_some(())
    });
    assert!(
        cleaned.is_some(),
        "the expired session's pool bytes were freed"
    );
    let got = try_get_checked(&mut engine, &keys).expect("lookup");
    assert!(got.iter().all(|o| *o == GetOutcome::Miss(None)), "{got:?}");
    let after = engine.put_blocks(&keys, &blocks).expect("put");
    assert!(
        after.iter().all(|o| matches!(o, PutOutcome::Written(_))),
        "{after:?}"
    );
}

/// Bytes of one block (every spec).
const BLOCK_BYTES: usize = SPECS * SPEC_BYTES;

/// The parts of `count` blocks lying back to back in `memory` from block `first` on.
fn parts_in(memory: &mut [u8], first: usize, count: usize) -> Vec<Vec<&mut [u8]>> {
    memory[first * BLOCK_BYTES..(first + count) * BLOCK_BYTES]
        .chunks_mut(BLOCK_BYTES)
        .map(|block| block.chunks_mut(SPEC_BYTES).collect())
        .collect()
}

/// `kvcm pool --prefault` backs its whole region at start (its process has all of it mapped
/// before any block is written); without it the region is backed as blocks land.
#[test]
fn a_prefaulted_pool_node_holds_its_whole_region_from_the_start() {
    const SIZE: u64 = 32 << 20;
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (server, lazy, backed) = runtime.block_on(async {
        let server = prepare_async(200, &[]).await;
        let lazy = PoolProcess::start(&server, "pool_a", "lazy", "32M").await;
        let prefault = ["--prefault"];
        let backed = PoolProcess::start_with(&server, "pool_a", "backed", "32M", &prefault).await;
        live_range(&server, "pool_a", Some("lazy"), 1).await;
        live_range(&server, "pool_a", Some("backed"), 1).await;
        (server, lazy, backed)
    });
    assert!(
        backed.resident_shared_bytes() >= SIZE,
        "prefaulted: {} B resident",
        backed.resident_shared_bytes()
    );
    assert!(
        lazy.resident_shared_bytes() < SIZE / 2,
        "lazy: {} B resident",
        lazy.resident_shared_bytes()
    );
    // Blocks land on the pool and read back byte for byte.
    let keys: Vec<i64> = (1..=64).collect();
    round_trip_by(&server, (Wire::Shm, TransferPath::PoolSoftShm), &keys);
    drop((lazy, backed));
}

/// A pool node whose size is a multiple of 2 MiB sits on hugetlb pages when the kernel has
/// them free, on regular pages otherwise, says which in its ready file, and serves blocks
/// either way. Needs root to add huge pages for the test: skips loudly otherwise, except
/// under `CI=true` (CI runs as root), where not getting them fails.
#[test]
fn a_pool_node_sits_on_huge_pages_when_the_kernel_has_them_or_loud_skip() {
    let reserved = match HugePages::reserve(8) {
        Ok(reserved) => reserved,
        Err(why) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("CI runs as root and must get huge pages: {why}")
        }
        Err(why) => return common::shout(&format!("SKIPPED huge pages for a pool node: {why}")),
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (server, nodes) = runtime.block_on(async {
        let server = prepare_async(200, &[]).await;
        // 16 MiB takes 8 pages; the second node gets huge pages only if 8 more were free
        // (on this machine, unless it had some of its own: none).
        let on = ["--huge-pages", "on"];
        let huge = PoolProcess::start_with(&server, "pool_a", "huge", "16M", &on).await;
        let left = HugePages::free();
        let auto = ["--huge-pages", "auto"];
        let second = PoolProcess::start_with(&server, "pool_a", "second", "16M", &auto).await;
        live_range(&server, "pool_a", Some("huge"), 1).await;
        live_range(&server, "pool_a", Some("second"), 1).await;
        (server, [(huge, true), (second, left >= 8)])
    });
    for (node, huge) in &nodes {
        assert_eq!(node.ready["huge_pages"], *huge, "{}", node.ready);
    }
    // `on` without enough free huge pages (64 GiB of them): the node does not start, and
    // says why; a bad value is refused naming the flag.
    let address = server.address("http").to_string();
    for (value, says) in [("on", "--huge-pages on"), ("maybe", "--huge-pages")] {
        let refused = std::process::Command::new(env!("CARGO_BIN_EXE_kvcm"))
            .args(["pool", "--size", "64G", "--listen", "127.0.0.1:0"])
            .args(["--huge-pages", value, "--server", &address])
            .output()
            .expect("kvcm pool");
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(
            !refused.status.success() && stderr.contains(says),
            "{value}: {stderr}"
        );
    }
    let keys: Vec<i64> = (1..=100).collect();
    for (wire, path, keys) in [
        (Wire::Tcp, TransferPath::PoolSoftTcp, &keys[..50]),
        (Wire::Shm, TransferPath::PoolSoftShm, &keys[50..]),
    ] {
        round_trip_by(&server, (wire, path), keys);
    }
    let used: Vec<u64> = runtime
        .block_on(members(&server, "pool_a"))
        .iter()
        .map(|n| n["used"].as_u64().expect("used"))
        .collect();
    assert!(
        used.iter().all(|&u| u > 0),
        "both nodes hold blocks: {used:?}"
    );
    drop(nodes);
    drop(reserved);
}

/// A server SIGKILLed and restarted on its data directory finds again the blocks of a pool
/// node that kept running: the node resumes its incarnation (same range id), the blocks
/// read back byte-exact, usage is exact, and new blocks go around them.
#[test]
fn pool_blocks_survive_a_server_restart_when_their_node_resumes() {
    let (runtime, server, _node) = prepare(200, "32M");
    let range = runtime.block_on(live_range(&server, "pool_a", Some("node-1"), 1));
    let keys: Vec<i64> = (1..=40).collect();
    let mut before = engine(&server, "on_pool", TransferConfig::default());
    assert_eq!(
        written_by(&put(&mut before, &keys)),
        vec![TransferPath::PoolSoftTcp; 40]
    );
    drop(before);

    let server = runtime.block_on(server.kill_and_restart_with(&["kvcm.pool.heartbeat_ms=200"]));
    let resumed = runtime.block_on(common::wait_until(Duration::from_secs(20), async || {
        let nodes = members(&server, "pool_a").await;
        let node = nodes
            .iter()
            .find(|n| n["node_id"] == "node-1" && n["live"] == true)?;
        Some((nodes.len(), node["range_id"].as_u64()))
    }));
    assert_eq!(
        resumed,
        Some((1, Some(range))),
        "the node resumed its incarnation"
    );
    let mut engine = engine(&server, "on_pool", TransferConfig::default());
    let got = get_checked(&mut engine, &keys);
    assert_eq!(got, vec![GetOutcome::Hit(TransferPath::PoolSoftTcp); 40]);
    assert_eq!(
        pool_used(&runtime, &server),
        (keys.len() * BLOCK_BYTES) as u64
    );
    let more: Vec<i64> = (100..=140).collect();
    assert_eq!(hits(&get_checked(&mut engine, &keys)), 40);
    put(&mut engine, &more);
    let all: Vec<i64> = keys.iter().chain(&more).copied().collect();
    assert_eq!(
        hits(&get_checked(&mut engine, &all)),
        all.len(),
        "old and new blocks"
    );
}

/// A prepared server whose node the test may SIGSTOP (heartbeats of 2 s: it is not declared
/// dead meanwhile), and a config that gives up on it after 300 ms.
fn prepare_to_stop() -> (
    tokio::runtime::Runtime,
    TestServer,
    PoolProcess,
    TransferConfig,
) {
    let (runtime, server, node) = prepare(2000, "80M");
    let config = TransferConfig {
        timeout: Duration::from_millis(300),
        ..TransferConfig::default()
    };
    (runtime, server, node, config)
}

/// A get large enough to be read in waves (600 blocks, 39 MB, into registered memory: its
/// zero-copy parts are verified apart from the transfers, in waves) from a node that
/// stopped answering waits for it once: the first wave gives up at the response timeout,
/// the others do not try the node again in the same call; the next call, once it answers
/// again, hits every block.
#[test]
fn a_hung_node_costs_one_timeout_per_call_even_over_waves() {
    let (_runtime, server, node, config) = prepare_to_stop();
    let mut engine = engine(&server, "on_pool", config);
    let keys: Vec<i64> = (1..=600).collect();
    put(&mut engine, &keys);
    let mut memory = vec![0u8; keys.len() * BLOCK_BYTES];
    // SAFETY: `memory` outlives the engine's use of it (deregistered below) and is never
    // reallocated.
    unsafe { engine.register_memory(memory.as_mut_ptr(), memory.len()) }.expect("register");
    node.signal("STOP");
    let gave_up = engine
        .get_blocks(&keys, &mut parts_in(&mut memory, 0, keys.len()))
        .expect("the lookup answers");
    node.signal("CONT");
    engine
        .deregister_memory(memory.as_mut_ptr())
        .expect("deregister");
    let reasons: Vec<&str> = gave_up.iter().map(miss_reason).collect();
    assert!(
        reasons.iter().all(|r| !r.is_empty()),
        "all misses: {:?}",
        &gave_up[..2]
    );
    let waited = reasons.iter().filter(|r| r.contains("in time")).count();
    let skipped = reasons
        .iter()
        .filter(|r| r.contains("failed earlier in this call"))
        .count();
    assert!(
        waited > 0 && skipped > 0 && waited + skipped == keys.len(),
        "{waited} + {skipped}"
    );
    let back = common::wait_until_blocking(Duration::from_secs(10), || {
        (hits(&get_checked(&mut engine, &keys)) == keys.len()).then_some(())
    });
    assert!(back.is_some(), "every block once the node answers again");
}

/// A batch spread over two pool nodes (placement picks a node per block) moves to and
/// from both at once, byte-exact, on both wires and zero-copy; each node holds a share.
#[test]
fn a_batch_spread_over_two_pool_nodes_round_trips_on_every_path() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (server, _nodes) = runtime.block_on(async {
        let server = prepare_async(200, &[]).await;
        let mut nodes = Vec::new();
        for node in ["node-1", "node-2"] {
            nodes.push(PoolProcess::start(&server, "pool_a", node, "32M").await);
            live_range(&server, "pool_a", Some(node), 1).await;
        }
        (server, nodes)
    });
    let keys: Vec<i64> = (1..=200).collect();
    for (wire, path, keys) in [
        (Wire::Tcp, TransferPath::PoolSoftTcp, &keys[..80]),
        (Wire::Shm, TransferPath::PoolSoftShm, &keys[80..160]),
    ] {
        round_trip_by(&server, (wire, path), keys);
    }
    let mut engine = engine(&server, "on_pool", TransferConfig::default());
    round_trip_in_registered_memory(&mut engine, &keys[160..], TransferPath::PoolSoftTcpZeroCopy);
    assert_eq!(
        hits(&get_checked(&mut engine, &keys)),
        keys.len(),
        "all read back"
    );
    let used: Vec<u64> = runtime
        .block_on(members(&server, "pool_a"))
        .iter()
        .map(|n| n["used"].as_u64().expect("used"))
        .collect();
    assert_eq!(used.len(), 2, "{used:?}");
    assert!(
        used.iter().all(|&u| u > 0),
        "both nodes hold blocks: {used:?}"
    );
    assert_eq!(used.iter().sum::<u64>(), (keys.len() * BLOCK_BYTES) as u64);
}

/// Puts blocks `keys` from memory registered with `engine` and gets them back into it:
/// every block must go by `path` and read back byte-exact; the memory is deregistered after.
fn round_trip_in_registered_memory(engine: &mut TransferEngine, keys: &[i64], path: TransferPath) {
    let count = keys.len();
    let mut aligned = kvcm_data::AlignedBuf::new(2 * count * BLOCK_BYTES);
    let memory = aligned.as_mut_slice();
    let base = memory.as_mut_ptr();
    // SAFETY: `memory` is deregistered below, before it drops, and never reallocated.
    unsafe { engine.register_memory(base, memory.len()) }.expect("register");
    for (block, parts) in parts_in(memory, 0, count).into_iter().enumerate() {
        for (spec, part) in parts.into_iter().enumerate() {
            part.copy_from_slice(&pattern(keys[block], spec));
        }
    }
    let blocks: Vec<Vec<&[u8]>> = memory[..count * BLOCK_BYTES]
        .chunks(BLOCK_BYTES)
        .map(|block| block.chunks(SPEC_BYTES).collect())
        .collect();
    let put = engine.put_blocks(keys, &blocks).expect("put");
    assert_eq!(written_by(&put), vec![path; count]);
    let got = engine
        .get_blocks(keys, &mut parts_in(memory, count, count))
        .expect("get");
    assert_eq!(got, vec![GetOutcome::Hit(path); count]);
    for (block, parts) in parts_in(memory, count, count).iter().enumerate() {
        for (spec, part) in parts.iter().enumerate() {
            assert!(
                **part == pattern(keys[block], spec),
                "block {block} spec {spec}"
            );
        }
    }
    engine.deregister_memory(base).expect("deregister");
}

/// Blocks in memory registered with the engine move zero-copy over soft-TCP, both ways,
/// byte-exact, and say so; buffers outside it are staged as before, and so is memory once
/// deregistered; bad registrations are refused with a reason and change nothing; with no
/// file-tier block moved, nothing is registered with io_uring.
#[test]
fn blocks_in_registered_memory_move_zero_copy_over_tcp_and_say_so() {
    let (_runtime, server, _node) = prepare(100, "80M");
    let mut engine = engine(&server, "on_pool", TransferConfig::default());
    let keys: Vec<i64> = (1..=32).collect();
    round_trip_in_registered_memory(&mut engine, &keys, TransferPath::PoolSoftTcpZeroCopy);
    // 800 parts to one node: more than the 768 zero-copy requests kept in flight, so later
    // batches wait for a few completions while others are still coming (a wait once took
    // more than it asked for and the put then timed out with every transfer done).
    let many: Vec<i64> = (1_000..1_200).collect();
    round_trip_in_registered_memory(&mut engine, &many, TransferPath::PoolSoftTcpZeroCopy);
    let staged = get_checked(&mut engine, &keys);
    assert_eq!(
        staged,
        vec![GetOutcome::Hit(TransferPath::PoolSoftTcp); keys.len()]
    );

    let mut memory = vec![0u8; keys.len() * BLOCK_BYTES];
    let base = memory.as_mut_ptr();
    // SAFETY: `memory` is deregistered below, before it drops, and never reallocated.
    unsafe { engine.register_memory(base, memory.len()) }.expect("register");
    assert_eq!(
        engine.file_buffers(),
        (0, None),
        "no file-tier block moved: io_uring pinned nothing"
    );
    // SAFETY: refused (it overlaps the range registered above), so nothing is kept.
    let refused = unsafe { engine.register_memory(base.wrapping_add(10), 10) };
    assert!(
        matches!(&refused, Err(kvcm_client::ClientError::InvalidArgument(m)) if m.contains("overlap")),
        "{refused:?}"
    );
    engine.deregister_memory(base).expect("deregister");
    let again = engine.deregister_memory(base);
    assert!(
        matches!(again, Err(kvcm_client::ClientError::InvalidArgument(_))),
        "{again:?}"
    );
    let got = engine
        .get_blocks(&keys, &mut parts_in(&mut memory, 0, keys.len()))
        .expect("get after deregistration");
    assert_eq!(
        got,
        vec![GetOutcome::Hit(TransferPath::PoolSoftTcp); keys.len()]
    );
}

/// Pool parts of one size on one node share one URI template in the lookup table, so once
/// a reader knows it, gets of blocks new to it cost one round trip of table reads, no
/// extra one for strings (format version 3; before, every pool part had a string of its
/// own and every get of new blocks paid one more round trip). The table may grow in the
/// background meanwhile: a get that meets a new generation retries and reads that
/// generation's strings once, so every extra round trip must come with a retry, and at
/// least one get must have met no new generation.
#[test]
fn lookups_of_new_pool_blocks_on_a_known_node_need_no_extra_round_trip() {
    let (_runtime, server, _node) = prepare(100, "80M");
    let mut engine = engine(&server, "on_pool", TransferConfig::default());
    let first: Vec<i64> = (1..=20).collect();
    put(&mut engine, &first);
    assert_eq!(hits(&get_checked(&mut engine, &first)), first.len());
    let warm = engine.client().metrics();
    for round in 1..=3 {
        let keys: Vec<i64> = (round * 100..round * 100 + 20).collect();
        put(&mut engine, &keys);
        assert_eq!(hits(&get_checked(&mut engine, &keys)), keys.len());
    }
    let after = engine.client().metrics();
    assert_eq!(
        after.hits - warm.hits,
        3,
        "the fast path answered the three gets"
    );
    let extra = after.extra_round_trips - warm.extra_round_trips;
    let new_generations = after.retries - warm.retries;
    assert!(
        new_generations < 3 && extra <= new_generations,
        "no string reads for blocks new to the reader but one per new generation: \
         {warm:?} then {after:?}"
    );
}

/// File-tier blocks in memory registered with the engine move through io_uring's
/// registered buffers (O_DIRECT: the memory is page aligned), both ways, byte-exact, and
/// say so; once deregistered, the same blocks read as before.
#[test]
fn file_blocks_in_registered_memory_move_through_registered_buffers_and_say_so() {
    let (_runtime, server, _node) = prepare(100, "80M");
    let mut files = engine(&server, "on_file", TransferConfig::default());
    if let (kvcm_data::IoBackend::Psync, reason) = files.file_backend() {
        let reason = reason.unwrap_or("unknown");
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "io_uring is refused under CI: {reason}"
        );
        common::shout(&format!("SKIPPED: io_uring is refused here ({reason})"));
        return;
    }
    assert_eq!(files.file_buffers(), (0, None));
    let keys: Vec<i64> = (1..=32).collect();
    let registered = TransferPath::File(kvcm_data::IoPath::UringDirectRegistered);
    round_trip_in_registered_memory(&mut files, &keys, registered);
    assert_eq!(
        files.file_buffers(),
        (0, None),
        "deregistered from io_uring too"
    );
    let mut memory = kvcm_data::AlignedBuf::new(keys.len() * BLOCK_BYTES);
    let got = files
        .get_blocks(&keys, &mut parts_in(memory.as_mut_slice(), 0, keys.len()))
        .expect("get");
    let unregistered = TransferPath::File(kvcm_data::IoPath::UringDirect);
    assert_eq!(got, vec![GetOutcome::Hit(unregistered); keys.len()]);
}

/// Cancel safety: a get into registered memory from a node that stopped answering gives
/// up at the response timeout, and no READ it posted lands in the caller's memory later,
/// when the node answers again (the engine tore the link down before returning). A control
/// queue pair's READ, posted while the node was stopped, shows that the node does answer
/// such READs once it runs again.
#[test]
fn a_get_that_gave_up_never_writes_into_registered_memory_afterwards() {
    let (_runtime, server, node, config) = prepare_to_stop();
    let mut engine = engine(&server, "on_pool", config.clone());
    let keys: Vec<i64> = (1..=8).collect();
    put(&mut engine, &keys);
    assert_eq!(hits(&get_checked(&mut engine, &keys)), keys.len());

    let mut memory = vec![0u8; keys.len() * BLOCK_BYTES];
    // SAFETY: `memory` outlives the engine (dropped first below) and is never reallocated.
    unsafe { engine.register_memory(memory.as_mut_ptr(), memory.len()) }.expect("register");
    let endpoint = node.ready["listen"].as_str().expect("listen").to_string();
    let mut hello = kvcm::pool::POOL_HELLO.to_vec();
    hello.push(Wire::Tcp.index() as u8);
    let control = RawPoolQp::open(&endpoint, &hello, Wire::Tcp).expect("a control queue pair");
    node.signal("STOP");
    assert!(
        control.post_read(0, control.info.rkey),
        "the control READ is posted"
    );
    let gave_up = engine
        .get_blocks(&keys, &mut parts_in(&mut memory, 0, keys.len()))
        .expect("the lookup answers");
    node.signal("CONT");
    assert!(
        gave_up.iter().all(|o| miss_reason(o).contains("in time")),
        "{gave_up:?}"
    );
    assert_eq!(
        control.read_completed(),
        Some(kvcm_transport::WcStatus::Success),
        "the node answers a READ posted while it was stopped"
    );
    // Another engine's get succeeds only once the node serves again, after it answered
    // the READs queued on the abandoned link.
    let mut other = engine_on(&server, "on_pool", Wire::Tcp, config);
    let served = common::wait_until_blocking(Duration::from_secs(10), || {
        (hits(&get_checked(&mut other, &keys)) == keys.len()).then_some(())
    });
    assert!(served.is_some(), "the node serves again");
    assert!(
        memory.iter().all(|&b| b == 0),
        "a READ of the abandoned get wrote into the caller's memory after the call returned"
    );
    assert_eq!(
        hits(&get_checked(&mut engine, &keys)),
        keys.len(),
        "the engine recovers"
    );
    drop(engine);
}

/// GetCacheLocation (batch get) over gRPC for `keys` of `instance`.
fn grpc_lookup(
    runtime: &tokio::runtime::Runtime,
    server: &TestServer,
    instance: &str,
    keys: &[i64],
) -> Vec<meta::CacheLocation> {
    runtime.block_on(async {
        let answer = server
            .meta()
            .await
            .get_cache_location(meta::GetCacheLocationRequest {
                instance_id: instance.into(),
                query_type: meta::QueryType::QtBatchGet as i32,
                block_keys: keys.to_vec(),
                ..Default::default()
            })
            .await
            .expect("grpc")
            .into_inner();
        answer.locations
    })
}

fn is_hit(location: &meta::CacheLocation) -> bool {
    location.location_specs.iter().any(|s| !s.uri.is_empty())
}

/// The reason of a miss, `""` for anything else.
fn miss_reason(outcome: &GetOutcome) -> &str {
    match outcome {
        GetOutcome::Miss(Some(reason)) => reason,
        _ => "",
    }
}

#[test]
fn a_flipped_byte_in_a_file_block_is_a_miss_and_the_block_is_removed() {
    let (runtime, server, _node) = prepare(200, "8M");
    let mut files = engine(&server, "on_file", TransferConfig::default());
    let keys: Vec<i64> = (1..=8).collect();
    written_by(&put(&mut files, &keys));
    // The manager holds one checksum per part, as the writer computed it.
    let located = grpc_lookup(&runtime, &server, "on_file", &keys);
    for (key, location) in keys.iter().zip(&located) {
        for (spec, part) in location.location_specs.iter().enumerate() {
            let expected = xxhash_rust::xxh3::xxh3_64(&pattern(*key, spec));
            assert_eq!(part.checksum, Some(expected), "key {key} spec {spec}");
        }
    }
    // Flip one byte of block 3's second part in its file.
    let part = kvcm_data::parse_block_uri(&located[2].location_specs[1].uri).expect("file uri");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&part.path)
        .expect("block file");
    let mut byte = [0u8];
    let at = part.offset + 100;
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut byte, at).expect("read");
    byte[0] ^= 0x10;
    std::os::unix::fs::FileExt::write_all_at(&file, &byte, at).expect("flip");
    drop(file);

    let got = get_checked(&mut files, &keys);
    assert!(
        miss_reason(&got[2]).contains("do not match their checksum"),
        "{:?}",
        got[2]
    );
    assert_eq!(hits(&got), keys.len() - 1, "the other blocks still read");
    let after = grpc_lookup(&runtime, &server, "on_file", &[3]);
    assert!(
        !is_hit(&after[0]),
        "the corrupt block was removed: {after:?}"
    );
    let again = get_checked(&mut files, &[3]);
    assert_eq!(again, vec![GetOutcome::Miss(None)]);
    // Written again once the deleter took its DELETING location (until then the key counts
    // as present, §8.5), it reads back whole.
    let rewritten = common::wait_until_blocking(Duration::from_secs(10), || {
        matches!(put(&mut files, &[3])[..], [PutOutcome::Written(_)]).then_some(())
    });
    assert!(
        rewritten.is_some(),
        "written again once its deletion finished"
    );
    assert_eq!(hits(&get_checked(&mut files, &[3])), 1);
}

#[test]
fn a_torn_pool_block_is_a_miss_and_the_block_is_removed() {
    let (runtime, server, _node) = prepare(200, "96M");
    // A writer commits two blocks whose bytes it never wrote (as after a torn write), with
    // the checksums of the bytes it meant to write.
    let torn = [7, 8];
    let checksums: Vec<u64> = (0..SPECS)
        .map(|s| xxhash_rust::xxh3::xxh3_64(&pattern(7, s)))
        .collect();
    runtime.block_on(async {
        let mut grpc = server.meta().await;
        let started = grpc
            .start_write_cache(meta::StartWriteCacheRequest {
                instance_id: "on_pool".into(),
                block_keys: torn.to_vec(),
                write_timeout_seconds: 30,
                ..Default::default()
            })
            .await
            .expect("start")
            .into_inner();
        assert_eq!(started.locations.len(), 2, "{started:?}");
        let mut locations = started.locations.clone();
        for location in &mut locations {
            for (spec, checksum) in location.location_specs.iter_mut().zip(&checksums) {
                spec.checksum = Some(*checksum);
            }
        }
        let finished = grpc
            .finish_write_cache(meta::FinishWriteCacheRequest {
                instance_id: "on_pool".into(),
                write_session_id: started.write_session_id,
                success_blocks: Some(meta::BlockMask {
                    info: Some(meta::block_mask::Info::Offset(2)),
                }),
                locations,
                ..Default::default()
            })
            .await
            .expect("finish")
            .into_inner();
        let code = finished.header.and_then(|h| h.status).map(|s| s.code);
        assert_eq!(code, Some(meta::ErrorCode::Ok as i32));
    });
    let located = grpc_lookup(&runtime, &server, "on_pool", &torn);
    assert!(located.iter().all(is_hit), "committed: {located:?}");
    // Each wire puts 400 good blocks (25 MiB); the other wire gets them with one torn
    // block among them, so each wire verifies checksums the other computed: shm as it
    // copies, TCP into registered memory, whose zero-copy parts are verified apart, in
    // waves on other threads. The torn one alone is a miss.
    let engines: Vec<_> = [Wire::Tcp, Wire::Shm]
        .into_iter()
        .enumerate()
        .map(|(i, wire)| {
            let config = TransferConfig {
                pool_wire: wire,
                ..TransferConfig::default()
            };
            let mut engine = engine(&server, "on_pool", config);
            let good: Vec<i64> = (1000 + 1000 * i as i64..1400 + 1000 * i as i64).collect();
            put(&mut engine, &good);
            (engine, good)
        })
        .collect::<Vec<_>>();
    let [(mut tcp, tcp_put), (mut shm, shm_put)] = <[_; 2]>::try_from(engines).expect("two");
    let with_torn = |good: &[i64], torn_key| {
        let mut keys = good.to_vec();
        keys.insert(200, torn_key);
        keys
    };
    let mut memory = vec![0u8; (shm_put.len() + 1) * BLOCK_BYTES];
    // SAFETY: `memory` is deregistered below, before it drops, and never reallocated.
    unsafe { tcp.register_memory(memory.as_mut_ptr(), memory.len()) }.expect("register");
    let keys = with_torn(&shm_put, 7);
    let got = tcp
        .get_blocks(&keys, &mut parts_in(&mut memory, 0, keys.len()))
        .expect("get");
    for (block, parts) in parts_in(&mut memory, 0, keys.len()).iter().enumerate() {
        if matches!(got[block], GetOutcome::Hit(_)) {
            for (spec, part) in parts.iter().enumerate() {
                assert!(**part == pattern(keys[block], spec), "block {block}");
            }
        }
    }
    tcp.deregister_memory(memory.as_mut_ptr())
        .expect("deregister");
    let by_shm = get_checked(&mut shm, &with_torn(&tcp_put, 8));
    for got in [got, by_shm] {
        assert!(
            miss_reason(&got[200]).contains("do not match their checksum"),
            "{:?}",
            got[200]
        );
        assert_eq!(hits(&got), got.len() - 1, "every good block is a hit");
    }
    let after = grpc_lookup(&runtime, &server, "on_pool", &torn);
    assert!(
        after.iter().all(|l| !is_hit(l)),
        "the torn blocks were removed: {after:?}"
    );
}

/// Device ranges of `count` blocks laid out from `base` in a device's memory (one range
/// per spec).
fn device_blocks(base: u64, count: usize) -> Vec<Vec<kvcm_client::DeviceRange>> {
    (0..count)
        .map(|block| {
            (0..SPECS)
                .map(|spec| kvcm_client::DeviceRange {
                    addr: base + ((block * SPECS + spec) * SPEC_BYTES) as u64,
                    len: SPEC_BYTES,
                })
                .collect()
        })
        .collect()
}

#[test]
fn device_blocks_round_trip_through_the_staging_ring_to_the_pool_and_to_files() {
    let (_runtime, server, _node) = prepare(200, "80M");
    let count = 40;
    let keys: Vec<i64> = (9000..9000 + count as i64).collect();
    let block_bytes = SPECS * SPEC_BYTES;
    // Two slots of three blocks: 14 chunks, copies overlapping transfers.
    let mut device = kvcm_client::HostStaging::new(2 * count * block_bytes, 2, 3 * block_bytes);
    let sources = device_blocks(0, count);
    let targets = device_blocks((count * block_bytes) as u64, count);
    fill_device(&device, &keys);
    for (instance, wire, half) in [
        ("on_pool", Wire::Tcp, 0..count / 2),
        ("on_pool", Wire::Shm, count / 2..count),
        ("on_file", Wire::Tcp, 0..count),
    ] {
        let config = TransferConfig {
            pool_wire: wire,
            ..TransferConfig::default()
        };
        let mut engine = engine(&server, instance, config);
        let put = engine
            .put_device_blocks(&keys[half.clone()], &sources[half.clone()], &mut device)
            .expect("put");
        assert_eq!(written_by(&put).len(), half.len(), "{instance} {wire:?}");
        // Host reads see the device's bytes; device reads land in other ranges.
        let got = get_checked(&mut engine, &keys[half.clone()]);
        assert_eq!(
            hits(&got),
            half.len(),
            "{instance} {wire:?}: {:?}",
            &got[..2]
        );
        let got = engine
            .get_device_blocks(&keys[half.clone()], &targets[half.clone()], &mut device)
            .expect("get");
        assert_eq!(
            hits(&got),
            half.len(),
            "{instance} {wire:?}: {:?}",
            &got[..2]
        );
        for block in half.clone() {
            assert!(
                landed(&device, &targets[block], keys[block]),
                "{instance} {wire:?}: block {block} landed wrong"
            );
        }
    }
    // A block larger than a slot fails alone; the session still finishes.
    let mut small = kvcm_client::HostStaging::new(2 * block_bytes, 2, block_bytes - 1);
    let mut engine = engine(&server, "on_pool", TransferConfig::default());
    let put = engine
        .put_device_blocks(&[7777], &device_blocks(0, 1), &mut small)
        .expect("put");
    assert!(
        matches!(&put[0], PutOutcome::Failed(reason) if reason.contains("staging slot")),
        "{put:?}"
    );
    let got = get_checked(&mut engine, &[7777]);
    assert_eq!(got, vec![GetOutcome::Miss(None)], "nothing was committed");
}

/// Writes the pattern of `keys[i]` into device memory as block `i` of `device_blocks(0, ..)`.
fn fill_device(device: &kvcm_client::HostStaging, keys: &[i64]) {
    let mut memory = device.memory();
    for (block, key) in keys.iter().enumerate() {
        for spec in 0..SPECS {
            let at = (block * SPECS + spec) * SPEC_BYTES;
            memory[at..at + SPEC_BYTES].copy_from_slice(&pattern(*key, spec));
        }
    }
}

/// Whether the device ranges `ranges` (one per spec) hold block `key`'s pattern.
fn landed(
    device: &kvcm_client::HostStaging,
    ranges: &[kvcm_client::DeviceRange],
    key: i64,
) -> bool {
    let memory = device.memory();
    ranges.iter().enumerate().all(|(spec, range)| {
        let at = range.addr as usize;
        memory[at..at + range.len] == pattern(key, spec)
    })
}

/// A device with one staging slot writes each chunk from the slot before it stages the next
/// one there (it once staged chunk `i` over chunk `i - 1` first, so the next chunk's bytes
/// were committed, checksummed, under the earlier chunk's keys); and a copy into device
/// memory that fails during a get makes its block a miss, never a hit — whichever later
/// wait the device reports it at (it once failed the chunk at hand instead).
#[test]
fn device_blocks_through_one_staging_slot_and_a_failing_copy() {
    let (_runtime, server, _node) = prepare(200, "80M");
    let count = 10;
    let keys: Vec<i64> = (9500..9500 + count as i64).collect();
    let block_bytes = SPECS * SPEC_BYTES;
    let memory_bytes = 2 * count * block_bytes;
    let sources = device_blocks(0, count);
    let targets = device_blocks((count * block_bytes) as u64, count);
    // One slot of three blocks: four chunks.
    let mut one_slot = kvcm_client::HostStaging::new(memory_bytes, 1, 3 * block_bytes);
    fill_device(&one_slot, &keys);
    let mut engine = engine(&server, "on_pool", TransferConfig::default());
    let put = engine
        .put_device_blocks(&keys, &sources, &mut one_slot)
        .expect("put");
    assert_eq!(written_by(&put).len(), count);
    assert_eq!(
        hits(&get_checked(&mut engine, &keys)),
        count,
        "each key's own bytes"
    );
    let got = engine
        .get_device_blocks(&keys, &targets, &mut one_slot)
        .expect("get");
    assert_eq!(hits(&got), count, "{got:?}");
    for block in 0..count {
        assert!(
            landed(&one_slot, &targets[block], keys[block]),
            "block {block}"
        );
    }

    // Two slots of one block; block 4's first range lies outside the device memory, so its
    // copy fails on the copy thread and is reported at a later wait.
    let mut two_slots = kvcm_client::HostStaging::new(memory_bytes, 2, block_bytes);
    let mut bad = targets.clone();
    bad[4][0].addr = memory_bytes as u64;
    let got = engine
        .get_device_blocks(&keys, &bad, &mut two_slots)
        .expect("get");
    assert!(
        matches!(&got[4], GetOutcome::Miss(Some(reason)) if reason.contains("outside")),
        "{:?}",
        got[4]
    );
    for (block, outcome) in got.iter().enumerate() {
        if matches!(outcome, GetOutcome::Hit(_)) {
            assert!(
                landed(&two_slots, &bad[block], keys[block]),
                "block {block}"
            );
        }
    }
    assert!(
        hits(&got) >= count - 3,
        "only blocks near the failed copy miss: {got:?}"
    );
}

/// `kvcm.auth.meta = required` with an admin token.
const ROOT: &str = "root-token";

/// A new key of a new account `user` with `role` (on `instances`): its text.
async fn key_of(server: &TestServer, user: &str, role: &str, instances: &[&str]) -> String {
    let account = json!({"user_name": user, "password": "pw", "role": role});
    let (status, answer) = server
        .post_as("admin_http", "/api/addAccount", &account, Some(ROOT))
        .await;
    assert_eq!((status, code(&answer)), (200, "OK"), "{answer}");
    let body = json!({"user_name": user, "instance_ids": instances, "expires_at_ms": 0});
    let (status, answer) = server
        .post_as("admin_http", "/api/createApiKey", &body, Some(ROOT))
        .await;
    assert_eq!((status, code(&answer)), (200, "OK"), "{answer}");
    answer["api_key"].as_str().expect("api_key").to_string()
}

/// A queue pair opened on a pool node with a ticket, as an engine opens one.
struct RawPoolQp {
    _domain: kvcm_transport::any::AnyDomain,
    cq: kvcm_transport::any::AnyCq,
    qp: kvcm_transport::any::AnyQp,
    _buffer: kvcm_transport::HostMemory,
    region: kvcm_transport::any::AnyRegion,
    info: kvcm::pool::RegionInfo,
    /// The node answered that this queue pair reaches only its instance's runs.
    isolated: bool,
    /// The handshake connection, kept as an engine keeps it (on verbs, when the hello set
    /// `KEEPS_CONNECTION`, its closing tears the node's queue pair down).
    hangup: Option<std::net::TcpStream>,
}

impl RawPoolQp {
    /// The queue pair a raw `hello` opens on `wire` (a TCP or verbs one), or `None` when
    /// the node refuses it.
    fn open(endpoint: &str, hello: &[u8], wire: Wire) -> Option<RawPoolQp> {
        use kvcm_transport::{Access, Domain, QpConfig, QueuePair};
        use std::io::{Read, Write};
        let domain = wire.open_domain(Duration::from_secs(2)).expect("domain");
        let cq = domain.create_cq().expect("cq");
        let qp = domain.create_qp(&cq, &cq, QpConfig::default()).expect("qp");
        let mut stream = std::net::TcpStream::connect(endpoint).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        stream.write_all(hello).expect("hello");
        let remote = kvcm_transport::exchange_endpoints(&mut stream, &qp.endpoint()).ok()?;
        qp.connect(&remote).expect("connect the queue pair");
        let mut info = [0u8; kvcm::pool::RegionInfo::SIZE];
        stream.read_exact(&mut info).ok()?;
        // A ticket hello is answered whether the queue pair reaches only its instance's
        // runs.
        let mut isolated = [0u8; 1];
        if hello.starts_with(kvcm::pool::listener::HELLO_TICKET) {
            stream.read_exact(&mut isolated).ok()?;
        }
        let buffer = domain.alloc(4096).expect("buffer");
        let region = domain
            .register(&buffer, 0, 4096, Access::LOCAL_WRITE)
            .expect("register");
        Some(RawPoolQp {
            _domain: domain,
            cq,
            qp,
            _buffer: buffer,
            region,
            info: kvcm::pool::RegionInfo::decode(&info),
            isolated: isolated[0] == 1,
            hangup: Some(stream),
        })
    }

    /// Whether one 8-byte READ of the node's region completes successfully (at its start
    /// with its rkey; on an isolating node at `run`'s start with its rkey).
    fn reads(&self, run: Option<Run>) -> bool {
        let (offset, rkey) = match run {
            Some(run) => (run.offset, run.rkey),
            None => (0, self.info.rkey),
        };
        self.reads_at(offset, rkey)
    }

    /// Whether one 8-byte READ at `offset` of the node's region with `rkey` completes
    /// successfully.
    fn reads_at(&self, offset: u64, rkey: u32) -> bool {
        self.post_read(offset, rkey)
            && self.read_completed() == Some(kvcm_transport::WcStatus::Success)
    }

    /// Posts one 8-byte READ at `offset` of the node's region with `rkey`; false when the
    /// post is refused.
    fn post_read(&self, offset: u64, rkey: u32) -> bool {
        use kvcm_transport::{QueuePair, Region, RemoteAddr, SendOp, SendWr, Sge};
        let sge = [Sge {
            addr: self.region.addr(),
            len: 8,
            lkey: self.region.lkey(),
        }];
        let read = SendWr {
            wr_id: 7,
            op: SendOp::Read(RemoteAddr {
                addr: self.info.addr + offset,
                rkey,
            }),
            sg_list: &sge,
            signaled: true,
        };
        self.qp.post_send(&[read]).is_ok()
    }

    /// The status of the READ posted last, once it completes (`None` after 10 s).
    fn read_completed(&self) -> Option<kvcm_transport::WcStatus> {
        use kvcm_transport::{CompletionQueue, WorkCompletion};
        let mut done = [WorkCompletion::EMPTY];
        common::wait_until_blocking(Duration::from_secs(10), || {
            (self.cq.poll(&mut done) == 1).then_some(done[0].status)
        })
    }
}

/// A run of an instance on an isolating node, as a runs request answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    offset: u64,
    len: u64,
    rkey: u32,
}

/// The runs an isolating node at `endpoint` answers for `offsets` on `wire` to a runs
/// request showing `ticket`, written byte by byte as a client of another language would
/// (`None` for an offset in no run of the ticket's instance; `Err` when the node closes
/// the connection instead).
fn runs_of(
    endpoint: &str,
    wire: Wire,
    ticket: &[u8],
    offsets: &[u64],
) -> std::io::Result<Vec<Option<Run>>> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(endpoint)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut request = b"KVPR".to_vec();
    request.push(wire.index() as u8);
    request.extend_from_slice(ticket);
    request.extend_from_slice(&(offsets.len() as u32).to_le_bytes());
    for offset in offsets {
        request.extend_from_slice(&offset.to_le_bytes());
    }
    stream.write_all(&request)?;
    let mut count = [0u8; 4];
    stream.read_exact(&mut count)?;
    assert_eq!(u32::from_le_bytes(count) as usize, offsets.len());
    let mut answer = vec![0u8; offsets.len() * 20];
    stream.read_exact(&mut answer)?;
    Ok(answer
        .chunks_exact(20)
        .map(|entry| {
            let run = Run {
                offset: u64::from_le_bytes(entry[..8].try_into().unwrap()),
                len: u64::from_le_bytes(entry[8..16].try_into().unwrap()),
                rkey: u32::from_le_bytes(entry[16..].try_into().unwrap()),
            };
            (run.len > 0).then_some(run)
        })
        .collect())
}

/// The distinct runs holding the first byte of each 2 MiB slab of a node of `bytes`.
fn runs_in(endpoint: &str, wire: Wire, ticket: &[u8], bytes: u64) -> Vec<Run> {
    let slabs: Vec<u64> = (0..bytes).step_by(2 << 20).collect();
    let mut runs: Vec<Run> = runs_of(endpoint, wire, ticket, &slabs)
        .expect("the node answers the runs of the ticket's instance")
        .into_iter()
        .flatten()
        .collect();
    runs.dedup();
    runs
}

/// A raw hello to the pool node at `endpoint` on `wire`; whether the node opened a queue
/// pair.
fn pool_hello_admitted(endpoint: &str, hello: &[u8], wire: Wire) -> bool {
    RawPoolQp::open(endpoint, hello, wire).is_some()
}

#[test]
fn under_meta_auth_nodes_join_with_an_operator_key_and_queue_pairs_need_a_ticket() {
    nodes_and_tickets_under_meta_auth(Wire::Tcp, &[], &[]);
}

/// The entry [`nodes_and_tickets_under_meta_auth`] runs as another user, and what it hands
/// it: `{"endpoint": <node>, "hello": <a shared-memory hello with a valid ticket>, "node":
/// <the node's pid>}`.
const POOL_CLIENT_ENTRY: &str = "pool_client_of_another_user_entry";
const POOL_CLIENT_ENV: &str = "KVCM_POOL_ISOLATION_CLIENT";

/// As another, non-root user: an isolating node refuses the shared-memory wire to a valid
/// ticket, and none of the node's descriptors or memory open through /proc.
#[test]
#[ignore = "the hostile client of the pool isolation test; started by it"]
fn pool_client_of_another_user_entry() {
    let Ok(handed) = std::env::var(POOL_CLIENT_ENV) else {
        return;
    };
    assert_eq!(other_user::euid(), other_user::NOBODY, "another user");
    let handed: serde_json::Value = serde_json::from_str(&handed).expect("handed json");
    let endpoint = handed["endpoint"].as_str().expect("endpoint");
    let hello: Vec<u8> = serde_json::from_value(handed["hello"].clone()).expect("hello");
    let node = handed["node"].as_u64().expect("pid");
    assert!(
        !pool_hello_admitted(endpoint, &hello, Wire::Shm),
        "the shared-memory wire, as another user"
    );
    other_user::proc_is_closed(node, []);
    println!("{}", other_user::PASSED);
}

/// The same on verbs: the node serves its region on the device too, and a revoked key's
/// verbs queue pair is destroyed by the node (the client's READs then fail).
#[test]
fn under_meta_auth_pool_queue_pairs_need_a_ticket_and_are_revoked_on_verbs_or_loud_skip() {
    let Some((settings, node_args)) = on_verbs("pool tickets and revocation on verbs") else {
        return;
    };
    nodes_and_tickets_under_meta_auth(Wire::Verbs, &as_strs(&settings), &as_strs(&node_args));
}

/// The server settings and the pool node's arguments that serve both on the verbs device
/// `KVCM_VERBS_DEVICE` names; `None` (skipped loudly) without one.
fn on_verbs(what: &str) -> Option<(Vec<String>, Vec<String>)> {
    let settings = common::verbs_settings(what)?;
    let device = kvcm_transport::any::VerbsDevice::from_env().expect("verbs device");
    let node_args = vec![
        "--verbs-device".to_string(),
        device.name,
        "--verbs-gid-index".to_string(),
        device.gid_index.to_string(),
    ];
    Some((settings, node_args))
}

/// A server and a live 16 MiB `kvcm pool` node of `pool_a`, both also serving on the verbs
/// device `KVCM_VERBS_DEVICE` names; `None` (skipped loudly, naming `what`) without one.
fn node_on_verbs(what: &str) -> Option<(tokio::runtime::Runtime, TestServer, PoolProcess)> {
    let (settings, node_args) = on_verbs(what)?;
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (server, node) = runtime.block_on(async {
        let server = prepare_async(200, &as_strs(&settings)).await;
        let node_args = as_strs(&node_args);
        let node = PoolProcess::start_with(&server, "pool_a", "node-1", "16M", &node_args).await;
        live_range(&server, "pool_a", Some("node-1"), 1).await;
        (server, node)
    });
    Some((runtime, server, node))
}

fn as_strs(strings: &[String]) -> Vec<&str> {
    strings.iter().map(String::as_str).collect()
}

/// Membership, the directory and node tickets under `kvcm.auth.meta = required`, the
/// isolation of instances on the node (a queue pair opened with one instance's ticket
/// reaches that instance's runs only: not another's with its replayed rkey, a guessed one or
/// the whole region's), and the teardown of a revoked key's queue pair, on `wire` (server
/// `settings`, node `node_args`).
fn nodes_and_tickets_under_meta_auth(wire: Wire, settings: &[&str], node_args: &[&str]) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let mut all = vec![
        "kvcm.service.admin_auth_token=root-token",
        "kvcm.auth.meta=required",
        "kvcm.pool.heartbeat_ms=100",
    ];
    all.extend_from_slice(settings);
    let server = runtime.block_on(TestServer::start_with(&all));
    let nodes = |bearer: Option<&str>, instance: Option<&str>| {
        let body = json!({ "storage": "pool_a", "instance_id": instance });
        runtime.block_on(server.post_as("http", kvcm::pool::NODES_ROUTE, &body, bearer))
    };
    let (client_key, client_b_key, operator_key) = runtime.block_on(async {
        let (status, answer) = server
            .post_as(
                "admin_http",
                "/api/addStorage",
                &json!({"storage": pool_storage("pool_a")}),
                Some(ROOT),
            )
            .await;
        assert_eq!((status, code(&answer)), (200, "OK"), "{answer}");
        let group = json!({"instance_group": group("gp", &["pool_a"])});
        let (status, answer) = server
            .post_as("admin_http", "/api/createInstanceGroup", &group, Some(ROOT))
            .await;
        assert_eq!((status, code(&answer)), (200, "OK"), "{answer}");
        let specs: Vec<_> = (0..SPECS)
            .map(|i| json!({"name": format!("tp{i}"), "size": SPEC_BYTES}))
            .collect();
        let body = json!({"instance_group": "gp", "instance_id": "on_pool", "block_size": 16,
                          "location_spec_infos": specs,
                          "model_deployment": {"model_name": "m", "dtype": "FP8", "tp_size": 4}});
        let mut other = body.clone();
        other["instance_id"] = json!("on_pool_b");
        let mut elsewhere = body.clone();
        elsewhere["instance_group"] = json!("default");
        elsewhere["instance_id"] = json!("on_file");
        for body in [&body, &other, &elsewhere] {
            let (status, answer) = server
                .post_as("http", "/api/registerInstance", body, Some(ROOT))
                .await;
            assert_eq!((status, code(&answer)), (200, "OK"), "{answer}");
        }
        (
            key_of(&server, "eng", "ROLE_USER", &["on_pool"]).await,
            key_of(&server, "eng_b", "ROLE_USER", &["on_pool_b"]).await,
            key_of(&server, "ops", "ROLE_OPERATOR", &[]).await,
        )
    });
    let other_tenant = runtime.block_on(key_of(&server, "other", "ROLE_USER", &["on_file"]));
    // Membership: a join without a credential, or with a client's key, is refused; so is
    // the operator's join of a node that cannot isolate instances.
    let join = json!({"storage": "pool_a", "node_id": "rogue", "endpoint": "127.0.0.1:9", "capacity": 1 << 20});
    for (bearer, status) in [
        (None, 401),
        (Some(client_key.as_str()), 403),
        (Some(operator_key.as_str()), 400),
    ] {
        let (got, answer) =
            runtime.block_on(server.post_as("http", kvcm::pool::JOIN_ROUTE, &join, bearer));
        assert_eq!(got, status, "join with {bearer:?}: {answer}");
        let says_why = answer.to_string().contains("must isolate instances");
        assert_eq!(says_why, status == 400, "{answer}");
    }
    // A node with the operator's key joins; the directory needs a credential and lists it
    // with a ticket.
    let mut args = vec!["--api-key", operator_key.as_str()];
    args.extend_from_slice(node_args);
    // Two 2 MiB slabs: one for each instance.
    const NODE_BYTES: u64 = 4 << 20;
    let node = runtime.block_on(PoolProcess::start_with(
        &server, "pool_a", "node-1", "4M", &args,
    ));
    let live_ticket = |bearer: &str, instance: Option<&str>| -> Option<(String, Vec<u8>)> {
        let (status, answer) = nodes(Some(bearer), instance);
        assert_eq!(status, 200, "{answer}");
        let live = answer["nodes"]
            .as_array()
            .and_then(|n| n.iter().find(|n| n["live"] == true).cloned())?;
        let ticket: kvcm::pool::ticket::Ticket =
            kvcm_manager::hex::decode(live["ticket"].as_str().expect("a ticket"))
                .expect("ticket hex");
        let ticket = ticket.to_vec();
        Some((
            live["endpoint"].as_str().expect("endpoint").to_string(),
            ticket,
        ))
    };
    let (endpoint, anyone_ticket) =
        common::wait_until_blocking(Duration::from_secs(10), || live_ticket(&client_key, None))
            .expect("the node joined with the operator's key");
    assert_eq!(
        nodes(None, None).0,
        401,
        "the directory without a credential"
    );
    let (status, answer) = nodes(Some(&other_tenant), None);
    assert_eq!(
        status, 403,
        "a key whose instances' groups do not use the pool: {answer}"
    );
    let (status, answer) = nodes(Some(&client_key), Some("on_pool_b"));
    assert_eq!(
        status, 403,
        "tickets for an instance the key does not reach: {answer}"
    );
    let ticket_a = live_ticket(&client_key, Some("on_pool")).expect("live").1;
    let ticket_b = live_ticket(&client_b_key, Some("on_pool_b"))
        .expect("live")
        .1;
    // The node's listener: no ticket, a forged one, one of an earlier release, one naming
    // no instance (the node isolates them), then the directory's.
    let hello = |magic: &[u8], ticket: Option<&[u8]>| {
        let mut bytes = magic.to_vec();
        bytes.push(wire.index() as u8);
        bytes.extend_from_slice(ticket.unwrap_or_default());
        bytes
    };
    let mut forged = ticket_a.clone();
    forged[20] ^= 1;
    for (refused, why) in [
        (hello(b"KVPL", None), "no ticket"),
        (hello(b"KVP3", Some(&forged)), "a forged ticket"),
        (
            hello(b"KVP2", Some(&ticket_a[..48])),
            "a ticket of an earlier release",
        ),
        (
            hello(b"KVP3", Some(&anyone_ticket)),
            "a ticket naming no instance",
        ),
    ] {
        assert!(!pool_hello_admitted(&endpoint, &refused, wire), "{why}");
    }
    let granted = hello(b"KVP3", Some(&ticket_a));
    let raw = RawPoolQp::open(&endpoint, &granted, wire).expect("the directory's ticket");
    assert!(raw.isolated, "the node isolates instances");
    assert_eq!(raw.info.rkey, 0, "no key of the whole region");
    if wire == Wire::Tcp {
        let mut on_shm = hello(b"KVP3", Some(&ticket_a));
        on_shm[4] = Wire::Shm.index() as u8;
        assert!(
            !pool_hello_admitted(&endpoint, &on_shm, Wire::Shm),
            "the shared-memory wire would map the whole region"
        );
        // Nor does a client of another, non-root user, with the same ticket.
        if !other_user::cannot_run("the pool node's shared-memory check as another user") {
            let handed = json!({"endpoint": endpoint, "hello": on_shm, "node": node.pid()});
            other_user::run_as_nobody(POOL_CLIENT_ENTRY, POOL_CLIENT_ENV, &handed.to_string());
        }
    }
    // The engines of both instances, each with its own key, move bytes through the node.
    let engine_of = |instance: &str, key: &str| {
        let config = TransferConfig {
            pool_wire: wire,
            ..TransferConfig::default()
        };
        engine_with_key(&server, (instance, Some(key)), wire, config)
    };
    let mut engine = engine_of("on_pool", &client_key);
    let mut engine_b = engine_of("on_pool_b", &client_b_key);
    let keys = [1, 2, 3];
    for engine in [&mut engine, &mut engine_b] {
        for outcome in put(engine, &keys) {
            assert!(matches!(outcome, PutOutcome::Written(_)), "{outcome:?}");
        }
        for outcome in get_checked(engine, &keys) {
            assert!(matches!(outcome, GetOutcome::Hit(_)), "{outcome:?}");
        }
    }
    // Each instance's runs, as the node answers them to its ticket: disjoint.
    let runs_a = runs_in(&endpoint, wire, &ticket_a, NODE_BYTES);
    let runs_b = runs_in(&endpoint, wire, &ticket_b, NODE_BYTES);
    assert!(
        !runs_a.is_empty() && !runs_b.is_empty(),
        "{runs_a:?} {runs_b:?}"
    );
    for a in &runs_a {
        for b in &runs_b {
            let disjoint = a.offset + a.len <= b.offset || b.offset + b.len <= a.offset;
            assert!(disjoint, "instances share bytes: {a:?} {b:?}");
        }
    }
    let b_run = runs_b[0];
    let asked = runs_of(&endpoint, wire, &ticket_a, &[b_run.offset]).expect("answered");
    assert_eq!(asked, [None], "A's ticket is told nothing of B's runs");
    let runs_without_instance = runs_of(&endpoint, wire, &anyone_ticket, &[0]);
    assert!(
        runs_without_instance.is_err(),
        "runs need a ticket naming an instance"
    );
    // A's queue pair reads A's run, and nothing of B's: not with B's rkey (replayed), A's
    // own, or any guessed key (a failed READ breaks the queue pair, so one each).
    assert!(raw.reads(Some(runs_a[0])), "A reads its own run");
    let mut guesses: Vec<u32> = (0..32).collect();
    for near in [b_run.rkey, runs_a[0].rkey] {
        guesses.extend(near.saturating_sub(4)..=near.saturating_add(4));
    }
    guesses.sort_unstable();
    guesses.dedup();
    for rkey in guesses {
        let probe = RawPoolQp::open(&endpoint, &granted, wire).expect("A's ticket");
        assert!(
            !probe.reads_at(b_run.offset, rkey),
            "A read B's run with rkey {rkey} (B's is {})",
            b_run.rkey
        );
    }
    let raw_b = RawPoolQp::open(&endpoint, &hello(b"KVP3", Some(&ticket_b)), wire).expect("B");
    assert!(
        raw_b.reads(Some(b_run)),
        "B reads its own run with that rkey"
    );
    // A gives its blocks up: the node drops its run's registration, then the server places
    // for no one there until the node said so; with B's slab taken the pool is full
    // meanwhile. A's next blocks land in that slab again, under a new key: A's engine,
    // which knew the old one, writes and reads them all the same (its first try fails on
    // the stale key and is made again over a fresh link).
    let removed = engine
        .client()
        .remove(kvcm::proto::meta::RemoveCacheRequest {
            block_keys: keys.to_vec(),
            ..Default::default()
        });
    removed.expect("A removes its blocks");
    let released = common::wait_until_blocking(Duration::from_secs(10), || {
        runs_in(&endpoint, wire, &ticket_a, NODE_BYTES)
            .is_empty()
            .then_some(())
    });
    released.expect("the node dropped A's run once its blocks were freed");
    let again = [4, 5, 6];
    let placed = common::wait_until_blocking(Duration::from_secs(10), || {
        // Refused for room (the slab is not back yet), or all written: never a transfer
        // that failed.
        match try_put(&mut engine, &again) {
            Err(error) => {
                assert!(error.to_string().contains("no space"), "{error}");
                None
            }
            Ok(outcomes) => {
                let written = |o: &PutOutcome| matches!(o, PutOutcome::Written(_));
                assert!(outcomes.iter().all(written), "{outcomes:?}");
                Some(())
            }
        }
    });
    placed.expect("A's blocks are placed once its slab came back");
    let back = runs_in(&endpoint, wire, &ticket_a, NODE_BYTES);
    assert_eq!(back.len(), 1, "{back:?}");
    assert_eq!(back[0].offset, runs_a[0].offset, "the same slab");
    assert_ne!(back[0].rkey, runs_a[0].rkey, "under a new key");
    for outcome in get_checked(&mut engine, &again) {
        assert!(matches!(outcome, GetOutcome::Hit(_)), "{outcome:?}");
    }
    // A queue pair opened with the client's ticket reads the region until the key is
    // revoked; within a few heartbeats the node tears it down and refuses the ticket. The
    // ticket is listed afresh: on a slow machine (rxe under TCG) the node may have missed
    // heartbeats and rejoined as a new incarnation meanwhile, which the old ticket does
    // not open.
    let ticket = live_ticket(&client_key, Some("on_pool"))
        .expect("the node is live")
        .1;
    let granted = hello(b"KVP3", Some(&ticket));
    let runs_a = runs_in(&endpoint, wire, &ticket, NODE_BYTES);
    let raw = RawPoolQp::open(&endpoint, &granted, wire).expect("the ticket opens a queue pair");
    assert!(raw.reads(Some(runs_a[0])), "a READ on a granted queue pair");
    runtime.block_on(async {
        let (status, listed) = server
            .post_as("admin_http", "/api/listApiKeys", &json!({}), Some(ROOT))
            .await;
        assert_eq!(status, 200, "{listed}");
        let keys = listed["keys"].as_array().expect("keys");
        let eng = keys
            .iter()
            .find(|k| k["user_name"] == "eng")
            .expect("eng's key");
        let key_id = eng["key_id"].as_str().expect("key_id").to_string();
        let (status, answer) = server
            .post_as(
                "admin_http",
                "/api/revokeApiKey",
                &json!({"key_id": key_id}),
                Some(ROOT),
            )
            .await;
        assert_eq!((status, code(&answer)), (200, "OK"), "{answer}");
    });
    let revoked_at = Instant::now();
    let torn_down = common::wait_until_blocking(Duration::from_secs(10), || {
        (!raw.reads(Some(runs_a[0]))).then_some(())
    });
    assert!(
        torn_down.is_some(),
        "the revoked key's queue pair is torn down"
    );
    eprintln!("torn down {:?} after the revocation", revoked_at.elapsed());
    assert!(
        !pool_hello_admitted(&endpoint, &granted, wire),
        "the revoked credential's ticket opens nothing more"
    );
}
