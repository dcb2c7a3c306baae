//! TLS on kvcm's gRPC and HTTP listeners (`kvcm.tls.*`, rustls with the `ring` provider): with a
//! certificate and key configured, meta gRPC, meta HTTP, admin gRPC, admin HTTP and debug
//! HTTP speak only TLS (1.2 and 1.3); with a client CA as well, every client must present a
//! certificate that CA signed (mutual TLS) and, with revocation lists, one they do not
//! revoke.
//!
//! Invariants: a handshake runs on its connection's own task and must finish within the
//! header timeout (a client that stalls in it holds one admission permit, never the accept
//! loop); the certificate and key, and the client CA with its revocation lists, are re-read
//! when one of their files'
//! modification times changes (looked at, at most once per [`RELOAD_CHECK`], on a
//! handshake), and files that do not load leave the previous ones in force (logged), so a
//! half-written renewal never takes the listeners down. Under mutual TLS sessions are never
//! resumed (rustls does not verify a resumed session's certificate again), so every new
//! connection is checked against the client CA in force; open connections keep going.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::rustls;
use tokio_rustls::rustls::client::danger::HandshakeSignatureValid;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{
    CertificateDer, CertificateRevocationListDer, PrivateKeyDer, SignatureVerificationAlgorithm,
    UnixTime,
};
use tokio_rustls::rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use tokio_rustls::rustls::server::{
    ClientHello, ResolvesServerCert, VerifierBuilderError, WebPkiClientVerifier,
};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use tonic::transport::server::Connected;

use super::admission::Admitted;
use super::client_cert;
use super::crl_signature;
use crate::config::TlsSettings;
use crate::service::auth::CertIdentity;
use crate::service::http::Peer;
use crate::tls_client::{Cause, NoCertificate};

/// How often a handshake may look at the certificate files' modification times.
pub const RELOAD_CHECK: Duration = Duration::from_secs(1);

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or holds nothing usable.
    #[error("{key} {path}: {source}")]
    File {
        /// The config key naming the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        source: Cause,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// The TLS side of the listeners: one acceptor, shared.
#[derive(Clone)]
pub struct Tls {
    acceptor: tokio_rustls::TlsAcceptor,
    handshake_timeout: Duration,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

impl Tls {
    /// The acceptor of `settings` (`None` when no certificate is configured); handshakes
    /// must finish within `handshake_timeout`.
    pub fn from_settings(
        settings: &TlsSettings,
        handshake_timeout: Duration,
    ) -> Result<Option<Tls>, TlsError> {
        let (Some(cert), Some(key)) = (&settings.cert_file, &settings.key_file) else {
            return Ok(None);
        };
        let provider = Arc::new(crate::tls_provider::ring_provider());
        let pair = {
            let (cert, key, provider) = (cert.clone(), key.clone(), provider.clone());
            move || load_pair(&cert, &key, &provider)
        };
        let files = vec![cert.clone(), key.clone()];
        let resolver = Arc::new(ServerCert(Reloading::new("certificate", files, pair)?));
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;
        let builder = match &settings.client_ca_file {
            Some(ca) => {
                let crl = settings.client_crl_file.clone();
                let files = [Some(ca.clone()), crl.clone()]
                    .into_iter()
                    .flatten()
                    .collect();
                let load = {
                    let ca = ca.clone();
                    move || client_verifier(&ca, crl.as_deref(), provider.clone())
                };
                let verifier = Reloading::new("client CA", files, load)?;
                builder.with_client_cert_verifier(Arc::new(ClientCa(verifier)))
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(resolver);
        if settings.client_ca_file.is_some() {
            // A resumed session is not verified again: without resumption every connection
            // is checked against the client CA in force.
            config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
            config.send_tls13_tickets = 0;
        }
        Ok(Some(Tls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            handshake_timeout,
        }))
    }

    /// The same acceptor offering only `protocol` in ALPN (`h2` for gRPC, `http/1.1` for the
    /// HTTP listeners, which serve HTTP/1.1 only).
    pub fn for_protocol(&self, protocol: &[u8]) -> Tls {
        let mut config = self.acceptor.config().as_ref().clone();
        config.alpn_protocols = vec![protocol.to_vec()];
        Tls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            handshake_timeout: self.handshake_timeout,
        }
    }

    /// Runs the handshake of `io` within the handshake timeout.
    pub async fn accept(&self, io: Admitted) -> io::Result<Conn> {
        let handshake = self.acceptor.accept(io);
        match tokio::time::timeout(self.handshake_timeout, handshake).await {
            Ok(stream) => {
                let stream = stream?;
                // The chain's first certificate is the client's own (verified by now).
                let certificate = stream.get_ref().1.peer_certificates();
                let identity = certificate
                    .and_then(|chain| chain.first())
                    .and_then(|leaf| client_cert::identity(leaf))
                    .map(Arc::new);
                Ok(Conn::Tls(Box::new(stream), identity))
            }
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "TLS handshake longer than kvcm.service.header_timeout_ms",
            )),
        }
    }
}

/// The verifier of client certificates signed by the CA(s) of `ca` and, when `crl` is given,
/// not revoked by its lists. Only the client's own certificate is checked for revocation
/// (against the list of the CA that issued it, which must be there); the CAs themselves are
/// the operator's choice in `ca`.
fn client_verifier(
    ca: &Path,
    crl: Option<&Path>,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let key = "kvcm.tls.client_ca_file";
    let roots = read_roots(key, ca)?;
    let crl_key = "kvcm.tls.client_crl_file";
    let crls = match crl {
        Some(path) => {
            let crls = read_crls(crl_key, path)?;
            check_issuers(
                &crls,
                &roots,
                provider.signature_verification_algorithms.all,
            )
            .map_err(|e| file_error(crl_key, path, e.into()))?
            .warn();
            Some((path, crls))
        }
        None => None,
    };
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
    let Some((crl, crls)) = crls else {
        return builder.build().map_err(|e| file_error(key, ca, e.into()));
    };
    builder
        .with_crls(crls)
        .only_check_end_entity_revocation()
        .build()
        .map_err(|e| match e {
            // Not expected: `check_issuers` decoded every list as rustls does.
            VerifierBuilderError::InvalidCrl(_) => file_error(crl_key, crl, e.into()),
            other => file_error(key, ca, other.into()),
        })
}

/// The CA certificates of the file `path` (of config key `key`), in file order.
fn read_roots(key: &'static str, path: &Path) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in read_certs(key, path)? {
        roots
            .add(cert)
            .map_err(|e| file_error(key, path, e.into()))?;
    }
    Ok(roots)
}

/// Why revocation lists cannot be used.
#[derive(Debug, thiserror::Error)]
enum IssuerError {
    /// A list does not decode.
    #[error("list {0}: {1}")]
    Decode(usize, webpki::Error),
    /// Two lists of one CA that can speak for the same certificates (the verifier would use
    /// the first, however old).
    #[error("lists {0} and {1} are of the same CA and scope: keep only the newest")]
    Duplicate(usize, usize),
    /// A list that the CA it names (CA number `.1` of the client CA file) did not sign.
    #[error("list {0} (of CA {1} in kvcm.tls.client_ca_file): {2}")]
    Signature(usize, usize, String),
}

/// What a CA file and its revocation lists leave uncovered (numbers from 1, in file order).
#[derive(Debug, Default, PartialEq, Eq)]
struct Uncovered {
    /// Lists of a CA that is not in the client CA file (an intermediate's list is fine: the
    /// verifier matches lists to the client certificate's issuer; a leftover of a removed
    /// CA is harmless).
    lists_of_unknown_cas: Vec<usize>,
    /// CAs of the file without a list: a client certificate one of them issues directly is
    /// refused (fine for a root that issues only intermediates, which have lists).
    cas_without_list: Vec<usize>,
}

impl Uncovered {
    fn warn(&self) {
        for list in &self.lists_of_unknown_cas {
            tracing::warn!(list,
                "kvcm.tls.client_crl_file: a revocation list of a CA that is not in kvcm.tls.client_ca_file");
        }
        for ca in &self.cas_without_list {
            tracing::warn!(ca,
                "kvcm.tls.client_ca_file: a CA without a revocation list in kvcm.tls.client_crl_file: client certificates it issues directly are refused (fine for a CA that issues only intermediates with lists)");
        }
    }
}

/// Checks that every list (numbered from 1 in the file) decodes and that no two lists of
/// one CA can both speak for a certificate (same issuing distribution point, or either
/// without one: the verifier would use the first) and that each list of a CA in the file
/// carries that CA's signature; returns the lists and CAs that do not match up (kept: see
/// [`Uncovered`]).
fn check_issuers(
    crls: &[CertificateRevocationListDer<'_>],
    roots: &rustls::RootCertStore,
    algorithms: &[&dyn SignatureVerificationAlgorithm],
) -> Result<Uncovered, IssuerError> {
    let mut scopes: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::with_capacity(crls.len());
    let mut uncovered = Uncovered::default();
    for (index, der) in crls.iter().enumerate() {
        let list = webpki::OwnedCertRevocationList::from_der(der)
            .map_err(|e| IssuerError::Decode(index + 1, e))?;
        let list = webpki::CertRevocationList::from(list);
        let scope = (
            list.issuer().to_vec(),
            list.issuing_distribution_point().map(<[u8]>::to_vec),
        );
        let cas: Vec<usize> = (0..roots.roots.len())
            .filter(|&ca| roots.roots[ca].subject.as_ref() == scope.0)
            .collect();
        if cas.is_empty() {
            uncovered.lists_of_unknown_cas.push(index + 1);
        } else {
            signed_by(der.as_ref(), roots, &cas, algorithms)
                .map_err(|why| IssuerError::Signature(index + 1, cas[0] + 1, why))?;
        }
        let overlaps = |(issuer, point): &(Vec<u8>, Option<Vec<u8>>)| {
            *issuer == scope.0 && (point.is_none() || scope.1.is_none() || *point == scope.1)
        };
        if let Some(first) = scopes.iter().position(overlaps) {
            return Err(IssuerError::Duplicate(first + 1, index + 1));
        }
        scopes.push(scope);
    }
    for (index, root) in roots.roots.iter().enumerate() {
        if !scopes
            .iter()
            .any(|(issuer, _)| root.subject.as_ref() == issuer)
        {
            uncovered.cas_without_list.push(index + 1);
        }
    }
    Ok(uncovered)
}

/// Whether one of the CAs `cas` (indexes into `roots`, all of the list's issuer name: a CA
/// being re-keyed may be there twice) signed the list `crl`, as `algorithms` verify; the
/// first CA's refusal when none did.
fn signed_by(
    crl: &[u8],
    roots: &rustls::RootCertStore,
    cas: &[usize],
    algorithms: &[&dyn SignatureVerificationAlgorithm],
) -> Result<(), String> {
    let key = |ca: usize| roots.roots[ca].subject_public_key_info.as_ref();
    let first = crl_signature::verify(crl, key(cas[0]), algorithms);
    let other_signed = |&ca: &usize| crl_signature::verify(crl, key(ca), algorithms).is_ok();
    match first {
        Err(_) if cas[1..].iter().any(other_signed) => Ok(()),
        first => first,
    }
}

/// A PEM file that holds no certificate revocation list.
#[derive(Debug, thiserror::Error)]
#[error("no PEM certificate revocation list (X509 CRL) in it")]
struct NoRevocationList;

fn read_crls(
    key: &'static str,
    path: &Path,
) -> Result<Vec<CertificateRevocationListDer<'static>>, TlsError> {
    read_pem(key, path, || NoRevocationList.into())
}

fn file_error(key: &'static str, path: &Path, source: Cause) -> TlsError {
    TlsError::File {
        key,
        path: path.to_path_buf(),
        source,
    }
}

fn read_certs(key: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    read_pem(key, path, || NoCertificate.into())
}

/// Every PEM item of type `T` in the file `path` (of config key `key`); none is the error
/// `nothing` gives.
fn read_pem<T: PemObject>(
    key: &'static str,
    path: &Path,
    nothing: impl FnOnce() -> Cause,
) -> Result<Vec<T>, TlsError> {
    let items = T::pem_file_iter(path)
        .and_then(|items| items.collect::<Result<Vec<_>, _>>())
        .map_err(|e| file_error(key, path, e.into()))?;
    if items.is_empty() {
        return Err(file_error(key, path, nothing()));
    }
    Ok(items)
}

/// The certificate and key of the files, as rustls signs with them.
fn load_pair(
    cert: &Path,
    key: &Path,
    provider: &rustls::crypto::CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let chain = read_certs("kvcm.tls.cert_file", cert)?;
    let private = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| file_error("kvcm.tls.key_file", key, e.into()))?;
    CertifiedKey::from_der(chain, private, provider)
        .map_err(|e| file_error("kvcm.tls.key_file", key, e.into()))
}

fn stamp(path: &Path) -> Option<FileStamp> {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.modified().ok()?, metadata.len(), metadata.ino()))
}

/// A value loaded from files, loaded again when one of their modification times changes
/// (looked at, at most once per [`RELOAD_CHECK`]); a load that fails leaves the value in
/// force (logged).
struct Reloading<T: ?Sized> {
    /// What it is, for the log ("certificate", "client CA").
    what: &'static str,
    files: Vec<PathBuf>,
    load: Box<dyn Fn() -> Result<Arc<T>, TlsError> + Send + Sync>,
    state: Mutex<Loaded<T>>,
}

struct Loaded<T: ?Sized> {
    value: Arc<T>,
    /// The files' stamps when `value` was loaded (or last failed to load).
    stamps: Vec<Option<FileStamp>>,
    checked: Instant,
}

/// What tells a file changed: its modification time, length and inode (a rename gives a
/// new inode even within one tick of the clock).
type FileStamp = (SystemTime, u64, u64);

impl<T: ?Sized> std::fmt::Debug for Reloading<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloading")
            .field("what", &self.what)
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl<T: ?Sized> Reloading<T> {
    /// Loads the value once (an error stops the start) and keeps `load` for later.
    fn new<V: Into<Arc<T>>>(
        what: &'static str,
        files: Vec<PathBuf>,
        load: impl Fn() -> Result<V, TlsError> + Send + Sync + 'static,
    ) -> Result<Reloading<T>, TlsError> {
        let load: Box<dyn Fn() -> Result<Arc<T>, TlsError> + Send + Sync> =
            Box::new(move || load().map(Into::into));
        let stamps = files.iter().map(|f| stamp(f)).collect();
        let value = load()?;
        Ok(Reloading {
            what,
            files,
            load,
            state: Mutex::new(Loaded {
                value,
                stamps,
                checked: Instant::now(),
            }),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Loaded<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The value in force. When a check is due and a file changed, this caller loads the
    /// files again, outside the lock (other handshakes meanwhile get the value in force).
    fn current(&self) -> Arc<T> {
        let mut state = self.state();
        if state.checked.elapsed() < RELOAD_CHECK {
            return state.value.clone();
        }
        state.checked = Instant::now();
        let stamps: Vec<_> = self.files.iter().map(|f| stamp(f)).collect();
        if stamps == state.stamps {
            return state.value.clone();
        }
        state.stamps = stamps;
        drop(state);
        match (self.load)() {
            Ok(value) => {
                tracing::info!("TLS {} reloaded from {:?}", self.what, self.files);
                self.state().value = value.clone();
                value
            }
            Err(error) => {
                let what = self.what;
                tracing::warn!("TLS {what} not reloaded, the previous one serves: {error}");
                self.state().value.clone()
            }
        }
    }
}

/// The server certificate in force.
#[derive(Debug)]
struct ServerCert(Reloading<CertifiedKey>);

impl ResolvesServerCert for ServerCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current())
    }
}

/// The client-certificate verifier of the client CA in force. It names no CA in its
/// certificate request (the hints would have to outlive a reload): a client sends the
/// certificate it has.
#[derive(Debug)]
struct ClientCa(Reloading<dyn ClientCertVerifier>);

impl ClientCertVerifier for ClientCa {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.0
            .current()
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.current().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.current().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.current().supported_verify_schemes()
    }
}

/// An accepted connection: plain, or TLS over it.
pub enum Conn {
    /// No TLS configured.
    Plain(Admitted),
    /// After the handshake, with what the client certificate names (mutual TLS).
    Tls(
        Box<tokio_rustls::server::TlsStream<Admitted>>,
        Option<Arc<CertIdentity>>,
    ),
}

impl Conn {
    fn project(self: Pin<&mut Self>) -> Pin<&mut dyn AsyncReadWrite> {
        match self.get_mut() {
            Conn::Plain(io) => Pin::new(io),
            Conn::Tls(io, _) => Pin::new(io.as_mut()),
        }
    }
}

/// Both halves of a stream.
trait AsyncReadWrite: AsyncRead + AsyncWrite + Unpin {}
impl<T: AsyncRead + AsyncWrite + Unpin> AsyncReadWrite for T {}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.project().poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.project().poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().poll_shutdown(cx)
    }
}

impl Connected for Conn {
    type ConnectInfo = Peer;

    fn connect_info(&self) -> Peer {
        let (io, certificate) = match self {
            Conn::Plain(io) => (io, None),
            Conn::Tls(io, identity) => (io.get_ref().0, identity.clone()),
        };
        Peer {
            addr: io.connect_info().remote_addr(),
            certificate,
        }
    }
}

/// Opens a connection: the handshake when `tls` is set, else as it is.
pub async fn open(tls: Option<&Tls>, io: Admitted) -> io::Result<Conn> {
    match tls {
        Some(tls) => tls.accept(io).await,
        None => Ok(Conn::Plain(io)),
    }
}

#[cfg(test)]
mod tests {
    use rcgen::{CertifiedIssuer, KeyPair};

    use super::super::crl_signature::tests::{authority_with, revocation_list_of};
    use super::*;

    fn authority(name: &str) -> CertifiedIssuer<'static, KeyPair> {
        authority_with(name, &rcgen::PKCS_ECDSA_P256_SHA256)
    }

    /// An empty revocation list of `issuer`, in PEM.
    fn revocation_list(issuer: &CertifiedIssuer<'static, KeyPair>, number: u8) -> String {
        revocation_list_of(issuer, number).pem().expect("PEM")
    }

    #[test]
    fn revocation_lists_that_do_not_load_repeat_a_ca_or_lack_its_signature_are_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let (ours, stranger) = (authority("client CA"), authority("another CA"));
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, ours.pem()).expect("write");
        let crl = dir.path().join("revoked.pem");
        let provider = Arc::new(crate::tls_provider::ring_provider());
        let (first, newer) = (revocation_list(&ours, 1), revocation_list(&ours, 2));
        // Another CA of the same name (a re-keyed one) signed this list, not ours.
        let impostor = revocation_list(&authority("client CA"), 3);
        let refused = [
            ("", "no PEM certificate revocation list"),
            ("not a CRL", "no PEM certificate revocation list"),
            (
                "-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n",
                "list 1",
            ),
            (
                &format!("{first}{newer}"),
                "lists 1 and 2 are of the same CA",
            ),
            (
                &impostor,
                "list 1 (of CA 1 in kvcm.tls.client_ca_file): its signature does not verify",
            ),
        ];
        for (text, says) in refused {
            std::fs::write(&crl, text).expect("write");
            let refusal = client_verifier(&ca, Some(&crl), provider.clone()).err();
            let message = refusal.map(|e| e.to_string()).unwrap_or_default();
            assert!(
                message.contains("kvcm.tls.client_crl_file") && message.contains(says),
                "{text:?}: {message:?}"
            );
        }
        // A list of another CA (an intermediate's, a removed CA's) is kept, with a warning.
        let stranger = revocation_list(&stranger, 1);
        std::fs::write(&crl, format!("{newer}{stranger}")).expect("write");
        assert!(client_verifier(&ca, Some(&crl), provider.clone()).is_ok());
        assert!(client_verifier(&ca, None, provider).is_ok());
        // So is a CA without a list (one that issues only intermediates needs none); both
        // are reported, by their numbers in their files.
        let listless = authority("a CA without a list");
        std::fs::write(&ca, format!("{}{}", ours.pem(), listless.pem())).expect("write");
        let roots = read_roots("ca", &ca).expect("CAs");
        let lists = read_crls("crl", &crl).expect("lists");
        let algorithms = crate::tls_provider::ring_provider()
            .signature_verification_algorithms
            .all;
        let uncovered = check_issuers(&lists, &roots, algorithms).expect("usable lists");
        let expected = Uncovered {
            lists_of_unknown_cas: vec![2],
            cas_without_list: vec![2],
        };
        assert_eq!(uncovered, expected);
        // While a CA is re-keyed both certificates may be in the file: a list signed by
        // either loads.
        let rekeyed = authority("client CA");
        let both = format!("{}{}", ours.pem(), rekeyed.pem());
        std::fs::write(&ca, both).expect("write");
        for signer in [&ours, &rekeyed] {
            std::fs::write(&crl, revocation_list(signer, 4)).expect("write");
            let loaded = client_verifier(
                &ca,
                Some(&crl),
                Arc::new(crate::tls_provider::ring_provider()),
            );
            assert!(loaded.is_ok(), "{:?}", loaded.err().map(|e| e.to_string()));
        }
    }
}
