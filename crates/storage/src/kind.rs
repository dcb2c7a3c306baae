//! Names of storage kinds: the `type` string of `storage_configs` (§15) and the URI scheme
//! (§14; an event-report storage's URIs are its reporters' own, any scheme).

use crate::{ReportTier, StorageKind, StorageSpec};

impl StorageKind {
    /// The `type` string of this kind in `storage_configs`: `file`, `hf3fs`, `vcns_hf3fs`,
    /// `mooncake`, `pace`, or `event_report` and `dummy` (never printed there: an
    /// event-report storage is not a write candidate, a dummy one is server-internal).
    pub fn type_name(self) -> &'static str {
        match self {
            StorageKind::Nfs => "file",
            StorageKind::ThreeFs => "hf3fs",
            StorageKind::VcnsThreeFs => "vcns_hf3fs",
            StorageKind::Mooncake => "mooncake",
            StorageKind::TairMemPool => "pace",
            StorageKind::EventReportL1p5 | StorageKind::EventReportL2 => "event_report",
            StorageKind::Dummy => "dummy",
        }
    }

    /// The scheme of the location URIs of this kind (VCNS 3FS shares `hf3fs`).
    pub fn scheme(self) -> &'static str {
        match self {
            StorageKind::VcnsThreeFs => "hf3fs",
            other => other.type_name(),
        }
    }
}

impl StorageSpec {
    /// The kind of backend these settings are for.
    pub fn kind(&self) -> StorageKind {
        match self {
            StorageSpec::Nfs { .. } => StorageKind::Nfs,
            StorageSpec::ThreeFs { .. } => StorageKind::ThreeFs,
            StorageSpec::VcnsThreeFs { .. } => StorageKind::VcnsThreeFs,
            StorageSpec::Mooncake { .. } => StorageKind::Mooncake,
            StorageSpec::TairMemPool { .. } => StorageKind::TairMemPool,
            StorageSpec::Dummy { .. } => StorageKind::Dummy,
            StorageSpec::EventReport { tier, .. } => match tier {
                ReportTier::L1p5 => StorageKind::EventReportL1p5,
                ReportTier::L2 => StorageKind::EventReportL2,
            },
        }
    }
}
