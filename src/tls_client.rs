//! TLS on kvcm's own client connections to a server that serves TLS (`kvcm.tls.*`): the
//! JSON routes of [`crate::http_json`] (lookup bootstrap, pool membership and directory)
//! and the client library's gRPC channels. rustls with the `ring` provider, TLS 1.2 and 1.3.
//!
//! Invariants: a server is trusted only when its certificate chains to the configured CA
//! and names the configured server name (no "insecure" mode exists); the private key of a
//! client identity is never printed (`Debug` shows the server name and whether an identity
//! is set).

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;

use kvcm_transport::DeadlineStream;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// Why a TLS client could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsClientError {
    /// A PEM file could not be read.
    #[error("{what} {path}: {source}")]
    File {
        /// Which file (CA, certificate, key).
        what: &'static str,
        /// Its path.
        path: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The PEM text holds nothing usable.
    #[error("{what}: {source}")]
    Pem {
        /// Which PEM (CA, certificate, key).
        what: &'static str,
        /// What is wrong.
        source: Cause,
    },
    /// The server name is neither a DNS name nor an IP address.
    #[error("server name {0:?} is neither a DNS name nor an IP address")]
    ServerName(String),
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// Why a PEM file or text is not usable (a PEM, rustls or webpki error, or
/// [`NoCertificate`]).
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// A PEM file or text that holds no certificate.
#[derive(Debug, thiserror::Error)]
#[error("no PEM certificate in it")]
pub struct NoCertificate;

/// How a client speaks TLS to kvcm servers: the CA it trusts, the name the servers'
/// certificates must carry, and (for mutual TLS) its own certificate and key.
#[derive(Clone)]
pub struct TlsClient {
    config: Arc<rustls::ClientConfig>,
    server_name: ServerName<'static>,
    ca_pem: String,
    /// Certificate and key PEM of the client's identity.
    identity: Option<(String, String)>,
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsClient")
            .field("server_name", &self.server_name)
            .field("identity", &self.identity.is_some())
            .finish_non_exhaustive()
    }
}

impl PartialEq for TlsClient {
    fn eq(&self, other: &TlsClient) -> bool {
        self.server_name == other.server_name
            && self.ca_pem == other.ca_pem
            && self.identity == other.identity
    }
}

impl Eq for TlsClient {}

impl TlsClient {
    /// Trusts the CA of `ca_pem` for servers named `server_name`, presenting `identity`
    /// (certificate PEM, key PEM) when given.
    pub fn from_pem(
        ca_pem: &str,
        identity: Option<(&str, &str)>,
        server_name: &str,
    ) -> Result<TlsClient, TlsClientError> {
        let pem_error = |what, source: Cause| TlsClientError::Pem { what, source };
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            let cert = cert.map_err(|e| pem_error("CA", e.into()))?;
            roots.add(cert).map_err(|e| pem_error("CA", e.into()))?;
        }
        if roots.is_empty() {
            return Err(pem_error("CA", NoCertificate.into()));
        }
        let provider = Arc::new(crate::tls_provider::ring_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
        let config = match identity {
            Some((cert, key)) => {
                let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| pem_error("certificate", e.into()))?;
                if chain.is_empty() {
                    return Err(pem_error("certificate", NoCertificate.into()));
                }
                let key = PrivateKeyDer::from_pem_slice(key.as_bytes())
                    .map_err(|e| pem_error("key", e.into()))?;
                builder.with_client_auth_cert(chain, key)?
            }
            None => builder.with_no_client_auth(),
        };
        let name = ServerName::try_from(server_name.to_string())
            .map_err(|_| TlsClientError::ServerName(server_name.to_string()))?;
        Ok(TlsClient {
            config: Arc::new(config),
            server_name: name,
            ca_pem: ca_pem.to_string(),
            identity: identity.map(|(cert, key)| (cert.to_string(), key.to_string())),
        })
    }

    /// As [`TlsClient::from_pem`], reading the PEM files.
    pub fn from_files(
        ca: &Path,
        identity: Option<(&Path, &Path)>,
        server_name: &str,
    ) -> Result<TlsClient, TlsClientError> {
        let read = |what, path: &Path| {
            std::fs::read_to_string(path).map_err(|source| TlsClientError::File {
                what,
                path: path.display().to_string(),
                source,
            })
        };
        let ca = read("CA", ca)?;
        let identity = match identity {
            Some((cert, key)) => Some((read("certificate", cert)?, read("key", key)?)),
            None => None,
        };
        let identity = identity.as_ref().map(|(c, k)| (c.as_str(), k.as_str()));
        TlsClient::from_pem(&ca, identity, server_name)
    }

    /// The same settings for a tonic channel (an `https://` endpoint).
    pub fn grpc(&self) -> tonic::transport::ClientTlsConfig {
        let name = self.server_name.to_str().into_owned();
        let mut tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&self.ca_pem))
            .domain_name(name);
        if let Some((cert, key)) = &self.identity {
            tls = tls.identity(tonic::transport::Identity::from_pem(cert, key));
        }
        tls
    }

    /// `tcp` after a TLS handshake (run on the first read or write, within the stream's
    /// deadline like every byte after it).
    pub fn wrap(&self, tcp: DeadlineStream<TcpStream>) -> io::Result<TlsStream> {
        let connection =
            rustls::ClientConnection::new(self.config.clone(), self.server_name.clone())
                .map_err(io::Error::other)?;
        Ok(TlsStream(rustls::StreamOwned::new(connection, tcp)))
    }
}

/// A blocking TLS connection made by [`TlsClient::wrap`].
pub struct TlsStream(rustls::StreamOwned<rustls::ClientConnection, DeadlineStream<TcpStream>>);

impl Read for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error;

    #[test]
    fn an_unusable_ca_says_which_file_and_keeps_why_as_its_source() {
        let error = TlsClient::from_pem("not a certificate", None, "localhost").unwrap_err();
        assert!(
            matches!(&error, TlsClientError::Pem { what: "CA", .. }),
            "{error}"
        );
        assert_eq!(error.to_string(), "CA: no PEM certificate in it");
        assert!(
            error.source().is_some_and(|s| s.is::<NoCertificate>()),
            "{error:?}"
        );
        let missing = Path::new("/nonexistent/ca.pem");
        let error = TlsClient::from_files(missing, None, "localhost").unwrap_err();
        assert!(error.to_string().contains("/nonexistent/ca.pem"), "{error}");
        assert!(
            error.source().is_some_and(|s| s.is::<io::Error>()),
            "{error:?}"
        );
    }
}
