//! Accepting connections whose first bytes are a handshake (the lookup and pool queue-pair
//! listeners): each connection is handled on a thread of its own, at most `max` at once;
//! more are closed at once, so silent clients neither delay others nor pile up.

use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Accepts on `listener` on a thread named `name` until the process ends, running
/// `handle` for each connection on its own thread (at most `max` at once).
pub(crate) fn serve(
    listener: TcpListener,
    name: &str,
    max: usize,
    handle: impl Fn(TcpStream) + Send + Sync + 'static,
) -> std::io::Result<()> {
    let handle = Arc::new(handle);
    let worker = format!("{name}-hello");
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let in_flight = Arc::new(AtomicUsize::new(0));
            for stream in listener.incoming().flatten() {
                if in_flight.fetch_add(1, Ordering::SeqCst) >= max {
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    continue; // dropped: closed at once
                }
                let (handle, done) = (handle.clone(), in_flight.clone());
                let spawned = std::thread::Builder::new()
                    .name(worker.clone())
                    .spawn(move || {
                        handle(stream);
                        done.fetch_sub(1, Ordering::SeqCst);
                    });
                if spawned.is_err() {
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    tracing::warn!("no thread for a handshake: connection refused");
                }
            }
        })?;
    Ok(())
}
