//! The crate's error type. I/O errors keep their `io::Error` source and name the path (and
//! offset) they happened at; URI errors name the URI and what is wrong with it.

use std::io;
use std::path::PathBuf;

/// An error of the data plane.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The URI's scheme is not a file-tier scheme (`file` or `hf3fs`).
    #[error(
        "block URI `{uri}` has scheme `{scheme}`; the file tier reads only `file` and `hf3fs`"
    )]
    UnsupportedScheme {
        /// The URI as given.
        uri: String,
        /// The scheme found before `://`.
        scheme: String,
    },
    /// The URI is malformed or unsafe to follow.
    #[error("invalid block URI `{uri}`: {reason}")]
    InvalidUri {
        /// The URI as given.
        uri: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The path lies outside the storage's configured root.
    #[error("path {path:?} is not under the storage root {root:?}")]
    OutsideRoot {
        /// The block file's path.
        path: PathBuf,
        /// The root it must lie under.
        root: PathBuf,
    },
    /// Creating the parent directories of a block file failed.
    #[error("cannot create directory {path:?}: {source}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The error of the file system.
        source: io::Error,
    },
    /// Opening (or creating) a block file failed.
    #[error("cannot open {path:?}: {source}")]
    Open {
        /// The block file.
        path: PathBuf,
        /// The error of the file system.
        source: io::Error,
    },
    /// Reading a block failed.
    #[error("read of {path:?} at offset {offset} failed: {source}")]
    Read {
        /// The block file.
        path: PathBuf,
        /// The block's byte offset.
        offset: u64,
        /// The error of the file system.
        source: io::Error,
    },
    /// Writing a block failed.
    #[error("write of {path:?} at offset {offset} failed: {source}")]
    Write {
        /// The block file.
        path: PathBuf,
        /// The block's byte offset.
        offset: u64,
        /// The error of the file system.
        source: io::Error,
    },
    /// The file ended before the block's last byte (a truncated or never-written block).
    #[error(
        "short read of {path:?} at offset {offset}: {got} of {expected} bytes before end of file"
    )]
    ShortRead {
        /// The block file.
        path: PathBuf,
        /// The block's byte offset.
        offset: u64,
        /// The block's length.
        expected: usize,
        /// The bytes there were before end of file.
        got: usize,
    },
    /// A range could not be registered as io_uring buffers.
    #[error("cannot register {len} bytes at {addr:#x} as io_uring buffers: {reason}")]
    RegisterBuffer {
        /// The range's address.
        addr: usize,
        /// Its length.
        len: usize,
        /// Why: the rule it breaks, or the kernel's error.
        reason: String,
    },
    /// The kernel refused to empty a registered range's buffer slots (the range is not used
    /// again all the same).
    #[error("unregistering the io_uring buffers at {addr:#x} failed: {reason}")]
    UnregisterBuffer {
        /// The range's address.
        addr: usize,
        /// The kernel's error.
        reason: String,
    },
}

impl DataError {
    /// Whether the block is simply not there (missing file or a file that ends before the
    /// block does): the caller treats it as a cache miss rather than a failure.
    pub fn is_miss(&self) -> bool {
        match self {
            DataError::ShortRead { .. } => true,
            DataError::Open { source, .. } => source.kind() == io::ErrorKind::NotFound,
            _ => false,
        }
    }
}

/// A copy of an `io::Error`, for an error shared by every op on one file (`io::Error` is not
/// `Clone`): the OS error code when there is one, else the kind and message.
pub(crate) fn copy_io_error(error: &io::Error) -> io::Error {
    match error.raw_os_error() {
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::new(error.kind(), error.to_string()),
    }
}
