//! The `event_report` backend: the namespace of locations that cache subscribers report
//! through ReportEvent (upstream trunk's `ST_EVENT_REPORT_L1P5` / `ST_EVENT_REPORT_L2`).
//! The reporters own those bytes and their URIs; the manager keeps only their metadata
//! (`kvcm_manager::reports`). So this backend allocates nothing, renders no URI and never
//! deletes a reporter's object: an instance group lists it as an event-report candidate,
//! never as a write candidate.

use crate::{
    AllocatedSpec, AllocationRequest, DataStorage, PartRef, StorageConfig, StorageError,
    StorageKind, UriTemplate,
};

/// An event-report storage as the storage table holds it: its config, nothing else.
#[derive(Debug)]
pub(crate) struct EventReportStorage {
    config: StorageConfig,
}

impl EventReportStorage {
    /// The backend of a validated `EventReport` config.
    pub(crate) fn new(config: StorageConfig) -> Self {
        Self { config }
    }
}

impl DataStorage for EventReportStorage {
    fn config(&self) -> &StorageConfig {
        &self.config
    }

    fn kind(&self) -> StorageKind {
        self.config.spec.kind()
    }

    /// Refused: the reporters place their blocks themselves.
    fn allocate(
        &self,
        _request: &AllocationRequest<'_>,
    ) -> Result<Vec<Vec<AllocatedSpec>>, StorageError> {
        Err(StorageError::Unsupported(self.kind()))
    }

    fn write_uri(&self, _part: &PartRef<'_>, _out: &mut String) -> bool {
        false
    }

    fn uri_template(&self, _part: &PartRef<'_>) -> Option<UriTemplate> {
        None
    }

    /// Metadata only: a reporter's objects are never deleted from here.
    fn delete(&self, _uris: &[String]) -> Result<(), StorageError> {
        Ok(())
    }

    /// Nothing to probe: the reporters' liveness is their heartbeats.
    fn check_health(&self) -> Result<(), StorageError> {
        Ok(())
    }
}
