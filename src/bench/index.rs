//! Local index throughput on one core: batch get and read_modify_write of 16 consecutive
//! keys, beside the same batch get on a plain `HashMap` (the floor).

use std::collections::HashMap;
use std::time::Instant;

use kvcm::manager::{Entry, Location, LocationState, Part, StorageHandle};
use kvcm_index::{LocalIndex, LocalIndexConfig, MetaIndex, Modify};
use kvcm_storage::PartAddress;

const BATCH: usize = 16;
const ROUNDS: usize = 200_000;

/// Measures and prints the index figures.
pub fn run(key_count: usize) {
    let entry = Entry::new(vec![Location {
        storage: StorageHandle(0),
        state: LocationState::Serving,
        nonce: 1,
        parts: vec![Part {
            spec: 0,
            address: PartAddress::default(),
        }],
        checksums: Vec::new(),
    }]);
    let index = match LocalIndex::new(LocalIndexConfig::default()) {
        Ok(index) => index,
        Err(error) => return eprintln!("local index: {error}"),
    };
    let keys: Vec<i64> = (0..key_count as i64).collect();
    for chunk in keys.chunks(4096) {
        let entries = chunk.iter().map(|&k| (k, entry.clone())).collect();
        if let Err(error) = index.put(entries) {
            return eprintln!("filling the index: {error}");
        }
    }
    let map: HashMap<i64, Entry> = keys.iter().map(|&k| (k, entry.clone())).collect();
    let starts: Vec<usize> = (0..ROUNDS)
        .map(|_| fastrand::usize(..key_count.saturating_sub(BATCH).max(1)))
        .collect();

    let floor = per_second(|| {
        for &start in &starts {
            let found = keys[start..start + BATCH]
                .iter()
                .filter(|k| map.contains_key(k))
                .count();
            std::hint::black_box(found);
        }
    });
    let get = per_second(|| {
        for &start in &starts {
            std::hint::black_box(index.get(&keys[start..start + BATCH]).map(|v| v.len()).ok());
        }
    });
    let rmw = per_second(|| {
        for &start in &starts {
            let outcome = index
                .read_modify_write(&keys[start..start + BATCH], &mut |_, current| {
                    current.map_or(Modify::Keep, |e| Modify::Put(e.clone()))
                });
            std::hint::black_box(outcome.ok());
        }
    });
    println!("index ({key_count} keys, batches of {BATCH}, one core)   batches/s      keys/s   vs HashMap");
    for (name, rate) in [
        ("HashMap get (floor)", floor),
        ("LocalIndex get", get),
        ("LocalIndex rmw", rmw),
    ] {
        println!(
            "{name:<38} {rate:>10.0} {:>11.0}   {:>5.2}x",
            rate * BATCH as f64,
            floor / rate
        );
    }
}

/// Batches per second of one pass of `work` over every start.
fn per_second(work: impl FnOnce()) -> f64 {
    let started = Instant::now();
    work();
    ROUNDS as f64 / started.elapsed().as_secs_f64().max(1e-9)
}
