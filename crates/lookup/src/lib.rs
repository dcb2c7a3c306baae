//! kvcm-lookup: the lookup table kvcm publishes per instance in registered memory, so that
//! clients answer GetCacheLocation queries with one-sided READs and no server thread.
//!
//! The format (docs/lookup-table.md is its reference for readers in other languages):
//! - a **header** ([`header`]) naming the current **generation**: one memory holding the
//!   availability block ([`avail`]), the bucket array and the string heap ([`strings`]);
//! - **buckets** of whole 64-byte lines, each a seqlocked block ([`seqlock`]) of fixed-size
//!   **slots** ([`slot`]), one per SERVING location; a key's slots lie in its two candidate
//!   buckets ([`header::candidates`]);
//! - growth or compaction builds a new generation, flips the header (epoch + 1) and retires
//!   every block of the old one, which readers then refuse.
//!
//! [`generation`] is the publisher's writer; [`reader`] decodes what a client copied.

pub mod avail;
mod error;
pub mod generation;
pub mod header;
pub mod reader;
pub mod seqlock;
pub mod slot;
pub mod strings;

pub use error::{FormatError, Full, Result};
