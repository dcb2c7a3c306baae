//! Every HTTP JSON route as a client's bytes reach it: the first byte picks the route, the
//! rest is its body, posted on the router of its listener — the RPCs of meta, admin and
//! debug HTTP, and (first byte ≥ 0xF0) the memory-pool membership routes of meta HTTP. An
//! RPC answers 200 with a JSON object, 400 `{}` (not the request's JSON shape) or 413 `{}`
//! (over the body limit); a membership route 200, 400 or 404 with a JSON object. Never a
//! 5xx, never a body that is not JSON.
#![no_main]

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use kvcm::pool::routes::{HEARTBEAT_ROUTE, JOIN_ROUTE, NODES_ROUTE};
use kvcm::service::http::{admin_router, debug_router, meta_router};
use kvcm::service::rpcs::Service;
use kvcm_fuzz::{harness, split};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use tower::ServiceExt;

/// The routers: meta, admin and debug RPCs, pool membership.
fn routers() -> &'static [Router; 4] {
    static ROUTERS: OnceLock<[Router; 4]> = OnceLock::new();
    ROUTERS.get_or_init(|| {
        let harness = harness();
        let (handlers, limits) = (&harness.handlers, harness.http_limits);
        let manager = handlers.core.manager.clone();
        [
            meta_router(handlers.meta.clone(), limits),
            admin_router(handlers.admin.clone(), handlers.core.clone(), limits, None),
            debug_router(handlers.debug.clone(), limits),
            kvcm::pool::routes::router(
                kvcm::pool::Registrar::new(
                    manager,
                    kvcm::service::auth::Authenticator::new(&[]),
                    kvcm::pool::ticket::ServerSecret::random().expect("a server secret"),
                ),
                limits,
            ),
        ]
    })
}

/// The route, its router, whether it is an RPC, and the body.
fn route(input: &[u8]) -> Option<(&'static str, &'static Router, bool, &[u8])> {
    let routers = routers();
    if let Some((&first, body)) = input.split_first().filter(|(&b, _)| b >= 0xF0) {
        let pool = [JOIN_ROUTE, HEARTBEAT_ROUTE, NODES_ROUTE][usize::from(first) % 3];
        return Some((pool, &routers[3], false, body));
    }
    let (rpc, body) = split(input)?;
    let router = match rpc.service {
        Service::Meta => &routers[0],
        Service::Admin => &routers[1],
        Service::Debug => &routers[2],
    };
    Some((rpc.route, router, true, body))
}

fuzz_target!(|input: &[u8]| {
    let Some((path, router, rpc, body)) = route(input) else {
        return;
    };
    let request = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_vec()))
        .expect("a well-formed request");
    let (status, text) = harness().runtime.block_on(async {
        let answer = router
            .clone()
            .oneshot(request)
            .await
            .unwrap_or_else(|never| match never {});
        let status = answer.status();
        let bytes = answer.into_body().collect().await.expect("a complete body");
        (status, bytes.to_bytes())
    });
    let json: Result<serde_json::Value, _> = serde_json::from_slice(&text);
    let json =
        json.unwrap_or_else(|e| panic!("{path}: {status} with a body that is not JSON: {e}"));
    assert!(json.is_object(), "{path}: {status} with {json}");
    match status {
        StatusCode::OK => {}
        StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE if rpc => {
            assert_eq!(&text[..], b"{}", "{path}: {status}")
        }
        StatusCode::BAD_REQUEST | StatusCode::NOT_FOUND if !rpc => {}
        other => panic!("{path}: answered {other}: {json}"),
    }
});
