//! [`LruCurve`]: LRU's hit rate at every capacity from one pass (Mattson stack distances).
//!
//! LRU of capacity C holds exactly the C most recently used blocks, so a block is held at a
//! request's start iff its stack depth then (distinct blocks used since its last use,
//! itself included) is <= C. A request's i-th block is a prefix hit iff the largest depth
//! among its blocks 0..=i is <= C. Depths come from a Fenwick tree over access positions
//! holding a 1 at each block's latest access, so the pass is O(accesses · log accesses).

use serde::Serialize;

use crate::model::Workload;
use crate::policy::BlockId;

use super::stats::ratio;
use super::Log2Histogram;

/// LRU hit counts for every capacity, plus the reuse-distance distribution.
#[derive(Debug, Clone, Serialize)]
pub struct LruCurve {
    /// `hit_blocks[c]`: prefix-hit blocks with capacity `c` blocks (`c` up to unique blocks).
    hit_blocks: Vec<u64>,
    /// `hit_tokens[c]`: prefix-hit tokens with capacity `c`.
    hit_tokens: Vec<u64>,
    requested_blocks: u64,
    requested_tokens: u64,
    /// Stack depth at request start of every access to a block used before.
    reuse_distances: Log2Histogram,
    /// Accesses to blocks never used before (infinite reuse distance).
    cold_accesses: u64,
}

impl LruCurve {
    /// Computes the curve in one pass over `workload`.
    pub fn compute(workload: &Workload) -> LruCurve {
        let unique = workload.unique_blocks();
        let mut curve = LruCurve {
            hit_blocks: vec![0; unique + 1],
            hit_tokens: vec![0; unique + 1],
            requested_blocks: workload.total_accesses() as u64,
            requested_tokens: 0,
            reuse_distances: Log2Histogram::default(),
            cold_accesses: 0,
        };
        let mut stack = Stack::new(workload);
        for request in 0..workload.requests() {
            curve.record_request(workload, request, &stack);
            for position in workload.request_range(request) {
                stack.touch(workload.accesses()[position], position);
            }
        }
        accumulate(&mut curve.hit_blocks);
        accumulate(&mut curve.hit_tokens);
        curve
    }

    /// Counts, at the depth from which on they hit, the blocks of `request` (before its
    /// accesses change the stack).
    fn record_request(&mut self, workload: &Workload, request: usize, stack: &Stack) {
        self.requested_tokens += workload.input_tokens(request);
        let range = workload.request_range(request);
        let mut deepest = 0;
        for (index, position) in range.clone().enumerate() {
            let depth = stack.depth(workload.accesses()[position], range.start);
            match depth {
                Some(depth) => self.reuse_distances.record(depth as u64),
                None => self.cold_accesses += 1,
            }
            deepest = deepest.max(depth.unwrap_or(usize::MAX));
            if deepest < self.hit_blocks.len() {
                self.hit_blocks[deepest] += 1;
                self.hit_tokens[deepest] +=
                    workload.hit_tokens(request, index + 1) - workload.hit_tokens(request, index);
            }
        }
    }

    /// Largest capacity the curve distinguishes (the number of unique blocks).
    pub fn max_capacity(&self) -> usize {
        self.hit_blocks.len() - 1
    }

    /// Prefix-hit blocks at `capacity` blocks.
    pub fn hit_blocks(&self, capacity: usize) -> u64 {
        self.hit_blocks[capacity.min(self.max_capacity())]
    }

    /// Block hit rate at `capacity` blocks.
    pub fn block_hit_rate(&self, capacity: usize) -> f64 {
        ratio(self.hit_blocks(capacity), self.requested_blocks)
    }

    /// Token hit rate at `capacity` blocks.
    pub fn token_hit_rate(&self, capacity: usize) -> f64 {
        let hit = self.hit_tokens[capacity.min(self.max_capacity())];
        ratio(hit, self.requested_tokens)
    }

    /// Smallest capacity whose block hit rate is at least `hit_rate`, if any.
    pub fn capacity_for(&self, hit_rate: f64) -> Option<usize> {
        let needed = (hit_rate * self.requested_blocks as f64).ceil() as u64;
        let capacity = self.hit_blocks.partition_point(|&hits| hits < needed);
        (capacity <= self.max_capacity()).then_some(capacity)
    }

    /// Reuse distances (stack depth at request start) of accesses to reused blocks.
    pub fn reuse_distances(&self) -> &Log2Histogram {
        &self.reuse_distances
    }

    /// Accesses to blocks seen for the first time.
    pub fn cold_accesses(&self) -> u64 {
        self.cold_accesses
    }
}

fn accumulate(counts: &mut [u64]) {
    for index in 1..counts.len() {
        counts[index] += counts[index - 1];
    }
}

/// The LRU stack: a Fenwick tree over access positions with a 1 at each block's latest
/// access, so a block's depth is the number of marks from its latest access on.
struct Stack {
    marks: Fenwick,
    last_use: Vec<Option<usize>>,
}

impl Stack {
    fn new(workload: &Workload) -> Stack {
        Stack {
            marks: Fenwick::new(workload.total_accesses()),
            last_use: vec![None; workload.unique_blocks()],
        }
    }

    /// Depth of `block` (1 = most recent) just before position `now`; `None` if never used.
    fn depth(&self, block: BlockId, now: usize) -> Option<usize> {
        self.last_use[block as usize].map(|last| self.marks.count_from(last, now))
    }

    /// Records an access to `block` at `position`.
    fn touch(&mut self, block: BlockId, position: usize) {
        if let Some(last) = self.last_use[block as usize].replace(position) {
            self.marks.add(last, -1);
        }
        self.marks.add(position, 1);
    }
}

/// Fenwick (binary indexed) tree of counts over positions `0..len`.
struct Fenwick {
    tree: Vec<i64>,
}

impl Fenwick {
    fn new(len: usize) -> Self {
        Fenwick {
            tree: vec![0; len + 1],
        }
    }

    fn add(&mut self, position: usize, delta: i64) {
        let mut index = position + 1;
        while index < self.tree.len() {
            self.tree[index] += delta;
            index += index & index.wrapping_neg();
        }
    }

    /// Sum over positions `0..end`.
    fn prefix(&self, end: usize) -> i64 {
        let (mut index, mut sum) = (end, 0);
        while index > 0 {
            sum += self.tree[index];
            index &= index - 1;
        }
        sum
    }

    /// Sum over positions `start..end`, as a count.
    fn count_from(&self, start: usize, end: usize) -> usize {
        (self.prefix(end) - self.prefix(start)) as usize
    }
}
