//! Who a caller is (authentication) and what it may call (authorization).
//!
//! Credentials: the admin bearer tokens of upstream trunk (wire delta §1,
//! `kvcm.service.admin_auth_token`) and kvcm's API keys (accounts' keys, see
//! `kvcm_manager::api_keys`), both presented as `Authorization: Bearer <credential>` (HTTP
//! header or gRPC metadata). A token acts as root; a key acts with its account's role, on
//! the instances it names. With mutual TLS and `kvcm.tls.client_identity = account`, a
//! request that carries no `Authorization` is authenticated by its connection's client
//! certificate instead: its Common Name names an account, its `urn:kvcm:instance:<id>` URI
//! names the instances (a [`CertIdentity`]); a bearer credential, when sent, always decides.
//!
//! When a credential is required: on the admin and debug HTTP listeners (`/metrics` and
//! `/api/healthy` included) while a token is configured or `kvcm.auth.meta = required`; on
//! Admin and Debug gRPC likewise, when `kvcm.service.admin_auth_grpc` is on or meta auth is
//! required; on the meta API (HTTP, gRPC, the lookup bootstrap) only with `kvcm.auth.meta =
//! required`. A request without a required credential is answered 401
//! `{"error":"unauthorized"}` with `WWW-Authenticate: Bearer realm="kvcm"` (plus
//! `error="invalid_request"` for a malformed or non-Bearer header, `error="invalid_token"`
//! for an unknown or expired credential), or UNAUTHENTICATED on gRPC. A known credential
//! that may not call the RPC (its role, or an instance its key does not name) is answered
//! 403 `{"error":"forbidden","message":...}`, PERMISSION_DENIED on gRPC. Where no credential
//! is required, every request passes (the reference's open mode), whatever it carries.
//!
//! Invariants: the scheme is case-insensitive and followed by at least one SP or HTAB; the
//! credential has no white space inside; a presented token is compared with every configured
//! one in time independent of where they differ (a key, by its digest); no credential is
//! ever logged or echoed; a key is checked against the manager at every request, so a
//! revocation holds from the next one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;

use kvcm_manager::{AccountRole, KeyGrant, KeyRefusal, Manager};

use super::http::{ClientAddr, ClientCertificate, Peer};
use super::rpcs::{Access, Service};
use crate::access_log::{AccessSink, Transport};

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `Authorization` header (or metadata).
    #[error("a bearer token (admin token or API key) is required")]
    Missing,
    /// Not `Bearer <token>`.
    #[error("the authorization is not of the form \"Bearer <token>\"")]
    Malformed,
    /// A well-formed token that is neither a configured token nor a valid API key.
    #[error("the bearer token is not valid")]
    UnknownToken,
    /// An API key past its expiry.
    #[error("the API key has expired")]
    ExpiredKey,
    /// A client certificate whose Common Name is no account.
    #[error("the client certificate's account does not exist")]
    UnknownAccount,
    /// A client certificate of a ROLE_USER account that names no instance.
    #[error("the client certificate names no instance (urn:kvcm:instance:<id>), which a ROLE_USER account needs")]
    UnscopedCertificate,
}

impl AuthError {
    /// The `WWW-Authenticate` challenge of this refusal.
    pub fn challenge(self) -> &'static str {
        match self {
            AuthError::Missing => r#"Bearer realm="kvcm""#,
            AuthError::Malformed => r#"Bearer realm="kvcm", error="invalid_request""#,
            AuthError::UnknownToken
            | AuthError::ExpiredKey
            | AuthError::UnknownAccount
            | AuthError::UnscopedCertificate => r#"Bearer realm="kvcm", error="invalid_token""#,
        }
    }
}

/// Body of every 401.
const UNAUTHORIZED: &str = r#"{"error":"unauthorized"}"#;

/// The credentials in force: the admin tokens (replaced at run time by SetAuthenticatorTokens /
/// RotateAuthenticatorToken), the manager's API keys, and whether the meta API requires one.
/// Shared by the HTTP middleware, the gRPC gates, the lookup bootstrap and the token RPCs.
#[derive(Clone, Default)]
pub struct Authenticator {
    tokens: Arc<RwLock<Tokens>>,
    /// Where API keys are verified (`None`: tokens only).
    keys: Option<Arc<Manager>>,
    /// `kvcm.auth.meta = required`.
    meta_required: Arc<AtomicBool>,
    /// `kvcm.tls.client_identity = account`: client certificates name accounts.
    certificate_accounts: Arc<AtomicBool>,
}

/// What a verified client certificate names (see `server::client_cert`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertIdentity {
    /// The subject's Common Name: an account's user name.
    pub account: String,
    /// The ids of its `urn:kvcm:instance:<id>` URI subject-alternative names.
    pub instances: Vec<String>,
}

/// One immutable set of tokens (swapped whole, so a check never sees half a change).
type Tokens = Arc<[Box<[u8]>]>;

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Authenticator({} tokens)", self.current().len())
    }
}

impl From<KeyRefusal> for AuthError {
    fn from(refusal: KeyRefusal) -> AuthError {
        match refusal {
            KeyRefusal::Malformed | KeyRefusal::Unknown => AuthError::UnknownToken,
            KeyRefusal::Expired => AuthError::ExpiredKey,
        }
    }
}

/// Why a token change was refused (nothing changed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenChangeError {
    /// RotateAuthenticatorToken without a new token.
    #[error("new_token is empty")]
    EmptyNewToken,
    /// RotateAuthenticatorToken naming an old token that is not configured.
    #[error("old_token is not a configured token")]
    UnknownOldToken,
}

impl Authenticator {
    /// Guards with these tokens (none = open) and no API keys.
    pub fn new(tokens: &[String]) -> Authenticator {
        let auth = Authenticator::default();
        auth.replace(tokens.iter().cloned());
        auth
    }

    /// Guards with no token yet and the API keys of `manager`.
    pub fn with_keys(manager: Arc<Manager>) -> Authenticator {
        Authenticator {
            keys: Some(manager),
            ..Authenticator::default()
        }
    }

    /// Whether a request without a bearer credential is authenticated by the account its
    /// client certificate names (`kvcm.tls.client_identity = account`).
    pub fn accept_certificates(&self, accepted: bool) {
        self.certificate_accounts.store(accepted, Ordering::Release);
    }

    /// Sets `kvcm.auth.meta = required` (on) or off.
    pub fn require_meta(&self, required: bool) {
        self.meta_required.store(required, Ordering::Release);
    }

    /// Whether the meta API requires a credential.
    pub fn meta_required(&self) -> bool {
        self.meta_required.load(Ordering::Acquire)
    }

    /// Whether a call of `service` needs a credential now (gRPC admin and debug calls only
    /// when their gate enforces, see [`GrpcGate`]).
    fn required(&self, service: Service, tokens: &Tokens) -> bool {
        match service {
            Service::Meta => self.meta_required(),
            Service::Admin | Service::Debug => self.meta_required() || !tokens.is_empty(),
        }
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

    /// Checks one `Authorization` value (`None`: absent) of a call of `service` on a
    /// connection whose client certificate names `certificate`: the caller its credential
    /// names (`None` where no credential is required, and everything passes).
    pub fn check(
        &self,
        service: Service,
        authorization: Option<&[u8]>,
        certificate: Option<&CertIdentity>,
    ) -> Result<Option<Caller>, AuthError> {
        if !self.required(service, &self.current()) {
            return Ok(None);
        }
        match (authorization, certificate) {
            (None, Some(identity)) if self.certificate_accounts.load(Ordering::Acquire) => {
                self.check_certificate(identity).map(Some)
            }
            _ => {
                let presented = bearer_token(authorization.ok_or(AuthError::Missing)?)?;
                self.check_token(service, Some(presented))
            }
        }
    }

    /// The caller a client certificate names: its account, checked now (a deleted account
    /// stops working from the next request).
    fn check_certificate(&self, identity: &CertIdentity) -> Result<Caller, AuthError> {
        let keys = self.keys.as_ref().ok_or(AuthError::UnknownAccount)?;
        let role = keys
            .account_role(&identity.account)
            .ok_or(AuthError::UnknownAccount)?;
        if role == AccountRole::User && identity.instances.is_empty() {
            return Err(AuthError::UnscopedCertificate);
        }
        Ok(Caller {
            name: format!("cert:{}", identity.account),
            grant: Grant::Key {
                role,
                instances: identity.instances.clone(),
            },
        })
    }

    /// [`Authenticator::check`] of what an HTTP request shows: its `Authorization` header
    /// and its connection's client certificate.
    pub fn check_request(
        &self,
        service: Service,
        request: &Request,
    ) -> Result<Option<Caller>, AuthError> {
        let authorization = request
            .headers()
            .get(header::AUTHORIZATION)
            .map(HeaderValue::as_bytes);
        let certificate = request.extensions().get::<ClientCertificate>();
        self.check(service, authorization, certificate.map(|c| c.0.as_ref()))
    }

    /// As [`Authenticator::check`], for a credential presented bare (the RDMA message path's
    /// Authenticate carries no `Bearer` scheme).
    pub fn check_token(
        &self,
        service: Service,
        presented: Option<&[u8]>,
    ) -> Result<Option<Caller>, AuthError> {
        let tokens = self.current();
        if !self.required(service, &tokens) {
            return Ok(None);
        }
        let presented = presented.ok_or(AuthError::Missing)?;
        // Every configured token is compared, whichever matches.
        let matches = tokens.iter().fold(false, |found, token| {
            constant_time_eq(token, presented) | found
        });
        if matches {
            return Ok(Some(Caller::token(presented)));
        }
        let keys = self.keys.as_ref().ok_or(AuthError::UnknownToken)?;
        Ok(Some(Caller::key(keys.verify_api_key(presented)?)))
    }

    /// Whether the caller `authorization` shows may read `instance_id`'s lookup table (the
    /// bootstrap's access check: a meta call of that instance).
    pub fn lookup_access(
        &self,
        instance_id: &str,
        authorization: Option<&[u8]>,
        certificate: Option<&CertIdentity>,
    ) -> Result<(), String> {
        let caller = self
            .check(Service::Meta, authorization, certificate)
            .map_err(|e| e.to_string())?;
        authorize(caller.as_ref(), Access::Client, Some(instance_id))
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

/// Who a call came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Its name in the access and audit logs' `caller`: the fingerprint of a token,
    /// `<account>:<key id>` for an API key, `cert:<account>` for a client certificate.
    pub name: String,
    /// What its credential grants.
    pub grant: Grant,
}

/// What a credential grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grant {
    /// An admin token: everything.
    Token,
    /// An API key or a client certificate: its account's role, on the instances it names
    /// (none named = every one).
    Key {
        /// The account's role.
        role: AccountRole,
        /// The instances the key names.
        instances: Vec<String>,
    },
}

impl Caller {
    fn token(token: &[u8]) -> Caller {
        Caller {
            name: fingerprint(token),
            grant: Grant::Token,
        }
    }

    fn key(grant: KeyGrant) -> Caller {
        Caller {
            name: format!("{}:{}", grant.user_name, grant.key_id),
            grant: Grant::Key {
                role: grant.role,
                instances: grant.instances,
            },
        }
    }
}

/// Whether `caller` may make a call that needs `access` (on `instance`, for a meta call of
/// one): `Err` says why not. No caller passes: the authentication layer lets a request
/// through without one only where none is required.
pub fn authorize(
    caller: Option<&Caller>,
    access: Access,
    instance: Option<&str>,
) -> Result<(), String> {
    let Some(Caller {
        grant: Grant::Key { role, instances },
        ..
    }) = caller
    else {
        return Ok(());
    };
    let role_may = match access {
        Access::Client | Access::Anyone => true,
        Access::Read | Access::Operate => *role != AccountRole::User,
        Access::AdminRead | Access::Admin => *role == AccountRole::Admin,
    };
    if !role_may {
        return Err(format!(
            "the key's account role ({role:?}) may not call this RPC"
        ));
    }
    match (access, instance) {
        (Access::Client, Some(id))
            if !instances.is_empty() && !instances.iter().any(|i| i == id) =>
        {
            Err(format!("the key does not name instance {id:?}"))
        }
        _ => Ok(()),
    }
}

/// The instance a request touches, for the authorization of instance-scoped RPCs
/// (implemented for every request type by the RPC table).
pub trait Scoped {
    /// The request's `instance_id` where its RPC is scoped to one, else `None`.
    fn instance_id(&self) -> Option<&str>;
}

/// 8 lower-case hex digits of a token's 32-bit FNV-1a.
fn fingerprint(token: &[u8]) -> String {
    format!("{:08x}", fnv1a(token))
}

/// The state of the HTTP middleware.
#[derive(Clone)]
struct HttpGuard {
    auth: Authenticator,
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

/// The one spelling of an `Authorization` header that carries a bearer token
/// (`Bearer <token>`): the scheme's case and the blanks before the token vary among
/// headers that authenticate alike; `None` for a header without one.
pub fn canonical_authorization(value: &[u8]) -> Option<Vec<u8>> {
    let token = bearer_token(value).ok()?;
    Some([b"Bearer ".as_slice(), token].concat())
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
    match guard.auth.check_request(guard.service, &request) {
        Ok(caller) => {
            // Routes that are no RPC (`/metrics`, `/api/healthy`, capacity curves) read the
            // admin plane: a ROLE_USER key may not, whichever route it asks.
            let plane = match guard.service {
                Service::Meta => Access::Anyone,
                Service::Admin | Service::Debug => Access::Read,
            };
            if let Err(reason) = authorize(caller.as_ref(), plane, None) {
                return forbidden_route(&guard, &request, caller.as_ref(), &reason);
            }
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

/// A 403 for a route of the admin plane that `caller` may not read, logged.
fn forbidden_route(
    guard: &HttpGuard,
    request: &Request,
    caller: Option<&Caller>,
    reason: &str,
) -> Response {
    let client = request.extensions().get::<ClientAddr>().map(|addr| addr.0);
    let name = caller.map_or("", |caller| caller.name.as_str());
    let path = request.uri().path();
    let access = &guard.access;
    access.forbidden_path(guard.service, path, Transport::Http, client, name, reason);
    let body = serde_json::json!({"error": "forbidden", "message": reason});
    let headers = [(header::CONTENT_TYPE, "application/json")];
    (StatusCode::FORBIDDEN, headers, body.to_string()).into_response()
}

fn unauthorized(refusal: AuthError) -> Response {
    let headers = [
        (header::CONTENT_TYPE, "application/json"),
        (header::WWW_AUTHENTICATE, refusal.challenge()),
    ];
    (StatusCode::UNAUTHORIZED, headers, UNAUTHORIZED).into_response()
}

/// The gRPC gate of a service. MetaService needs a credential when meta auth is required;
/// Admin and Debug when `kvcm.service.admin_auth_grpc` is on (and a token is in force) or
/// meta auth is required (else anyone could create a key over gRPC). Refusals are
/// UNAUTHENTICATED and logged (the interceptor does not see the method: the line names the
/// service, `MetaService` / `AdminService` / `DebugService`).
#[derive(Debug, Clone)]
pub struct GrpcGate {
    auth: Authenticator,
    /// `kvcm.service.admin_auth_grpc`.
    admin_grpc: bool,
    service: Service,
    access: AccessSink,
}

impl GrpcGate {
    /// The gate of `service` checking with `auth` (`admin_grpc`:
    /// `kvcm.service.admin_auth_grpc`); refusals are logged to `access`.
    pub fn new(
        auth: &Authenticator,
        admin_grpc: bool,
        service: Service,
        access: AccessSink,
    ) -> GrpcGate {
        GrpcGate {
            auth: auth.clone(),
            admin_grpc,
            service,
            access,
        }
    }

    fn enforces(&self) -> bool {
        self.service == Service::Meta || self.admin_grpc || self.auth.meta_required()
    }
}

impl tonic::service::Interceptor for GrpcGate {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if !self.enforces() {
            return Ok(request);
        }
        let authorization = request
            .metadata()
            .get("authorization")
            .map(|v| v.as_bytes());
        let peer = Peer::of(&request);
        match self
            .auth
            .check(self.service, authorization, peer.certificate.as_deref())
        {
            Ok(caller) => {
                if let Some(caller) = caller {
                    request.extensions_mut().insert(caller);
                }
                Ok(request)
            }
            Err(refusal) => {
                let reason = refusal.to_string();
                let name = match self.service {
                    Service::Meta => "MetaService",
                    Service::Debug => "DebugService",
                    Service::Admin => "AdminService",
                };
                let (client, access) = (peer.addr, &self.access);
                access.unauthorized(self.service, name, Transport::Grpc, client, &reason);
                Err(tonic::Status::unauthenticated(reason))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth() -> Authenticator {
        Authenticator::new(&["s3cret".into(), "other-token".into()])
    }

    #[test]
    fn headers_that_authenticate_alike_have_one_canonical_spelling() {
        for spelling in ["Bearer s3cret", "bEaReR s3cret", "BEARER \t  s3cret"] {
            assert_eq!(
                canonical_authorization(spelling.as_bytes()).as_deref(),
                Some(b"Bearer s3cret".as_slice()),
                "{spelling:?}"
            );
        }
        for other in ["Basic s3cret", "Bearer", "Bearer s3 cret"] {
            assert_eq!(canonical_authorization(other.as_bytes()), None, "{other:?}");
        }
    }

    #[test]
    fn bearer_tokens_are_parsed_as_the_trunk_says() {
        let auth = auth();
        let caller = |token: &[u8]| Ok(Some(Caller::token(token)));
        for (good, token) in [
            ("Bearer s3cret", "s3cret"),
            ("bearer other-token", "other-token"),
            ("BEARER \t s3cret", "s3cret"),
        ] {
            let outcome = auth.check(Service::Admin, Some(good.as_bytes()), None);
            assert_eq!(outcome, caller(token.as_bytes()), "{good}");
        }
        assert_eq!(
            auth.check(Service::Admin, None, None),
            Err(AuthError::Missing)
        );
        for malformed in [
            "Basic s3cret",
            "Bearer",
            "Bearer ",
            "Bearers3cret",
            "Bearer s3 cret",
        ] {
            let outcome = auth.check(Service::Admin, Some(malformed.as_bytes()), None);
            assert_eq!(outcome, Err(AuthError::Malformed), "{malformed:?}");
        }
        for unknown in ["Bearer s3cre", "Bearer s3cret2", "Bearer S3CRET"] {
            let outcome = auth.check(Service::Admin, Some(unknown.as_bytes()), None);
            assert_eq!(outcome, Err(AuthError::UnknownToken), "{unknown:?}");
        }
        assert_eq!(
            Authenticator::new(&[]).check(Service::Admin, None, None),
            Ok(None),
            "open mode"
        );
    }

    #[test]
    fn tokens_are_replaced_rotated_and_fingerprinted() {
        let auth = Authenticator::new(&[]);
        assert_eq!(
            auth.check(Service::Admin, None, None),
            Ok(None),
            "open without tokens"
        );
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
        assert_eq!(
            auth.check(Service::Admin, Some(b"Bearer a"), None),
            Err(AuthError::UnknownToken)
        );
        let caller = Caller::token(b"c");
        assert_eq!(caller.name, "e60c2c52", "FNV-1a 32 of \"c\"");
        assert_eq!(
            auth.check(Service::Admin, Some(b"Bearer c"), None),
            Ok(Some(caller))
        );
        auth.rotate("", "c").unwrap();
        assert_eq!(
            auth.fingerprints().len(),
            2,
            "a duplicate new token is ignored"
        );
        auth.replace(Vec::new());
        assert_eq!(
            auth.check(Service::Admin, None, None),
            Ok(None),
            "an empty set is open mode"
        );
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
        assert_eq!(caller, Some(Caller::token(b"s3cret")));
    }
}
