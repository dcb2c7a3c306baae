//! [`Workload`]: a trace compiled for replay — requests as ranges of block ids, the parent of
//! every block, and for every access the position of the next access to the same block.
//!
//! Invariants: `starts` is non-decreasing, starts with 0 and ends with `accesses.len()`;
//! every block id in `accesses` is `< unique_blocks()`; `next_use[i] > i` or `NEVER`.

use std::ops::Range;
use std::path::PathBuf;

use super::PrefixTree;
use crate::policy::BlockId;
use crate::trace::{expand_paths, Request, TraceError, TraceFormat, TraceReader};

/// Marks an access whose block is never accessed again.
pub const NEVER: u32 = u32::MAX;

/// A trace compiled for replay.
#[derive(Debug)]
pub struct Workload {
    block_tokens: u32,
    instances: usize,
    starts: Vec<usize>,
    accesses: Vec<BlockId>,
    next_use: Vec<u32>,
    parents: Vec<Option<BlockId>>,
    input_tokens: Vec<u64>,
    timestamps_us: Vec<u64>,
}

impl Workload {
    /// Reads the trace files in order and compiles them; a directory stands for the rotated
    /// event log in it. `block_tokens` overrides what the trace declares or its format implies;
    /// without it, every file must imply the same block size
    /// ([`TraceError::BlockTokensMismatch`] names the first that does not).
    pub fn load(
        paths: &[PathBuf],
        format: Option<TraceFormat>,
        block_tokens: Option<u32>,
    ) -> Result<Workload, TraceError> {
        let mut builder = Builder::default();
        let mut implied_block_tokens = None;
        for path in &expand_paths(paths)? {
            let mut reader = TraceReader::open(path, format)?;
            for request in reader.by_ref() {
                builder
                    .push(&request?)
                    .ok_or_else(|| TraceError::TooLarge { path: path.clone() })?;
            }
            let implied = reader
                .declared_block_tokens()
                .unwrap_or(reader.format().default_block_tokens());
            match implied_block_tokens {
                Some(expected) if expected != implied && block_tokens.is_none() => {
                    return Err(TraceError::BlockTokensMismatch {
                        path: path.clone(),
                        found: implied,
                        expected,
                    });
                }
                _ => {
                    implied_block_tokens.get_or_insert(implied);
                }
            }
        }
        Ok(builder.finish(block_tokens.or(implied_block_tokens).unwrap_or(16)))
    }

    /// Compiles in-memory requests (tests, benchmarks, generated traces). `None` when the
    /// requests hold more than `u32::MAX - 1` block accesses.
    pub fn from_requests<'a>(
        requests: impl IntoIterator<Item = &'a Request>,
        block_tokens: u32,
    ) -> Option<Workload> {
        let mut builder = Builder::default();
        for request in requests {
            builder.push(request)?;
        }
        Some(builder.finish(block_tokens))
    }

    /// Tokens per block.
    pub fn block_tokens(&self) -> u32 {
        self.block_tokens
    }

    /// Number of instances in the trace.
    pub fn instances(&self) -> usize {
        self.instances
    }

    /// Number of requests.
    pub fn requests(&self) -> usize {
        self.starts.len() - 1
    }

    /// Total block accesses (sum of request lengths).
    pub fn total_accesses(&self) -> usize {
        self.accesses.len()
    }

    /// Number of distinct blocks (prefix-tree nodes); the infinite-cache size.
    pub fn unique_blocks(&self) -> usize {
        self.parents.len()
    }

    /// Positions in the access sequence of request `request`'s blocks.
    pub fn request_range(&self, request: usize) -> Range<usize> {
        self.starts[request]..self.starts[request + 1]
    }

    /// Block ids of all accesses, request after request.
    pub fn accesses(&self) -> &[BlockId] {
        &self.accesses
    }

    /// Position of the next access to the block accessed at `position`, or [`NEVER`].
    pub fn next_use(&self, position: usize) -> u32 {
        self.next_use[position]
    }

    /// Parent of `block` in its instance's prefix tree.
    pub fn parent(&self, block: BlockId) -> Option<BlockId> {
        self.parents[block as usize]
    }

    /// Prompt tokens of request `request`.
    pub fn input_tokens(&self, request: usize) -> u64 {
        self.input_tokens[request]
    }

    /// Arrival time of request `request` in microseconds.
    pub fn timestamp_us(&self, request: usize) -> u64 {
        self.timestamps_us[request]
    }

    /// Tokens of request `request` served by its first `hit_blocks` blocks.
    pub fn hit_tokens(&self, request: usize, hit_blocks: usize) -> u64 {
        (hit_blocks as u64 * u64::from(self.block_tokens)).min(self.input_tokens[request])
    }
}

/// Accumulates requests; computes next-use positions at the end.
#[derive(Default)]
struct Builder {
    tree: PrefixTree,
    starts: Vec<usize>,
    accesses: Vec<BlockId>,
    input_tokens: Vec<u64>,
    timestamps_us: Vec<u64>,
}

impl Builder {
    fn push(&mut self, request: &Request) -> Option<()> {
        if self.accesses.len() + request.blocks.len() >= NEVER as usize {
            return None;
        }
        self.starts.push(self.accesses.len());
        self.tree
            .intern(&request.instance, &request.blocks, &mut self.accesses)?;
        self.input_tokens.push(request.input_tokens);
        self.timestamps_us.push(request.timestamp_us);
        Some(())
    }

    fn finish(mut self, block_tokens: u32) -> Workload {
        self.starts.push(self.accesses.len());
        let instances = self.tree.instances();
        let parents = self.tree.into_parents();
        let next_use = next_uses(&self.accesses, parents.len());
        Workload {
            block_tokens,
            instances,
            starts: self.starts,
            accesses: self.accesses,
            next_use,
            parents,
            input_tokens: self.input_tokens,
            timestamps_us: self.timestamps_us,
        }
    }
}

/// For every position, the position of the next access to the same block (or [`NEVER`]).
fn next_uses(accesses: &[BlockId], unique_blocks: usize) -> Vec<u32> {
    let mut upcoming = vec![NEVER; unique_blocks];
    let mut next_use = vec![NEVER; accesses.len()];
    for (position, &block) in accesses.iter().enumerate().rev() {
        next_use[position] = upcoming[block as usize];
        upcoming[block as usize] = position as u32;
    }
    next_use
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compiles_ranges_next_uses_and_token_hits() {
        let requests = [Request::untimed(&[1, 2], 20), Request::untimed(&[1, 3], 15)];
        let workload = Workload::from_requests(&requests, 10).unwrap();
        assert_eq!(workload.requests(), 2);
        assert_eq!(workload.accesses(), &[0, 1, 0, 2]);
        assert_eq!(workload.unique_blocks(), 3);
        assert_eq!(workload.request_range(1), 2..4);
        assert_eq!(
            (0..4).map(|p| workload.next_use(p)).collect::<Vec<_>>(),
            vec![2, NEVER, NEVER, NEVER]
        );
        assert_eq!(workload.parent(2), Some(0));
        assert_eq!(workload.hit_tokens(1, 1), 10);
        assert_eq!(workload.hit_tokens(1, 2), 15);
    }
}
