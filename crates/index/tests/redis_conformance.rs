//! The Redis backend: the conformance suite on a private single node and on a private
//! 3-master Redis Cluster, namespaces on different masters, a server killed and restarted
//! under load, and corrupt data in Redis.

mod redis_support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvcm_index::redis::resp::Reply;
use kvcm_index::{
    conformance, IndexError, MetaIndex, Modify, RedisIndex, RedisIndexConfig, U64Codec,
};
use redis_support::{command, raw_command, redis_available, wait_until, RedisCluster, RedisServer};

type Index = RedisIndex<u64, U64Codec>;

static NAMESPACES: AtomicU64 = AtomicU64::new(0);

/// A fresh namespace name for each index of a test run.
fn fresh_namespace(prefix: &str) -> String {
    let n = NAMESPACES.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{n}", std::process::id())
}

fn open(uri: &str, namespace: &str, max_key_count: u64) -> Index {
    RedisIndex::connect(
        RedisIndexConfig {
            uri: uri.to_owned(),
            namespace: namespace.to_owned(),
            max_key_count,
            timeout: Duration::from_secs(5),
        },
        U64Codec,
    )
    .expect("connect to the test redis")
}

#[test]
fn single_redis_conforms() {
    if !redis_available("single_redis_conforms") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let server = RedisServer::start(dir.path());
    let uri = server.uri();
    conformance::run_all(|max_key_count| open(&uri, &fresh_namespace("single"), max_key_count));
}

#[test]
fn redis_cluster_conforms_and_spreads_namespaces_over_masters() {
    if !redis_available("redis_cluster_conforms") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = RedisCluster::start(dir.path());
    let uri = cluster.uri();
    conformance::run_all(|max_key_count| open(&uri, &fresh_namespace("cluster"), max_key_count));
    check_namespaces_on_every_master(&cluster);
    check_a_slot_migration_is_followed(&cluster);
}

fn node_id(address: &str) -> String {
    match command(address, &["CLUSTER", "MYID"]) {
        Ok(Reply::Bulk(Some(id))) => String::from_utf8(id).expect("ascii id"),
        other => panic!("CLUSTER MYID on {address}: {other:?}"),
    }
}

fn expect_ok(address: &str, args: &[&str]) {
    let reply = command(address, args);
    assert!(
        matches!(&reply, Ok(Reply::Status(s)) if s == "OK"),
        "{args:?} on {address}: {reply:?}"
    );
}

/// The slot of a namespace moves to another master while an index uses it: during the
/// migration the index follows `ASK` (reads and writes), afterwards `MOVED` (its owner
/// changes), and it never loses or misplaces a key.
fn check_a_slot_migration_is_followed(cluster: &RedisCluster) {
    let namespace = "migrating";
    let index = open(&cluster.uri(), namespace, u64::MAX);
    index
        .put((0..10).map(|k| (k, k as u64)).collect())
        .expect("put");
    let source = index.node();
    let target = cluster
        .nodes
        .iter()
        .map(RedisServer::address)
        .find(|address| *address != source)
        .expect("another master");
    let slot = kvcm_index::redis::tag_slot(namespace).to_string();
    let (source_id, target_id) = (node_id(&source), node_id(&target));
    expect_ok(
        &target,
        &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &source_id],
    );
    expect_ok(
        &source,
        &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &target_id],
    );
    // Every key of the slot moves: another test's namespace may hash to the same slot (the
    // slot cannot change owner while its old master holds any key of it).
    let in_slot = command(&source, &["CLUSTER", "GETKEYSINSLOT", &slot, "100000"]);
    let Ok(Reply::Array(Some(keys))) = in_slot else {
        panic!("CLUSTER GETKEYSINSLOT on {source}: {in_slot:?}");
    };
    let keys: Vec<String> = keys
        .into_iter()
        .map(|key| match key {
            Reply::Bulk(Some(key)) => String::from_utf8(key).expect("a text key"),
            other => panic!("a key of the slot: {other:?}"),
        })
        .collect();
    let [values, order] = index.redis_keys();
    assert!(keys.iter().any(|k| k == values) && keys.iter().any(|k| k == order));
    let target_port = target.rsplit(':').next().expect("port");
    let mut migrate = vec!["MIGRATE", "127.0.0.1", target_port, "", "0", "5000", "KEYS"];
    migrate.extend(keys.iter().map(String::as_str));
    expect_ok(&source, &migrate);

    let expected: Vec<Option<u64>> = (0..10).map(Some).collect();
    assert_eq!(
        index
            .get(&(0..10).collect::<Vec<_>>())
            .expect("get via ASK"),
        expected
    );
    index.put(vec![(10, 10)]).expect("put via ASK");
    assert_eq!(index.node(), source, "ASK does not change the owner");

    for node in &cluster.nodes {
        expect_ok(
            &node.address(),
            &["CLUSTER", "SETSLOT", &slot, "NODE", &target_id],
        );
    }
    let all: Vec<i64> = (0..11).collect();
    let got = index.get(&all).expect("get after MOVED");
    assert_eq!(got, (0..11).map(Some).collect::<Vec<_>>());
    assert_eq!(index.node(), target, "MOVED changes the owner");
    assert_eq!(index.len().expect("len"), 11);
}

/// Namespaces whose tags hash to each of the three masters, all written through one seed
/// node: each index finds its own master, and batches to all of them work side by side.
fn check_namespaces_on_every_master(cluster: &RedisCluster) {
    let masters: BTreeSet<String> = cluster.nodes.iter().map(RedisServer::address).collect();
    let mut by_master: Vec<(String, Index)> = Vec::new();
    for n in 0.. {
        let index = open(&cluster.uri(), &format!("spread-{n}"), u64::MAX);
        let node = index.node();
        if !by_master.iter().any(|(seen, _)| *seen == node) {
            by_master.push((node, index));
        }
        if by_master.len() == masters.len() {
            break;
        }
        assert!(n < 1000, "namespaces never reached every master");
    }
    let reached: BTreeSet<String> = by_master.iter().map(|(node, _)| node.clone()).collect();
    assert_eq!(reached, masters);
    for (i, (_, index)) in by_master.iter().enumerate() {
        assert!(index.is_cluster());
        let entries: Vec<(i64, u64)> = (0..200).map(|k| (k, k as u64 + i as u64)).collect();
        index.put(entries).expect("put on one master");
    }
    for (i, (node, index)) in by_master.iter().enumerate() {
        let got = index.get(&[0, 199, 200]).expect("get");
        assert_eq!(
            got,
            vec![Some(i as u64), Some(199 + i as u64), None],
            "{node}"
        );
        let [values, _] = index.redis_keys();
        let stored = command(node, &["HLEN", values]).expect("HLEN on the owner");
        assert_eq!(stored, Reply::Int(200), "the keys live on {node}");
    }
}

#[test]
fn a_cluster_failover_is_followed_by_the_same_index() {
    if !redis_available("a_cluster_failover_is_followed_by_the_same_index") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cluster = RedisCluster::start_with(dir.path(), 1, &["--cluster-node-timeout", "1000"]);
    let seed = cluster.uri();
    let index = (0..)
        .map(|n| open(&seed, &format!("failover-{n}"), u64::MAX))
        .find(|index| cluster.nodes[0].address() != index.node())
        .expect("a namespace whose master is not the seed");
    index
        .put((0..100).map(|k| (k, k as u64)).collect())
        .expect("put");
    let master = index.node();
    let replicated = command(&master, &["WAIT", "1", "5000"]);
    assert_eq!(
        replicated.expect("WAIT"),
        Reply::Int(1),
        "the replica has the writes"
    );

    cluster.node_mut(&master).kill();
    let keys: Vec<i64> = (0..100).collect();
    wait_until("the index reads again after the failover", || {
        index.get(&keys).is_ok()
    });
    assert_ne!(index.node(), master, "the promoted replica serves the slot");
    let expected: Vec<Option<u64>> = (0..100).map(Some).collect();
    assert_eq!(index.get(&keys).expect("get"), expected);
    index.put(vec![(100, 100)]).expect("put on the new master");
    assert_eq!(index.len().expect("len"), 101);
}

#[test]
fn a_killed_and_restarted_redis_recovers_without_a_new_index() {
    if !redis_available("a_killed_and_restarted_redis_recovers") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mut server = RedisServer::start(dir.path());
    let index = Arc::new(open(&server.uri(), "restart", u64::MAX));
    let acknowledged = Arc::new(Mutex::new(Vec::new()));
    let errors = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (index, acknowledged) = (index.clone(), acknowledged.clone());
        let (errors, stop) = (errors.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut next: i64 = 0;
            while !stop.load(Ordering::Acquire) {
                let batch: Vec<(i64, u64)> = (next..next + 4).map(|k| (k, k as u64)).collect();
                match index.put(batch) {
                    Ok(()) => acknowledged.lock().expect("lock").push(next),
                    Err(IndexError::Backend(_)) => {
                        errors.fetch_add(1, Ordering::AcqRel);
                    }
                    Err(other) => panic!("unexpected error {other}"),
                }
                next += 4;
            }
        })
    };
    let incrementer = spawn_incrementer(index.clone(), stop.clone());
    let acked = || acknowledged.lock().expect("lock").len();
    wait_until("some writes are acknowledged", || acked() >= 50);
    server.kill();
    wait_until("writes fail while redis is down", || {
        errors.load(Ordering::Acquire) >= 2
    });
    let acked_before_restart = acked();
    server.restart();
    wait_until("writes succeed again after the restart", || {
        acked() >= acked_before_restart + 50
    });
    stop.store(true, Ordering::Release);
    writer.join().expect("writer");
    let (increments_ok, increments_failed) = incrementer.join().expect("incrementer");

    let counter = index.get(&[COUNTER]).expect("read the counter")[0].unwrap_or(0);
    assert!(
        (increments_ok..=increments_ok + increments_failed).contains(&counter),
        "counter {counter}: {increments_ok} increments acknowledged, {increments_failed} failed"
    );
    let starts = acknowledged.lock().expect("lock").clone();
    let keys: Vec<i64> = starts.iter().flat_map(|&s| s..s + 4).collect();
    let got = index.get(&keys).expect("read after recovery");
    for (key, value) in keys.iter().zip(got) {
        assert_eq!(value, Some(*key as u64), "acknowledged key {key} survived");
    }
    eprintln!(
        "restart test: {} batches acknowledged, {} failed while redis was down; counter \
         {counter} after {increments_ok} acknowledged and {increments_failed} failed increments",
        starts.len(),
        errors.load(Ordering::Acquire)
    );
}

/// The key the incrementer of the restart test counts on (the putter uses keys ≥ 0).
const COUNTER: i64 = -1;

/// Increments `COUNTER` with `read_modify_write` until `stop`; returns how many increments
/// were acknowledged and how many failed (a failed one may or may not have been applied).
fn spawn_incrementer(
    index: Arc<Index>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(u64, u64)> {
    std::thread::spawn(move || {
        let (mut ok, mut failed) = (0, 0);
        while !stop.load(Ordering::Acquire) {
            let increment =
                &mut |_, current: Option<&u64>| Modify::Put(current.map_or(1, |n| n + 1));
            match index.read_modify_write(&[COUNTER], increment) {
                Ok(()) => ok += 1,
                Err(IndexError::Backend(_)) => failed += 1,
                Err(other) => panic!("unexpected error {other}"),
            }
        }
        (ok, failed)
    })
}

#[test]
fn a_write_whose_reply_is_lost_is_an_error_not_ok() {
    if !redis_available("a_write_whose_reply_is_lost_is_an_error_not_ok") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let server = RedisServer::start(dir.path());
    let index = RedisIndex::connect(
        RedisIndexConfig {
            uri: server.uri(),
            namespace: "lost-reply".to_owned(),
            max_key_count: u64::MAX,
            timeout: Duration::from_millis(300),
        },
        U64Codec,
    )
    .expect("connect");
    index.put(vec![(1, 1)]).expect("put before the pause");
    expect_ok(&server.address(), &["CLIENT", "PAUSE", "1500", "WRITE"]);
    match index.put(vec![(1, 2)]) {
        Err(IndexError::Backend(message)) => {
            assert!(
                message.contains("may or may not have been applied"),
                "{message}"
            )
        }
        other => panic!("a write without a reply must fail, got {other:?}"),
    }
    assert!(
        matches!(index.get(&[1]).expect("reads go on")[..], [Some(1 | 2)]),
        "the key holds the old or the new value"
    );
    wait_until("writes work again after the pause", || {
        index.put(vec![(2, 2)]).is_ok()
    });
    let got = index.get(&[1, 2]).expect("get");
    assert!(matches!(got[..], [Some(1 | 2), Some(2)]), "{got:?}");
}

#[test]
fn garbage_in_redis_is_a_clear_backend_error() {
    if !redis_available("garbage_in_redis_is_a_clear_backend_error") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let server = RedisServer::start(dir.path());
    let index = open(&server.uri(), "garbage", u64::MAX);
    index.put(vec![(5, 50)]).expect("put");
    let [values, order] = index.redis_keys();
    let field = (5i64 as u64 ^ (1 << 63)).to_be_bytes();
    let wrote = raw_command(
        &server.address(),
        &[b"HSET", values.as_bytes(), &field, b"junk"],
    );
    assert_eq!(wrote.expect("HSET"), Reply::Int(0));

    let failures = [
        index.get(&[5]).map(|_| ()),
        index.read_modify_write(&[5], &mut |_, _| Modify::Keep),
    ];
    for failure in failures {
        match failure {
            Err(IndexError::Backend(message)) => {
                assert!(
                    message.contains("key 5") && message.contains("8 bytes"),
                    "{message}"
                )
            }
            other => panic!("expected a Backend error, got {other:?}"),
        }
    }

    let wrote = command(&server.address(), &["ZADD", order, "0", "short"]);
    assert_eq!(wrote.expect("ZADD"), Reply::Int(1));
    match index.scan(kvcm_index::ScanCursor::START, 10) {
        Err(IndexError::Backend(message)) => assert!(message.contains("5 bytes"), "{message}"),
        other => panic!("expected a Backend error, got {other:?}"),
    }
    let wrong_type = command(&server.address(), &["SET", values, "x"]);
    assert!(matches!(wrong_type, Ok(Reply::Status(_))));
    match index.len() {
        Err(IndexError::Backend(message)) => assert!(message.contains("WRONGTYPE"), "{message}"),
        other => panic!("expected a Backend error, got {other:?}"),
    }
}

#[test]
fn credentials_and_the_database_of_the_uri_are_used() {
    if !redis_available("credentials_and_the_database_of_the_uri_are_used") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let server = RedisServer::start_with_args(dir.path(), &["--requirepass", "s3cret"]);
    let authed = format!("redis://:s3cret@127.0.0.1:{}/2", server.port);
    let index = open(&authed, "authed", u64::MAX);
    index.put(vec![(1, 1)]).expect("put with a password");
    let as_user = format!("redis://default:s3cret@127.0.0.1:{}/2", server.port);
    assert_eq!(
        open(&as_user, "authed", u64::MAX).get(&[1]).expect("get"),
        vec![Some(1)]
    );
    let db0 = format!("redis://:s3cret@127.0.0.1:{}", server.port);
    assert_eq!(
        open(&db0, "authed", u64::MAX).len().expect("len"),
        0,
        "db 0 is another space"
    );

    let wrong = RedisIndex::<u64, U64Codec>::connect(
        RedisIndexConfig {
            uri: format!("redis://:nope@127.0.0.1:{}", server.port),
            namespace: "authed".to_owned(),
            max_key_count: u64::MAX,
            timeout: Duration::from_secs(5),
        },
        U64Codec,
    );
    match wrong {
        Err(IndexError::Backend(message)) => {
            assert!(
                message.contains("AUTH") && message.contains("WRONGPASS"),
                "{message}"
            )
        }
        other => panic!("expected a Backend error, got {other:?}"),
    }
}

#[test]
fn bad_settings_are_refused_before_connecting() {
    let config = |uri: &str, namespace: &str, timeout| RedisIndexConfig {
        uri: uri.to_owned(),
        namespace: namespace.to_owned(),
        max_key_count: u64::MAX,
        timeout,
    };
    let second = Duration::from_secs(1);
    for (bad, part) in [
        (config("rediss://127.0.0.1:1", "ns", second), "TLS"),
        (config("redis://127.0.0.1:1?tls=1", "ns", second), "tls"),
        (config("redis://127.0.0.1:1", "a{b}", second), "namespace"),
        (
            config("redis://127.0.0.1:1", "ns", Duration::ZERO),
            "timeout",
        ),
    ] {
        match RedisIndex::<u64, U64Codec>::connect(bad, U64Codec) {
            Err(IndexError::InvalidArgument(message)) => {
                assert!(message.contains(part), "{message}")
            }
            other => panic!("expected InvalidArgument naming {part}, got {other:?}"),
        }
    }
}

#[test]
fn an_unreachable_server_is_a_clear_backend_error() {
    let port = redis_support::free_port();
    let refused = RedisIndex::<u64, U64Codec>::connect(
        RedisIndexConfig {
            uri: format!("redis://127.0.0.1:{port}"),
            namespace: "nobody".to_owned(),
            max_key_count: u64::MAX,
            timeout: Duration::from_secs(1),
        },
        U64Codec,
    );
    match refused {
        Err(IndexError::Backend(message)) => {
            assert!(
                message.contains(&port.to_string()) && message.contains("tries"),
                "{message}"
            )
        }
        other => panic!("expected a Backend error, got {other:?}"),
    }
}

#[test]
fn a_stale_leaders_writes_are_refused_once_a_newer_leader_wrote() {
    if !redis_available("a_stale_leaders_writes_are_refused") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let server = RedisServer::start(dir.path());
    let namespace = fresh_namespace("fence");
    let (old_token, new_token) = (Arc::new(AtomicU64::new(1)), Arc::new(AtomicU64::new(2)));
    let old = open(&server.uri(), &namespace, u64::MAX).fenced_by(old_token.clone());
    let new = open(&server.uri(), &namespace, u64::MAX).fenced_by(new_token);
    old.put(vec![(1, 10)])
        .expect("the only leader so far writes");
    old.put(vec![(2, 20)]).expect("still the only one");
    new.put(vec![(3, 30)])
        .expect("the new leader's first write");
    let refused = old.put(vec![(4, 40)]).unwrap_err();
    assert!(
        matches!(refused, IndexError::Fenced { token: 1 }),
        "{refused:?}"
    );
    let refused = old.delete(&[1]).unwrap_err();
    assert!(matches!(refused, IndexError::Fenced { .. }), "{refused:?}");
    let refused = old
        .read_modify_write(&[2], &mut |_, _| Modify::Put(0))
        .unwrap_err();
    assert!(matches!(refused, IndexError::Fenced { .. }), "{refused:?}");
    assert_eq!(
        old.get(&[1, 2, 3, 4]).unwrap(),
        [Some(10), Some(20), Some(30), None],
        "reads go on; nothing refused changed"
    );
    old_token.store(3, Ordering::Release);
    old.put(vec![(4, 40)])
        .expect("re-elected with a newer token, it writes again");
    assert!(matches!(
        new.put(vec![(5, 50)]),
        Err(IndexError::Fenced { token: 2 })
    ));
}

#[test]
fn apply_raise_fence_and_drop_all_are_fenced_writes() {
    if !redis_available("apply_raise_fence_and_drop_all") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let server = RedisServer::start(dir.path());
    let namespace = fresh_namespace("apply");
    let (old_token, new_token) = (Arc::new(AtomicU64::new(1)), Arc::new(AtomicU64::new(2)));
    let old = open(&server.uri(), &namespace, u64::MAX).fenced_by(old_token);
    let new = open(&server.uri(), &namespace, u64::MAX).fenced_by(new_token);
    old.apply(&[(1, Some(10)), (2, Some(20)), (1, None), (3, Some(30))])
        .expect("one write of puts and deletes");
    assert_eq!(old.get(&[1, 2, 3]).unwrap(), [None, Some(20), Some(30)]);
    assert_eq!(old.len().unwrap(), 2);
    let page = old.scan(kvcm_index::ScanCursor::START, 10).unwrap();
    assert_eq!(page.keys, [2, 3], "the order zset follows the hash");

    new.raise_fence().expect("the new leader raises the fence");
    let refused = old.apply(&[(4, Some(40))]).unwrap_err();
    assert!(
        matches!(refused, IndexError::Fenced { token: 1 }),
        "{refused:?}"
    );
    assert!(matches!(
        old.drop_all(),
        Err(IndexError::Fenced { token: 1 })
    ));
    assert!(matches!(
        old.raise_fence(),
        Err(IndexError::Fenced { token: 1 })
    ));
    assert_eq!(new.len().unwrap(), 2, "nothing refused changed");

    new.drop_all().expect("the leader drops the namespace");
    assert_eq!(new.len().unwrap(), 0);
    assert!(new
        .scan(kvcm_index::ScanCursor::START, 10)
        .unwrap()
        .keys
        .is_empty());
    assert!(
        matches!(old.apply(&[(5, Some(50))]), Err(IndexError::Fenced { .. })),
        "the fence outlives the dropped keys"
    );
}
