//! [`Record`]: what the request path hands to the writer thread — the raw facts of one call,
//! as cheap to build as possible. The writer thread turns records into schema-v1 lines.

use std::sync::Arc;

use kvcm_index::BlockKey;
use kvcm_optimizer::trace::events::{Event, EventType, EVENT_LOG_VERSION};

/// One successful call to log. Block keys are written as the `u64` with the same bits as
/// the wire's `i64`, so that a key keeps its identity through replay.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// GetCacheLocation: every key of the request, in prefix order.
    Lookup {
        /// When the call was served (µs since the Unix epoch).
        ts_us: u64,
        /// The instance.
        instance: Arc<str>,
        /// The request's keys.
        keys: Vec<BlockKey>,
        /// The instance's block size in tokens.
        block_tokens: u32,
        /// `len(token_ids)` when the request sent tokens.
        input_tokens: Option<u64>,
    },
    /// StartWriteCache: the keys the session will write (the absent ones), in request order.
    WriteStarted {
        /// When the call was served (µs since the Unix epoch).
        ts_us: u64,
        /// The instance.
        instance: Arc<str>,
        /// The new keys, in the session's block order.
        keys: Vec<BlockKey>,
        /// The write session id.
        session: String,
    },
    /// FinishWriteCache: the session's blocks that were committed.
    WriteFinished {
        /// When the call was served (µs since the Unix epoch).
        ts_us: u64,
        /// The instance.
        instance: Arc<str>,
        /// The write session id.
        session: String,
        /// The committed keys, in the session's block order.
        keys: Vec<BlockKey>,
    },
    /// The reclaimer evicted these keys.
    Reclaimed {
        /// When they were evicted (µs since the Unix epoch).
        ts_us: u64,
        /// The instance.
        instance: Arc<str>,
        /// The evicted keys, in key order.
        keys: Vec<BlockKey>,
    },
}

/// The `u64` written for a wire key (same bits).
pub fn key_bits(key: BlockKey) -> u64 {
    key as u64
}

/// A schema-v1 event with the fields every type carries.
pub fn event(event_type: EventType, ts_us: u64, instance: &str, keys: Vec<u64>) -> Event {
    Event {
        v: EVENT_LOG_VERSION,
        ts_us,
        event: event_type,
        instance: instance.to_string(),
        keys,
        block_tokens: None,
        input_tokens: None,
        write_session: None,
    }
}
