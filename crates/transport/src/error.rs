//! The one error type of the transport layer.
//!
//! Errors returned by calls are API misuse or resource failures; the outcome of a work
//! request that was accepted is always reported as a [`crate::WcStatus`] in a completion.

use std::io;

/// Why a transport call was refused. A refused call changed nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// An argument breaks the API contract (zero length, unaligned atomic, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// The range overlaps a region already registered on the same memory.
    #[error("registration [{offset}, {end}) overlaps an existing registration")]
    OverlappingRegistration {
        /// First byte of the refused range.
        offset: usize,
        /// One past the last byte of the refused range.
        end: usize,
    },
    /// The queue pair is not in a state that accepts the call.
    #[error("queue pair {qpn} is {state:?}: {action} refused")]
    QpState {
        /// Number of the queue pair.
        qpn: u32,
        /// State it is in.
        state: crate::QpState,
        /// What was attempted.
        action: &'static str,
    },
    /// More work requests outstanding than the queue depth allows.
    #[error("{queue} queue full ({depth} outstanding work requests)")]
    QueueFull {
        /// "send" or "receive".
        queue: &'static str,
        /// Configured depth.
        depth: usize,
    },
    /// The peer's queue-pair endpoint could not be decoded or used.
    #[error("bad queue-pair endpoint: {0}")]
    BadEndpoint(String),
    /// This provider cannot do what was asked (the soft providers give peers no access to
    /// caller-owned memory).
    #[error("not supported by this provider: {0}")]
    Unsupported(&'static str),
    /// No RDMA device is present (verbs provider).
    #[error("no RDMA device: {0}")]
    NoDevice(String),
    /// A table (memory keys, queue pair numbers) is full.
    #[error("out of {0}")]
    Exhausted(&'static str),
    /// The operation did not finish before its deadline.
    #[error("timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// An operating-system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl TransportError {
    /// Wraps an OS error with what was being done.
    pub(crate) fn io(context: &'static str, source: io::Error) -> Self {
        TransportError::Io { context, source }
    }

    /// The current `errno` as an [`TransportError::Io`].
    pub(crate) fn last_os(context: &'static str) -> Self {
        Self::io(context, io::Error::last_os_error())
    }
}

/// Result of transport calls.
pub type Result<T> = std::result::Result<T, TransportError>;
