//! Soft domain (device + protection domain), memory and regions.

use super::cq::SoftCq;
use super::nic::{self, NicShared};
use super::qp::SoftQp;
use super::registry::Registry;
use super::shm::Broker;
use super::{SoftConfig, Wire};
use crate::memory::HostMemory;
use crate::{Access, Domain, QpConfig, Region, Result, TransportError};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

/// What every handle of a domain keeps alive; dropping the last handle stops the NIC.
#[derive(Debug)]
pub(crate) struct DomainInner {
    pub(crate) nic: Arc<NicShared>,
    pub(crate) config: SoftConfig,
    pub(crate) listen_addr: Option<SocketAddr>,
    /// The descriptor broker (shared-memory wire): peers get every memfd from it.
    pub(crate) broker: Option<Broker>,
    next_qpn: AtomicU32,
    next_pd: AtomicU32,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl DomainInner {
    pub(crate) fn allocate_qpn(&self) -> u32 {
        self.next_qpn.fetch_add(1, Ordering::Relaxed)
    }

    fn allocate_pd(&self) -> Result<u32> {
        self.next_pd
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |pd| pd.checked_add(1))
            .map_err(|_| TransportError::Exhausted("protection domains"))
    }
}

impl Drop for DomainInner {
    fn drop(&mut self) {
        self.nic.stop();
        let thread = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

/// A soft device (its NIC thread) with one of its protection domains: regions registered
/// through this handle are reachable only by queue pairs created through a handle of the
/// same protection domain (see [`Domain::new_pd`]).
#[derive(Clone, Debug)]
pub struct SoftDomain {
    inner: Arc<DomainInner>,
    pd: u32,
}

impl SoftDomain {
    /// Opens a domain: starts its NIC thread (and TCP listener on the TCP wire).
    pub fn open(config: SoftConfig) -> Result<Self> {
        let registry = Arc::new(Registry::new()?);
        let inbound_links = config.wire == Wire::Tcp;
        let nic = Arc::new(NicShared::new(
            Arc::clone(&registry),
            config.idle,
            inbound_links,
        )?);
        let listener = match config.wire {
            Wire::Tcp => Some(listen(&config)?),
            Wire::Shm => None,
        };
        let listen_addr = listener.as_ref().and_then(|l| l.local_addr().ok());
        let broker = match config.wire {
            Wire::Shm => Some(Broker::start(Arc::clone(&registry))?),
            Wire::Tcp => None,
        };
        let thread = nic::spawn(Arc::clone(&nic), listener)?;
        let inner = DomainInner {
            nic,
            config,
            listen_addr,
            broker,
            next_qpn: AtomicU32::new(1),
            next_pd: AtomicU32::new(1),
            thread: Mutex::new(Some(thread)),
        };
        Ok(SoftDomain {
            inner: Arc::new(inner),
            pd: 0,
        })
    }

    /// The address peers' NICs connect to (TCP wire).
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.inner.listen_addr
    }
}

fn listen(config: &SoftConfig) -> Result<TcpListener> {
    let listener = TcpListener::bind((config.bind, 0))
        .map_err(|e| TransportError::io("bind NIC listener", e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| TransportError::io("NIC listener", e))?;
    Ok(listener)
}

impl Domain for SoftDomain {
    type Memory = HostMemory;
    type Region = SoftRegion;
    type Cq = SoftCq;
    type Qp = SoftQp;

    fn provider_name(&self) -> &'static str {
        match self.inner.config.wire {
            Wire::Tcp => "soft-tcp",
            Wire::Shm => "soft-shm",
        }
    }

    fn alloc(&self, len: usize) -> Result<HostMemory> {
        HostMemory::allocate(len)
    }

    fn new_pd(&self) -> Result<Self> {
        Ok(SoftDomain {
            inner: Arc::clone(&self.inner),
            pd: self.inner.allocate_pd()?,
        })
    }

    fn register(
        &self,
        memory: &HostMemory,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<SoftRegion> {
        let (key, entry) =
            self.inner
                .nic
                .registry
                .register(&memory.inner, (offset, len), access, self.pd)?;
        Ok(SoftRegion {
            domain: Arc::clone(&self.inner),
            key,
            addr: entry.addr,
            len,
            access,
        })
    }

    fn create_cq(&self) -> Result<SoftCq> {
        SoftCq::new()
    }

    fn create_qp(&self, send_cq: &SoftCq, recv_cq: &SoftCq, config: QpConfig) -> Result<SoftQp> {
        SoftQp::create(&self.inner, self.pd, send_cq, recv_cq, config)
    }
}

/// A registration of a soft domain; dropping it deregisters (its keys stop working).
#[derive(Debug)]
pub struct SoftRegion {
    domain: Arc<DomainInner>,
    key: u32,
    addr: u64,
    len: usize,
    access: Access,
}

impl Region for SoftRegion {
    fn addr(&self) -> u64 {
        self.addr
    }

    fn len(&self) -> usize {
        self.len
    }

    fn lkey(&self) -> u32 {
        self.key
    }

    fn rkey(&self) -> u32 {
        self.key
    }

    fn access(&self) -> Access {
        self.access
    }
}

impl Drop for SoftRegion {
    fn drop(&mut self) {
        self.domain.nic.deregister(self.key);
    }
}
