//! Durability of the manager's state: a write-ahead log of every registry change and every
//! committed index batch, periodic snapshots that bound the log, and recovery on start-up.
//!
//! Layout of the journal directory: log segments `wal-<seq>.log` and snapshots
//! `snapshot-<seq>.snap` (see [`files`] for the format). A snapshot of sequence `s` holds the
//! whole state as of some moment after segment `s - 1` was closed; replay reads the newest
//! complete snapshot, then every segment from `s` on, in order. Records are whole values (an
//! object's config, a key's full entry or its removal), so replaying a suffix of a key's
//! history over a snapshot that already saw part of it ends in the right state.
//!
//! What is recorded: storages (with the incarnation handle entries name), groups, instances,
//! accounts, and each instance's entries as [`record::DurableEntry`] — locations whose bytes
//! outlive the process, with the names of file-tier objects so they can be adopted again.
//! Derived state is rebuilt, not logged: file-tier block references (by adoption), quota
//! usage, location nonces (the next one is above every restored one). Not recorded: storage
//! availability toggles, open write sessions (their WRITING locations are cleaned up on
//! recovery: bytes freed, entries dropped) and memory-pool locations (pools restart empty).
//!
//! Invariants:
//! - a write is acknowledged only after its record is durable under the fsync policy (the
//!   index waits through [`kvcm_index::ChangeLog`], registry calls through
//!   [`crate::Manager`]'s `log_registry`);
//! - per key, log order is memory order (records are appended under the key's lock);
//! - after a write or sync failure the journal refuses every later write until restart;
//!   reads go on (see [`writer`]);
//! - recovery cuts a torn or corrupt tail at the last valid record and reports it; a record
//!   that decodes but is refused by validation (a damaged registry object) is reported and
//!   skipped, the rest is restored.

mod files;
mod record;
mod recover;
mod segment;
mod shared;
mod sink;
mod snapshot;
#[cfg(test)]
mod tests;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use kvcm_index::LogTicket;

#[cfg(feature = "fuzzing")]
pub(crate) use record::nesting as record_nesting;
pub(crate) use record::Record;
pub use recover::RecoveryReport;
pub use shared::SharedStore;
pub(crate) use sink::InstanceLog;
use writer::LogWriter;

use crate::error::ManagerResult;
use crate::Manager;

/// When the log is synced to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// Every acknowledged write was fdatasync'ed first (group commit shares one sync).
    Always,
    /// Writes are acknowledged once written to the file; the file is synced every period
    /// (an OS crash loses at most the last period).
    Every(Duration),
    /// Writes are acknowledged once written to the file; never synced except at segment
    /// rotation (an OS crash loses what the OS had not written back).
    Never,
}

impl std::str::FromStr for FsyncPolicy {
    type Err = String;

    /// `always`, `never`, or a period in milliseconds: `10ms`.
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "always" => Ok(FsyncPolicy::Always),
            "never" => Ok(FsyncPolicy::Never),
            _ => text
                .strip_suffix("ms")
                .and_then(|ms| ms.parse::<u64>().ok())
                .filter(|&ms| ms > 0)
                .map(|ms| FsyncPolicy::Every(Duration::from_millis(ms)))
                .ok_or_else(|| format!("{text:?} is not always, never or <N>ms (N > 0)")),
        }
    }
}

/// Where and how the journal is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalConfig {
    /// The journal directory (created when missing).
    pub dir: PathBuf,
    /// When the log is synced.
    pub fsync: FsyncPolicy,
    /// A snapshot is taken once the log has grown by this many bytes since the last one.
    pub snapshot_bytes: u64,
}

/// Errors of the journal.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// A file operation failed.
    #[error("journal i/o on {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file is not a readable journal file.
    #[error("journal file {path} is damaged: {reason}")]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A file was written by a newer kvcm.
    #[error("journal file {path} has format version {found}; this build reads up to {newest} (a downgrade is refused)")]
    NewerFormat {
        /// The file.
        path: PathBuf,
        /// Its version.
        found: u32,
        /// The newest this build reads.
        newest: u32,
    },
    /// An earlier write or sync failed; writes are refused until restart.
    #[error("the journal failed ({0}); writes are refused until kvcm restarts, reads are served")]
    Failed(String),
    /// The journal is already open for this manager.
    #[error("the journal is already open")]
    AlreadyOpen,
    /// A journal thread could not start.
    #[error("starting a journal thread: {0}")]
    Thread(String),
    /// The shared store failed or answered something unexpected (the write may or may not
    /// have been applied when its reply was lost).
    #[error("shared store {uri}: {reason}")]
    Shared {
        /// The store's URI, password masked.
        uri: String,
        /// What went wrong.
        reason: String,
    },
    /// A newer leader took over the shared store: this node's writes are refused (token 0:
    /// this node never led).
    #[error(
        "fenced: a newer leader took over the shared store (this node's token {token} is stale)"
    )]
    Fenced {
        /// This node's token.
        token: u64,
    },
    /// A record larger than recovery reads: written, it would read as damage there and cut
    /// the log (every later record with it), so it is refused and its change not made.
    #[error("a journal record of {bytes} bytes exceeds the {max}-byte limit; the change is refused (split the request)")]
    RecordTooLarge {
        /// The record's size.
        bytes: usize,
        /// The largest record recovery reads.
        max: usize,
    },
    /// An empty record: its frame would read as the end of the log (every record starts
    /// with its tag byte, so only a bug gets here).
    #[error("an empty journal record is refused (it would read as the end of the log)")]
    EmptyRecord,
}

impl JournalError {
    fn io(path: &Path, source: std::io::Error) -> JournalError {
        JournalError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// The open journal of a manager.
#[derive(Debug)]
pub struct Journal {
    writer: LogWriter,
    config: JournalConfig,
    /// Held while a snapshot is written (one at a time).
    snapshotting: Mutex<()>,
}

impl Journal {
    /// Appends one record; durable once [`Journal::wait`] returns for the ticket.
    pub(crate) fn append(&self, record: &Record) -> Result<LogTicket, JournalError> {
        self.writer.append(&record.encode())
    }

    /// Waits until `ticket` is durable.
    pub(crate) fn wait(&self, ticket: LogTicket) -> Result<(), JournalError> {
        self.writer.wait(ticket)
    }

    /// Counters: records appended and durable, flushes, bytes since the last snapshot.
    pub fn stats(&self) -> JournalStats {
        self.writer.stats()
    }
}

/// What a journal has done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalStats {
    /// Records appended since start.
    pub appended: u64,
    /// Records durable since start.
    pub durable: u64,
    /// Flushes (one write, under `always` one fdatasync, each).
    pub flushes: u64,
    /// fdatasyncs of the log by its flushes (rotations not counted).
    pub syncs: u64,
    /// Records (since start) known fdatasync'ed.
    pub synced: u64,
    /// The highest record (since start) a write was acknowledged for.
    pub acknowledged: u64,
    /// Waits for durability that returned: one per acknowledged write, however many records
    /// the writer appended before it waited (the deleter waits once per instance per pass).
    pub waits: u64,
    /// Acknowledgements under `always` of a record not yet fdatasync'ed: the journal's own
    /// bookkeeping of its guarantee (0 unless it is broken).
    pub early_acknowledgements: u64,
    /// Log bytes written since the last snapshot.
    pub log_bytes_since_snapshot: u64,
    /// Log bytes written since start (frames included).
    pub log_bytes: u64,
    /// Why the journal refuses writes, if it does.
    pub failure: Option<String>,
}

/// Where a manager's changes go once it keeps them: its journal directory, or the shared
/// store on Redis.
#[derive(Debug)]
pub(crate) enum Durable {
    /// The local journal.
    Files(Arc<Journal>),
    /// The shared store: each change is written before `append` returns.
    Shared(Arc<SharedStore>),
}

/// The ticket of a change the shared store already holds.
const STORED: LogTicket = LogTicket(0);

impl Durable {
    /// Appends (journal) or writes (shared store) one record.
    pub(crate) fn append(&self, record: &Record) -> Result<LogTicket, JournalError> {
        match self {
            Durable::Files(journal) => journal.append(record),
            Durable::Shared(store) => store.append(record).map(|()| STORED),
        }
    }

    /// Waits until an appended record is durable.
    pub(crate) fn wait(&self, ticket: LogTicket) -> Result<(), JournalError> {
        match self {
            Durable::Files(journal) => journal.wait(ticket),
            Durable::Shared(_) => Ok(()),
        }
    }

    fn stats(&self) -> JournalStats {
        match self {
            Durable::Files(journal) => journal.stats(),
            Durable::Shared(store) => store.stats(),
        }
    }
}

/// The slot a manager and its instances' index logs share: empty until the journal is open
/// or the shared store taken over (recovery writes nothing), then set once.
pub(crate) type JournalSlot = Arc<OnceLock<Durable>>;

impl Manager {
    /// Opens the journal in `config.dir`: replays what is there into this manager (which must
    /// hold nothing yet), then logs every later change. A snapshot of the recovered state is
    /// written at once, so the log restarts small and recovery's clean-ups are durable.
    pub fn open_journal(self: &Arc<Self>, config: JournalConfig) -> ManagerResult<RecoveryReport> {
        if self.journal.get().is_some() {
            return Err(JournalError::AlreadyOpen.into());
        }
        std::fs::create_dir_all(&config.dir).map_err(|e| JournalError::io(&config.dir, e))?;
        // No eviction until the recovered state is in the startup snapshot.
        let _recovering = crate::sync::write_lock(&self.recovery_gate);
        let mut report = RecoveryReport::default();
        let replay = recover::read_journal(&config.dir, &mut report)?;
        let over_cap = self.restore(replay, &mut report);
        let writer = LogWriter::create(config.dir.clone(), report.next_sequence, config.fsync)?;
        let journal = Arc::new(Journal {
            writer,
            config,
            snapshotting: Mutex::new(()),
        });
        self.journal
            .set(Durable::Files(journal.clone()))
            .map_err(|_| JournalError::AlreadyOpen)?;
        self.take_snapshot(&journal)?;
        over_cap.free(&mut report);
        snapshot::spawn_snapshotter(Arc::downgrade(self), journal)?;
        Ok(report)
    }

    /// Whether the local journal is open (it takes snapshots; the shared store does not).
    pub(crate) fn journal_takes_snapshots(&self) -> bool {
        matches!(self.journal.get(), Some(Durable::Files(_)))
    }

    /// The journal's counters, when one is open.
    pub fn journal_stats(&self) -> Option<JournalStats> {
        self.journal.get().map(Durable::stats)
    }

    /// Appends a registry change (call it under the lock that orders the change in memory);
    /// `None` when no journal is open.
    pub(crate) fn journal_append(&self, record: &Record) -> ManagerResult<Option<LogTicket>> {
        match self.journal.get() {
            Some(journal) => Ok(Some(journal.append(record)?)),
            None => Ok(None),
        }
    }

    /// Waits until an appended registry change is durable (call it after the lock).
    pub(crate) fn journal_wait(&self, ticket: Option<LogTicket>) -> ManagerResult<()> {
        match (self.journal.get(), ticket) {
            (Some(journal), Some(ticket)) => Ok(journal.wait(ticket)?),
            _ => Ok(()),
        }
    }

    /// Appends a registry change and waits for it (changes without a lock of their own).
    pub(crate) fn journal_log(&self, record: &Record) -> ManagerResult<()> {
        let ticket = self.journal_append(record)?;
        self.journal_wait(ticket)
    }
}
