//! The lookup path's figures for the server's metrics (`kvcm_lookup_*` on `GET /metrics`
//! and in GetMetrics, docs/lookup-table.md): the polling-thread core's queue pairs and
//! messages, the tables dropped, and per published table its size, epoch and how it grew.

use std::sync::atomic::Ordering;
use std::sync::Arc;

pub use super::core::CoreStats;
pub use super::table::TableStats;
use super::{InstanceTable, LookupService};

/// A snapshot of the lookup path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupStats {
    /// The polling-thread core.
    pub core: CoreStats,
    /// Tables retired because they could not be kept in step (readers fell back to gRPC
    /// until the next bootstrap built them again).
    pub tables_dropped: u64,
    /// Each published table, by instance id (sorted).
    pub tables: Vec<(String, TableStats)>,
}

impl LookupService {
    /// The lookup path's figures now.
    pub fn stats(&self) -> LookupStats {
        // Each table's lock is taken after the map's is released.
        let kept: Vec<(String, Arc<InstanceTable>)> = self
            .tables()
            .iter()
            .map(|(id, table)| (id.clone(), Arc::clone(table)))
            .collect();
        let mut tables: Vec<(String, TableStats)> = kept
            .into_iter()
            .map(|(id, table)| (id, table.stats()))
            .collect();
        tables.sort_by(|a, b| a.0.cmp(&b.0));
        LookupStats {
            core: self.core.stats(),
            tables_dropped: self.tables_dropped.load(Ordering::Relaxed),
            tables,
        }
    }
}
