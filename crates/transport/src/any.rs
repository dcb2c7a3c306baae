//! One set of types over every provider built, for programs that serve several wires at
//! once (the lookup path: soft-TCP, soft-shm and, with feature `rdma`, verbs) or pick one
//! at run time (the client). Each type is an enum with a variant per provider and forwards
//! every call to it; nothing else happens here.
//!
//! Invariant: objects of one provider are only combined with objects of the same provider.
//! A domain creates queue pairs only on completion queues of its own provider; mixing them
//! is refused with `InvalidArgument` and creates nothing. Memory is [`HostMemory`] on every
//! provider, so one memory may be registered on domains of several providers.
//!
//! Tested by the conformance suite run through [`AnyDomain`] (tests/transport_soft.rs,
//! and on verbs in tests/transport_verbs.rs).

use crate::soft::{SoftCq, SoftDomain, SoftQp, SoftRegion};
#[cfg(feature = "rdma")]
use crate::verbs::{VerbsCq, VerbsDomain, VerbsQp, VerbsRegion};
use crate::{
    Access, CompletionQueue, Domain, HostMemory, QpConfig, QpEndpoint, QpState, QueuePair, RecvWr,
    Region, Result, SendWr, TransportError, WorkCompletion,
};
use std::os::fd::RawFd;

/// Forwards `$body` to whichever provider `$value` holds, naming it `$inner`.
macro_rules! forward {
    ($value:expr, $inner:ident => $body:expr) => {
        match $value {
            Self::Soft($inner) => $body,
            #[cfg(feature = "rdma")]
            Self::Verbs($inner) => $body,
        }
    };
}

/// An RDMA device for the verbs wire: its name (`mlx5_0`, `rxe0`; empty: the first device)
/// and the GID table index used for RoCE addressing (1 is RoCE v2 on rxe).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerbsDevice {
    /// Device name.
    pub name: String,
    /// GID table index.
    pub gid_index: u8,
}

impl VerbsDevice {
    /// The device `KVCM_VERBS_DEVICE` names (unset or empty: the first one) with GID index
    /// `KVCM_VERBS_GID_INDEX` (unset: 0; anything but 0–255 is refused).
    pub fn from_env() -> Result<VerbsDevice> {
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
}

/// A domain of any provider.
#[derive(Clone, Debug)]
pub enum AnyDomain {
    /// The soft provider (TCP or shared-memory wire).
    Soft(SoftDomain),
    /// libibverbs.
    #[cfg(feature = "rdma")]
    Verbs(VerbsDomain),
}

/// A registration of any provider.
#[derive(Debug)]
pub enum AnyRegion {
    /// See [`AnyDomain::Soft`].
    Soft(SoftRegion),
    /// See [`AnyDomain::Verbs`].
    #[cfg(feature = "rdma")]
    Verbs(VerbsRegion),
}

/// A completion queue of any provider.
#[derive(Clone, Debug)]
pub enum AnyCq {
    /// See [`AnyDomain::Soft`].
    Soft(SoftCq),
    /// See [`AnyDomain::Verbs`].
    #[cfg(feature = "rdma")]
    Verbs(VerbsCq),
}

/// A queue pair of any provider.
#[derive(Debug)]
pub enum AnyQp {
    /// See [`AnyDomain::Soft`].
    Soft(SoftQp),
    /// See [`AnyDomain::Verbs`].
    #[cfg(feature = "rdma")]
    Verbs(VerbsQp),
}

impl From<SoftDomain> for AnyDomain {
    fn from(domain: SoftDomain) -> Self {
        AnyDomain::Soft(domain)
    }
}

#[cfg(feature = "rdma")]
impl From<VerbsDomain> for AnyDomain {
    fn from(domain: VerbsDomain) -> Self {
        AnyDomain::Verbs(domain)
    }
}

impl AnyDomain {
    /// Opens RDMA device `device` on port 1. `NoDevice` when the host has no such device,
    /// or when this build has no verbs provider (feature `rdma`), saying which.
    pub fn open_verbs(device: &VerbsDevice) -> Result<AnyDomain> {
        #[cfg(feature = "rdma")]
        {
            let config = crate::verbs::VerbsConfig {
                device: Some(device.name.clone()).filter(|name| !name.is_empty()),
                port: 1,
                gid_index: device.gid_index,
            };
            VerbsDomain::open(&config).map(AnyDomain::Verbs)
        }
        #[cfg(not(feature = "rdma"))]
        {
            let _ = device;
            Err(TransportError::NoDevice(
                "this build has no verbs provider (build with feature `rdma`)".into(),
            ))
        }
    }
}

impl AnyQp {
    /// The soft queue pair, when this is one.
    pub fn as_soft(&self) -> Option<&SoftQp> {
        match self {
            AnyQp::Soft(qp) => Some(qp),
            #[cfg(feature = "rdma")]
            AnyQp::Verbs(_) => None,
        }
    }
}

impl Domain for AnyDomain {
    type Memory = HostMemory;
    type Region = AnyRegion;
    type Cq = AnyCq;
    type Qp = AnyQp;

    fn provider_name(&self) -> &'static str {
        forward!(self, domain => domain.provider_name())
    }

    fn alloc(&self, len: usize) -> Result<HostMemory> {
        forward!(self, domain => domain.alloc(len))
    }

    fn new_pd(&self) -> Result<Self> {
        forward!(self, domain => domain.new_pd().map(Self::from))
    }

    fn register(
        &self,
        memory: &HostMemory,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<AnyRegion> {
        match self {
            AnyDomain::Soft(domain) => domain
                .register(memory, offset, len, access)
                .map(AnyRegion::Soft),
            #[cfg(feature = "rdma")]
            AnyDomain::Verbs(domain) => domain
                .register(memory, offset, len, access)
                .map(AnyRegion::Verbs),
        }
    }

    fn create_cq(&self) -> Result<AnyCq> {
        match self {
            AnyDomain::Soft(domain) => domain.create_cq().map(AnyCq::Soft),
            #[cfg(feature = "rdma")]
            AnyDomain::Verbs(domain) => domain.create_cq().map(AnyCq::Verbs),
        }
    }

    fn create_qp(&self, send_cq: &AnyCq, recv_cq: &AnyCq, config: QpConfig) -> Result<AnyQp> {
        match (self, send_cq, recv_cq) {
            (AnyDomain::Soft(domain), AnyCq::Soft(send), AnyCq::Soft(recv)) => {
                domain.create_qp(send, recv, config).map(AnyQp::Soft)
            }
            #[cfg(feature = "rdma")]
            (AnyDomain::Verbs(domain), AnyCq::Verbs(send), AnyCq::Verbs(recv)) => {
                domain.create_qp(send, recv, config).map(AnyQp::Verbs)
            }
            #[allow(unreachable_patterns)]
            _ => Err(TransportError::InvalidArgument(
                "completion queues of another provider",
            )),
        }
    }
}

impl Region for AnyRegion {
    fn addr(&self) -> u64 {
        forward!(self, region => region.addr())
    }

    fn len(&self) -> usize {
        forward!(self, region => region.len())
    }

    fn lkey(&self) -> u32 {
        forward!(self, region => region.lkey())
    }

    fn rkey(&self) -> u32 {
        forward!(self, region => region.rkey())
    }

    fn access(&self) -> Access {
        forward!(self, region => region.access())
    }
}

impl CompletionQueue for AnyCq {
    fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        forward!(self, cq => cq.poll(out))
    }

    fn arm(&self) -> Result<bool> {
        forward!(self, cq => cq.arm())
    }

    fn event_fd(&self) -> RawFd {
        forward!(self, cq => cq.event_fd())
    }
}

impl QueuePair for AnyQp {
    fn qpn(&self) -> u32 {
        forward!(self, qp => qp.qpn())
    }

    fn state(&self) -> QpState {
        forward!(self, qp => qp.state())
    }

    fn endpoint(&self) -> QpEndpoint {
        forward!(self, qp => qp.endpoint())
    }

    fn connect(&self, remote: &QpEndpoint) -> Result<()> {
        forward!(self, qp => qp.connect(remote))
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        forward!(self, qp => qp.post_send(wrs))
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        forward!(self, qp => qp.post_recv(wrs))
    }
}
