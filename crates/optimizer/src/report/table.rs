//! [`table`]: the results as an aligned text table, as printed to stdout.

use std::fmt::Write;

use super::Report;

/// Renders the results table and the capacity-planning lines.
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    let trace = &report.trace;
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "trace: {} requests, {} block accesses, {} unique blocks of {} tokens, {} instance(s); infinite-cache block hit rate {:.4}",
        trace.requests, trace.accesses, trace.unique_blocks, trace.block_tokens, trace.instances,
        trace.infinite_block_hit_rate
    );
    let _ = writeln!(
        out,
        "{:<11} {:>15} {:>14} {:>14} {:>12} {:>14} {:>14}",
        "policy",
        "capacity_blocks",
        "block_hit_rate",
        "token_hit_rate",
        "memory_blocks",
        "written_main",
        "written_memory"
    );
    for row in &report.results {
        let memory = row
            .memory_tier_blocks
            .map_or("-".to_string(), |m| m.to_string());
        let _ = writeln!(
            out,
            "{:<11} {:>15} {:>14.4} {:>14.4} {:>12} {:>14} {:>14}",
            row.policy,
            row.capacity_blocks,
            row.block_hit_rate,
            row.token_hit_rate,
            memory,
            row.stats.blocks_written_main,
            row.stats.blocks_written_memory
        );
    }
    let target = &report.target;
    let _ = writeln!(
        out,
        "smallest sampled capacity for {:.0}% of the infinite-cache hit rate (block hit rate {:.4}; exact for lru):",
        target.fraction_of_infinite * 100.0,
        target.block_hit_rate
    );
    for entry in &target.capacities {
        let needed = entry
            .capacity_blocks
            .map_or("unreachable".to_string(), |c| format!("{c} blocks"));
        let _ = writeln!(out, "  {:<11} {needed}", entry.policy);
    }
    out
}
