//! The journal's counters in the Prometheus text of `GET /metrics` (admin HTTP port):
//! records appended, durable, synced and acknowledged, waits for durability that returned,
//! flushes and syncs, and
//! `kvcm_journal_early_acknowledgements` — acknowledgements under `fsync = always` of a record
//! not yet fdatasync'ed, the journal's own check of its guarantee (0 unless it is broken).
//! Nothing is written when no journal is open.

use std::fmt::Write;

use kvcm_manager::Manager;

use super::metrics::prometheus_name;

/// The journal's lines of the exposition (named with `prefix`, see [`prometheus_name`]).
pub fn to_prometheus(manager: &Manager, prefix: &str) -> String {
    let Some(stats) = manager.journal_stats() else {
        return String::new();
    };
    let counters = [
        ("records_appended", stats.appended),
        ("records_durable", stats.durable),
        ("records_synced", stats.synced),
        ("records_acknowledged", stats.acknowledged),
        ("waits", stats.waits),
        ("flushes", stats.flushes),
        ("syncs", stats.syncs),
        ("early_acknowledgements", stats.early_acknowledgements),
        ("log_bytes", stats.log_bytes),
    ];
    let mut text = String::new();
    for (name, value) in counters {
        let name = prometheus_name(prefix, &format!("journal.{name}"));
        let _ = writeln!(text, "# TYPE {name} counter");
        let _ = writeln!(text, "{name} {value}");
    }
    let name = prometheus_name(prefix, "journal.failed");
    let _ = writeln!(text, "# TYPE {name} gauge");
    let _ = writeln!(text, "{name} {}", u8::from(stats.failure.is_some()));
    text
}
