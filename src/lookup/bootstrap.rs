//! The bootstrap: `POST /kvcm/v1/lookupBootstrap` on the meta HTTP port, body
//! `{"instance_id":"..."}`, answers where the instance's table is and how to connect
//! (kvcm's own namespace: nothing of the reference's API changes). Errors answer a non-200
//! status with `{"error":"..."}`: 404 unknown instance, 403 refused, 400 bad body, 408 /
//! 413 a body slower or larger than the listener's limits, 503 the table cannot be
//! published or too many tokens wait (clients then use gRPC). The answer's `qp_token`
//! opens one queue pair of that instance (`grants`).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use serde::{Deserialize, Serialize};

use super::grants::{token_hex, Grant};
use super::{wire_name, AccessCheck, LookupError, LookupService};
use crate::service::core::lookup_keys_allowed;
use crate::service::http::{
    own_answer, own_refusal, read_body, ClientAddr, ClientCertificate, HttpLimits,
};

/// The route.
pub const ROUTE: &str = "/kvcm/v1/lookupBootstrap";

/// The request body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BootstrapRequest {
    /// The instance whose table is asked for.
    pub instance_id: String,
}

/// One wire a table can be read over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireAnswer {
    /// "soft-tcp", "soft-shm" or "verbs".
    pub name: String,
    /// Index of the wire in the header's rkeys.
    pub wire: usize,
    /// The header's rkey on this wire.
    pub header_rkey: u32,
}

/// The answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootstrapAnswer {
    /// The table format version the server writes.
    pub format_version: u32,
    /// The server process's incarnation id (the header must show the same).
    pub server_incarnation: u64,
    /// The instance.
    pub instance_id: String,
    /// Where to connect a queue pair (see the peers listener).
    pub connect: String,
    /// The header's address.
    pub header_addr: u64,
    /// The instance's spec layout version.
    pub layout_version: u32,
    /// The wires served.
    pub wires: Vec<WireAnswer>,
    /// The single-use token the queue-pair hello must carry (32 hex digits; valid for
    /// `grants::TOKEN_TTL`), binding the queue pair to this instance.
    pub qp_token: String,
    /// The most keys a lookup of this instance may have: the server refuses one over
    /// `kvcm.service.max_keys_per_request`, or over fewer keys where its answer's estimated
    /// size passes `kvcm.service.max_response_bytes`, so the fast path sends a larger one
    /// there rather than answer it (absent from servers before it was added: no limit
    /// known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_keys_per_request: Option<u64>,
}

impl LookupService {
    /// Where `check.instance_id`'s table is, after the access check; builds the table on
    /// first use.
    pub fn bootstrap(&self, check: &AccessCheck<'_>) -> Result<BootstrapAnswer, LookupError> {
        (self.access)(check).map_err(LookupError::Refused)?;
        let leading = || {
            self.manager
                .upgrade()
                .is_some_and(|m| m.leadership().is_leader())
        };
        if !leading() {
            return Err(LookupError::NotLeader);
        }
        let (table, instance) = self.table_for(check.instance_id)?;
        // A demotion while the table was built retired the others, not this one.
        if !leading() {
            self.drop_this_table(check.instance_id, &table, &LookupError::NotLeader);
            return Err(LookupError::NotLeader);
        }
        let keys_allowed = lookup_keys_allowed(&self.request_limits, &instance);
        let token = self.grants.issue(Grant::of(check))?;
        let address = table.address();
        Ok(BootstrapAnswer {
            format_version: kvcm_lookup::header::FORMAT_VERSION,
            server_incarnation: self.incarnation,
            instance_id: check.instance_id.to_string(),
            connect: self.connect_addr().to_string(),
            header_addr: address.addr,
            layout_version: address.layout_version,
            wires: address
                .rkeys
                .iter()
                .map(|&(wire, header_rkey)| WireAnswer {
                    name: wire_name(wire).to_string(),
                    wire,
                    header_rkey,
                })
                .collect(),
            qp_token: token_hex(&token),
            max_keys_per_request: Some(keys_allowed as u64),
        })
    }
}

/// The bootstrap route, to merge into the meta HTTP router; bodies are read within
/// `limits`.
pub fn router(service: Arc<LookupService>, limits: HttpLimits) -> Router {
    Router::new()
        .route(ROUTE, post(answer))
        .with_state((service, limits))
}

async fn answer(
    State((service, limits)): State<(Arc<LookupService>, HttpLimits)>,
    request: Request,
) -> Response {
    let authorization = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let peer = request.extensions().get::<ClientAddr>().map(|addr| addr.0);
    let certificate = request.extensions().get::<ClientCertificate>().cloned();
    let body = match read_body(request.into_body(), limits).await {
        Ok(body) => body,
        Err(status) => return own_refusal(status, "the body is too large or too slow"),
    };
    let Ok(request) = serde_json::from_slice::<BootstrapRequest>(&body) else {
        return own_refusal(
            StatusCode::BAD_REQUEST,
            "body must be {\"instance_id\":\"...\"}",
        );
    };
    let task = tokio::task::spawn_blocking(move || {
        let check = AccessCheck {
            instance_id: &request.instance_id,
            peer,
            authorization: authorization.as_deref(),
            certificate: certificate.as_ref().map(|c| c.0.as_ref()),
        };
        service.bootstrap(&check)
    });
    match task.await {
        Ok(Ok(answer)) => own_answer(StatusCode::OK, &answer),
        Ok(Err(error)) => {
            let status = match error {
                LookupError::UnknownInstance(_) => StatusCode::NOT_FOUND,
                LookupError::Refused(_) => StatusCode::FORBIDDEN,
                _ => StatusCode::SERVICE_UNAVAILABLE,
            };
            own_refusal(status, &error.to_string())
        }
        Err(_) => own_refusal(StatusCode::INTERNAL_SERVER_ERROR, "bootstrap failed"),
    }
}
