//! The keys of the logs `kvcm serve` writes as rotated JSON-lines files: the event log the
//! optimizer replays (`kvcm.event_log.*`), the access log (`kvcm.access_log.*`, see
//! [`super::access_log`]) and the audit log (`kvcm.audit_log.*`). Each log has the same four
//! keys under its prefix: whether it is written, where, and how it rotates. All are on by
//! default: replaying a production day needs the event log from day one, tracing a request
//! its access-log line, and an incident the audit trail; each costs the request path one
//! non-blocking channel send.

use std::path::{Path, PathBuf};

use super::{parse, ConfigError};

/// Key prefix of the event log.
pub const EVENT_LOG_PREFIX: &str = "kvcm.event_log";

/// Subdirectory of the data directory that holds the event log when its `dir` is empty.
pub const EVENT_LOG_SUBDIR: &str = "events";

/// Key prefix of the audit log (admin and debug calls that change state, token refusals).
pub const AUDIT_LOG_PREFIX: &str = "kvcm.audit_log";

/// Subdirectory of the data directory that holds the audit log when its `dir` is empty.
pub const AUDIT_LOG_SUBDIR: &str = "audit";

/// The audit-log keys, in the order they are documented.
pub const AUDIT_LOG_KEYS: [&str; 4] = [
    "kvcm.audit_log.enabled",
    "kvcm.audit_log.dir",
    "kvcm.audit_log.max_file_bytes",
    "kvcm.audit_log.keep_files",
];

/// Settings of one rotated log.
#[derive(Debug, Clone, PartialEq)]
pub struct LogFilesConfig {
    /// `<prefix>.enabled`: write the log (default true).
    pub enabled: bool,
    /// `<prefix>.dir`: where the log lives ("" = a subdirectory of the data directory).
    pub dir: PathBuf,
    /// `<prefix>.max_file_bytes`: the current file rotates before passing this size.
    pub max_file_bytes: u64,
    /// `<prefix>.keep_files`: rotated files kept besides the current one.
    pub keep_files: usize,
}

/// The event log's settings.
pub type EventLogConfig = LogFilesConfig;

impl Default for LogFilesConfig {
    fn default() -> Self {
        LogFilesConfig {
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

/// Most rotated files `<prefix>.keep_files` may ask for.
const MAX_KEEP_FILES: usize = 10_000;

impl LogFilesConfig {
    /// Sets one `<prefix>.*` key from its text form.
    pub fn set(&mut self, prefix: &str, key: &str, value: &str) -> Result<(), ConfigError> {
        match suffix(prefix, key) {
            Some("enabled") => self.enabled = parse(key, value)?,
            Some("dir") => self.dir = PathBuf::from(value),
            Some("max_file_bytes") => self.max_file_bytes = parse(key, value)?,
            Some("keep_files") => self.keep_files = parse(key, value)?,
            _ => return Err(ConfigError::UnknownKey(key.to_string())),
        }
        Ok(())
    }

    /// Checks the ranges (only when the log is on: a disabled log's settings are unused).
    pub fn validate(&self, prefix: &str) -> Result<(), ConfigError> {
        let invalid = |suffix: &str, reason: String| ConfigError::InvalidValue {
            key: format!("{prefix}.{suffix}"),
            reason,
        };
        if !self.enabled {
            return Ok(());
        }
        if self.max_file_bytes == 0 {
            return Err(invalid("max_file_bytes", "must be positive".into()));
        }
        if self.keep_files > MAX_KEEP_FILES {
            let reason = format!("{} is above the limit {MAX_KEEP_FILES}", self.keep_files);
            return Err(invalid("keep_files", reason));
        }
        Ok(())
    }

    /// The log directory: `dir`, or `<data_dir>/<subdir>` when `dir` is empty.
    pub fn resolved_dir(&self, data_dir: &Path, subdir: &str) -> PathBuf {
        if self.dir.as_os_str().is_empty() {
            data_dir.join(subdir)
        } else {
            self.dir.clone()
        }
    }
}

/// `key` without `<prefix>.`.
fn suffix<'k>(prefix: &str, key: &'k str) -> Option<&'k str> {
    key.strip_prefix(prefix)?.strip_prefix('.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_write_under_the_data_dir() {
        let config = EventLogConfig::default();
        assert!(config.enabled);
        assert!(config.validate(EVENT_LOG_PREFIX).is_ok());
        let dir = config.resolved_dir(Path::new("/data"), EVENT_LOG_SUBDIR);
        assert_eq!(dir, Path::new("/data/events"));
        let moved = EventLogConfig {
            dir: PathBuf::from("/logs"),
            ..config
        };
        let dir = moved.resolved_dir(Path::new("/data"), EVENT_LOG_SUBDIR);
        assert_eq!(dir, Path::new("/logs"));
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
            let error = config.set(EVENT_LOG_PREFIX, key, value).unwrap_err();
            assert!(error.to_string().contains(key), "{error}");
        }
        assert_eq!(config, EventLogConfig::default());
        let error = config
            .set(EVENT_LOG_PREFIX, "kvcm.event_log.nope", "1")
            .unwrap_err();
        assert!(error.to_string().contains("kvcm.event_log.nope"), "{error}");
    }

    #[test]
    fn validate_rejects_zero_size_and_huge_keep_only_when_enabled() {
        let mut config = EventLogConfig::default();
        let set = |config: &mut LogFilesConfig, key: &str, value: &str| {
            config.set(EVENT_LOG_PREFIX, key, value).unwrap()
        };
        set(&mut config, "kvcm.event_log.max_file_bytes", "0");
        let error = config.validate(EVENT_LOG_PREFIX).unwrap_err();
        assert!(
            error.to_string().contains("kvcm.event_log.max_file_bytes"),
            "{error}"
        );
        set(&mut config, "kvcm.event_log.enabled", "false");
        assert!(config.validate(EVENT_LOG_PREFIX).is_ok());
        set(&mut config, "kvcm.event_log.enabled", "true");
        set(&mut config, "kvcm.event_log.max_file_bytes", "1");
        set(&mut config, "kvcm.event_log.keep_files", "10001");
        let error = config.validate(EVENT_LOG_PREFIX).unwrap_err();
        assert!(error.to_string().contains("keep_files"), "{error}");
    }
}
