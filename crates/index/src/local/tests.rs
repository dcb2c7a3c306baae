//! Tests specific to the local backend (the shared behaviour is in the conformance suite).

use super::*;

fn index(shard_bits: u32, max_key_count: u64) -> LocalIndex<u64> {
    LocalIndex::new(LocalIndexConfig {
        shard_bits,
        max_key_count,
    })
    .expect("valid config")
}

#[test]
fn too_many_shard_bits_is_rejected() {
    let config = LocalIndexConfig {
        shard_bits: MAX_SHARD_BITS + 1,
        max_key_count: 10,
    };
    let err = LocalIndex::<u64>::new(config).expect_err("17 bits must be refused");
    assert!(matches!(err, IndexError::InvalidArgument(ref m) if m.contains("shard_bits")));
}

#[test]
fn zero_shard_bits_means_one_shard() {
    let index = index(0, u64::MAX);
    index.put(vec![(1, 10), (-1, 20)]).expect("put");
    assert_eq!(
        index.get(&[-1, 1, 2]).expect("get"),
        vec![Some(20), Some(10), None]
    );
    let page = index.scan(ScanCursor::START, 10).expect("scan");
    assert_eq!(page.keys.len(), 2);
    assert_eq!(page.next, None);
}

#[test]
fn put_over_the_cap_changes_nothing() {
    let index = index(4, 3);
    index.put(vec![(1, 1), (2, 2)]).expect("put");
    let err = index
        .put(vec![(3, 3), (1, 100), (4, 4)])
        .expect_err("4 keys > cap 3");
    assert!(matches!(err, IndexError::Full { max: 3 }));
    assert_eq!(index.len().expect("len"), 2);
    assert_eq!(
        index.get(&[1, 3, 4]).expect("get"),
        vec![Some(1), None, None]
    );
    // Replacing and deleting while at the cap is fine; so is a batch whose net growth fits.
    index
        .put(vec![(3, 3), (1, 100)])
        .expect("reaches the cap exactly");
    index
        .read_modify_write(&[1, 5], &mut |key, _| {
            if key == 1 {
                Modify::Delete
            } else {
                Modify::Put(5)
            }
        })
        .expect("net growth zero");
    assert_eq!(index.len().expect("len"), 3);
    assert_eq!(index.get(&[1, 5]).expect("get"), vec![None, Some(5)]);
}

#[test]
fn rmw_sees_earlier_calls_of_the_same_batch() {
    let index = index(2, u64::MAX);
    let mut seen = Vec::new();
    index
        .read_modify_write(&[9, 9, 9], &mut |_, current| {
            seen.push(current.copied());
            Modify::Put(current.map_or(1, |n| n + 1))
        })
        .expect("rmw");
    assert_eq!(seen, vec![None, Some(1), Some(2)]);
    assert_eq!(index.get(&[9]).expect("get"), vec![Some(3)]);
    assert_eq!(index.len().expect("len"), 1);
}

#[test]
fn delete_counts_distinct_present_keys() {
    let index = index(3, u64::MAX);
    index.put(vec![(1, 1), (2, 2)]).expect("put");
    assert_eq!(index.delete(&[1, 1, 3]).expect("delete"), 1);
    assert_eq!(index.len().expect("len"), 1);
}

#[test]
fn a_panicking_closure_leaves_the_index_usable_and_unchanged() {
    let index = std::sync::Arc::new(index(2, u64::MAX));
    index.put(vec![(1, 1)]).expect("put");
    let clone = index.clone();
    let result = std::thread::spawn(move || {
        clone.read_modify_write(&[1, 2], &mut |key, _| {
            assert_ne!(key, 2, "closure panics on purpose");
            Modify::Put(7)
        })
    })
    .join();
    assert!(result.is_err(), "the closure panicked");
    assert_eq!(index.get(&[1, 2]).expect("get"), vec![Some(1), None]);
    index.put(vec![(2, 2)]).expect("put after poison");
    assert_eq!(index.len().expect("len"), 2);
}

#[test]
fn reads_of_other_shards_do_not_wait_for_a_running_write() {
    use std::sync::mpsc;
    use std::time::Duration;
    let index = std::sync::Arc::new(index(8, u64::MAX));
    let (held, other) = (1, 2);
    let shard = |key| key_order::shard_of(position_of(key), 8);
    assert_ne!(
        shard(held),
        shard(other),
        "the test needs keys of two shards"
    );
    index.put(vec![(other, 2)]).expect("put");

    let (inside_tx, inside_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let writer_index = index.clone();
    let writer = std::thread::spawn(move || {
        writer_index.read_modify_write(&[held], &mut |_, _| {
            inside_tx.send(()).expect("signal");
            let _ = release_rx.recv_timeout(Duration::from_secs(30));
            Modify::Put(1)
        })
    });
    inside_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("writer holds its shard");

    let (read_tx, read_rx) = mpsc::channel();
    let reader_index = index.clone();
    std::thread::spawn(move || {
        let values = reader_index.get(&[other]).expect("get");
        let _ = read_tx.send((values, reader_index.len().expect("len")));
    });
    let read = read_rx.recv_timeout(Duration::from_secs(30));
    let _ = release_tx.send(());
    writer.join().expect("writer").expect("rmw");
    assert_eq!(
        read.expect("the read finished while the write ran"),
        (vec![Some(2)], 1)
    );
    assert_eq!(index.get(&[held]).expect("get"), vec![Some(1)]);
}

/// One logged batch: per key its new value.
type LoggedBatch = Vec<(BlockKey, Option<u64>)>;

/// A change log that records every batch and can be told to refuse.
#[derive(Default)]
struct RecordingLog {
    batches: std::sync::Mutex<Vec<LoggedBatch>>,
    refuse: std::sync::atomic::AtomicBool,
    /// Waits fail (a sync the disk refused).
    refuse_waits: std::sync::atomic::AtomicBool,
    waited: std::sync::Mutex<Vec<LogTicket>>,
}

impl ChangeLog<u64> for RecordingLog {
    fn append(&self, changes: &[crate::Change<'_, u64>]) -> Result<LogTicket, IndexError> {
        if self.refuse.load(Ordering::SeqCst) {
            return Err(IndexError::Backend("disk full".into()));
        }
        let mut batches = self.batches.lock().unwrap();
        batches.push(changes.iter().map(|(k, v)| (*k, v.copied())).collect());
        Ok(LogTicket(batches.len() as u64))
    }

    fn wait_durable(&self, ticket: LogTicket) -> Result<(), IndexError> {
        self.waited.lock().unwrap().push(ticket);
        if self.refuse_waits.load(Ordering::SeqCst) {
            return Err(IndexError::Backend("fdatasync failed".into()));
        }
        Ok(())
    }
}

#[test]
fn every_changing_batch_is_logged_once_and_a_refused_append_changes_nothing() {
    let log = Arc::new(RecordingLog::default());
    let index = LocalIndex::with_log(LocalIndexConfig::default(), log.clone()).unwrap();
    index.put(vec![(1, 10), (2, 20)]).unwrap();
    index.delete(&[2, 3]).unwrap();
    index
        .read_modify_write(&[1, 1], &mut |_, v| match v {
            Some(&v) => Modify::Put(v + 1),
            None => Modify::Keep,
        })
        .unwrap();
    index
        .read_modify_write(&[1], &mut |_, _| Modify::Keep)
        .unwrap();
    assert_eq!(
        *log.batches.lock().unwrap(),
        vec![
            vec![(1, Some(10)), (2, Some(20))],
            vec![(2, None), (3, None)],
            vec![(1, Some(12))],
        ],
        "one record per key per batch, the last value; a batch that keeps all is not logged"
    );
    assert_eq!(
        *log.waited.lock().unwrap(),
        [LogTicket(1), LogTicket(2), LogTicket(3)]
    );
    log.refuse.store(true, Ordering::SeqCst);
    assert!(matches!(
        index.put(vec![(7, 70), (1, 0)]),
        Err(IndexError::Backend(_))
    ));
    assert_eq!(
        index.get(&[7, 1]).unwrap(),
        [None, Some(12)],
        "nothing changed"
    );
    assert_eq!(index.len().unwrap(), 1, "the key count is restored");
}

#[test]
fn batches_written_together_wait_for_the_log_once_and_a_failing_one_stops_the_rest() {
    let log = Arc::new(RecordingLog::default());
    let config = LocalIndexConfig {
        max_key_count: 4,
        ..LocalIndexConfig::default()
    };
    let index = LocalIndex::with_log(config, log.clone()).unwrap();
    let batches = [vec![1, 2], vec![3], vec![3]];
    let mut add_one = |_, v: Option<&u64>| Modify::Put(v.map_or(1, |v| v + 1));
    index
        .read_modify_write_batches(&batches, &mut add_one)
        .unwrap();
    assert_eq!(log.batches.lock().unwrap().len(), 3, "one record per batch");
    assert_eq!(
        *log.waited.lock().unwrap(),
        [LogTicket(3)],
        "one wait, for the last record"
    );
    assert_eq!(index.get(&[1, 2, 3]).unwrap(), [Some(1), Some(1), Some(2)]);

    // The second batch passes the key cap: the first stays applied (and waited for), the
    // third is not run.
    let batches = [vec![4], vec![5, 6], vec![1]];
    let result = index.read_modify_write_batches(&batches, &mut add_one);
    assert!(
        matches!(
            result,
            Err(BatchesStopped {
                applied: 1,
                durable: true,
                error: IndexError::Full { max: 4 }
            })
        ),
        "{result:?}"
    );
    assert_eq!(
        index.get(&[4, 5, 6, 1]).unwrap(),
        [Some(1), None, None, Some(1)]
    );
    assert_eq!(*log.waited.lock().unwrap(), [LogTicket(3), LogTicket(4)]);

    // The wait fails: every batch is applied in memory, none is durable.
    log.refuse_waits.store(true, Ordering::SeqCst);
    let result = index.read_modify_write_batches(&[vec![1], vec![2]], &mut add_one);
    assert!(
        matches!(
            result,
            Err(BatchesStopped {
                applied: 2,
                durable: false,
                error: IndexError::Backend(_)
            })
        ),
        "{result:?}"
    );
}
