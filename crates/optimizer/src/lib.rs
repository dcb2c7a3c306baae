//! kvcm-optimizer: replays KV-cache access traces against eviction policies and plans
//! capacity (`kvcm optimize`).
//!
//! Layers, bottom up: [`trace`] reads trace files into requests; [`model`] compiles them into
//! a prefix-tree workload; [`policy`] holds the eviction policies (shared with the server's
//! reclaimer); [`sim`] replays workloads against policies and computes the one-pass LRU
//! curve; [`report`] writes tables, CSV, JSON and plots; [`cli`] wires it to the command line.

pub mod cli;
pub mod model;
pub mod policy;
pub mod report;
pub mod rng;
pub mod sim;
pub mod trace;
