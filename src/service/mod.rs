//! The service edge: MetaService, AdminService and DebugService over gRPC (tonic) and HTTP
//! JSON (axum). Handlers are transport-neutral; [`core::Core`] applies the reference's order
//! of checks, maps manager errors to wire codes (once) and records metrics.

pub mod admin;
mod convert;
pub mod core;
pub mod debug;
pub mod faults;
mod grpc;
pub mod http;
pub mod meta;
pub mod metrics;
mod reply;
mod wire_admin;

pub use wire_admin::group_from_wire;

use std::sync::Arc;

use kvcm_manager::Manager;

/// Every API name except [`INSTANCE_API_NAMES`], for the metrics registry.
pub const OTHER_API_NAMES: [&str; 26] = [
    "RegisterInstance",
    "GetInstanceInfo",
    "AddStorage",
    "EnableStorage",
    "DisableStorage",
    "RemoveStorage",
    "UpdateStorage",
    "ListStorage",
    "CreateInstanceGroup",
    "UpdateInstanceGroup",
    "RemoveInstanceGroup",
    "GetInstanceGroup",
    "RemoveInstance",
    "ListInstanceInfo",
    "AddAccount",
    "DeleteAccount",
    "ListAccount",
    "GenConfigSnapshot",
    "LoadConfigSnapshot",
    "GetMetrics",
    "CheckHealth",
    "GetManagerClusterInfo",
    "LeaderDemote",
    "GetLeaderElectorConfig",
    "UpdateLeaderElectorConfig",
    "UpdateLogger",
];

/// The meta APIs on one instance (counted per API and per instance).
pub const INSTANCE_API_NAMES: [&str; 6] = [
    "GetCacheMeta",
    "GetCacheLocation",
    "StartWriteCache",
    "FinishWriteCache",
    "RemoveCache",
    "TrimCache",
];

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

impl Handlers {
    /// Handlers serving this manager; `log_level` makes UpdateLogger effective.
    pub fn new(manager: Arc<Manager>, log_level: Option<LogLevelSetter>) -> Self {
        Self::with_events(manager, log_level, crate::events::EventSink::disabled())
    }

    /// As [`Handlers::new`], logging successful meta calls to `events`.
    pub fn with_events(
        manager: Arc<Manager>,
        log_level: Option<LogLevelSetter>,
        events: crate::events::EventSink,
    ) -> Self {
        let registry = manager.clone();
        let registered = move |id: &Arc<str>| {
            let instance = registry.instance(id);
            instance.is_some_and(|instance| Arc::ptr_eq(instance.id(), id))
        };
        let metrics =
            metrics::Metrics::new(&OTHER_API_NAMES, &INSTANCE_API_NAMES, Box::new(registered));
        let core = Arc::new(core::Core {
            manager,
            metrics,
            faults: faults::Faults::default(),
            log_level,
            events,
        });
        Handlers {
            meta: meta::MetaHandler::new(core.clone()),
            admin: admin::AdminHandler::new(core.clone()),
            debug: debug::DebugHandler::new(core.clone()),
            core,
        }
    }
}
