//! The client: lookups on the fast path when it can answer, gRPC otherwise; writes and
//! removals as RDMA messages on the fast path's queue pair, gRPC otherwise. A message
//! that was sent but not answered is an error (its outcome is unknown), never retried.
//! With [`Client::with_read_reports`], lookups the fast path answered are reported to the
//! server in batches (a `Reads` message once [`REPORT_KEYS`] keys or [`REPORT_AFTER`] have
//! gathered, checked at each lookup, and when the client is dropped or
//! [`Client::flush_read_reports`] is called), so that its access clock (the reclaimer's
//! order), event log and capacity curves count them; a lost report is counted, not retried.
//! Off by default: then the server does no work at all for fast-path reads.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::Wire;
use kvcm::proto::meta;
use kvcm::tls_client::TlsClient;

use kvcm::lookup::messages::{Reply, Request};

use crate::connection::CallError;
use crate::error::{ClientError, FastError};
use crate::fast::{FastPath, Query};
use crate::grpc::{Bearer, Grpc, MetaClient, WithHeader};
use crate::metrics::{FastPathMetrics, Metrics};

/// After the fast path broke, how long the client uses gRPC alone before connecting again.
const RECONNECT_AFTER: Duration = Duration::from_millis(200);
/// Keys of fast-path lookups that make a report due.
pub const REPORT_KEYS: usize = 4096;
/// Age of the oldest unreported fast-path lookup that makes a report due.
pub const REPORT_AFTER: Duration = Duration::from_millis(100);

/// One kvcm server: its gRPC endpoint and its meta HTTP address (for the bootstrap).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerAddress {
    /// `http://host:port` of the gRPC MetaService (`https://` with [`ClientConfig::tls`]).
    pub grpc: String,
    /// The meta HTTP listener.
    pub http: SocketAddr,
}

/// What a client connects to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConfig {
    /// The servers, tried in order (failover on SERVER_NOT_LEADER and unreachable ones).
    pub servers: Vec<ServerAddress>,
    /// The instance every call is for.
    pub instance_id: String,
    /// The wire of the fast path: `Tcp` anywhere, `Shm` on the server's host, `Verbs` to a
    /// server serving its tables on an RDMA device (refused by a build without feature
    /// `rdma`); `None` turns the fast path off.
    pub wire: Option<Wire>,
    /// The API key calls carry (`kvcm.auth.meta = required`): gRPC metadata and the lookup
    /// bootstrap's `Authorization`. `None`: calls carry none.
    pub api_key: Option<String>,
    /// TLS towards the servers (`kvcm.tls.*` on the server): gRPC, the lookup bootstrap
    /// and the pool directory. `None`: plaintext. The fast path's queue pairs are not
    /// TLS (docs/security.md).
    pub tls: Option<TlsClient>,
}

/// A connected client (one fast-path queue pair; calls are serialised on it, so give each
/// thread its own client for parallel lookups).
pub struct Client {
    config: ClientConfig,
    fast: Mutex<FastState>,
    grpc: Mutex<Grpc>,
    metrics: Metrics,
    /// Whether fast-path lookups are reported (and those not reported yet).
    report_reads: AtomicBool,
    reads: Mutex<PendingReads>,
}

/// Fast-path lookups not reported yet.
#[derive(Default)]
struct PendingReads {
    lookups: Vec<meta::GetCacheLocationRequest>,
    keys: usize,
    since: Option<Instant>,
}

/// The fast path, or since when it is down.
enum FastState {
    Up(Box<FastPath>),
    Down(Instant),
    Off,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Connects: the fast path when the server offers it (otherwise lookups use gRPC).
    pub fn connect(config: ClientConfig) -> Result<Client, ClientError> {
        if config.instance_id.is_empty() {
            return Err(ClientError::InvalidArgument("instance_id is empty".into()));
        }
        let bearer = Bearer::new(config.api_key.as_deref())?;
        let scheme = if config.tls.is_some() {
            "https://"
        } else {
            "http://"
        };
        if let Some(server) = config.servers.iter().find(|s| !s.grpc.starts_with(scheme)) {
            return Err(ClientError::InvalidArgument(format!(
                "grpc address {:?} must start with {scheme} (tls is {})",
                server.grpc,
                if config.tls.is_some() {
                    "set"
                } else {
                    "not set"
                }
            )));
        }
        if config.wire == Some(Wire::Verbs) && !kvcm_transport::ProviderKind::Verbs.is_built() {
            return Err(ClientError::InvalidArgument(
                "wire Verbs: this build of kvcm-client has no verbs provider (feature `rdma`)"
                    .into(),
            ));
        }
        let grpc = Grpc::new(
            config.servers.iter().map(|s| s.grpc.clone()).collect(),
            bearer,
            config.tls.as_ref().map(TlsClient::grpc),
        )?;
        let client = Client {
            fast: Mutex::new(FastState::Off),
            grpc: Mutex::new(grpc),
            metrics: Metrics::default(),
            report_reads: AtomicBool::new(false),
            reads: Mutex::default(),
            config,
        };
        if client.config.wire.is_some() {
            *client.fast() = client.connect_fast();
        }
        Ok(client)
    }

    /// Reports the lookups the fast path answers to the server (`on`), so that they count as
    /// reads for its reclaimer, event log and capacity curves, at the cost of one message per
    /// [`REPORT_KEYS`] keys read (or per [`REPORT_AFTER`]); off by default.
    pub fn with_read_reports(self, on: bool) -> Client {
        self.set_read_reports(on);
        self
    }

    /// As [`Client::with_read_reports`], on a client in use (lookups already noted are still
    /// reported when it is turned off).
    pub fn set_read_reports(&self, on: bool) {
        self.report_reads.store(on, Ordering::Relaxed);
    }

    /// Whether lookups currently use the fast path.
    pub fn fast_path_up(&self) -> bool {
        matches!(*self.fast(), FastState::Up(_))
    }

    /// The fast path's counters.
    pub fn metrics(&self) -> FastPathMetrics {
        self.metrics.snapshot()
    }

    /// The epoch of the table the fast path reads (`None` while it is down).
    pub fn table_epoch(&self) -> Option<u64> {
        match &*self.fast() {
            FastState::Up(fast) => Some(fast.epoch()),
            _ => None,
        }
    }

    /// Bytes of the table the fast path reads: header page and current generation
    /// (`None` while it is down).
    pub fn table_bytes(&self) -> Option<u64> {
        match &*self.fast() {
            FastState::Up(fast) => Some(fast.table_bytes()),
            _ => None,
        }
    }

    /// Round trips the fast path made (0 without one).
    pub fn round_trips(&self) -> u64 {
        match &*self.fast() {
            FastState::Up(fast) => fast.round_trips(),
            _ => 0,
        }
    }

    fn fast(&self) -> MutexGuard<'_, FastState> {
        self.fast.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn grpc(&self) -> MutexGuard<'_, Grpc> {
        self.grpc.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn connect_fast(&self) -> FastState {
        let Some(wire) = self.config.wire else {
            return FastState::Off;
        };
        for server in &self.config.servers {
            let (instance, key) = (&self.config.instance_id, self.config.api_key.as_deref());
            let tls = self.config.tls.as_ref();
            let connected = crate::bootstrap::fetch(server.http, instance, key, tls)
                .and_then(|answer| FastPath::connect(answer, wire))
                .and_then(|fast| authenticated(fast, key));
            match connected {
                Ok(fast) => return FastState::Up(Box::new(fast)),
                Err(error) => tracing_debug(&error),
            }
        }
        FastState::Down(Instant::now())
    }

    /// GetCacheLocation (the request's `instance_id` is the client's): the fast path's
    /// answer when it has one, equal to the server's, else the server's.
    pub fn get_cache_location(
        &self,
        request: meta::GetCacheLocationRequest,
    ) -> Result<Vec<meta::CacheLocation>, ClientError> {
        self.collect(&Query::of(&request))
    }

    /// As [`Client::get_cache_location`], writing the answer into `out` and reusing the
    /// locations, vectors and strings it holds: a caller that passes the same vector to
    /// every lookup allocates one small vector per fast-path lookup (the per-key choices;
    /// on soft-TCP also the batch's work requests) instead of every location and string.
    pub fn get_cache_location_into(
        &self,
        request: &meta::GetCacheLocationRequest,
        out: &mut Vec<meta::CacheLocation>,
    ) -> Result<(), ClientError> {
        self.query_into(&Query::of(request), out)
    }

    /// Prefix match over block keys.
    pub fn prefix_match(&self, keys: &[i64]) -> Result<Vec<meta::CacheLocation>, ClientError> {
        self.collect(&Query::over_keys(meta::QueryType::QtPrefixMatch, keys, 0))
    }

    /// Prefix match over block keys into `out` (see [`Client::get_cache_location_into`]).
    pub fn prefix_match_into(
        &self,
        keys: &[i64],
        out: &mut Vec<meta::CacheLocation>,
    ) -> Result<(), ClientError> {
        self.query_into(
            &Query::over_keys(meta::QueryType::QtPrefixMatch, keys, 0),
            out,
        )
    }

    /// Batch get over block keys.
    pub fn batch_get(&self, keys: &[i64]) -> Result<Vec<meta::CacheLocation>, ClientError> {
        self.collect(&Query::over_keys(meta::QueryType::QtBatchGet, keys, 0))
    }

    /// Batch get over block keys into `out` (see [`Client::get_cache_location_into`]).
    pub fn batch_get_into(
        &self,
        keys: &[i64],
        out: &mut Vec<meta::CacheLocation>,
    ) -> Result<(), ClientError> {
        self.query_into(&Query::over_keys(meta::QueryType::QtBatchGet, keys, 0), out)
    }

    /// Reverse rolling sliding-window match over block keys.
    pub fn sliding_window(
        &self,
        keys: &[i64],
        sw_size: i32,
    ) -> Result<Vec<meta::CacheLocation>, ClientError> {
        let kind = meta::QueryType::QtReverseRollSwMatch;
        self.collect(&Query::over_keys(kind, keys, sw_size))
    }

    /// Sliding-window match over block keys into `out` (see
    /// [`Client::get_cache_location_into`]).
    pub fn sliding_window_into(
        &self,
        keys: &[i64],
        sw_size: i32,
        out: &mut Vec<meta::CacheLocation>,
    ) -> Result<(), ClientError> {
        let kind = meta::QueryType::QtReverseRollSwMatch;
        self.query_into(&Query::over_keys(kind, keys, sw_size), out)
    }

    /// The answer to `query` in a new vector.
    fn collect(&self, query: &Query<'_>) -> Result<Vec<meta::CacheLocation>, ClientError> {
        let mut out = Vec::new();
        self.query_into(query, &mut out)?;
        Ok(out)
    }

    /// The answer to `query`: the fast path's when it has one, else the server's.
    fn query_into(
        &self,
        query: &Query<'_>,
        out: &mut Vec<meta::CacheLocation>,
    ) -> Result<(), ClientError> {
        if self.try_fast(query, out) {
            self.metrics.hit();
            if self.report_reads.load(Ordering::Relaxed) {
                self.note_read(query);
            }
            return Ok(());
        }
        if self.config.wire.is_some() {
            self.metrics.fallback();
        }
        let request = query.to_request(&self.config.instance_id);
        let response = self.grpc().call(|mut client| {
            let request = request.clone();
            async move { client.get_cache_location(request).await }
        })?;
        *out = response.locations;
        Ok(())
    }

    /// Remembers a lookup the fast path answered; reports the batch when it is due.
    fn note_read(&self, query: &Query<'_>) {
        let due = {
            let mut reads = self.reads.lock().unwrap_or_else(PoisonError::into_inner);
            reads.keys += query.block_keys.len().max(query.token_ids.len());
            reads.lookups.push(meta::GetCacheLocationRequest {
                instance_id: self.config.instance_id.clone(),
                block_keys: query.block_keys.to_vec(),
                token_ids: query.token_ids.to_vec(),
                ..Default::default()
            });
            let since = *reads.since.get_or_insert_with(Instant::now);
            reads.keys >= REPORT_KEYS || since.elapsed() >= REPORT_AFTER
        };
        if due {
            self.flush_read_reports();
        }
    }

    /// Reports the fast-path lookups not reported yet (one `Reads` message); what the server
    /// did not acknowledge is counted in [`FastPathMetrics::reads_unreported`].
    pub fn flush_read_reports(&self) {
        let lookups = {
            let mut reads = self.reads.lock().unwrap_or_else(PoisonError::into_inner);
            std::mem::take(&mut *reads).lookups
        };
        if lookups.is_empty() {
            return;
        }
        let count = lookups.len() as u64;
        let acknowledged = match self.message(Request::Reads(lookups)) {
            Some(Ok(Reply::Common(response))) => checked(response).is_ok(),
            _ => false,
        };
        self.metrics.reads_reported(count, acknowledged);
    }

    /// Whether the fast path answered `query` into `out`, reconnecting it when it has been
    /// down long enough.
    fn try_fast(&self, query: &Query<'_>, out: &mut Vec<meta::CacheLocation>) -> bool {
        let mut fast = self.fast();
        if let FastState::Down(since) = *fast {
            if since.elapsed() < RECONNECT_AFTER {
                return false;
            }
            self.metrics.reconnect();
            *fast = self.connect_fast();
        }
        let FastState::Up(path) = &mut *fast else {
            return false;
        };
        match path.lookup(query, out, &self.metrics) {
            Ok(()) => true,
            Err(FastError::AskServer(_)) => false,
            Err(error @ FastError::Broken(_)) => {
                tracing_debug(&error);
                *fast = FastState::Down(Instant::now());
                false
            }
        }
    }

    /// StartWriteCache: as an RDMA message on the fast path's queue pair when it is up,
    /// else over gRPC (same handler, same answers).
    pub fn start_write(
        &self,
        mut request: meta::StartWriteCacheRequest,
    ) -> Result<meta::StartWriteCacheResponse, ClientError> {
        request.instance_id = self.config.instance_id.clone();
        match self.message(Request::StartWrite(request.clone())) {
            Some(Ok(Reply::StartWrite(response))) => return checked(response),
            Some(Ok(_)) => return Err(unexpected_reply()),
            Some(Err(error)) => return Err(error),
            None => {}
        }
        let response = self.grpc().call(|mut client| {
            let request = request.clone();
            async move { client.start_write_cache(request).await }
        })?;
        Ok(response)
    }

    /// FinishWriteCache, by message or over gRPC.
    pub fn finish_write(
        &self,
        mut request: meta::FinishWriteCacheRequest,
    ) -> Result<(), ClientError> {
        request.instance_id = self.config.instance_id.clone();
        self.common(Request::FinishWrite(request.clone()), move |mut client| {
            let request = request.clone();
            async move { client.finish_write_cache(request).await }
        })
    }

    /// RemoveCache, by message or over gRPC.
    pub fn remove(&self, mut request: meta::RemoveCacheRequest) -> Result<(), ClientError> {
        request.instance_id = self.config.instance_id.clone();
        self.common(Request::Remove(request.clone()), move |mut client| {
            let request = request.clone();
            async move { client.remove_cache(request).await }
        })
    }

    /// A call answered by a CommonResponse: by message, else by `grpc`.
    fn common<F, Fut>(&self, request: Request, grpc: F) -> Result<(), ClientError>
    where
        F: Fn(MetaClient) -> Fut,
        Fut: std::future::Future<
            Output = Result<tonic::Response<meta::CommonResponse>, tonic::Status>,
        >,
    {
        match self.message(request) {
            Some(Ok(Reply::Common(response))) => checked(response).map(drop),
            Some(Ok(_)) => Err(unexpected_reply()),
            Some(Err(error)) => Err(error),
            None => self.grpc().call(grpc).map(drop),
        }
    }

    /// Sends `request` on the fast path: `None` when it did not go (no fast path, or the
    /// server refused it unapplied: use gRPC), else the reply or why it was lost.
    fn message(&self, request: Request) -> Option<Result<Reply, ClientError>> {
        let mut fast = self.fast();
        let FastState::Up(path) = &mut *fast else {
            return None;
        };
        match path.call(&request) {
            // Refused unapplied, or by a follower: gRPC (with its failover) answers.
            Ok(Reply::Refused(_)) => None,
            Ok(reply) if reply_code(&reply) == Some(SERVER_NOT_LEADER) => None,
            Ok(reply) => {
                if !matches!(request, Request::Reads(_)) {
                    self.metrics.write_by_message();
                }
                Some(Ok(reply))
            }
            Err(CallError::NotSent(error)) => {
                tracing_debug(&error);
                if matches!(error, FastError::Broken(_)) {
                    *fast = FastState::Down(Instant::now());
                }
                None
            }
            Err(CallError::Lost(error)) => {
                tracing_debug(&error);
                *fast = FastState::Down(Instant::now());
                Some(Err(ClientError::Unreachable(format!(
                    "a write-path message was sent but not answered (its outcome is unknown): {error}"
                ))))
            }
        }
    }
}

/// `fast` after it gave its queue pair the API key (none: as it is), so that write-path
/// messages are checked with it; a key the server refuses fails the fast path.
fn authenticated(mut fast: FastPath, api_key: Option<&str>) -> Result<FastPath, FastError> {
    let Some(key) = api_key else {
        return Ok(fast);
    };
    let broken = |why: String| FastError::Broken(format!("authenticating the queue pair: {why}"));
    match fast.call(&Request::Authenticate(key.as_bytes().to_vec())) {
        Ok(Reply::Common(response)) => checked(response)
            .map(|_| fast)
            .map_err(|e| broken(e.to_string())),
        // A server without the message (older) refuses it; its messages then go to gRPC.
        Ok(Reply::Refused(_)) => Ok(fast),
        Ok(_) => Err(broken("an unexpected reply".into())),
        Err(CallError::NotSent(error) | CallError::Lost(error)) => Err(broken(error.to_string())),
    }
}

impl Drop for Client {
    /// Reports the fast-path lookups not reported yet.
    fn drop(&mut self) {
        self.flush_read_reports();
    }
}

/// A response whose header says OK, or the server's error.
fn checked<R: WithHeader>(response: R) -> Result<R, ClientError> {
    match response.status() {
        Some((1, _)) => Ok(response),
        Some((code, message)) => Err(ClientError::Server { code, message }),
        None => Err(unexpected_reply()),
    }
}

/// `ErrorCode::ServerNotLeader`.
const SERVER_NOT_LEADER: i32 = 9;

/// The status code in a reply's header.
fn reply_code(reply: &Reply) -> Option<i32> {
    match reply {
        Reply::StartWrite(r) => r.status().map(|(code, _)| code),
        Reply::Common(r) => r.status().map(|(code, _)| code),
        Reply::Refused(_) => None,
    }
}

fn unexpected_reply() -> ClientError {
    ClientError::Unreachable("the server answered a message with another kind of reply".into())
}

/// Records why the fast path could not answer (stderr when `KVCM_CLIENT_DEBUG` is set).
fn tracing_debug(error: &FastError) {
    if std::env::var_os("KVCM_CLIENT_DEBUG").is_some() {
        eprintln!("kvcm-client fast path: {error}");
    }
}
