//! The `kvcm.event_log.*` keys: whether `kvcm serve` writes the event log the optimizer
//! replays, where, and how it rotates. On by default: replaying a production day needs the
//! log from day one, and writing it costs the request path one non-blocking channel send.

use std::path::{Path, PathBuf};

use super::{parse, ConfigError};

/// Subdirectory of the data directory that holds the log when `kvcm.event_log.dir` is empty.
pub const DEFAULT_SUBDIR: &str = "events";

/// Settings of the event log.
#[derive(Debug, Clone, PartialEq)]
pub struct EventLogConfig {
    /// `kvcm.event_log.enabled`: write the log (default true).
    pub enabled: bool,
    /// `kvcm.event_log.dir`: where the log lives ("" = `<data_dir>/events`).
    pub dir: PathBuf,
    /// `kvcm.event_log.max_file_bytes`: the current file rotates before passing this size.
    pub max_file_bytes: u64,
    /// `kvcm.event_log.keep_files`: rotated files kept besides the current one.
    pub keep_files: usize,
}

impl Default for EventLogConfig {
    fn default() -> Self {
        EventLogConfig {
            enabled: true,
            dir: PathBuf::new(),
            max_file_bytes: 256 << 20,
            keep_files: 16,
        }
    }
}

/// The event-log keys, in the order they are documented.
pub const EVENT_LOG_KEYS: [&str; 4] = [
    "kvcm.event_log.enabled",
    "kvcm.event_log.dir",
    "kvcm.event_log.max_file_bytes",
    "kvcm.event_log.keep_files",
];

/// Most rotated files `kvcm.event_log.keep_files` may ask for.
const MAX_KEEP_FILES: usize = 10_000;

impl EventLogConfig {
    /// Sets one `kvcm.event_log.*` key from its text form.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        match key {
            "kvcm.event_log.enabled" => self.enabled = parse(key, value)?,
            "kvcm.event_log.dir" => self.dir = PathBuf::from(value),
            "kvcm.event_log.max_file_bytes" => self.max_file_bytes = parse(key, value)?,
            "kvcm.event_log.keep_files" => self.keep_files = parse(key, value)?,
            _ => return Err(ConfigError::UnknownKey(key.to_string())),
        }
        Ok(())
    }

    /// Checks the ranges (only when the log is on: a disabled log's settings are unused).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key: &str, reason: String| ConfigError::InvalidValue {
            key: key.to_string(),
            reason,
        };
        if !self.enabled {
            return Ok(());
        }
        if self.max_file_bytes == 0 {
            let reason = "must be positive".to_string();
            return Err(invalid("kvcm.event_log.max_file_bytes", reason));
        }
        if self.keep_files > MAX_KEEP_FILES {
            let reason = format!("{} is above the limit {MAX_KEEP_FILES}", self.keep_files);
            return Err(invalid("kvcm.event_log.keep_files", reason));
        }
        Ok(())
    }

    /// The log directory: `dir`, or `<data_dir>/events` when `dir` is empty.
    pub fn resolved_dir(&self, data_dir: &Path) -> PathBuf {
        if self.dir.as_os_str().is_empty() {
            data_dir.join(DEFAULT_SUBDIR)
        } else {
            self.dir.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_write_under_the_data_dir() {
        let config = EventLogConfig::default();
        assert!(config.enabled);
        assert!(config.validate().is_ok());
        let dir = config.resolved_dir(Path::new("/data"));
        assert_eq!(dir, Path::new("/data/events"));
        let moved = EventLogConfig {
            dir: PathBuf::from("/logs"),
            ..config
        };
        assert_eq!(moved.resolved_dir(Path::new("/data")), Path::new("/logs"));
    }

    #[test]
    fn environment_variables_set_the_event_log_keys() {
        let mut config = super::super::ServerConfig::default();
        config
            .apply_env(|name| match name {
                "KVCM_EVENT_LOG_ENABLED" => Some("false".into()),
                "KVCM_EVENT_LOG_KEEP_FILES" => Some("3".into()),
                _ => None,
            })
            .expect("env");
        assert!(!config.event_log.enabled);
        assert_eq!(config.event_log.keep_files, 3);
    }

    #[test]
    fn bad_values_name_their_key_and_change_nothing() {
        let mut config = EventLogConfig::default();
        for (key, value) in [
            ("kvcm.event_log.enabled", "yes"),
            ("kvcm.event_log.max_file_bytes", "-1"),
            ("kvcm.event_log.keep_files", "many"),
        ] {
            let error = config.set(key, value).unwrap_err();
            assert!(error.to_string().contains(key), "{error}");
        }
        assert_eq!(config, EventLogConfig::default());
        let error = config.set("kvcm.event_log.nope", "1").unwrap_err();
        assert!(error.to_string().contains("kvcm.event_log.nope"), "{error}");
    }

    #[test]
    fn validate_rejects_zero_size_and_huge_keep_only_when_enabled() {
        let mut config = EventLogConfig::default();
        config.set("kvcm.event_log.max_file_bytes", "0").unwrap();
        let error = config.validate().unwrap_err();
        assert!(error.to_string().contains("max_file_bytes"), "{error}");
        config.set("kvcm.event_log.enabled", "false").unwrap();
        assert!(config.validate().is_ok());
        config.set("kvcm.event_log.enabled", "true").unwrap();
        config.set("kvcm.event_log.max_file_bytes", "1").unwrap();
        config.set("kvcm.event_log.keep_files", "10001").unwrap();
        let error = config.validate().unwrap_err();
        assert!(error.to_string().contains("keep_files"), "{error}");
    }
}
