//! Replaying a [`Workload`](crate::model::Workload) against policies.
//!
//! [`replay`] simulates one configuration (a policy, or a memory tier in front of a main
//! tier) and returns [`ReplayStats`]; [`run_parallel`] spreads many configurations over
//! threads; [`LruCurve`] gives LRU's hit rate at every capacity from one pass over the trace
//! (stack distances); [`capacity_for_target`] finds the capacity a policy needs for a hit rate.

mod histogram;
mod parallel;
mod replay;
mod stack;
mod stats;
mod target;
mod tiers;

pub use histogram::Log2Histogram;
pub use parallel::run_parallel;
pub use replay::{replay, Config};
pub use stack::LruCurve;
pub use stats::{ReplayStats, WindowStats};
pub use target::capacity_for_target;
pub use tiers::Tiers;
