//! kvcm-transport: one verbs-shaped API over several RDMA providers.
//!
//! - [`api`]: the object model (domain, memory, region, completion queue, queue pair) and
//!   the work requests and completions every provider speaks.
//! - [`soft`]: the userspace software-RDMA provider, always built: a NIC thread per domain
//!   serving one-sided READ / WRITE / atomics over TCP, or over shared memory on one host.
//! - `verbs` (feature `rdma`): the same API on libibverbs.
//! - [`HostMemory`]: registrable memory, common to all providers.
//! - [`ProviderKind`]: provider selection by name.
//!
//! See `docs/transport.md` for the design and how to run the suite on soft-RoCE.

pub mod api;
mod error;
mod memory;
mod provider;
pub mod soft;
mod sys;
#[cfg(feature = "rdma")]
pub mod verbs;

pub use api::*;
pub use error::{Result, TransportError};
pub use memory::HostMemory;
pub use provider::ProviderKind;
