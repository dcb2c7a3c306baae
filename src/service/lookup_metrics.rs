//! The lookup path's series (docs/lookup-table.md, "Metrics") in GetMetrics and `GET
//! /metrics`: the polling-thread core's queue pairs and messages, tables dropped, and per
//! published table (`instance_id`) its bytes, slots, epoch, growths, rebuilds (inside write
//! calls, at a growth's install) and the changes that waited for a growth. Nothing is
//! written when the lookup path is off.

use crate::lookup::stats::LookupStats;
use crate::proto::admin;

use super::core::Core;
use super::samples::{self, counter, gauge_u64, Sample};

/// Every series, grouped by name.
fn lookup_samples(stats: &LookupStats) -> Vec<Sample> {
    let core = &stats.core;
    let mut out = vec![
        gauge_u64("lookup.queue_pairs", Vec::new(), core.queue_pairs),
        counter("lookup.messages", Vec::new(), core.messages),
        counter("lookup.messages_busy", Vec::new(), core.busy),
        counter("lookup.messages_malformed", Vec::new(), core.malformed),
        counter("lookup.tables_dropped", Vec::new(), stats.tables_dropped),
    ];
    for (id, table) in &stats.tables {
        let tags = || vec![("instance_id", id.clone())];
        let waited_us = u64::try_from(table.waited.as_micros()).unwrap_or(u64::MAX);
        out.extend([
            gauge_u64("lookup.table_bytes", tags(), table.bytes),
            gauge_u64("lookup.table_slots", tags(), table.slots),
            gauge_u64("lookup.table_slots_used", tags(), table.slots_used),
            gauge_u64("lookup.table_epoch", tags(), table.epoch),
            counter(
                "lookup.table_growths_started",
                tags(),
                table.growths_started,
            ),
            counter(
                "lookup.table_growths_installed",
                tags(),
                table.growths_installed,
            ),
            counter(
                "lookup.table_rebuilds_in_call",
                tags(),
                table.rebuilt_in_call,
            ),
            counter("lookup.table_growth_waits", tags(), table.waited_for_growth),
            counter("lookup.table_growth_wait_us", tags(), waited_us),
        ]);
    }
    out.sort_by_key(|s| s.name);
    out
}

/// The lookup series for GetMetrics (none while the lookup path is off).
pub fn to_wire(core: &Core) -> Vec<admin::MetricsData> {
    core.lookup_stats()
        .map_or_else(Vec::new, |stats| samples::to_wire(lookup_samples(&stats)))
}

/// The lookup lines of the exposition (named with `prefix`).
pub fn to_prometheus(core: &Core, prefix: &str) -> String {
    core.lookup_stats().map_or_else(String::new, |stats| {
        samples::to_prometheus(lookup_samples(&stats), prefix)
    })
}
