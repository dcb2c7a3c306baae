//! The `verbs` provider (feature `rdma`): the same API on libibverbs, for real NICs and
//! kernel soft-RoCE (rxe). Object tree: device context → protection domain → memory
//! region / completion queue → RC queue pair, each child holding its parents by `Arc`.
//!
//! With no device, [`VerbsDomain::open`] fails with [`TransportError::NoDevice`].
//! All raw verbs calls live in this module, each `unsafe` block with a `// SAFETY:` note.

mod cq;
mod device;
mod ledger;
mod qp;
mod region;

pub use cq::VerbsCq;
pub use qp::VerbsQp;
pub use region::VerbsRegion;

use crate::memory::HostMemory;
use crate::{Access, Domain, QpConfig, Result, TransportError};
use device::{DeviceContext, ProtectionDomain};
use qp::PortInfo;
use rdma_sys::*;
use std::sync::Arc;

/// Which device and port a verbs domain uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerbsConfig {
    /// Device name (e.g. `mlx5_0`, `rxe0`); default: the first device.
    pub device: Option<String>,
    /// Port number; 0 means the default, port 1.
    pub port: u8,
    /// GID table index used for RoCE addressing. Default 0 (use 1 for RoCE v2 on rxe).
    pub gid_index: u8,
}

/// An opened verbs device with its protection domain.
#[derive(Clone, Debug)]
pub struct VerbsDomain {
    pd: Arc<ProtectionDomain>,
    port: PortInfo,
}

impl VerbsDomain {
    /// Opens the configured device; `NoDevice` when the host has none.
    pub fn open(config: &VerbsConfig) -> Result<Self> {
        let context = Arc::new(DeviceContext::open(config.device.as_deref())?);
        let port = query_port(&context, config.port.max(1), config.gid_index)?;
        let pd = Arc::new(ProtectionDomain::allocate(context)?);
        Ok(VerbsDomain { pd, port })
    }

    /// The device's name.
    pub fn device_name(&self) -> &str {
        &self.pd.context.name
    }
}

fn query_port(context: &DeviceContext, port: u8, gid_index: u8) -> Result<PortInfo> {
    // SAFETY: ibv_port_attr is plain old data; all-zero is valid.
    let mut attr: ibv_port_attr = unsafe { std::mem::zeroed() };
    // SAFETY: live context; `attr` is a live out-parameter.
    if unsafe { ___ibv_query_port(context.raw.as_ptr(), port, &mut attr) } != 0 {
        return Err(TransportError::last_os("ibv_query_port"));
    }
    // SAFETY: ibv_gid is plain old data; all-zero is valid.
    let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
    // SAFETY: live context; `gid` is a live out-parameter.
    if unsafe { ibv_query_gid(context.raw.as_ptr(), port, i32::from(gid_index), &mut gid) } != 0 {
        return Err(TransportError::last_os("ibv_query_gid"));
    }
    // SAFETY: every bit pattern of the union is a valid `[u8; 16]`.
    let gid = unsafe { gid.raw };
    Ok(PortInfo {
        port,
        lid: attr.lid,
        mtu: attr.active_mtu,
        gid,
        gid_index,
    })
}

impl Domain for VerbsDomain {
    type Memory = HostMemory;
    type Region = VerbsRegion;
    type Cq = VerbsCq;
    type Qp = VerbsQp;

    fn provider_name(&self) -> &'static str {
        "verbs"
    }

    fn alloc(&self, len: usize) -> Result<HostMemory> {
        HostMemory::allocate(len)
    }

    fn new_pd(&self) -> Result<Self> {
        let pd = ProtectionDomain::allocate(Arc::clone(&self.pd.context))?;
        Ok(VerbsDomain {
            pd: Arc::new(pd),
            port: self.port,
        })
    }

    fn register(
        &self,
        memory: &HostMemory,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<VerbsRegion> {
        VerbsRegion::register(&self.pd, memory, offset, len, access)
    }

    fn create_cq(&self) -> Result<VerbsCq> {
        VerbsCq::create(&self.pd.context)
    }

    fn create_qp(&self, send_cq: &VerbsCq, recv_cq: &VerbsCq, config: QpConfig) -> Result<VerbsQp> {
        VerbsQp::create(&self.pd, send_cq, recv_cq, config, self.port)
    }
}
