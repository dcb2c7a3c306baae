//! The replay model: a prefix tree of blocks per instance and the compiled workload.
//!
//! A request hits the longest cached prefix of its block list; then every block of the
//! request is accessed in order (inserted if absent, refreshed if present). Blocks are the
//! nodes of the prefix tree, so the same key under two different prefixes is two blocks.

mod prefix_tree;
mod workload;

pub use prefix_tree::PrefixTree;
pub use workload::{Workload, NEVER};
