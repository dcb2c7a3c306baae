//! Server configuration: one typed struct, layered as
//! defaults < TOML file (`--config`) < `--env key=value` < environment variables
//! (`kvcm.service.rpc_port` ↔ `KVCM_SERVICE_RPC_PORT`) < explicit command-line flags,
//! then validated. Keys are the reference's dotted names; a TOML file may nest them
//! (`[kvcm.service] rpc_port = 6381`) or quote them (`"kvcm.service.rpc_port" = 6381`).

mod access_log;
mod journal;
mod log_files;
mod metrics;
mod reclaimer;
mod security;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kvcm_manager::leader::{ElectorSettings, LockUri};

pub use access_log::{AccessLogConfig, ACCESS_LOG_KEYS};
pub use journal::{JournalSettings, JOURNAL_KEYS};
pub use log_files::{EventLogConfig, LogFilesConfig, AUDIT_LOG_KEYS, EVENT_LOG_KEYS};
pub use metrics::{MetricsConfig, METRICS_KEYS};
pub use reclaimer::{ReclaimerConfig, RECLAIMER_KEYS};
pub use security::{
    AdminTokens, ConnectionLimits, RequestLimits, SecurityConfig, TlsSettings, SECURITY_KEYS,
};

/// Why a configuration cannot be used; every variant names the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The key is not a known setting.
    #[error("unknown config key {0:?}")]
    UnknownKey(String),
    /// The value does not parse or is out of range.
    #[error("config key {key:?}: {reason}")]
    InvalidValue {
        /// The key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// The TOML file cannot be read or parsed.
    #[error("config file {path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

/// Everything `kvcm serve` needs to start.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// `kvcm.service.rpc_port`: gRPC MetaService (0 = chosen by the OS).
    pub rpc_port: u16,
    /// `kvcm.service.admin_rpc_port`: separate gRPC Admin(+Debug) port; 0 or equal to
    /// `rpc_port` = served on the main gRPC port.
    pub admin_rpc_port: u16,
    /// `kvcm.service.http_port`: meta HTTP (0 = chosen by the OS).
    pub http_port: u16,
    /// `kvcm.service.admin_http_port`: admin HTTP and `/metrics` (0 = chosen by the OS).
    pub admin_http_port: u16,
    /// `kvcm.service.enable_debug_service`: serve DebugService (HTTP on http_port + 3000).
    pub enable_debug_service: bool,
    /// `kvcm.service.http_max_body_bytes`: larger HTTP bodies get 413 `{}`.
    pub http_max_body_bytes: usize,
    /// `kvcm.data_dir`: where the embedded default storage keeps its block files.
    pub data_dir: PathBuf,
    /// `kvcm.leader_elector.node_id`: this node's id ("" = generated).
    pub node_id: String,
    /// `kvcm.coordination.uri`: the leader lock (`memory://`, `file://<dir>`); wins over
    /// `kvcm.distributed_lock.uri` when set.
    pub coordination_uri: String,
    /// `kvcm.distributed_lock.uri`: the reference's older name of the leader lock URI.
    pub distributed_lock_uri: String,
    /// `kvcm.leader_elector.lease_ms`: lease length.
    pub lease_ms: u64,
    /// `kvcm.leader_elector.loop_interval_ms`: elector period (renewals, campaigns).
    pub loop_interval_ms: u64,
    /// `kvcm.service.advertised_host`: the host published for leader discovery ("" =
    /// 127.0.0.1).
    pub advertised_host: String,
    /// `kvcm.service.custom_info`: opaque text published with this node's endpoint.
    pub custom_info: String,
    /// Other `kvcm.*` keys met in the file or `--env` pairs: reference settings kvcm has no
    /// use for; skipped (the server logs a warning for each) rather than refused.
    pub ignored_keys: Vec<String>,
    /// `kvcm.event_log.*`: the event log the optimizer replays.
    pub event_log: EventLogConfig,
    /// `kvcm.access_log.*`: one line per served RPC.
    pub access_log: AccessLogConfig,
    /// `kvcm.audit_log.*`: one line per state-changing admin or debug call.
    pub audit_log: LogFilesConfig,
    /// `kvcm.lookup.enabled`, `kvcm.lookup.bind`: the published lookup tables.
    pub lookup: crate::lookup::LookupConfig,
    /// `kvcm.pool.*`: memory-pool membership timing and the embedded pool node.
    pub pool: crate::pool::PoolConfig,
    /// `kvcm.journal.*`: the write-ahead log and snapshots of the metadata.
    pub journal: JournalSettings,
    /// `kvcm.metrics.*`: the Prometheus exposition at `GET /metrics`.
    pub metrics: MetricsConfig,
    /// `kvcm.cache_reclaimer.*`: the live reclaimer.
    pub reclaimer: ReclaimerConfig,
    /// `kvcm.storage.probe_interval_ms`: milliseconds between health-probe rounds of the
    /// registered storages (0 = no probes; docs/storage.md).
    pub storage_probe_interval_ms: u64,
    /// `kvcm.capacity_curve.window_accesses`: block accesses of GetCacheLocation each
    /// instance's live capacity curve covers (0 = no curves; docs/capacity.md).
    pub capacity_curve_window_accesses: usize,
    /// `kvcm.service.admin_auth_*`, `bind_host`, `max_*`: tokens, bind address, limits.
    pub security: SecurityConfig,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            rpc_port: 6381,
            admin_rpc_port: 0,
            http_port: 6382,
            admin_http_port: 6492,
            enable_debug_service: false,
            http_max_body_bytes: 4 << 20,
            data_dir: PathBuf::from("./kvcm-data"),
            node_id: String::new(),
            coordination_uri: String::new(),
            distributed_lock_uri: String::new(),
            lease_ms: 10_000,
            loop_interval_ms: 100,
            advertised_host: String::new(),
            custom_info: String::new(),
            ignored_keys: Vec::new(),
            event_log: EventLogConfig::default(),
            access_log: AccessLogConfig::default(),
            audit_log: LogFilesConfig::default(),
            lookup: crate::lookup::LookupConfig::default(),
            pool: crate::pool::PoolConfig::default(),
            journal: JournalSettings::default(),
            metrics: MetricsConfig::default(),
            reclaimer: ReclaimerConfig::default(),
            storage_probe_interval_ms: 5_000,
            capacity_curve_window_accesses: 100_000,
            security: SecurityConfig::default(),
        }
    }
}

/// Every key except those of the logs, journal, metrics, reclaimer and security, in the
/// order they are documented.
pub const KEYS: [&str; 27] = [
    "kvcm.service.rpc_port",
    "kvcm.service.admin_rpc_port",
    "kvcm.service.http_port",
    "kvcm.service.admin_http_port",
    "kvcm.service.enable_debug_service",
    "kvcm.service.http_max_body_bytes",
    "kvcm.data_dir",
    "kvcm.leader_elector.node_id",
    "kvcm.leader_elector.lease_ms",
    "kvcm.leader_elector.loop_interval_ms",
    "kvcm.coordination.uri",
    "kvcm.distributed_lock.uri",
    "kvcm.service.advertised_host",
    "kvcm.service.custom_info",
    "kvcm.lookup.enabled",
    "kvcm.lookup.bind",
    "kvcm.lookup.verbs_device",
    "kvcm.lookup.verbs_gid_index",
    "kvcm.lookup.max_queue_pairs",
    "kvcm.lookup.max_queue_pairs_per_instance",
    "kvcm.pool.heartbeat_ms",
    "kvcm.pool.rejoin_ramp_ms",
    "kvcm.pool.resume_window_ms",
    "kvcm.pool.size",
    "kvcm.pool.prefault",
    "kvcm.storage.probe_interval_ms",
    "kvcm.capacity_curve.window_accesses",
];

/// The largest live-curve window: 16 Mi accesses (128 MiB of keys per instance).
const MAX_CURVE_WINDOW: usize = 1 << 24;

/// The environment variable of a key (`kvcm.service.rpc_port` → `KVCM_SERVICE_RPC_PORT`).
pub fn env_name(key: &str) -> String {
    key.replace('.', "_").to_ascii_uppercase()
}

impl ServerConfig {
    /// Sets one key from a file or `--env` pair: an unknown `kvcm.*` key is remembered in
    /// [`ServerConfig::ignored_keys`]; any other unknown key is an error.
    fn set_or_ignore(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        match self.set(key, value) {
            Err(ConfigError::UnknownKey(key)) if key.starts_with("kvcm.") => {
                self.ignored_keys.push(key);
                Ok(())
            }
            other => other,
        }
    }

    /// Sets one key from its text form.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        match key {
            "kvcm.service.rpc_port" => self.rpc_port = parse(key, value)?,
            "kvcm.service.admin_rpc_port" => self.admin_rpc_port = parse(key, value)?,
            "kvcm.service.http_port" => self.http_port = parse(key, value)?,
            "kvcm.service.admin_http_port" => self.admin_http_port = parse(key, value)?,
            "kvcm.service.enable_debug_service" => self.enable_debug_service = parse(key, value)?,
            "kvcm.service.http_max_body_bytes" => self.http_max_body_bytes = parse(key, value)?,
            "kvcm.data_dir" => self.data_dir = PathBuf::from(value),
            "kvcm.leader_elector.node_id" => self.node_id = value.to_string(),
            "kvcm.leader_elector.lease_ms" => self.lease_ms = parse(key, value)?,
            "kvcm.leader_elector.loop_interval_ms" => self.loop_interval_ms = parse(key, value)?,
            "kvcm.coordination.uri" => self.coordination_uri = value.to_string(),
            "kvcm.distributed_lock.uri" => self.distributed_lock_uri = value.to_string(),
            "kvcm.service.advertised_host" => self.advertised_host = value.to_string(),
            "kvcm.service.custom_info" => self.custom_info = value.to_string(),
            "kvcm.lookup.enabled" => self.lookup.enabled = parse(key, value)?,
            "kvcm.lookup.bind" => self.lookup.bind = parse(key, value)?,
            "kvcm.lookup.verbs_device" => {
                self.lookup.verbs_device = Some(value.to_string()).filter(|d| !d.is_empty())
            }
            "kvcm.lookup.verbs_gid_index" => self.lookup.verbs_gid_index = parse(key, value)?,
            "kvcm.lookup.max_queue_pairs" => self.lookup.queue_pairs.total = parse(key, value)?,
            "kvcm.lookup.max_queue_pairs_per_instance" => {
                self.lookup.queue_pairs.per_instance = parse(key, value)?
            }
            "kvcm.pool.heartbeat_ms" => self.pool.heartbeat_ms = parse(key, value)?,
            "kvcm.pool.rejoin_ramp_ms" => self.pool.rejoin_ramp_ms = parse(key, value)?,
            "kvcm.pool.resume_window_ms" => self.pool.resume_window_ms = parse(key, value)?,
            "kvcm.pool.size" => {
                self.pool.embedded_size =
                    crate::pool::parse_size(value).map_err(|reason| ConfigError::InvalidValue {
                        key: key.to_string(),
                        reason,
                    })?
            }
            "kvcm.pool.prefault" => self.pool.embedded_prefault = parse(key, value)?,
            "kvcm.storage.probe_interval_ms" => self.storage_probe_interval_ms = parse(key, value)?,
            "kvcm.capacity_curve.window_accesses" => {
                self.capacity_curve_window_accesses = parse(key, value)?
            }
            _ if key.starts_with("kvcm.event_log.") => {
                self.event_log
                    .set(log_files::EVENT_LOG_PREFIX, key, value)?
            }
            _ if key.starts_with("kvcm.access_log.") => self.access_log.set(key, value)?,
            _ if key.starts_with("kvcm.audit_log.") => {
                self.audit_log
                    .set(log_files::AUDIT_LOG_PREFIX, key, value)?
            }
            _ if METRICS_KEYS.contains(&key) => self.metrics.set(key, value)?,
            _ if RECLAIMER_KEYS.contains(&key) => self.reclaimer.set(key, value)?,
            _ if SECURITY_KEYS.contains(&key) => self.security.set(key, value)?,
            _ if key.starts_with("kvcm.journal.") || key == journal::REGISTRY_URI_KEY => {
                self.journal.set(key, value)?
            }
            _ => return Err(ConfigError::UnknownKey(key.to_string())),
        }
        Ok(())
    }

    /// Applies every key of a TOML file.
    pub fn apply_toml_file(&mut self, path: &Path) -> Result<(), ConfigError> {
        let file_error = |reason: String| ConfigError::File {
            path: path.to_path_buf(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| file_error(e.to_string()))?;
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| file_error(e.to_string()))?;
        let mut flat = BTreeMap::new();
        flatten("", &toml::Value::Table(table), &mut flat);
        for (key, value) in flat {
            self.set_or_ignore(&key, &value)?;
        }
        Ok(())
    }

    /// Applies `key=value` pairs (the reference's `--env` form).
    pub fn apply_pairs(&mut self, pairs: &[String]) -> Result<(), ConfigError> {
        for pair in pairs {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| ConfigError::InvalidValue {
                    key: pair.clone(),
                    reason: "expected key=value".into(),
                })?;
            self.set_or_ignore(key.trim(), value.trim())?;
        }
        Ok(())
    }

    /// Applies the environment variables of known keys, read through `lookup`.
    pub fn apply_env(
        &mut self,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        let logs = EVENT_LOG_KEYS
            .iter()
            .chain(&ACCESS_LOG_KEYS)
            .chain(&AUDIT_LOG_KEYS);
        let keys = KEYS.iter().chain(logs).chain(&JOURNAL_KEYS);
        for key in keys
            .chain(&METRICS_KEYS)
            .chain(&RECLAIMER_KEYS)
            .chain(&SECURITY_KEYS)
        {
            // Upstream reads the lower-case form (`kvcm_service_admin_auth_token`).
            let value = lookup(&env_name(key)).or_else(|| lookup(&key.replace('.', "_")));
            if let Some(value) = value {
                self.set(key, &value)?;
            }
        }
        Ok(())
    }

    /// Checks cross-key rules.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key: &str, reason: &str| ConfigError::InvalidValue {
            key: key.to_string(),
            reason: reason.to_string(),
        };
        if self.enable_debug_service && self.http_port != 0 && self.http_port > u16::MAX - 3000 {
            return Err(invalid(
                "kvcm.service.http_port",
                "the debug HTTP port http_port + 3000 must be below 65536",
            ));
        }
        if self.http_max_body_bytes == 0 {
            return Err(invalid(
                "kvcm.service.http_max_body_bytes",
                "must be positive",
            ));
        }
        if self.data_dir.as_os_str().is_empty() {
            return Err(invalid("kvcm.data_dir", "must not be empty"));
        }
        if self.lookup.bind.is_unspecified() {
            return Err(invalid(
                "kvcm.lookup.bind",
                "must be an address clients can reach (it is handed to them), not 0.0.0.0 or ::",
            ));
        }
        let queue_pairs = self.lookup.queue_pairs;
        if queue_pairs.per_instance == 0 || queue_pairs.per_instance > queue_pairs.total {
            return Err(invalid(
                "kvcm.lookup.max_queue_pairs_per_instance",
                "must be positive and at most kvcm.lookup.max_queue_pairs",
            ));
        }
        if self.lookup.verbs_device.is_some() && !kvcm_transport::ProviderKind::Verbs.is_built() {
            return Err(invalid(
                "kvcm.lookup.verbs_device",
                "this build has no verbs provider (build kvcm with feature `rdma`)",
            ));
        }
        self.validate_election()?;
        security::validate_auth(&self.security)?;
        if self.capacity_curve_window_accesses > MAX_CURVE_WINDOW {
            return Err(invalid(
                "kvcm.capacity_curve.window_accesses",
                &format!("at most {MAX_CURVE_WINDOW} block accesses (8 bytes each per instance)"),
            ));
        }
        let size = self.pool.embedded_size;
        if self.security.meta_auth_required && size > 0 && !crate::pool::region::can_isolate(size) {
            return Err(invalid(
                "kvcm.pool.size",
                &format!(
                    "with kvcm.auth.meta = required the embedded pool must isolate instances: \
                     at most {} bytes (about 32 GiB)",
                    crate::pool::region::MAX_ISOLATING_BYTES
                ),
            ));
        }
        if let Err(reason) = self.pool.validate() {
            let key = reason.split_whitespace().next().unwrap_or("kvcm.pool");
            return Err(invalid(key, &reason));
        }
        self.event_log.validate(log_files::EVENT_LOG_PREFIX)?;
        self.access_log.validate()?;
        self.audit_log.validate(log_files::AUDIT_LOG_PREFIX)?;
        self.metrics.validate()?;
        self.reclaimer.validate()?;
        self.journal.validate()
    }

    /// The interval of storage health probes; `None` when they are off.
    pub fn storage_probe_interval(&self) -> Option<Duration> {
        let ms = self.storage_probe_interval_ms;
        (ms > 0).then(|| Duration::from_millis(ms))
    }

    /// The lock URI in force and the key it came from (`kvcm.coordination.uri` wins).
    pub fn lock_uri(&self) -> (&'static str, &str) {
        if self.coordination_uri.is_empty() {
            ("kvcm.distributed_lock.uri", &self.distributed_lock_uri)
        } else {
            ("kvcm.coordination.uri", &self.coordination_uri)
        }
    }

    /// Lease and elector period.
    pub fn elector_settings(&self) -> ElectorSettings {
        ElectorSettings {
            lease: Duration::from_millis(self.lease_ms),
            loop_interval: Duration::from_millis(self.loop_interval_ms),
        }
    }

    /// The host published for leader discovery.
    pub fn published_host(&self) -> &str {
        if self.advertised_host.is_empty() {
            "127.0.0.1"
        } else {
            &self.advertised_host
        }
    }

    /// The lock URI parses to a backend of this build; lease and period fit together.
    fn validate_election(&self) -> Result<(), ConfigError> {
        let invalid = |key: &str, reason: String| ConfigError::InvalidValue {
            key: key.to_string(),
            reason,
        };
        let (key, uri) = self.lock_uri();
        let lock = LockUri::parse(uri).map_err(|error| invalid(key, error.to_string()))?;
        if self.journal.shared_store().is_some() && matches!(lock, LockUri::Memory) {
            return Err(invalid(
                key,
                "kvcm.registry_storage.uri keeps the metadata on Redis, which needs a lock every \
                 node shares and whose fencing tokens outlive a process: set redis://… (the same \
                 server works) or file://<dir>"
                    .into(),
            ));
        }
        if self.loop_interval_ms == 0 {
            let key = "kvcm.leader_elector.loop_interval_ms";
            return Err(invalid(key, "must be positive".into()));
        }
        self.elector_settings()
            .validate()
            .map_err(|reason| invalid("kvcm.leader_elector.lease_ms", reason))
    }

    /// The debug HTTP port: `http_port + 3000`, or OS-chosen when `http_port` is 0.
    pub fn debug_http_port(&self) -> u16 {
        if self.http_port == 0 {
            0
        } else {
            self.http_port.saturating_add(3000)
        }
    }

    /// Where the event log is written: `kvcm.event_log.dir`, else `<data_dir>/events`.
    pub fn event_log_dir(&self) -> PathBuf {
        let subdir = log_files::EVENT_LOG_SUBDIR;
        self.event_log.resolved_dir(&self.data_dir, subdir)
    }

    /// Where the audit log is written: `kvcm.audit_log.dir`, else `<data_dir>/audit`.
    pub fn audit_log_dir(&self) -> PathBuf {
        let subdir = log_files::AUDIT_LOG_SUBDIR;
        self.audit_log.resolved_dir(&self.data_dir, subdir)
    }

    /// Where the access log is written: `kvcm.access_log.dir`, else `<data_dir>/access`.
    pub fn access_log_dir(&self) -> PathBuf {
        let subdir = access_log::ACCESS_LOG_SUBDIR;
        self.access_log.files.resolved_dir(&self.data_dir, subdir)
    }

    /// Whether Admin (and Debug) gRPC share the main gRPC listener.
    pub fn admin_rpc_shared(&self) -> bool {
        self.admin_rpc_port == 0 || self.admin_rpc_port == self.rpc_port
    }
}

fn parse<T: std::str::FromStr>(key: &str, value: &str) -> Result<T, ConfigError>
where
    T::Err: std::fmt::Display,
{
    value
        .parse()
        .map_err(|e: T::Err| ConfigError::InvalidValue {
            key: key.to_string(),
            reason: format!("{value:?}: {e}"),
        })
}

/// Dotted keys and text values of every leaf of a TOML value.
fn flatten(prefix: &str, value: &toml::Value, out: &mut BTreeMap<String, String>) {
    match value {
        toml::Value::Table(table) => {
            for (name, child) in table {
                let key = if prefix.is_empty() {
                    name.clone()
                } else {
                    format!("{prefix}.{name}")
                };
                flatten(&key, child, out);
            }
        }
        toml::Value::String(text) => {
            out.insert(prefix.to_string(), text.clone());
        }
        toml::Value::Integer(number) => {
            out.insert(prefix.to_string(), number.to_string());
        }
        toml::Value::Boolean(flag) => {
            out.insert(prefix.to_string(), flag.to_string());
        }
        // Floats, dates and arrays fit no key; their debug text fails the key's parser.
        other => {
            out.insert(prefix.to_string(), format!("{other:?}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_apply_in_order_and_errors_name_the_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("kvcm.toml");
        std::fs::write(
            &file,
            "[kvcm.service]\nrpc_port = 7000\nhttp_port = 7001\n\"enable_debug_service\" = true\n",
        )
        .expect("write config");
        let mut config = ServerConfig::default();
        config.apply_toml_file(&file).expect("toml");
        assert_eq!((config.rpc_port, config.http_port), (7000, 7001));
        assert!(config.enable_debug_service);
        config
            .apply_pairs(&["kvcm.service.http_port=7101".into()])
            .expect("pairs");
        assert_eq!(config.http_port, 7101);
        config
            .apply_env(|name| (name == "KVCM_SERVICE_HTTP_PORT").then(|| "7201".into()))
            .expect("env");
        assert_eq!(config.http_port, 7201);
        assert_eq!(config.debug_http_port(), 10201);

        let error = config.set("kvcm.service.rpc_port", "70000").unwrap_err();
        assert!(
            error.to_string().contains("kvcm.service.rpc_port"),
            "{error}"
        );
        let error = config.set("kvcm.nope", "1").unwrap_err();
        assert!(error.to_string().contains("kvcm.nope"), "{error}");
        assert!(config.apply_pairs(&["no-equals".into()]).is_err());
    }

    #[test]
    fn unknown_kvcm_keys_are_skipped_and_other_unknown_keys_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("kvcm.toml");
        let text = "[kvcm.index_backend]\nuri = \"redis://x\"\n[kvcm.service]\nrpc_port = 7000\n";
        std::fs::write(&file, text).expect("write config");
        let mut config = ServerConfig::default();
        config
            .apply_toml_file(&file)
            .expect("a reference file with other kvcm keys");
        config
            .apply_pairs(&["kvcm.service.io_thread_num=8".into()])
            .expect("an unused reference key");
        assert_eq!(config.rpc_port, 7000);
        assert_eq!(
            config.ignored_keys,
            ["kvcm.index_backend.uri", "kvcm.service.io_thread_num"]
        );
        let error = config
            .apply_pairs(&["service.rpc_port=1".into()])
            .unwrap_err();
        assert!(error.to_string().contains("service.rpc_port"), "{error}");
    }

    #[test]
    fn a_verbs_device_needs_a_build_with_the_verbs_provider() {
        let mut config = ServerConfig::default();
        config.set("kvcm.lookup.verbs_device", "rxe0").unwrap();
        config.set("kvcm.lookup.verbs_gid_index", "1").unwrap();
        assert_eq!(config.lookup.verbs_device.as_deref(), Some("rxe0"));
        assert_eq!(config.lookup.verbs_gid_index, 1);
        let built = kvcm_transport::ProviderKind::Verbs.is_built();
        match config.validate() {
            Ok(()) => assert!(built, "accepted without the provider"),
            Err(error) => {
                assert!(!built, "{error}");
                assert!(
                    error.to_string().contains("kvcm.lookup.verbs_device"),
                    "{error}"
                );
            }
        }
        assert!(config.set("kvcm.lookup.verbs_gid_index", "256").is_err());
        config.set("kvcm.lookup.verbs_device", "").unwrap();
        assert_eq!(config.lookup.verbs_device, None, "empty turns verbs off");
        config.validate().unwrap();
    }

    #[test]
    fn an_instances_queue_pair_share_is_positive_and_within_the_total() {
        let mut config = ServerConfig::default();
        config.set("kvcm.lookup.max_queue_pairs", "8").unwrap();
        for bad in ["0", "9"] {
            config
                .set("kvcm.lookup.max_queue_pairs_per_instance", bad)
                .unwrap();
            let error = config.validate().unwrap_err().to_string();
            assert!(
                error.contains("kvcm.lookup.max_queue_pairs_per_instance"),
                "{error}"
            );
        }
        config
            .set("kvcm.lookup.max_queue_pairs_per_instance", "8")
            .unwrap();
        config.validate().unwrap();
        assert!(config.set("kvcm.lookup.max_queue_pairs", "-1").is_err());
    }

    #[test]
    fn under_meta_auth_an_embedded_pool_too_large_to_isolate_instances_is_refused() {
        let mut config = ServerConfig::default();
        config.set("kvcm.service.admin_auth_token", "t").unwrap();
        config.set("kvcm.auth.meta", "required").unwrap();
        let largest = crate::pool::region::MAX_ISOLATING_BYTES;
        config.set("kvcm.pool.size", &largest.to_string()).unwrap();
        config.validate().unwrap();
        config
            .set("kvcm.pool.size", &(largest + 1).to_string())
            .unwrap();
        let error = config.validate().unwrap_err().to_string();
        assert!(error.contains("kvcm.pool.size"), "{error}");
        assert!(error.contains("isolate"), "{error}");
        config.set("kvcm.auth.meta", "off").unwrap();
        config.validate().unwrap();
    }

    #[test]
    fn the_embedded_pool_size_takes_the_same_suffixes_as_the_flag() {
        let mut config = ServerConfig::default();
        config.set("kvcm.pool.size", "4M").unwrap();
        assert_eq!(config.pool.embedded_size, 4 << 20);
        config.set("kvcm.pool.size", "65536").unwrap();
        assert_eq!(config.pool.embedded_size, 65536);
        let error = config.set("kvcm.pool.size", "4X").unwrap_err().to_string();
        assert!(error.contains("kvcm.pool.size"), "{error}");
        assert_eq!(
            config.pool.embedded_size, 65536,
            "a refused value changes nothing"
        );
    }

    #[test]
    fn validate_rejects_an_unspecified_lookup_bind() {
        let mut config = ServerConfig::default();
        config.set("kvcm.lookup.bind", "0.0.0.0").unwrap();
        let error = config.validate().unwrap_err().to_string();
        assert!(error.contains("kvcm.lookup.bind"), "{error}");
        assert!(config.set("kvcm.lookup.bind", "not-an-ip").is_err());
        config.set("kvcm.lookup.bind", "127.0.0.1").unwrap();
        config.set("kvcm.lookup.enabled", "false").unwrap();
        assert!(config.validate().is_ok());
        assert!(!config.lookup.enabled);
    }

    #[test]
    fn the_shared_store_needs_a_lock_every_node_shares() {
        let mut config = ServerConfig::default();
        config
            .set("kvcm.registry_storage.uri", "redis://127.0.0.1:6379")
            .unwrap();
        let error = config.validate().unwrap_err().to_string();
        assert!(error.contains("kvcm.distributed_lock.uri"), "{error}");
        assert!(error.contains("kvcm.registry_storage.uri"), "{error}");
        config
            .set("kvcm.coordination.uri", "redis://127.0.0.1:6379")
            .unwrap();
        assert!(config.validate().is_ok());
        assert_eq!(
            config.journal.shared_store(),
            Some("redis://127.0.0.1:6379")
        );
        assert!(config.journal.journal(&config.data_dir).is_none());
    }

    #[test]
    fn lock_uris_and_elector_timing_are_validated_naming_the_key() {
        let mut config = ServerConfig::default();
        config
            .set("kvcm.distributed_lock.uri", "redis://127.0.0.1:6379")
            .unwrap();
        assert!(config.validate().is_ok(), "a redis lock URI");
        config
            .set("kvcm.distributed_lock.uri", "rediss://127.0.0.1:6379")
            .unwrap();
        let error = config.validate().unwrap_err().to_string();
        assert!(error.contains("kvcm.distributed_lock.uri"), "{error}");
        assert!(error.contains("TLS"), "{error}");
        config
            .set("kvcm.coordination.uri", "file:///tmp/kvcm-lock")
            .unwrap();
        assert_eq!(
            config.lock_uri(),
            ("kvcm.coordination.uri", "file:///tmp/kvcm-lock")
        );
        assert!(config.validate().is_ok(), "the newer name wins");
        config.set("kvcm.coordination.uri", "etcd://x").unwrap();
        let error = config.validate().unwrap_err().to_string();
        assert!(error.contains("kvcm.coordination.uri"), "{error}");

        let mut config = ServerConfig::default();
        config
            .set("kvcm.leader_elector.loop_interval_ms", "0")
            .unwrap();
        let error = config.validate().unwrap_err().to_string();
        assert!(
            error.contains("kvcm.leader_elector.loop_interval_ms"),
            "{error}"
        );
        config
            .set("kvcm.leader_elector.loop_interval_ms", "100")
            .unwrap();
        config.set("kvcm.leader_elector.lease_ms", "200").unwrap();
        let error = config.validate().unwrap_err().to_string();
        assert!(error.contains("kvcm.leader_elector.lease_ms"), "{error}");
        assert!(config.set("kvcm.leader_elector.lease_ms", "-1").is_err());
        config.set("kvcm.leader_elector.lease_ms", "2000").unwrap();
        assert!(config.validate().is_ok());
        assert_eq!(config.published_host(), "127.0.0.1");
    }

    #[test]
    fn validate_rejects_a_debug_port_past_65535() {
        let mut config = ServerConfig {
            enable_debug_service: true,
            http_port: 63000,
            ..Default::default()
        };
        let error = config.validate().unwrap_err();
        assert!(error.to_string().contains("kvcm.service.http_port"));
        config.http_port = 0;
        assert!(config.validate().is_ok());
        assert_eq!(config.debug_http_port(), 0);
    }
}
