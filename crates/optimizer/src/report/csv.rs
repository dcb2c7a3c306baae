//! CSV renderings: `results.csv` (one row per policy × capacity) and `lru_curve.csv`.

use std::fmt::Write;

use super::Report;

/// Header of `results.csv`.
pub const RESULTS_HEADER: &str = "policy,capacity_blocks,block_hit_rate,token_hit_rate,\
memory_tier_blocks,memory_hit_rate,hit_blocks,requested_blocks,hit_tokens,requested_tokens,\
blocks_written_main,blocks_written_memory";

/// `results.csv`: one row per policy × capacity.
pub fn results_csv(report: &Report) -> String {
    let mut out = format!("{RESULTS_HEADER}\n");
    for row in &report.results {
        let stats = &row.stats;
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "{},{},{:.6},{:.6},{},{:.6},{},{},{},{},{},{}",
            row.policy,
            row.capacity_blocks,
            row.block_hit_rate,
            row.token_hit_rate,
            row.memory_tier_blocks.unwrap_or(0),
            row.memory_hit_rate,
            stats.hit_blocks,
            stats.requested_blocks,
            stats.hit_tokens,
            stats.requested_tokens,
            stats.blocks_written_main,
            stats.blocks_written_memory
        );
    }
    out
}

/// `lru_curve.csv`: the sampled one-pass LRU curve.
pub fn curve_csv(report: &Report) -> String {
    let mut out = "capacity_blocks,block_hit_rate,token_hit_rate\n".to_string();
    for point in &report.lru_curve {
        let _ = writeln!(
            out,
            "{},{:.6},{:.6}",
            point.capacity_blocks, point.block_hit_rate, point.token_hit_rate
        );
    }
    out
}
