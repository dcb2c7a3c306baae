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
    /// A generation has no room left (buckets of a key, string heap or storage handles):
    /// the publisher builds a bigger one.
    #[error("lookup table generation is full: {0}")]
    Full(&'static str),
    /// The memory refused an access.
    #[error(transparent)]
    Memory(#[from] kvcm_transport::TransportError),
}

/// Result of the table format.
pub type Result<T> = std::result::Result<T, FormatError>;
