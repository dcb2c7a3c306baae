//! Fast-path counters of one client.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters (relaxed: they are statistics).
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    hits: AtomicU64,
    fallbacks: AtomicU64,
    retries: AtomicU64,
    extra_round_trips: AtomicU64,
    reconnects: AtomicU64,
    reads_reported: AtomicU64,
    reads_unreported: AtomicU64,
    writes_by_message: AtomicU64,
}

/// A snapshot of a client's fast-path counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FastPathMetrics {
    /// Queries answered by the fast path.
    pub hits: u64,
    /// Queries answered by gRPC instead (fast path unavailable or not exact for them).
    pub fallbacks: u64,
    /// Copies read again (torn buckets, retired generations).
    pub retries: u64,
    /// Round trips beyond the first for cold string-table entries.
    pub extra_round_trips: u64,
    /// Fast-path connections made after the first.
    pub reconnects: u64,
    /// Fast-path answers the server acknowledged counting (access clock, event log, curves).
    pub reads_reported: u64,
    /// Fast-path answers whose report was lost (fast path down, server not leader or busy).
    pub reads_unreported: u64,
    /// Write-path calls (StartWriteCache, FinishWriteCache, RemoveCache) answered by message;
    /// the others went over gRPC.
    pub writes_by_message: u64,
}

impl Metrics {
    pub(crate) fn hit(&self) {
        self.hits.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn fallback(&self) {
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn retry(&self) {
        self.retries.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn extra_round_trip(&self) {
        self.extra_round_trips.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn write_by_message(&self) {
        self.writes_by_message.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn reconnect(&self) {
        self.reconnects.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn reads_reported(&self, count: u64, reported: bool) {
        let counter = if reported {
            &self.reads_reported
        } else {
            &self.reads_unreported
        };
        counter.fetch_add(count, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> FastPathMetrics {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        FastPathMetrics {
            hits: get(&self.hits),
            fallbacks: get(&self.fallbacks),
            retries: get(&self.retries),
            extra_round_trips: get(&self.extra_round_trips),
            reconnects: get(&self.reconnects),
            reads_reported: get(&self.reads_reported),
            reads_unreported: get(&self.reads_unreported),
            writes_by_message: get(&self.writes_by_message),
        }
    }
}
