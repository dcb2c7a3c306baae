//! Quotas (wire fact sheet §16.3, docs/capacity.md): a group's total byte capacity, per
//! storage type a byte capacity, and per instance the key cap `max_key_count`.
//!
//! Usage is counted per instance and type from the moment a StartWriteCache allocates a
//! location (and given back when the allocation is freed before it entered the index) until
//! the deleter frees it, and recomputed from the index on recovery; VCNS 3FS counts as 3FS.
//!
//! Invariants:
//! - budgets are exact under concurrent writes: a StartWriteCache budgets and allocates
//!   inside its group's write gate ([`WriteGates`]) and counts what it placed before leaving
//!   it, so the next one sees those bytes; its new keys count against the key cap
//!   ([`PendingKeys`]) until they are in the index (briefly twice, which only refuses
//!   sooner);
//! - no counter wraps: additions saturate at `i64::MAX` (a saturated counter keeps refusing
//!   writes) and group sums use checked arithmetic, an overflowing sum reading as full;
//! - a write is budgeted block by block ([`Budget`]): a block that would take the group past
//!   its capacity, or the instance past its key cap, is refused; one that would take a type
//!   past its type quota is left to a storage of another candidate type.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use kvcm_storage::StorageKind;

use super::error::{ManagerError, ManagerResult};
use super::group_config::GroupConfig;
use super::instance::Instance;
use super::storage_type::StorageType;
use super::Manager;
use crate::sync::{lock, read_lock};

/// Stripes of [`WriteGates`].
const WRITE_GATES: usize = 64;

/// Per group (striped by name), the lock a StartWriteCache holds while it budgets and
/// allocates, so that budgets never overlap.
#[derive(Debug)]
pub(crate) struct WriteGates([Mutex<()>; WRITE_GATES]);

impl Default for WriteGates {
    fn default() -> WriteGates {
        WriteGates(std::array::from_fn(|_| Mutex::new(())))
    }
}

impl WriteGates {
    /// Holds the gate of `group` until the guard drops.
    pub(crate) fn enter(&self, group: &str) -> MutexGuard<'_, ()> {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        group.hash(&mut hasher);
        lock(&self.0[(hasher.finish() % WRITE_GATES as u64) as usize])
    }
}

/// New keys a StartWriteCache placed that may not be in the index yet: they count against
/// the instance's key cap until this drops.
#[derive(Debug)]
pub(crate) struct PendingKeys<'a> {
    counter: &'a AtomicU64,
    count: u64,
}

impl<'a> PendingKeys<'a> {
    /// Counts `count` new keys of `instance`.
    pub(crate) fn hold(instance: &'a Instance, count: u64) -> PendingKeys<'a> {
        instance.pending_keys.fetch_add(count, Ordering::AcqRel);
        PendingKeys {
            counter: &instance.pending_keys,
            count,
        }
    }
}

impl Drop for PendingKeys<'_> {
    fn drop(&mut self) {
        self.counter.fetch_sub(self.count, Ordering::AcqRel);
    }
}

/// Number of usage slots (one per storage type; VCNS shares the 3FS slot).
const TYPE_SLOTS: usize = StorageType::ALL.len();

/// Bytes stored per storage type by one instance.
#[derive(Debug, Default)]
pub struct TypeUsage {
    bytes: [AtomicI64; TYPE_SLOTS],
}

impl TypeUsage {
    /// Adds (or, negative, removes) bytes of a storage type, saturating instead of wrapping
    /// (never below 0).
    pub fn add(&self, storage_type: StorageType, bytes: i64) {
        let slot = &self.bytes[storage_type.quota_type().index()];
        let moved = |current: i64| Some(current.saturating_add(bytes).max(0));
        // The closure never refuses, so the update always succeeds.
        let _ = slot.fetch_update(Ordering::Relaxed, Ordering::Relaxed, moved);
    }

    /// Bytes of every type.
    fn snapshot(&self) -> [i64; TYPE_SLOTS] {
        std::array::from_fn(|i| self.bytes[i].load(Ordering::Relaxed))
    }

    /// Bytes of one storage type.
    pub fn of(&self, storage_type: StorageType) -> i64 {
        self.bytes[storage_type.quota_type().index()].load(Ordering::Relaxed)
    }

    /// Bytes over every type (saturating).
    pub fn total(&self) -> i64 {
        self.snapshot()
            .iter()
            .fold(0i64, |sum, &b| sum.saturating_add(b))
    }
}

/// A group's usage, summed over its instances; `None` for a sum past `i64::MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupUsage {
    /// Bytes per type slot.
    by_type: [Option<i64>; TYPE_SLOTS],
}

impl GroupUsage {
    /// The sum of these usages, with checked arithmetic.
    fn sum<'a>(usages: impl Iterator<Item = &'a TypeUsage>) -> GroupUsage {
        let mut by_type = [Some(0i64); TYPE_SLOTS];
        for usage in usages {
            for (sum, bytes) in by_type.iter_mut().zip(usage.snapshot()) {
                *sum = sum.and_then(|s| s.checked_add(bytes));
            }
        }
        GroupUsage { by_type }
    }

    /// Total bytes, `None` when past `i64::MAX`.
    pub fn total(&self) -> Option<i64> {
        self.by_type
            .iter()
            .try_fold(0i64, |sum, b| sum.checked_add((*b)?))
    }

    /// Bytes of one storage type, `None` when past `i64::MAX`.
    pub fn of(&self, storage_type: StorageType) -> Option<i64> {
        self.by_type[storage_type.quota_type().index()]
    }
}

/// Why a block got no room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoRoom {
    /// The type quota of this storage's type is reached: another type may take it.
    Type(String),
    /// The group quota or the instance's key cap is reached: nothing may take it.
    Refused(String),
}

/// What one StartWriteCache may still take: bytes under the group quota, under each type
/// quota, and new keys under the instance's `max_key_count`.
#[derive(Debug, Clone)]
pub struct Budget {
    group: String,
    group_room: i64,
    /// Room per type slot; `None` = no type quota.
    type_room: [Option<i64>; TYPE_SLOTS],
    /// New keys left; `None` = no cap.
    key_room: Option<u64>,
    /// The key cap (for messages).
    max_keys: i64,
}

impl Budget {
    /// The budget of a group with this usage and an instance holding `keys` keys.
    pub fn new(group: &GroupConfig, usage: &GroupUsage, keys: u64) -> Budget {
        let room =
            |capacity: i64, used: Option<i64>| used.map_or(0, |u| capacity - u.min(capacity));
        let capacity = group.quota.as_ref().map_or(0, |q| q.capacity.max(0));
        let mut type_room = [None; TYPE_SLOTS];
        for quota in group.quota.iter().flat_map(|q| &q.per_type) {
            let slot = &mut type_room[quota.storage_type.quota_type().index()];
            let here = room(quota.capacity.max(0), usage.of(quota.storage_type));
            *slot = Some(slot.map_or(here, |other: i64| other.min(here)));
        }
        let max_keys = group.cache.indexer.max_key_count;
        Budget {
            group: group.name.clone(),
            group_room: room(capacity, usage.total()),
            type_room,
            key_room: u64::try_from(max_keys)
                .ok()
                .filter(|&m| m > 0)
                .map(|m| m.saturating_sub(keys)),
            max_keys,
        }
    }

    /// Takes room for one block of `bytes` on a storage of this type (`new_key`: the block's
    /// key is not in the index yet), or says why there is none (and takes nothing).
    pub fn take(
        &mut self,
        storage_type: StorageType,
        bytes: i64,
        new_key: bool,
    ) -> Result<(), NoRoom> {
        if new_key && self.key_room == Some(0) {
            return Err(NoRoom::Refused(format!(
                "the instance holds the {} keys that max_key_count of group {:?} allows",
                self.max_keys, self.group
            )));
        }
        if bytes > self.group_room {
            return Err(NoRoom::Refused(format!(
                "a block of {bytes} bytes exceeds the {} bytes left in the quota of group {:?}",
                self.group_room, self.group
            )));
        }
        let slot = storage_type.quota_type().index();
        if let Some(room) = self.type_room[slot].filter(|&room| bytes > room) {
            return Err(NoRoom::Type(format!(
                "a block of {bytes} bytes exceeds the {room} bytes left in the {:?} quota of group {:?}",
                storage_type.quota_type(),
                self.group
            )));
        }
        self.group_room -= bytes;
        if let Some(room) = &mut self.type_room[slot] {
            *room -= bytes;
        }
        if new_key {
            self.key_room = self.key_room.map(|k| k - 1);
        }
        Ok(())
    }

    /// Gives back what [`Budget::take`] took for a block no storage could place.
    pub fn give_back(&mut self, storage_type: StorageType, bytes: i64, new_key: bool) {
        self.group_room += bytes;
        if let Some(room) = &mut self.type_room[storage_type.quota_type().index()] {
            *room += bytes;
        }
        if new_key {
            self.key_room = self.key_room.map(|k| k + 1);
        }
    }

    /// Whether a type quota still has room for something on a storage of this kind.
    pub fn type_has_room(&self, kind: StorageKind) -> bool {
        let slot = StorageType::of(kind).quota_type().index();
        self.type_room[slot].is_none_or(|room| room > 0)
    }
}

impl Manager {
    /// The group's usage, summed over its instances.
    pub(crate) fn group_usage(&self, group: &str) -> GroupUsage {
        let instances = read_lock(&self.instances);
        let members = instances.values().filter(|i| i.group() == group);
        GroupUsage::sum(members.map(|i| i.usage()))
    }

    /// The write budget of an instance; refuses writes when its group reached its capacity
    /// (capacity 0 = no writes, negative = refuse).
    pub(crate) fn write_budget(
        &self,
        group: &GroupConfig,
        instance: &Instance,
    ) -> ManagerResult<Budget> {
        let usage = self.group_usage(&group.name);
        let capacity = group.quota.as_ref().map_or(0, |q| q.capacity);
        match usage.total() {
            Some(used) if capacity >= 0 && used < capacity => {}
            used => {
                let used = used.map_or_else(|| "more than i64::MAX".to_string(), |u| u.to_string());
                return Err(ManagerError::NoSpace(format!(
                    "group {:?} uses {used} of its {capacity} bytes",
                    group.name
                )));
            }
        }
        let keys = instance.index.len()? + instance.pending_keys.load(Ordering::Acquire);
        Ok(Budget::new(group, &usage, keys))
    }
}

/// A group's capacity as the metrics report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupCapacity {
    /// The group.
    pub name: String,
    /// Its total byte quota (`quota.capacity`; 0 when it has none).
    pub quota_bytes: i64,
    /// Bytes its instances store (`None`: past `i64::MAX`).
    pub used_bytes: Option<i64>,
    /// Per storage type (quota slots, VCNS 3FS counted as 3FS) that has a quota or usage.
    pub per_type: Vec<TypeCapacity>,
    /// Its instances.
    pub instances: Vec<InstanceCapacity>,
}

/// A group's quota and usage of one storage type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeCapacity {
    /// The type (its quota slot).
    pub storage_type: StorageType,
    /// Its type quota, if the group has one.
    pub quota_bytes: Option<i64>,
    /// Bytes of the type the group's instances store (`None`: past `i64::MAX`).
    pub used_bytes: Option<i64>,
}

/// The types of `group` with a quota or usage, in [`StorageType::ALL`] order.
fn per_type(group: &GroupConfig, usage: &GroupUsage) -> Vec<TypeCapacity> {
    let slots = StorageType::ALL
        .into_iter()
        .filter(|t| *t != StorageType::Unspecified && !t.is_event_report() && t.quota_type() == *t);
    let quota_of = |t: StorageType| {
        let limits = group.quota.as_ref().map(|q| q.per_type.as_slice());
        let limit = limits.unwrap_or(&[]).iter();
        let mut own = limit.filter(|limit| limit.storage_type.quota_type() == t);
        own.next().map(|limit| limit.capacity)
    };
    slots
        .map(|t| TypeCapacity {
            storage_type: t,
            quota_bytes: quota_of(t),
            used_bytes: usage.of(t),
        })
        .filter(|c| c.quota_bytes.is_some() || c.used_bytes != Some(0))
        .collect()
}

/// An instance's usage as the metrics report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceCapacity {
    /// The instance.
    pub instance_id: std::sync::Arc<str>,
    /// Bytes it stores.
    pub used_bytes: i64,
    /// Keys in its index (every state).
    pub keys: u64,
}

impl Manager {
    /// Every group's quota and usage, by group name, instances by id.
    pub fn capacity_report(&self) -> Vec<GroupCapacity> {
        let mut instances = self.all_instances();
        instances.sort_by(|a, b| a.id().cmp(b.id()));
        self.list_groups()
            .iter()
            .map(|group| {
                let usage = self.group_usage(&group.name);
                GroupCapacity {
                    name: group.name.clone(),
                    quota_bytes: group.quota.as_ref().map_or(0, |q| q.capacity),
                    used_bytes: usage.total(),
                    per_type: per_type(group, &usage),
                    instances: instances
                        .iter()
                        .filter(|i| i.group() == group.name)
                        .map(|i| InstanceCapacity {
                            instance_id: i.id().clone(),
                            used_bytes: i.usage().total(),
                            keys: i.index.len().unwrap_or(0),
                        })
                        .collect(),
                }
            })
            .collect()
    }
}
