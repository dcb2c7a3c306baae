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

use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::admission::AdmittedListener;

/// Serves `router` on `listener` until `stop` turns true, then waits for open connections.
pub(super) async fn serve(
    listener: AdmittedListener,
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
        let service = TowerToHyperService::new(router.clone());
        let connection = builder.serve_connection(TokioIo::new(io), service);
        let mut stop = stop.clone();
        connections.spawn(async move {
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
