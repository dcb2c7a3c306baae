//! [`ReplayStats`]: what one replay measured.

use serde::Serialize;

use super::Log2Histogram;

/// Hits and requests of one time window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WindowStats {
    /// Prefix-hit blocks in the window.
    pub hit_blocks: u64,
    /// Requested blocks in the window.
    pub requested_blocks: u64,
}

/// Counters of one replay.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReplayStats {
    /// Blocks requested (sum of request lengths).
    pub requested_blocks: u64,
    /// Blocks served from the cache as part of a request's cached prefix.
    pub hit_blocks: u64,
    /// Prompt tokens requested.
    pub requested_tokens: u64,
    /// Prompt tokens covered by prefix-hit blocks.
    pub hit_tokens: u64,
    /// Prefix-hit blocks that the memory tier served (two-tier runs).
    pub memory_hit_blocks: u64,
    /// Blocks written into the main tier (insertions and demotions).
    pub blocks_written_main: u64,
    /// Blocks written into the memory tier (insertions and promotions).
    pub blocks_written_memory: u64,
    /// Distribution of prefix-hit lengths (blocks per request).
    pub prefix_hit_lengths: Log2Histogram,
    /// Hits over time, in equal time windows.
    pub windows: Vec<WindowStats>,
}

impl ReplayStats {
    /// Prefix-hit blocks / requested blocks (0 when nothing was requested).
    pub fn block_hit_rate(&self) -> f64 {
        ratio(self.hit_blocks, self.requested_blocks)
    }

    /// Prefix-hit tokens / requested tokens.
    pub fn token_hit_rate(&self) -> f64 {
        ratio(self.hit_tokens, self.requested_tokens)
    }

    /// Memory-tier prefix hits / requested blocks.
    pub fn memory_hit_rate(&self) -> f64 {
        ratio(self.memory_hit_blocks, self.requested_blocks)
    }
}

/// `part / whole`, 0 for an empty whole.
pub(crate) fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}
