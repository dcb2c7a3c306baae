//! The floors: a bare tonic MetaService whose GetCacheLocation answers a prepared response
//! (same codec, transport and message sizes as the real one, no manager), and a bare axum
//! route that answers prepared bytes.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

use kvcm::proto::meta;
use kvcm::proto::meta::meta_service_server::{MetaService, MetaServiceServer};

/// Echo service: GetCacheLocation answers the prepared response for the request's key count.
pub struct EchoMeta {
    /// (key count, response) pairs.
    pub answers: Vec<(usize, meta::GetCacheLocationResponse)>,
}

fn unimplemented<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented("echo serves GetCacheLocation only"))
}

#[tonic::async_trait]
impl MetaService for EchoMeta {
    async fn get_cache_location(
        &self,
        request: Request<meta::GetCacheLocationRequest>,
    ) -> Result<Response<meta::GetCacheLocationResponse>, Status> {
        let count = request.get_ref().block_keys.len();
        let answer = self
            .answers
            .iter()
            .find(|(n, _)| *n == count)
            .map(|(_, a)| a.clone());
        Ok(Response::new(answer.unwrap_or_default()))
    }
    async fn register_instance(
        &self,
        _: Request<meta::RegisterInstanceRequest>,
    ) -> Result<Response<meta::RegisterInstanceResponse>, Status> {
        unimplemented()
    }
    async fn get_instance_info(
        &self,
        _: Request<meta::GetInstanceInfoRequest>,
    ) -> Result<Response<meta::GetInstanceInfoResponse>, Status> {
        unimplemented()
    }
    async fn get_cache_meta(
        &self,
        _: Request<meta::GetCacheMetaRequest>,
    ) -> Result<Response<meta::GetCacheMetaResponse>, Status> {
        unimplemented()
    }
    async fn start_write_cache(
        &self,
        _: Request<meta::StartWriteCacheRequest>,
    ) -> Result<Response<meta::StartWriteCacheResponse>, Status> {
        unimplemented()
    }
    async fn finish_write_cache(
        &self,
        _: Request<meta::FinishWriteCacheRequest>,
    ) -> Result<Response<meta::CommonResponse>, Status> {
        unimplemented()
    }
    async fn remove_cache(
        &self,
        _: Request<meta::RemoveCacheRequest>,
    ) -> Result<Response<meta::CommonResponse>, Status> {
        unimplemented()
    }
    async fn trim_cache(
        &self,
        _: Request<meta::TrimCacheRequest>,
    ) -> Result<Response<meta::CommonResponse>, Status> {
        unimplemented()
    }
    async fn get_cluster_info(
        &self,
        _: Request<meta::GetClusterInfoRequest>,
    ) -> Result<Response<meta::GetClusterInfoResponse>, Status> {
        unimplemented()
    }
    async fn get_cache_location_len(
        &self,
        _: Request<meta::GetCacheLocationLenRequest>,
    ) -> Result<Response<meta::GetCacheLocationLenResponse>, Status> {
        unimplemented()
    }
    async fn report_event(
        &self,
        _: Request<meta::ReportEventRequest>,
    ) -> Result<Response<meta::ReportEventResponse>, Status> {
        unimplemented()
    }
    async fn get_host_cache_state(
        &self,
        _: Request<meta::GetHostCacheStateRequest>,
    ) -> Result<Response<meta::GetHostCacheStateResponse>, Status> {
        unimplemented()
    }
    async fn get_cache_locations_by_backend(
        &self,
        _: Request<meta::GetCacheLocationsByBackendRequest>,
    ) -> Result<Response<meta::GetCacheLocationsByBackendResponse>, Status> {
        unimplemented()
    }
}

/// Serves the echo gRPC service on an OS-chosen port.
pub async fn spawn_grpc_echo(echo: EchoMeta) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let incoming = kvcm::server::nodelay_incoming(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(MetaServiceServer::new(echo))
            .serve_with_incoming(incoming),
    );
    Ok(address)
}

/// Serves `POST /echo/<n>` answering the prepared bytes for n keys, and
/// `POST /json-echo/<n>` that also decodes the request and encodes the prepared response
/// message with the edge's JSON codec (the HTTP floor including JSON), on an OS-chosen port.
pub async fn spawn_http_echo(
    answers: Vec<(usize, meta::GetCacheLocationResponse)>,
) -> anyhow::Result<SocketAddr> {
    use axum::extract::Path;
    use axum::http::{header, StatusCode};
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let bodies: Vec<(usize, Vec<u8>)> = answers
        .iter()
        .map(|(n, answer)| Ok((*n, kvcm::proto::json::encode(answer)?)))
        .collect::<anyhow::Result<_>>()?;
    let bodies = Arc::new(bodies);
    let answers = Arc::new(answers);
    let raw = move |Path(count): Path<usize>, _body: axum::body::Bytes| {
        let bodies = bodies.clone();
        async move {
            let body = bodies
                .iter()
                .find(|(n, _)| *n == count)
                .map(|(_, b)| b.clone());
            (
                [(header::CONTENT_TYPE, "application/json")],
                body.unwrap_or_default(),
            )
        }
    };
    let json = move |Path(count): Path<usize>, body: axum::body::Bytes| {
        let answers = answers.clone();
        async move {
            let decoded = kvcm::proto::json::decode::<meta::GetCacheLocationRequest>(&body);
            let answer = answers.iter().find(|(n, _)| *n == count).map(|(_, a)| a);
            match (decoded, answer.map(kvcm::proto::json::encode)) {
                (Ok(_), Some(Ok(bytes))) => (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "application/json")],
                    bytes,
                ),
                _ => (
                    StatusCode::BAD_REQUEST,
                    [(header::CONTENT_TYPE, "application/json")],
                    Vec::new(),
                ),
            }
        }
    };
    let router = axum::Router::new()
        .route("/echo/{count}", axum::routing::post(raw))
        .route("/json-echo/{count}", axum::routing::post(json));
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(address)
}
