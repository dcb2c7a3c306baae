//! [`replay`]: runs a workload through a cache configuration.

use crate::model::{Workload, NEVER};
use crate::policy::{Access, PolicyKind};

use super::tiers::Tier;
use super::{ReplayStats, Tiers, WindowStats};

/// One cache configuration to replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// The eviction policy of every tier.
    pub policy: PolicyKind,
    /// Capacity of the main tier, in blocks.
    pub capacity: usize,
    /// Capacity of a memory tier in front of the main tier, if any.
    pub memory_capacity: Option<usize>,
}

impl Config {
    /// A single-tier configuration.
    pub fn single(policy: PolicyKind, capacity: usize) -> Config {
        Config {
            policy,
            capacity,
            memory_capacity: None,
        }
    }

    /// The empty cache this configuration describes.
    pub fn build(&self) -> Tiers {
        let main = self.policy.build(self.capacity);
        match self.memory_capacity {
            Some(memory) => Tiers::two_tier(self.policy.build(memory), main),
            None => Tiers::single(main),
        }
    }
}

/// Replays `workload` against `config`, counting hits in `windows` equal time windows.
pub fn replay(workload: &Workload, config: &Config, windows: usize) -> ReplayStats {
    let mut tiers = config.build();
    let mut stats = ReplayStats {
        windows: vec![WindowStats::default(); windows.max(1)],
        ..ReplayStats::default()
    };
    let window_of = window_function(workload, windows.max(1));
    for request in 0..workload.requests() {
        let range = workload.request_range(request);
        let blocks = &workload.accesses()[range.clone()];
        let mut hit = 0;
        for &block in blocks {
            match tiers.lookup(block) {
                Some(Tier::Memory) => stats.memory_hit_blocks += 1,
                Some(Tier::Main) => {}
                None => break,
            }
            hit += 1;
        }
        record_request(&mut stats, workload, request, hit, window_of(request));
        for position in range {
            let block = workload.accesses()[position];
            let next_use = workload.next_use(position);
            let access = Access {
                block,
                parent: workload.parent(block),
                next_use: (next_use != NEVER).then_some(u64::from(next_use)),
            };
            tiers.access(access, |b| workload.parent(b), &mut stats);
        }
    }
    stats
}

fn record_request(
    stats: &mut ReplayStats,
    workload: &Workload,
    request: usize,
    hit: usize,
    window: usize,
) {
    let requested = workload.request_range(request).len() as u64;
    stats.requested_blocks += requested;
    stats.hit_blocks += hit as u64;
    stats.requested_tokens += workload.input_tokens(request);
    stats.hit_tokens += workload.hit_tokens(request, hit);
    stats.prefix_hit_lengths.record(hit as u64);
    stats.windows[window].requested_blocks += requested;
    stats.windows[window].hit_blocks += hit as u64;
}

/// Maps a request to one of `windows` equal spans of the trace's time range.
fn window_function(workload: &Workload, windows: usize) -> impl Fn(usize) -> usize + '_ {
    let times = (0..workload.requests()).map(|r| workload.timestamp_us(r));
    let start = times.clone().min().unwrap_or(0);
    let span = u128::from(times.max().unwrap_or(0) - start) + 1;
    move |request| {
        let offset = u128::from(workload.timestamp_us(request) - start);
        (offset * windows as u128 / span) as usize
    }
}
