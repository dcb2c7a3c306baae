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
        self.current()
            .iter()
            .map(|t| format!("{:08x}", fnv1a(t)))
            .collect()
    }

    /// Checks one `Authorization` value (`None`: absent).
    pub fn check(&self, authorization: Option<&[u8]>) -> Result<(), AuthError> {
        let tokens = self.current();
        if tokens.is_empty() {
            return Ok(());
        }
        let presented = bearer_token(authorization.ok_or(AuthError::Missing)?)?;
        // Every configured token is compared, whichever matches.
        let matches = tokens.iter().fold(false, |found, token| {
            constant_time_eq(token, presented) | found
        });
        matches.then_some(()).ok_or(AuthError::UnknownToken)
    }

    /// `router` behind the check (which passes everything while no token is set).
    pub fn protect(&self, router: Router) -> Router {
        router.layer(axum::middleware::from_fn_with_state(
            self.clone(),
            require_bearer,
        ))
    }
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
/// is on and a token is in force; refusals are UNAUTHENTICATED.
#[derive(Debug, Clone, Default)]
pub struct GrpcGate(Option<AdminAuth>);

impl GrpcGate {
    /// Enforces `auth` when `enforce` is set.
    pub fn new(auth: &AdminAuth, enforce: bool) -> GrpcGate {
        GrpcGate(enforce.then(|| auth.clone()))
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
    fn tokens_are_replaced_rotated_and_fingerprinted() {
        let auth = AdminAuth::new(&[]);
        assert_eq!(auth.check(None), Ok(()), "open without tokens");
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
        assert_eq!(auth.check(Some(b"Bearer c")), Ok(()));
        auth.rotate("", "c").unwrap();
        assert_eq!(
            auth.fingerprints().len(),
            2,
            "a duplicate new token is ignored"
        );
        auth.replace(Vec::new());
        assert_eq!(auth.check(None), Ok(()), "an empty set is open mode");
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
