//! kvcm: a global KVCache manager for LLM inference.
//!
//! The control plane's edge (reference-compatible gRPC + HTTP, proto ⇄ domain conversion) and
//! the embedded server live in this crate; the domain model and its rules live in
//! `kvcm-manager` (re-exported as [`manager`]), and the other hardware-free building blocks in
//! `crates/`: `kvcm-index` (metadata index), `kvcm-storage` (block location allocation),
//! `kvcm-transport` (verbs-shaped RDMA API) and `kvcm-optimizer` (trace replay).
//! See docs/ARCHITECTURE.md for the module map.

pub mod access_log;
pub mod config;
pub mod curves;
pub mod events;
mod handshakes;
mod hangups;
pub mod http_json;
pub mod logs;
pub mod lookup;
pub mod pool;
pub mod proto;
pub mod server;
pub mod service;
pub mod tls_client;
pub mod tls_provider;

pub use kvcm_manager as manager;
