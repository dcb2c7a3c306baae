//! RedisIndex batch get and read_modify_write of 128 keys beside the raw floor on the same
//! `redis-server` in the same run: 128 pipelined `GET`s and 128 pipelined `SET`s of string
//! keys through the same RESP client, one connection, one thread. read_modify_write is shown
//! beside two floors: the write alone (128 pipelined `SET`s, one round trip) and a raw,
//! non-atomic read-modify-write (128 pipelined `GET`s, then 128 pipelined `SET`s: the same two
//! round trips the index makes).
//!
//! The server is a private one started here on a free port, in memory (`--appendonly no`),
//! so the figures compare the index's work (one `HMGET`; `HMGET` + the write script) with the
//! raw commands rather than with the disk. Rounds interleave the four workloads (alternating
//! which side goes first) so both see the same machine load; the printed figures are the
//! median keys/s of each side and the median per-round ratio.
//!
//! Run: `cargo bench -p kvcm-index --bench redis_index` (`KVCM_BENCH_ROUNDS`, default 21).

#[path = "../tests/redis_support/mod.rs"]
mod redis_support;

use std::time::{Duration, Instant};

use kvcm_index::redis::resp::{Command, Connection, Handshake, Reply};
use kvcm_index::{MetaIndex, Modify, RedisIndex, RedisIndexConfig, U64Codec};
use rand::Rng;

/// Keys stored in the index and as raw strings.
const STORED: i64 = 100_000;
/// Keys per batch.
const BATCH: usize = 128;
/// Batches per side per round.
const BATCHES_PER_ROUND: usize = 100;

type Index = RedisIndex<u64, U64Codec>;

fn rounds() -> usize {
    std::env::var("KVCM_BENCH_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(21)
}

fn random_keys() -> Vec<i64> {
    let mut rng = rand::rng();
    (0..BATCH).map(|_| rng.random_range(0..STORED)).collect()
}

fn raw_key(key: i64) -> String {
    format!("raw:{{bench}}:{key}")
}

fn raw_get(connection: &mut Connection, keys: &[i64]) {
    let commands: Vec<Command> = keys
        .iter()
        .map(|&key| {
            let mut get = Command::new("GET");
            get.arg(raw_key(key));
            get
        })
        .collect();
    let replies = connection.pipeline(&commands).expect("pipelined GET");
    assert!(replies.iter().all(|r| matches!(r, Reply::Bulk(Some(_)))));
}

fn raw_set(connection: &mut Connection, keys: &[i64]) {
    let commands: Vec<Command> = keys
        .iter()
        .map(|&key| {
            let mut set = Command::new("SET");
            set.arg(raw_key(key)).arg((key as u64).to_le_bytes());
            set
        })
        .collect();
    let replies = connection.pipeline(&commands).expect("pipelined SET");
    assert!(replies.iter().all(|r| matches!(r, Reply::Status(_))));
}

fn index_get(index: &Index, keys: &[i64]) {
    let values = index.get(keys).expect("get");
    assert!(values.iter().all(Option::is_some));
}

fn index_rmw(index: &Index, keys: &[i64]) {
    index
        .read_modify_write(keys, &mut |_, current| {
            Modify::Put(current.map_or(0, |n| n + 1))
        })
        .expect("rmw");
}

/// The shared store's write: one `apply` of the batch (puts of known values, no read).
fn index_apply(index: &Index, keys: &[i64]) {
    let changes: Vec<(i64, Option<u64>)> = keys.iter().map(|&k| (k, Some(k as u64))).collect();
    index.apply(&changes).expect("apply");
}

fn populate(index: &Index, connection: &mut Connection) {
    let all: Vec<i64> = (0..STORED).collect();
    for chunk in all.chunks(1000) {
        index
            .put(chunk.iter().map(|&k| (k, k as u64)).collect())
            .expect("populate the index");
        raw_set(connection, chunk);
    }
}

/// Time of `BATCHES_PER_ROUND` batches of `work` on fresh random keys.
fn timed(mut work: impl FnMut(&[i64])) -> Duration {
    let batches: Vec<Vec<i64>> = (0..BATCHES_PER_ROUND).map(|_| random_keys()).collect();
    let start = Instant::now();
    for keys in &batches {
        work(keys);
    }
    start.elapsed()
}

fn keys_per_second(elapsed: Duration) -> f64 {
    (BATCHES_PER_ROUND * BATCH) as f64 / elapsed.as_secs_f64()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Paired rounds of `index_side` and `raw_side`; prints medians and the median ratio.
fn compare(name: &str, mut index_side: impl FnMut(&[i64]), mut raw_side: impl FnMut(&[i64])) {
    let (mut index_rates, mut raw_rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds() {
        let (index_time, raw_time) = if round % 2 == 0 {
            let index_time = timed(&mut index_side);
            (index_time, timed(&mut raw_side))
        } else {
            let raw_time = timed(&mut raw_side);
            (timed(&mut index_side), raw_time)
        };
        index_rates.push(keys_per_second(index_time));
        raw_rates.push(keys_per_second(raw_time));
        ratios.push(raw_time.as_secs_f64() / index_time.as_secs_f64());
    }
    println!(
        "RESULT {name}: index {:.0} keys/s, raw {:.0} keys/s, index/raw {:.2}",
        median(index_rates),
        median(raw_rates),
        median(ratios)
    );
}

fn main() {
    if !redis_support::redis_available("bench redis_index") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let server = redis_support::RedisServer::start_with_args(dir.path(), &["--appendonly", "no"]);
    let index: Index = RedisIndex::connect(
        RedisIndexConfig {
            uri: server.uri(),
            namespace: "bench".to_owned(),
            max_key_count: u64::MAX,
            timeout: Duration::from_secs(5),
        },
        U64Codec,
    )
    .expect("connect");
    let mut raw = Connection::open(
        &server.address(),
        Duration::from_secs(5),
        &Handshake::default(),
    )
    .expect("raw connection");
    populate(&index, &mut raw);
    let mut reset = Command::new("CONFIG");
    reset.arg("RESETSTAT");
    raw.call(&reset).expect("CONFIG RESETSTAT");
    println!(
        "redis_index: {STORED} keys, batches of {BATCH}, {} rounds of {BATCHES_PER_ROUND} \
         batches per side, one connection each, redis-server --appendonly no",
        rounds()
    );
    compare(
        "get_128 vs pipelined GET x128",
        |keys| index_get(&index, keys),
        |keys| raw_get(&mut raw, keys),
    );
    let mut raw = Connection::open(
        &server.address(),
        Duration::from_secs(5),
        &Handshake::default(),
    )
    .expect("raw connection");
    compare(
        "read_modify_write_128 vs pipelined SET x128",
        |keys| index_rmw(&index, keys),
        |keys| raw_set(&mut raw, keys),
    );
    compare(
        "apply_128 (the shared store's write) vs pipelined SET x128",
        |keys| index_apply(&index, keys),
        |keys| raw_set(&mut raw, keys),
    );
    compare(
        "read_modify_write_128 vs pipelined GET x128 then SET x128",
        |keys| index_rmw(&index, keys),
        |keys| {
            raw_get(&mut raw, keys);
            raw_set(&mut raw, keys);
        },
    );
    print_server_times(&mut raw);
}

/// The server's own time per command (`INFO commandstats`), to tell script time from the rest.
fn print_server_times(connection: &mut Connection) {
    let mut info = Command::new("INFO");
    info.arg("commandstats");
    let Ok(Reply::Bulk(Some(text))) = connection.call(&info) else {
        return;
    };
    for line in String::from_utf8_lossy(&text).lines() {
        let wanted = ["get:", "set:", "hmget:", "evalsha:"];
        if let Some(stats) = wanted
            .iter()
            .find_map(|w| line.strip_prefix(&format!("cmdstat_{w}")))
        {
            let per_call = stats.split(',').find(|s| s.starts_with("usec_per_call"));
            println!("server {line:.40} ... {}", per_call.unwrap_or(""));
        }
    }
}
