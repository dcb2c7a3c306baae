//! The service edge: MetaService, AdminService and DebugService over gRPC (tonic) and HTTP
//! JSON (axum). Every RPC is declared once, in [`rpcs`]; handlers are transport-neutral;
//! [`core::Core`] applies the reference's order of checks, maps errors to wire codes (once,
//! in [`core::wire_status`]) and records metrics.

pub mod admin;
pub mod auth;
mod by_backend;
pub mod capacity_metrics;
pub mod convert;
pub mod core;
pub mod debug;
pub mod faults;
mod grpc;
pub mod http;
pub mod journal_metrics;
mod location_json;
mod lookup_metrics;
pub mod meta;
pub mod metrics;
mod reply;
mod reports;
pub mod rpcs;
mod samples;
mod wire_admin;

pub(crate) use reply::Reply;
pub use wire_admin::{group_from_wire, storage_type_number};

use std::sync::Arc;

use kvcm_manager::Manager;

use crate::config::RequestLimits;

/// Applies a new log level; installed by the binary that owns the log subscriber.
pub type LogLevelSetter = Arc<dyn Fn(tracing::Level) -> Result<(), String> + Send + Sync>;

/// The three handlers over one shared core.
#[derive(Debug, Clone)]
pub struct Handlers {
    /// Shared state.
    pub core: Arc<core::Core>,
    /// MetaService.
    pub meta: meta::MetaHandler,
    /// AdminService.
    pub admin: admin::AdminHandler,
    /// DebugService.
    pub debug: debug::DebugHandler,
}

/// Where the handlers and transports log.
#[derive(Debug, Clone, Default)]
pub struct LogSinks {
    /// The event log of successful meta calls and reclaims.
    pub events: crate::events::EventSink,
    /// The access log of every transport call.
    pub access: crate::access_log::AccessSink,
    /// The live capacity curves fed by served lookups.
    pub curves: Arc<crate::curves::LiveCurves>,
}

impl Handlers {
    /// Handlers serving this manager; `log_level` makes UpdateLogger effective.
    pub fn new(manager: Arc<Manager>, log_level: Option<LogLevelSetter>) -> Self {
        Self::with_logs(
            manager,
            log_level,
            LogSinks::default(),
            RequestLimits::default(),
        )
    }

    /// As [`Handlers::new`], logging to `logs`, requests bounded by `limits`.
    pub fn with_logs(
        manager: Arc<Manager>,
        log_level: Option<LogLevelSetter>,
        logs: LogSinks,
        limits: RequestLimits,
    ) -> Self {
        let LogSinks {
            events,
            access,
            curves,
        } = logs;
        if events.is_enabled() {
            let reclaims = events.clone();
            manager.set_reclaim_listener(Arc::new(move |instance, keys| {
                reclaims.reclaimed(instance, keys)
            }));
        }
        let registry = manager.clone();
        let registered = move |id: &Arc<str>| {
            let instance = registry.instance(id);
            instance.is_some_and(|instance| Arc::ptr_eq(instance.id(), id))
        };
        let (api_names, instance_api_names) = rpcs::metric_names();
        let metrics = metrics::Metrics::new(&api_names, &instance_api_names, Box::new(registered));
        let auth = auth::Authenticator::with_keys(manager.clone());
        let core = Arc::new(core::Core {
            manager,
            metrics,
            faults: faults::Faults::default(),
            log_level,
            events,
            access,
            curves,
            limits,
            auth,
            lookup: std::sync::OnceLock::new(),
        });
        Handlers {
            meta: meta::MetaHandler::new(core.clone()),
            admin: admin::AdminHandler::new(core.clone()),
            debug: debug::DebugHandler::new(core.clone()),
            core,
        }
    }
}
