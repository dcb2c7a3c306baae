//! The HTTP edge: `POST /api/<lowerCamelRpc>` with protobuf-JSON bodies (wire fact sheet
//! §2.2, §7). Application errors answer 200 with the status in the header; a body that is
//! not a JSON object of the request's shape answers 400 `{}`; a body over the configured
//! limit answers 413 `{}`. The admin router also serves Prometheus text at `GET /metrics`.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::{de::DeserializeOwned, Serialize};

use super::admin::AdminHandler;
use super::core::Core;
use super::debug::DebugHandler;
use super::meta::MetaHandler;
use crate::proto::json;

/// Body of every non-200 answer.
const EMPTY_OBJECT: &str = "{}";

/// Reads, decodes, calls, encodes.
async fn json_rpc<Req, Resp>(body: Body, limit: usize, call: impl FnOnce(Req) -> Resp) -> Response
where
    Req: DeserializeOwned,
    Resp: Serialize,
{
    let Ok(bytes) = axum::body::to_bytes(body, limit).await else {
        return json_answer(StatusCode::PAYLOAD_TOO_LARGE, EMPTY_OBJECT.into());
    };
    let Ok(request) = json::decode::<Req>(&bytes) else {
        return json_answer(StatusCode::BAD_REQUEST, EMPTY_OBJECT.into());
    };
    match json::encode(&call(request)) {
        Ok(text) => json_answer(StatusCode::OK, text),
        Err(_) => json_answer(StatusCode::INTERNAL_SERVER_ERROR, EMPTY_OBJECT.into()),
    }
}

fn json_answer(status: StatusCode, body: Vec<u8>) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

macro_rules! routes {
    ($handler:expr, $limit:expr, $($path:literal => $method:ident,)*) => {{
        let mut router = Router::new();
        $(
            let handler = $handler.clone();
            router = router.route($path, post(move |body: Body| async move {
                json_rpc(body, $limit, |request| handler.$method(request)).await
            }));
        )*
        router
    }};
}

/// The meta HTTP router.
pub fn meta_router(handler: MetaHandler, limit: usize) -> Router {
    routes!(handler, limit,
        "/api/registerInstance" => register_instance,
        "/api/getInstanceInfo" => get_instance_info,
        "/api/getCacheMeta" => get_cache_meta,
        "/api/getCacheLocation" => get_cache_location,
        "/api/startWriteCache" => start_write_cache,
        "/api/finishWriteCache" => finish_write_cache,
        "/api/removeCache" => remove_cache,
        "/api/trimCache" => trim_cache,
    )
}

/// The admin HTTP router, plus `GET /metrics`.
pub fn admin_router(handler: AdminHandler, core: Arc<Core>, limit: usize) -> Router {
    let router = routes!(handler, limit,
        "/api/addStorage" => add_storage,
        "/api/enableStorage" => enable_storage,
        "/api/disableStorage" => disable_storage,
        "/api/removeStorage" => remove_storage,
        "/api/updateStorage" => update_storage,
        "/api/listStorage" => list_storage,
        "/api/createInstanceGroup" => create_instance_group,
        "/api/updateInstanceGroup" => update_instance_group,
        "/api/removeInstanceGroup" => remove_instance_group,
        "/api/getInstanceGroup" => get_instance_group,
        "/api/getCacheMeta" => get_cache_meta,
        "/api/removeCache" => remove_cache,
        "/api/registerInstance" => register_instance,
        "/api/removeInstance" => remove_instance,
        "/api/getInstanceInfo" => get_instance_info,
        "/api/listInstanceInfo" => list_instance_info,
        "/api/addAccount" => add_account,
        "/api/deleteAccount" => delete_account,
        "/api/listAccount" => list_account,
        "/api/genConfigSnapshot" => gen_config_snapshot,
        "/api/loadConfigSnapshot" => load_config_snapshot,
        "/api/getMetrics" => get_metrics,
        "/api/checkHealth" => check_health,
        "/api/getManagerClusterInfo" => get_manager_cluster_info,
        "/api/leaderDemote" => leader_demote,
        "/api/getLeaderElectorConfig" => get_leader_elector_config,
        "/api/updateLeaderElectorConfig" => update_leader_elector_config,
        "/api/updateLogger" => update_logger,
    );
    router.route(
        "/metrics",
        get(move || async move {
            let text = core.metrics.to_prometheus() + &core.events.to_prometheus();
            ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
        }),
    )
}

/// The debug HTTP router.
pub fn debug_router(handler: DebugHandler, limit: usize) -> Router {
    routes!(handler, limit,
        "/api/injectFault" => inject_fault,
        "/api/removeFault" => remove_fault,
        "/api/clearFaults" => clear_faults,
    )
}
