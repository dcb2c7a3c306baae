//! The `kvcm.access_log.*` keys: the access log's files (the four keys every rotated log
//! has, [`LogFilesConfig`]) and whether its lines carry the request and response bodies.

use super::log_files::LogFilesConfig;
use super::{parse, ConfigError};

/// Key prefix of the access log.
pub const ACCESS_LOG_PREFIX: &str = "kvcm.access_log";

/// Subdirectory of the data directory that holds the access log when its `dir` is empty.
pub const ACCESS_LOG_SUBDIR: &str = "access";

/// The access-log keys, in the order they are documented.
pub const ACCESS_LOG_KEYS: [&str; 6] = [
    "kvcm.access_log.enabled",
    "kvcm.access_log.dir",
    "kvcm.access_log.max_file_bytes",
    "kvcm.access_log.keep_files",
    "kvcm.access_log.bodies",
    "kvcm.access_log.max_body_bytes",
];

/// Settings of the access log.
#[derive(Debug, Clone, PartialEq)]
pub struct AccessLogConfig {
    /// Whether, where and how the files rotate.
    pub files: LogFilesConfig,
    /// `kvcm.access_log.bodies`: each line carries the request and response as protobuf
    /// JSON, secrets redacted (default false: `{}` for both, as the reference writes them
    /// outside its debug mode).
    pub bodies: bool,
    /// `kvcm.access_log.max_body_bytes`: a body whose JSON is larger is written as
    /// `{"kvcm_truncated_bytes": <its size>}` instead.
    pub max_body_bytes: usize,
}

impl Default for AccessLogConfig {
    fn default() -> Self {
        AccessLogConfig {
            files: LogFilesConfig::default(),
            bodies: false,
            max_body_bytes: 64 << 10,
        }
    }
}

impl AccessLogConfig {
    /// Sets one `kvcm.access_log.*` key from its text form.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        match key {
            "kvcm.access_log.bodies" => self.bodies = parse(key, value)?,
            "kvcm.access_log.max_body_bytes" => self.max_body_bytes = parse(key, value)?,
            _ => self.files.set(ACCESS_LOG_PREFIX, key, value)?,
        }
        Ok(())
    }

    /// Checks the ranges (only when the log is on).
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.files.validate(ACCESS_LOG_PREFIX)?;
        if self.files.enabled && self.bodies && self.max_body_bytes == 0 {
            return Err(ConfigError::InvalidValue {
                key: "kvcm.access_log.max_body_bytes".into(),
                reason: "must be positive when kvcm.access_log.bodies is true".into(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_sets_its_field_and_bad_values_name_their_key() {
        let mut config = AccessLogConfig::default();
        assert!(config.files.enabled && !config.bodies);
        for (key, value) in [
            ("kvcm.access_log.enabled", "false"),
            ("kvcm.access_log.dir", "/logs/access"),
            ("kvcm.access_log.max_file_bytes", "1000"),
            ("kvcm.access_log.keep_files", "2"),
            ("kvcm.access_log.bodies", "true"),
            ("kvcm.access_log.max_body_bytes", "512"),
        ] {
            config.set(key, value).expect(key);
        }
        let files = &config.files;
        assert!(!files.enabled);
        assert_eq!(files.dir, std::path::Path::new("/logs/access"));
        assert_eq!((files.max_file_bytes, files.keep_files), (1000, 2));
        assert!(config.bodies);
        assert_eq!(config.max_body_bytes, 512);

        let before = config.clone();
        for (key, value) in [
            ("kvcm.access_log.bodies", "sometimes"),
            ("kvcm.access_log.max_body_bytes", "-3"),
            ("kvcm.access_log.keep_files", "x"),
            ("kvcm.access_log.nope", "1"),
        ] {
            let error = config.set(key, value).unwrap_err();
            assert!(error.to_string().contains(key), "{error}");
        }
        assert_eq!(config, before);
    }

    #[test]
    fn a_zero_body_limit_is_refused_only_when_bodies_are_written() {
        let mut config = AccessLogConfig::default();
        config.set("kvcm.access_log.max_body_bytes", "0").unwrap();
        assert!(config.validate().is_ok());
        config.set("kvcm.access_log.bodies", "true").unwrap();
        let error = config.validate().unwrap_err();
        assert!(error.to_string().contains("max_body_bytes"), "{error}");
        config.set("kvcm.access_log.max_file_bytes", "0").unwrap();
        let error = config.validate().unwrap_err();
        assert!(
            error.to_string().contains("kvcm.access_log.max_file_bytes"),
            "{error}"
        );
    }
}
