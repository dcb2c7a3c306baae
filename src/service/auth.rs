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

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;

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

/// The configured admin tokens (empty = open).
#[derive(Clone, Default)]
pub struct AdminAuth {
    tokens: Arc<[Box<[u8]>]>,
}

impl std::fmt::Debug for AdminAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AdminAuth({} tokens)", self.tokens.len())
    }
}

impl AdminAuth {
    /// Guards with these tokens (none = open).
    pub fn new(tokens: &[String]) -> AdminAuth {
        let tokens = tokens.iter().map(|t| t.as_bytes().into()).collect();
        AdminAuth { tokens }
    }

    /// Whether no token is configured.
    pub fn is_open(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Checks one `Authorization` value (`None`: absent).
    pub fn check(&self, authorization: Option<&[u8]>) -> Result<(), AuthError> {
        if self.is_open() {
            return Ok(());
        }
        let presented = bearer_token(authorization.ok_or(AuthError::Missing)?)?;
        // Every configured token is compared, whichever matches.
        let matches = self.tokens.iter().fold(false, |found, token| {
            constant_time_eq(token, presented) | found
        });
        matches.then_some(()).ok_or(AuthError::UnknownToken)
    }

    /// `router` behind the check (unchanged when open).
    pub fn protect(&self, router: Router) -> Router {
        if self.is_open() {
            return router;
        }
        router.layer(axum::middleware::from_fn_with_state(
            self.clone(),
            require_bearer,
        ))
    }
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

/// The HTTP middleware: passes an authorised request on, answers the others 401.
async fn require_bearer(State(auth): State<AdminAuth>, request: Request, next: Next) -> Response {
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes);
    match auth.check(authorization) {
        Ok(()) => next.run(request).await,
        Err(refusal) => unauthorized(refusal),
    }
}

fn unauthorized(refusal: AuthError) -> Response {
    let headers = [
        (header::CONTENT_TYPE, "application/json"),
        (header::WWW_AUTHENTICATE, refusal.challenge()),
    ];
    (StatusCode::UNAUTHORIZED, headers, UNAUTHORIZED).into_response()
}

/// The gRPC gate of Admin and Debug services: open unless `kvcm.service.admin_auth_grpc`
/// is on and a token is configured; refusals are UNAUTHENTICATED.
#[derive(Debug, Clone, Default)]
pub struct GrpcGate(Option<AdminAuth>);

impl GrpcGate {
    /// Enforces `auth` when `enforce` is set.
    pub fn new(auth: &AdminAuth, enforce: bool) -> GrpcGate {
        GrpcGate((enforce && !auth.is_open()).then(|| auth.clone()))
    }
}

impl tonic::service::Interceptor for GrpcGate {
    fn call(&mut self, request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let Some(auth) = &self.0 else {
            return Ok(request);
        };
        let authorization = request
            .metadata()
            .get("authorization")
            .map(|v| v.as_bytes());
        match auth.check(authorization) {
            Ok(()) => Ok(request),
            Err(refusal) => Err(tonic::Status::unauthenticated(refusal.to_string())),
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
        for good in ["Bearer s3cret", "bearer other-token", "BEARER \t s3cret"] {
            assert_eq!(auth.check(Some(good.as_bytes())), Ok(()), "{good}");
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
        assert_eq!(AdminAuth::new(&[]).check(None), Ok(()), "open mode");
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
        let mut open = GrpcGate::new(&auth(), false);
        assert!(tonic::service::Interceptor::call(&mut open, request()).is_ok());
        let mut gate = GrpcGate::new(&auth(), true);
        let refusal = tonic::service::Interceptor::call(&mut gate, request()).unwrap_err();
        assert_eq!(refusal.code(), tonic::Code::Unauthenticated);
        let mut authorised = request();
        let value = "Bearer s3cret".parse().expect("metadata");
        authorised.metadata_mut().insert("authorization", value);
        assert!(tonic::service::Interceptor::call(&mut gate, authorised).is_ok());
    }
}
