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
