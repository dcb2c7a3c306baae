//! kvcm-index: the metadata index, block key → entry, for one instance's key space.
//!
//! One trait, [`MetaIndex`], several backends (local sharded memory, Redis / Redis Cluster), and one
//! conformance suite that every backend must pass. A write-ahead log attaches to a backend
//! through [`ChangeLog`].
//!
//! Invariants every backend keeps:
//! - a batch call is atomic per key, and `read_modify_write` is atomic over all its keys:
//!   no other writer observes or changes any of them between the read and the write;
//! - results come back in the order of the keys asked for (duplicates answered each time).

mod cache;
mod change_log;
#[cfg(feature = "testing")]
pub mod conformance;
mod local;
pub mod redis;

pub use cache::{CacheConfig, CacheStats, CachedIndex};
pub use change_log::{Change, ChangeLog, LogTicket};
pub use local::{BuildMixHasher, LocalIndex, LocalIndexConfig, MAX_SHARD_BITS};
pub use redis::{RedisIndex, RedisIndexConfig, U64Codec, ValueCodec};

/// A block key: a signed 64-bit prefix hash (see the wire fact sheet §9).
pub type BlockKey = i64;

/// What `read_modify_write` does with one key after looking at its current value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Modify<V> {
    /// Leave the key as it is.
    Keep,
    /// Store this value (insert or replace).
    Put(V),
    /// Remove the key.
    Delete,
}

/// Position of a scan; start with `ScanCursor::START`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScanCursor(pub u64);

impl ScanCursor {
    /// The cursor that starts a scan.
    pub const START: ScanCursor = ScanCursor(0);
}

/// One page of a scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanPage {
    /// Keys of this page (each key present for the whole scan is returned exactly once).
    pub keys: Vec<BlockKey>,
    /// Where the next page starts; `None` when the scan is complete.
    pub next: Option<ScanCursor>,
}

/// Errors of an index backend.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// The index holds `max` keys and the write would add more.
    #[error("index is full: {max} keys")]
    Full {
        /// The configured key cap.
        max: u64,
    },
    /// An argument or setting is out of range (the message names it); nothing changed.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A newer leader wrote to this key space: a write with fencing token `token` is stale
    /// and was refused; nothing changed.
    #[error("fenced: a newer leader wrote here; this node's token {token} is stale")]
    Fenced {
        /// The refused token.
        token: u64,
    },
    /// The backend failed (I/O, connection, corrupt data).
    #[error("index backend failed: {0}")]
    Backend(String),
}

/// Why [`MetaIndex::read_modify_write_batches`] stopped: batch `applied` failed with `error`
/// and changed nothing, the batches before it are applied, the later ones were not run.
/// (Should waiting for the log fail instead, `error` is that failure: the batches before
/// `applied` are applied in memory, and the log refuses every later write.)
#[derive(Debug)]
pub struct BatchesStopped {
    /// Batches applied before the failure.
    pub applied: usize,
    /// Whether those batches are durable: false when waiting for the log failed (they are
    /// applied in memory only, and a restart may bring back what they changed).
    pub durable: bool,
    /// Why batch `applied` (or the wait for the log) failed.
    pub error: IndexError,
}

/// The metadata index of one key space. `V` is the stored entry (cheap to clone: use an `Arc`).
pub trait MetaIndex<V>: Send + Sync {
    /// Values of `keys`, in order; `None` for an absent key.
    fn get(&self, keys: &[BlockKey]) -> Result<Vec<Option<V>>, IndexError>;
    /// Inserts or replaces every entry.
    fn put(&self, entries: Vec<(BlockKey, V)>) -> Result<(), IndexError>;
    /// Removes the keys; returns how many were present.
    fn delete(&self, keys: &[BlockKey]) -> Result<usize, IndexError>;
    /// Calls `f` once per key (in key order) with its current value while every key of the
    /// batch is locked, then applies what `f` returned. `f` must not call into the same index
    /// (the batch's locks are held while it runs). An optimistic backend (`RedisIndex`) runs
    /// `f` again over the whole batch when another writer changed one of its keys first; only
    /// the last run's results are applied, so `f` should have no effect besides its answer.
    fn read_modify_write(
        &self,
        keys: &[BlockKey],
        f: &mut dyn FnMut(BlockKey, Option<&V>) -> Modify<V>,
    ) -> Result<(), IndexError>;
    /// [`MetaIndex::read_modify_write`] over each of `batches` in turn (each under its own
    /// locks, so a batch of one lock group blocks the readers of that group only), returning
    /// once every applied batch is durable: a backend with a write-ahead log waits for it once,
    /// after the last batch, so a background writer's many small batches share its syncs.
    /// It stops at the first batch that fails ([`BatchesStopped`]: the batches before it
    /// stay applied).
    fn read_modify_write_batches(
        &self,
        batches: &[Vec<BlockKey>],
        f: &mut dyn FnMut(BlockKey, Option<&V>) -> Modify<V>,
    ) -> Result<(), BatchesStopped> {
        for (applied, keys) in batches.iter().enumerate() {
            self.read_modify_write(keys, f)
                .map_err(|error| BatchesStopped {
                    applied,
                    durable: true,
                    error,
                })?;
        }
        Ok(())
    }
    /// Up to `limit` keys from `cursor` on.
    fn scan(&self, cursor: ScanCursor, limit: usize) -> Result<ScanPage, IndexError>;
    /// Up to `count` distinct keys drawn uniformly at random.
    fn sample(&self, count: usize) -> Result<Vec<BlockKey>, IndexError>;
    /// Number of keys stored.
    fn len(&self) -> Result<u64, IndexError>;
    /// Which lock of the index guards `key` (keys of one group share it): background writers
    /// batch keys by it, so that a batch blocks readers of one group only. 0 for every key
    /// of a backend without such locks.
    fn lock_group(&self, key: BlockKey) -> usize {
        let _ = key;
        0
    }
    /// True when no key is stored.
    fn is_empty(&self) -> Result<bool, IndexError> {
        Ok(self.len()? == 0)
    }
}
