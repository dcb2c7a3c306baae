//! Property test: random operation sequences against a `BTreeMap` model, including scans with
//! writes between their pages.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use super::Value;
use crate::{BlockKey, MetaIndex, Modify, ScanCursor};

type Model = BTreeMap<BlockKey, Value>;

/// A write of a generated sequence.
#[derive(Debug, Clone)]
enum Write {
    Put(Vec<(BlockKey, Value)>),
    Delete(Vec<BlockKey>),
    /// Increments odd values, deletes even ones, inserts 1 where absent.
    Rmw(Vec<BlockKey>),
}

/// One operation of a generated sequence.
#[derive(Debug, Clone)]
enum Op {
    Get(Vec<BlockKey>),
    Write(Write),
    Scan(usize),
    /// A scan with pages of `limit` keys and one write after each page.
    ScanDuring(usize, Vec<Write>),
}

/// Keys from a small range so that operations collide, plus a few extreme ones.
fn key() -> impl Strategy<Value = BlockKey> {
    prop_oneof![8 => -20i64..20, 1 => Just(i64::MIN), 1 => Just(i64::MAX)]
}

fn keys() -> impl Strategy<Value = Vec<BlockKey>> {
    prop::collection::vec(key(), 0..8)
}

fn write() -> impl Strategy<Value = Write> {
    prop_oneof![
        prop::collection::vec((key(), 0u64..100), 0..8).prop_map(Write::Put),
        keys().prop_map(Write::Delete),
        keys().prop_map(Write::Rmw),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => keys().prop_map(Op::Get),
        6 => write().prop_map(Op::Write),
        1 => (1usize..6).prop_map(Op::Scan),
        1 => (1usize..4, prop::collection::vec(write(), 0..12))
            .prop_map(|(limit, writes)| Op::ScanDuring(limit, writes)),
    ]
}

fn rmw_rule(current: Option<Value>) -> Option<Value> {
    match current {
        None => Some(1),
        Some(n) if n % 2 == 1 => Some(n + 1),
        Some(_) => None,
    }
}

/// What `write` does to the model; returns how many distinct keys a delete finds.
fn model_write(model: &mut Model, write: &Write) -> usize {
    match write {
        Write::Put(entries) => {
            model.extend(entries.iter().copied());
            0
        }
        Write::Delete(keys) => {
            let present: BTreeSet<&BlockKey> =
                keys.iter().filter(|key| model.contains_key(key)).collect();
            let found = present.len();
            keys.iter().for_each(|key| {
                model.remove(key);
            });
            found
        }
        Write::Rmw(keys) => {
            for key in keys {
                match rmw_rule(model.get(key).copied()) {
                    Some(value) => model.insert(*key, value),
                    None => model.remove(key),
                };
            }
            0
        }
    }
}

/// Applies a write to the index and the model; compares what delete answers.
fn apply_write(
    index: &dyn MetaIndex<Value>,
    model: &mut Model,
    write: Write,
) -> Result<(), TestCaseError> {
    let found = model_write(model, &write);
    match write {
        Write::Put(entries) => index.put(entries).expect("put"),
        Write::Delete(keys) => prop_assert_eq!(index.delete(&keys).expect("delete"), found),
        Write::Rmw(keys) => {
            let mut rule = |_, current: Option<&Value>| match rmw_rule(current.copied()) {
                Some(value) => Modify::Put(value),
                None => Modify::Delete,
            };
            index.read_modify_write(&keys, &mut rule).expect("rmw");
        }
    }
    Ok(())
}

/// Scans with pages of `limit`, applying one of `writes` after each page; returns every key
/// the scan returned (with repeats).
fn scan_with(
    index: &dyn MetaIndex<Value>,
    model: &mut Model,
    limit: usize,
    writes: Vec<Write>,
) -> Result<Vec<BlockKey>, TestCaseError> {
    let mut writes = writes.into_iter();
    let mut returned = Vec::new();
    let mut cursor = Some(ScanCursor::START);
    while let Some(at) = cursor {
        let page = index.scan(at, limit).expect("scan");
        returned.extend(page.keys);
        cursor = page.next;
        if let Some(write) = writes.next() {
            apply_write(index, model, write)?;
        }
    }
    writes.try_for_each(|write| apply_write(index, model, write))?;
    Ok(returned)
}

/// A scan interleaved with writes returns each key present throughout exactly once, and only
/// keys that were present at some point.
fn check_scan_during(
    index: &dyn MetaIndex<Value>,
    model: &mut Model,
    limit: usize,
    writes: Vec<Write>,
) -> Result<(), TestCaseError> {
    let mut always: BTreeSet<BlockKey> = model.keys().copied().collect();
    let mut ever = always.clone();
    let mut replay = model.clone();
    for write in &writes {
        model_write(&mut replay, write);
        always.retain(|key| replay.contains_key(key));
        ever.extend(replay.keys().copied());
    }
    let returned = scan_with(index, model, limit, writes)?;
    let mut times: BTreeMap<BlockKey, usize> = BTreeMap::new();
    for key in returned {
        *times.entry(key).or_insert(0) += 1;
    }
    for key in &always {
        prop_assert_eq!(
            times.get(key).copied(),
            Some(1),
            "key {} present throughout",
            key
        );
    }
    for key in times.keys() {
        prop_assert!(ever.contains(key), "key {} was never stored", key);
    }
    Ok(())
}

/// Applies `op` to both the index and the model and compares what they answer.
fn apply(index: &dyn MetaIndex<Value>, model: &mut Model, op: Op) -> Result<(), TestCaseError> {
    match op {
        Op::Get(keys) => {
            let expected: Vec<Option<Value>> =
                keys.iter().map(|key| model.get(key).copied()).collect();
            prop_assert_eq!(index.get(&keys).expect("get"), expected);
        }
        Op::Write(write) => apply_write(index, model, write)?,
        Op::Scan(limit) => {
            let mut returned = scan_with(index, model, limit, Vec::new())?;
            returned.sort_unstable();
            prop_assert_eq!(returned, model.keys().copied().collect::<Vec<_>>());
        }
        Op::ScanDuring(limit, writes) => check_scan_during(index, model, limit, writes)?,
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
        let mut model = Model::new();
        for op in ops {
            apply(&index, &mut model, op)?;
        }
        Ok(())
    });
    if let Err(failure) = result {
        panic!("the index diverged from the BTreeMap model: {failure}");
    }
}
