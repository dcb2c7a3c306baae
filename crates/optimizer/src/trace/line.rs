//! Parsing of one trace line into a [`Request`], per format.
//!
//! Parsers validate every field they use; fields the model does not need are ignored, so
//! traces with extra columns still load.

use serde::Deserialize;

use super::events::{Event, EventType, EVENT_LOG_VERSION};
use super::{Request, TraceFormat};

/// What one line turned into.
pub(crate) enum Parsed {
    /// A request to replay.
    Request(Request),
    /// A valid line that carries no request (a header, a write or reclaim event).
    Skip,
}

/// Parses lines of one file; keeps the little state some formats need.
pub(crate) struct LineParser {
    format: TraceFormat,
    /// Tokens per block as declared by the file (native header, event log), if any.
    block_tokens: Option<u32>,
    native_header_seen: bool,
}

#[derive(Deserialize)]
struct MooncakeLine {
    timestamp: f64,
    input_length: u64,
    hash_ids: Vec<u64>,
}

#[derive(Deserialize)]
struct BailianLine {
    #[serde(rename = "chat_id")]
    _chat_id: i64,
    #[serde(rename = "parent_chat_id")]
    _parent_chat_id: i64,
    #[serde(rename = "turn")]
    _turn: u64,
    timestamp: f64,
    input_length: u64,
    hash_ids: Vec<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NativeHeader {
    kvcm_trace: u32,
    block_tokens: u32,
}

#[derive(Deserialize)]
struct NativeLine {
    ts_us: u64,
    #[serde(default)]
    instance: String,
    tokens: u64,
    blocks: Vec<u64>,
}

impl LineParser {
    /// A parser for `format`.
    pub(crate) fn new(format: TraceFormat) -> Self {
        LineParser {
            format,
            block_tokens: None,
            native_header_seen: false,
        }
    }

    /// Tokens per block declared by the file so far.
    pub(crate) fn block_tokens(&self) -> Option<u32> {
        self.block_tokens
    }

    /// Parses one non-blank line; the error message does not repeat file and line.
    pub(crate) fn parse(&mut self, text: &str) -> Result<Parsed, String> {
        match self.format {
            TraceFormat::Mooncake => parse_mooncake(text),
            TraceFormat::Bailian => parse_bailian(text),
            TraceFormat::Native => self.parse_native(text),
            TraceFormat::Events => self.parse_event(text),
        }
    }

    fn parse_native(&mut self, text: &str) -> Result<Parsed, String> {
        if !self.native_header_seen {
            let header: NativeHeader =
                from_json(text).map_err(|e| format!("expected the native header line: {e}"))?;
            if header.kvcm_trace != 1 {
                return Err(format!(
                    "unsupported native trace version {}",
                    header.kvcm_trace
                ));
            }
            self.block_tokens = Some(positive_block_tokens(header.block_tokens)?);
            self.native_header_seen = true;
            return Ok(Parsed::Skip);
        }
        let line: NativeLine = from_json(text)?;
        Ok(Parsed::Request(Request {
            timestamp_us: line.ts_us,
            instance: line.instance,
            input_tokens: line.tokens,
            blocks: line.blocks,
        }))
    }

    fn parse_event(&mut self, text: &str) -> Result<Parsed, String> {
        let event: Event = from_json(text)?;
        if event.v != EVENT_LOG_VERSION {
            return Err(format!("unsupported event log version {}", event.v));
        }
        if event.event != EventType::GetCacheLocation {
            return Ok(Parsed::Skip);
        }
        let declared = event
            .block_tokens
            .ok_or("get_cache_location event without block_tokens")?;
        let declared = positive_block_tokens(declared)?;
        match self.block_tokens {
            Some(known) if known != declared => {
                return Err(format!(
                    "block_tokens {declared} differs from {known} earlier in the log"
                ))
            }
            _ => self.block_tokens = Some(declared),
        }
        let input_tokens = event
            .input_tokens
            .unwrap_or(event.keys.len() as u64 * u64::from(declared));
        Ok(Parsed::Request(Request {
            timestamp_us: event.ts_us,
            instance: event.instance,
            input_tokens,
            blocks: event.keys,
        }))
    }
}

fn parse_mooncake(text: &str) -> Result<Parsed, String> {
    let line: MooncakeLine = from_json(text)?;
    single_instance_request(line.timestamp, 1_000.0, line.input_length, line.hash_ids)
}

fn parse_bailian(text: &str) -> Result<Parsed, String> {
    let line: BailianLine = from_json(text)?;
    single_instance_request(
        line.timestamp,
        1_000_000.0,
        line.input_length,
        line.hash_ids,
    )
}

/// A request of a single-instance trace whose timestamps count units of
/// `micros_per_unit` microseconds.
fn single_instance_request(
    timestamp: f64,
    micros_per_unit: f64,
    input_tokens: u64,
    blocks: Vec<u64>,
) -> Result<Parsed, String> {
    Ok(Parsed::Request(Request {
        timestamp_us: scaled_timestamp(timestamp, micros_per_unit)?,
        instance: String::new(),
        input_tokens,
        blocks,
    }))
}

fn from_json<'a, T: Deserialize<'a>>(text: &'a str) -> Result<T, String> {
    serde_json::from_str(text).map_err(|e| e.to_string())
}

/// Converts a timestamp in some unit to microseconds; rejects negative and non-finite values.
fn scaled_timestamp(value: f64, micros_per_unit: f64) -> Result<u64, String> {
    let micros = value * micros_per_unit;
    if !micros.is_finite() || micros < 0.0 || micros > u64::MAX as f64 {
        return Err(format!(
            "timestamp {value} is not a non-negative finite number"
        ));
    }
    Ok(micros.round() as u64)
}

fn positive_block_tokens(block_tokens: u32) -> Result<u32, String> {
    if block_tokens == 0 {
        return Err("block_tokens must be at least 1".to_string());
    }
    Ok(block_tokens)
}
