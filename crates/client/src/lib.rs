//! kvcm-client: the engine-side library of kvcm.
//!
//! GetCacheLocation is answered from the instance's published lookup table with one-sided
//! READs (soft-TCP anywhere, soft-shm on the server's host): one round trip for every key's
//! two candidate buckets, no server thread involved, and the same answer the server gives
//! (see `fast`). Queries the table cannot answer exactly, and every other call, go to the
//! server over gRPC, with failover across the configured servers.
//!
//! ```no_run
//! use kvcm_client::{Client, ClientConfig, ServerAddress, Wire};
//! # fn main() -> Result<(), kvcm_client::ClientError> {
//! let client = Client::connect(ClientConfig {
//!     servers: vec![ServerAddress {
//!         grpc: "http://127.0.0.1:6381".into(),
//!         http: "127.0.0.1:6382".parse().unwrap(),
//!     }],
//!     instance_id: "instance1".into(),
//!     wire: Some(Wire::Tcp),
//! })?;
//! let hits = client.prefix_match(&[1, 2, 3])?;
//! println!("{} of 3 blocks cached", hits.len());
//! # Ok(())
//! # }
//! ```

mod bootstrap;
mod client;
mod connection;
mod error;
mod fast;
mod grpc;
mod metrics;

pub use client::{Client, ClientConfig, ServerAddress};
pub use error::ClientError;
pub use kvcm_transport::soft::Wire;
pub use metrics::FastPathMetrics;
