//! The one access check every lookup bootstrap passes through: the server's
//! (`service::auth::Authenticator::lookup_access`) admits everyone while `kvcm.auth.meta` is
//! off, and otherwise a credential that may make meta calls of the instance.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::service::auth::CertIdentity;

/// What a bootstrap request shows about its caller.
#[derive(Debug, Clone)]
pub struct AccessCheck<'a> {
    /// The instance whose table is asked for.
    pub instance_id: &'a str,
    /// The caller's address, when known.
    pub peer: Option<SocketAddr>,
    /// The `Authorization` header, when sent.
    pub authorization: Option<&'a str>,
    /// What the connection's client certificate names (mutual TLS), when it has one.
    pub certificate: Option<&'a CertIdentity>,
}

/// Decides whether a caller may read an instance's table (`Err` = refused, with why).
pub type LookupAccess = Arc<dyn Fn(&AccessCheck<'_>) -> Result<(), String> + Send + Sync>;
