//! TLS and mutual TLS on a real `kvcm serve` (docs/security.md, "TLS"): gRPC and HTTP over
//! TLS, plaintext refused, a renewed certificate or client CA served without a restart (and
//! a broken one ignored), client certificates required and checked against the configured
//! CA and mapped to accounts; kvcm's own clients (Rust client, `kvcm pool`) over TLS.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::{wait_until, TestServer};
use kvcm::proto::meta;
use kvcm::proto::meta::meta_service_client::MetaServiceClient;
use kvcm_client::{
    Client, ClientConfig, GetOutcome, PutOutcome, ServerAddress, TlsClient, TransferConfig,
    TransferEngine, TransferPath, Wire,
};
use rcgen::{
    date_time_ymd, BasicConstraints, CertificateParams, CertificateRevocationListParams,
    CertifiedIssuer, IsCa, KeyIdMethod, KeyPair, RevocationReason, RevokedCertParams, SerialNumber,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// A CA and what it signed.
struct Authority {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, in PEM.
struct Pem {
    cert: String,
    key: String,
}

impl Authority {
    fn new(name: &str) -> Authority {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let issuer =
            CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("CA");
        Authority { issuer }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A leaf for `names` (DNS names or IP addresses), signed by this CA.
    fn sign(&self, names: &[&str]) -> Pem {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        self.signed(CertificateParams::new(names).expect("params"))
    }

    /// A leaf for `name` with serial number `serial`, signed by this CA.
    fn sign_numbered(&self, name: &str, serial: u8) -> Pem {
        let mut params = CertificateParams::new(vec![name.to_string()]).expect("params");
        params.serial_number = Some(SerialNumber::from_slice(&[serial]));
        self.signed(params)
    }

    /// The certificate of `params` with a new key, signed by this CA.
    fn signed(&self, params: CertificateParams) -> Pem {
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("signed");
        Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    /// This CA's revocation list number `number` (PEM), revoking the certificates of serial
    /// numbers `serials`.
    fn revocation_list(&self, number: u8, serials: &[u8]) -> String {
        let revoked_certs = serials
            .iter()
            .map(|serial| RevokedCertParams {
                serial_number: SerialNumber::from_slice(&[*serial]),
                revocation_time: date_time_ymd(2026, 1, 2),
                reason_code: Some(RevocationReason::KeyCompromise),
                invalidity_date: None,
            })
            .collect();
        let params = CertificateRevocationListParams {
            this_update: date_time_ymd(2026, 1, 1),
            next_update: date_time_ymd(2099, 1, 1),
            crl_number: SerialNumber::from_slice(&[number]),
            issuing_distribution_point: None,
            revoked_certs,
            key_identifier_method: KeyIdMethod::Sha256,
        };
        let list = params.signed_by(&self.issuer).expect("CRL");
        list.pem().expect("CRL PEM")
    }
}

impl Authority {
    /// A client certificate of account `common_name` scoped to `instances`
    /// (`urn:kvcm:instance:<id>` URIs), signed by this CA.
    fn sign_client(&self, common_name: &str, instances: &[&str]) -> Pem {
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        params.subject_alt_names = instances
            .iter()
            .map(|id| {
                let uri = format!("urn:kvcm:instance:{id}");
                rcgen::SanType::URI(uri.try_into().expect("IA5 URI"))
            })
            .collect();
        self.signed(params)
    }
}

/// Writes `text` to `path` atomically (a renewal never shows half a file).
fn replace(path: &Path, text: &str) {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, text).expect("write");
    std::fs::rename(&partial, path).expect("rename");
}

/// The server's files: certificate, key and (for mutual TLS) client CA.
struct Files {
    _dir: tempfile::TempDir,
    cert: PathBuf,
    key: PathBuf,
    client_ca: PathBuf,
}

impl Files {
    fn new(server: &Pem, client_ca: &Authority) -> Files {
        let dir = tempfile::tempdir().expect("dir");
        let files = Files {
            cert: dir.path().join("server.pem"),
            key: dir.path().join("server.key"),
            client_ca: dir.path().join("clients.pem"),
            _dir: dir,
        };
        replace(&files.cert, &server.cert);
        replace(&files.key, &server.key);
        replace(&files.client_ca, &client_ca.pem());
        files
    }

    fn settings(&self, mutual: bool) -> Vec<String> {
        let mut settings = vec![
            format!("kvcm.tls.cert_file={}", self.cert.display()),
            format!("kvcm.tls.key_file={}", self.key.display()),
        ];
        if mutual {
            settings.push(format!(
                "kvcm.tls.client_ca_file={}",
                self.client_ca.display()
            ));
        }
        settings
    }
}

async fn start(settings: &[String]) -> TestServer {
    let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
    TestServer::start_with(&settings).await
}

/// A gRPC meta client over TLS trusting `ca`, presenting `identity` when given.
async fn grpc_tls(
    address: SocketAddr,
    ca: &str,
    identity: Option<&Pem>,
) -> Result<MetaServiceClient<Channel>, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    if let Some(pem) = identity {
        tls = tls.identity(Identity::from_pem(&pem.cert, &pem.key));
    }
    let endpoint = Channel::from_shared(format!("https://{address}"))
        .expect("uri")
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5));
    Ok(MetaServiceClient::new(endpoint.connect().await?))
}

/// Whether a meta gRPC call fails on this connection attempt (no channel, or no answer).
async fn grpc_refused(
    channel: Result<MetaServiceClient<Channel>, tonic::transport::Error>,
) -> bool {
    match channel {
        Err(_) => true,
        Ok(mut client) => client
            .get_cluster_info(meta::GetClusterInfoRequest::default())
            .await
            .is_err(),
    }
}

/// GetCacheLocation over HTTPS at `http` (trusting `ca`), as `identity` when given: the status.
async fn lookup_as(http: SocketAddr, ca: &str, identity: Option<&Pem>) -> Result<u16, String> {
    let body = r#"{"instance_id":"none","block_keys":[1]}"#;
    https(http, "POST", "/api/getCacheLocation", body, ca, identity).await
}

fn rustls_client(ca: &str, identity: Option<&Pem>) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(kvcm::tls_provider::ring_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(cert.expect("ca pem")).expect("root");
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots);
    let config = match identity {
        Some(pem) => {
            let chain = CertificateDer::pem_slice_iter(pem.cert.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .expect("chain");
            let key = PrivateKeyDer::from_pem_slice(pem.key.as_bytes()).expect("key");
            builder
                .with_client_auth_cert(chain, key)
                .expect("client cert")
        }
        None => builder.with_no_client_auth(),
    };
    Arc::new(config)
}

/// One HTTP/1.1 request over TLS trusting `ca`: the status, or why the exchange failed.
async fn https(
    address: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    ca: &str,
    identity: Option<&Pem>,
) -> Result<u16, String> {
    let request = Https {
        ca,
        identity,
        bearer: None,
    };
    request
        .send(address, method, path, body)
        .await
        .map(|(status, _)| status)
}

/// What an HTTPS request presents: the CA it trusts, a client certificate, a bearer token.
struct Https<'a> {
    ca: &'a str,
    identity: Option<&'a Pem>,
    bearer: Option<&'a str>,
}

impl Https<'_> {
    /// POSTs `body` to `path` at `address`, which must answer 200 with code OK.
    async fn post_ok(&self, address: SocketAddr, path: &str, body: &str) {
        let answer = self.send(address, "POST", path, body).await;
        assert_eq!(
            answer.map(|(s, b)| (s, json_code(&b))),
            Ok((200, "OK".into())),
            "{path}"
        );
    }

    /// One HTTP/1.1 request: the status and the body, or why the exchange failed.
    async fn send(
        &self,
        address: SocketAddr,
        method: &str,
        path: &str,
        body: &str,
    ) -> Result<(u16, String), String> {
        let (ca, identity) = (self.ca, self.identity);
        let connector = tokio_rustls::TlsConnector::from(rustls_client(ca, identity));
        let tcp = tokio::net::TcpStream::connect(address)
            .await
            .map_err(|e| e.to_string())?;
        let name = ServerName::try_from("localhost").expect("name");
        let mut tls = connector
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())?;
        let authorization = self
            .bearer
            .map(|token| format!("Authorization: Bearer {token}\r\n"))
            .unwrap_or_default();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{authorization}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        tls.write_all(head.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut answer = Vec::new();
        // A peer that closes without close_notify still delivered its answer.
        let _ = tls.read_to_end(&mut answer).await;
        let text = String::from_utf8_lossy(&answer);
        let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok());
        let answer = text
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_string());
        status
            .zip(answer)
            .ok_or_else(|| format!("no HTTP answer: {text:?}"))
    }
}

/// What a listener answers a plaintext HTTP request (within 5 s).
async fn plaintext(address: SocketAddr) -> Vec<u8> {
    let mut tcp = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    let _ = tcp
        .write_all(b"GET /api/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
        .await;
    let mut answer = Vec::new();
    let read = tcp.read_to_end(&mut answer);
    let _ = tokio::time::timeout(Duration::from_secs(5), read).await;
    answer
}

#[tokio::test]
async fn grpc_and_http_speak_tls_only_and_a_renewed_certificate_is_served_without_restart() {
    let (first, second) = (Authority::new("first CA"), Authority::new("second CA"));
    let files = Files::new(&first.sign(&["localhost"]), &first);
    let server = start(&files.settings(false)).await;

    // gRPC over TLS: a real call.
    let mut grpc = grpc_tls(server.address("grpc"), &first.pem(), None)
        .await
        .expect("TLS channel");
    let request = common::registration_grpc("tls-instance", 4);
    let answer = grpc
        .register_instance(request)
        .await
        .expect("call")
        .into_inner();
    assert_eq!(common::grpc_code(&answer.header), meta::ErrorCode::Ok);
    // Plaintext gRPC gets no answer.
    let plain = MetaServiceClient::connect(format!("http://{}", server.address("grpc"))).await;
    assert!(grpc_refused(plain).await, "plaintext gRPC is refused");

    // Every HTTP listener over TLS; plaintext HTTP gets no HTTP answer.
    let body = r#"{"instance_id":"tls-instance","block_keys":[1]}"#;
    for (listener, method, path) in [
        ("http", "POST", "/api/getCacheLocation"),
        ("admin_http", "GET", "/api/healthy"),
        ("debug_http", "POST", "/api/clearFaults"),
    ] {
        let address = server.address(listener);
        let status = https(address, method, path, body, &first.pem(), None).await;
        assert_eq!(status, Ok(200), "{listener} over TLS");
        let answer = plaintext(address).await;
        assert!(
            !answer.starts_with(b"HTTP/"),
            "{listener}: plaintext answered"
        );
    }
    // A client that trusts another CA fails the handshake.
    let http = server.address("http");
    let second_pem = second.pem();
    let trusting_second = || {
        https(
            http,
            "POST",
            "/api/getCacheLocation",
            body,
            &second_pem,
            None,
        )
    };
    let untrusting = trusting_second().await;
    assert!(untrusting.is_err(), "{untrusting:?}");

    // Renewal: a certificate of the second CA replaces the first, no restart.
    let renewed = second.sign(&["localhost"]);
    replace(&files.key, &renewed.key);
    replace(&files.cert, &renewed.cert);
    let served = wait_until(Duration::from_secs(10), async || {
        trusting_second().await.ok().filter(|status| *status == 200)
    })
    .await;
    assert_eq!(served, Some(200), "the renewed certificate is served");
    // A broken renewal is refused and the one in force keeps serving.
    replace(&files.cert, "not a certificate");
    let warned = wait_until(Duration::from_secs(10), async || {
        // Each handshake lets the server look at the files again.
        let _ = trusting_second().await;
        server
            .log()
            .contains("TLS certificate not reloaded")
            .then_some(())
    })
    .await;
    assert!(warned.is_some(), "{}", server.log());
    let status = trusting_second().await;
    assert_eq!(status, Ok(200), "the previous certificate still serves");
}

#[tokio::test]
async fn mutual_tls_demands_a_client_certificate_of_the_configured_ca() {
    let (ours, rogue) = (Authority::new("client CA"), Authority::new("rogue CA"));
    let server_ca = Authority::new("server CA");
    let files = Files::new(&server_ca.sign(&["localhost"]), &ours);
    let server = start(&files.settings(true)).await;
    let (engine, impostor) = (ours.sign(&["engine-1"]), rogue.sign(&["engine-1"]));
    let http = server.address("http");
    let server_ca_pem = server_ca.pem();
    let call = |identity| lookup_as(http, &server_ca_pem, identity);
    assert_eq!(
        call(Some(&engine)).await,
        Ok(200),
        "a certificate of the client CA"
    );
    assert!(call(None).await.is_err(), "no client certificate");
    assert!(
        call(Some(&impostor)).await.is_err(),
        "a certificate of another CA"
    );

    let grpc = server.address("grpc");
    let mut client = grpc_tls(grpc, &server_ca.pem(), Some(&engine))
        .await
        .expect("mTLS channel");
    let registered = client
        .register_instance(common::registration_grpc("mtls", 4))
        .await
        .expect("call")
        .into_inner();
    assert_eq!(common::grpc_code(&registered.header), meta::ErrorCode::Ok);
    let anonymous = grpc_tls(grpc, &server_ca.pem(), None).await;
    assert!(
        grpc_refused(anonymous).await,
        "gRPC without a client certificate is refused"
    );

    // A new client CA replaces the old one without a restart.
    let renewed = Authority::new("renewed client CA");
    replace(&files.client_ca, &renewed.pem());
    let newcomer = renewed.sign(&["engine-2"]);
    let accepted = wait_until(Duration::from_secs(10), async || {
        (call(Some(&newcomer)).await == Ok(200)).then_some(())
    })
    .await;
    assert!(accepted.is_some(), "a certificate of the new client CA");
    assert!(
        call(Some(&engine)).await.is_err(),
        "a certificate of the replaced CA"
    );
    // A broken CA file is ignored: the new CA stays in force.
    replace(&files.client_ca, "not a CA");
    let warned = wait_until(Duration::from_secs(10), async || {
        let _ = call(Some(&newcomer)).await;
        server
            .log()
            .contains("TLS client CA not reloaded")
            .then_some(())
    })
    .await;
    assert!(warned.is_some(), "{}", server.log());
    assert_eq!(call(Some(&newcomer)).await, Ok(200));
}

#[tokio::test]
async fn a_revoked_client_certificate_is_refused_and_a_new_revocation_list_applies_at_once() {
    let (ours, partner) = (Authority::new("client CA"), Authority::new("partner CA"));
    let server_ca = Authority::new("server CA");
    let files = Files::new(&server_ca.sign(&["localhost"]), &ours);
    // Two client CAs; revocation lists of the first only.
    replace(
        &files.client_ca,
        &format!("{}{}", ours.pem(), partner.pem()),
    );
    let crl = files.client_ca.with_file_name("revoked.pem");
    replace(&crl, &ours.revocation_list(1, &[2]));
    let mut settings = files.settings(true);
    settings.push(format!("kvcm.tls.client_crl_file={}", crl.display()));
    let server = start(&settings).await;
    let (kept, revoked) = (
        ours.sign_numbered("engine-1", 1),
        ours.sign_numbered("engine-2", 2),
    );
    let http = server.address("http");
    let server_ca_pem = server_ca.pem();
    let call = |identity| lookup_as(http, &server_ca_pem, identity);
    assert_eq!(
        call(Some(&kept)).await,
        Ok(200),
        "a certificate not revoked"
    );
    assert!(call(Some(&revoked)).await.is_err(), "a revoked certificate");
    let stranger = partner.sign_numbered("engine-3", 3);
    assert!(
        call(Some(&stranger)).await.is_err(),
        "a certificate of a CA without a revocation list: its status is unknown"
    );
    let grpc = server.address("grpc");
    let channel = grpc_tls(grpc, &server_ca.pem(), Some(&revoked)).await;
    assert!(
        grpc_refused(channel).await,
        "gRPC with a revoked certificate is refused"
    );

    // A newer list that revokes the other one too applies without a restart.
    replace(&crl, &ours.revocation_list(2, &[1, 2]));
    let applied = wait_until(Duration::from_secs(10), async || {
        call(Some(&kept)).await.is_err().then_some(())
    })
    .await;
    assert!(applied.is_some(), "the newer revocation list is in force");
    // A broken list, or a newer one appended to the old (the verifier would use the first
    // of a CA's lists), is not loaded: the list in force stays.
    let appended = format!(
        "{}{}",
        ours.revocation_list(2, &[1, 2]),
        ours.revocation_list(3, &[])
    );
    for (refusals, text) in [(1, appended.as_str()), (2, "not a CRL")] {
        replace(&crl, text);
        let warned = wait_until(Duration::from_secs(10), async || {
            let _ = call(Some(&kept)).await;
            let log = server.log();
            (log.matches("TLS client CA not reloaded").count() >= refusals).then_some(())
        })
        .await;
        assert!(warned.is_some(), "{}", server.log());
        assert!(call(Some(&kept)).await.is_err(), "still revoked");
    }
    replace(&crl, &ours.revocation_list(3, &[]));
    let restored = wait_until(Duration::from_secs(10), async || {
        (call(Some(&kept)).await == Ok(200)).then_some(())
    })
    .await;
    assert!(restored.is_some(), "an empty list revokes nothing");
    // A CA taken out of the client CA file is untrusted at once, its list left behind.
    replace(&files.client_ca, &partner.pem());
    let untrusted = wait_until(Duration::from_secs(10), async || {
        call(Some(&kept)).await.is_err().then_some(())
    })
    .await;
    assert!(untrusted.is_some(), "{}", server.log());
}

/// The `header.status.code` of a JSON answer.
fn json_code(body: &str) -> String {
    let answer: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    answer["header"]["status"]["code"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

#[tokio::test]
async fn a_client_certificate_acts_as_the_account_it_names_on_the_instances_it_names() {
    let secured = Secured::start().await; // `eng` registered `mine` with its certificate
    let (server, clients, ca) = (&secured.server, &secured.clients, &secured.server_ca);
    let admin = server.address("admin_http");
    let body = r#"{"user_name":"ops","password":"pw","role":"ROLE_OPERATOR"}"#;
    secured
        .as_root()
        .post_ok(admin, "/api/addAccount", body)
        .await;

    let (engine, as_engine) = (&secured.engine, secured.as_engine());
    let http = server.address("http");
    let register = |id: &str| common::registration(id, 4).to_string();
    let theirs = as_engine
        .send(http, "POST", "/api/registerInstance", &register("theirs"))
        .await
        .expect("answer");
    assert_eq!(
        theirs.0, 403,
        "an instance the certificate does not name: {theirs:?}"
    );
    assert!(theirs.1.contains("theirs"), "{theirs:?}");
    // The operator's certificate (no instance named) may register any instance, but not
    // add accounts (the root token sent with the engine's certificate did).
    let operator = clients.sign_client("ops", &[]);
    let as_operator = Https {
        ca,
        identity: Some(&operator),
        bearer: None,
    };
    let body = r#"{"user_name":"x","password":"pw","role":"ROLE_USER"}"#;
    let forbidden = as_operator
        .send(admin, "POST", "/api/addAccount", body)
        .await;
    assert_eq!(forbidden.map(|(status, _)| status), Ok(403));
    let theirs = as_operator
        .send(http, "POST", "/api/registerInstance", &register("theirs"))
        .await;
    assert_eq!(
        theirs.map(|(s, b)| (s, json_code(&b))),
        Ok((200, "OK".into()))
    );

    // The lookup bootstrap admits the certificate for its instance only.
    let bootstrap = |id: &str| format!(r#"{{"instance_id":"{id}"}}"#);
    let route = "/kvcm/v1/lookupBootstrap";
    let admitted = as_engine
        .send(http, "POST", route, &bootstrap("mine"))
        .await;
    assert_eq!(admitted.map(|(status, _)| status), Ok(200));
    let refused = as_engine
        .send(http, "POST", route, &bootstrap("theirs"))
        .await;
    assert_eq!(refused.map(|(status, _)| status), Ok(403));

    // gRPC: the same identity, the same scope.
    let grpc = server.address("grpc");
    let mut client = grpc_tls(grpc, ca, Some(engine)).await.expect("mTLS");
    let lookup = |id: &str| meta::GetCacheLocationRequest {
        instance_id: id.to_string(),
        query_type: meta::QueryType::QtPrefixMatch as i32,
        block_keys: vec![1],
        ..Default::default()
    };
    let answer = client
        .get_cache_location(lookup("mine"))
        .await
        .expect("call");
    assert_eq!(
        common::grpc_code(&answer.into_inner().header),
        meta::ErrorCode::Ok
    );
    let denied = client
        .get_cache_location(lookup("theirs"))
        .await
        .unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");

    // No account of that name, or a ROLE_USER certificate naming no instance: 401.
    for (who, pem) in [
        ("unknown account", clients.sign_client("ghost", &["mine"])),
        ("unscoped user", clients.sign_client("eng", &[])),
    ] {
        let caller = Https {
            ca,
            identity: Some(&pem),
            bearer: None,
        };
        let refused = caller
            .send(http, "POST", "/api/registerInstance", &register("mine"))
            .await;
        assert_eq!(refused.map(|(status, _)| status), Ok(401), "{who}");
        let mut client = grpc_tls(grpc, ca, Some(&pem)).await.expect("mTLS");
        let refused = client.get_cache_location(lookup("mine")).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{who}");
    }

    // A ROLE_USER certificate may not call admin RPCs; deleting its account stops it.
    let forbidden = as_engine
        .send(admin, "POST", "/api/listStorage", "{}")
        .await;
    assert_eq!(forbidden.map(|(status, _)| status), Ok(403));
    let deleted = secured
        .as_root()
        .send(
            admin,
            "POST",
            "/api/deleteAccount",
            r#"{"user_name":"eng"}"#,
        )
        .await
        .expect("deleteAccount");
    assert_eq!(deleted.0, 200, "{deleted:?}");
    let after = as_engine
        .send(http, "POST", "/api/registerInstance", &register("mine"))
        .await;
    assert_eq!(
        after.map(|(status, _)| status),
        Ok(401),
        "a deleted account"
    );
}

/// The admin token of [`Secured`].
const ROOT: &str = "root-token";

/// A server with mutual TLS whose client certificates name accounts, meta auth required,
/// the admin token [`ROOT`], the ROLE_USER account `eng` and its instance `mine`: the
/// server, its CA's PEM, the client CA and the engine's certificate (scoped to `mine`).
struct Secured {
    server: TestServer,
    _files: Files,
    server_ca: String,
    clients: Authority,
    engine: Pem,
}

impl Secured {
    async fn start() -> Secured {
        Secured::start_with(&[]).await
    }

    /// [`Secured::start`] with `extra` settings.
    async fn start_with(extra: &[&str]) -> Secured {
        let (clients, server_ca) = (Authority::new("client CA"), Authority::new("server CA"));
        let files = Files::new(&server_ca.sign(&["localhost"]), &clients);
        let mut settings = files.settings(true);
        settings.extend([
            "kvcm.tls.client_identity=account".to_string(),
            "kvcm.auth.meta=required".to_string(),
            format!("kvcm.service.admin_auth_token={ROOT}"),
        ]);
        settings.extend(extra.iter().map(|setting| setting.to_string()));
        let server = start(&settings).await;
        let secured = Secured {
            server,
            _files: files,
            server_ca: server_ca.pem(),
            engine: clients.sign_client("eng", &["mine"]),
            clients,
        };
        let body = r#"{"user_name":"eng","password":"pw","role":"ROLE_USER"}"#;
        secured
            .as_root()
            .post_ok(
                secured.server.address("admin_http"),
                "/api/addAccount",
                body,
            )
            .await;
        let registration = common::registration("mine", 4).to_string();
        let http = secured.server.address("http");
        let registered = secured
            .as_engine()
            .send(http, "POST", "/api/registerInstance", &registration)
            .await;
        assert_eq!(
            registered.map(|(s, b)| (s, json_code(&b))),
            Ok((200, "OK".into()))
        );
        secured
    }

    fn as_root(&self) -> Https<'_> {
        Https {
            ca: &self.server_ca,
            identity: Some(&self.engine),
            bearer: Some(ROOT),
        }
    }

    fn as_engine(&self) -> Https<'_> {
        Https {
            ca: &self.server_ca,
            identity: Some(&self.engine),
            bearer: None,
        }
    }

    /// The Rust client's view of the server, over TLS (`tls`) or not.
    fn client_config(&self, tls: Option<TlsClient>) -> ClientConfig {
        let scheme = if tls.is_some() { "https" } else { "http" };
        ClientConfig {
            servers: vec![ServerAddress {
                grpc: format!("{scheme}://{}", self.server.address("grpc")),
                http: self.server.address("http"),
            }],
            instance_id: "mine".into(),
            wire: Some(Wire::Tcp),
            api_key: None,
            tls,
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_rust_client_speaks_tls_and_its_certificate_is_its_credential() {
    let secured = Secured::start().await;
    let tls = TlsClient::from_pem(
        &secured.server_ca,
        Some((&secured.engine.cert, &secured.engine.key)),
        "localhost",
    )
    .expect("TLS client");
    let config = secured.client_config(Some(tls.clone()));
    let plain = secured.client_config(None);
    let mut mismatched = secured.client_config(Some(tls));
    mismatched.servers[0].grpc = format!("http://{}", secured.server.address("grpc"));
    tokio::task::spawn_blocking(move || {
        let client = Client::connect(config).expect("client");
        assert!(
            client.fast_path_up(),
            "the bootstrap admitted the certificate over TLS"
        );
        let start = client
            .start_write(meta::StartWriteCacheRequest {
                block_keys: vec![11, 12],
                write_timeout_seconds: 30,
                ..Default::default()
            })
            .expect("StartWriteCache");
        client
            .finish_write(meta::FinishWriteCacheRequest {
                write_session_id: start.write_session_id,
                success_blocks: Some(meta::BlockMask {
                    info: Some(meta::block_mask::Info::Offset(2)),
                }),
                ..Default::default()
            })
            .expect("FinishWriteCache");
        let hits = client.prefix_match(&[11, 12, 13]).expect("lookup");
        assert_eq!(
            hits.len(),
            2,
            "both committed blocks are found on the fast path"
        );
        // The queue pair carries no certificate: its write messages are refused unapplied
        // and the writes went over gRPC, which the certificate authenticates.
        assert_eq!(client.metrics().writes_by_message, 0);

        // Plaintext towards a TLS server reaches nothing; a gRPC address whose scheme
        // contradicts the TLS setting is refused before anything is sent.
        let plain = Client::connect(plain).expect("client");
        assert!(!plain.fast_path_up());
        let refused = plain.prefix_match(&[11]).unwrap_err();
        assert!(
            matches!(refused, kvcm_client::ClientError::Unreachable(_)),
            "{refused:?}"
        );
        let refused = Client::connect(mismatched).unwrap_err();
        assert!(refused.to_string().contains("https://"), "{refused}");
    })
    .await
    .expect("client thread");
}

/// The embedded pool node joins its own server in the process, so TLS, mutual TLS and meta
/// auth on the server's listeners do not keep it out; it demands tickets like any node, and
/// an engine whose certificate names an instance of the default group puts blocks into it
/// and gets them back, byte-exact, while the admin token (which the node used to present)
/// is rotated away.
#[tokio::test(flavor = "multi_thread")]
async fn the_embedded_pool_node_serves_a_tls_server_under_meta_auth() {
    let secured = Secured::start_with(&["kvcm.pool.size=4M", "kvcm.pool.heartbeat_ms=50"]).await;
    let http = secured.server.address("http");
    let body = r#"{"storage":"default_pool"}"#;
    // The node joins on a thread of its own: wait for the directory to list it live.
    let node = wait_until(Duration::from_secs(20), async || {
        let (status, answer) = secured
            .as_engine()
            .send(http, "POST", kvcm::pool::NODES_ROUTE, body)
            .await
            .ok()?;
        let answer: serde_json::Value = serde_json::from_str(&answer).ok()?;
        let node = answer["nodes"][0].clone();
        (status == 200 && node["live"] == true).then_some(node)
    })
    .await
    .expect("the embedded node is listed live over TLS");
    assert!(node["ticket"].is_string(), "tickets are in force: {node}");
    // Rotate the only admin token: the embedded node shows none, so its heartbeats go on.
    let rotate = r#"{"tokens":["another-root-token"]}"#;
    let admin = secured.server.address("admin_http");
    let (status, answer) = secured
        .as_root()
        .send(admin, "POST", "/api/setAdminAuthTokens", rotate)
        .await
        .expect("rotate");
    assert_eq!((status, json_code(&answer)), (200, "OK".into()), "{answer}");

    let tls = TlsClient::from_pem(
        &secured.server_ca,
        Some((&secured.engine.cert, &secured.engine.key)),
        "localhost",
    )
    .expect("TLS client");
    let config = secured.client_config(Some(tls));
    tokio::task::spawn_blocking(move || {
        let mut engine =
            TransferEngine::connect(config, TransferConfig::default()).expect("engine");
        let keys: Vec<i64> = (1..=8).collect();
        let data: Vec<Vec<u8>> = keys.iter().map(|&k| vec![k as u8; 1024]).collect();
        let blocks: Vec<Vec<&[u8]>> = data.iter().map(|d| vec![d.as_slice()]).collect();
        let put = engine.put_blocks(&keys, &blocks).expect("put_blocks");
        assert!(
            put.iter()
                .all(|o| *o == PutOutcome::Written(TransferPath::PoolSoftTcp)),
            "{put:?}"
        );
        // Past several heartbeats after the rotation: the node is still live and serving.
        std::thread::sleep(Duration::from_millis(300));
        let mut back = vec![vec![0u8; 1024]; keys.len()];
        let mut blocks: Vec<Vec<&mut [u8]>> =
            back.iter_mut().map(|b| vec![b.as_mut_slice()]).collect();
        let got = engine.get_blocks(&keys, &mut blocks).expect("get_blocks");
        drop(blocks);
        assert!(
            got.iter()
                .all(|o| *o == GetOutcome::Hit(TransferPath::PoolSoftTcp)),
            "{got:?}"
        );
        assert_eq!(back, data, "the blocks come back byte-exact");
    })
    .await
    .expect("engine thread");
}

#[tokio::test]
async fn a_pool_node_joins_a_tls_server_with_its_certificate() {
    let secured = Secured::start().await;
    let dir = tempfile::tempdir().expect("dir");
    let node = secured.clients.sign_client("pool-node", &[]);
    let (ca, cert, key) = (
        dir.path().join("ca.pem"),
        dir.path().join("node.pem"),
        dir.path().join("node.key"),
    );
    replace(&ca, &secured.server_ca);
    replace(&cert, &node.cert);
    replace(&key, &node.key);
    let storage = r#"{"storage":{"global_unique_name":"pool_a","tair_mem_pool":{"domain":"test","timeout":100}}}"#;
    let admin = secured.server.address("admin_http");
    secured
        .as_root()
        .post_ok(admin, "/api/addStorage", storage)
        .await;
    // Membership needs an operator under `kvcm.auth.meta = required`: the certificate's
    // account is one.
    let operator = r#"{"user_name":"pool-node","password":"pw","role":"ROLE_OPERATOR"}"#;
    secured
        .as_root()
        .post_ok(admin, "/api/addAccount", operator)
        .await;
    let pool = |extra: &[&std::ffi::OsStr]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_kvcm"))
            .args([
                "pool",
                "--size",
                "1M",
                "--listen",
                "127.0.0.1:0",
                "--node-id",
                "n1",
            ])
            .args(["--storage", "pool_a"])
            .arg("--server")
            .arg(secured.server.address("http").to_string())
            .args(extra)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn kvcm pool")
    };
    let mut child = pool(&[
        "--tls-ca".as_ref(),
        ca.as_os_str(),
        "--tls-cert".as_ref(),
        cert.as_os_str(),
        "--tls-key".as_ref(),
        key.as_os_str(),
    ]);
    let http = secured.server.address("http");
    let route = kvcm::pool::NODES_ROUTE;
    let body = r#"{"storage":"pool_a"}"#;
    // The directory as root: the engine's certificate names an instance whose group does
    // not use pool_a, so the directory would refuse it that pool.
    let joined = wait_until(Duration::from_secs(20), async || {
        let (status, answer) = secured
            .as_root()
            .send(http, "POST", route, body)
            .await
            .ok()?;
        let answer: serde_json::Value = serde_json::from_str(&answer).ok()?;
        let live = answer["nodes"]
            .as_array()?
            .iter()
            .any(|n| n["node_id"] == "n1" && n["live"] == true);
        (status == 200 && live).then_some(())
    })
    .await;
    let _ = child.kill();
    let _ = child.wait();
    assert!(joined.is_some(), "the node joined over mutual TLS");

    // A key file that does not exist: the start fails naming the flags.
    let missing = dir.path().join("missing.key");
    let output = pool(&[
        "--tls-ca".as_ref(),
        ca.as_os_str(),
        "--tls-cert".as_ref(),
        cert.as_os_str(),
        "--tls-key".as_ref(),
        missing.as_os_str(),
    ])
    .wait_with_output()
    .expect("kvcm pool");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--tls-key") && stderr.contains("missing.key"),
        "{stderr}"
    );
}

#[tokio::test]
async fn without_client_identity_a_certificate_is_no_credential() {
    let (clients, server_ca) = (Authority::new("client CA"), Authority::new("server CA"));
    let files = Files::new(&server_ca.sign(&["localhost"]), &clients);
    let mut settings = files.settings(true);
    settings.extend([
        "kvcm.auth.meta=required".to_string(),
        format!("kvcm.service.admin_auth_token={ROOT}"),
    ]);
    let server = start(&settings).await;
    let ca = server_ca.pem();
    let engine = clients.sign_client("eng", &["mine"]);
    let body = r#"{"user_name":"eng","password":"pw","role":"ROLE_USER"}"#;
    let as_root = Https {
        ca: &ca,
        identity: Some(&engine),
        bearer: Some(ROOT),
    };
    as_root
        .post_ok(server.address("admin_http"), "/api/addAccount", body)
        .await;
    let as_engine = Https {
        bearer: None,
        ..as_root
    };
    let registration = common::registration("mine", 4).to_string();
    let http = server.address("http");
    let refused = as_engine
        .send(http, "POST", "/api/registerInstance", &registration)
        .await;
    assert_eq!(
        refused.map(|(status, _)| status),
        Ok(401),
        "kvcm.tls.client_identity is none"
    );
}
