//! Trace readers: turn trace files into a stream of [`Request`]s.
//!
//! Four line-oriented JSON formats are understood (see docs/optimizer.md for each schema):
//! Mooncake jsonl, Qwen-Bailian jsonl, kvcm's own event log and the native kvcm format.
//! Readers stream: they hold one line at a time. Every error names the file and the 1-based
//! line it came from; a reader never panics on input.

mod error;
pub mod events;
mod format;
mod line;
mod reader;

pub use error::TraceError;
pub use format::TraceFormat;
pub use reader::TraceReader;

use std::path::PathBuf;

/// One inference request as the optimizer replays it: a prefix lookup over `blocks`, followed
/// by an access to every block in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Arrival time in microseconds since the trace's epoch.
    pub timestamp_us: u64,
    /// Inference instance the request was sent to; empty for single-instance traces.
    pub instance: String,
    /// Prompt tokens of the request (the denominator of the token hit rate).
    pub input_tokens: u64,
    /// Block keys of the prompt, in prefix order.
    pub blocks: Vec<u64>,
}

impl Request {
    /// A request of the default (unnamed) instance at time 0: for tests and generated traces.
    pub fn untimed(blocks: &[u64], input_tokens: u64) -> Request {
        Request {
            timestamp_us: 0,
            instance: String::new(),
            input_tokens,
            blocks: blocks.to_vec(),
        }
    }
}

/// The files to read for `paths`, in order: a file stands for itself, a directory for the
/// rotated event log inside it, oldest file first.
pub fn expand_paths(paths: &[PathBuf]) -> Result<Vec<PathBuf>, TraceError> {
    let mut files = Vec::new();
    for path in paths {
        if !path.is_dir() {
            files.push(path.clone());
            continue;
        }
        let log = events::EventLogWriter::files_oldest_first(path);
        if log.is_empty() {
            return Err(TraceError::NoEventLog { path: path.clone() });
        }
        files.extend(log);
    }
    Ok(files)
}
