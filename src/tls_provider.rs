//! The one TLS crypto provider kvcm builds: rustls with *ring* (no C toolchain for aws-lc),
//! for every listener, client and certificate check, so they all accept the same suites.
//!
//! rustls 0.23.48 deprecates *ring*'s provider constructor (it offers no post-quantum key
//! exchange); kvcm keeps *ring* deliberately, so the deprecation is allowed here, once.

use tokio_rustls::rustls;
use tokio_rustls::rustls::crypto::CryptoProvider;

/// rustls' *ring* provider with its default suites and key-exchange groups.
#[allow(deprecated)]
pub fn ring_provider() -> CryptoProvider {
    rustls::crypto::ring::default_provider()
}
