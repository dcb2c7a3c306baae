//! Every protobuf RPC through the gRPC services, as a client's bytes reach them: the first
//! byte picks the RPC, the rest is its request message. The call goes through the tonic
//! server (framing, decoding, the handler, encoding the answer). The answer's gRPC status is
//! OK — kvcm puts application errors in the response header, as the reference does — or
//! tonic's INTERNAL for bytes that are not the request message.
#![no_main]

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use kvcm::proto::admin::admin_service_server::AdminServiceServer;
use kvcm::proto::debug::debug_service_server::DebugServiceServer;
use kvcm::proto::meta::meta_service_server::MetaServiceServer;
use kvcm::service::rpcs::{Rpc, Service};
use kvcm_fuzz::{harness, split};
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;

type Request = tonic::codegen::http::Request<Full<Bytes>>;
type Response = tonic::codegen::http::Response<tonic::body::Body>;

/// The gRPC path of `rpc` (the generated services' names).
fn path(rpc: &Rpc) -> String {
    let service = match rpc.service {
        Service::Meta => kvcm::proto::meta::meta_service_server::SERVICE_NAME,
        Service::Admin => kvcm::proto::admin::admin_service_server::SERVICE_NAME,
        Service::Debug => kvcm::proto::debug::debug_service_server::SERVICE_NAME,
    };
    format!("/{service}/{}", rpc.name)
}

/// A gRPC request carrying `message` as its one length-prefixed, uncompressed message.
fn request(rpc: &Rpc, message: &[u8]) -> Request {
    let mut body = Vec::with_capacity(5 + message.len());
    body.push(0);
    body.extend_from_slice(&(message.len() as u32).to_be_bytes());
    body.extend_from_slice(message);
    tonic::codegen::http::Request::builder()
        .method("POST")
        .uri(path(rpc))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from(body)))
        .expect("a well-formed request")
}

async fn call(rpc: &Rpc, request: Request) -> Response {
    let handlers = &harness().handlers;
    let answer = match rpc.service {
        Service::Meta => {
            MetaServiceServer::new(handlers.meta.clone())
                .oneshot(request)
                .await
        }
        Service::Admin => {
            AdminServiceServer::new(handlers.admin.clone())
                .oneshot(request)
                .await
        }
        Service::Debug => {
            DebugServiceServer::new(handlers.debug.clone())
                .oneshot(request)
                .await
        }
    };
    answer.unwrap_or_else(|never| match never {})
}

/// The gRPC status code and message of an answer (in the headers of a trailers-only
/// answer, else in the trailers).
async fn status(answer: Response) -> (String, String) {
    let (parts, body) = answer.into_parts();
    let collected = body.collect().await.expect("the answer's body is complete");
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let field = |name: &str| {
        let value = parts.headers.get(name).or_else(|| trailers.get(name));
        value.map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    };
    let code = field("grpc-status").expect("an answer carries grpc-status");
    (code, field("grpc-message").unwrap_or_default())
}

fuzz_target!(|input: &[u8]| {
    let Some((rpc, message)) = split(input) else {
        return;
    };
    let answer = harness()
        .runtime
        .block_on(async { status(call(&rpc, request(&rpc, message)).await).await });
    // OK, or tonic's INTERNAL for a message that is not the request type.
    let (code, text) = answer;
    let undecodable = code == "13" && text.contains("decode");
    assert!(
        code == "0" || undecodable,
        "{}: grpc-status {code} {text:?}",
        rpc.name
    );
});
