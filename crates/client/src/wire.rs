//! Which wire a client reaches a server's lookup tables and pool nodes over.
//!
//! The soft wires exist in every build; verbs needs feature `rdma` and an RDMA device
//! (`KVCM_VERBS_DEVICE` names it, default the first; `KVCM_VERBS_GID_INDEX` the GID index
//! for RoCE, default 0). Pool nodes serve the soft wires only.

use kvcm_transport::any::{AnyDomain, VerbsDevice};
use kvcm_transport::soft::{self, SoftConfig, SoftDomain};
use kvcm_transport::TransportError;
use std::time::Duration;

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

    /// Opens a domain of this wire's provider; `response_timeout` bounds how long a soft
    /// peer may take to answer (on verbs the NIC's own retry timers apply).
    pub fn open_domain(self, response_timeout: Duration) -> Result<AnyDomain, TransportError> {
        match self.soft() {
            Some(wire) => {
                let config = SoftConfig::with_wire(wire).with_response_timeout(response_timeout);
                Ok(SoftDomain::open(config)?.into())
            }
            None => AnyDomain::open_verbs(&verbs_device_from_env()?),
        }
    }
}

/// The device `KVCM_VERBS_DEVICE` names (unset: the first one), with the GID index
/// `KVCM_VERBS_GID_INDEX` (unset: 0).
fn verbs_device_from_env() -> Result<VerbsDevice, TransportError> {
    let gid_index = match std::env::var("KVCM_VERBS_GID_INDEX") {
        Ok(text) => text.parse().map_err(|_| {
            TransportError::InvalidArgument("KVCM_VERBS_GID_INDEX is not a GID index (0-255)")
        })?,
        Err(_) => 0,
    };
    Ok(VerbsDevice {
        name: std::env::var("KVCM_VERBS_DEVICE").unwrap_or_default(),
        gid_index,
    })
}
