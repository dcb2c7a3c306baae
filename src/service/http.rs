//! The HTTP edge: `POST /api/<lowerCamelRpc>` with protobuf-JSON bodies (wire fact sheet
//! §2.2, §7). Application errors answer 200 with the status in the header; a body that is
//! not a JSON object of the request's shape answers 400 `{}`; a body over the configured
//! limit answers 413 `{}`, one that takes longer than the configured deadline 408 `{}`. The
//! admin router also serves Prometheus text at `GET /metrics` and the leader health probe
//! `GET /api/healthy`.
//! Every request of an RPC route gets its access-log line, refusals included.
//! Decoding judges no enum number: a body becomes the message the same gRPC request carries
//! (see [`crate::proto::json`]), so the handlers answer both transports alike.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::admin::AdminHandler;
use super::auth::{authorize, Caller, CertIdentity, Scoped};
use super::core::{served_since, Core};
use super::debug::DebugHandler;
use super::meta::MetaHandler;
use super::reply::Reply;
use super::rpcs::{self, Mode, Rpc};
use crate::access_log::{AccessLine, AccessSink, Transport};
use crate::proto::admin;
use crate::proto::json::{self, JsonBody};

/// Body of every non-200 answer.
const EMPTY_OBJECT: &str = "{}";

/// What one HTTP request body may be: its size and the time it may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// `kvcm.service.http_max_body_bytes`: a larger body is answered 413 `{}`.
    pub max_body_bytes: usize,
    /// `kvcm.service.body_timeout_ms`: a body not complete within it is answered 408 `{}`.
    pub body_timeout: Duration,
}

/// The peer of an HTTP connection, set on each of its requests by the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub SocketAddr);

/// What a connection's verified client certificate names (mutual TLS), set on each of its
/// requests by the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCertificate(pub Arc<CertIdentity>);

/// What a connection shows of its peer: the connect info of every kvcm listener's
/// connections, which gRPC requests carry in their extensions.
#[derive(Debug, Clone, Default)]
pub struct Peer {
    /// The peer's address, when known.
    pub addr: Option<SocketAddr>,
    /// What its client certificate names (mutual TLS only).
    pub certificate: Option<Arc<CertIdentity>>,
}

impl Peer {
    /// The peer of a gRPC request (an empty one where the request has none).
    pub fn of<T>(request: &tonic::Request<T>) -> Peer {
        request
            .extensions()
            .get::<Peer>()
            .cloned()
            .unwrap_or_default()
    }
}

/// Serves one request of `rpc`: the answer, and its access-log line.
async fn json_rpc<Req, Resp>(
    request: Request,
    rpc: &'static Rpc,
    limits: HttpLimits,
    access: &AccessSink,
    call: impl FnOnce(Req) -> Resp + Send + 'static,
) -> Response
where
    Req: DeserializeOwned + Scoped + Send + 'static,
    Resp: Reply + JsonBody + Send + 'static,
{
    let started = Instant::now();
    let client = request.extensions().get::<ClientAddr>().map(|addr| addr.0);
    let caller = request.extensions().get::<Caller>().cloned();
    let mut line = access.begin(rpc, Transport::Http, client);
    if let Some(line) = line.as_mut() {
        line.set_caller(caller.as_ref().map(|caller| caller.name.clone()));
    }
    let log_to = line.as_mut().map(|line| (line, access));
    let body = request.into_body();
    let gate = Gate { rpc, caller };
    let answer = answer(body, gate.clone(), limits, log_to, started, call).await;
    if let Some(reason) = &answer.forbidden {
        let name = gate
            .caller
            .as_ref()
            .map_or("", |caller| caller.name.as_str());
        access.forbidden(rpc, Transport::Http, client, name, reason);
        return forbidden(reason);
    }
    if let Some(mut line) = line {
        line.response_json(access, &answer.body);
        let status = answer
            .reply_status
            .as_ref()
            .map(|(code, id)| (*code, id.as_str()));
        line.finish(
            access,
            answer.trace_id,
            status,
            Some(answer.status.as_u16()),
        );
    }
    json_answer(answer.status, answer.body)
}

/// The RPC of a request and its caller, for the authorization after decoding.
#[derive(Clone)]
struct Gate {
    rpc: &'static Rpc,
    caller: Option<Caller>,
}

/// What one HTTP request was answered.
struct Answer {
    status: StatusCode,
    body: Vec<u8>,
    /// The trace id the handlers saw (access log on, a handler ran).
    trace_id: Option<String>,
    /// The answer header's code and request id (a handler ran).
    reply_status: Option<(i32, String)>,
    /// Why the caller may not make this call (answered 403; no handler ran).
    forbidden: Option<String>,
}

impl Answer {
    /// An answer no handler gave: `{}` with `status`.
    fn refused(status: StatusCode) -> Answer {
        Answer {
            status,
            body: EMPTY_OBJECT.into(),
            trace_id: None,
            reply_status: None,
            forbidden: None,
        }
    }
}

/// The answer to a caller whose credential may not make the call.
fn forbidden(reason: &str) -> Response {
    let body = serde_json::json!({"error": "forbidden", "message": reason});
    json_answer(StatusCode::FORBIDDEN, body.to_string().into_bytes())
}

/// Reads, decodes, calls (as `mode` says), encodes.
async fn answer<Req, Resp>(
    body: Body,
    gate: Gate,
    limits: HttpLimits,
    line: Option<(&mut AccessLine, &AccessSink)>,
    started: Instant,
    call: impl FnOnce(Req) -> Resp + Send + 'static,
) -> Answer
where
    Req: DeserializeOwned + Scoped + Send + 'static,
    Resp: Reply + JsonBody + Send + 'static,
{
    let logged = line.is_some();
    let bytes = match read_body(body, limits).await {
        Ok(bytes) => bytes,
        Err(status) => return Answer::refused(status),
    };
    if let Some((line, access)) = line {
        line.request_json(access, &bytes);
    }
    let mode = gate.rpc.mode.for_request(bytes.len());
    let work = move || process(&bytes, &gate, logged, started, call);
    match mode {
        Mode::Inline => work(),
        Mode::Blocking => tokio::task::spawn_blocking(work)
            .await
            .unwrap_or_else(|_| Answer::refused(StatusCode::INTERNAL_SERVER_ERROR)),
    }
}

/// Decodes, calls, encodes (on a blocking thread for a blocking mode: the JSON of a large
/// request and of its answer is work too).
fn process<Req, Resp>(
    bytes: &[u8],
    gate: &Gate,
    logged: bool,
    started: Instant,
    call: impl FnOnce(Req) -> Resp,
) -> Answer
where
    Req: DeserializeOwned + Scoped,
    Resp: Reply + JsonBody,
{
    let Ok(request) = json::decode::<Req>(bytes) else {
        return Answer::refused(StatusCode::BAD_REQUEST);
    };
    let scope = request.instance_id();
    if let Err(reason) = authorize(gate.caller.as_ref(), gate.rpc.access, scope) {
        return Answer {
            forbidden: Some(reason),
            ..Answer::refused(StatusCode::FORBIDDEN)
        };
    }
    let (reply, trace_id) = served_since(started, || call(request));
    let reply_status = reply
        .status()
        .filter(|_| logged)
        .map(|(code, id)| (code, id.to_string()));
    let (status, body) = match reply.to_json() {
        Ok(text) => (StatusCode::OK, text),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, EMPTY_OBJECT.into()),
    };
    Answer {
        status,
        body,
        trace_id,
        reply_status,
        forbidden: None,
    }
}

/// Reads a request body within `limits`: `Err(413)` beyond its size, `Err(408)` when it is
/// not complete within its deadline. Every POST route of kvcm's listeners reads through it.
pub async fn read_body(body: Body, limits: HttpLimits) -> Result<Bytes, StatusCode> {
    let read = axum::body::to_bytes(body, limits.max_body_bytes);
    match tokio::time::timeout(limits.body_timeout, read).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(_)) => Err(StatusCode::PAYLOAD_TOO_LARGE),
        Err(_) => Err(StatusCode::REQUEST_TIMEOUT),
    }
}

/// The answer of kvcm's own routes (lookup bootstrap, pool membership): `body` as JSON.
pub fn own_answer(status: StatusCode, body: &impl Serialize) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    json_answer(status, bytes)
}

/// A refusal of kvcm's own routes: `{"error": message}`.
pub fn own_refusal(status: StatusCode, message: &str) -> Response {
    own_answer(status, &serde_json::json!({ "error": message }))
}

fn json_answer(status: StatusCode, body: Vec<u8>) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Adds the `POST` route of `rpc`, served by its handler method `call`.
pub(super) fn route<Req, Resp>(
    router: Router,
    rpc: &'static Rpc,
    limits: HttpLimits,
    access: AccessSink,
    call: impl Fn(Req) -> Resp + Clone + Send + Sync + 'static,
) -> Router
where
    Req: DeserializeOwned + Scoped + Send + 'static,
    Resp: Reply + JsonBody + Send + 'static,
{
    router.route(
        rpc.route,
        post(move |request: Request| {
            let (call, access) = (call.clone(), access.clone());
            async move { json_rpc(request, rpc, limits, &access, call).await }
        }),
    )
}

/// The meta HTTP router.
pub fn meta_router(handler: MetaHandler, limits: HttpLimits) -> Router {
    rpcs::meta_router(handler, limits)
}

/// Body of `GET /api/healthy` on a healthy leader.
const HEALTHY: &str = r#"{"status":"OK"}"#;

/// The admin HTTP router, plus `GET /api/healthy` and, when `prometheus_prefix` is given
/// (`kvcm.metrics.enable_prometheus`), `GET /metrics` with metric names of that prefix.
pub fn admin_router(
    handler: AdminHandler,
    core: Arc<Core>,
    limits: HttpLimits,
    prometheus_prefix: Option<&str>,
) -> Router {
    let router = rpcs::admin_routes(handler.clone(), limits);
    let router = router.route("/api/healthy", get(move || healthy(handler.clone())));
    let curves = core.clone();
    let router = router.route(
        CAPACITY_CURVE_ROUTE,
        get(move |uri: axum::http::Uri| async move { capacity_curve(&curves, &uri) }),
    );
    let Some(prefix) = prometheus_prefix else {
        return router;
    };
    let prefix: Arc<str> = prefix.into();
    router.route(
        "/metrics",
        get(move || async move {
            let text = core.metrics.to_prometheus(&prefix)
                + &core.events.to_prometheus(&prefix)
                + &core.access.to_prometheus(&prefix)
                + &super::journal_metrics::to_prometheus(&core.manager, &prefix)
                + &super::capacity_metrics::to_prometheus(&core.manager, &core.curves, &prefix)
                + &super::lookup_metrics::to_prometheus(&core, &prefix);
            ([(header::CONTENT_TYPE, PROMETHEUS_TEXT)], text)
        }),
    )
}

/// The live capacity curve of one instance (kvcm's own route, docs/capacity.md).
pub const CAPACITY_CURVE_ROUTE: &str = "/kvcm/capacity_curve";

/// Points answered when the query does not say.
const DEFAULT_CURVE_POINTS: usize = 33;

/// `GET /kvcm/capacity_curve?instance_id=<id>[&points=<n>]`: 200 with the curve's JSON; 400
/// naming a missing or bad parameter; 404 for an unregistered instance or when
/// `kvcm.capacity_curve.window_accesses` is 0.
fn capacity_curve(core: &Core, uri: &axum::http::Uri) -> Response {
    let refuse = |status: StatusCode, error: String| {
        let body = serde_json::json!({ "error": error }).to_string();
        json_answer(status, body.into_bytes())
    };
    let mut instance_id = None;
    let mut points = DEFAULT_CURVE_POINTS;
    for pair in uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "instance_id" => instance_id = Some(value.to_string()),
            "points" => match value.parse::<usize>() {
                Ok(n) if (2..=crate::curves::MAX_POINTS).contains(&n) => points = n,
                _ => {
                    let why = format!(
                        "points {value:?} is not in 2..={}",
                        crate::curves::MAX_POINTS
                    );
                    return refuse(StatusCode::BAD_REQUEST, why);
                }
            },
            other => {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    format!("unknown parameter {other:?}"),
                )
            }
        }
    }
    let Some(instance_id) = instance_id.filter(|id| !id.is_empty()) else {
        return refuse(StatusCode::BAD_REQUEST, "instance_id is missing".into());
    };
    let Some(instance) = core.manager.instance(&instance_id) else {
        let why = format!("instance {instance_id:?} is not registered");
        return refuse(StatusCode::NOT_FOUND, why);
    };
    let Some(curve) = core.curves.curve(&instance_id) else {
        let why = "kvcm.capacity_curve.window_accesses is 0: no curves are kept".to_string();
        return refuse(StatusCode::NOT_FOUND, why);
    };
    let block_bytes = instance
        .specs()
        .iter()
        .map(|spec| spec.size.max(0) as u64)
        .sum();
    let body = curve.to_json(&instance_id, points, block_bytes);
    json_answer(StatusCode::OK, body.into_bytes())
}

/// Content type of the Prometheus text exposition (upstream trunk, wire delta §8).
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `GET /api/healthy` (upstream trunk): 200 `{"status":"OK"}` when CheckHealth says this
/// node is the leader and healthy (its journal has not failed), else 503 with the
/// CheckHealth answer. Served as a CheckHealth call (counted in its metrics).
async fn healthy(handler: AdminHandler) -> Response {
    let request = admin::CheckHealthRequest {
        trace_id: "healthy".into(),
    };
    let reply = handler.check_health(request);
    if reply.is_leader && reply.is_health {
        return json_answer(StatusCode::OK, HEALTHY.into());
    }
    match reply.to_json() {
        Ok(text) => json_answer(StatusCode::SERVICE_UNAVAILABLE, text),
        Err(_) => json_answer(StatusCode::INTERNAL_SERVER_ERROR, EMPTY_OBJECT.into()),
    }
}

/// The debug HTTP router.
pub fn debug_router(handler: DebugHandler, limits: HttpLimits) -> Router {
    rpcs::debug_router(handler, limits)
}
