//! kvcm-optimizer: replays KV-cache access traces against eviction policies and plans capacity.
//!
//! Placeholder: the optimizer issue fills this crate in.

pub mod cli;
