//! The journal's counters in the Prometheus text of `GET /metrics` (admin HTTP port):
//! records appended, durable, synced and acknowledged, flushes and syncs, and
//! `kvcm_journal_early_acknowledgements` — acknowledgements under `fsync = always` of a record
//! not yet fdatasync'ed, the journal's own check of its guarantee (0 unless it is broken).
//! Nothing is written when no journal is open.

use std::fmt::Write;

use kvcm_manager::Manager;

/// The journal's lines of the exposition.
pub fn to_prometheus(manager: &Manager) -> String {
    let Some(stats) = manager.journal_stats() else {
        return String::new();
    };
    let counters = [
        ("records_appended", stats.appended),
        ("records_durable", stats.durable),
        ("records_synced", stats.synced),
        ("records_acknowledged", stats.acknowledged),
        ("flushes", stats.flushes),
        ("syncs", stats.syncs),
        ("early_acknowledgements", stats.early_acknowledgements),
        ("log_bytes", stats.log_bytes),
    ];
    let mut text = String::new();
    for (name, value) in counters {
        let _ = writeln!(text, "# TYPE kvcm_journal_{name} counter");
        let _ = writeln!(text, "kvcm_journal_{name} {value}");
    }
    let _ = writeln!(text, "# TYPE kvcm_journal_failed gauge");
    let _ = writeln!(
        text,
        "kvcm_journal_failed {}",
        u8::from(stats.failure.is_some())
    );
    text
}
