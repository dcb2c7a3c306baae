//! kvcm-client: the engine-side library of kvcm.
//!
//! GetCacheLocation is answered from the instance's published lookup table with one-sided
//! READs (soft-TCP anywhere, soft-shm on the server's host, verbs with feature `rdma`): one round trip for every key's
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
//!     api_key: None,
//!     tls: None,
//! })?;
//! let hits = client.prefix_match(&[1, 2, 3])?;
//! println!("{} of 3 blocks cached", hits.len());
//! // In a lookup loop, reuse one answer vector: its locations and strings are overwritten.
//! let mut answer = Vec::new();
//! client.prefix_match_into(&[1, 2, 3, 4], &mut answer)?;
//! # Ok(())
//! # }
//! ```
//!
//! [`TransferEngine`] moves the blocks themselves: `put_blocks` (two-phase write with the
//! real success mask) and `get_blocks` (fast lookup, then reads) against pool nodes and
//! the file tier, reporting the path every block took.

mod bootstrap;
mod client;
mod connection;
mod data;
mod error;
mod fast;
mod grpc;
mod metrics;
mod wire;

pub use client::{Client, ClientConfig, ServerAddress};
#[cfg(feature = "cuda")]
pub use data::{cuda_present, CudaDevice};
pub use data::{
    Device, DeviceRange, GetOutcome, HostStaging, PutOutcome, TransferConfig, TransferEngine,
    TransferPath,
};
pub use error::ClientError;
pub use kvcm::tls_client::TlsClient;
pub use kvcm_data::{DirectMode, FileIoConfig, IoBackend, IoPath};
pub use metrics::FastPathMetrics;
pub use wire::Wire;
