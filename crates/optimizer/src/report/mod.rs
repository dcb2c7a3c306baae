//! Reports: the [`Report`] of one `kvcm optimize` run, printed as a table and written as CSV,
//! JSON and plots (SVG and PNG, drawn here without external tools).

mod csv;
mod plot;
mod table;
mod write;

pub use csv::{curve_csv, results_csv};
pub use plot::{charts, Chart, Series, SeriesStyle};
pub use table::table;
pub use write::{write_report, ReportError};

use serde::Serialize;

use crate::sim::{Log2Histogram, ReplayStats};

/// What was replayed.
#[derive(Debug, Clone, Serialize)]
pub struct TraceSummary {
    /// Trace files, in replay order.
    pub files: Vec<String>,
    /// Requests replayed.
    pub requests: usize,
    /// Block accesses (sum of request lengths).
    pub accesses: usize,
    /// Distinct blocks (prefix-tree nodes): the infinite-cache size.
    pub unique_blocks: usize,
    /// Instances in the trace.
    pub instances: usize,
    /// Tokens per block.
    pub block_tokens: u32,
    /// Block hit rate of an infinite cache.
    pub infinite_block_hit_rate: f64,
    /// Token hit rate of an infinite cache.
    pub infinite_token_hit_rate: f64,
}

/// One policy × capacity result.
#[derive(Debug, Clone, Serialize)]
pub struct ResultRow {
    /// Policy name.
    pub policy: &'static str,
    /// Main-tier capacity in blocks.
    pub capacity_blocks: usize,
    /// Memory-tier capacity in blocks (two-tier runs).
    pub memory_tier_blocks: Option<usize>,
    /// Prefix-hit blocks / requested blocks.
    pub block_hit_rate: f64,
    /// Prefix-hit tokens / requested tokens.
    pub token_hit_rate: f64,
    /// Memory-tier prefix hits / requested blocks.
    pub memory_hit_rate: f64,
    /// All counters of the replay.
    pub stats: ReplayStats,
}

impl ResultRow {
    /// A row from a replay's statistics.
    pub fn new(
        policy: &'static str,
        capacity_blocks: usize,
        memory_tier_blocks: Option<usize>,
        stats: ReplayStats,
    ) -> ResultRow {
        ResultRow {
            policy,
            capacity_blocks,
            memory_tier_blocks,
            block_hit_rate: stats.block_hit_rate(),
            token_hit_rate: stats.token_hit_rate(),
            memory_hit_rate: stats.memory_hit_rate(),
            stats,
        }
    }
}

/// One point of the LRU curve.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CurvePoint {
    /// Capacity in blocks.
    pub capacity_blocks: usize,
    /// LRU block hit rate at that capacity.
    pub block_hit_rate: f64,
    /// LRU token hit rate at that capacity.
    pub token_hit_rate: f64,
}

/// The capacity each policy needs for the target hit rate.
#[derive(Debug, Clone, Serialize)]
pub struct TargetCapacity {
    /// Policy name.
    pub policy: &'static str,
    /// Smallest sampled capacity in blocks reaching the target, if any (exact for LRU; see
    /// [`crate::sim::capacity_for_target`]).
    pub capacity_blocks: Option<usize>,
}

/// Capacity planning answer.
#[derive(Debug, Clone, Serialize)]
pub struct TargetSummary {
    /// Target as a fraction of the infinite-cache block hit rate (`--target`).
    pub fraction_of_infinite: f64,
    /// The block hit rate that fraction means on this trace.
    pub block_hit_rate: f64,
    /// Per policy.
    pub capacities: Vec<TargetCapacity>,
}

/// Everything one run produced.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The trace.
    pub trace: TraceSummary,
    /// Policy × capacity results.
    pub results: Vec<ResultRow>,
    /// The LRU hit-rate curve (one pass), sampled.
    pub lru_curve: Vec<CurvePoint>,
    /// Reuse distances (LRU stack depth at request start) of re-accessed blocks.
    pub reuse_distances: Log2Histogram,
    /// Accesses to never-seen blocks.
    pub cold_accesses: u64,
    /// Capacity needed for the target.
    pub target: TargetSummary,
}
