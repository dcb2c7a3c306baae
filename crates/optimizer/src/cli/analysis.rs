//! [`analyse`]: from a compiled workload and the arguments to a [`Report`].

use std::thread::available_parallelism;

use crate::model::Workload;
use crate::policy::PolicyKind;
use crate::report::{CurvePoint, Report, ResultRow, TargetCapacity, TargetSummary, TraceSummary};
use crate::sim::{capacity_for_target, replay, run_parallel, Config, LruCurve};

use super::{CapacitySpec, OptimizeArgs, OptimizeError, Progress};

/// Points of the LRU curve kept in the report.
const CURVE_POINTS: usize = 200;

/// Replays every policy × capacity, computes the LRU curve and the target capacities.
pub fn analyse(workload: &Workload, args: &OptimizeArgs) -> Result<Report, OptimizeError> {
    let configs = configs(workload, args)?;
    let threads = args
        .threads
        .unwrap_or_else(|| available_parallelism().map_or(1, |n| n.get()));
    let curve = LruCurve::compute(workload);
    let progress = Progress::new("replay");
    let stats = run_parallel(
        &configs,
        threads,
        |config| replay(workload, config, args.windows),
        |done, total| progress.update(done, total),
    );
    let results = configs
        .iter()
        .zip(stats)
        .map(|(c, s)| ResultRow::new(c.policy.name(), c.capacity, c.memory_capacity, s))
        .collect();
    Ok(Report {
        trace: summary(workload, args, &curve),
        results,
        lru_curve: sample_curve(&curve),
        reuse_distances: curve.reuse_distances().clone(),
        cold_accesses: curve.cold_accesses(),
        target: targets(
            workload,
            &curve,
            &distinct(&args.policy),
            args.target,
            threads,
        ),
    })
}

/// Every policy × capacity configuration the arguments ask for, capacities in blocks.
fn configs(workload: &Workload, args: &OptimizeArgs) -> Result<Vec<Config>, OptimizeError> {
    let to_blocks = |spec: &CapacitySpec| {
        spec.blocks(
            workload.unique_blocks(),
            workload.block_tokens(),
            args.bytes_per_token,
        )
    };
    let capacities = args
        .capacity
        .iter()
        .map(to_blocks)
        .collect::<Result<Vec<_>, _>>()?;
    let memory_capacity = args.memory_tier.as_ref().map(to_blocks).transpose()?;
    Ok(distinct(&args.policy)
        .into_iter()
        .flat_map(|policy| {
            capacities.iter().map(move |&capacity| Config {
                policy,
                capacity,
                memory_capacity,
            })
        })
        .collect())
}

/// The capacity each policy needs for `fraction` of the infinite-cache hit rate.
fn targets(
    workload: &Workload,
    curve: &LruCurve,
    policies: &[PolicyKind],
    fraction: f64,
    threads: usize,
) -> TargetSummary {
    let hit_rate = fraction * curve.block_hit_rate(workload.unique_blocks());
    let progress = Progress::new("target");
    let needed = run_parallel(
        policies,
        threads,
        |&policy| capacity_for_target(workload, curve, policy, hit_rate),
        |done, total| progress.update(done, total),
    );
    TargetSummary {
        fraction_of_infinite: fraction,
        block_hit_rate: hit_rate,
        capacities: policies
            .iter()
            .zip(needed)
            .map(|(p, capacity_blocks)| TargetCapacity {
                policy: p.name(),
                capacity_blocks,
            })
            .collect(),
    }
}

fn distinct(policies: &[PolicyKind]) -> Vec<PolicyKind> {
    let mut seen = Vec::new();
    for &policy in policies {
        if !seen.contains(&policy) {
            seen.push(policy);
        }
    }
    seen
}

fn summary(workload: &Workload, args: &OptimizeArgs, curve: &LruCurve) -> TraceSummary {
    let unique = workload.unique_blocks();
    TraceSummary {
        files: args.trace.iter().map(|p| p.display().to_string()).collect(),
        requests: workload.requests(),
        accesses: workload.total_accesses(),
        unique_blocks: unique,
        instances: workload.instances(),
        block_tokens: workload.block_tokens(),
        infinite_block_hit_rate: curve.block_hit_rate(unique),
        infinite_token_hit_rate: curve.token_hit_rate(unique),
    }
}

fn sample_curve(curve: &LruCurve) -> Vec<CurvePoint> {
    let max = curve.max_capacity();
    let mut points: Vec<CurvePoint> = (0..=CURVE_POINTS)
        .map(|i| max * i / CURVE_POINTS)
        .map(|capacity| CurvePoint {
            capacity_blocks: capacity,
            block_hit_rate: curve.block_hit_rate(capacity),
            token_hit_rate: curve.token_hit_rate(capacity),
        })
        .collect();
    points.dedup_by_key(|p| p.capacity_blocks);
    points
}
