//! Replay speed on the Mooncake fixture: the 7-capacity sweep of every policy, the one-pass
//! LRU curve, and the floor — a minimal direct LRU replay (HashMap + linked list over the
//! raw hash ids) — measured in the same run. After criterion's report, prints accesses/s per
//! policy and every figure's ratio to the floor.
//!
//! Run: `cargo bench -p kvcm-optimizer --bench replay`.

use std::collections::HashMap;
use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use kvcm_optimizer::model::Workload;
use kvcm_optimizer::policy::PolicyKind;
use kvcm_optimizer::sim::{replay, Config, LruCurve};
use kvcm_optimizer::trace::TraceReader;

const PERCENTS: [usize; 7] = [5, 10, 20, 40, 60, 80, 100];

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/data/mooncake_synthetic_trace.jsonl")
}

/// The floor: the simplest correct LRU prefix replay, over raw keys.
struct FloorLru {
    capacity: usize,
    slots: HashMap<u64, usize>,
    /// (key, newer, older) per slot; slot 0 is the list's sentinel.
    nodes: Vec<(u64, usize, usize)>,
    free: Vec<usize>,
}

impl FloorLru {
    fn new(capacity: usize) -> Self {
        FloorLru {
            capacity,
            slots: HashMap::new(),
            nodes: vec![(0, 0, 0)],
            free: Vec::new(),
        }
    }

    fn unlink(&mut self, slot: usize) {
        let (_, newer, older) = self.nodes[slot];
        self.nodes[newer].2 = older;
        self.nodes[older].1 = newer;
    }

    fn push_newest(&mut self, slot: usize) {
        let newest = self.nodes[0].2;
        self.nodes[slot].1 = 0;
        self.nodes[slot].2 = newest;
        self.nodes[newest].1 = slot;
        self.nodes[0].2 = slot;
    }

    fn access(&mut self, key: u64) {
        if let Some(&slot) = self.slots.get(&key) {
            self.unlink(slot);
            self.push_newest(slot);
            return;
        }
        let slot = self.free.pop().unwrap_or_else(|| {
            self.nodes.push((0, 0, 0));
            self.nodes.len() - 1
        });
        self.nodes[slot].0 = key;
        self.slots.insert(key, slot);
        self.push_newest(slot);
        if self.slots.len() > self.capacity {
            let oldest = self.nodes[0].1;
            self.unlink(oldest);
            self.slots.remove(&self.nodes[oldest].0);
            self.free.push(oldest);
        }
    }

    /// Prefix-hit blocks over all requests.
    fn replay(capacity: usize, requests: &[Vec<u64>]) -> u64 {
        let mut cache = FloorLru::new(capacity);
        let mut hits = 0;
        for blocks in requests {
            hits += blocks
                .iter()
                .take_while(|k| cache.slots.contains_key(k))
                .count() as u64;
            for &key in blocks {
                cache.access(key);
            }
        }
        hits
    }
}

struct Setup {
    workload: Workload,
    raw: Vec<Vec<u64>>,
    capacities: Vec<usize>,
}

fn setup() -> Setup {
    let path = fixture();
    let workload = Workload::load(std::slice::from_ref(&path), None, None).expect("fixture");
    let raw = TraceReader::open(&path, None)
        .expect("fixture")
        .map(|r| r.expect("fixture").blocks)
        .collect();
    let capacities = PERCENTS
        .iter()
        .map(|p| workload.unique_blocks() * p / 100)
        .collect();
    Setup {
        workload,
        raw,
        capacities,
    }
}

fn floor_sweep(setup: &Setup) -> u64 {
    setup
        .capacities
        .iter()
        .map(|&c| FloorLru::replay(c, &setup.raw))
        .sum()
}

fn policy_sweep(setup: &Setup, policy: PolicyKind) -> u64 {
    setup
        .capacities
        .iter()
        .map(|&c| replay(&setup.workload, &Config::single(policy, c), 1).hit_blocks)
        .sum()
}

fn curve_sweep(setup: &Setup) -> u64 {
    let curve = LruCurve::compute(&setup.workload);
    setup.capacities.iter().map(|&c| curve.hit_blocks(c)).sum()
}

fn benches(c: &mut Criterion, setup: &Setup) {
    let accesses = (setup.workload.total_accesses() * PERCENTS.len()) as u64;
    let mut group = c.benchmark_group("sweep7");
    group.throughput(Throughput::Elements(accesses));
    group.sample_size(10);
    group.bench_function("floor_lru", |b| b.iter(|| black_box(floor_sweep(setup))));
    group.bench_function("lru_curve_one_pass", |b| {
        b.iter(|| black_box(curve_sweep(setup)))
    });
    for policy in PolicyKind::ALL {
        group.bench_function(policy.name(), |b| {
            b.iter(|| black_box(policy_sweep(setup, policy)))
        });
    }
    group.finish();
}

/// Median wall time of `runs` calls.
fn median_time(runs: usize, mut f: impl FnMut() -> u64) -> Duration {
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            black_box(f());
            start.elapsed()
        })
        .collect();
    times.sort();
    times[runs / 2]
}

fn print_ratios(setup: &Setup) {
    let lru_hits = policy_sweep(setup, PolicyKind::Lru);
    assert_eq!(floor_sweep(setup), lru_hits, "floor and LRU disagree");
    assert_eq!(curve_sweep(setup), lru_hits, "curve and LRU disagree");
    let accesses = (setup.workload.total_accesses() * PERCENTS.len()) as f64;
    let floor = median_time(11, || floor_sweep(setup));
    println!("\n7-capacity sweep on the fixture ({accesses} accesses per sweep, one thread)");
    println!(
        "{:<20} {:>10} {:>14} {:>16}",
        "what", "ms", "Maccesses/s", "ratio to floor"
    );
    let row = |name: &str, time: Duration| {
        println!(
            "{:<20} {:>10.2} {:>14.1} {:>16.2}",
            name,
            time.as_secs_f64() * 1e3,
            accesses / time.as_secs_f64() / 1e6,
            time.as_secs_f64() / floor.as_secs_f64()
        );
    };
    row("floor (direct LRU)", floor);
    row(
        "lru curve, one pass",
        median_time(11, || curve_sweep(setup)),
    );
    for policy in PolicyKind::ALL {
        row(
            policy.name(),
            median_time(5, || policy_sweep(setup, policy)),
        );
    }
}

fn main() {
    let setup = setup();
    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    benches(&mut criterion, &setup);
    criterion.final_summary();
    print_ratios(&setup);
}
