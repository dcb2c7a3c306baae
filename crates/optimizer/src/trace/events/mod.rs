//! kvcm's event log: the JSON lines the server writes for every GetCacheLocation,
//! StartWriteCache, FinishWriteCache and reclaim, so a production day can be replayed.
//!
//! One [`Event`] per line, schema version 1 (docs/optimizer.md has the full table). The log is
//! rotated by size ([`EventLogWriter`]); replay the rotated files oldest first.

mod writer;

pub use writer::{EventLogWriter, RotatingLog, EVENTS_STEM};

use serde::{Deserialize, Serialize};

/// Event-log schema version written in every line's `v` field.
pub const EVENT_LOG_VERSION: u32 = 1;

/// Which server call or action an event records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventType {
    /// A prefix lookup: `keys` is the full block-key list of the prompt. Replayed as a request.
    GetCacheLocation,
    /// The engine starts writing `keys` (the blocks the lookup missed).
    StartWriteCache,
    /// The write of `keys` under `write_session` finished.
    FinishWriteCache,
    /// The server's reclaimer evicted `keys`.
    Reclaim,
}

/// One line of the event log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Schema version ([`EVENT_LOG_VERSION`]).
    pub v: u32,
    /// Time of the event in microseconds since the Unix epoch.
    pub ts_us: u64,
    /// What happened.
    pub event: EventType,
    /// Instance id the call was made for.
    pub instance: String,
    /// Block keys concerned, in prefix order.
    pub keys: Vec<u64>,
    /// Tokens per block of the instance; required on `get_cache_location`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_tokens: Option<u32>,
    /// Prompt tokens of a lookup; defaults to `keys.len() * block_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    /// Write session id of `start_write_cache` / `finish_write_cache`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_session: Option<String>,
}
