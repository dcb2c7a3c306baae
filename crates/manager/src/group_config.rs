//! An instance group as the manager stores it: which storages its instances write to, its
//! quotas, and the settings of its instances' indexes. Every field of the reference's
//! `InstanceGroup` has a home here, so that a group reads back exactly as it was written.

use crate::storage_type::StorageType;

/// One instance group.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupConfig {
    /// Unique name.
    pub name: String,
    /// Names of the storages its instances may write to, in preference order.
    pub storage_candidates: Vec<String>,
    /// The quota group its instances report (`global_quota_group_name`).
    pub quota_group_name: String,
    /// Informational cap on instances (not enforced, as in the reference).
    pub max_instance_count: i64,
    /// Byte quotas; `None` when the group was created without one (no writes then).
    pub quota: Option<GroupQuota>,
    /// Cache settings.
    pub cache: CacheConfig,
    /// Opaque text kept for the operator.
    pub user_data: String,
    /// Version, raised by every update.
    pub version: i64,
    /// Opaque text handed to the group's clients (upstream trunk `extra_info`; "" = none).
    pub extra_info: String,
    /// Revisit-interval buckets in seconds as given, e.g. "1,5,30,60" (upstream trunk
    /// `revisit_interval_buckets`; "" = none): stored and answered back; see
    /// [`revisit_buckets`] for the accepted form.
    pub revisit_interval_buckets: String,
    /// Names of the event-report storages whose reporters may report for the group's
    /// instances (upstream trunk `event_report_storage_candidates`; at most one per tier).
    pub event_report_storage_candidates: Vec<String>,
}

/// The buckets of a `revisit_interval_buckets` text: comma-separated positive integers
/// (seconds, white space around each allowed) in strictly increasing order; "" = none.
/// `None` when the text is not of that form.
pub fn revisit_buckets(text: &str) -> Option<Vec<u64>> {
    if text.trim().is_empty() {
        return Some(Vec::new());
    }
    let buckets: Vec<u64> = text
        .split(',')
        .map(|item| item.trim().parse::<u64>().ok().filter(|&s| s > 0))
        .collect::<Option<_>>()?;
    buckets
        .windows(2)
        .all(|pair| pair[0] < pair[1])
        .then_some(buckets)
}

/// A group's byte quotas.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GroupQuota {
    /// Total bytes over every storage type (0 = no writes, negative = refuse).
    pub capacity: i64,
    /// Per storage type limits.
    pub per_type: Vec<TypeQuota>,
}

/// A byte limit for one storage type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypeQuota {
    /// The storage type it limits.
    pub storage_type: StorageType,
    /// Bytes.
    pub capacity: i64,
}

/// Cache settings of a group.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheConfig {
    /// How and where blocks are reclaimed.
    pub reclaim: ReclaimStrategy,
    /// Which storage type new blocks go to.
    pub prefer: PreferStrategy,
    /// Settings of each instance's index.
    pub indexer: IndexerConfig,
}

/// Reclaim settings (see `reclaimer` and docs/capacity.md for what the reclaimer uses).
#[derive(Debug, Clone, PartialEq)]
pub struct ReclaimStrategy {
    /// The storage reclaimed.
    pub storage_unique_name: String,
    /// The eviction policy.
    pub policy: ReclaimPolicy,
    /// When reclaiming starts; `None` when not given.
    pub trigger: Option<ReclaimTrigger>,
    /// Seconds between reclaim checks (stored; the period is `kvcm.cache_reclaimer.period_ms`).
    pub trigger_period_seconds: i32,
    /// Blocks an instance may lose per reclaimer pass (not positive: the default).
    pub step_size: i32,
    /// Percent of blocks per reclaim step (stored, unused).
    pub step_percentage: i32,
    /// Delay between a reclaimer eviction (unpublished) and its physical delete (≥ 0).
    pub delay_before_delete_ms: i32,
}

/// Usage that starts reclaiming.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReclaimTrigger {
    /// Bytes used (stored; the reclaimer ignores it, as the reference's does).
    pub used_size: i64,
    /// The watermark: the fraction of a quota (or of `max_key_count`) above which the
    /// reclaimer evicts, in [0, 1] (0 = none).
    pub used_percentage: f64,
}

/// Eviction policies a group may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReclaimPolicy {
    /// None named.
    Unspecified,
    /// Least recently used.
    Lru,
    /// Least frequently used.
    Lfu,
    /// Time to live.
    Ttl,
}

/// Which storage type new blocks of a group go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreferStrategy {
    /// No preference: the first available candidate.
    Unspecified,
    /// Only this type (`CPS_ALWAYS_*`).
    Always(StorageType),
    /// This type when one is available, else the first available candidate (`CPS_PREFER_*`).
    Prefer(StorageType),
}

/// Settings of the index of each instance of a group.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct IndexerConfig {
    /// Key cap per instance (0 or negative = none).
    pub max_key_count: i64,
    /// Shard count (a power of two; 0 = default).
    pub mutex_shard_num: i64,
    /// Keys per backend batch (stored).
    pub batch_key_size: i64,
    /// Where the index lives (`storage_type` "local" here).
    pub backend: IndexBackend,
    /// The search cache in front of it.
    pub cache_policy: SearchCachePolicy,
    /// Upstream trunk's `mutex_enabled = false` (stored and answered; kvcm's index keeps its
    /// shard locks, which its atomic read-modify-write needs).
    pub mutex_disabled: bool,
}

/// The index backend of a group.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IndexBackend {
    /// Backend kind.
    pub storage_type: String,
    /// Backend address.
    pub storage_uri: String,
}

/// The search cache of a group's indexes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SearchCachePolicy {
    /// MiB (0 = no cache).
    pub capacity: i64,
    /// Policy name (only "lru").
    pub kind: String,
    /// log2 of the cache's shard count.
    pub cache_shard_bits: i32,
    /// Stored, unused.
    pub high_pri_pool_ratio: f64,
}
