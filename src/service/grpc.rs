//! The tonic side of the edge: each gRPC method (implemented from the RPC table in `rpcs`)
//! hands the decoded request to the handler of the same name. Application errors travel in
//! `header.status`; the gRPC status is always OK (as in the reference). Blocking RPCs
//! (file-system work, whole-instance scans, opening backends) run on tokio's blocking pool,
//! never on a runtime thread.

use std::time::Instant;

use tonic::{Request, Response, Status};

use super::core::served_since;
use super::rpcs::{Mode, Rpc};

/// Serves one gRPC call of `rpc` with its handler method `call`.
pub(super) async fn serve<Req, Resp>(
    rpc: &Rpc,
    request: Request<Req>,
    call: impl FnOnce(Req) -> Resp + Send + 'static,
) -> Result<Response<Resp>, Status>
where
    Req: Send + 'static,
    Resp: Send + 'static,
{
    let started = Instant::now();
    let request = request.into_inner();
    let reply = match rpc.mode {
        Mode::Inline => served_since(started, || call(request)),
        Mode::Blocking => {
            tokio::task::spawn_blocking(move || served_since(started, || call(request)))
                .await
                .map_err(|error| Status::internal(format!("handler task failed: {error}")))?
        }
    };
    Ok(Response::new(reply))
}
