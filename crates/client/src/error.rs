//! Errors of the client.

/// What a client call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with a non-OK status (its code and message as sent).
    #[error("server answered {code}: {message}")]
    Server {
        /// The wire `ErrorCode` number.
        code: i32,
        /// The status message.
        message: String,
    },
    /// No server could be reached.
    #[error("no kvcm server reachable: {0}")]
    Unreachable(String),
    /// The server refused the call's credential (gRPC UNAUTHENTICATED: none, unknown,
    /// revoked or expired) or what it may call (PERMISSION_DENIED); the server's reason.
    #[error("refused by the server's access check: {0}")]
    Unauthorized(String),
    /// The arguments are unusable (named).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The device (GPU) holding the blocks failed or is missing.
    #[error("device: {0}")]
    Device(String),
}

/// Why the fast path could not answer (the client then asks gRPC).
#[derive(Debug, thiserror::Error)]
pub(crate) enum FastError {
    /// The table or the transport failed, or the format is unknown: reconnect later.
    #[error("{0}")]
    Broken(String),
    /// This query needs the server (overflowed key, an error only the server words).
    #[error("{0}")]
    AskServer(&'static str),
}

impl From<kvcm_transport::TransportError> for FastError {
    fn from(error: kvcm_transport::TransportError) -> Self {
        FastError::Broken(error.to_string())
    }
}

impl From<kvcm_lookup::FormatError> for FastError {
    fn from(error: kvcm_lookup::FormatError) -> Self {
        FastError::Broken(error.to_string())
    }
}
