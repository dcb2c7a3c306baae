//! [`capacity_for_target`]: the smallest capacity at which a policy reaches a hit rate.

use crate::model::Workload;
use crate::policy::PolicyKind;

use super::{replay, Config, LruCurve};

/// Smallest capacity (in blocks) at which `policy` reaches `hit_rate` on `workload`.
///
/// LRU reads the answer off `lru_curve`; other policies binary-search over replays, which is
/// exact for policies whose hit rate grows with capacity and a close bound otherwise (FIFO
/// can show Belady's anomaly). Every policy reaches the infinite-cache hit rate at the
/// unique-block count, so a `hit_rate` at or below it always has an answer; `None` otherwise.
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
    let (mut low, mut high) = (0, workload.unique_blocks());
    if !reaches(high) {
        return None;
    }
    while low < high {
        let middle = low + (high - low) / 2;
        if reaches(middle) {
            high = middle;
        } else {
            low = middle + 1;
        }
    }
    Some(high)
}
