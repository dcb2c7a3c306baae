//! The `kvcm.service.*` security keys: admin bearer tokens (upstream trunk, wire delta §1),
//! the extension that enforces them on admin gRPC, the bind address of the listeners, and
//! the request limits of docs/security.md.
//!
//! Invariants: a token's text never leaves [`AdminTokens`] except to be compared (its
//! `Debug` prints a count); with no token and no `bind_host` the admin and debug listeners
//! bind loopback only.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use kvcm_manager::ManagerLimits;
use kvcm_storage::AllowedRoots;

use super::{parse, ConfigError};

/// The configured admin tokens: `kvcm.service.admin_auth_token`, comma-separated, each
/// trimmed, empties dropped. Empty = open mode.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct AdminTokens(Vec<String>);

impl AdminTokens {
    /// Parses the comma-separated setting.
    pub fn parse(text: &str) -> AdminTokens {
        let tokens = text
            .split(',')
            .map(str::trim)
            .filter(|token| !token.is_empty())
            .map(String::from)
            .collect();
        AdminTokens(tokens)
    }

    /// The tokens (to be compared, never logged).
    pub fn as_slice(&self) -> &[String] {
        &self.0
    }

    /// No token is configured: admin and debug HTTP are open.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for AdminTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AdminTokens({} configured)", self.0.len())
    }
}

/// Limits on what one request may ask for (docs/security.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// `kvcm.service.max_keys_per_request`: block keys (or keys derived from token ids) in
    /// one meta request.
    pub max_keys_per_request: usize,
    /// `kvcm.service.max_response_bytes`: the estimated size of one GetCacheLocation /
    /// GetCacheMeta answer (placeholders of missing keys included).
    pub max_response_bytes: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            max_keys_per_request: 131_072,
            max_response_bytes: 256 << 20,
        }
    }
}

/// Connection limits of every listener (src/server/admission.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// `kvcm.service.max_connections_per_listener`: open connections one listener holds
    /// (lowered at start to what the descriptor limit leaves each listener).
    pub per_listener: usize,
    /// `kvcm.service.idle_timeout_ms`: a connection without progress for this long (half
    /// a header, a stalled body, an idle keep-alive) is closed.
    pub idle_timeout_ms: u64,
    /// `kvcm.service.header_timeout_ms`: an HTTP connection that has waited this long for a
    /// request head without receiving all of it is closed, however steadily the head
    /// trickles in (the clock starts when the connection starts waiting, so an idle
    /// keep-alive connection is closed after it too).
    pub header_timeout_ms: u64,
    /// `kvcm.service.body_timeout_ms`: an HTTP request body not complete this long after its
    /// head is answered 408 `{}`.
    pub body_timeout_ms: u64,
    /// `kvcm.service.grpc_request_timeout_ms`: a gRPC call not answered this long after its
    /// headers arrived (a trickled request message included) is ended with CANCELLED
    /// "Timeout expired"; a client's shorter `grpc-timeout` wins.
    pub grpc_request_timeout_ms: u64,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            per_listener: 4096,
            idle_timeout_ms: 60_000,
            header_timeout_ms: 30_000,
            body_timeout_ms: 30_000,
            grpc_request_timeout_ms: 30_000,
        }
    }
}

/// Security settings of the listeners.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecurityConfig {
    /// `kvcm.service.admin_auth_token`.
    pub admin_tokens: AdminTokens,
    /// `kvcm.service.admin_auth_grpc`: also demand a token (as `authorization` metadata) on
    /// Admin and Debug gRPC (our extension; upstream leaves gRPC open). Default off.
    pub admin_auth_grpc: bool,
    /// `kvcm.auth.meta`: `required` makes every meta call (HTTP, gRPC, the lookup bootstrap)
    /// demand an API key that names the instance it touches (or an admin token), and every
    /// admin and debug call, on both transports, a credential. Default `off` (the
    /// reference's open meta API).
    pub meta_auth_required: bool,
    /// `kvcm.service.bind_host`: the address every listener binds; unset = all interfaces
    /// for meta gRPC/HTTP and, without a token, loopback for admin and debug.
    pub bind_host: Option<IpAddr>,
    /// `kvcm.service.max_keys_per_request`, `max_response_bytes`.
    pub limits: RequestLimits,
    /// `kvcm.service.max_connections_per_listener`, `idle_timeout_ms`, `header_timeout_ms`,
    /// `body_timeout_ms`.
    pub connections: ConnectionLimits,
    /// `kvcm.service.max_sessions_per_instance`, `max_instances_per_group`,
    /// `max_reporters_per_instance`.
    pub manager: ManagerLimits,
    /// `kvcm.service.storage_root_allow_list`: directories file-tier roots must lie in
    /// (comma-separated; empty = anywhere but the system directories).
    pub allowed_roots: AllowedRoots,
    /// `kvcm.tls.*`: TLS on every gRPC and HTTP listener.
    pub tls: TlsSettings,
    /// `kvcm.service.dumpable`: leave `kvcm serve` dumpable (core dumps, `/proc/<pid>/fd`,
    /// `/proc/<pid>/mem` and ptrace open to processes of its user). Default false: the
    /// server marks itself not dumpable at start, so another process of its user cannot
    /// open its shared-memory lookup tables behind the transport's back.
    pub dumpable: bool,
}

/// `kvcm.tls.cert_file`, `key_file` (PEM; both or neither: TLS on every gRPC and HTTP listener),
/// `client_ca_file` (PEM; clients must present a certificate it signed), `client_crl_file`
/// (PEM revocation lists of those CAs: a revoked client certificate is refused),
/// `client_identity`
/// (`none` or `account`: a client certificate's Common Name names the account a request
/// without a bearer credential acts as).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// The server's certificate chain.
    pub cert_file: Option<PathBuf>,
    /// Its private key.
    pub key_file: Option<PathBuf>,
    /// The CA client certificates must chain to (mutual TLS).
    pub client_ca_file: Option<PathBuf>,
    /// Revocation lists of the client CAs: a client certificate they revoke is refused.
    pub client_crl_file: Option<PathBuf>,
    /// `kvcm.tls.client_identity = account`.
    pub certificate_accounts: bool,
}

/// The security keys, in the order they are documented.
pub const SECURITY_KEYS: [&str; 21] = [
    "kvcm.service.admin_auth_token",
    "kvcm.service.admin_auth_grpc",
    "kvcm.auth.meta",
    "kvcm.service.bind_host",
    "kvcm.service.max_keys_per_request",
    "kvcm.service.max_response_bytes",
    "kvcm.service.max_connections_per_listener",
    "kvcm.service.idle_timeout_ms",
    "kvcm.service.header_timeout_ms",
    "kvcm.service.body_timeout_ms",
    "kvcm.service.grpc_request_timeout_ms",
    "kvcm.service.max_sessions_per_instance",
    "kvcm.service.max_instances_per_group",
    "kvcm.service.max_reporters_per_instance",
    "kvcm.service.storage_root_allow_list",
    "kvcm.tls.cert_file",
    "kvcm.tls.key_file",
    "kvcm.tls.client_ca_file",
    "kvcm.tls.client_crl_file",
    "kvcm.tls.client_identity",
    "kvcm.service.dumpable",
];

impl SecurityConfig {
    /// Sets one security key from its text form.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        let (limits, connections) = (&mut self.limits, &mut self.connections);
        match key {
            "kvcm.service.admin_auth_token" => self.admin_tokens = AdminTokens::parse(value),
            "kvcm.service.admin_auth_grpc" => self.admin_auth_grpc = parse(key, value)?,
            "kvcm.service.dumpable" => self.dumpable = parse(key, value)?,
            "kvcm.auth.meta" => self.meta_auth_required = switch(key, value, ("off", "required"))?,
            "kvcm.tls.cert_file" => self.tls.cert_file = path_or_none(value),
            "kvcm.tls.key_file" => self.tls.key_file = path_or_none(value),
            "kvcm.tls.client_ca_file" => self.tls.client_ca_file = path_or_none(value),
            "kvcm.tls.client_crl_file" => self.tls.client_crl_file = path_or_none(value),
            "kvcm.tls.client_identity" => {
                self.tls.certificate_accounts = switch(key, value, ("none", "account"))?
            }
            "kvcm.service.bind_host" if value.trim().is_empty() => self.bind_host = None,
            "kvcm.service.bind_host" => self.bind_host = Some(parse(key, value.trim())?),
            "kvcm.service.max_keys_per_request" => {
                limits.max_keys_per_request = positive(key, value)?
            }
            "kvcm.service.max_response_bytes" => limits.max_response_bytes = positive(key, value)?,
            "kvcm.service.max_connections_per_listener" => {
                connections.per_listener = positive(key, value)?
            }
            "kvcm.service.max_sessions_per_instance" => {
                self.manager.max_sessions_per_instance = positive(key, value)?
            }
            "kvcm.service.max_instances_per_group" => {
                self.manager.max_instances_per_group = positive(key, value)?
            }
            "kvcm.service.max_reporters_per_instance" => {
                self.manager.max_reporters_per_instance = positive(key, value)?
            }
            "kvcm.service.storage_root_allow_list" => {
                self.allowed_roots =
                    AllowedRoots::parse(value).map_err(|reason| ConfigError::InvalidValue {
                        key: key.to_string(),
                        reason,
                    })?
            }
            "kvcm.service.idle_timeout_ms" => {
                connections.idle_timeout_ms = positive(key, value)? as u64
            }
            "kvcm.service.header_timeout_ms" => {
                connections.header_timeout_ms = positive(key, value)? as u64
            }
            "kvcm.service.body_timeout_ms" => {
                connections.body_timeout_ms = positive(key, value)? as u64
            }
            "kvcm.service.grpc_request_timeout_ms" => {
                connections.grpc_request_timeout_ms = positive(key, value)? as u64
            }
            _ => return Err(ConfigError::UnknownKey(key.to_string())),
        }
        Ok(())
    }

    /// Where the meta listeners (gRPC, meta HTTP) bind.
    pub fn meta_host(&self) -> IpAddr {
        self.bind_host.unwrap_or(Ipv4Addr::UNSPECIFIED.into())
    }

    /// Where the admin and debug listeners bind: `bind_host`, else all interfaces when a
    /// token protects them, else loopback.
    pub fn admin_host(&self) -> IpAddr {
        match self.bind_host {
            Some(host) => host,
            None if self.admin_tokens.is_empty() => Ipv4Addr::LOCALHOST.into(),
            None => Ipv4Addr::UNSPECIFIED.into(),
        }
    }

    /// Admin and debug listeners fall back to loopback (no token, no `bind_host`).
    pub fn admin_loopback_only(&self) -> bool {
        self.bind_host.is_none() && self.admin_tokens.is_empty()
    }
}

/// `off` (false) or `on` (true): the two words a switch of `key` takes.
fn switch(key: &str, value: &str, (off, on): (&str, &str)) -> Result<bool, ConfigError> {
    match value.trim() {
        word if word == off => Ok(false),
        word if word == on => Ok(true),
        other => Err(ConfigError::InvalidValue {
            key: key.to_string(),
            reason: format!("{other:?} is neither {off:?} nor {on:?}"),
        }),
    }
}

/// A path, or none for an empty value.
fn path_or_none(value: &str) -> Option<PathBuf> {
    let value = value.trim();
    (!value.is_empty()).then(|| PathBuf::from(value))
}

/// Cross-key rules: meta auth needs an admin token, else no one could create the first key;
/// a TLS certificate needs its key and the other way round, a client CA needs both.
pub fn validate_auth(security: &SecurityConfig) -> Result<(), ConfigError> {
    let tls = &security.tls;
    let invalid = |key: &str, reason: &str| ConfigError::InvalidValue {
        key: key.into(),
        reason: reason.into(),
    };
    match (&tls.cert_file, &tls.key_file) {
        (Some(_), None) => return Err(invalid("kvcm.tls.key_file", "kvcm.tls.cert_file needs it")),
        (None, Some(_)) => return Err(invalid("kvcm.tls.cert_file", "kvcm.tls.key_file needs it")),
        (None, None) if tls.client_ca_file.is_some() => {
            let why = "needs kvcm.tls.cert_file and kvcm.tls.key_file (mutual TLS is TLS)";
            return Err(invalid("kvcm.tls.client_ca_file", why));
        }
        _ => {}
    }
    if tls.client_crl_file.is_some() && tls.client_ca_file.is_none() {
        let why = "needs kvcm.tls.client_ca_file (revocation lists are of client CAs)";
        return Err(invalid("kvcm.tls.client_crl_file", why));
    }
    if tls.certificate_accounts && tls.client_ca_file.is_none() {
        let why =
            "account needs kvcm.tls.client_ca_file (client certificates come with mutual TLS)";
        return Err(invalid("kvcm.tls.client_identity", why));
    }
    if security.meta_auth_required && security.admin_tokens.is_empty() {
        return Err(ConfigError::InvalidValue {
            key: "kvcm.auth.meta".into(),
            reason: "\"required\" needs kvcm.service.admin_auth_token: without a token no one \
                     could create the first API key"
                .into(),
        });
    }
    Ok(())
}

fn positive(key: &str, value: &str) -> Result<usize, ConfigError> {
    let number: usize = parse(key, value)?;
    if number == 0 {
        return Err(ConfigError::InvalidValue {
            key: key.to_string(),
            reason: "must be positive".into(),
        });
    }
    Ok(number)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_split_trimmed_and_never_printed() {
        let tokens = AdminTokens::parse(" s3cret , ,other,");
        assert_eq!(tokens.as_slice(), ["s3cret", "other"]);
        let shown = format!(
            "{:?}",
            SecurityConfig {
                admin_tokens: tokens,
                ..Default::default()
            }
        );
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(AdminTokens::parse(" , ").is_empty());
    }

    #[test]
    fn admin_listeners_bind_loopback_without_a_token_or_bind_host() {
        let mut config = SecurityConfig::default();
        assert_eq!(config.admin_host(), IpAddr::from(Ipv4Addr::LOCALHOST));
        assert_eq!(config.meta_host(), IpAddr::from(Ipv4Addr::UNSPECIFIED));
        assert!(config.admin_loopback_only());
        config.set("kvcm.service.admin_auth_token", "t").unwrap();
        assert_eq!(config.admin_host(), IpAddr::from(Ipv4Addr::UNSPECIFIED));
        config.set("kvcm.service.admin_auth_token", "").unwrap();
        config.set("kvcm.service.bind_host", "0.0.0.0").unwrap();
        assert_eq!(config.admin_host(), IpAddr::from(Ipv4Addr::UNSPECIFIED));
        assert!(!config.admin_loopback_only());
        let error = config.set("kvcm.service.bind_host", "nowhere").unwrap_err();
        assert!(
            error.to_string().contains("kvcm.service.bind_host"),
            "{error}"
        );
    }

    #[test]
    fn limits_must_be_positive_naming_the_key() {
        let mut config = SecurityConfig::default();
        let error = config
            .set("kvcm.service.max_keys_per_request", "0")
            .unwrap_err();
        assert!(
            error.to_string().contains("max_keys_per_request"),
            "{error}"
        );
        config
            .set("kvcm.service.max_response_bytes", "1024")
            .unwrap();
        assert_eq!(config.limits.max_response_bytes, 1024);
    }

    #[test]
    fn the_root_allow_list_is_parsed_and_bad_entries_name_the_key() {
        let mut config = SecurityConfig::default();
        config
            .set("kvcm.service.storage_root_allow_list", "/data/kv, /mnt/3fs")
            .unwrap();
        assert_eq!(config.allowed_roots.prefixes(), ["/data/kv", "/mnt/3fs"]);
        let error = config
            .set("kvcm.service.storage_root_allow_list", "data")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("kvcm.service.storage_root_allow_list"),
            "{error}"
        );
        config
            .set("kvcm.service.storage_root_allow_list", "")
            .unwrap();
        assert!(config.allowed_roots.is_empty());
    }

    #[test]
    fn tls_keys_come_in_pairs_and_name_the_missing_one() {
        let refusal = |settings: &[(&str, &str)]| {
            let mut config = SecurityConfig::default();
            for (key, value) in settings {
                if let Err(error) = config.set(key, value) {
                    return Some(error.to_string());
                }
            }
            validate_auth(&config).err().map(|e| e.to_string())
        };
        let (cert, key) = (
            ("kvcm.tls.cert_file", "c.pem"),
            ("kvcm.tls.key_file", "k.pem"),
        );
        let ca = ("kvcm.tls.client_ca_file", "ca.pem");
        let accounts = ("kvcm.tls.client_identity", "account");
        let crl = ("kvcm.tls.client_crl_file", "revoked.pem");
        assert_eq!(refusal(&[cert, key, ca, crl, accounts]), None);
        assert_eq!(refusal(&[cert, key]), None);
        let missing = [
            (vec![cert], "kvcm.tls.key_file"),
            (vec![key], "kvcm.tls.cert_file"),
            (vec![ca], "kvcm.tls.client_ca_file"),
            (vec![cert, key, accounts], "kvcm.tls.client_identity"),
            (vec![cert, key, crl], "kvcm.tls.client_crl_file"),
            (
                vec![cert, key, ca, ("kvcm.tls.client_identity", "cn")],
                "kvcm.tls.client_identity",
            ),
        ];
        for (settings, named) in missing {
            let error = refusal(&settings).unwrap_or_default();
            assert!(error.contains(named), "{settings:?}: {error:?}");
        }
        let mut config = SecurityConfig::default();
        config.set("kvcm.tls.client_identity", "account").unwrap();
        config.set("kvcm.tls.client_identity", "none").unwrap();
        assert!(!config.tls.certificate_accounts);
    }
}
