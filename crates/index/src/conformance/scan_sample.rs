//! Scan and sample behaviour.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Value;
use crate::{BlockKey, IndexError, MetaIndex, ScanCursor};

/// Every key of a scan from START with pages of `limit`, with how often each came back.
fn scan_all(
    index: &dyn MetaIndex<Value>,
    limit: usize,
    between_pages: &mut dyn FnMut(usize),
) -> BTreeMap<BlockKey, usize> {
    let mut seen = BTreeMap::new();
    let mut cursor = ScanCursor::START;
    for page_number in 0..1_000_000 {
        let page = index.scan(cursor, limit).expect("scan");
        assert!(
            page.keys.len() <= limit,
            "page of {} > limit {limit}",
            page.keys.len()
        );
        for key in page.keys {
            *seen.entry(key).or_insert(0) += 1;
        }
        match page.next {
            Some(next) => cursor = next,
            None => return seen,
        }
        between_pages(page_number);
    }
    panic!("scan did not finish within a million pages");
}

/// A limit of 0 is refused; pages of any size return every key exactly once.
pub fn check_scan_pages(index: &dyn MetaIndex<Value>) {
    let refused = index.scan(ScanCursor::START, 0);
    assert!(
        matches!(refused, Err(IndexError::InvalidArgument(_))),
        "{refused:?}"
    );
    let empty = index
        .scan(ScanCursor::START, 10)
        .expect("scan of an empty index");
    assert!(empty.keys.is_empty() && empty.next.is_none(), "{empty:?}");

    let keys: Vec<BlockKey> = (-500..500).map(|n| n * 7_919 + (n << 40)).collect();
    index
        .put(keys.iter().map(|&key| (key, 1)).collect())
        .expect("put");
    let expected: BTreeMap<BlockKey, usize> = keys.iter().map(|&key| (key, 1)).collect();
    for limit in [1, 7, 999, 1000, 5000] {
        assert_eq!(
            scan_all(index, limit, &mut |_| {}),
            expected,
            "limit {limit}"
        );
    }
}

/// Keys present for the whole scan come back exactly once while other keys are inserted and
/// deleted between pages and by a concurrent writer.
pub fn check_scan_under_writes<I: MetaIndex<Value> + 'static>(index: I) {
    let index = Arc::new(index);
    let stable: Vec<BlockKey> = (0..2_000).map(|n| n * 1_000_003).collect();
    index
        .put(stable.iter().map(|&key| (key, 1)).collect())
        .expect("put");

    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    let writer = spawn_churn(index.clone(), stop.clone(), writes.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    while writes.load(Ordering::Acquire) == 0 {
        assert!(Instant::now() < deadline, "the churn writer never wrote");
        std::thread::yield_now();
    }

    let seen = scan_all(index.as_ref(), 13, &mut |page| {
        let churn = -1 - page as BlockKey;
        index.put(vec![(churn, 2)]).expect("put between pages");
        index.delete(&[churn + 1]).expect("delete between pages");
    });
    stop.store(true, Ordering::Release);
    writer.join().expect("churn writer");
    for key in &stable {
        assert_eq!(
            seen.get(key),
            Some(&1),
            "stable key {key} must come back exactly once"
        );
    }
}

/// Inserts and deletes keys disjoint from the stable ones until `stop`.
fn spawn_churn<I: MetaIndex<Value> + 'static>(
    index: Arc<I>,
    stop: Arc<AtomicBool>,
    writes: Arc<AtomicU64>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut round: i64 = 0;
        while !stop.load(Ordering::Acquire) {
            let batch: Vec<BlockKey> = (0..16).map(|n| (round * 16 + n) * 1_000_003 + 1).collect();
            index
                .put(batch.iter().map(|&key| (key, 3)).collect())
                .expect("churn put");
            if round > 0 {
                let old: Vec<BlockKey> = batch.iter().map(|key| key - 16 * 1_000_003).collect();
                index.delete(&old).expect("churn delete");
            }
            writes.fetch_add(1, Ordering::Release);
            round = (round + 1) % 1_000;
        }
    })
}

/// Samples are distinct stored keys, `min(count, len)` of them.
pub fn check_sample_sizes(index: &dyn MetaIndex<Value>) {
    assert!(index.sample(5).expect("sample").is_empty(), "empty index");
    let keys: HashSet<BlockKey> = (0..100).map(|n| n * 31 - 1_000).collect();
    index
        .put(keys.iter().map(|&key| (key, 1)).collect())
        .expect("put");
    assert!(index.sample(0).expect("sample").is_empty());
    for count in [1, 10, 100, 1_000] {
        let drawn = index.sample(count).expect("sample");
        let distinct: HashSet<BlockKey> = drawn.iter().copied().collect();
        assert_eq!(drawn.len(), count.min(100), "count {count}");
        assert_eq!(distinct.len(), drawn.len(), "duplicates in {drawn:?}");
        assert!(distinct.is_subset(&keys), "foreign keys in {drawn:?}");
    }
}

/// Each of 40 keys is drawn about equally often (8000 single draws; bounds at ±5.7σ), however
/// the backend spreads them internally.
pub fn check_sample_is_uniform(index: &dyn MetaIndex<Value>) {
    let keys: Vec<BlockKey> = (0..40).collect();
    index
        .put(keys.iter().map(|&key| (key, 1)).collect())
        .expect("put");
    let mut hits: BTreeMap<BlockKey, u32> = BTreeMap::new();
    for _ in 0..8_000 {
        for key in index.sample(1).expect("sample") {
            *hits.entry(key).or_insert(0) += 1;
        }
    }
    for key in keys {
        let count = hits.get(&key).copied().unwrap_or(0);
        assert!(
            (120..=280).contains(&count),
            "key {key} drawn {count} times of 8000: {hits:?}"
        );
    }
}
