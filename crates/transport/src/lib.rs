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
//!
//! A one-sided READ between two soft domains (two "hosts"):
//!
//! ```
//! use kvcm_transport::soft::{SoftConfig, SoftDomain, Wire};
//! use kvcm_transport::{
//!     Access, CompletionQueue, Domain, Memory, QpConfig, QueuePair, Region, SendOp, SendWr,
//! };
//! # fn main() -> kvcm_transport::Result<()> {
//! let open = || SoftDomain::open(SoftConfig::with_wire(Wire::Tcp));
//! let (a, b) = (open()?, open()?);
//! let (memory_a, memory_b) = (a.alloc(4096)?, b.alloc(4096)?);
//! let local = a.register(&memory_a, 0, 4096, Access::LOCAL_WRITE)?;
//! let remote = b.register(&memory_b, 0, 4096, Access::REMOTE_READ)?;
//! memory_b.write(0, b"hello")?;
//! let (cq_a, cq_b) = (a.create_cq()?, b.create_cq()?);
//! let qp_a = a.create_qp(&cq_a, &cq_a, QpConfig::default())?;
//! let qp_b = b.create_qp(&cq_b, &cq_b, QpConfig::default())?;
//! // Endpoints normally travel out of band (`exchange_endpoints` over a TcpStream).
//! qp_a.connect(&qp_b.endpoint())?;
//! qp_b.connect(&qp_a.endpoint())?;
//! let read = SendOp::Read(remote.remote(0));
//! qp_a.post_send(&[SendWr { wr_id: 1, op: read, sg_list: &[local.sge(0, 5)], signaled: true }])?;
//! assert!(cq_a.wait(std::time::Duration::from_secs(10))?);
//! let mut got = [0u8; 5];
//! memory_a.read(0, &mut got)?;
//! assert_eq!(&got, b"hello");
//! # Ok(())
//! # }
//! ```

pub mod any;
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
/// Waits until one of the descriptors is readable (e.g. completion queues' event fds and
/// an application doorbell), for pollers that park on several at once.
pub use sys::poll_readable;
/// Marks this process (not) dumpable: a process that serves memory on the shared-memory
/// wire should not be, so that other processes of its user cannot open its memfds through
/// `/proc/<pid>/fd` behind the descriptor broker's back (its `/proc` entries then belong
/// to root; core dumps are off).
pub use sys::process::{is_dumpable, set_dumpable};
