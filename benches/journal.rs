//! Acknowledged metadata writes through the journal against their floor, in one run:
//! StartWriteCache / FinishWriteCache of one block on the embedded manager (a real `file`
//! storage, the journal under a temp data directory on this machine's disk), with fsync
//! `always`, `10ms` and `never`, by 1 and 8 concurrent writers — beside a bare loop that
//! appends one record of the journal's mean record size and fdatasyncs it, in the same
//! directory (the floor), and the same loop over zeros written ahead (what the
//! disk does for a sync that commits no file size: the journal's segments are written so).
//!
//! `cargo bench --bench journal` (`KVCM_BENCH_WRITES` sets the writes per case, default 2000).
//! Targets (issue 10): one writer's acknowledged call p50 ≤ 1.2× one bare fdatasync; 8
//! writers with `always` reach ≥ 4× the bare loop's records per second (group commit).
//!
//! Then the same calls on the shared store (`kvcm.registry_storage.uri=redis://…`, a private
//! `redis-server` with `appendfsync always`), beside their floor on that server: one `HSET`
//! of a value of the same size per round trip.

#[path = "../crates/index/tests/redis_support/mod.rs"]
mod redis_support;

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvcm::config::ServerConfig;
use kvcm_manager::mask::BlockMask;
use kvcm_manager::registration::{InstanceInfo, ModelDeployment};
use kvcm_manager::{FsyncPolicy, Instance, Manager};
use kvcm_storage::BlockSpec;

/// Latencies of acknowledged calls and the wall time they took.
struct Run {
    calls: Vec<Duration>,
    wall: Duration,
    mean_record_bytes: u64,
}

impl Run {
    fn percentile(&self, p: f64) -> Duration {
        let mut sorted = self.calls.clone();
        sorted.sort();
        sorted[((sorted.len() - 1) as f64 * p) as usize]
    }

    fn per_second(&self) -> f64 {
        self.calls.len() as f64 / self.wall.as_secs_f64()
    }
}

/// Where a bench manager keeps its metadata.
#[derive(Clone, Copy)]
enum Keeping<'a> {
    Journal(FsyncPolicy),
    Shared(&'a str),
}

fn manager(dir: &Path, keeping: Keeping) -> (Arc<Manager>, Arc<Instance>) {
    let mut config = ServerConfig {
        data_dir: dir.to_path_buf(),
        ..ServerConfig::default()
    };
    match keeping {
        Keeping::Journal(fsync) => config.journal.fsync = fsync,
        Keeping::Shared(uri) => {
            config.journal.shared_uri = uri.to_string();
            config.coordination_uri = uri.to_string();
        }
    }
    let manager = kvcm::server::embedded_manager(&config).expect("manager");
    let info = InstanceInfo {
        quota_group_name: String::new(),
        instance_group_name: kvcm::server::DEFAULT_GROUP.into(),
        instance_id: "bench".into(),
        block_size: 16,
        specs: vec![BlockSpec {
            name: "tp0".into(),
            size: 1 << 16,
        }],
        model: ModelDeployment {
            model_name: "m".into(),
            dtype: "fp8".into(),
            ..Default::default()
        },
        spec_groups: Vec::new(),
        default_query: Default::default(),
    };
    manager.register_instance(info).expect("register");
    let instance = manager.instance("bench").expect("instance");
    (manager, instance)
}

/// `writes` one-block writes split over `writers` threads; each start and finish is one call.
fn journaled(keeping: Keeping, writers: usize, writes: usize) -> Run {
    let dir = tempfile::tempdir_in(".").expect("temp dir");
    let (manager, instance) = manager(dir.path(), keeping);
    let before = manager.journal_stats().expect("journal");
    let began = Instant::now();
    let calls: Vec<Duration> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..writers)
            .map(|writer| {
                let (manager, instance) = (&manager, &instance);
                scope.spawn(move || {
                    let mut calls = Vec::new();
                    for i in 0..writes / writers {
                        let key = (writer * writes + i) as i64;
                        let timed = Instant::now();
                        let started = manager
                            .start_write(instance, vec![key], &[], 30)
                            .expect("start");
                        calls.push(timed.elapsed());
                        let timed = Instant::now();
                        manager
                            .finish_write(instance, &started.session_id, &BlockMask::Offset(1))
                            .expect("finish");
                        calls.push(timed.elapsed());
                    }
                    calls
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().expect("writer"))
            .collect()
    });
    let wall = began.elapsed();
    let after = manager.journal_stats().expect("journal");
    let records = (after.appended - before.appended).max(1);
    manager.leadership().resign();
    Run {
        calls,
        wall,
        mean_record_bytes: (after.log_bytes - before.log_bytes) / records,
    }
}

/// The shared store's floor: one `HSET` of `value_bytes` per round trip, `count` times.
fn bare_hset(address: &str, value_bytes: usize, count: usize) -> Run {
    use kvcm_index::redis::resp::{Command, Connection, Handshake};
    let mut connection =
        Connection::open(address, Duration::from_secs(5), &Handshake::default()).expect("redis");
    let value = vec![0x5a; value_bytes];
    let began = Instant::now();
    let calls = (0..count)
        .map(|i| {
            let mut hset = Command::new("HSET");
            hset.arg("bench:floor").arg(i.to_le_bytes()).arg(&value);
            let timed = Instant::now();
            connection.call(&hset).expect("HSET");
            timed.elapsed()
        })
        .collect();
    Run {
        calls,
        wall: began.elapsed(),
        mean_record_bytes: value_bytes as u64,
    }
}

/// The shared-store cases, when `redis-server` is installed (said loudly otherwise); each
/// case on a fresh server.
fn shared_store(writes: usize) {
    if !redis_support::redis_available("the shared-store cases of the journal bench") {
        return;
    }
    let on_fresh_redis = |writers| {
        let dir = tempfile::tempdir_in(".").expect("redis dir");
        let redis = redis_support::RedisServer::start(dir.path());
        journaled(Keeping::Shared(&redis.uri()), writers, writes)
    };
    let one = on_fresh_redis(1);
    let dir = tempfile::tempdir_in(".").expect("redis dir");
    let redis = redis_support::RedisServer::start(dir.path());
    // A stored entry of one file-tier block is ~100 bytes.
    let floor = bare_hset(&redis.address(), 128, writes);
    println!(
        "floor: HSET of 128 B on redis-server (appendfsync always), one per round trip: {:.0}/s, p50 {:.1} us, p99 {:.1} us",
        floor.per_second(),
        floor.percentile(0.5).as_secs_f64() * 1e6,
        floor.percentile(0.99).as_secs_f64() * 1e6,
    );
    print("shared store, 1 writer", &one, &floor);
    print("shared store, 8 writers", &on_fresh_redis(8), &floor);
}

/// The floor: write `record_bytes` and fdatasync, `count` times, one record per sync —
/// appended to a growing file (`ahead` false: each sync commits the new size too), or over
/// zeros written ahead (`ahead` true: the data alone, as the journal's segments do).
fn bare_fdatasync(record_bytes: u64, count: usize, ahead: bool) -> Run {
    let dir = tempfile::tempdir_in(".").expect("temp dir");
    let mut file = std::fs::File::create(dir.path().join("bare.log")).expect("file");
    if ahead {
        file.write_all(&vec![0; record_bytes as usize * count])
            .and_then(|()| file.sync_all())
            .expect("zeros ahead");
    }
    let record = vec![0x5a; record_bytes as usize];
    let began = Instant::now();
    let calls = (0..count as u64)
        .map(|i| {
            let timed = Instant::now();
            file.write_all_at(&record, i * record_bytes).expect("write");
            file.sync_data().expect("fdatasync");
            timed.elapsed()
        })
        .collect();
    Run {
        calls,
        wall: began.elapsed(),
        mean_record_bytes: record_bytes,
    }
}

fn print(label: &str, run: &Run, floor: &Run) {
    println!(
        "{label:<28} {:>9.0} calls/s ({:>5.2}x floor)  p50 {:>7.1} us ({:>5.2}x floor)  p99 {:>7.1} us",
        run.per_second(),
        run.per_second() / floor.per_second(),
        run.percentile(0.5).as_secs_f64() * 1e6,
        run.percentile(0.5).as_secs_f64() / floor.percentile(0.5).as_secs_f64(),
        run.percentile(0.99).as_secs_f64() * 1e6,
    );
}

fn main() {
    let writes: usize = std::env::var("KVCM_BENCH_WRITES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let journal = |fsync| Keeping::Journal(fsync);
    let one_always = journaled(journal(FsyncPolicy::Always), 1, writes);
    let floor = bare_fdatasync(one_always.mean_record_bytes, writes, false);
    let ahead = bare_fdatasync(one_always.mean_record_bytes, writes, true);
    for (how, run) in [("append", &floor), ("write over zeros", &ahead)] {
        println!(
            "floor: bare {how} of {} B + fdatasync, one record per sync: {:.0} records/s, p50 {:.1} us, p99 {:.1} us",
            run.mean_record_bytes,
            run.per_second(),
            run.percentile(0.5).as_secs_f64() * 1e6,
            run.percentile(0.99).as_secs_f64() * 1e6,
        );
    }
    print("always, 1 writer", &one_always, &floor);
    print("  against zeros ahead", &one_always, &ahead);
    print(
        "always, 8 writers",
        &journaled(journal(FsyncPolicy::Always), 8, writes),
        &floor,
    );
    let every = journal(FsyncPolicy::Every(Duration::from_millis(10)));
    print("10ms, 1 writer", &journaled(every, 1, writes), &floor);
    print("10ms, 8 writers", &journaled(every, 8, writes), &floor);
    print(
        "never, 1 writer",
        &journaled(journal(FsyncPolicy::Never), 1, writes),
        &floor,
    );
    print(
        "never, 8 writers",
        &journaled(journal(FsyncPolicy::Never), 8, writes),
        &floor,
    );
    shared_store(writes);
}
