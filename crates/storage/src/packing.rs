//! "Few big files cut into blocks" (§14): how the parts of one allocation are packed into
//! files, shared by the `file` and `hf3fs` backends.
//!
//! Object names are generated per (block, part) and cut into consecutive chunks of
//! `key_count_per_file` (≤ 0 → 1); each chunk is one file. When every part of the instance has
//! the same size the names are ordered part-major (all blocks of part 0, then part 1, ...) and
//! chunked together; otherwise each part is chunked on its own. A file of more than one block
//! is named after its first object plus `_<16 lower-case hex digits>`: XXH3-64 (seed 42) of
//! the chunk's object names joined with `|`.
//!
//! Invariant: a request accepted by [`check_request`] has unique part names and unique keys,
//! so no two (block, part) pairs share an object name, hence a (file, blkid) slot.

use std::collections::HashSet;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::names::{check_name, object_name};
use crate::{AllocationRequest, StorageError};

/// Seed of the chunk-name hash (the reference's).
const CHUNK_HASH_SEED: u64 = 42;

/// One (block, part) pair placed in a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Member {
    /// Index into `AllocationRequest::blocks`.
    pub block: usize,
    /// Position of the part inside the block's `spec_indexes`.
    pub slot: usize,
    /// Index into `AllocationRequest::specs`.
    pub spec: usize,
}

/// One file of an allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PackedFile {
    /// Object path relative to the storage's base (`instance/spec/hex[_hash]`).
    pub name: String,
    /// The members, in block-id order (`blkid` = index in this list).
    pub members: Vec<Member>,
}

fn bad_request(message: String) -> StorageError {
    StorageError::InvalidRequest(message)
}

/// Refuses requests whose names would break URIs or paths, whose parts are unknown, repeated
/// or not ascending, whose sizes are not positive, or whose keys repeat.
pub(crate) fn check_request(request: &AllocationRequest<'_>) -> Result<(), StorageError> {
    check_name("instance_id", request.instance_id).map_err(bad_request)?;
    let mut spec_names = HashSet::new();
    for spec in request.specs {
        check_name("spec name", &spec.name).map_err(bad_request)?;
        if spec.size <= 0 {
            return Err(bad_request(format!(
                "spec {:?} has size {}",
                spec.name, spec.size
            )));
        }
        if !spec_names.insert(spec.name.as_str()) {
            return Err(bad_request(format!("spec name {:?} repeated", spec.name)));
        }
    }
    let mut keys = HashSet::new();
    for block in request.blocks {
        if !keys.insert(block.key) {
            return Err(bad_request(format!("block key {} repeated", block.key)));
        }
        let ascending = block.spec_indexes.windows(2).all(|pair| pair[0] < pair[1]);
        let known = block
            .spec_indexes
            .iter()
            .all(|&spec| spec < request.specs.len());
        if !ascending || !known {
            return Err(bad_request(format!(
                "block {} has spec_indexes {:?}: they must be ascending and below {}",
                block.key,
                block.spec_indexes,
                request.specs.len()
            )));
        }
    }
    Ok(())
}

/// The members carrying part `spec`, in block order.
fn members_of_spec(request: &AllocationRequest<'_>, spec: usize) -> Vec<Member> {
    let blocks = request.blocks.iter().enumerate();
    blocks
        .filter_map(|(block, wanted)| {
            let slot = wanted
                .spec_indexes
                .iter()
                .position(|&index| index == spec)?;
            Some(Member { block, slot, spec })
        })
        .collect()
}

/// Packs a checked request into files of at most `key_count_per_file` members.
pub(crate) fn pack(request: &AllocationRequest<'_>, key_count_per_file: i32) -> Vec<PackedFile> {
    let per_file = usize::try_from(key_count_per_file)
        .ok()
        .filter(|&n| n > 0)
        .unwrap_or(1);
    let uniform = request
        .specs
        .windows(2)
        .all(|pair| pair[0].size == pair[1].size);
    let by_spec = (0..request.specs.len()).map(|spec| members_of_spec(request, spec));
    let sequences: Vec<Vec<Member>> = if uniform {
        vec![by_spec.flatten().collect()]
    } else {
        by_spec.collect()
    };
    let mut files = Vec::new();
    for sequence in sequences {
        for chunk in sequence.chunks(per_file) {
            files.push(PackedFile {
                name: file_name(request, chunk),
                members: chunk.to_vec(),
            });
        }
    }
    files
}

fn member_name(request: &AllocationRequest<'_>, member: Member) -> String {
    let spec_name = &request.specs[member.spec].name;
    object_name(
        request.instance_id,
        spec_name,
        request.blocks[member.block].key,
    )
}

fn file_name(request: &AllocationRequest<'_>, chunk: &[Member]) -> String {
    let names: Vec<String> = chunk
        .iter()
        .map(|&member| member_name(request, member))
        .collect();
    let first = names[0].clone();
    if names.len() == 1 {
        return first;
    }
    let hash = xxh3_64_with_seed(names.join("|").as_bytes(), CHUNK_HASH_SEED);
    format!("{first}_{hash:016x}")
}

#[cfg(test)]
mod tests;
