//! The listeners of one server and their shutdown.
//!
//! Invariants (docs/security.md): meta gRPC and meta HTTP bind `kvcm.service.bind_host`
//! (default every interface); admin HTTP, debug HTTP and a separate admin gRPC bind it too,
//! or loopback while no admin token is configured; admin and debug HTTP sit behind the
//! token middleware, Admin and Debug gRPC behind the gate; every listener accepts through
//! its own connection budget with the idle timeout ([`super::admission`]).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::StreamExt;
use tonic::transport::Server;

use super::admission::{self, Admission, AdmittedListener};
use super::tls::{self, Conn, Tls};
use super::ServerError;
use crate::config::ServerConfig;
use crate::lookup::{self, LookupService};
use crate::pool::{self, PoolNode};
use crate::proto::admin::admin_service_server::AdminServiceServer;
use crate::proto::debug::debug_service_server::DebugServiceServer;
use crate::proto::meta::meta_service_server::MetaServiceServer;
use crate::service::auth::GrpcGate;
use crate::service::rpcs::Service;
use crate::service::{http, Handlers};
use std::sync::Arc;

/// A started server.
#[derive(Debug)]
pub struct RunningServer {
    /// Listener name → bound address.
    pub addresses: BTreeMap<&'static str, SocketAddr>,
    /// The handlers (shared with every listener).
    pub handlers: Handlers,
    /// The lookup path's server side, when enabled.
    pub lookup: Option<Arc<LookupService>>,
    /// The embedded pool node (`kvcm.pool.size`).
    pub pool_node: Option<PoolNode>,
    stop: watch::Sender<bool>,
    tasks: Vec<(&'static str, JoinHandle<Result<(), String>>)>,
    /// Connections per listener and their idle timeout.
    connections: (usize, Duration),
    /// How long an HTTP request head may take (`kvcm.service.header_timeout_ms`); a TLS
    /// handshake too.
    header_timeout: Duration,
    /// TLS on every listener (`kvcm.tls.*`), when configured.
    tls: Option<Tls>,
}

impl RunningServer {
    /// Resigns leadership (releasing the lock for the other nodes), stops every listener
    /// (in-flight requests finish) and waits for them, then stops the embedded pool node
    /// (its heartbeats call the manager directly, so they would outlive the listeners).
    pub async fn stop(self) -> Result<(), ServerError> {
        self.handlers.core.manager.leadership().resign();
        // Receivers live as long as the tasks; a send error only means they all ended.
        let _ = self.stop.send(true);
        for (name, task) in self.tasks {
            let outcome = task.await.map_err(|e| e.to_string()).and_then(|r| r);
            outcome.map_err(|reason| ServerError::Serve { name, reason })?;
        }
        drop(self.pool_node);
        Ok(())
    }
}

/// One listener to bind: its name, address and port.
#[derive(Debug, Clone, Copy)]
struct Listen {
    name: &'static str,
    host: IpAddr,
    port: u16,
}

impl Listen {
    fn new(name: &'static str, host: IpAddr, port: u16) -> Listen {
        Listen { name, host, port }
    }

    async fn bind(self) -> Result<TcpListener, ServerError> {
        let Listen { name, host, port } = self;
        TcpListener::bind((host, port))
            .await
            .map_err(|source| ServerError::Bind { name, port, source })
    }
}

/// Connections each listener may hold (below the descriptor limit) and their idle timeout.
fn connection_budget(config: &ServerConfig) -> (usize, Duration) {
    let wanted = config.security.connections.per_listener;
    let listeners =
        3 + usize::from(!config.admin_rpc_shared()) + usize::from(config.enable_debug_service);
    let descriptors = admission::descriptor_limit();
    let budget = admission::per_listener_budget(wanted, listeners, descriptors);
    if budget < wanted {
        tracing::warn!(
            "kvcm.service.max_connections_per_listener lowered from {wanted} to {budget}: \
             {listeners} listeners share a limit of {descriptors:?} descriptors"
        );
    }
    let idle = Duration::from_millis(config.security.connections.idle_timeout_ms);
    (budget, idle)
}

/// Says at start how admin and debug are protected (never which tokens).
fn announce_security(config: &ServerConfig) {
    let security = &config.security;
    let tokens = security.admin_tokens.as_slice().len();
    if tokens == 0 {
        tracing::warn!(
            "kvcm.service.admin_auth_token is not set: admin and debug HTTP accept every request"
        );
    } else {
        let grpc = if security.admin_auth_grpc {
            "and gRPC "
        } else {
            ""
        };
        tracing::info!("admin and debug HTTP {grpc}demand one of {tokens} bearer tokens");
    }
    if security.admin_loopback_only() {
        tracing::warn!(
            "admin and debug listeners bind {} only (no kvcm.service.admin_auth_token, no \
             kvcm.service.bind_host); set either to serve them on every interface",
            security.admin_host()
        );
    }
}

async fn stopped(mut stop: watch::Receiver<bool>) {
    // An error means the sender is gone: stop as well.
    let _ = stop.wait_for(|&stop| stop).await;
}

/// The accepted connections of `listener` with Nagle off (small request/response pairs
/// must never wait for delayed ACKs).
pub fn nodelay_incoming(
    listener: TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    TcpListenerStream::new(listener).map(|stream| {
        if let Ok(stream) = &stream {
            let _ = stream.set_nodelay(true);
        }
        stream
    })
}

/// Shortest interval between two reaper rounds.
const MIN_REAP: std::time::Duration = std::time::Duration::from_millis(5);

/// The embedded pool node: its soft NIC and listener on the lookup bind address (and its
/// region on the lookup path's RDMA device, when one is set), joining through this
/// server's `registrar` directly (no HTTP: TLS and credentials do not apply to it).
fn start_embedded_pool(
    config: &ServerConfig,
    registrar: pool::Registrar,
) -> Result<PoolNode, ServerError> {
    let listen = SocketAddr::new(config.lookup.bind, 0);
    let joining = pool::Joining {
        storage: super::DEFAULT_POOL.to_string(),
        channel: pool::Channel::InProcess(registrar),
    };
    let verbs = config.lookup.verbs();
    let spec = pool::RegionSpec {
        size: config.pool.embedded_size,
        huge_pages: pool::HugePages::Auto,
        prefault: config.pool.embedded_prefault,
    };
    let node = PoolNode::start(spec, listen, None, joining, verbs.as_ref())
        .map_err(|e| ServerError::Pool(e.to_string()))?;
    tracing::info!(
        "embedded pool node: {} bytes, queue pairs on {}",
        config.pool.embedded_size,
        node.listen_addr()
    );
    Ok(node)
}

/// Binds and serves every listener of `config` with these handlers.
pub async fn start(
    config: &ServerConfig,
    handlers: Handlers,
) -> Result<RunningServer, ServerError> {
    let (stop, stop_rx) = watch::channel(false);
    let header_timeout = Duration::from_millis(config.security.connections.header_timeout_ms);
    let mut server = RunningServer {
        addresses: BTreeMap::new(),
        handlers: handlers.clone(),
        lookup: None,
        pool_node: None,
        stop,
        tasks: Vec::new(),
        connections: connection_budget(config),
        header_timeout,
        tls: Tls::from_settings(&config.security.tls, header_timeout)?,
    };
    for key in &config.ignored_keys {
        tracing::warn!(key = %key, "ignoring a config key kvcm does not use");
    }
    let limit = http::HttpLimits {
        max_body_bytes: config.http_max_body_bytes,
        body_timeout: Duration::from_millis(config.security.connections.body_timeout_ms),
    };
    let debug = config.enable_debug_service;
    let security = &config.security;
    let auth = handlers.core.auth.clone();
    auth.replace(security.admin_tokens.as_slice().iter().cloned());
    auth.require_meta(security.meta_auth_required);
    auth.accept_certificates(security.tls.certificate_accounts);
    announce_security(config);
    let (meta_host, admin_host) = (security.meta_host(), security.admin_host());

    let shared = config.admin_rpc_shared();
    let access = &handlers.core.access;
    let gate = |service| GrpcGate::new(&auth, security.admin_auth_grpc, service, access.clone());
    let admin_service =
        || AdminServiceServer::with_interceptor(handlers.admin.clone(), gate(Service::Admin));
    let debug_service =
        || DebugServiceServer::with_interceptor(handlers.debug.clone(), gate(Service::Debug));
    let grpc_timeout = Duration::from_millis(security.connections.grpc_request_timeout_ms);
    let grpc = Server::builder()
        .timeout(grpc_timeout)
        .add_service(MetaServiceServer::with_interceptor(
            handlers.meta.clone(),
            gate(Service::Meta),
        ))
        .add_optional_service(shared.then(admin_service))
        .add_optional_service((shared && debug).then(debug_service));
    let main_grpc = Listen::new("grpc", meta_host, config.rpc_port);
    server.spawn_grpc(main_grpc, grpc, &stop_rx).await?;
    if !shared {
        let admin_grpc = Server::builder()
            .timeout(grpc_timeout)
            .add_service(admin_service())
            .add_optional_service(debug.then(debug_service));
        let listen = Listen::new("admin_grpc", admin_host, config.admin_rpc_port);
        server.spawn_grpc(listen, admin_grpc, &stop_rx).await?;
    }
    let meta_router = http::meta_router(handlers.meta.clone(), limit);
    let mut meta_http = auth.protect(meta_router, Service::Meta, access.clone());
    if config.lookup.enabled {
        let manager = &handlers.core.manager;
        let meta = handlers.meta.clone();
        let bootstrap_auth = auth.clone();
        let check: lookup::LookupAccess = Arc::new(move |check: &lookup::AccessCheck<'_>| {
            let authorization = check.authorization.map(str::as_bytes);
            let certificate = check.certificate;
            bootstrap_auth.lookup_access(check.instance_id, authorization, certificate)
        });
        let service = LookupService::start(manager, meta, &config.lookup, check)
            .map_err(|e| ServerError::Lookup(e.to_string()))?;
        tracing::info!("lookup tables: queue pairs on {}", service.connect_addr());
        meta_http = meta_http.merge(lookup::router(service.clone(), limit));
        let _ = handlers.core.lookup.set(Arc::downgrade(&service));
        server.lookup = Some(service);
    }
    let manager = &handlers.core.manager;
    let secret =
        pool::ticket::ServerSecret::random().map_err(|e| ServerError::Pool(e.to_string()))?;
    let registrar = pool::Registrar::new(manager.clone(), auth.clone(), secret);
    meta_http = meta_http.merge(pool::routes::router(registrar.clone(), limit));
    let reap_every = std::time::Duration::from_millis(config.pool.heartbeat_ms / 2).max(MIN_REAP);
    pool::routes::start_reaper(manager, reap_every)
        .map_err(|e| ServerError::Pool(e.to_string()))?;
    let listen = Listen::new("http", meta_host, config.http_port);
    server.spawn_http(listen, meta_http, &stop_rx).await?;
    if config.pool.embedded_size > 0 {
        // Off the runtime's workers: a prefaulted region is backed here.
        let pool_config = config.clone();
        let started =
            tokio::task::spawn_blocking(move || start_embedded_pool(&pool_config, registrar));
        let node = started.await.map_err(|e| {
            ServerError::Pool(format!("the embedded pool node's start failed: {e}"))
        })??;
        server.pool_node = Some(node);
    }
    let admin_http = http::admin_router(
        handlers.admin.clone(),
        handlers.core.clone(),
        limit,
        config.metrics.exposition_prefix(),
    );
    let listen = Listen::new("admin_http", admin_host, config.admin_http_port);
    server
        .spawn_http(
            listen,
            auth.protect(admin_http, Service::Admin, access.clone()),
            &stop_rx,
        )
        .await?;
    if debug {
        let debug_router = http::debug_router(handlers.debug.clone(), limit);
        let debug_http = auth.protect(debug_router, Service::Debug, access.clone());
        let listen = Listen::new("debug_http", admin_host, config.debug_http_port());
        server.spawn_http(listen, debug_http, &stop_rx).await?;
    }
    super::election::publish(config, &handlers.core.manager, &server.addresses);
    Ok(server)
}

/// The connections of `listener`, each opened (its TLS handshake, when `tls` is set) on a
/// task of its own, so that a slow handshake holds no other connection back; ends when the
/// server drops the stream.
fn opened(
    listener: AdmittedListener,
    tls: Option<Tls>,
) -> impl tokio_stream::Stream<Item = std::io::Result<Conn>> {
    let (sender, receiver) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let io = tokio::select! {
                io = listener.accept() => io,
                () = sender.closed() => return,
            };
            let (tls, sender) = (tls.clone(), sender.clone());
            tokio::spawn(async move {
                match tls::open(tls.as_ref(), io).await {
                    Ok(conn) => drop(sender.send(Ok(conn)).await),
                    Err(error) => tracing::debug!("a connection failed to open: {error}"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(receiver)
}

impl RunningServer {
    async fn spawn_grpc(
        &mut self,
        listen: Listen,
        router: tonic::transport::server::Router,
        stop: &watch::Receiver<bool>,
    ) -> Result<(), ServerError> {
        let name = listen.name;
        let listener = listen.bind().await?;
        self.announce(name, &listener)?;
        let tls = self.tls.as_ref().map(|tls| tls.for_protocol(b"h2"));
        let incoming = opened(self.admitted(listener), tls);
        let shutdown = stopped(stop.clone());
        let task = tokio::spawn(async move {
            router
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await
                .map_err(|e| e.to_string())
        });
        self.tasks.push((name, task));
        Ok(())
    }

    async fn spawn_http(
        &mut self,
        listen: Listen,
        router: axum::Router,
        stop: &watch::Receiver<bool>,
    ) -> Result<(), ServerError> {
        let name = listen.name;
        let listener = listen.bind().await?;
        self.announce(name, &listener)?;
        let listener = self.admitted(listener);
        let task = tokio::spawn(super::http_serve::serve(
            listener,
            self.tls.as_ref().map(|tls| tls.for_protocol(b"http/1.1")),
            router,
            self.header_timeout,
            stop.clone(),
        ));
        self.tasks.push((name, task));
        Ok(())
    }

    fn admitted(&self, listener: TcpListener) -> AdmittedListener {
        let (connections, idle) = self.connections;
        AdmittedListener::new(listener, Admission::new(connections, idle))
    }

    fn announce(&mut self, name: &'static str, listener: &TcpListener) -> Result<(), ServerError> {
        let address = listener.local_addr().map_err(|source| ServerError::Bind {
            name,
            port: 0,
            source,
        })?;
        tracing::info!("listening {name} on {address}");
        self.addresses.insert(name, address);
        Ok(())
    }

    /// Writes `{"<listener>":"<ip:port>",...}` to `path` (atomically, via a rename).
    pub fn write_ready_file(&self, path: &Path) -> Result<(), ServerError> {
        let map: BTreeMap<&str, String> = self
            .addresses
            .iter()
            .map(|(name, address)| (*name, address.to_string()))
            .collect();
        let text = serde_json::to_string(&map).unwrap_or_default();
        let partial = path.with_extension("partial");
        let error = |source| ServerError::ReadyFile {
            path: path.to_path_buf(),
            source,
        };
        std::fs::write(&partial, text).map_err(error)?;
        std::fs::rename(&partial, path).map_err(error)
    }
}
