//! Storage types as the control plane counts and weighs them (the reference's
//! `StorageType`); a backend's [`StorageKind`] maps to exactly one.

use kvcm_storage::StorageKind;

/// A storage type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StorageType {
    /// Not a storage (the type of a miss placeholder).
    Unspecified,
    /// 3FS.
    ThreeFs,
    /// Mooncake store.
    Mooncake,
    /// Tair memory pool.
    TairMemPool,
    /// NFS or a local directory.
    Nfs,
    /// VCNS 3FS.
    VcnsThreeFs,
    /// Locations reported by L1.5 cache subscribers (ReportEvent; upstream trunk).
    EventReportL1p5,
    /// Locations reported by L2 cache subscribers, the peer-to-peer sources (upstream trunk).
    EventReportL2,
    /// A storage that places locations and holds no bytes (upstream trunk's `ST_DUMMY`).
    Dummy,
}

impl StorageType {
    /// Every type (the 2026-02 ones in wire order, then upstream trunk's event-report and
    /// dummy types; their wire numbers belong to the service layer). Positions are stored
    /// (registry encoding): new types go at the end.
    pub const ALL: [StorageType; 9] = [
        StorageType::Unspecified,
        StorageType::ThreeFs,
        StorageType::Mooncake,
        StorageType::TairMemPool,
        StorageType::Nfs,
        StorageType::VcnsThreeFs,
        StorageType::EventReportL1p5,
        StorageType::EventReportL2,
        StorageType::Dummy,
    ];

    /// The type of a backend kind.
    pub fn of(kind: StorageKind) -> StorageType {
        match kind {
            StorageKind::Nfs => StorageType::Nfs,
            StorageKind::ThreeFs => StorageType::ThreeFs,
            StorageKind::VcnsThreeFs => StorageType::VcnsThreeFs,
            StorageKind::Mooncake => StorageType::Mooncake,
            StorageKind::TairMemPool => StorageType::TairMemPool,
            StorageKind::EventReportL1p5 => StorageType::EventReportL1p5,
            StorageKind::EventReportL2 => StorageType::EventReportL2,
            StorageKind::Dummy => StorageType::Dummy,
        }
    }

    /// The backend kind of a type (`None` for `Unspecified`).
    pub fn kind(self) -> Option<StorageKind> {
        match self {
            StorageType::Unspecified => None,
            StorageType::Nfs => Some(StorageKind::Nfs),
            StorageType::ThreeFs => Some(StorageKind::ThreeFs),
            StorageType::VcnsThreeFs => Some(StorageKind::VcnsThreeFs),
            StorageType::Mooncake => Some(StorageKind::Mooncake),
            StorageType::TairMemPool => Some(StorageKind::TairMemPool),
            StorageType::EventReportL1p5 => Some(StorageKind::EventReportL1p5),
            StorageType::EventReportL2 => Some(StorageKind::EventReportL2),
            StorageType::Dummy => Some(StorageKind::Dummy),
        }
    }

    /// The fixed read weight of the type: NFS 5; 3FS, Mooncake, TairMemPool 3; others 1.
    pub fn read_weight(self) -> u32 {
        match self {
            StorageType::Nfs => 5,
            StorageType::ThreeFs | StorageType::Mooncake | StorageType::TairMemPool => 3,
            StorageType::Unspecified
            | StorageType::VcnsThreeFs
            | StorageType::EventReportL1p5
            | StorageType::EventReportL2
            | StorageType::Dummy => 1,
        }
    }

    /// The quota slot the type is counted in: VCNS 3FS counts as 3FS.
    pub fn quota_type(self) -> StorageType {
        match self {
            StorageType::VcnsThreeFs => StorageType::ThreeFs,
            other => other,
        }
    }

    /// Whether locations of this type are reported by cache subscribers (they hold no bytes
    /// kvcm allocates: no quota counts them, no write goes to them).
    pub fn is_event_report(self) -> bool {
        matches!(
            self,
            StorageType::EventReportL1p5 | StorageType::EventReportL2
        )
    }

    /// Position in [`StorageType::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}
