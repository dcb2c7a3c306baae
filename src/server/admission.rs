//! Per-listener admission: each listener holds at most `kvcm.service.max_connections_per_listener`
//! open connections, and a connection on which nothing moved for
//! `kvcm.service.idle_timeout_ms` (half-sent headers, a stalled body, an idle keep-alive, a
//! client that stopped reading) is closed.
//!
//! Invariants: a listener takes a permit *before* it accepts, so a full listener leaves new
//! connections in the kernel's backlog and spends no descriptor of the process; the permits
//! of all listeners together stay below the process's descriptor limit (with
//! [`RESERVED_DESCRIPTORS`] kept for files, journals and peers), so one listener's
//! exhaustion never starves another's accept.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Descriptors left outside every listener's share: block files, the journal, the lookup
/// and pool paths, outgoing connections.
pub const RESERVED_DESCRIPTORS: u64 = 512;

/// Pause after a failed accept (e.g. EMFILE) before the next one.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The connection budget of one listener.
#[derive(Debug, Clone)]
pub struct Admission {
    permits: Arc<Semaphore>,
    idle: Duration,
}

impl Admission {
    /// At most `connections` open connections, each closed after `idle` without progress.
    pub fn new(connections: usize, idle: Duration) -> Admission {
        Admission {
            permits: Arc::new(Semaphore::new(connections)),
            idle,
        }
    }

    /// Waits for a free slot, then accepts one connection (Nagle off).
    async fn admit(&self, listener: &TcpListener) -> Admitted {
        let Ok(permit) = self.permits.clone().acquire_owned().await else {
            // The semaphore is never closed; should it be, accept nothing more.
            return std::future::pending().await;
        };
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    return Admitted::new(stream, permit, self.idle);
                }
                Err(error) => {
                    tracing::warn!("accepting a connection failed: {error}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            }
        }
    }
}

/// How many connections each of `listeners` listeners may hold: `wanted`, lowered so that
/// all of them together stay below the descriptor limit `descriptors` (minus
/// [`RESERVED_DESCRIPTORS`]); at least one.
pub fn per_listener_budget(wanted: usize, listeners: usize, descriptors: Option<u64>) -> usize {
    let Some(limit) = descriptors else {
        return wanted;
    };
    let shared = limit.saturating_sub(RESERVED_DESCRIPTORS) / listeners.max(1) as u64;
    let shared = usize::try_from(shared).unwrap_or(usize::MAX);
    wanted.min(shared).max(1)
}

/// The soft limit on open descriptors of this process, when known.
pub fn descriptor_limit() -> Option<u64> {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .ok()
        .map(|(soft, _)| soft)
}

/// A TCP connection holding its listener's permit until it closes.
#[derive(Debug)]
pub struct Admitted {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
    idle: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl Admitted {
    fn new(stream: TcpStream, permit: OwnedSemaphorePermit, idle: Duration) -> Admitted {
        let deadline = Box::pin(tokio::time::sleep(idle));
        Admitted {
            stream,
            _permit: permit,
            idle,
            deadline,
        }
    }

    /// Passes a ready outcome on (progress: the idle clock restarts); a pending one fails
    /// with `TimedOut` once the connection has been idle too long.
    fn progress<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match poll {
            Poll::Ready(outcome) => {
                let idle = self.idle;
                self.deadline.as_mut().reset(Instant::now() + idle);
                Poll::Ready(outcome)
            }
            Poll::Pending => match self.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "idle longer than kvcm.service.idle_timeout_ms",
                ))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl AsyncRead for Admitted {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.stream).poll_read(cx, buf);
        this.progress(cx, poll)
    }
}

impl AsyncWrite for Admitted {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.progress(cx, poll)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.stream).poll_flush(cx);
        this.progress(cx, poll)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

impl Connected for Admitted {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

/// An admitted TCP listener.
#[derive(Debug)]
pub struct AdmittedListener {
    listener: TcpListener,
    admission: Admission,
}

impl AdmittedListener {
    /// `listener` under `admission`.
    pub fn new(listener: TcpListener, admission: Admission) -> AdmittedListener {
        AdmittedListener {
            listener,
            admission,
        }
    }

    /// Waits for a free slot, then accepts one connection.
    pub async fn accept(&self) -> Admitted {
        self.admission.admit(&self.listener).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listeners_share_what_the_descriptor_limit_leaves() {
        assert_eq!(per_listener_budget(4096, 4, None), 4096);
        assert_eq!(per_listener_budget(4096, 4, Some(1 << 20)), 4096);
        assert_eq!(
            per_listener_budget(20_000, 4, Some(20_000)),
            (20_000 - 512) / 4
        );
        assert_eq!(per_listener_budget(100, 4, Some(100)), 1);
    }

    #[tokio::test]
    async fn a_full_listener_accepts_nothing_until_a_connection_closes() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let admitted = AdmittedListener::new(listener, Admission::new(1, Duration::from_secs(60)));
        let _first = TcpStream::connect(address).await.expect("connect");
        let held = admitted.accept().await;
        let _second = TcpStream::connect(address).await.expect("backlog");
        let blocked = tokio::time::timeout(
            Duration::from_millis(200),
            admitted.admission.admit(&admitted.listener),
        );
        assert!(blocked.await.is_err(), "no slot while the first is open");
        drop(held);
        let next = tokio::time::timeout(Duration::from_secs(5), admitted.accept());
        assert!(next.await.is_ok(), "the freed slot admits the next");
    }

    #[tokio::test]
    async fn an_idle_connection_times_out() {
        use tokio::io::AsyncReadExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let admission = Admission::new(1, Duration::from_millis(100));
        let _client = TcpStream::connect(address).await.expect("connect");
        let mut connection = admission.admit(&listener).await;
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), connection.read(&mut byte));
        let error = read
            .await
            .expect("the idle timeout ends the read")
            .unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
    }
}
