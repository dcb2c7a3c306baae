//! The verbs-shaped API every provider implements.
//!
//! The object tree follows verbs: a [`Domain`] (device + protection domain) allocates
//! [`Memory`], registers [`Region`]s on it, and creates [`CompletionQueue`]s and
//! reliable-connected [`QueuePair`]s. A queue pair is connected by exchanging its
//! [`QpEndpoint`] with the peer out of band ([`exchange_endpoints`] does it over TCP).
//!
//! Contract for every provider (checked by the conformance suite):
//! - misuse is refused with a [`crate::TransportError`] and changes nothing;
//! - the outcome of an accepted work request arrives as a [`WorkCompletion`];
//! - any error completion moves the queue pair to [`QpState::Error`] and flushes what is
//!   queued behind it with [`WcStatus::WrFlushError`];
//! - work requests of one queue pair execute in order (reliable connected).

mod access;
mod deadline;
mod exchange;
mod work;

pub use access::Access;
pub use deadline::DeadlineStream;
pub use exchange::{exchange_endpoints, read_endpoint, write_endpoint, QpEndpoint};
pub use work::{
    QpState, RecvWr, RemoteAddr, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion,
};

use crate::Result;
use std::os::fd::RawFd;
use std::time::Duration;

/// Sizes of a queue pair's queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpConfig {
    /// Most send work requests outstanding at once. Default 1024.
    pub max_send_wr: usize,
    /// Most receive work requests outstanding at once. Default 1024.
    pub max_recv_wr: usize,
    /// Most scatter-gather elements per work request. Default 16.
    pub max_sge: usize,
}

impl Default for QpConfig {
    fn default() -> Self {
        QpConfig {
            max_send_wr: 1024,
            max_recv_wr: 1024,
            max_sge: 16,
        }
    }
}

/// An opened device with its protection domain: the root of all other objects.
pub trait Domain: Send + Sync {
    /// Memory this provider can register.
    type Memory: Memory;
    /// A registration.
    type Region: Region;
    /// A completion queue.
    type Cq: CompletionQueue;
    /// A reliable-connected queue pair.
    type Qp: QueuePair;

    /// Provider name for logs and test output ("soft-tcp", "soft-shm", "verbs").
    fn provider_name(&self) -> &'static str;
    /// Allocates `len` zeroed bytes of registrable memory (page aligned).
    fn alloc(&self, len: usize) -> Result<Self::Memory>;
    /// A handle on the same device with a protection domain of its own (verbs
    /// `ibv_alloc_pd`): a queue pair uses local keys and serves remote keys only of
    /// regions registered in its own protection domain; any other key fails as a bad key
    /// does (`LocalProtectionError`, `RemoteAccessError`). Completion queues are the
    /// device's and may be shared across protection domains.
    fn new_pd(&self) -> Result<Self>
    where
        Self: Sized;
    /// Registers `len` bytes at `offset` of `memory` with `access`. Ranges registered on one
    /// memory may not overlap. Dropping the region deregisters it.
    fn register(
        &self,
        memory: &Self::Memory,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Self::Region>;
    /// Creates a completion queue.
    fn create_cq(&self) -> Result<Self::Cq>;
    /// Creates a queue pair completing sends on `send_cq` and receives on `recv_cq`.
    fn create_qp(
        &self,
        send_cq: &Self::Cq,
        recv_cq: &Self::Cq,
        config: QpConfig,
    ) -> Result<Self::Qp>;
}

/// Registrable memory owned by a domain. Local CPU access goes through copies and atomics,
/// because the NIC and peers may touch the same bytes at any time.
pub trait Memory: Send + Sync + std::fmt::Debug {
    /// Virtual address of byte 0.
    fn addr(&self) -> u64;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the memory is empty (never true: zero-length memory is refused).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies `data` to `offset`.
    fn write(&self, offset: usize, data: &[u8]) -> Result<()>;
    /// Copies from `offset` into `out`.
    fn read(&self, offset: usize, out: &mut [u8]) -> Result<()>;
    /// Atomic fetch-add on the aligned 8-byte word at `offset`.
    fn fetch_add_u64(&self, offset: usize, add: u64) -> Result<u64>;
    /// Atomic load of the aligned 8-byte word at `offset`.
    fn load_u64(&self, offset: usize) -> Result<u64>;
}

/// A memory registration.
pub trait Region: Send + Sync + std::fmt::Debug {
    /// Virtual address of the first registered byte.
    fn addr(&self) -> u64;
    /// Registered length.
    fn len(&self) -> usize;
    /// Whether the region is empty (never true).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Key for local scatter-gather elements.
    fn lkey(&self) -> u32;
    /// Key peers use to reach this region.
    fn rkey(&self) -> u32;
    /// Rights granted.
    fn access(&self) -> Access;
    /// A scatter-gather element for `len` bytes at `offset` of this region (an offset
    /// past the region gives an element that posting refuses; the address wraps, never
    /// panics).
    fn sge(&self, offset: usize, len: u32) -> Sge {
        Sge {
            addr: self.addr().wrapping_add(offset as u64),
            len,
            lkey: self.lkey(),
        }
    }
    /// The remote address of `offset` in this region, to hand to a peer (an offset past
    /// the region gives an address the peer's NIC refuses; it wraps, never panics).
    fn remote(&self, offset: usize) -> RemoteAddr {
        RemoteAddr {
            addr: self.addr().wrapping_add(offset as u64),
            rkey: self.rkey(),
        }
    }
}

/// A completion queue: polled busily, or awaited through a file descriptor.
///
/// To await completions in an event loop (epoll, tokio's `AsyncFd`, ...): call
/// [`CompletionQueue::arm`]; if it returns false, wait until [`CompletionQueue::event_fd`]
/// is readable; then drain with [`CompletionQueue::poll`] and arm again.
pub trait CompletionQueue: Send + Sync + std::fmt::Debug {
    /// Moves up to `out.len()` completions into `out`; returns how many. Never blocks.
    fn poll(&self, out: &mut [WorkCompletion]) -> usize;
    /// Requests a notification (verbs `req_notify_cq`): the event fd becomes readable at
    /// the next completion. Returns true when completions are already waiting, in which
    /// case the caller polls instead of waiting.
    fn arm(&self) -> Result<bool>;
    /// The descriptor that becomes readable after [`CompletionQueue::arm`] once a
    /// completion arrives.
    fn event_fd(&self) -> RawFd;
    /// Blocks until a completion is available or `timeout` passes; returns whether one is.
    fn wait(&self, timeout: Duration) -> Result<bool> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if self.arm()? {
                return Ok(true);
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            let millis = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            crate::sys::poll_readable(&[self.event_fd()], millis)?;
        }
    }
}

/// A reliable-connected queue pair.
pub trait QueuePair: Send + Sync + std::fmt::Debug {
    /// The queue pair number.
    fn qpn(&self) -> u32;
    /// Current state.
    fn state(&self) -> QpState;
    /// What the peer needs to connect to this queue pair.
    fn endpoint(&self) -> QpEndpoint;
    /// Connects to the peer described by `remote` (Init → ReadyToSend).
    fn connect(&self, remote: &QpEndpoint) -> Result<()>;
    /// Posts work requests in order. Refused whole (nothing posted) on misuse.
    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()>;
    /// Posts receive buffers. Refused whole (nothing posted) on misuse.
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()>;
}

/// Moves up to `out.len()` completions from the front of `queue` into `out`.
pub(crate) fn drain_completions(
    queue: &mut std::collections::VecDeque<WorkCompletion>,
    out: &mut [WorkCompletion],
) -> usize {
    let count = out.len().min(queue.len());
    for (slot, completion) in out.iter_mut().zip(queue.drain(..count)) {
        *slot = completion;
    }
    count
}

/// Checks the parts of a send batch that need no provider state: no empty or oversized
/// scatter lists, no zero lengths, aligned 8-byte atomics.
pub fn validate_send_batch(wrs: &[SendWr<'_>], config: &QpConfig) -> Result<()> {
    use crate::TransportError::InvalidArgument;
    for wr in wrs {
        validate_sg_list(wr.sg_list, config)?;
        if let Some(target) = wr.op.atomic_target() {
            if target.addr % 8 != 0 {
                return Err(InvalidArgument(
                    "atomic target address is not 8-byte aligned",
                ));
            }
            if wr.sg_list.len() != 1 || wr.sg_list[0].len != 8 {
                return Err(InvalidArgument(
                    "atomic needs exactly one 8-byte scatter element",
                ));
            }
        }
    }
    Ok(())
}

/// Checks a receive batch: scatter lists non-empty, within `max_sge`, no zero lengths.
pub fn validate_recv_batch(wrs: &[RecvWr<'_>], config: &QpConfig) -> Result<()> {
    wrs.iter()
        .try_for_each(|wr| validate_sg_list(wr.sg_list, config))
}

fn validate_sg_list(sg_list: &[Sge], config: &QpConfig) -> Result<()> {
    use crate::TransportError::InvalidArgument;
    if sg_list.is_empty() {
        return Err(InvalidArgument("empty scatter-gather list"));
    }
    if sg_list.len() > config.max_sge {
        return Err(InvalidArgument("more scatter-gather elements than max_sge"));
    }
    if sg_list.iter().any(|sge| sge.len == 0) {
        return Err(InvalidArgument("zero-length scatter-gather element"));
    }
    Ok(())
}
