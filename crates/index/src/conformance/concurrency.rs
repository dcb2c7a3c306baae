//! Concurrency checks: atomic read-modify-write and deadlock freedom.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use super::Value;
use crate::{BlockKey, MetaIndex, Modify, ScanCursor};

const THREADS: usize = 8;
const ROUNDS: usize = 300;
/// How long the threads of one check may take before it counts as a deadlock.
const DEADLINE: Duration = Duration::from_secs(120);

/// Runs `work(thread)` on `THREADS` threads and waits for all, failing after `DEADLINE`.
fn run_threads<I, W>(index: Arc<I>, work: W)
where
    I: MetaIndex<Value> + 'static,
    W: Fn(&I, usize) + Send + Sync + 'static,
{
    let work = Arc::new(work);
    let (done_tx, done_rx) = mpsc::channel();
    for thread in 0..THREADS {
        let (index, work, done_tx) = (index.clone(), work.clone(), done_tx.clone());
        std::thread::spawn(move || {
            work(&index, thread);
            let _ = done_tx.send(thread);
        });
    }
    drop(done_tx);
    for _ in 0..THREADS {
        done_rx
            .recv_timeout(DEADLINE)
            .expect("every thread finishes (a deadlock or a panic otherwise)");
    }
}

/// `THREADS` threads each increment overlapping counters `ROUNDS` times with
/// `read_modify_write`; every increment is counted exactly once.
pub fn check_concurrent_increments<I: MetaIndex<Value> + 'static>(index: I) {
    let counters: Vec<BlockKey> = (0..12).map(|n| n * 0x0101_0101_0101).collect();
    let index = Arc::new(index);
    let keys = counters.clone();
    run_threads(index.clone(), move |index, thread| {
        for round in 0..ROUNDS {
            let start = (thread + round) % keys.len();
            let batch: Vec<BlockKey> = keys.iter().cycle().skip(start).take(5).copied().collect();
            index
                .read_modify_write(&batch, &mut |_, current| {
                    Modify::Put(current.map_or(1, |n| n + 1))
                })
                .expect("increment");
        }
    });
    let total: Value = index
        .get(&counters)
        .expect("get")
        .into_iter()
        .flatten()
        .sum();
    assert_eq!(total, (THREADS * ROUNDS * 5) as Value);
}

/// Batches over the same keys in opposite orders and rotations, interleaved with samples and
/// scans (which may lock many shards), all finish.
pub fn check_opposite_order_batches<I: MetaIndex<Value> + 'static>(index: I) {
    let keys: Vec<BlockKey> = (0..64).map(|n| n * 0x0123_4567_89ab).collect();
    let index = Arc::new(index);
    run_threads(index.clone(), move |index, thread| {
        let mut batch = keys[thread * 4..].to_vec();
        batch.extend_from_slice(&keys[..thread * 4]);
        if thread % 2 == 1 {
            batch.reverse();
        }
        for _ in 0..ROUNDS / 3 {
            index
                .put(batch.iter().map(|&key| (key, thread as Value)).collect())
                .expect("put");
            index
                .read_modify_write(&batch, &mut |_, current| {
                    Modify::Put(current.map_or(0, |n| n + 1))
                })
                .expect("rmw");
            index.get(&batch).expect("get");
            index.sample(8).expect("sample");
            index.scan(ScanCursor::START, 16).expect("scan");
        }
    });
    assert_eq!(index.len().expect("len"), 64);
}
