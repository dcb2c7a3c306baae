//! Errors of the trace readers.

use std::path::PathBuf;

/// Why a trace could not be read. Every variant names the file; line errors name the line.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be opened or read.
    #[error("{path}: {source}")]
    Io {
        /// The trace file.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// The file holds no request.
    #[error("{path}: trace is empty (no requests)")]
    Empty {
        /// The trace file.
        path: PathBuf,
    },
    /// The first line matches no known format and `--format` was not given.
    #[error("{path}:{line}: cannot detect the trace format; pass --format mooncake|bailian|events|native")]
    UnknownFormat {
        /// The trace file.
        path: PathBuf,
        /// The line that was inspected.
        line: usize,
    },
    /// A line is malformed (truncated JSON, wrong types, missing fields, bad values).
    #[error("{path}:{line}: {message}")]
    Line {
        /// The trace file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with the line.
        message: String,
    },
    /// The trace holds more block accesses or blocks than the replay can index (2^32 - 1).
    #[error("{path}: trace too large: more than 2^32 - 1 block accesses or blocks")]
    TooLarge {
        /// The trace file being read when the limit was reached.
        path: PathBuf,
    },
    /// Without `--block-tokens`, a trace file implies a different block size than the files
    /// read before it (their block ids would not mean the same amount of prompt).
    #[error("{path}: implies {found} tokens per block, but the trace files before it imply {expected}; pass --block-tokens to replay them together anyway")]
    BlockTokensMismatch {
        /// The first file that disagrees.
        path: PathBuf,
        /// Tokens per block this file declares or its format implies.
        found: u32,
        /// Tokens per block of the files before it.
        expected: u32,
    },
    /// A directory was given as a trace but holds no event-log file.
    #[error("{path}: directory holds no event log (events.jsonl, events.N.jsonl)")]
    NoEventLog {
        /// The directory.
        path: PathBuf,
    },
}
