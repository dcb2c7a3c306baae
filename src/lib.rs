//! kvcm: a global KVCache manager for LLM inference.
//!
//! The control plane (reference-compatible gRPC + HTTP), the manager and the embedded server
//! live in this crate; hardware-free building blocks live in `crates/`:
//! `kvcm-index` (metadata index), `kvcm-storage` (block location allocation),
//! `kvcm-transport` (verbs-shaped RDMA API) and `kvcm-optimizer` (trace replay).
//! See docs/ARCHITECTURE.md for the module map.

pub mod config;
pub mod events;
pub mod manager;
pub mod proto;
pub mod server;
pub mod service;
mod sync;
