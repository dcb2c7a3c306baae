//! The backends behind [`crate::DataStorage`], one file per way of holding blocks (block
//! files, URIs only, reported locations; the memory pool is [`crate::pool`]), and [`open`],
//! which picks one for a config.
//!
//! Every backend: checks the allocation request (`packing::check_request`) before acting;
//! emits URIs through `BlockUri` (§14); refuses, on delete, URIs of another scheme or
//! storage with `InvalidUri` before freeing anything.

mod block_files;
pub(crate) use block_files::nfs_anchor;
mod event_report;
mod uri_only;

use std::sync::Arc;

use crate::pool::MemPool;
use crate::{DataStorage, StorageConfig, StorageError, StorageSpec};

/// Validates `config`, opens its backend and, when `check_storage_available_when_open` is
/// set, probes it (memory pools excepted: their nodes join later). VCNS 3FS is `Unsupported` in this build.
pub fn open(config: StorageConfig) -> Result<Arc<dyn DataStorage>, StorageError> {
    let storage = open_unprobed(config)?;
    if wants_probe(storage.as_ref()) {
        storage.check_health()?;
    }
    Ok(storage)
}

/// Whether opening `storage` probes it: its config asks to
/// (`check_storage_available_when_open`) and it is not a memory pool, which has no member
/// before its nodes join.
pub(crate) fn wants_probe(storage: &dyn DataStorage) -> bool {
    storage.config().check_storage_available_when_open && storage.as_pool().is_none()
}

/// Opens `config` as recovered from a journal: even when the probe its config asks for
/// fails (a mount not up yet); returns the backend and why that probe failed, if it did.
pub fn open_recovered(
    config: StorageConfig,
) -> Result<(Arc<dyn DataStorage>, Option<String>), StorageError> {
    let storage = open_unprobed(config)?;
    let failed_probe = wants_probe(storage.as_ref())
        .then(|| storage.check_health())
        .and_then(Result::err)
        .map(|error| error.to_string());
    Ok((storage, failed_probe))
}

/// Validates `config` and opens its backend without probing it.
pub(crate) fn open_unprobed(config: StorageConfig) -> Result<Arc<dyn DataStorage>, StorageError> {
    config.validate()?;
    let storage: Arc<dyn DataStorage> = match &config.spec {
        StorageSpec::Nfs { .. } | StorageSpec::ThreeFs { .. } => {
            Arc::new(block_files::BlockFileStorage::new(config)?)
        }
        StorageSpec::Mooncake { .. } | StorageSpec::Dummy { .. } => {
            Arc::new(uri_only::UriOnlyStorage::new(config))
        }
        StorageSpec::TairMemPool { .. } => Arc::new(MemPool::new(config)),
        StorageSpec::EventReport { .. } => Arc::new(event_report::EventReportStorage::new(config)),
        StorageSpec::VcnsThreeFs { .. } => {
            return Err(StorageError::Unsupported(config.spec.kind()));
        }
    };
    Ok(storage)
}
