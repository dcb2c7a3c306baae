//! Admin bearer tokens (upstream trunk, wire delta §1): with `kvcm.service.admin_auth_token`
//! set, every admin and debug HTTP request — `/metrics` and `/api/healthy` included — must
//! carry `Authorization: Bearer <token>` naming one of the configured tokens, else it is
//! answered 401 `{"error":"unauthorized"}` with `WWW-Authenticate: Bearer realm="kvcm"`
//! (plus `error="invalid_request"` for a malformed or non-Bearer header, `error="invalid_token"`
//! for an unknown token). With `kvcm.service.admin_auth_grpc` the same check guards Admin
//! and Debug gRPC, the token read from the `authorization` metadata (our extension).
//!
//! Invariants: the scheme is case-insensitive and followed by at least one SP or HTAB; the
//! token has no white space inside; a presented token is compared with every configured
//! one in time independent of where they differ; no token is ever logged or echoed.

use std::sync::{Arc, RwLock};

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;

use super::http::ClientAddr;
use super::rpcs::Service;
use crate::access_log::{AccessSink, Transport};

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `Authorization` header (or metadata).
    #[error("an admin bearer token is required")]
    Missing,
    /// Not `Bearer <token>`.
    #[error("the authorization is not of the form \"Bearer <token>\"")]
    Malformed,
    /// A well-formed token that is not configured.
    #[error("the admin bearer token is not valid")]
    UnknownToken,
}

impl AuthError {
    /// The `WWW-Authenticate` challenge of this refusal.
    pub fn challenge(self) -> &'static str {
        match self {
            AuthError::Missing => r#"Bearer realm="kvcm""#,
            AuthError::Malformed => r#"Bearer realm="kvcm", error="invalid_request""#,
            AuthError::UnknownToken => r#"Bearer realm="kvcm", error="invalid_token""#,
        }
    }
}

/// Body of every 401.
const UNAUTHORIZED: &str = r#"{"error":"unauthorized"}"#;

/// The admin tokens in force (empty = open), shared by the HTTP middleware, the gRPC gate
/// and the token RPCs; replaced at run time by SetAdminAuthTokens / RotateAdminAuthToken.
#[derive(Clone, Default)]
pub struct AdminAuth {
    tokens: Arc<RwLock<Tokens>>,
}

/// One immutable set of tokens (swapped whole, so a check never sees half a change).
type Tokens = Arc<[Box<[u8]>]>;

impl std::fmt::Debug for AdminAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AdminAuth({} tokens)", self.current().len())
    }
}

/// Why a token change was refused (nothing changed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenChangeError {
    /// RotateAdminAuthToken without a new token.
    #[error("new_token is empty")]
    EmptyNewToken,
    /// RotateAdminAuthToken naming an old token that is not configured.
    #[error("old_token is not a configured token")]
    UnknownOldToken,
}

impl AdminAuth {
    /// Guards with these tokens (none = open).
    pub fn new(tokens: &[String]) -> AdminAuth {
        let auth = AdminAuth::default();
        auth.replace(tokens.iter().cloned());
        auth
    }

    fn current(&self) -> Tokens {
        self.tokens
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces every token (each trimmed, empties dropped; none = open mode).
    pub fn replace(&self, tokens: impl IntoIterator<Item = String>) {
        let tokens: Tokens = tokens
            .into_iter()
            .filter(|token| !token.trim().is_empty())
            .map(|token| token.trim().as_bytes().into())
            .collect();
        *self.tokens.write().unwrap_or_else(|p| p.into_inner()) = tokens;
    }

    /// Adds `new` (unless present) and then removes `old` when given; an unknown `old` or an
    /// empty `new` changes nothing.
    pub fn rotate(&self, old: &str, new: &str) -> Result<(), TokenChangeError> {
        let (old, new) = (old.trim().as_bytes(), new.trim().as_bytes());
        if new.is_empty() {
            return Err(TokenChangeError::EmptyNewToken);
        }
        let mut tokens = self.tokens.write().unwrap_or_else(|p| p.into_inner());
        if !old.is_empty() && !tokens.iter().any(|t| constant_time_eq(t, old)) {
            return Err(TokenChangeError::UnknownOldToken);
        }
        let mut next: Vec<Box<[u8]>> = tokens.to_vec();
        if !next.iter().any(|t| constant_time_eq(t, new)) {
            next.push(new.into());
        }
        if !old.is_empty() && old != new {
            next.retain(|t| !constant_time_eq(t, old));
        }
        *tokens = next.into();
        Ok(())
    }

    /// One fingerprint per token, in order: 8 lower-case hex digits of its 32-bit FNV-1a.
    pub fn fingerprints(&self) -> Vec<String> {
        self.current().iter().map(|t| fingerprint(t)).collect()
    }

    /// Checks one `Authorization` value (`None`: absent): the caller the matching token
    /// names (`None` while no token is set, and everything passes).
    pub fn check(&self, authorization: Option<&[u8]>) -> Result<Option<Caller>, AuthError> {
        let tokens = self.current();
        if tokens.is_empty() {
            return Ok(None);
        }
        let presented = bearer_token(authorization.ok_or(AuthError::Missing)?)?;
        // Every configured token is compared, whichever matches.
        let matches = tokens.iter().fold(false, |found, token| {
            constant_time_eq(token, presented) | found
        });
        if !matches {
            return Err(AuthError::UnknownToken);
        }
        Ok(Some(Caller(fingerprint(presented))))
    }

    /// `router` of `service` behind the check (which passes everything while no token is
    /// set); refusals are logged to `access`.
    pub fn protect(&self, router: Router, service: Service, access: AccessSink) -> Router {
        let guard = HttpGuard {
            auth: self.clone(),
            service,
            access,
        };
        router.layer(axum::middleware::from_fn_with_state(guard, require_bearer))
    }
}

/// Who an admin or debug call came from: the fingerprint of the token it presented (the
/// access and audit logs' `caller`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller(pub String);

/// 8 lower-case hex digits of a token's 32-bit FNV-1a.
fn fingerprint(token: &[u8]) -> String {
    format!("{:08x}", fnv1a(token))
}

/// The state of the HTTP middleware.
#[derive(Clone)]
struct HttpGuard {
    auth: AdminAuth,
    service: Service,
    access: AccessSink,
}

/// 32-bit FNV-1a.
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |hash, &b| {
        (hash ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// The token of `Bearer <token>`.
fn bearer_token(value: &[u8]) -> Result<&[u8], AuthError> {
    const SCHEME: &[u8] = b"bearer";
    let blank = |b: &u8| *b == b' ' || *b == b'\t';
    let (scheme, rest) = value
        .split_at_checked(SCHEME.len())
        .ok_or(AuthError::Malformed)?;
    if !scheme.eq_ignore_ascii_case(SCHEME) || !rest.first().is_some_and(blank) {
        return Err(AuthError::Malformed);
    }
    let start = rest
        .iter()
        .position(|b| !blank(b))
        .ok_or(AuthError::Malformed)?;
    let token = &rest[start..];
    let visible = |b: &u8| b.is_ascii_graphic();
    if !token.iter().all(visible) {
        return Err(AuthError::Malformed);
    }
    Ok(token)
}

/// Equality whose time depends on the lengths only, not on where the bytes differ.
fn constant_time_eq(expected: &[u8], presented: &[u8]) -> bool {
    let longest = expected.len().max(presented.len());
    let byte = |bytes: &[u8], i: usize| bytes.get(i).copied().unwrap_or(0);
    let difference = (0..longest).fold(expected.len() ^ presented.len(), |acc, i| {
        acc | usize::from(byte(expected, i) ^ byte(presented, i))
    });
    std::hint::black_box(difference) == 0
}

/// The HTTP middleware: passes an authorised request on (with its [`Caller`]), answers the
/// others 401 and logs them.
async fn require_bearer(
    State(guard): State<HttpGuard>,
    mut request: Request,
    next: Next,
) -> Response {
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes);
    match guard.auth.check(authorization) {
        Ok(caller) => {
            if let Some(caller) = caller {
                request.extensions_mut().insert(caller);
            }
            next.run(request).await
        }
        Err(refusal) => {
            let client = request.extensions().get::<ClientAddr>().map(|addr| addr.0);
            let path = request.uri().path();
            let reason = refusal.to_string();
            let access = &guard.access;
            access.unauthorized(guard.service, path, Transport::Http, client, &reason);
            unauthorized(refusal)
        }
    }
}

fn unauthorized(refusal: AuthError) -> Response {
    let headers = [
        (header::CONTENT_TYPE, "application/json"),
        (header::WWW_AUTHENTICATE, refusal.challenge()),
    ];
    (StatusCode::UNAUTHORIZED, headers, UNAUTHORIZED).into_response()
}

/// The gRPC gate of the Admin or Debug service: open unless `kvcm.service.admin_auth_grpc`
/// is on and a token is in force; refusals are UNAUTHENTICATED and logged (the interceptor
/// does not see the method: the line names the service, `AdminService` / `DebugService`).
#[derive(Debug, Clone)]
pub struct GrpcGate {
    auth: Option<AdminAuth>,
    service: Service,
    access: AccessSink,
}

impl GrpcGate {
    /// Enforces `auth` on `service` when `enforce` is set; refusals are logged to `access`.
    pub fn new(auth: &AdminAuth, enforce: bool, service: Service, access: AccessSink) -> GrpcGate {
        GrpcGate {
            auth: enforce.then(|| auth.clone()),
            service,
            access,
        }
    }
}

impl tonic::service::Interceptor for GrpcGate {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        let Some(auth) = &self.auth else {
            return Ok(request);
        };
        let authorization = request
            .metadata()
            .get("authorization")
            .map(|v| v.as_bytes());
        match auth.check(authorization) {
            Ok(caller) => {
                if let Some(caller) = caller {
                    request.extensions_mut().insert(caller);
                }
                Ok(request)
            }
            Err(refusal) => {
                let reason = refusal.to_string();
                let name = match self.service {
                    Service::Debug => "DebugService",
                    Service::Admin | Service::Meta => "AdminService",
                };
                let (client, access) = (request.remote_addr(), &self.access);
                access.unauthorized(self.service, name, Transport::Grpc, client, &reason);
                Err(tonic::Status::unauthenticated(reason))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth() -> AdminAuth {
        AdminAuth::new(&["s3cret".into(), "other-token".into()])
    }

    #[test]
    fn bearer_tokens_are_parsed_as_the_trunk_says() {
        let auth = auth();
        let caller = |token: &[u8]| Ok(Some(Caller(fingerprint(token))));
        for (good, token) in [
            ("Bearer s3cret", "s3cret"),
            ("bearer other-token", "other-token"),
            ("BEARER \t s3cret", "s3cret"),
        ] {
            let outcome = auth.check(Some(good.as_bytes()));
            assert_eq!(outcome, caller(token.as_bytes()), "{good}");
        }
        assert_eq!(auth.check(None), Err(AuthError::Missing));
        for malformed in [
            "Basic s3cret",
            "Bearer",
            "Bearer ",
            "Bearers3cret",
            "Bearer s3 cret",
        ] {
            let outcome = auth.check(Some(malformed.as_bytes()));
            assert_eq!(outcome, Err(AuthError::Malformed), "{malformed:?}");
        }
        for unknown in ["Bearer s3cre", "Bearer s3cret2", "Bearer S3CRET"] {
            let outcome = auth.check(Some(unknown.as_bytes()));
            assert_eq!(outcome, Err(AuthError::UnknownToken), "{unknown:?}");
        }
        assert_eq!(AdminAuth::new(&[]).check(None), Ok(None), "open mode");
    }

    #[test]
    fn tokens_are_replaced_rotated_and_fingerprinted() {
        let auth = AdminAuth::new(&[]);
        assert_eq!(auth.check(None), Ok(None), "open without tokens");
        auth.replace(["a".to_string(), " ".to_string(), "b".to_string()]);
        assert_eq!(
            auth.fingerprints(),
            [
                format!("{:08x}", fnv1a(b"a")),
                format!("{:08x}", fnv1a(b"b"))
            ]
        );
        // FNV-1a 32 of "a" is 0xe40c292c.
        assert_eq!(auth.fingerprints()[0], "e40c292c");
        assert_eq!(
            auth.rotate("nope", "c"),
            Err(TokenChangeError::UnknownOldToken)
        );
        assert_eq!(auth.rotate("a", " "), Err(TokenChangeError::EmptyNewToken));
        assert_eq!(
            auth.fingerprints().len(),
            2,
            "a refused change changes nothing"
        );
        auth.rotate("a", "c").unwrap();
        assert_eq!(auth.check(Some(b"Bearer a")), Err(AuthError::UnknownToken));
        let caller = Caller("e60c2c52".into()); // FNV-1a 32 of "c"
        assert_eq!(auth.check(Some(b"Bearer c")), Ok(Some(caller)));
        auth.rotate("", "c").unwrap();
        assert_eq!(
            auth.fingerprints().len(),
            2,
            "a duplicate new token is ignored"
        );
        auth.replace(Vec::new());
        assert_eq!(auth.check(None), Ok(None), "an empty set is open mode");
    }

    #[test]
    fn constant_time_eq_is_equality() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abc\0"));
        assert!(!constant_time_eq(b"", b"a"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn the_grpc_gate_enforces_only_when_asked() {
        let request = || tonic::Request::new(());
        let gate = |enforce| GrpcGate::new(&auth(), enforce, Service::Admin, AccessSink::default());
        let mut open = gate(false);
        assert!(tonic::service::Interceptor::call(&mut open, request()).is_ok());
        let mut gate = gate(true);
        let refusal = tonic::service::Interceptor::call(&mut gate, request()).unwrap_err();
        assert_eq!(refusal.code(), tonic::Code::Unauthenticated);
        let mut authorised = request();
        let value = "Bearer s3cret".parse().expect("metadata");
        authorised.metadata_mut().insert("authorization", value);
        let passed = tonic::service::Interceptor::call(&mut gate, authorised).unwrap();
        let caller = passed.extensions().get::<Caller>().cloned();
        assert_eq!(caller, Some(Caller(fingerprint(b"s3cret"))));
    }
}
