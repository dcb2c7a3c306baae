//! kvcm-storage: data storage backends. A backend turns "these new blocks of this instance"
//! into location URIs (wire fact sheet §14), creates what the tier needs (directories, files),
//! and frees a block's bytes on delete without touching its neighbours.
//!
//! The control plane holds backends as `Arc<dyn DataStorage>`; it never parses a URI itself.

pub mod allocator;
mod allowed_roots;
pub use allowed_roots::AllowedRoots;
mod backends;
mod block_file;
mod kind;
mod live_blocks;
mod names;
pub use names::MAX_NAME_BYTES;
mod packing;
pub mod pool;
mod registry;
#[cfg(test)]
mod test_support;
mod uri;
mod validate;
pub use validate::check_block_file_path;

pub use backends::{open, open_recovered};
pub use registry::{HealthListener, StorageRegistry, StorageStatus};
pub use uri::BlockUri;

/// A block key: a signed 64-bit prefix hash.
pub type BlockKey = i64;

/// The kind of a backend; decides the URI scheme (`file`, `hf3fs`, `mooncake`, `pace`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StorageKind {
    /// NFS or a local directory (`file://`).
    Nfs,
    /// A 3FS mount (`hf3fs://`).
    ThreeFs,
    /// VCNS 3FS (`hf3fs://`); not available in open source.
    VcnsThreeFs,
    /// Mooncake store (`mooncake://`); URIs only, nothing allocated here.
    Mooncake,
    /// Memory pool (`pace://`): regions of `kvcm pool` nodes.
    TairMemPool,
    /// Locations reported by cache subscribers of the L1.5 tier (upstream trunk's
    /// `ST_EVENT_REPORT_L1P5`): never allocated, deleted or read here.
    EventReportL1p5,
    /// As [`StorageKind::EventReportL1p5`], tier L2 (`ST_EVENT_REPORT_L2`, the P2P peers).
    EventReportL2,
    /// Upstream trunk's `ST_DUMMY` (`dummy://`): places locations, holds no bytes.
    Dummy,
}

/// The tier of an event-report storage (upstream trunk's two `ST_EVENT_REPORT_*` types).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReportTier {
    /// `ST_EVENT_REPORT_L1P5`.
    L1p5,
    /// `ST_EVENT_REPORT_L2`: the tier whose reporters are peer-to-peer sources.
    L2,
}

/// The timings of an event-report storage's reporters (upstream `EventReportStorageSpec`),
/// in milliseconds, defaults applied (a wire 0 means the default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportTimings {
    /// A reporter without a heartbeat for this long is hidden from queries.
    pub heartbeat_timeout_ms: u64,
    /// After this long past the heartbeat timeout the reporter is unregistered and its
    /// metadata cleaned.
    pub cleanup_grace_ms: u64,
    /// How often liveness is checked.
    pub liveness_check_interval_ms: u64,
    /// The least time between two successful snapshots of one reporter.
    pub snapshot_min_interval_ms: u64,
    /// How long a snapshot waits for admitted deltas (and a delta for a snapshot).
    pub snapshot_delta_drain_timeout_ms: u64,
}

impl Default for ReportTimings {
    fn default() -> Self {
        ReportTimings {
            heartbeat_timeout_ms: 30_000,
            cleanup_grace_ms: 300_000,
            liveness_check_interval_ms: 1_000,
            snapshot_min_interval_ms: 30_000,
            snapshot_delta_drain_timeout_ms: 10_000,
        }
    }
}

/// Backend-specific settings (field names as in the reference protos).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageSpec {
    /// NFS / local directory.
    Nfs {
        /// Directory prefix, concatenated verbatim with object names.
        root_path: String,
        /// Blocks packed per file (≤ 0 means 1).
        key_count_per_file: i32,
    },
    /// 3FS mount.
    ThreeFs {
        /// Informational.
        cluster_name: String,
        /// Mount path.
        mountpoint: String,
        /// Data directory below the mount point.
        root_dir: String,
        /// Blocks packed per file (≤ 0 means 1).
        key_count_per_file: i32,
        /// Create the (empty) file and its parents at allocation time.
        touch_file_when_create: bool,
    },
    /// VCNS 3FS: the 3FS fields plus a remote metadata service.
    VcnsThreeFs {
        /// 3FS mount path.
        mountpoint: String,
        /// Data directory below the mount point.
        root_dir: String,
        /// Remote host.
        remote_host: String,
        /// Remote port.
        remote_port: i32,
        /// Metadata storage URI.
        meta_storage_uri: String,
    },
    /// Mooncake store.
    Mooncake {
        /// host[:port] of the server-side Mooncake client.
        local_hostname: String,
        /// Mooncake metadata service address.
        metadata_connstring: String,
        /// `rdma` or `tcp`.
        protocol: String,
        /// NIC name(s); required when protocol is `rdma`.
        rdma_device: String,
        /// Mooncake master address.
        master_service_entry: String,
    },
    /// Tair memory pool.
    TairMemPool {
        /// Pool metadata service domain.
        domain: String,
        /// Connect / request timeout.
        timeout: i32,
        /// Name-service discovery switch (2026-02; upstream trunk reserves its number).
        enable_vipserver: bool,
        /// Upstream trunk's discovery URL (`vipserver://…`, `spectrum://…`,
        /// `static://h:p,h:p`; empty = use `domain`). Stored: kvcm's pool nodes register
        /// themselves (docs/data-plane.md).
        service_discovery_url: String,
        /// Upstream trunk's medium: 0 unset, 2 DRAM (5 SSD needs ST_TAIRMEMPOOL_SSD, not
        /// served).
        media_type: i32,
    },
    /// Places locations and holds no bytes (upstream trunk's dummy storage: control-plane
    /// tests and load runs without a data tier).
    Dummy {
        /// Absolute path printed in the URIs; nothing is created there.
        root_path: String,
        /// Stored and answered (≤ 0 means 1); every part is its own object.
        key_count_per_file: i32,
    },
    /// A namespace of locations that cache subscribers report (ReportEvent); holds no bytes.
    EventReport {
        /// Its tier.
        tier: ReportTier,
        /// Its reporters' timings.
        timings: ReportTimings,
    },
}

/// One registered storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageConfig {
    /// Storage id; the host part of every URI on it.
    pub global_unique_name: String,
    /// Backend settings.
    pub spec: StorageSpec,
    /// Verify the tier is reachable when the backend is opened.
    pub check_storage_available_when_open: bool,
}

/// One part of a block as the instance registered it (e.g. one per TP rank).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockSpec {
    /// Part name.
    pub name: String,
    /// Bytes of this part per block.
    pub size: i64,
}

/// One new block to place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockToAllocate {
    /// The block key.
    pub key: BlockKey,
    /// Indexes into `AllocationRequest::specs` of the parts this block carries, ascending
    /// (all of them, or those of the block's location spec group).
    pub spec_indexes: Vec<usize>,
}

/// The new blocks of one StartWriteCache call (the allocation unit).
#[derive(Debug, Clone, Copy)]
pub struct AllocationRequest<'a> {
    /// Owning instance (first component of object names).
    pub instance_id: &'a str,
    /// The instance's parts, in registration order.
    pub specs: &'a [BlockSpec],
    /// The blocks to place, in request order.
    pub blocks: &'a [BlockToAllocate],
}

/// A part placed by an earlier process, as its write-ahead log names it
/// ([`DataStorage::adopt`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamedPart<'a> {
    /// The instance whose block it is.
    pub instance_id: &'a str,
    /// The object's [`DurableAddress::Named`] name.
    pub name: &'a str,
    /// The block in the object.
    pub block: u32,
    /// Bytes of the part.
    pub size: u64,
}

/// Where one part of one block lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatedSpec {
    /// Part name.
    pub name: String,
    /// Location URI (§14).
    pub uri: String,
    /// The same place in the backend's compact terms ([`DataStorage::write_uri`] renders
    /// `uri` from it).
    pub address: PartAddress,
}

/// Where a backend put one part of one block, in the backend's own compact terms: with the
/// block's key, instance and part it is enough to render the part's URI again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PartAddress {
    /// The backend's object: a file id for file backends (valid while any block of the file
    /// is allocated; reused after the file is released); 0 where the URI needs none.
    pub object: u32,
    /// The block's index inside the object (0 for a single-block object).
    pub block: u32,
    /// Which use of a reused object id this is: an address of an earlier file under the same
    /// id renders nothing, never the newer file's URI.
    pub generation: u16,
}

/// One allocated part, as [`DataStorage::uri`] needs it.
#[derive(Debug, Clone, Copy)]
pub struct PartRef<'a> {
    /// Owning instance.
    pub instance_id: &'a str,
    /// The block key.
    pub key: BlockKey,
    /// The part as registered.
    pub spec: &'a BlockSpec,
    /// Where the backend put it.
    pub address: PartAddress,
}

/// A part's URI cut where its block number goes: `head`, the block number shifted left by
/// `block_shift` in decimal (when there is one), `tail`. Readers that render URIs themselves
/// (the lookup table's clients) share templates between the blocks of one object (a block
/// file, a pool node's region).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UriTemplate {
    /// Text before the block number.
    pub head: String,
    /// The block number, when the URI has one.
    pub block: Option<u32>,
    /// The URI holds `block << block_shift` (a pool part's byte offset is its granule
    /// number times the granule); at most 32, so the shifted number fits in a `u64`.
    pub block_shift: u8,
    /// Text after it.
    pub tail: String,
}

impl UriTemplate {
    /// A template without a block number: the whole URI.
    pub fn whole(uri: String) -> UriTemplate {
        UriTemplate {
            head: uri,
            block: None,
            block_shift: 0,
            tail: String::new(),
        }
    }

    /// Appends the URI to `out`.
    pub fn render(&self, out: &mut String) {
        out.push_str(&self.head);
        if let Some(block) = self.block {
            let number = u64::from(block) << self.block_shift;
            out.push_str(itoa::Buffer::new().format(number));
        }
        out.push_str(&self.tail);
    }
}

impl From<live_blocks::OtherBlockSize> for StorageError {
    /// Refused like a full storage: the blocks go to the group's next storage, or the call
    /// fails naming this.
    fn from(other: live_blocks::OtherBlockSize) -> Self {
        StorageError::Full(format!(
            "{} still holds blocks of {} bytes (an earlier instance of this id, not deleted yet), \
             not {}",
            other.name, other.tracked, other.asked
        ))
    }
}

impl From<live_blocks::TooManyReferences> for StorageError {
    fn from(_: live_blocks::TooManyReferences) -> Self {
        StorageError::InvalidRequest(
            "a block file is held by too many allocations (or there are 2^32 files)".into(),
        )
    }
}

/// Errors of a storage backend.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The configuration is invalid; the message names the field.
    #[error("invalid storage config: {0}")]
    InvalidConfig(String),
    /// An allocation request is malformed (bad names, sizes, part indexes, repeated keys);
    /// nothing was allocated.
    #[error("invalid allocation request: {0}")]
    InvalidRequest(String),
    /// This backend kind cannot be opened in this build.
    #[error("storage type {0:?} is not supported")]
    Unsupported(StorageKind),
    /// A URI is not one this backend produced.
    #[error("invalid location uri {uri:?}: {reason}")]
    InvalidUri {
        /// The offending URI.
        uri: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No storage is registered under this name.
    #[error("storage {0:?} is not registered")]
    UnknownStorage(String),
    /// A storage is already registered under this name.
    #[error("storage {0:?} is already registered")]
    DuplicateStorage(String),
    /// No room is left for the blocks; nothing was allocated.
    #[error("storage full: {0}")]
    Full(String),
    /// The place an allocation needs holds a file kvcm did not allocate; nothing was allocated
    /// and the file is left alone.
    #[error("{0} exists and was not allocated by kvcm: left alone")]
    Foreign(String),
    /// The storage cannot serve now (e.g. a pool without a live node).
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// A pool node incarnation that is not a live member.
    #[error("unknown pool node: {0}")]
    UnknownPoolNode(String),
    /// The tier failed.
    #[error("storage i/o failed on {path}: {source}")]
    Io {
        /// File or directory involved.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// What of a part's address outlives the manager process that allocated it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DurableAddress {
    /// The address means the same to the next process (it names nothing process-local).
    AsIs,
    /// The address names a process-local object id; the object's name (below the storage's
    /// base) lets [`DataStorage::adopt`] track the part again in another process.
    Named(String),
    /// The bytes do not outlive the process, or the address names nothing any more.
    Lost,
}

/// A data storage backend.
pub trait DataStorage: Send + Sync + std::fmt::Debug {
    /// The configuration this backend was opened with.
    fn config(&self) -> &StorageConfig;
    /// The backend kind.
    fn kind(&self) -> StorageKind;
    /// Places the blocks: one entry per block, in request order; each lists the block's parts
    /// (in `spec_indexes` order) with their URIs.
    fn allocate(
        &self,
        request: &AllocationRequest<'_>,
    ) -> Result<Vec<Vec<AllocatedSpec>>, StorageError>;
    /// Appends the URI of an allocated part to `out`, byte-identical to the one `allocate`
    /// returned; false (nothing appended) when the backend no longer knows the address (its
    /// object was freed).
    fn write_uri(&self, part: &PartRef<'_>, out: &mut String) -> bool;
    /// The URI of an allocated part as a template that renders to exactly what
    /// [`DataStorage::write_uri`] writes; `None` when the backend no longer knows it.
    fn uri_template(&self, part: &PartRef<'_>) -> Option<UriTemplate>;
    /// Frees the bytes of these locations (URIs this backend produced).
    fn delete(&self, uris: &[String]) -> Result<(), StorageError>;
    /// Probes the tier (mount present, directory writable, ...).
    fn check_health(&self) -> Result<(), StorageError>;
    /// What of `address` a write-ahead log must keep for the part to be found again after a
    /// restart.
    fn durable_address(&self, _address: PartAddress) -> DurableAddress {
        DurableAddress::AsIs
    }
    /// Takes back a part an earlier process placed in a named object (a
    /// [`DurableAddress::Named`]): it counts as allocated once more (one later delete frees
    /// it) and its address in this process is returned. Nothing is created or written.
    fn adopt(&self, part: &NamedPart<'_>) -> Result<PartAddress, StorageError> {
        Err(StorageError::InvalidRequest(format!(
            "storage {:?} has no named objects to adopt ({:?})",
            self.config().global_unique_name,
            part.name
        )))
    }
    /// The memory pool behind this backend, when it is one (its members join and heartbeat
    /// through it).
    fn as_pool(&self) -> Option<&pool::MemPool> {
        None
    }
}
