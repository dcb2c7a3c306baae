//! The tonic side of the edge: each gRPC method (implemented from the RPC table in `rpcs`)
//! hands the decoded request to the handler of the same name. Application errors travel in
//! `header.status`; the gRPC status is always OK (as in the reference). Blocking RPCs
//! (file-system work, whole-instance scans, opening backends) run on tokio's blocking pool,
//! never on a runtime thread, and so do calls whose request is large (many keys,
//! [`super::rpcs::HEAVY_REQUEST_BYTES`]). Every call gets its access-log line. A caller whose
//! credential may not make the call (see [`super::auth`]) is answered PERMISSION_DENIED.

use std::time::Instant;

use serde::Serialize;
use tonic::{Request, Response, Status};

use super::auth::{authorize, Caller, Scoped};
use super::core::served_since;
use super::http::Peer;
use super::reply::Reply;
use super::rpcs::{Mode, Rpc};
use crate::access_log::{AccessSink, Transport};
use crate::proto::json::JsonBody;

/// Serves one gRPC call of `rpc` with its handler method `call`.
pub(super) async fn serve<Req, Resp>(
    rpc: &'static Rpc,
    access: &AccessSink,
    request: Request<Req>,
    call: impl FnOnce(Req) -> Resp + Send + 'static,
) -> Result<Response<Resp>, Status>
where
    Req: prost::Message + Serialize + Scoped + Send + 'static,
    Resp: Reply + JsonBody + Send + 'static,
{
    let started = Instant::now();
    let caller = request.extensions().get::<Caller>();
    let client = Peer::of(&request).addr;
    if let Err(reason) = authorize(caller, rpc.access, request.get_ref().instance_id()) {
        let name = caller.map_or("", |caller| caller.name.as_str());
        access.forbidden(rpc, Transport::Grpc, client, name, &reason);
        return Err(Status::permission_denied(reason));
    }
    let mut line = access.begin(rpc, Transport::Grpc, client);
    if let Some(line) = line.as_mut() {
        let caller = request.extensions().get::<Caller>();
        line.set_caller(caller.map(|caller| caller.name.clone()));
    }
    let request = request.into_inner();
    if let Some(line) = line.as_mut() {
        line.request_message(access, &request);
    }
    let served = match rpc.mode.for_request(request.encoded_len()) {
        Mode::Inline => Ok(served_since(started, || call(request))),
        Mode::Blocking => {
            tokio::task::spawn_blocking(move || served_since(started, || call(request))).await
        }
    };
    let (reply, trace_id) = match served {
        Ok(served) => served,
        Err(error) => {
            if let Some(line) = line {
                line.finish(access, None, None, None);
            }
            return Err(Status::internal(format!("handler task failed: {error}")));
        }
    };
    if let Some(mut line) = line {
        if line.wants_bodies(access) {
            line.response_json(access, &reply.to_json().unwrap_or_default());
        }
        line.finish(access, trace_id, reply.status(), None);
    }
    Ok(Response::new(reply))
}
