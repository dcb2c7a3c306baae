//! Property test: random operation sequences against a `BTreeMap` model.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use super::Value;
use crate::{BlockKey, MetaIndex, Modify, ScanCursor};

/// One operation of a generated sequence.
#[derive(Debug, Clone)]
enum Op {
    Get(Vec<BlockKey>),
    Put(Vec<(BlockKey, Value)>),
    Delete(Vec<BlockKey>),
    /// Increments odd values, deletes even ones, inserts 1 where absent.
    Rmw(Vec<BlockKey>),
    Scan(usize),
}

/// Keys from a small range so that operations collide, plus a few extreme ones.
fn key() -> impl Strategy<Value = BlockKey> {
    prop_oneof![8 => -20i64..20, 1 => Just(i64::MIN), 1 => Just(i64::MAX)]
}

fn op() -> impl Strategy<Value = Op> {
    let keys = || prop::collection::vec(key(), 0..8);
    prop_oneof![
        keys().prop_map(Op::Get),
        prop::collection::vec((key(), 0u64..100), 0..8).prop_map(Op::Put),
        keys().prop_map(Op::Delete),
        keys().prop_map(Op::Rmw),
        (1usize..6).prop_map(Op::Scan),
    ]
}

fn rmw_rule(current: Option<Value>) -> Option<Value> {
    match current {
        None => Some(1),
        Some(n) if n % 2 == 1 => Some(n + 1),
        Some(_) => None,
    }
}

/// Applies `op` to both the index and the model and compares what they answer.
fn apply(
    index: &dyn MetaIndex<Value>,
    model: &mut BTreeMap<BlockKey, Value>,
    op: Op,
) -> Result<(), TestCaseError> {
    match op {
        Op::Get(keys) => {
            let expected: Vec<Option<Value>> =
                keys.iter().map(|key| model.get(key).copied()).collect();
            prop_assert_eq!(index.get(&keys).expect("get"), expected);
        }
        Op::Put(entries) => {
            model.extend(entries.iter().copied());
            index.put(entries).expect("put");
        }
        Op::Delete(keys) => {
            let present = keys
                .iter()
                .filter(|key| model.contains_key(key))
                .collect::<std::collections::BTreeSet<_>>()
                .len();
            keys.iter().for_each(|key| {
                model.remove(key);
            });
            prop_assert_eq!(index.delete(&keys).expect("delete"), present);
        }
        Op::Rmw(keys) => {
            for key in &keys {
                match rmw_rule(model.get(key).copied()) {
                    Some(value) => model.insert(*key, value),
                    None => model.remove(key),
                };
            }
            index
                .read_modify_write(&keys, &mut |_, current| match rmw_rule(current.copied()) {
                    Some(value) => Modify::Put(value),
                    None => Modify::Delete,
                })
                .expect("rmw");
        }
        Op::Scan(limit) => {
            let mut keys = Vec::new();
            let mut cursor = Some(ScanCursor::START);
            while let Some(at) = cursor {
                let page = index.scan(at, limit).expect("scan");
                keys.extend(page.keys);
                cursor = page.next;
            }
            keys.sort_unstable();
            prop_assert_eq!(keys, model.keys().copied().collect::<Vec<_>>());
        }
    }
    prop_assert_eq!(index.len().expect("len"), model.len() as u64);
    Ok(())
}

/// 64 random sequences of up to 40 operations, each on a fresh index from `make`.
pub fn check_against_btreemap_model<I: MetaIndex<Value>>(make: impl Fn() -> I) {
    let mut runner = TestRunner::new(Config {
        cases: 64,
        ..Config::default()
    });
    let result = runner.run(&prop::collection::vec(op(), 0..40), |ops| {
        let index = make();
        let mut model = BTreeMap::new();
        for op in ops {
            apply(&index, &mut model, op)?;
        }
        Ok(())
    });
    if let Err(failure) = result {
        panic!("the index diverged from the BTreeMap model: {failure}");
    }
}
