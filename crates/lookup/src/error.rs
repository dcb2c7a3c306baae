//! Errors of the table format.

/// What can go wrong writing or decoding the table.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// The bytes are not a table this reader understands (magic, version, bounds).
    #[error("lookup table: {0}")]
    Corrupt(&'static str),
    /// The table was written by a newer format version.
    #[error("lookup table format version {found} is not supported (this reader knows {known})")]
    UnknownVersion {
        /// Version in the header.
        found: u32,
        /// Version this build reads.
        known: u32,
    },
    /// A generation has no room left: the publisher builds a bigger one.
    #[error("lookup table generation is full: {0}")]
    Full(Full),
    /// A layout that cannot be made (more specs than a slot holds, memory too small).
    #[error("lookup table layout: {0}")]
    Layout(&'static str),
    /// The memory refused an access.
    #[error(transparent)]
    Memory(#[from] kvcm_transport::TransportError),
}

/// What ran out in a generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// Both candidate buckets of a key.
    Buckets,
    /// The string heap.
    Heap,
    /// The availability block's storage handles.
    Handles,
    /// A slot's records (a location with checksums needs two per part).
    Parts,
}

impl std::fmt::Display for Full {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Full::Buckets => "both buckets of a key",
            Full::Heap => "string heap",
            Full::Handles => "storage handles",
            Full::Parts => "slot records",
        })
    }
}

/// Result of the table format.
pub type Result<T> = std::result::Result<T, FormatError>;
