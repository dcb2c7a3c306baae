//! The gRPC side of the client: every meta RPC against the configured servers in turn,
//! moving on when one is unreachable or answers SERVER_NOT_LEADER.

use kvcm::proto::meta;
use kvcm::proto::meta::meta_service_client::MetaServiceClient;
use tonic::transport::Channel;

use crate::error::ClientError;

/// `ErrorCode::Ok`.
const OK: i32 = 1;
/// `ErrorCode::ServerNotLeader`.
const SERVER_NOT_LEADER: i32 = 9;

/// Connections to the servers (made on first use), on a runtime of the client's own.
pub(crate) struct Grpc {
    runtime: tokio::runtime::Runtime,
    endpoints: Vec<String>,
    channels: Vec<Option<MetaServiceClient<Channel>>>,
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

impl Grpc {
    /// Clients of `endpoints` (`http://host:port`).
    pub(crate) fn new(endpoints: Vec<String>) -> Result<Grpc, ClientError> {
        if endpoints.is_empty() {
            return Err(ClientError::InvalidArgument("no server address".into()));
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ClientError::Unreachable(format!("runtime: {e}")))?;
        Ok(Grpc {
            runtime,
            channels: endpoints.iter().map(|_| None).collect(),
            endpoints,
            current: 0,
        })
    }

    /// Calls `rpc` on each server in turn from the current one; returns the first answer
    /// that is not SERVER_NOT_LEADER (errors included), or `Unreachable`.
    pub(crate) fn call<R, F, Fut>(&mut self, rpc: F) -> Result<R, ClientError>
    where
        R: WithHeader,
        F: Fn(MetaServiceClient<Channel>) -> Fut,
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
                Err(status) => {
                    self.channels[index] = None;
                    last = status.to_string();
                }
            }
        }
        Err(ClientError::Unreachable(last))
    }

    fn channel(&mut self, index: usize) -> Result<MetaServiceClient<Channel>, String> {
        if let Some(client) = &self.channels[index] {
            return Ok(client.clone());
        }
        let endpoint = self.endpoints[index].clone();
        let client = self
            .runtime
            .block_on(MetaServiceClient::connect(endpoint))
            .map_err(|e| e.to_string())?;
        self.channels[index] = Some(client.clone());
        Ok(client)
    }
}
