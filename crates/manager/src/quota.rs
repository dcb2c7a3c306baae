//! Quotas (wire fact sheet §16.3): a group's total byte capacity, and per storage type a
//! capacity whose reached usage excludes that type from new writes. Usage is counted per
//! instance and type as locations enter the index (allocation) and leave it (deleter);
//! VCNS 3FS counts as 3FS.

use std::sync::atomic::{AtomicI64, Ordering};

use kvcm_storage::StorageKind;

use super::error::{ManagerError, ManagerResult};
use super::group_config::GroupConfig;
use super::storage_type::StorageType;
use super::Manager;
use crate::sync::read_lock;

/// Number of usage slots (one per storage type; VCNS shares the 3FS slot).
const TYPE_SLOTS: usize = StorageType::ALL.len();

/// Bytes stored per storage type by one instance.
#[derive(Debug, Default)]
pub struct TypeUsage {
    bytes: [AtomicI64; TYPE_SLOTS],
}

impl TypeUsage {
    /// Adds (or, negative, removes) bytes of a storage type.
    pub fn add(&self, storage_type: StorageType, bytes: i64) {
        self.bytes[storage_type.quota_type().index()].fetch_add(bytes, Ordering::Relaxed);
    }

    /// Bytes of every type.
    fn snapshot(&self) -> [i64; TYPE_SLOTS] {
        std::array::from_fn(|i| self.bytes[i].load(Ordering::Relaxed))
    }
}

/// A group's usage, summed over its instances.
pub struct GroupUsage {
    by_type: [i64; TYPE_SLOTS],
}

impl GroupUsage {
    fn total(&self) -> i64 {
        self.by_type
            .iter()
            .fold(0i64, |sum, &b| sum.saturating_add(b))
    }

    /// Whether the group's quota for this backend kind (if any) still has room.
    pub fn has_room(&self, group: &GroupConfig, kind: StorageKind) -> bool {
        let wanted = StorageType::of(kind).quota_type();
        let quotas = group.quota.iter().flat_map(|q| &q.per_type);
        quotas
            .filter(|q| q.storage_type.quota_type() == wanted)
            .all(|q| q.capacity > self.by_type[wanted.index()])
    }
}

impl Manager {
    /// The group's usage; refuses writes when it reached the group's capacity
    /// (capacity 0 = no writes, negative = refuse).
    pub(crate) fn group_usage_with_room(&self, group: &GroupConfig) -> ManagerResult<GroupUsage> {
        let mut by_type = [0i64; TYPE_SLOTS];
        for instance in read_lock(&self.instances).values() {
            if instance.group() == group.name {
                for (sum, bytes) in by_type.iter_mut().zip(instance.usage().snapshot()) {
                    *sum = sum.saturating_add(bytes);
                }
            }
        }
        let usage = GroupUsage { by_type };
        let capacity = group.quota.as_ref().map_or(0, |q| q.capacity);
        if capacity < 0 || usage.total() >= capacity {
            return Err(ManagerError::NoSpace(format!(
                "group {:?} uses {} of its {capacity} bytes",
                group.name,
                usage.total()
            )));
        }
        Ok(usage)
    }
}
