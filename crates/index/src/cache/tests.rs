//! Cache-specific behaviour (the shared behaviour is in the conformance suite).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use super::*;
use crate::{LocalIndex, LocalIndexConfig};

fn cached(capacity: usize) -> CachedIndex<LocalIndex<u64>, u64> {
    let inner = LocalIndex::new(LocalIndexConfig::default()).expect("inner");
    CachedIndex::new(
        inner,
        CacheConfig {
            shard_bits: 2,
            capacity,
        },
    )
    .expect("cache")
}

#[test]
fn too_many_shard_bits_is_rejected() {
    let inner = LocalIndex::<u64>::new(LocalIndexConfig::default()).expect("inner");
    let config = CacheConfig {
        shard_bits: MAX_SHARD_BITS + 1,
        capacity: 1,
    };
    let err = CachedIndex::<_, u64>::new(inner, config).expect_err("refused");
    assert!(matches!(err, IndexError::InvalidArgument(ref m) if m.contains("shard_bits")));
}

#[test]
fn repeated_gets_hit_the_cache_including_absent_keys() {
    let index = cached(100);
    index.put(vec![(1, 10)]).expect("put");
    assert_eq!(index.get(&[1, 2]).expect("get"), vec![Some(10), None]);
    assert_eq!(index.stats(), CacheStats { hits: 0, misses: 2 });
    assert_eq!(index.get(&[2, 1]).expect("get"), vec![None, Some(10)]);
    assert_eq!(index.stats(), CacheStats { hits: 2, misses: 2 });
}

#[test]
fn every_write_through_the_cache_invalidates_its_keys() {
    let index = cached(100);
    index.put(vec![(1, 10), (2, 20)]).expect("put");
    index.get(&[1, 2, 3]).expect("warm");
    index.put(vec![(1, 11), (3, 30)]).expect("put");
    assert_eq!(
        index.get(&[1, 2, 3]).expect("get"),
        vec![Some(11), Some(20), Some(30)]
    );
    index.delete(&[2]).expect("delete");
    assert_eq!(index.get(&[2]).expect("get"), vec![None]);
    index
        .read_modify_write(&[3], &mut |_, v| Modify::Put(v.map_or(0, |n| n + 1)))
        .expect("rmw");
    assert_eq!(index.get(&[3]).expect("get"), vec![Some(31)]);
}

#[test]
fn capacity_bounds_what_is_cached() {
    let index = cached(4);
    let keys: Vec<BlockKey> = (0..64).collect();
    index.get(&keys).expect("first pass");
    index.get(&keys).expect("second pass");
    let stats = index.stats();
    assert_eq!(stats.misses + stats.hits, 128);
    assert!(
        stats.hits <= 4,
        "at most 4 entries can be cached: {stats:?}"
    );
}

#[test]
fn failed_writes_still_invalidate() {
    let inner = LocalIndex::new(LocalIndexConfig {
        shard_bits: 2,
        max_key_count: 1,
    })
    .expect("inner");
    let index = CachedIndex::new(
        inner,
        CacheConfig {
            shard_bits: 1,
            capacity: 8,
        },
    )
    .expect("cache");
    index.put(vec![(1, 1)]).expect("put");
    index.get(&[1, 2]).expect("warm");
    assert!(matches!(
        index.put(vec![(1, 5), (2, 2)]),
        Err(IndexError::Full { max: 1 })
    ));
    assert_eq!(index.get(&[1, 2]).expect("get"), vec![Some(1), None]);
    assert_eq!(
        index.stats().misses,
        4,
        "the failed write dropped both keys"
    );
}

/// Readers racing a writer must never leave a stale value in the cache.
#[test]
fn no_stale_value_survives_concurrent_reads_and_writes() {
    let index = Arc::new(cached(1_000));
    let keys: Vec<BlockKey> = (0..8).collect();
    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (index, keys, done) = (index.clone(), keys.clone(), done.clone());
            std::thread::spawn(move || {
                while !done.load(Ordering::Acquire) {
                    index.get(&keys).expect("get");
                }
            })
        })
        .collect();
    for round in 1..=5_000 {
        index
            .read_modify_write(&keys, &mut |_, v| Modify::Put(v.map_or(1, |n| n + 1)))
            .expect("rmw");
        let seen = index.get(&keys).expect("get after the write");
        assert_eq!(
            seen,
            vec![Some(round); 8],
            "a read after write {round} saw a stale value"
        );
    }
    done.store(true, Ordering::Release);
    readers
        .into_iter()
        .for_each(|reader| reader.join().expect("reader"));
    let truth = index.inner().get(&keys).expect("inner get");
    assert_eq!(truth, vec![Some(5_000); 8]);
    assert_eq!(index.get(&keys).expect("cached get"), truth);
}

/// One pause in a [`GatedIndex`] call: tells the test it was reached, waits to be released.
struct Gate {
    reached: mpsc::Sender<()>,
    proceed: mpsc::Receiver<()>,
}

/// A gate, the receiver that hears it reached, and the sender that releases it.
fn gate() -> (Gate, mpsc::Receiver<()>, mpsc::Sender<()>) {
    let (reached, heard) = mpsc::channel();
    let (release, proceed) = mpsc::channel();
    (Gate { reached, proceed }, heard, release)
}

/// A local index whose next `get` (after reading) and next `put` (before and after
/// committing) can each be held at a gate, to replay one interleaving exactly.
struct GatedIndex {
    inner: LocalIndex<u64>,
    get_read: Mutex<Option<Gate>>,
    put_start: Mutex<Option<Gate>>,
    put_committed: Mutex<Option<Gate>>,
}

impl GatedIndex {
    fn new() -> Self {
        Self {
            inner: LocalIndex::new(LocalIndexConfig::default()).expect("inner"),
            get_read: Mutex::default(),
            put_start: Mutex::default(),
            put_committed: Mutex::default(),
        }
    }

    fn pass(slot: &Mutex<Option<Gate>>) {
        let taken = slot.lock().expect("gate slot").take();
        if let Some(gate) = taken {
            gate.reached.send(()).expect("test listens");
            gate.proceed.recv().expect("test releases");
        }
    }

    fn arm(slot: &Mutex<Option<Gate>>) -> (mpsc::Receiver<()>, mpsc::Sender<()>) {
        let (gate, heard, release) = gate();
        *slot.lock().expect("gate slot") = Some(gate);
        (heard, release)
    }
}

impl MetaIndex<u64> for GatedIndex {
    fn get(&self, keys: &[BlockKey]) -> Result<Vec<Option<u64>>, IndexError> {
        let values = self.inner.get(keys);
        Self::pass(&self.get_read);
        values
    }

    fn put(&self, entries: Vec<(BlockKey, u64)>) -> Result<(), IndexError> {
        Self::pass(&self.put_start);
        let result = self.inner.put(entries);
        Self::pass(&self.put_committed);
        result
    }

    fn delete(&self, keys: &[BlockKey]) -> Result<usize, IndexError> {
        self.inner.delete(keys)
    }

    fn read_modify_write(
        &self,
        keys: &[BlockKey],
        f: &mut dyn FnMut(BlockKey, Option<&u64>) -> Modify<u64>,
    ) -> Result<(), IndexError> {
        self.inner.read_modify_write(keys, f)
    }

    fn scan(&self, cursor: ScanCursor, limit: usize) -> Result<ScanPage, IndexError> {
        self.inner.scan(cursor, limit)
    }

    fn sample(&self, count: usize) -> Result<Vec<BlockKey>, IndexError> {
        self.inner.sample(count)
    }

    fn len(&self) -> Result<u64, IndexError> {
        self.inner.len()
    }
}

/// While a write is in flight, once one reader has seen the new value no later reader may
/// see the old one — even when a reader that read the old value fills the cache late.
#[test]
fn no_reader_sees_the_old_value_after_one_saw_the_new() {
    let config = CacheConfig {
        shard_bits: 0,
        capacity: 8,
    };
    let index = CachedIndex::new(GatedIndex::new(), config).expect("cache");
    index.put(vec![(1, 10)]).expect("put the old value");
    let gates = index.inner();
    std::thread::scope(|scope| {
        // Armed inside the scope: a failed assertion drops the senders, which frees the
        // gated threads instead of leaving the scope waiting for them.
        let (put_started, start_put) = GatedIndex::arm(&gates.put_start);
        let (put_committed, finish_put) = GatedIndex::arm(&gates.put_committed);
        let writer = scope.spawn(|| index.put(vec![(1, 11)]));
        put_started.recv().expect("the write began");
        let (old_read, finish_old_read) = GatedIndex::arm(&gates.get_read);
        let slow_reader = scope.spawn(|| index.get(&[1]));
        old_read.recv().expect("the slow reader read the old value");
        start_put.send(()).expect("commit");
        put_committed.recv().expect("the write committed");

        assert_eq!(index.get(&[1]).expect("get"), vec![Some(11)], "new");
        finish_old_read.send(()).expect("let the slow reader fill");
        let slow = slow_reader.join().expect("slow reader").expect("get");
        assert_eq!(slow, vec![Some(10)], "it read before the commit");
        assert_eq!(
            index.get(&[1]).expect("get"),
            vec![Some(11)],
            "a later reader saw the old value again"
        );
        finish_put.send(()).expect("finish the write");
        writer.join().expect("writer").expect("put");
    });
    assert_eq!(index.get(&[1]).expect("get"), vec![Some(11)]);
}
