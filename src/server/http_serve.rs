//! Serves an HTTP router on an admitted listener with hyper's HTTP/1.1 connection builder
//! (in place of `axum::serve`, which cannot bound how long a request head may take).
//!
//! Invariants: a connection waiting for a request head gets all of it within
//! `kvcm.service.header_timeout_ms`, however steadily it trickles in (the idle timeout alone
//! would keep a client sending one byte per interval), or is closed; hyper starts that clock
//! when the connection starts waiting, so an idle keep-alive connection is closed after it
//! too. The body's deadline is the handlers'
//! (`kvcm.service.body_timeout_ms`, [`crate::service::http`]). On stop the listener accepts
//! nothing more and every open connection finishes its in-flight request, then closes.

use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tonic::transport::server::Connected;

use super::admission::AdmittedListener;
use super::tls::{self, Tls};
use crate::service::http::{ClientAddr, ClientCertificate, Peer};

/// Serves `router` on `listener` (over TLS when `tls` is set, each handshake on its
/// connection's task) until `stop` turns true, then waits for open connections.
pub(super) async fn serve(
    listener: AdmittedListener,
    tls: Option<Tls>,
    router: Router,
    header_timeout: Duration,
    mut stop: watch::Receiver<bool>,
) -> Result<(), String> {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    let mut connections = JoinSet::new();
    loop {
        let io = tokio::select! {
            io = listener.accept() => io,
            // An error means the sender is gone: stop as well.
            _ = stop.wait_for(|&stop| stop) => break,
        };
        while connections.try_join_next().is_some() {}
        let (router, builder, tls) = (router.clone(), builder.clone(), tls.clone());
        let mut stop = stop.clone();
        connections.spawn(async move {
            // A failed handshake (or one past its deadline) closes the connection.
            let Ok(io) = tls::open(tls.as_ref(), io).await else {
                return;
            };
            let service = TowerToHyperService::new(WithPeer {
                router,
                peer: io.connect_info(),
            });
            let connection = builder.serve_connection(TokioIo::new(io), service);
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                // A connection ends with an error when its peer misbehaves or goes (a
                // head past its deadline, a reset, the idle timeout): nothing to report.
                _ = connection.as_mut() => return,
                _ = stop.wait_for(|&stop| stop) => connection.as_mut().graceful_shutdown(),
            }
            let _ = connection.await;
        });
    }
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// The router, tagging each request with the connection's peer ([`ClientAddr`], for the
/// access log) and the identity of its client certificate ([`ClientCertificate`]).
#[derive(Clone)]
struct WithPeer {
    router: Router,
    peer: Peer,
}

impl tower_service::Service<hyper::Request<Incoming>> for WithPeer {
    type Response = <Router as tower_service::Service<hyper::Request<Incoming>>>::Response;
    type Error = <Router as tower_service::Service<hyper::Request<Incoming>>>::Error;
    type Future = <Router as tower_service::Service<hyper::Request<Incoming>>>::Future;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        tower_service::Service::<hyper::Request<Incoming>>::poll_ready(&mut self.router, context)
    }

    fn call(&mut self, mut request: hyper::Request<Incoming>) -> Self::Future {
        if let Some(addr) = self.peer.addr {
            request.extensions_mut().insert(ClientAddr(addr));
        }
        if let Some(identity) = &self.peer.certificate {
            request
                .extensions_mut()
                .insert(ClientCertificate(identity.clone()));
        }
        self.router.call(request)
    }
}
