//! LocalIndex batch get (16 and 128 keys) and read_modify_write (16 keys) on one core, and a
//! batch get of 16 through a warm `CachedIndex` (every key a hit), each beside its floor
//! measured in the same run: the same batch against a plain single-threaded
//! `std::collections::HashMap`.
//!
//! Criterion measures each side on its own. Because the machine is shared, the printed
//! `RESULT` line comes from a paired measurement instead: rounds of index batches and floor
//! batches interleaved (alternating which goes first), so both sides see the same load; it
//! prints the median time per batch of each, keys/s per core and the median per-round ratio.
//!
//! Run: `cargo bench -p kvcm-index --bench index_ops` (`KVCM_BENCH_KEYS=4096` to measure with
//! an index that fits in the CPU caches; default 1 Mi keys).

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use kvcm_index::{CacheConfig, CachedIndex, LocalIndex, LocalIndexConfig, MetaIndex, Modify};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// A stored entry, shared like the manager's location entries.
type Value = Arc<[u8; 32]>;

/// Keys stored in both the index and the floor map, unless `KVCM_BENCH_KEYS` says otherwise.
const STORED_KEYS: usize = 1 << 20;

/// Rounds of the paired measurement.
const PAIRED_ROUNDS: usize = 101;

/// Keys per side per round of the paired measurement.
const KEYS_PER_ROUND: usize = 32_768;

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
    let config = CacheConfig {
        shard_bits: 8,
        capacity,
    };
    let cached = CachedIndex::new(index, config).expect("cache");
    cached.get(&keys).expect("warm the cache");
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

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Nanoseconds per batch of `batches` calls of `run` from batch number `first`.
fn time_batches(first: usize, batches: usize, run: &mut dyn FnMut(usize)) -> f64 {
    let start = Instant::now();
    for n in first..first + batches {
        run(n);
    }
    start.elapsed().as_nanos() as f64 / batches as f64
}

/// Interleaved rounds of `index` and `floor` over the same batches; prints the RESULT line.
fn paired(
    name: &str,
    batch_size: usize,
    index: &mut dyn FnMut(usize),
    floor: &mut dyn FnMut(usize),
) {
    let per_round = KEYS_PER_ROUND / batch_size;
    let (mut index_ns, mut floor_ns, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..PAIRED_ROUNDS {
        let first = round * per_round;
        let (index_time, floor_time) = if round % 2 == 0 {
            let index_time = time_batches(first, per_round, index);
            (index_time, time_batches(first, per_round, floor))
        } else {
            let floor_time = time_batches(first, per_round, floor);
            (time_batches(first, per_round, index), floor_time)
        };
        index_ns.push(index_time);
        floor_ns.push(floor_time);
        ratios.push(index_time / floor_time);
    }
    let (index_ns, floor_ns) = (median(index_ns), median(floor_ns));
    let keys_per_s = |ns: f64| batch_size as f64 / ns * 1e3;
    println!(
        "RESULT {name}: index {index_ns:.0} ns/batch = {:.1} M keys/s/core; \
         floor HashMap {floor_ns:.0} ns/batch = {:.1} M keys/s; \
         ratio {:.2}x the floor (median of {PAIRED_ROUNDS} interleaved rounds)",
        keys_per_s(index_ns),
        keys_per_s(floor_ns),
        median(ratios)
    );
}

/// Runs criterion on both sides, then the paired measurement.
fn compare(
    c: &mut Criterion,
    name: &str,
    batch_size: usize,
    index: &mut dyn FnMut(usize),
    floor: &mut dyn FnMut(usize),
) {
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(batch_size as u64));
    let mut n = 0;
    group.bench_function("index", |b| {
        b.iter(|| {
            index(n);
            n += 1;
        })
    });
    group.bench_function("floor_hashmap", |b| {
        b.iter(|| {
            floor(n);
            n += 1;
        })
    });
    group.finish();
    paired(name, batch_size, index, floor);
}

fn bench_get(
    c: &mut Criterion,
    fixture: &Fixture,
    batch_size: usize,
    index: &dyn MetaIndex<Value>,
    name: &str,
) {
    let keys = &fixture.keys;
    let mut from_index = |n| {
        black_box(index.get(batch(keys, batch_size, n)).expect("get"));
    };
    let mut from_floor = |n| {
        let values: Vec<Option<Value>> = batch(keys, batch_size, n)
            .iter()
            .map(|k| fixture.floor.get(k).cloned())
            .collect();
        black_box(values);
    };
    compare(c, name, batch_size, &mut from_index, &mut from_floor);
}

fn bench_read_modify_write(c: &mut Criterion, fixture: &mut Fixture, batch_size: usize) {
    let fresh: Value = Arc::new([2; 32]);
    let Fixture {
        keys,
        cached,
        floor,
    } = fixture;
    let index = cached.inner();
    let mut in_index = |n| {
        let mut replace =
            |_, current: Option<&Value>| Modify::Put(current.unwrap_or(&fresh).clone());
        index
            .read_modify_write(batch(keys, batch_size, n), &mut replace)
            .expect("rmw");
    };
    let mut in_floor = |n| {
        for &key in batch(keys, batch_size, n) {
            let value = floor.get(&key).unwrap_or(&fresh).clone();
            floor.insert(key, value);
        }
    };
    let name = format!("read_modify_write_{batch_size}");
    compare(c, &name, batch_size, &mut in_index, &mut in_floor);
}

fn main() {
    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20)
        .configure_from_args();
    let mut fixture = fixture();
    bench_get(
        &mut criterion,
        &fixture,
        16,
        fixture.cached.inner(),
        "get_16",
    );
    bench_get(
        &mut criterion,
        &fixture,
        128,
        fixture.cached.inner(),
        "get_128",
    );
    bench_get(
        &mut criterion,
        &fixture,
        16,
        &fixture.cached,
        "get_16_cached_hits",
    );
    bench_read_modify_write(&mut criterion, &mut fixture, 16);
    criterion.final_summary();
}
