//! The `kvcm.journal.*` keys: the write-ahead log and snapshots that make the metadata survive
//! a crash. On by default, with `fsync = always`: an acknowledged write is on disk.

use std::path::{Path, PathBuf};

use kvcm_manager::{FsyncPolicy, JournalConfig};

use super::{parse, ConfigError};

/// Subdirectory of the data directory that holds the journal when `kvcm.journal.dir` is empty.
pub const DEFAULT_SUBDIR: &str = "meta";

/// Settings of the journal.
#[derive(Debug, Clone, PartialEq)]
pub struct JournalSettings {
    /// `kvcm.journal.enabled`: keep a journal (default true; off = metadata in memory only).
    pub enabled: bool,
    /// `kvcm.journal.dir`: where it lives ("" = `<data_dir>/meta`).
    pub dir: PathBuf,
    /// `kvcm.journal.fsync`: `always` (default), `<N>ms` or `never`.
    pub fsync: FsyncPolicy,
    /// `kvcm.journal.snapshot_bytes`: log growth that triggers a snapshot.
    pub snapshot_bytes: u64,
}

impl Default for JournalSettings {
    fn default() -> Self {
        JournalSettings {
            enabled: true,
            dir: PathBuf::new(),
            fsync: FsyncPolicy::Always,
            snapshot_bytes: 64 << 20,
        }
    }
}

/// The journal keys, in the order they are documented.
pub const JOURNAL_KEYS: [&str; 4] = [
    "kvcm.journal.enabled",
    "kvcm.journal.dir",
    "kvcm.journal.fsync",
    "kvcm.journal.snapshot_bytes",
];

impl JournalSettings {
    /// Sets one `kvcm.journal.*` key from its text form.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        match key {
            "kvcm.journal.enabled" => self.enabled = parse(key, value)?,
            "kvcm.journal.dir" => self.dir = PathBuf::from(value),
            "kvcm.journal.fsync" => self.fsync = parse(key, value)?,
            "kvcm.journal.snapshot_bytes" => self.snapshot_bytes = parse(key, value)?,
            _ => return Err(ConfigError::UnknownKey(key.to_string())),
        }
        Ok(())
    }

    /// Checks the ranges.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.enabled && self.snapshot_bytes == 0 {
            return Err(ConfigError::InvalidValue {
                key: "kvcm.journal.snapshot_bytes".into(),
                reason: "must be positive".into(),
            });
        }
        Ok(())
    }

    /// The manager's journal config (`None` when disabled), its directory resolved against
    /// the data directory.
    pub fn journal(&self, data_dir: &Path) -> Option<JournalConfig> {
        self.enabled.then(|| JournalConfig {
            dir: if self.dir.as_os_str().is_empty() {
                data_dir.join(DEFAULT_SUBDIR)
            } else {
                self.dir.clone()
            },
            fsync: self.fsync,
            snapshot_bytes: self.snapshot_bytes,
        })
    }
}
