//! The `kvcm.cache_reclaimer.*` keys (our extension, docs/capacity.md): the eviction policy
//! of the live reclaimer and the period of its passes.

use std::time::Duration;

use kvcm_manager::LivePolicy;

use super::{parse, ConfigError};

/// Settings of the reclaimer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReclaimerConfig {
    /// `kvcm.cache_reclaimer.policy`: the eviction policy (`lru`, the default, `sieve` or
    /// `s3fifo`).
    pub policy: String,
    /// `kvcm.cache_reclaimer.period_ms`: milliseconds between passes (default 500; 0 = no
    /// reclaimer).
    pub period_ms: u64,
}

impl Default for ReclaimerConfig {
    fn default() -> Self {
        ReclaimerConfig {
            policy: "lru".into(),
            period_ms: 500,
        }
    }
}

/// The reclaimer keys, in the order they are documented.
pub const RECLAIMER_KEYS: [&str; 2] = [
    "kvcm.cache_reclaimer.policy",
    "kvcm.cache_reclaimer.period_ms",
];

impl ReclaimerConfig {
    /// Sets one `kvcm.cache_reclaimer.*` key from its text form.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        match key {
            "kvcm.cache_reclaimer.policy" => self.policy = value.trim().to_ascii_lowercase(),
            "kvcm.cache_reclaimer.period_ms" => self.period_ms = parse(key, value)?,
            _ => return Err(ConfigError::UnknownKey(key.to_string())),
        }
        Ok(())
    }

    /// The policy must be one the live reclaimer runs: `lru`, `sieve` or `s3fifo`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self.live_policy() {
            Some(_) => Ok(()),
            None => Err(ConfigError::InvalidValue {
                key: "kvcm.cache_reclaimer.policy".into(),
                reason: format!(
                    "unknown policy {:?}; the live reclaimer runs \"lru\", \"sieve\" or \"s3fifo\"",
                    self.policy
                ),
            }),
        }
    }

    /// The live policy named by `kvcm.cache_reclaimer.policy` (`None` for one it does not run).
    pub fn live_policy(&self) -> Option<LivePolicy> {
        match self.policy.as_str() {
            "lru" => Some(LivePolicy::Lru),
            "sieve" => Some(LivePolicy::Sieve),
            "s3fifo" => Some(LivePolicy::S3Fifo),
            _ => None,
        }
    }

    /// The period of the reclaimer's passes; `None` when it is off.
    pub fn period(&self) -> Option<Duration> {
        (self.period_ms > 0).then(|| Duration::from_millis(self.period_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::super::ServerConfig;

    #[test]
    fn lru_is_the_default_sieve_and_s3fifo_run_and_others_are_refused_naming_the_key() {
        let mut config = ServerConfig::default();
        assert!(config.validate().is_ok());
        assert_eq!(
            config.reclaimer.period(),
            Some(std::time::Duration::from_millis(500))
        );
        config
            .apply_pairs(&["kvcm.cache_reclaimer.policy=LRU".into()])
            .expect("pairs");
        assert!(config.validate().is_ok(), "case-insensitive");
        config
            .set("kvcm.cache_reclaimer.policy", "sieve")
            .expect("sieve");
        assert!(config.validate().is_ok());
        assert_eq!(
            config.reclaimer.live_policy(),
            Some(super::LivePolicy::Sieve)
        );
        config
            .set("kvcm.cache_reclaimer.policy", "S3FIFO")
            .expect("s3fifo");
        assert!(config.validate().is_ok());
        assert_eq!(
            config.reclaimer.live_policy(),
            Some(super::LivePolicy::S3Fifo)
        );
        for (policy, says) in [("lfu", "unknown"), ("arc", "s3fifo")] {
            config.set("kvcm.cache_reclaimer.policy", policy).unwrap();
            let error = config.validate().unwrap_err().to_string();
            assert!(
                error.contains("kvcm.cache_reclaimer.policy") && error.contains(says),
                "{error}"
            );
        }
        config
            .apply_env(|name| (name == "KVCM_CACHE_RECLAIMER_PERIOD_MS").then(|| "0".into()))
            .expect("env");
        assert_eq!(config.reclaimer.period(), None, "0 = off");
        assert!(config.set("kvcm.cache_reclaimer.period_ms", "-1").is_err());
    }
}
