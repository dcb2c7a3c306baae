//! Single-threaded behaviour of the batch operations.

use super::Value;
use crate::{IndexError, MetaIndex, Modify};

/// Batches answer in request order (duplicates each time), put replaces, delete counts.
pub fn check_get_put_delete(index: &dyn MetaIndex<Value>) {
    assert!(
        index.is_empty().expect("is_empty"),
        "a fresh index is empty"
    );
    index
        .put(vec![(1, 10), (-1, 20), (i64::MAX, 30), (i64::MIN, 40)])
        .expect("put");
    let got = index.get(&[i64::MIN, 2, 1, -1, 1, i64::MAX]).expect("get");
    assert_eq!(
        got,
        vec![Some(40), None, Some(10), Some(20), Some(10), Some(30)]
    );
    assert_eq!(index.len().expect("len"), 4);

    index
        .put(vec![(1, 11), (5, 50), (5, 51)])
        .expect("put replacing");
    assert_eq!(
        index.get(&[1, 5]).expect("get"),
        vec![Some(11), Some(51)],
        "last put wins"
    );
    assert_eq!(index.len().expect("len"), 5);

    assert_eq!(
        index.delete(&[1, 2, 1, -1]).expect("delete"),
        2,
        "distinct present keys"
    );
    assert_eq!(
        index.get(&[1, -1, 5]).expect("get"),
        vec![None, None, Some(51)]
    );
    assert_eq!(index.len().expect("len"), 3);
    assert!(!index.is_empty().expect("is_empty"));
}

/// Empty batches are accepted and change nothing.
pub fn check_empty_batches(index: &dyn MetaIndex<Value>) {
    index.put(vec![(7, 70)]).expect("put");
    assert_eq!(index.get(&[]).expect("get"), Vec::<Option<Value>>::new());
    index.put(Vec::new()).expect("empty put");
    assert_eq!(index.delete(&[]).expect("empty delete"), 0);
    let mut calls = 0;
    index
        .read_modify_write(&[], &mut |_, _| {
            calls += 1;
            Modify::Delete
        })
        .expect("empty rmw");
    assert_eq!(calls, 0, "no key, no call");
    assert_eq!(index.len().expect("len"), 1);
}

/// `f` runs once per key in request order with the current value; Keep / Put / Delete apply;
/// a key listed twice sees its first modification.
pub fn check_read_modify_write(index: &dyn MetaIndex<Value>) {
    index.put(vec![(1, 1), (2, 2), (3, 3)]).expect("put");
    let mut seen = Vec::new();
    index
        .read_modify_write(&[3, 4, 1, 2, 3], &mut |key, current| {
            seen.push((key, current.copied()));
            match key {
                1 => Modify::Keep,
                2 => Modify::Delete,
                _ => Modify::Put(current.map_or(100, |v| v * 10)),
            }
        })
        .expect("rmw");
    assert_eq!(
        seen,
        vec![
            (3, Some(3)),
            (4, None),
            (1, Some(1)),
            (2, Some(2)),
            (3, Some(30))
        ]
    );
    let got = index.get(&[1, 2, 3, 4]).expect("get");
    assert_eq!(got, vec![Some(1), None, Some(300), Some(100)]);
    assert_eq!(index.len().expect("len"), 3);
}

/// Batches written together apply in order, each seeing the ones before it.
pub fn check_read_modify_write_batches(index: &dyn MetaIndex<Value>) {
    index.put(vec![(1, 1)]).expect("put");
    let batches = [vec![1, 2], vec![2, 3], vec![1]];
    let mut seen = Vec::new();
    index
        .read_modify_write_batches(&batches, &mut |key, current| {
            seen.push((key, current.copied()));
            Modify::Put(current.map_or(10, |v| v + 1))
        })
        .expect("rmw batches");
    let expected = [
        (1, Some(1)),
        (2, None),
        (2, Some(10)),
        (3, None),
        (1, Some(2)),
    ];
    assert_eq!(seen, expected);
    let got = index.get(&[1, 2, 3]).expect("get");
    assert_eq!(got, vec![Some(3), Some(11), Some(10)]);
}

/// `index` was made with a cap of `cap` (≥ 2) keys: writes that would pass it fail with
/// `Full` and change nothing; replacing, deleting and net-neutral writes at the cap succeed.
pub fn check_key_cap(index: &dyn MetaIndex<Value>, cap: u64) {
    assert!(cap >= 2, "the check needs a cap of at least 2");
    let filling: Vec<(i64, Value)> = (0..cap as i64).map(|key| (key, 1)).collect();
    index.put(filling).expect("fill up to the cap");

    let over = index.put(vec![(0, 9), (cap as i64, 9)]);
    assert!(
        matches!(over, Err(IndexError::Full { max }) if max == cap),
        "{over:?}"
    );
    let over = index.read_modify_write(&[1, -5], &mut |_, _| Modify::Put(9));
    assert!(matches!(over, Err(IndexError::Full { .. })), "{over:?}");
    assert_eq!(index.len().expect("len"), cap);
    assert_eq!(
        index.get(&[0, 1, -5, cap as i64]).expect("get"),
        vec![Some(1), Some(1), None, None]
    );

    index.put(vec![(0, 2)]).expect("replacing at the cap");
    index
        .read_modify_write(&[0, -5], &mut |key, _| {
            if key == 0 {
                Modify::Delete
            } else {
                Modify::Put(5)
            }
        })
        .expect("net-neutral rmw at the cap");
    assert_eq!(index.get(&[0, -5]).expect("get"), vec![None, Some(5)]);
    assert_eq!(index.len().expect("len"), cap);
}
