//! The trace formats and detection of a file's format from its first line.

/// A trace file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TraceFormat {
    /// Mooncake FAST'25 jsonl: `timestamp` (ms), `input_length`, `output_length`, `hash_ids`.
    Mooncake,
    /// Qwen-Bailian jsonl: `timestamp` (s, float), `chat_id`, `parent_chat_id`, `turn`, `type`,
    /// `input_length`, `output_length`, `hash_ids` (16-token blocks).
    Bailian,
    /// kvcm's event log (GetCacheLocation / StartWriteCache / FinishWriteCache / reclaim).
    Events,
    /// kvcm's native trace: a header line, then one request per line.
    Native,
}

impl TraceFormat {
    /// Tokens per block the format implies when the trace does not say.
    pub fn default_block_tokens(self) -> u32 {
        match self {
            TraceFormat::Mooncake => 512,
            TraceFormat::Bailian | TraceFormat::Events | TraceFormat::Native => 16,
        }
    }

    /// Guesses the format from the first non-blank line; `None` when nothing matches.
    pub fn detect(first_line: &str) -> Option<TraceFormat> {
        let value: serde_json::Value = serde_json::from_str(first_line).ok()?;
        let object = value.as_object()?;
        if object.contains_key("kvcm_trace") {
            Some(TraceFormat::Native)
        } else if object.contains_key("event") {
            Some(TraceFormat::Events)
        } else if object.contains_key("chat_id") {
            Some(TraceFormat::Bailian)
        } else if object.contains_key("hash_ids") {
            Some(TraceFormat::Mooncake)
        } else {
            None
        }
    }
}
