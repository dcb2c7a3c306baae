//! The `kvcm.journal.*` keys: the write-ahead log and snapshots that make the metadata survive
//! a crash. On by default, with `fsync = always`: an acknowledged write is on disk. With
//! `kvcm.registry_storage.uri=redis://…` the metadata is kept on Redis instead (the shared
//! store), where any node that wins the lead finds it.

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
    /// `kvcm.registry_storage.uri=redis://…`: the shared store's URI ("" = the local journal).
    pub shared_uri: String,
}

impl Default for JournalSettings {
    fn default() -> Self {
        JournalSettings {
            enabled: true,
            dir: PathBuf::new(),
            fsync: FsyncPolicy::Always,
            snapshot_bytes: 64 << 20,
            shared_uri: String::new(),
        }
    }
}

/// The journal keys, in the order they are documented.
pub const JOURNAL_KEYS: [&str; 5] = [
    "kvcm.journal.enabled",
    "kvcm.journal.dir",
    "kvcm.journal.fsync",
    "kvcm.journal.snapshot_bytes",
    REGISTRY_URI_KEY,
];

/// The reference's registry location: `local://<path>` keeps the journal (registry and
/// index) in the directory `<path>`; `redis://…` keeps them in the shared store on Redis.
pub const REGISTRY_URI_KEY: &str = "kvcm.registry_storage.uri";

impl JournalSettings {
    /// Sets one `kvcm.journal.*` key from its text form.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        match key {
            "kvcm.journal.enabled" => self.enabled = parse(key, value)?,
            "kvcm.journal.dir" => self.dir = PathBuf::from(value),
            "kvcm.journal.fsync" => self.fsync = parse(key, value)?,
            "kvcm.journal.snapshot_bytes" => self.snapshot_bytes = parse(key, value)?,
            REGISTRY_URI_KEY => self.set_registry_uri(value)?,
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

    /// `kvcm.registry_storage.uri`: `local://<dir>` (the journal's directory) or
    /// `redis://…` (the shared store; checked here, connected at start).
    fn set_registry_uri(&mut self, uri: &str) -> Result<(), ConfigError> {
        let invalid = |reason: String| ConfigError::InvalidValue {
            key: REGISTRY_URI_KEY.into(),
            reason,
        };
        match uri.split_once("://") {
            Some(("local", path)) if !path.is_empty() => {
                self.dir = PathBuf::from(path);
                self.shared_uri.clear();
            }
            Some(("redis" | "rediss", _)) => {
                kvcm_index::redis::parse_uri(uri).map_err(|e| invalid(e.to_string()))?;
                self.shared_uri = uri.to_string();
            }
            _ => {
                return Err(invalid(format!(
                    "{uri:?} is not local://<dir> or redis://…"
                )))
            }
        }
        Ok(())
    }

    /// The shared store's URI, when the metadata is kept on Redis.
    pub fn shared_store(&self) -> Option<&str> {
        (!self.shared_uri.is_empty()).then_some(self.shared_uri.as_str())
    }

    /// The manager's journal config (`None` when disabled or on the shared store), its
    /// directory resolved against the data directory.
    pub fn journal(&self, data_dir: &Path) -> Option<JournalConfig> {
        let local = self.enabled && self.shared_uri.is_empty();
        local.then(|| JournalConfig {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_uri_names_the_journal_directory_or_the_shared_store_or_is_refused() {
        let mut settings = JournalSettings::default();
        settings
            .set(REGISTRY_URI_KEY, "local:///var/kvcm/registry")
            .unwrap();
        let config = settings.journal(Path::new("/data")).unwrap();
        assert_eq!(config.dir, Path::new("/var/kvcm/registry"));
        for bad in [
            "rediss://127.0.0.1:6379",
            "redis://127.0.0.1:6379?no_such_option=1",
            "local://",
            "file:///x",
            "nonsense",
        ] {
            let error = settings.set(REGISTRY_URI_KEY, bad).unwrap_err();
            assert!(error.to_string().contains(REGISTRY_URI_KEY), "{error}");
        }
        settings
            .set(REGISTRY_URI_KEY, "redis://127.0.0.1:6379")
            .unwrap();
        assert_eq!(settings.shared_store(), Some("redis://127.0.0.1:6379"));
        assert!(
            settings.journal(Path::new("/data")).is_none(),
            "no local journal beside the shared store"
        );
        let defaulted = JournalSettings::default()
            .journal(Path::new("/data"))
            .unwrap();
        assert_eq!(defaulted.dir, Path::new("/data/meta"));
        assert!(JournalSettings {
            enabled: false,
            ..JournalSettings::default()
        }
        .journal(Path::new("/data"))
        .is_none());
    }
}
