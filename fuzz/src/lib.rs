//! What the fuzz targets share: one in-process kvcm (the embedded default storage and group,
//! the journal on, file tiers confined to a temporary directory by
//! `kvcm.service.storage_root_allow_list`) and the choice of an RPC from an input's first
//! byte.
//!
//! The server is built once per fuzzing process and keeps its state across inputs, as a
//! long-running server does; libFuzzer's panic hook turns a panic on any thread (a handler
//! on a runtime worker included) into a crash. Its access and audit logs are on, bodies
//! included (small files, rotated), so every input's request and answer also pass through
//! the logs' redaction on their writer threads.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use kvcm::access_log::AccessLog;
use kvcm::config::ServerConfig;
use kvcm::service::http::HttpLimits;
use kvcm::service::rpcs::{Rpc, ALL};
use kvcm::service::{Handlers, LogSinks};

/// RPCs the targets never call: they change this process's role in the election (a
/// demoted node answers SERVER_NOT_LEADER to everything after), which tests/election.rs
/// covers.
const ROLE_CHANGES: [&str; 2] = ["LeaderDemote", "UpdateLeaderElectorConfig"];

/// The in-process server.
pub struct Harness {
    /// Runs the handlers (blocking ones on its blocking pool, as the server does).
    pub runtime: tokio::runtime::Runtime,
    /// The three services over one manager.
    pub handlers: Handlers,
    /// What an HTTP body may be (`kvcm.service.http_max_body_bytes`, `body_timeout_ms`).
    pub http_limits: HttpLimits,
    /// The access and audit logs the handlers write.
    _logs: AccessLog,
    /// The data directory (storage roots may lie only here).
    _dir: tempfile::TempDir,
}

/// The process's harness, built on first use.
pub fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| build().expect("the fuzz harness starts"))
}

fn build() -> Result<Harness, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let root = dir.path().canonicalize().map_err(|e| e.to_string())?;
    let root = root
        .to_str()
        .ok_or("a temporary directory that is not UTF-8")?;
    let mut config = ServerConfig::default();
    for (key, value) in [
        ("kvcm.data_dir", root),
        ("kvcm.service.storage_root_allow_list", root),
        ("kvcm.journal.fsync", "never"),
        ("kvcm.lookup.enabled", "false"),
        ("kvcm.storage.probe_interval_ms", "0"),
        ("kvcm.event_log.enabled", "false"),
        ("kvcm.access_log.bodies", "true"),
        ("kvcm.access_log.max_file_bytes", "1048576"),
        ("kvcm.access_log.keep_files", "1"),
        ("kvcm.audit_log.max_file_bytes", "1048576"),
        ("kvcm.audit_log.keep_files", "1"),
    ] {
        config.set(key, value).map_err(|e| e.to_string())?;
    }
    config.validate().map_err(|e| e.to_string())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let manager = kvcm::server::embedded_manager(&config).map_err(|e| e.to_string())?;
    let logs = AccessLog::from_config(&config).map_err(|e| e.to_string())?;
    let sinks = LogSinks {
        events: kvcm::events::EventSink::disabled(),
        access: logs.sink(),
        curves: Arc::new(kvcm::curves::LiveCurves::new(
            config.capacity_curve_window_accesses,
        )),
    };
    let limits = config.security.limits;
    Ok(Harness {
        runtime,
        handlers: Handlers::with_logs(Arc::clone(&manager), None, sinks, limits),
        http_limits: HttpLimits {
            max_body_bytes: config.http_max_body_bytes,
            body_timeout: Duration::from_millis(config.security.connections.body_timeout_ms),
        },
        _logs: logs,
        _dir: dir,
    })
}

/// The RPCs a target may call, in the table's order.
pub fn callable() -> &'static [Rpc] {
    static CALLABLE: OnceLock<Vec<Rpc>> = OnceLock::new();
    CALLABLE.get_or_init(|| {
        ALL.iter()
            .filter(|rpc| !ROLE_CHANGES.contains(&rpc.name))
            .copied()
            .collect()
    })
}

/// The RPC an input's first byte names, and the rest of the input.
pub fn split(input: &[u8]) -> Option<(Rpc, &[u8])> {
    let (&first, rest) = input.split_first()?;
    let rpcs = callable();
    Some((rpcs[usize::from(first) % rpcs.len()], rest))
}
