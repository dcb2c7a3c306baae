//! The conformance suite every [`MetaIndex`] backend must pass (cargo feature `testing`).
//!
//! ```no_run
//! use kvcm_index::{conformance, LocalIndex, LocalIndexConfig};
//! conformance::run_all(|max_key_count| {
//!     LocalIndex::new(LocalIndexConfig { shard_bits: 4, max_key_count }).expect("valid config")
//! });
//! ```
//!
//! `make(max_key_count)` must return a fresh, empty index storing `u64` values whose key cap
//! is `max_key_count` (`u64::MAX`: no cap). Every check panics with a message on failure; it
//! is test support code, not library code.

mod basics;
mod concurrency;
mod model;
mod scan_sample;

use crate::MetaIndex;

pub use basics::{
    check_empty_batches, check_get_put_delete, check_key_cap, check_read_modify_write,
    check_read_modify_write_batches,
};
pub use concurrency::{check_concurrent_increments, check_opposite_order_batches};
pub use model::check_against_btreemap_model;
pub use scan_sample::{
    check_sample_is_uniform, check_sample_sizes, check_scan_pages, check_scan_under_writes,
};

/// Value of an index under test.
pub type Value = u64;

/// Runs every check, each on fresh indexes from `make`.
pub fn run_all<I, F>(make: F)
where
    I: MetaIndex<Value> + 'static,
    F: Fn(u64) -> I,
{
    let unbounded = || make(u64::MAX);
    check_get_put_delete(&unbounded());
    check_empty_batches(&unbounded());
    check_read_modify_write(&unbounded());
    check_read_modify_write_batches(&unbounded());
    check_key_cap(&make(3), 3);
    check_scan_pages(&unbounded());
    check_scan_under_writes(unbounded());
    check_sample_sizes(&unbounded());
    check_sample_is_uniform(&unbounded());
    check_concurrent_increments(unbounded());
    check_opposite_order_batches(unbounded());
    check_against_btreemap_model(unbounded);
}
