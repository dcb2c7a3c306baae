//! Packing order and request checks.

use super::*;
use crate::test_support::{blocks, specs};
use crate::{BlockSpec, BlockToAllocate};

/// Each file as the list of its (key, spec name) members.
fn layout(request: &AllocationRequest<'_>, per_file: i32) -> Vec<Vec<(i64, String)>> {
    let files = pack(request, per_file);
    let member = |m: &Member| {
        (
            request.blocks[m.block].key,
            request.specs[m.spec].name.clone(),
        )
    };
    files
        .iter()
        .map(|file| file.members.iter().map(member).collect())
        .collect()
}

fn named(pairs: &[(i64, &str)]) -> Vec<(i64, String)> {
    pairs
        .iter()
        .map(|&(key, name)| (key, name.to_string()))
        .collect()
}

#[test]
fn equal_sizes_are_packed_spec_major_across_specs() {
    let (specs, blocks) = (specs(&[64, 64]), blocks(&[1, 2, 3], &[0, 1]));
    let request = AllocationRequest {
        instance_id: "i",
        specs: &specs,
        blocks: &blocks,
    };
    let files = layout(&request, 4);
    assert_eq!(
        files,
        vec![
            named(&[(1, "tp0"), (2, "tp0"), (3, "tp0"), (1, "tp1")]),
            named(&[(2, "tp1"), (3, "tp1")]),
        ]
    );
}

#[test]
fn different_sizes_never_share_a_file() {
    let (specs, blocks) = (specs(&[64, 128]), blocks(&[1, 2, 3], &[0, 1]));
    let request = AllocationRequest {
        instance_id: "i",
        specs: &specs,
        blocks: &blocks,
    };
    let files = layout(&request, 2);
    assert_eq!(
        files,
        vec![
            named(&[(1, "tp0"), (2, "tp0")]),
            named(&[(3, "tp0")]),
            named(&[(1, "tp1"), (2, "tp1")]),
            named(&[(3, "tp1")]),
        ]
    );
}

#[test]
fn blocks_carrying_some_parts_are_packed_with_their_slots() {
    let specs = specs(&[64, 64, 64]);
    let mut blocks = blocks(&[1], &[0, 2]);
    blocks.push(BlockToAllocate {
        key: 2,
        spec_indexes: vec![1],
    });
    let request = AllocationRequest {
        instance_id: "i",
        specs: &specs,
        blocks: &blocks,
    };
    let files = pack(&request, 8);
    assert_eq!(files.len(), 1);
    let slots: Vec<(usize, usize, usize)> = files[0]
        .members
        .iter()
        .map(|m| (m.block, m.slot, m.spec))
        .collect();
    assert_eq!(slots, vec![(0, 0, 0), (1, 0, 1), (0, 1, 2)]);
    assert!(files[0].name.starts_with("i/tp0/1_"), "{}", files[0].name);
    assert_eq!(files[0].name.len(), "i/tp0/1_".len() + 16);
}

#[test]
fn bad_requests_are_refused() {
    let good_specs = specs(&[64, 64]);
    let cases: Vec<(&str, Vec<BlockSpec>, Vec<BlockToAllocate>, &str)> = vec![
        (
            "../x",
            good_specs.clone(),
            blocks(&[1], &[0]),
            "instance_id",
        ),
        ("i", specs(&[64, 0]), blocks(&[1], &[0]), "size 0"),
        (
            "i",
            vec![good_specs[0].clone(), good_specs[0].clone()],
            blocks(&[1], &[0]),
            "repeated",
        ),
        (
            "i",
            good_specs.clone(),
            blocks(&[1, 1], &[0]),
            "key 1 repeated",
        ),
        ("i", good_specs.clone(), blocks(&[1], &[1, 0]), "ascending"),
        ("i", good_specs.clone(), blocks(&[1], &[0, 0]), "ascending"),
        ("i", good_specs.clone(), blocks(&[1], &[2]), "below 2"),
    ];
    let mut bad_name = good_specs.clone();
    bad_name[1].name = "a/b".to_string();
    let mut all = cases;
    all.push(("i", bad_name, blocks(&[1], &[0]), "spec name"));
    for (instance_id, specs, blocks, expected) in all {
        let request = AllocationRequest {
            instance_id,
            specs: &specs,
            blocks: &blocks,
        };
        match check_request(&request) {
            Err(StorageError::InvalidRequest(message)) => {
                assert!(message.contains(expected), "{message:?} lacks {expected:?}")
            }
            other => panic!("{request:?} should be refused, got {other:?}"),
        }
    }
}
