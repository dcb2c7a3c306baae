//! The `kvcm.metrics.*` keys of upstream trunk: whether the admin HTTP port serves the
//! Prometheus text at `GET /metrics`, and the prefix of its metric names
//! (`<prefix>_<dotted name with _>`, default prefix `kvcm`).

use super::{parse, ConfigError};

/// Settings of the Prometheus exposition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsConfig {
    /// `kvcm.metrics.enable_prometheus`: serve `GET /metrics` (default true).
    pub enable_prometheus: bool,
    /// `kvcm.metrics.prometheus_prefix`: the prefix of every metric name (default `kvcm`;
    /// "" = names without a prefix).
    pub prometheus_prefix: String,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            enable_prometheus: true,
            prometheus_prefix: "kvcm".into(),
        }
    }
}

/// The metrics keys, in the order they are documented.
pub const METRICS_KEYS: [&str; 2] = [
    "kvcm.metrics.enable_prometheus",
    "kvcm.metrics.prometheus_prefix",
];

impl MetricsConfig {
    /// Sets one `kvcm.metrics.*` key from its text form.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        match key {
            "kvcm.metrics.enable_prometheus" => self.enable_prometheus = parse(key, value)?,
            "kvcm.metrics.prometheus_prefix" => self.prometheus_prefix = value.to_string(),
            _ => return Err(ConfigError::UnknownKey(key.to_string())),
        }
        Ok(())
    }

    /// The prefix must start a valid Prometheus metric name: `[A-Za-z_][A-Za-z0-9_]*`, or
    /// be empty.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let prefix = &self.prometheus_prefix;
        let mut chars = prefix.chars();
        let valid = chars.next().is_none_or(|first| {
            (first.is_ascii_alphabetic() || first == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        });
        if valid {
            return Ok(());
        }
        Err(ConfigError::InvalidValue {
            key: "kvcm.metrics.prometheus_prefix".into(),
            reason: format!("{prefix:?} is not of the form [A-Za-z_][A-Za-z0-9_]*"),
        })
    }

    /// The prefix `GET /metrics` names its metrics with; `None` when it is not served.
    pub fn exposition_prefix(&self) -> Option<&str> {
        self.enable_prometheus
            .then_some(self.prometheus_prefix.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::super::ServerConfig;

    #[test]
    fn defaults_layers_and_a_bad_prefix_naming_the_key() {
        let mut config = ServerConfig::default();
        assert_eq!(config.metrics.exposition_prefix(), Some("kvcm"));
        config
            .apply_pairs(&["kvcm.metrics.prometheus_prefix=team_a".into()])
            .expect("pairs");
        config
            .apply_env(|name| (name == "KVCM_METRICS_PROMETHEUS_PREFIX").then(|| "team_b".into()))
            .expect("env");
        assert_eq!(config.metrics.prometheus_prefix, "team_b", "env wins");
        assert!(config.validate().is_ok());
        for bad in ["9lives", "a-b", "a.b", "ü"] {
            config.set("kvcm.metrics.prometheus_prefix", bad).unwrap();
            let error = config.validate().unwrap_err().to_string();
            assert!(error.contains("kvcm.metrics.prometheus_prefix"), "{error}");
        }
        config.set("kvcm.metrics.prometheus_prefix", "").unwrap();
        assert!(config.validate().is_ok(), "no prefix");
        let error = config
            .set("kvcm.metrics.enable_prometheus", "maybe")
            .unwrap_err();
        assert!(error.to_string().contains("kvcm.metrics.enable_prometheus"));
        config
            .set("kvcm.metrics.enable_prometheus", "false")
            .unwrap();
        assert_eq!(config.metrics.exposition_prefix(), None);
    }
}
