//! The tonic service implementations: each gRPC method hands the decoded request to the
//! handler of the same name. Application errors travel in `header.status`; the gRPC status
//! is always OK (as in the reference).

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

macro_rules! grpc_service {
    ($service:ident for $handler:ty, $($method:ident($request:ty) -> $response:ty;)*) => {
        #[tonic::async_trait]
        impl $service for $handler {
            $(
                async fn $method(
                    &self,
                    request: Request<$request>,
                ) -> Result<Response<$response>, Status> {
                    let started = Instant::now();
                    let request = request.into_inner();
                    let reply = served_since(started, || <$handler>::$method(self, request));
                    Ok(Response::new(reply))
                }
            )*
        }
    };
}

grpc_service!(MetaService for MetaHandler,
        register_instance(meta::RegisterInstanceRequest) -> meta::RegisterInstanceResponse;
        get_instance_info(meta::GetInstanceInfoRequest) -> meta::GetInstanceInfoResponse;
        get_cache_meta(meta::GetCacheMetaRequest) -> meta::GetCacheMetaResponse;
        get_cache_location(meta::GetCacheLocationRequest) -> meta::GetCacheLocationResponse;
        start_write_cache(meta::StartWriteCacheRequest) -> meta::StartWriteCacheResponse;
        finish_write_cache(meta::FinishWriteCacheRequest) -> meta::CommonResponse;
        remove_cache(meta::RemoveCacheRequest) -> meta::CommonResponse;
        trim_cache(meta::TrimCacheRequest) -> meta::CommonResponse;
);

grpc_service!(AdminService for AdminHandler,
        add_storage(admin::AddStorageRequest) -> admin::CommonResponse;
        enable_storage(admin::EnableStorageRequest) -> admin::CommonResponse;
        disable_storage(admin::DisableStorageRequest) -> admin::CommonResponse;
        remove_storage(admin::RemoveStorageRequest) -> admin::CommonResponse;
        update_storage(admin::UpdateStorageRequest) -> admin::CommonResponse;
        list_storage(admin::ListStorageRequest) -> admin::ListStorageResponse;
        create_instance_group(admin::CreateInstanceGroupRequest) -> admin::CommonResponse;
        update_instance_group(admin::UpdateInstanceGroupRequest) -> admin::CommonResponse;
        remove_instance_group(admin::RemoveInstanceGroupRequest) -> admin::CommonResponse;
        get_instance_group(admin::GetInstanceGroupRequest) -> admin::GetInstanceGroupResponse;
        get_cache_meta(admin::GetCacheMetaRequest) -> admin::GetCacheMetaResponse;
        remove_cache(admin::RemoveCacheRequest) -> admin::CommonResponse;
        register_instance(admin::RegisterInstanceRequest) -> admin::CommonResponse;
        remove_instance(admin::RemoveInstanceRequest) -> admin::CommonResponse;
        get_instance_info(admin::GetInstanceInfoRequest) -> admin::GetInstanceInfoResponse;
        list_instance_info(admin::ListInstanceInfoRequest) -> admin::ListInstanceInfoResponse;
        add_account(admin::AddAccountRequest) -> admin::CommonResponse;
        delete_account(admin::DeleteAccountRequest) -> admin::CommonResponse;
        list_account(admin::ListAccountRequest) -> admin::ListAccountResponse;
        gen_config_snapshot(admin::GenConfigSnapshotRequest) -> admin::ConfigSnapShotResponse;
        load_config_snapshot(admin::LoadConfigSnapshotRequest) -> admin::CommonResponse;
        get_metrics(admin::GetMetricsRequest) -> admin::GetMetricsResponse;
        check_health(admin::CheckHealthRequest) -> admin::CheckHealthResponse;
        get_manager_cluster_info(admin::GetManagerClusterInfoRequest) -> admin::GetManagerClusterInfoResponse;
        leader_demote(admin::LeaderDemoteRequest) -> admin::CommonResponse;
        get_leader_elector_config(admin::GetLeaderElectorConfigRequest) -> admin::GetLeaderElectorConfigResponse;
        update_leader_elector_config(admin::UpdateLeaderElectorConfigRequest) -> admin::CommonResponse;
        update_logger(admin::UpdateLoggerRequest) -> admin::CommonResponse;
);

grpc_service!(DebugService for DebugHandler,
        inject_fault(debug::InjectFaultRequest) -> debug::CommonResponse;
        remove_fault(debug::RemoveFaultRequest) -> debug::CommonResponse;
        clear_faults(debug::ClearFaultsRequest) -> debug::CommonResponse;
);
