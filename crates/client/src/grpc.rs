//! The gRPC side of the client: every meta RPC against the configured servers in turn,
//! moving on when one is unreachable or answers SERVER_NOT_LEADER; each call carries the
//! client's API key, when it has one, as `authorization: Bearer <key>` metadata.

use kvcm::proto::meta;
use kvcm::proto::meta::meta_service_client::MetaServiceClient;
use std::time::Duration;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig};

use crate::error::ClientError;

/// `ErrorCode::Ok`.
const OK: i32 = 1;
/// `ErrorCode::ServerNotLeader`.
const SERVER_NOT_LEADER: i32 = 9;
/// Longest a connection to a server may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest one call may take (the server's own limit, `kvcm.service.grpc_request_timeout_ms`,
/// is as long): a server that accepts and never answers fails the call, which moves on to
/// the next server, instead of holding the client for good.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// HTTP/2 pings on an idle connection, and how long one may go unanswered: a server that
/// vanished without closing is noticed.
const KEEP_ALIVE: Duration = Duration::from_secs(10);

/// A meta client whose calls carry the API key.
pub(crate) type MetaClient = MetaServiceClient<InterceptedService<Channel, Bearer>>;

/// Adds `authorization: Bearer <key>` to every call (nothing without a key).
#[derive(Clone)]
pub(crate) struct Bearer(Option<MetadataValue<Ascii>>);

impl Bearer {
    /// The metadata of `api_key`; a key that is not visible ASCII is refused.
    pub(crate) fn new(api_key: Option<&str>) -> Result<Bearer, ClientError> {
        let Some(key) = api_key else {
            return Ok(Bearer(None));
        };
        let refused = || ClientError::InvalidArgument("api_key must be visible ASCII".into());
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(refused());
        }
        let value = format!("Bearer {key}").parse().map_err(|_| refused())?;
        Ok(Bearer(Some(value)))
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// Connections to the servers (made on first use), on a runtime of the client's own.
pub(crate) struct Grpc {
    runtime: tokio::runtime::Runtime,
    endpoints: Vec<String>,
    bearer: Bearer,
    tls: Option<ClientTlsConfig>,
    channels: Vec<Option<MetaClient>>,
    /// The server that answered last (tried first).
    current: usize,
}

/// A response with the common header.
pub(crate) trait WithHeader {
    /// The header's status (code, message); `None` when absent.
    fn status(&self) -> Option<(i32, String)>;
}

macro_rules! with_header {
    ($($t:ty),*) => {$(
        impl WithHeader for $t {
            fn status(&self) -> Option<(i32, String)> {
                let status = self.header.as_ref()?.status.as_ref()?;
                Some((status.code, status.message.clone()))
            }
        }
    )*};
}
with_header!(
    meta::GetCacheLocationResponse,
    meta::StartWriteCacheResponse,
    meta::CommonResponse
);

/// Whether a gRPC status is the server's access check refusing the call.
fn refused_access(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
    )
}

impl Grpc {
    /// Clients of `endpoints` (`http://host:port`, or `https://` with `tls`), calling with
    /// `bearer`.
    pub(crate) fn new(
        endpoints: Vec<String>,
        bearer: Bearer,
        tls: Option<ClientTlsConfig>,
    ) -> Result<Grpc, ClientError> {
        if endpoints.is_empty() {
            return Err(ClientError::InvalidArgument("no server address".into()));
        }
        // One worker thread drives the connections between calls too, so a connection the
        // server closes while idle (`kvcm.service.idle_timeout_ms`) is noticed then, and the
        // next call reconnects instead of writing into the closed socket.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("kvcm-client-grpc")
            .enable_all()
            .build()
            .map_err(|e| ClientError::Unreachable(format!("runtime: {e}")))?;
        Ok(Grpc {
            runtime,
            channels: endpoints.iter().map(|_| None).collect(),
            endpoints,
            bearer,
            tls,
            current: 0,
        })
    }

    /// Calls `rpc` on each server in turn from the current one; returns the first answer
    /// that is not SERVER_NOT_LEADER (errors included), or `Unreachable`.
    pub(crate) fn call<R, F, Fut>(&mut self, rpc: F) -> Result<R, ClientError>
    where
        R: WithHeader,
        F: Fn(MetaClient) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<R>, tonic::Status>>,
    {
        let mut last = String::new();
        for step in 0..self.endpoints.len() {
            let index = (self.current + step) % self.endpoints.len();
            let client = match self.channel(index) {
                Ok(client) => client,
                Err(error) => {
                    last = error;
                    continue;
                }
            };
            match self.runtime.block_on(rpc(client)) {
                Ok(response) => {
                    let response = response.into_inner();
                    match response.status() {
                        Some((SERVER_NOT_LEADER, message)) => last = message,
                        Some((OK, _)) => {
                            self.current = index;
                            return Ok(response);
                        }
                        Some((code, message)) => {
                            self.current = index;
                            return Err(ClientError::Server { code, message });
                        }
                        None => last = "answer without a status".into(),
                    }
                }
                Err(status) if refused_access(&status) => {
                    // Every server checks the same keys: another would refuse too.
                    return Err(ClientError::Unauthorized(status.message().to_string()));
                }
                Err(status) => {
                    self.channels[index] = None;
                    last = status.to_string();
                }
            }
        }
        Err(ClientError::Unreachable(last))
    }

    fn channel(&mut self, index: usize) -> Result<MetaClient, String> {
        if let Some(client) = &self.channels[index] {
            return Ok(client.clone());
        }
        let mut endpoint = Channel::from_shared(self.endpoints[index].clone())
            .map_err(|e| e.to_string())?
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(CALL_TIMEOUT)
            .http2_keep_alive_interval(KEEP_ALIVE)
            .keep_alive_timeout(KEEP_ALIVE);
        if let Some(tls) = &self.tls {
            endpoint = endpoint
                .tls_config(tls.clone())
                .map_err(|e| e.to_string())?;
        }
        let channel = self
            .runtime
            .block_on(endpoint.connect())
            .map_err(|e| e.to_string())?;
        let client = MetaServiceClient::with_interceptor(channel, self.bearer.clone());
        self.channels[index] = Some(client.clone());
        Ok(client)
    }
}
