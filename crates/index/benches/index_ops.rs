//! LocalIndex batch get (16 and 128 keys) and read_modify_write (16 keys) on one core, and a
//! batch get of 16 through a warm `CachedIndex` (every key a hit), each beside its floor measured in the same run: the same batch against a plain single-threaded
//! `std::collections::HashMap`. After each group the median time per batch of both, the
//! throughput in keys per second per core and the ratio to the floor are printed.
//!
//! Run: `cargo bench -p kvcm-index --bench index_ops` (`KVCM_BENCH_KEYS=4096` to measure with
//! an index that fits in the CPU caches; default 1 Mi keys).

use std::cell::RefCell;
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Bencher, Criterion, Throughput};
use kvcm_index::{CacheConfig, CachedIndex, LocalIndex, LocalIndexConfig, MetaIndex, Modify};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// A stored entry, shared like the manager's location entries.
type Value = Arc<[u8; 32]>;

/// Keys stored in both the index and the floor map, unless `KVCM_BENCH_KEYS` says otherwise.
const STORED_KEYS: usize = 1 << 20;

fn stored_keys() -> usize {
    let configured = std::env::var("KVCM_BENCH_KEYS")
        .ok()
        .and_then(|n| n.parse().ok());
    configured.filter(|&n| n > 256).unwrap_or(STORED_KEYS)
}

/// The same random keys, stored in a LocalIndex (behind a cache large enough for all of them)
/// and in a HashMap.
struct Fixture {
    keys: Vec<i64>,
    cached: CachedIndex<LocalIndex<Value>, Value>,
    floor: HashMap<i64, Value>,
}

impl Fixture {
    fn index(&self) -> &LocalIndex<Value> {
        self.cached.inner()
    }
}

fn fixture() -> Fixture {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut keys: Vec<i64> = (0..stored_keys()).map(|_| rng.random()).collect();
    keys.shuffle(&mut rng);
    let value: Value = Arc::new([1; 32]);
    let entries: Vec<(i64, Value)> = keys.iter().map(|&key| (key, value.clone())).collect();
    let index = LocalIndex::new(LocalIndexConfig::default()).expect("config");
    for chunk in entries.chunks(4096) {
        index.put(chunk.to_vec()).expect("fill");
    }
    let capacity = keys.len() * 2; // room for uneven shards: every key stays cached
    let cached = CachedIndex::new(
        index,
        CacheConfig {
            shard_bits: 8,
            capacity,
        },
    )
    .expect("cache");
    let floor = entries.into_iter().collect();
    Fixture {
        keys,
        cached,
        floor,
    }
}

/// Batch number `n` of `size` keys: consecutive slices of the shuffled keys.
fn batch(keys: &[i64], size: usize, n: usize) -> &[i64] {
    let start = (n * size) % (keys.len() - size);
    &keys[start..start + size]
}

/// Times `iters` calls of `routine` and records the time per call.
fn timed(bencher: &mut Bencher, record: &RefCell<Vec<f64>>, mut routine: impl FnMut(usize)) {
    bencher.iter_custom(|iters| {
        let start = Instant::now();
        for n in 0..iters as usize {
            routine(n);
        }
        let elapsed = start.elapsed();
        record
            .borrow_mut()
            .push(elapsed.as_nanos() as f64 / iters as f64);
        elapsed
    });
}

fn median(samples: &RefCell<Vec<f64>>) -> f64 {
    let mut samples = samples.borrow().clone();
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied().unwrap_or(f64::NAN)
}

fn report(name: &str, batch_size: usize, local: &RefCell<Vec<f64>>, floor: &RefCell<Vec<f64>>) {
    if local.borrow().is_empty() || floor.borrow().is_empty() {
        return; // filtered out on the command line
    }
    let (local_ns, floor_ns) = (median(local), median(floor));
    let keys_per_s = |ns: f64| batch_size as f64 / ns * 1e3;
    println!(
        "RESULT {name}: index {local_ns:.0} ns/batch = {:.1} M keys/s/core; \
         floor HashMap {floor_ns:.0} ns/batch = {:.1} M keys/s; ratio {:.2}x the floor",
        keys_per_s(local_ns),
        keys_per_s(floor_ns),
        local_ns / floor_ns
    );
}

/// Where a get bench reads from.
#[derive(Clone, Copy)]
enum Reader {
    Local,
    WarmCache,
}

fn bench_get(c: &mut Criterion, fixture: &Fixture, batch_size: usize, reader: Reader) {
    let name = match reader {
        Reader::Local => format!("get_{batch_size}"),
        Reader::WarmCache => format!("get_{batch_size}_cached_hits"),
    };
    let index: &dyn MetaIndex<Value> = match reader {
        Reader::Local => fixture.index(),
        Reader::WarmCache => {
            fixture.cached.get(&fixture.keys).expect("warm the cache");
            &fixture.cached
        }
    };
    let (local, floor) = (RefCell::new(Vec::new()), RefCell::new(Vec::new()));
    let mut group = c.benchmark_group(&name);
    group.throughput(Throughput::Elements(batch_size as u64));
    group.bench_function("local_index", |b| {
        timed(b, &local, |n| {
            black_box(index.get(batch(&fixture.keys, batch_size, n)).expect("get"));
        })
    });
    group.bench_function("floor_hashmap", |b| {
        timed(b, &floor, |n| {
            let keys = batch(&fixture.keys, batch_size, n);
            let values: Vec<Option<Value>> =
                keys.iter().map(|k| fixture.floor.get(k).cloned()).collect();
            black_box(values);
        })
    });
    group.finish();
    report(&name, batch_size, &local, &floor);
}

fn bench_read_modify_write(c: &mut Criterion, fixture: &mut Fixture, batch_size: usize) {
    let name = format!("read_modify_write_{batch_size}");
    let (local, floor) = (RefCell::new(Vec::new()), RefCell::new(Vec::new()));
    let fresh: Value = Arc::new([2; 32]);
    let mut group = c.benchmark_group(&name);
    group.throughput(Throughput::Elements(batch_size as u64));
    group.bench_function("local_index", |b| {
        timed(b, &local, |n| {
            let keys = batch(&fixture.keys, batch_size, n);
            let mut replace =
                |_, current: Option<&Value>| Modify::Put(current.unwrap_or(&fresh).clone());
            fixture
                .index()
                .read_modify_write(keys, &mut replace)
                .expect("rmw");
        })
    });
    let Fixture {
        keys, floor: map, ..
    } = fixture;
    group.bench_function("floor_hashmap", |b| {
        timed(b, &floor, |n| {
            for &key in batch(keys, batch_size, n) {
                let value = map.get(&key).unwrap_or(&fresh).clone();
                map.insert(key, value);
            }
        })
    });
    group.finish();
    report(&name, batch_size, &local, &floor);
}

fn main() {
    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30)
        .configure_from_args();
    let mut fixture = fixture();
    bench_get(&mut criterion, &fixture, 16, Reader::Local);
    bench_get(&mut criterion, &fixture, 128, Reader::Local);
    bench_get(&mut criterion, &fixture, 16, Reader::WarmCache);
    bench_read_modify_write(&mut criterion, &mut fixture, 16);
    criterion.final_summary();
}
