//! [`capacity_for_target`]: the smallest sampled capacity at which a policy reaches a hit rate.
//!
//! Only LRU's answer is exact over every capacity (read off the one-pass curve). Other
//! policies need not have a hit rate that grows with capacity (FIFO, ARC, S3-FIFO, LFU, ...
//! can show Belady's anomaly), so a plain binary search over `0..=unique` could return a
//! capacity far above a smaller one that reaches the target. Instead the search scans a grid
//! upward and bisects only inside the first grid step that reaches the target.
//!
//! Invariant of the answer `c`: `c` reaches the target, and no replayed capacity below `c`
//! does — in particular no grid point below it. With a monotone hit rate it is the exact
//! smallest; otherwise a capacity strictly between two grid points below `c` might still
//! reach the target unseen.

use crate::model::Workload;
use crate::policy::PolicyKind;

use super::{replay, Config, LruCurve};

/// Grid points scanned over `1..=unique blocks` (plus capacity 0) before bisecting.
const GRID_POINTS: usize = 32;

/// Smallest sampled capacity (in blocks) at which `policy` reaches `hit_rate` on `workload`
/// (see the module docs for what "sampled" guarantees).
///
/// Every policy reaches the infinite-cache hit rate at the unique-block count, so a
/// `hit_rate` at or below it always has an answer; `None` otherwise.
pub fn capacity_for_target(
    workload: &Workload,
    lru_curve: &LruCurve,
    policy: PolicyKind,
    hit_rate: f64,
) -> Option<usize> {
    if policy == PolicyKind::Lru {
        return lru_curve.capacity_for(hit_rate);
    }
    let reaches = |capacity| {
        let stats = replay(workload, &Config::single(policy, capacity), 1);
        stats.block_hit_rate() >= hit_rate
    };
    let mut below = None;
    for point in grid(workload.unique_blocks()) {
        if reaches(point) {
            let low = below.map_or(0, |b: usize| b + 1);
            return Some(smallest_reaching_probe(low, point, reaches));
        }
        below = Some(point);
    }
    None
}

/// Capacity 0, then `GRID_POINTS` evenly spaced capacities up to `unique`, ascending and
/// without repeats.
fn grid(unique: usize) -> Vec<usize> {
    let mut points = vec![0];
    for step in 1..=GRID_POINTS {
        let point = (unique as u128 * step as u128).div_ceil(GRID_POINTS as u128) as usize;
        if points.last() != Some(&point) {
            points.push(point);
        }
    }
    points
}

/// Bisects `low..=high`, where `high` reaches: returns the smallest probe that reached (every
/// probe after a reaching one is below it, so the last reaching probe is the smallest).
fn smallest_reaching_probe(
    mut low: usize,
    mut high: usize,
    reaches: impl Fn(usize) -> bool,
) -> usize {
    while low < high {
        let middle = low + (high - low) / 2;
        if reaches(middle) {
            high = middle;
        } else {
            low = middle + 1;
        }
    }
    high
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_starts_at_zero_ends_at_unique_and_never_repeats() {
        assert_eq!(grid(0), [0]);
        assert_eq!(grid(3), [0, 1, 2, 3]);
        let big = grid(43_924);
        assert_eq!((big.len(), big[1], big[32]), (33, 1_373, 43_924));
    }
}
