//! Which wire a client reaches a server's lookup tables and pool nodes over.
//!
//! The soft wires exist in every build; verbs needs feature `rdma` and an RDMA device
//! (`KVCM_VERBS_DEVICE` names it, default the first; `KVCM_VERBS_GID_INDEX` the GID index
//! for RoCE, default 0). Pool nodes serve the soft wires only.

use kvcm_transport::any::AnyDomain;
use kvcm_transport::soft::{self, SoftConfig, SoftDomain};

use crate::error::FastError;

/// A wire of the fast path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Wire {
    /// The soft provider over TCP: anywhere.
    Tcp,
    /// The soft provider over shared memory: on the server's host.
    Shm,
    /// RDMA verbs (feature `rdma`): a NIC, or kernel soft-RoCE.
    Verbs,
}

impl Wire {
    /// The wire's index in the table header's rkeys (as the server numbers them).
    pub fn index(self) -> usize {
        match self {
            Wire::Tcp => kvcm::lookup::WIRE_SOFT_TCP,
            Wire::Shm => kvcm::lookup::WIRE_SOFT_SHM,
            Wire::Verbs => kvcm::lookup::WIRE_VERBS,
        }
    }

    /// The wire's name in bootstrap answers ("soft-tcp", "soft-shm", "verbs").
    pub fn name(self) -> &'static str {
        kvcm::lookup::wire_name(self.index())
    }

    /// The soft provider's wire, when this is one.
    pub fn soft(self) -> Option<soft::Wire> {
        match self {
            Wire::Tcp => Some(soft::Wire::Tcp),
            Wire::Shm => Some(soft::Wire::Shm),
            Wire::Verbs => None,
        }
    }

    /// Opens a domain of this wire's provider.
    pub(crate) fn open(self) -> Result<AnyDomain, FastError> {
        match self.soft() {
            Some(wire) => Ok(SoftDomain::open(SoftConfig::with_wire(wire))?.into()),
            None => {
                let device = std::env::var("KVCM_VERBS_DEVICE").ok();
                let gid_index = match std::env::var("KVCM_VERBS_GID_INDEX") {
                    Ok(text) => text.parse().map_err(|_| {
                        FastError::Broken(format!(
                            "KVCM_VERBS_GID_INDEX={text:?} is not a GID index (0-255)"
                        ))
                    })?,
                    Err(_) => 0,
                };
                Ok(AnyDomain::open_verbs(device.as_deref(), gid_index)?)
            }
        }
    }
}
