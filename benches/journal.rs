//! Acknowledged metadata writes through the journal against their floor, in one run:
//! StartWriteCache / FinishWriteCache of one block on the embedded manager (a real `file`
//! storage, the journal under a temp data directory on this machine's disk), with fsync
//! `always`, `10ms` and `never`, by 1 and 8 concurrent writers — beside a bare loop that
//! appends one record of the journal's mean record size and fdatasyncs it, in the same
//! directory.
//!
//! `cargo bench --bench journal` (`KVCM_BENCH_WRITES` sets the writes per case, default 2000).
//! Targets (issue 10): one writer's acknowledged call p50 ≤ 1.2× one bare fdatasync; 8
//! writers with `always` reach ≥ 4× the bare loop's records per second (group commit).

use std::io::Write;
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

fn manager(dir: &Path, fsync: FsyncPolicy) -> (Arc<Manager>, Arc<Instance>) {
    let mut config = ServerConfig {
        data_dir: dir.to_path_buf(),
        ..ServerConfig::default()
    };
    config.journal.fsync = fsync;
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
fn journaled(fsync: FsyncPolicy, writers: usize, writes: usize) -> Run {
    let dir = tempfile::tempdir_in(".").expect("temp dir");
    let (manager, instance) = manager(dir.path(), fsync);
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
    Run {
        calls,
        wall,
        mean_record_bytes: (after.log_bytes - before.log_bytes) / records,
    }
}

/// The floor: append `record_bytes` and fdatasync, `count` times, one record per sync.
fn bare_fdatasync(record_bytes: u64, count: usize) -> Run {
    let dir = tempfile::tempdir_in(".").expect("temp dir");
    let mut file = std::fs::File::create(dir.path().join("bare.log")).expect("file");
    let record = vec![0x5a; record_bytes as usize];
    let began = Instant::now();
    let calls = (0..count)
        .map(|_| {
            let timed = Instant::now();
            file.write_all(&record).expect("write");
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
    let one_always = journaled(FsyncPolicy::Always, 1, writes);
    let floor = bare_fdatasync(one_always.mean_record_bytes, writes);
    println!(
        "floor: bare append of {} B + fdatasync, one record per sync: {:.0} records/s, p50 {:.1} us, p99 {:.1} us",
        floor.mean_record_bytes,
        floor.per_second(),
        floor.percentile(0.5).as_secs_f64() * 1e6,
        floor.percentile(0.99).as_secs_f64() * 1e6,
    );
    print("always, 1 writer", &one_always, &floor);
    print(
        "always, 8 writers",
        &journaled(FsyncPolicy::Always, 8, writes),
        &floor,
    );
    let every = FsyncPolicy::Every(Duration::from_millis(10));
    print("10ms, 1 writer", &journaled(every, 1, writes), &floor);
    print("10ms, 8 writers", &journaled(every, 8, writes), &floor);
    print(
        "never, 1 writer",
        &journaled(FsyncPolicy::Never, 1, writes),
        &floor,
    );
    print(
        "never, 8 writers",
        &journaled(FsyncPolicy::Never, 8, writes),
        &floor,
    );
}
