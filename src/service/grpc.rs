//! The tonic service implementations: each gRPC method hands the decoded request to the
//! handler of the same name. Application errors travel in `header.status`; the gRPC status
//! is always OK (as in the reference). Methods marked `blocking` (file-system work, whole
//! instance scans, opening backends) run on tokio's blocking pool, never on a runtime thread.

use std::time::Instant;

use tonic::{Request, Response, Status};

use super::admin::AdminHandler;
use super::core::served_since;
use super::debug::DebugHandler;
use super::meta::MetaHandler;
use crate::proto::admin::admin_service_server::AdminService;
use crate::proto::debug::debug_service_server::DebugService;
use crate::proto::meta::meta_service_server::MetaService;
use crate::proto::{admin, debug, meta};

/// Serves one request on the calling runtime thread (short, memory-only work).
macro_rules! serve {
    (inline, $handler:ident, $method:ident, $request:ident, $started:ident) => {
        served_since($started, || $handler.$method($request))
    };
    (blocking, $handler:ident, $method:ident, $request:ident, $started:ident) => {{
        let handler = $handler.clone();
        tokio::task::spawn_blocking(move || served_since($started, || handler.$method($request)))
            .await
            .map_err(|error| Status::internal(format!("handler task failed: {error}")))?
    }};
}

macro_rules! grpc_service {
    ($service:ident for $handler:ty, $($mode:ident $method:ident($request:ty) -> $response:ty;)*) => {
        #[tonic::async_trait]
        impl $service for $handler {
            $(
                async fn $method(
                    &self,
                    request: Request<$request>,
                ) -> Result<Response<$response>, Status> {
                    let started = Instant::now();
                    let request = request.into_inner();
                    let reply = serve!($mode, self, $method, request, started);
                    Ok(Response::new(reply))
                }
            )*
        }
    };
}

grpc_service!(MetaService for MetaHandler,
        inline register_instance(meta::RegisterInstanceRequest) -> meta::RegisterInstanceResponse;
        inline get_instance_info(meta::GetInstanceInfoRequest) -> meta::GetInstanceInfoResponse;
        inline get_cache_meta(meta::GetCacheMetaRequest) -> meta::GetCacheMetaResponse;
        inline get_cache_location(meta::GetCacheLocationRequest) -> meta::GetCacheLocationResponse;
        blocking start_write_cache(meta::StartWriteCacheRequest) -> meta::StartWriteCacheResponse;
        inline finish_write_cache(meta::FinishWriteCacheRequest) -> meta::CommonResponse;
        inline remove_cache(meta::RemoveCacheRequest) -> meta::CommonResponse;
        blocking trim_cache(meta::TrimCacheRequest) -> meta::CommonResponse;
);

grpc_service!(AdminService for AdminHandler,
        blocking add_storage(admin::AddStorageRequest) -> admin::CommonResponse;
        inline enable_storage(admin::EnableStorageRequest) -> admin::CommonResponse;
        inline disable_storage(admin::DisableStorageRequest) -> admin::CommonResponse;
        blocking remove_storage(admin::RemoveStorageRequest) -> admin::CommonResponse;
        blocking update_storage(admin::UpdateStorageRequest) -> admin::CommonResponse;
        inline list_storage(admin::ListStorageRequest) -> admin::ListStorageResponse;
        inline create_instance_group(admin::CreateInstanceGroupRequest) -> admin::CommonResponse;
        inline update_instance_group(admin::UpdateInstanceGroupRequest) -> admin::CommonResponse;
        inline remove_instance_group(admin::RemoveInstanceGroupRequest) -> admin::CommonResponse;
        inline get_instance_group(admin::GetInstanceGroupRequest) -> admin::GetInstanceGroupResponse;
        inline get_cache_meta(admin::GetCacheMetaRequest) -> admin::GetCacheMetaResponse;
        inline remove_cache(admin::RemoveCacheRequest) -> admin::CommonResponse;
        inline register_instance(admin::RegisterInstanceRequest) -> admin::CommonResponse;
        blocking remove_instance(admin::RemoveInstanceRequest) -> admin::CommonResponse;
        inline get_instance_info(admin::GetInstanceInfoRequest) -> admin::GetInstanceInfoResponse;
        inline list_instance_info(admin::ListInstanceInfoRequest) -> admin::ListInstanceInfoResponse;
        inline add_account(admin::AddAccountRequest) -> admin::CommonResponse;
        inline delete_account(admin::DeleteAccountRequest) -> admin::CommonResponse;
        inline list_account(admin::ListAccountRequest) -> admin::ListAccountResponse;
        inline gen_config_snapshot(admin::GenConfigSnapshotRequest) -> admin::ConfigSnapShotResponse;
        inline load_config_snapshot(admin::LoadConfigSnapshotRequest) -> admin::CommonResponse;
        inline get_metrics(admin::GetMetricsRequest) -> admin::GetMetricsResponse;
        inline check_health(admin::CheckHealthRequest) -> admin::CheckHealthResponse;
        inline get_manager_cluster_info(admin::GetManagerClusterInfoRequest) -> admin::GetManagerClusterInfoResponse;
        inline leader_demote(admin::LeaderDemoteRequest) -> admin::CommonResponse;
        inline get_leader_elector_config(admin::GetLeaderElectorConfigRequest) -> admin::GetLeaderElectorConfigResponse;
        inline update_leader_elector_config(admin::UpdateLeaderElectorConfigRequest) -> admin::CommonResponse;
        inline update_logger(admin::UpdateLoggerRequest) -> admin::CommonResponse;
);

grpc_service!(DebugService for DebugHandler,
        inline inject_fault(debug::InjectFaultRequest) -> debug::CommonResponse;
        inline remove_fault(debug::RemoveFaultRequest) -> debug::CommonResponse;
        inline clear_faults(debug::ClearFaultsRequest) -> debug::CommonResponse;
);
