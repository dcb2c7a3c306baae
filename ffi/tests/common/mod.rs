//! Test harness of the ffi tests: a real kvcm server started in-process (as `kvcm serve`
//! does: every port 0, a temp data directory, the lookup path on) on a tokio runtime the
//! harness keeps alive, an instance registered over gRPC, keys written with the Rust
//! client, and the library cargo built for this test run. [`Harness::start_tls`] serves
//! mutual TLS with certificates made here (rcgen) and written as PEM files.

#![allow(dead_code)] // each test binary uses part of the harness

use std::path::{Path, PathBuf};
use std::process::Command;

use kvcm::proto::meta;
use kvcm::proto::meta::meta_service_client::MetaServiceClient;
use kvcm_client::{Client, ClientConfig, ServerAddress, TlsClient, Wire};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use tonic::transport::Channel;

/// A running in-process server; stopped when dropped.
pub struct Harness {
    runtime: tokio::runtime::Runtime,
    server: Option<kvcm::server::RunningServer>,
    /// The server's data directory (its embedded file storage lies below it).
    pub dir: tempfile::TempDir,
    /// `http://127.0.0.1:<port>` of the gRPC listener.
    pub grpc: String,
    /// `127.0.0.1:<port>` of the meta HTTP listener.
    pub http: String,
    /// The API key of a server started by [`Harness::start_with_key`].
    pub api_key: Option<String>,
    /// The client's PEM files of a server started by [`Harness::start_tls`].
    pub tls: Option<TlsFiles>,
    /// The harness's own TLS client (from [`Harness::tls`]).
    tls_client: Option<TlsClient>,
}

/// The files a client of a mutual-TLS harness needs: the CA of the server's certificate
/// (issued for `localhost`), and a certificate of the CA the server trusts for clients,
/// with its key.
pub struct TlsFiles {
    /// The server's CA (PEM).
    pub ca: PathBuf,
    /// The client certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
}

/// A self-signed CA named `name`.
fn authority(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("CA")
}

/// Writes a leaf of `params` signed by `issuer` to `<dir>/<name>.pem` and `<name>.key`.
fn leaf(
    params: CertificateParams,
    issuer: &CertifiedIssuer<'static, KeyPair>,
    dir: &Path,
    name: &str,
) -> (PathBuf, PathBuf) {
    let key = KeyPair::generate().expect("key");
    let cert = params.signed_by(&key, issuer).expect("signed");
    let paths = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    );
    std::fs::write(&paths.0, cert.pem()).expect("write certificate");
    std::fs::write(&paths.1, key.serialize_pem()).expect("write key");
    paths
}

/// Certificates for mutual TLS under `dir`: the server's settings and the client's files.
fn mutual_tls(dir: &Path) -> (kvcm::config::TlsSettings, TlsFiles) {
    let (server_ca, client_ca) = (authority("server CA"), authority("client CA"));
    let names = vec!["localhost".to_string()];
    let server = CertificateParams::new(names).expect("server params");
    let (server_cert, server_key) = leaf(server, &server_ca, dir, "server");
    let mut client = CertificateParams::default();
    client
        .distinguished_name
        .push(rcgen::DnType::CommonName, "engine");
    let (cert, key) = leaf(client, &client_ca, dir, "client");
    let (ca, clients) = (dir.join("ca.pem"), dir.join("clients.pem"));
    std::fs::write(&ca, server_ca.pem()).expect("write CA");
    std::fs::write(&clients, client_ca.pem()).expect("write client CA");
    let settings = kvcm::config::TlsSettings {
        cert_file: Some(server_cert),
        key_file: Some(server_key),
        client_ca_file: Some(clients),
        client_crl_file: None,
        certificate_accounts: false,
    };
    (settings, TlsFiles { ca, cert, key })
}

/// A ROLE_USER account `engine` and a key of it naming `instance`.
fn key_for(manager: &kvcm_manager::Manager, instance: &str) -> String {
    manager
        .add_account(kvcm_manager::Account {
            user_name: "engine".into(),
            password: kvcm_manager::password::StoredPassword::Clear("unused".into()),
            role: kvcm_manager::AccountRole::User,
        })
        .expect("account");
    let request = kvcm_manager::NewApiKey {
        user_name: "engine".into(),
        instances: vec![instance.to_string()],
        expires_ms: 0,
    };
    manager.create_api_key(request).expect("key").1
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            let stopped = self.runtime.block_on(server.stop());
            // A failed stop while unwinding from a failed test would hide the first panic.
            if !std::thread::panicking() {
                stopped.expect("server stops cleanly");
            }
        }
    }
}

impl Harness {
    /// Starts the server.
    pub fn start() -> Harness {
        Self::start_as(None, false)
    }

    /// Starts a server with `kvcm.auth.meta = required` and one ROLE_USER API key naming
    /// `instance` ([`Harness::api_key`]); the harness's own calls carry it.
    pub fn start_with_key(instance: &str) -> Harness {
        Self::start_as(Some(instance), false)
    }

    /// Starts a server with TLS on every listener and client certificates required (mutual
    /// TLS); [`Harness::tls`] names the client's files, [`Harness::grpc`] is `https://`.
    pub fn start_tls() -> Harness {
        Self::start_as(None, true)
    }

    fn start_as(keyed_instance: Option<&str>, tls: bool) -> Harness {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = kvcm::config::ServerConfig {
            rpc_port: 0,
            http_port: 0,
            admin_http_port: 0,
            data_dir: dir.path().to_path_buf(),
            ..Default::default()
        };
        if keyed_instance.is_some() {
            config.security.meta_auth_required = true;
            config.security.admin_tokens = kvcm::config::AdminTokens::parse("harness-root");
        }
        let tls = tls.then(|| {
            let (settings, files) = mutual_tls(dir.path());
            config.security.tls = settings;
            files
        });
        let tls_client = tls.as_ref().map(|files| {
            let identity = Some((files.cert.as_path(), files.key.as_path()));
            TlsClient::from_files(&files.ca, identity, "localhost").expect("TLS client")
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let (server, api_key) = runtime.block_on(async {
            let manager = kvcm::server::embedded_manager(&config).expect("manager");
            let api_key = keyed_instance.map(|instance| key_for(&manager, instance));
            let handlers = kvcm::service::Handlers::new(manager, None);
            let server = kvcm::server::start(&config, handlers)
                .await
                .expect("server starts");
            (server, api_key)
        });
        let port = |name: &str| server.addresses[name].port();
        let scheme = if tls.is_some() { "https" } else { "http" };
        Harness {
            grpc: format!("{scheme}://127.0.0.1:{}", port("grpc")),
            http: format!("127.0.0.1:{}", port("http")),
            api_key,
            tls,
            tls_client,
            runtime,
            server: Some(server),
            dir,
        }
    }

    /// Registers `instance` in group `default` (one spec `tp0` of 1024 bytes) over gRPC.
    pub fn register(&self, instance: &str) {
        let request = meta::RegisterInstanceRequest {
            trace_id: "reg".into(),
            instance_group: "default".into(),
            instance_id: instance.into(),
            block_size: 4,
            location_spec_infos: vec![meta::LocationSpecInfo {
                name: "tp0".into(),
                size: 1024,
            }],
            model_deployment: Some(meta::ModelDeployment {
                model_name: "model".into(),
                dtype: "FP8".into(),
                tp_size: 1,
                ..Default::default()
            }),
            location_spec_groups: Vec::new(),
            default_query_type: 0,
        };
        let mut request = tonic::Request::new(request);
        if let Some(key) = &self.api_key {
            let value = format!("Bearer {key}").parse().expect("metadata");
            request.metadata_mut().insert("authorization", value);
        }
        let mut endpoint = Channel::from_shared(self.grpc.clone()).expect("grpc endpoint");
        if let Some(tls) = &self.tls_client {
            endpoint = endpoint.tls_config(tls.grpc()).expect("grpc TLS");
        }
        let answer = self.runtime.block_on(async {
            let channel = endpoint.connect().await.expect("grpc connect");
            let mut grpc = MetaServiceClient::new(channel);
            grpc.register_instance(request)
                .await
                .expect("register")
                .into_inner()
        });
        let code = answer.header.and_then(|h| h.status).map(|s| s.code);
        assert_eq!(code, Some(meta::ErrorCode::Ok as i32), "RegisterInstance");
    }

    /// A Rust client of `instance` on `wire`.
    pub fn client(&self, instance: &str, wire: Option<Wire>) -> Client {
        Client::connect(ClientConfig {
            servers: vec![ServerAddress {
                grpc: self.grpc.clone(),
                http: self.http.parse().expect("http address"),
            }],
            instance_id: instance.into(),
            wire,
            api_key: self.api_key.clone(),
            tls: self.tls_client.clone(),
        })
        .expect("client connects")
    }

    /// StartWriteCache + FinishWriteCache (every block succeeded) of `keys`.
    pub fn write(&self, instance: &str, keys: &[i64]) {
        let client = self.client(instance, None);
        let started = client
            .start_write(meta::StartWriteCacheRequest {
                trace_id: "write".into(),
                block_keys: keys.to_vec(),
                write_timeout_seconds: 30,
                ..Default::default()
            })
            .expect("StartWriteCache");
        assert_eq!(started.locations.len(), keys.len(), "every key is new");
        let all = meta::block_mask::Info::Offset(started.locations.len() as i32);
        client
            .finish_write(meta::FinishWriteCacheRequest {
                trace_id: "write".into(),
                write_session_id: started.write_session_id,
                success_blocks: Some(meta::BlockMask { info: Some(all) }),
                ..Default::default()
            })
            .expect("FinishWriteCache");
    }
}

/// One line per spec, `location type spec_size name uri`, as the C program prints them.
pub fn lines(locations: &[meta::CacheLocation]) -> Vec<String> {
    let mut out = Vec::new();
    for (i, location) in locations.iter().enumerate() {
        for spec in &location.location_specs {
            out.push(format!(
                "{i} {} {} {} {}",
                location.r#type, location.spec_size, spec.name, spec.uri
            ));
        }
    }
    out
}

/// The URIs of an answer, one per spec.
pub fn uris(locations: &[meta::CacheLocation]) -> Vec<String> {
    let specs = locations.iter().flat_map(|l| &l.location_specs);
    specs.map(|s| s.uri.clone()).collect()
}

/// The shared library cargo built for this test run (next to the test executable); when it
/// is missing (a test binary run by hand), builds it with the cargo that runs the tests.
pub fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let deps = exe.parent().expect("deps directory");
    let candidates = [
        deps.to_path_buf(),
        deps.parent().expect("profile directory").to_path_buf(),
    ];
    if let Some(found) = find_library(&candidates) {
        return found;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "-p", "kvcm-ffi", "--lib"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("run cargo build");
    assert!(status.success(), "cargo build -p kvcm-ffi failed");
    find_library(&candidates).expect("cargo build -p kvcm-ffi made libkvcm_ffi.so")
}

fn find_library(dirs: &[PathBuf]) -> Option<PathBuf> {
    dirs.iter()
        .map(|dir| dir.join("libkvcm_ffi.so"))
        .find(|path| path.is_file())
}

/// Whether a tool the test needs is on PATH: `tool --version` runs.
pub fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success())
}

/// Skips loudly when `tool` is missing; fails instead when `CI=true`. Returns whether the
/// test may go on.
pub fn require_tool(tool: &str, test: &str) -> bool {
    if have(tool) {
        return true;
    }
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    assert!(
        !ci,
        "{test}: {tool} not found, and CI=true forbids skipping"
    );
    eprintln!("*** SKIPPED {test}: {tool} not found ***");
    false
}

/// The repository root of the ffi crate (`ffi/`).
pub fn ffi_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}
