//! `kvcm serve`: binds every listener (gRPC, meta HTTP, admin HTTP, debug HTTP), logs one
//! line per listener with its real address (and optionally writes them to a ready file),
//! and stops cleanly on SIGTERM / SIGINT.

mod admission;
mod bootstrap;
mod client_cert;
mod crl_signature;
mod der;
mod election;
mod http_serve;
mod listeners;
pub mod tls;

use std::path::PathBuf;

pub use bootstrap::{embedded_manager, DEFAULT_GROUP, DEFAULT_POOL, DEFAULT_STORAGE};
pub use listeners::{nodelay_incoming, start, RunningServer};

/// Marks the process not dumpable unless `kvcm.service.dumpable` is set: no core dumps,
/// and `/proc/<pid>/fd`, `/proc/<pid>/mem` and ptrace closed to every process without
/// `CAP_SYS_PTRACE`, its own user's included (the shared-memory wire hands its memory to
/// clients by descriptor passing only, docs/security.md).
pub fn protect_process(security: &crate::config::SecurityConfig) -> Result<(), ServerError> {
    if security.dumpable {
        tracing::warn!(
            "kvcm.service.dumpable=true: processes of this user can read the server's memory"
        );
        return Ok(());
    }
    kvcm_transport::set_dumpable(false).map_err(ServerError::Protect)
}

/// Set once a restart was asked for (see [`request_restart`]).
static RESTART: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// The campaign pause the restarted process keeps, in ms.
static RESTART_HOLD_OFF_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The environment variable that hands a restarted `kvcm serve` the rest of its campaign
/// pause (set by the process that restarts itself, read at start; not a setting).
pub const RESTART_HOLD_OFF_ENV: &str = "KVCM_RESTART_HOLD_OFF_MS";

/// Asks the process to stop as on SIGTERM (listeners drained, logs closed) and then to start
/// again with the same arguments (`kvcm serve` re-executes itself: same pid, fresh state).
/// A node on the shared store does this when it loses the lead, since what it holds in
/// memory may be stale from then on; `hold_off` is the campaign pause the new process keeps
/// (what remains of a LeaderDemote's), so a demotion is not undone by the restart.
pub fn request_restart(why: &str, hold_off: std::time::Duration) {
    tracing::warn!(why, "restarting the process");
    let hold_off_ms = u64::try_from(hold_off.as_millis()).unwrap_or(u64::MAX);
    RESTART_HOLD_OFF_MS.store(hold_off_ms, std::sync::atomic::Ordering::SeqCst);
    RESTART.store(true, std::sync::atomic::Ordering::SeqCst);
    if let Err(error) = nix::sys::signal::raise(nix::sys::signal::Signal::SIGTERM) {
        tracing::error!(%error, "raising SIGTERM for the restart; exiting at once");
        std::process::exit(75);
    }
}

/// Whether [`request_restart`] was called, and the campaign pause to hand on (ms).
pub fn restart_requested() -> Option<u64> {
    RESTART
        .load(std::sync::atomic::Ordering::SeqCst)
        .then(|| RESTART_HOLD_OFF_MS.load(std::sync::atomic::Ordering::SeqCst))
}

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The process could not be marked not dumpable.
    #[error("marking the process not dumpable (kvcm.service.dumpable): {0}")]
    Protect(kvcm_transport::TransportError),
    /// The data directory cannot be created.
    #[error("data directory {path}: {source}")]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The leader lock cannot be opened.
    #[error("{key}: {source}")]
    Election {
        /// The config key of the lock URI.
        key: &'static str,
        /// What went wrong.
        source: kvcm_manager::leader::LockError,
    },
    /// Registering the embedded default failed.
    #[error("embedded default: {0}")]
    Bootstrap(#[from] kvcm_manager::ManagerError),
    /// A listener cannot bind.
    #[error("binding {name} on port {port}: {source}")]
    Bind {
        /// Listener name.
        name: &'static str,
        /// Requested port.
        port: u16,
        /// The OS error.
        source: std::io::Error,
    },
    /// The ready file cannot be written.
    #[error("writing ready file {path}: {source}")]
    ReadyFile {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The pool membership or the embedded pool node could not start.
    #[error("memory pool: {0}")]
    Pool(String),
    /// The lookup path could not start.
    #[error("lookup path: {0}")]
    Lookup(String),
    /// TLS could not be set up (a certificate, key or CA file).
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// A listener failed while serving.
    #[error("{name} stopped: {reason}")]
    Serve {
        /// Listener name.
        name: &'static str,
        /// What happened.
        reason: String,
    },
}
