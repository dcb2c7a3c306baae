//! The HTTP edge: `POST /api/<lowerCamelRpc>` with protobuf-JSON bodies (wire fact sheet
//! §2.2, §7). Application errors answer 200 with the status in the header; a body that is
//! not a JSON object of the request's shape answers 400 `{}`; a body over the configured
//! limit answers 413 `{}`. The admin router also serves Prometheus text at `GET /metrics`.
//! Decoding judges no enum number: a body becomes the message the same gRPC request carries
//! (see [`crate::proto::json`]), so the handlers answer both transports alike.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::{de::DeserializeOwned, Serialize};

use super::admin::AdminHandler;
use super::core::{served_since, Core};
use super::debug::DebugHandler;
use super::meta::MetaHandler;
use crate::proto::json;

/// Body of every non-200 answer.
const EMPTY_OBJECT: &str = "{}";

/// How a route runs its handler.
#[derive(Clone, Copy)]
enum Mode {
    /// On the runtime thread (short, memory-only work).
    Inline,
    /// On tokio's blocking pool (file-system work, whole-instance scans, opening backends).
    Blocking,
}

/// Reads, decodes, calls (as `mode` says), encodes.
async fn json_rpc<Req, Resp>(
    body: Body,
    limit: usize,
    mode: Mode,
    call: impl FnOnce(Req) -> Resp + Send + 'static,
) -> Response
where
    Req: DeserializeOwned + Send + 'static,
    Resp: Serialize + Send + 'static,
{
    let started = Instant::now();
    let Ok(bytes) = axum::body::to_bytes(body, limit).await else {
        return json_answer(StatusCode::PAYLOAD_TOO_LARGE, EMPTY_OBJECT.into());
    };
    let Ok(request) = json::decode::<Req>(&bytes) else {
        return json_answer(StatusCode::BAD_REQUEST, EMPTY_OBJECT.into());
    };
    let reply = match mode {
        Mode::Inline => served_since(started, || call(request)),
        Mode::Blocking => {
            let task = tokio::task::spawn_blocking(move || served_since(started, || call(request)));
            match task.await {
                Ok(reply) => reply,
                Err(_) => {
                    return json_answer(StatusCode::INTERNAL_SERVER_ERROR, EMPTY_OBJECT.into())
                }
            }
        }
    };
    match json::encode(&reply) {
        Ok(text) => json_answer(StatusCode::OK, text),
        Err(_) => json_answer(StatusCode::INTERNAL_SERVER_ERROR, EMPTY_OBJECT.into()),
    }
}

fn json_answer(status: StatusCode, body: Vec<u8>) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

macro_rules! routes {
    ($handler:expr, $limit:expr, $($path:literal => $mode:ident $method:ident,)*) => {{
        let mut router = Router::new();
        $(
            let handler = $handler.clone();
            router = router.route($path, post(move |body: Body| async move {
                let call = move |request| handler.$method(request);
                json_rpc(body, $limit, Mode::$mode, call).await
            }));
        )*
        router
    }};
}

/// The meta HTTP router.
pub fn meta_router(handler: MetaHandler, limit: usize) -> Router {
    routes!(handler, limit,
        "/api/registerInstance" => Inline register_instance,
        "/api/getInstanceInfo" => Inline get_instance_info,
        "/api/getCacheMeta" => Inline get_cache_meta,
        "/api/getCacheLocation" => Inline get_cache_location,
        "/api/startWriteCache" => Blocking start_write_cache,
        "/api/finishWriteCache" => Inline finish_write_cache,
        "/api/removeCache" => Inline remove_cache,
        "/api/trimCache" => Blocking trim_cache,
    )
}

/// The admin HTTP router, plus `GET /metrics`.
pub fn admin_router(handler: AdminHandler, core: Arc<Core>, limit: usize) -> Router {
    let router = routes!(handler, limit,
        "/api/addStorage" => Blocking add_storage,
        "/api/enableStorage" => Inline enable_storage,
        "/api/disableStorage" => Inline disable_storage,
        "/api/removeStorage" => Blocking remove_storage,
        "/api/updateStorage" => Blocking update_storage,
        "/api/listStorage" => Inline list_storage,
        "/api/createInstanceGroup" => Inline create_instance_group,
        "/api/updateInstanceGroup" => Inline update_instance_group,
        "/api/removeInstanceGroup" => Inline remove_instance_group,
        "/api/getInstanceGroup" => Inline get_instance_group,
        "/api/getCacheMeta" => Inline get_cache_meta,
        "/api/removeCache" => Inline remove_cache,
        "/api/registerInstance" => Inline register_instance,
        "/api/removeInstance" => Blocking remove_instance,
        "/api/getInstanceInfo" => Inline get_instance_info,
        "/api/listInstanceInfo" => Inline list_instance_info,
        "/api/addAccount" => Inline add_account,
        "/api/deleteAccount" => Inline delete_account,
        "/api/listAccount" => Inline list_account,
        "/api/genConfigSnapshot" => Inline gen_config_snapshot,
        "/api/loadConfigSnapshot" => Inline load_config_snapshot,
        "/api/getMetrics" => Inline get_metrics,
        "/api/checkHealth" => Inline check_health,
        "/api/getManagerClusterInfo" => Inline get_manager_cluster_info,
        "/api/leaderDemote" => Inline leader_demote,
        "/api/getLeaderElectorConfig" => Inline get_leader_elector_config,
        "/api/updateLeaderElectorConfig" => Inline update_leader_elector_config,
        "/api/updateLogger" => Inline update_logger,
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
        "/api/injectFault" => Inline inject_fault,
        "/api/removeFault" => Inline remove_fault,
        "/api/clearFaults" => Inline clear_faults,
    )
}
