//! The one table of RPCs. Each line declares an RPC once — its constant, handler method,
//! request and response types, name, HTTP route, how it runs, whether it is leader-only,
//! whether debug faults apply to it, whether it is counted per instance, and what it asks of
//! its caller — and from this table come the tonic service implementations, the HTTP
//! routers, the metric names, the fault-injection list, the authorization rule and the audit
//! list. A new RPC is one line here plus its handler method. A line may name
//! a second method after `/` for the HTTP route (an answer that prints its own JSON).

use axum::Router;

use super::admin::AdminHandler;
use super::debug::DebugHandler;
use super::meta::MetaHandler;
use crate::proto::admin::admin_service_server::AdminService;
use crate::proto::debug::debug_service_server::DebugService;
use crate::proto::meta::meta_service_server::MetaService;

/// The service an RPC belongs to (its status rules follow from it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// MetaService: engine-facing.
    Meta,
    /// AdminService: operator-facing.
    Admin,
    /// DebugService: fault injection.
    Debug,
}

/// Where the transports run an RPC's handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// On the runtime thread (short, memory-only work).
    Inline,
    /// On tokio's blocking pool (file-system work, whole-instance scans, opening backends).
    Blocking,
}

/// Request bytes beyond which an inline RPC runs on the blocking pool instead (about 7,000
/// keys): a call that resolves many keys and builds a large answer (a 100k-key batch get
/// takes tens of ms) must not hold a runtime thread that small calls are waiting for.
pub const HEAVY_REQUEST_BYTES: usize = 64 << 10;

impl Mode {
    /// How a call of this mode whose request is `request_bytes` long runs.
    pub fn for_request(self, request_bytes: usize) -> Mode {
        if request_bytes > HEAVY_REQUEST_BYTES {
            Mode::Blocking
        } else {
            self
        }
    }
}

/// What an RPC asks of its caller where a credential is required (see `auth`): the roles
/// allowed, and for a meta call of one instance, a key that names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// A meta call of the request's `instance_id`: a key must name that instance (or none).
    Client,
    /// A meta call of no instance: any authenticated caller.
    Anyone,
    /// Admin or debug, read only: operators and admins (not audited).
    Read,
    /// Admin or debug, changes state: operators and admins.
    Operate,
    /// Accounts, API keys, admin tokens, read only: admins (not audited).
    AdminRead,
    /// Accounts, API keys, admin tokens, changes: admins.
    Admin,
}

impl Access {
    /// Whether it only reads.
    pub fn reads_only(self) -> bool {
        matches!(self, Access::Read | Access::AdminRead)
    }
}

/// One RPC as the edge serves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rpc {
    /// The reference's RPC name (metric tag, fault-injection key).
    pub name: &'static str,
    /// `POST` route on the service's HTTP listener.
    pub route: &'static str,
    /// Its service.
    pub service: Service,
    /// How it runs.
    pub mode: Mode,
    /// Followers answer SERVER_NOT_LEADER.
    pub leader_only: bool,
    /// Debug fault injection applies.
    pub faultable: bool,
    /// Counted per instance as well as per API.
    pub per_instance: bool,
    /// What it asks of its caller.
    pub access: Access,
}

macro_rules! flag {
    (leader) => {
        true
    };
    (any) => {
        false
    };
    (faults) => {
        true
    };
    (nofaults) => {
        false
    };
    (instance) => {
        true
    };
    (global) => {
        false
    };
}

/// Calls the handler method of an RPC's HTTP route: its own, or the one named after `/`.
macro_rules! http_call {
    ($handler:ident, $request:ident, $method:ident) => {
        $handler.$method($request)
    };
    ($handler:ident, $request:ident, $method:ident, $http:ident) => {
        $handler.$http($request)
    };
}

macro_rules! access {
    (client) => {
        Access::Client
    };
    (anyone) => {
        Access::Anyone
    };
    (read) => {
        Access::Read
    };
    (operate) => {
        Access::Operate
    };
    (admin_read) => {
        Access::AdminRead
    };
    (admin) => {
        Access::Admin
    };
}

/// The instance a request of an RPC with this access touches.
macro_rules! scope {
    (client, $request:expr) => {
        Some($request.instance_id.as_str())
    };
    ($other:ident, $request:expr) => {
        None
    };
}

macro_rules! mode {
    (inline) => {
        Mode::Inline
    };
    (blocking) => {
        Mode::Blocking
    };
}

/// Emits, per service: its `Rpc` constants (in a module named after the service), its tonic
/// trait implementation and its HTTP router; and [`ALL`].
macro_rules! rpc_table {
    ($(
        $module:ident ($service:ident, $trait:ident for $handler:ty, $router:ident, $package:ident) {
            $( $constant:ident $method:ident $(/ $http:ident)? ($request:ident) -> $response:ident
                = $name:literal $route:literal $mode:ident $gate:ident $faults:ident $scope:ident $access:ident; )*
        }
    )*) => {
        $(
            #[doc = concat!("The RPCs of ", stringify!($trait), ".")]
            pub mod $module {
                use super::{Access, Mode, Rpc, Service};
                $(
                    #[doc = concat!("`", $name, "`.")]
                    pub const $constant: Rpc = Rpc {
                        name: $name,
                        route: $route,
                        service: Service::$service,
                        mode: mode!($mode),
                        leader_only: flag!($gate),
                        faultable: flag!($faults),
                        per_instance: flag!($scope),
                        access: access!($access),
                    };
                )*
            }

            $(
                impl super::auth::Scoped for crate::proto::$package::$request {
                    fn instance_id(&self) -> Option<&str> {
                        scope!($access, self)
                    }
                }
            )*

            #[tonic::async_trait]
            impl $trait for $handler {
                $(
                    async fn $method(
                        &self,
                        request: tonic::Request<crate::proto::$package::$request>,
                    ) -> Result<tonic::Response<crate::proto::$package::$response>, tonic::Status> {
                        let handler = self.clone();
                        let call = move |request| handler.$method(request);
                        super::grpc::serve(&$module::$constant, &self.core.access, request, call).await
                    }
                )*
            }

            #[doc = concat!("The HTTP router of ", stringify!($trait), ".")]
            pub fn $router(handler: $handler, limits: super::http::HttpLimits) -> Router {
                let router = Router::new();
                $(
                    let router = {
                        let handler = handler.clone();
                        let access = handler.core.access.clone();
                        super::http::route(router, &$module::$constant, limits, access, move |request| {
                            http_call!(handler, request, $method $(, $http)?)
                        })
                    };
                )*
                router
            }
        )*

        /// Every RPC, by service, in declaration order.
        pub const ALL: &[Rpc] = &[$($($module::$constant,)*)*];
    };
}

rpc_table! {
    meta (Meta, MetaService for MetaHandler, meta_router, meta) {
        REGISTER_INSTANCE register_instance(RegisterInstanceRequest) -> RegisterInstanceResponse
            = "RegisterInstance" "/api/registerInstance" inline leader nofaults global client;
        GET_INSTANCE_INFO get_instance_info(GetInstanceInfoRequest) -> GetInstanceInfoResponse
            = "GetInstanceInfo" "/api/getInstanceInfo" inline leader nofaults global client;
        GET_CACHE_META get_cache_meta(GetCacheMetaRequest) -> GetCacheMetaResponse
            = "GetCacheMeta" "/api/getCacheMeta" inline leader nofaults instance client;
        GET_CACHE_LOCATION get_cache_location / get_cache_location_json
            (GetCacheLocationRequest) -> GetCacheLocationResponse
            = "GetCacheLocation" "/api/getCacheLocation" inline leader faults instance client;
        START_WRITE_CACHE start_write_cache(StartWriteCacheRequest) -> StartWriteCacheResponse
            = "StartWriteCache" "/api/startWriteCache" blocking leader faults instance client;
        FINISH_WRITE_CACHE finish_write_cache(FinishWriteCacheRequest) -> CommonResponse
            = "FinishWriteCache" "/api/finishWriteCache" inline leader faults instance client;
        REMOVE_CACHE remove_cache(RemoveCacheRequest) -> CommonResponse
            = "RemoveCache" "/api/removeCache" inline leader nofaults instance client;
        TRIM_CACHE trim_cache(TrimCacheRequest) -> CommonResponse
            = "TrimCache" "/api/trimCache" blocking leader nofaults instance client;
        GET_CLUSTER_INFO get_cluster_info(GetClusterInfoRequest) -> GetClusterInfoResponse
            = "GetClusterInfo" "/api/getClusterInfo" blocking any nofaults global anyone;
        GET_CACHE_LOCATION_LEN get_cache_location_len(GetCacheLocationLenRequest) -> GetCacheLocationLenResponse
            = "GetCacheLocationLen" "/api/getCacheLocationLen" inline leader faults instance client;
        REPORT_EVENT report_event(ReportEventRequest) -> ReportEventResponse
            = "ReportEvent" "/api/reportEvent" blocking leader faults instance client;
        GET_HOST_CACHE_STATE get_host_cache_state(GetHostCacheStateRequest) -> GetHostCacheStateResponse
            = "GetHostCacheState" "/api/getHostCacheState" inline leader faults instance client;
        GET_CACHE_LOCATIONS_BY_BACKEND get_cache_locations_by_backend(GetCacheLocationsByBackendRequest) -> GetCacheLocationsByBackendResponse
            = "GetCacheLocationsByBackend" "/api/getCacheLocationsByBackend" inline leader faults instance client;
    }
    admin (Admin, AdminService for AdminHandler, admin_routes, admin) {
        ADD_STORAGE add_storage(AddStorageRequest) -> CommonResponse
            = "AddStorage" "/api/addStorage" blocking leader nofaults global operate;
        ENABLE_STORAGE enable_storage(EnableStorageRequest) -> CommonResponse
            = "EnableStorage" "/api/enableStorage" inline leader nofaults global operate;
        DISABLE_STORAGE disable_storage(DisableStorageRequest) -> CommonResponse
            = "DisableStorage" "/api/disableStorage" inline leader nofaults global operate;
        REMOVE_STORAGE remove_storage(RemoveStorageRequest) -> CommonResponse
            = "RemoveStorage" "/api/removeStorage" blocking leader nofaults global operate;
        UPDATE_STORAGE update_storage(UpdateStorageRequest) -> CommonResponse
            = "UpdateStorage" "/api/updateStorage" blocking leader nofaults global operate;
        LIST_STORAGE list_storage(ListStorageRequest) -> ListStorageResponse
            = "ListStorage" "/api/listStorage" inline leader nofaults global read;
        CREATE_INSTANCE_GROUP create_instance_group(CreateInstanceGroupRequest) -> CommonResponse
            = "CreateInstanceGroup" "/api/createInstanceGroup" inline leader nofaults global operate;
        UPDATE_INSTANCE_GROUP update_instance_group(UpdateInstanceGroupRequest) -> CommonResponse
            = "UpdateInstanceGroup" "/api/updateInstanceGroup" inline leader nofaults global operate;
        REMOVE_INSTANCE_GROUP remove_instance_group(RemoveInstanceGroupRequest) -> CommonResponse
            = "RemoveInstanceGroup" "/api/removeInstanceGroup" inline leader nofaults global operate;
        GET_INSTANCE_GROUP get_instance_group(GetInstanceGroupRequest) -> GetInstanceGroupResponse
            = "GetInstanceGroup" "/api/getInstanceGroup" inline leader nofaults global read;
        GET_CACHE_META get_cache_meta(GetCacheMetaRequest) -> GetCacheMetaResponse
            = "GetCacheMeta" "/api/getCacheMeta" inline leader nofaults global read;
        REMOVE_CACHE remove_cache(RemoveCacheRequest) -> CommonResponse
            = "RemoveCache" "/api/removeCache" inline leader nofaults global operate;
        REGISTER_INSTANCE register_instance(RegisterInstanceRequest) -> CommonResponse
            = "RegisterInstance" "/api/registerInstance" inline leader nofaults global operate;
        REMOVE_INSTANCE remove_instance(RemoveInstanceRequest) -> CommonResponse
            = "RemoveInstance" "/api/removeInstance" blocking leader nofaults global operate;
        GET_INSTANCE_INFO get_instance_info(GetInstanceInfoRequest) -> GetInstanceInfoResponse
            = "GetInstanceInfo" "/api/getInstanceInfo" inline leader nofaults global read;
        LIST_INSTANCE_INFO list_instance_info(ListInstanceInfoRequest) -> ListInstanceInfoResponse
            = "ListInstanceInfo" "/api/listInstanceInfo" inline leader nofaults global read;
        ADD_ACCOUNT add_account(AddAccountRequest) -> CommonResponse
            = "AddAccount" "/api/addAccount" blocking leader nofaults global admin;
        DELETE_ACCOUNT delete_account(DeleteAccountRequest) -> CommonResponse
            = "DeleteAccount" "/api/deleteAccount" inline leader nofaults global admin;
        LIST_ACCOUNT list_account(ListAccountRequest) -> ListAccountResponse
            = "ListAccount" "/api/listAccount" inline leader nofaults global admin_read;
        GEN_CONFIG_SNAPSHOT gen_config_snapshot(GenConfigSnapshotRequest) -> ConfigSnapShotResponse
            = "GenConfigSnapshot" "/api/genConfigSnapshot" inline leader nofaults global admin_read;
        LOAD_CONFIG_SNAPSHOT load_config_snapshot(LoadConfigSnapshotRequest) -> CommonResponse
            = "LoadConfigSnapshot" "/api/loadConfigSnapshot" inline leader nofaults global admin;
        GET_METRICS get_metrics(GetMetricsRequest) -> GetMetricsResponse
            = "GetMetrics" "/api/getMetrics" inline any nofaults global read;
        CHECK_HEALTH check_health(CheckHealthRequest) -> CheckHealthResponse
            = "CheckHealth" "/api/checkHealth" inline any nofaults global read;
        GET_MANAGER_CLUSTER_INFO get_manager_cluster_info(GetManagerClusterInfoRequest) -> GetManagerClusterInfoResponse
            = "GetManagerClusterInfo" "/api/getManagerClusterInfo" blocking any nofaults global read;
        LEADER_DEMOTE leader_demote(LeaderDemoteRequest) -> CommonResponse
            = "LeaderDemote" "/api/leaderDemote" inline any nofaults global operate;
        GET_LEADER_ELECTOR_CONFIG get_leader_elector_config(GetLeaderElectorConfigRequest) -> GetLeaderElectorConfigResponse
            = "GetLeaderElectorConfig" "/api/getLeaderElectorConfig" inline any nofaults global read;
        UPDATE_LEADER_ELECTOR_CONFIG update_leader_elector_config(UpdateLeaderElectorConfigRequest) -> CommonResponse
            = "UpdateLeaderElectorConfig" "/api/updateLeaderElectorConfig" inline any nofaults global operate;
        UPDATE_LOGGER update_logger(UpdateLoggerRequest) -> CommonResponse
            = "UpdateLogger" "/api/updateLogger" inline any nofaults global operate;
        LIST_INSTANCE_GROUP list_instance_group(ListInstanceGroupRequest) -> ListInstanceGroupResponse
            = "ListInstanceGroup" "/api/listInstanceGroup" inline leader nofaults global read;
        SET_ADMIN_AUTH_TOKENS set_admin_auth_tokens(SetAdminAuthTokensRequest) -> CommonResponse
            = "SetAdminAuthTokens" "/api/setAdminAuthTokens" inline any nofaults global admin;
        ROTATE_ADMIN_AUTH_TOKEN rotate_admin_auth_token(RotateAdminAuthTokenRequest) -> CommonResponse
            = "RotateAdminAuthToken" "/api/rotateAdminAuthToken" inline any nofaults global admin;
        LIST_ADMIN_AUTH_TOKENS list_admin_auth_tokens(ListAdminAuthTokensRequest) -> ListAdminAuthTokensResponse
            = "ListAdminAuthTokens" "/api/listAdminAuthTokens" inline any nofaults global admin_read;
        CREATE_API_KEY create_api_key(CreateApiKeyRequest) -> CreateApiKeyResponse
            = "CreateApiKey" "/api/createApiKey" inline leader nofaults global admin;
        REVOKE_API_KEY revoke_api_key(RevokeApiKeyRequest) -> CommonResponse
            = "RevokeApiKey" "/api/revokeApiKey" inline leader nofaults global admin;
        LIST_API_KEYS list_api_keys(ListApiKeysRequest) -> ListApiKeysResponse
            = "ListApiKeys" "/api/listApiKeys" inline leader nofaults global admin_read;
    }
    debug (Debug, DebugService for DebugHandler, debug_router, debug) {
        INJECT_FAULT inject_fault(InjectFaultRequest) -> CommonResponse
            = "InjectFault" "/api/injectFault" inline any nofaults global operate;
        REMOVE_FAULT remove_fault(RemoveFaultRequest) -> CommonResponse
            = "RemoveFault" "/api/removeFault" inline any nofaults global operate;
        CLEAR_FAULTS clear_faults(ClearFaultsRequest) -> CommonResponse
            = "ClearFaults" "/api/clearFaults" inline any nofaults global operate;
    }
}

/// The names of the RPCs counted in the metrics (meta and admin, each name once), split into
/// those counted per API only and those also counted per instance.
pub fn metric_names() -> (Vec<&'static str>, Vec<&'static str>) {
    let mut global = Vec::new();
    let mut per_instance = Vec::new();
    for rpc in ALL.iter().filter(|rpc| rpc.service != Service::Debug) {
        if global.contains(&rpc.name) || per_instance.contains(&rpc.name) {
            continue;
        }
        if rpc.per_instance {
            per_instance.push(rpc.name);
        } else {
            global.push(rpc.name);
        }
    }
    (global, per_instance)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_routes_are_unique_per_service() {
        for service in [Service::Meta, Service::Admin, Service::Debug] {
            let rpcs: Vec<&Rpc> = ALL.iter().filter(|r| r.service == service).collect();
            for (i, rpc) in rpcs.iter().enumerate() {
                assert!(rpcs[..i]
                    .iter()
                    .all(|r| r.name != rpc.name && r.route != rpc.route));
            }
        }
    }

    #[test]
    fn metrics_count_every_meta_and_admin_name_once() {
        let (global, per_instance) = metric_names();
        assert_eq!((global.len(), per_instance.len()), (34, 10));
        assert!(per_instance.contains(&"GetCacheLocation"));
        assert!(!global.contains(&"GetCacheMeta"), "counted per instance");
    }
}
