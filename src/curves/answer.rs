//! What a live curve answers: points of the hit-rate-vs-capacity curve and the capacity for
//! each of [`FRACTIONS`] of the hit rate the window allows (its hit rate at unbounded
//! capacity), as JSON for the admin route and as gauges for the metrics.

use kvcm_optimizer::sim::LruCurve;
use serde::Serialize;

/// The fractions of the achievable hit rate whose capacity is answered.
pub const FRACTIONS: [f64; 3] = [0.8, 0.9, 0.95];

/// Most points one answer holds.
pub const MAX_POINTS: usize = 1025;

/// A window's curve, as computed.
#[derive(Debug, Clone)]
pub struct CurveSummary {
    curve: std::sync::Arc<LruCurve>,
    /// Requests in the window.
    pub requests: usize,
}

/// One point of a curve.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CurvePoint {
    /// Capacity in blocks.
    pub capacity_blocks: usize,
    /// Prefix hit rate of blocks at that capacity.
    pub block_hit_rate: f64,
    /// Prefix hit rate of tokens at that capacity.
    pub token_hit_rate: f64,
}

/// The capacity for one fraction of the achievable hit rate.
#[derive(Debug, Clone, PartialEq, Serialize)]
struct CapacityFor {
    fraction: f64,
    capacity_blocks: usize,
    capacity_bytes: u64,
}

/// The JSON answer of the admin route.
#[derive(Debug, Serialize)]
struct CurveAnswer<'a> {
    instance_id: &'a str,
    window_requests: usize,
    unique_blocks: usize,
    cold_accesses: u64,
    block_bytes: u64,
    achievable_block_hit_rate: f64,
    capacity_for: Vec<CapacityFor>,
    points: Vec<CurvePoint>,
}

impl CurveSummary {
    pub(super) fn of(curve: &std::sync::Arc<LruCurve>, requests: usize) -> CurveSummary {
        CurveSummary {
            curve: curve.clone(),
            requests,
        }
    }

    /// The window's distinct blocks (beyond them more capacity changes nothing).
    pub fn unique_blocks(&self) -> usize {
        self.curve.max_capacity()
    }

    /// The curve at `capacity` blocks.
    pub fn point(&self, capacity: usize) -> CurvePoint {
        CurvePoint {
            capacity_blocks: capacity,
            block_hit_rate: self.curve.block_hit_rate(capacity),
            token_hit_rate: self.curve.token_hit_rate(capacity),
        }
    }

    /// `count` points (at least 2, at most [`MAX_POINTS`]) from 0 to the window's distinct
    /// blocks, evenly spaced, without repeats.
    pub fn points(&self, count: usize) -> Vec<CurvePoint> {
        let count = count.clamp(2, MAX_POINTS);
        let unique = self.unique_blocks();
        let mut capacities: Vec<usize> = (0..count)
            .map(|i| ((i as u128 * unique as u128) / (count as u128 - 1)) as usize)
            .collect();
        capacities.dedup();
        capacities.into_iter().map(|c| self.point(c)).collect()
    }

    /// The hit rate at unbounded capacity.
    pub fn achievable(&self) -> f64 {
        self.curve.block_hit_rate(self.unique_blocks())
    }

    /// The smallest capacity (blocks) reaching `fraction` of the achievable hit rate.
    pub fn capacity_for(&self, fraction: f64) -> usize {
        let rate = fraction * self.achievable();
        self.curve
            .capacity_for(rate)
            .unwrap_or(self.unique_blocks())
    }

    /// The admin route's JSON of `instance_id`'s curve, `points` points, blocks of
    /// `block_bytes` bytes.
    pub fn to_json(&self, instance_id: &str, points: usize, block_bytes: u64) -> String {
        let capacity_for = FRACTIONS
            .iter()
            .map(|&fraction| {
                let blocks = self.capacity_for(fraction);
                CapacityFor {
                    fraction,
                    capacity_blocks: blocks,
                    capacity_bytes: (blocks as u64).saturating_mul(block_bytes),
                }
            })
            .collect();
        let answer = CurveAnswer {
            instance_id,
            window_requests: self.requests,
            unique_blocks: self.unique_blocks(),
            cold_accesses: self.curve.cold_accesses(),
            block_bytes,
            achievable_block_hit_rate: self.achievable(),
            capacity_for,
            points: self.points(points),
        };
        serde_json::to_string(&answer).unwrap_or_else(|_| "{}".into())
    }
}
