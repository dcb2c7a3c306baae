//! The application's handle on a soft queue pair: connection and posting.

use super::cq::Progress;
use super::cq::SoftCq;
use super::domain::DomainInner;
use super::endpoint::{host_id, SoftEndpoint};
use super::frame;
use super::nic::SharedLink;
use super::queue_pair::{PostedRecv, PostedSend, QpShared, SgList};
use super::shm::{self, Ring, ShmAddress, ShmPeer};
use super::Wire;
use crate::api::{validate_recv_batch, validate_send_batch};
use crate::{
    QpConfig, QpEndpoint, QpState, QueuePair, RecvWr, RemoteAddr, Result, SendWr, TransportError,
};
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

/// How long `connect` waits for the peer NIC to accept a TCP link.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A reliable-connected queue pair of the soft provider. Dropping it closes its links; the
/// peer's queue pair then fails its outstanding work with `RetryExceeded` / flushes.
#[derive(Debug)]
pub struct SoftQp {
    domain: Arc<DomainInner>,
    shared: Arc<QpShared>,
    endpoint: QpEndpoint,
    /// The outbound link (TCP wire), driven by posting and polling threads too.
    link: OnceLock<Arc<SharedLink>>,
}

impl SoftQp {
    pub(crate) fn create(
        domain: &Arc<DomainInner>,
        pd: u32,
        send_cq: &SoftCq,
        recv_cq: &SoftCq,
        config: QpConfig,
    ) -> Result<Self> {
        if config.max_send_wr == 0 || config.max_recv_wr == 0 || config.max_sge == 0 {
            return Err(TransportError::InvalidArgument(
                "queue depths and max_sge must be positive",
            ));
        }
        let qpn = domain.allocate_qpn();
        let token = crate::sys::random_u64()?;
        let (inbound, endpoint) = match (domain.config.wire, domain.listen_addr) {
            (Wire::Shm, _) => {
                let ring = Ring::create(domain.config.ring_capacity)?;
                let endpoint = shm_endpoint(domain, (qpn, pd, token), &ring)?;
                (Some(ring), endpoint)
            }
            (Wire::Tcp, Some(addr)) => {
                let lists = true;
                let endpoint = SoftEndpoint::Tcp {
                    qpn,
                    addr,
                    token,
                    lists,
                };
                (None, endpoint)
            }
            (Wire::Tcp, None) => {
                return Err(TransportError::InvalidArgument(
                    "TCP domain without a listener",
                ))
            }
        };
        let cqs = (Arc::clone(&send_cq.shared), Arc::clone(&recv_cq.shared));
        let shared = Arc::new(QpShared::new((qpn, token, pd), config, cqs, inbound));
        if let Some(broker) = &domain.broker {
            broker.adopt_qp(&shared);
        }
        domain.nic.adopt_qp(Arc::clone(&shared));
        Ok(SoftQp {
            domain: Arc::clone(domain),
            shared,
            endpoint: endpoint.encode(),
            link: OnceLock::new(),
        })
    }

    /// The state shared with the NIC (unit tests).
    #[cfg(test)]
    pub(crate) fn shared(&self) -> &Arc<QpShared> {
        &self.shared
    }

    fn refuse(&self, action: &'static str) -> TransportError {
        TransportError::QpState {
            qpn: self.shared.qpn,
            state: self.shared.state(),
            action,
        }
    }

    /// Opens the outbound link to queue pair `qpn` at `addr` (READ lists go to it when
    /// its NIC takes them: `lists`).
    fn connect_tcp(&self, qpn: u32, addr: SocketAddr, token: u64, lists: bool) -> Result<()> {
        let io = |e| TransportError::io("connect to peer NIC", e);
        let mut stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).map_err(io)?;
        stream.set_nodelay(true).map_err(io)?;
        stream.write_all(&frame::hello(qpn, token)).map_err(io)?;
        let nic = Arc::clone(&self.domain.nic);
        let timeout = self.domain.config.response_timeout;
        let qp = Arc::clone(&self.shared);
        let link = Arc::new(SharedLink::new(nic, qp, stream, timeout, lists).map_err(io)?);
        self.link
            .set(Arc::clone(&link))
            .map_err(|_| self.refuse("connect"))?;
        let driver: Weak<dyn Progress> = Arc::downgrade(&link) as Weak<dyn Progress>;
        self.shared.send_cq.add_driver(driver);
        self.domain.nic.adopt_link(link);
        Ok(())
    }

    fn connect_shm(&self, qpn: u32, host: &str, address: &ShmAddress) -> Result<()> {
        if host != host_id() {
            return Err(TransportError::BadEndpoint(
                "shared-memory peer is on another host".into(),
            ));
        }
        let peer = ShmPeer::open(qpn, address, self.domain.config.response_timeout)?;
        self.shared
            .shm_peer
            .set(peer)
            .map_err(|_| self.refuse("connect"))
    }
}

/// The endpoint of a shared-memory queue pair: its process, ring size, NIC doorbell, and
/// the broker (and secret) that hands out its key table, inbound ring, liveness page and
/// memories.
fn shm_endpoint(
    domain: &DomainInner,
    (qpn, pd, token): (u32, u32, u64),
    ring: &Ring,
) -> Result<SoftEndpoint> {
    let broker = domain
        .broker
        .as_ref()
        .ok_or(TransportError::InvalidArgument(
            "shared-memory domain without a descriptor broker",
        ))?;
    // Peers map it: start the keeper now, not at the first request.
    crate::sys::life::process_page()?;
    Ok(SoftEndpoint::Shm {
        qpn,
        host: host_id(),
        address: ShmAddress {
            pid: std::process::id(),
            pd,
            ring_capacity: ring.capacity(),
            doorbell: domain.nic.doorbell_name().to_string(),
            broker: broker.name().to_string(),
            token,
        },
    })
}

impl QueuePair for SoftQp {
    fn qpn(&self) -> u32 {
        self.shared.qpn
    }

    fn state(&self) -> QpState {
        self.shared.state()
    }

    fn endpoint(&self) -> QpEndpoint {
        self.endpoint.clone()
    }

    fn connect(&self, remote: &QpEndpoint) -> Result<()> {
        if self.shared.state() != QpState::Init {
            return Err(self.refuse("connect"));
        }
        match (SoftEndpoint::decode(remote)?, self.domain.config.wire) {
            (
                SoftEndpoint::Tcp {
                    qpn,
                    addr,
                    token,
                    lists,
                },
                Wire::Tcp,
            ) => self.connect_tcp(qpn, addr, token, lists)?,
            (SoftEndpoint::Shm { qpn, host, address }, Wire::Shm) => {
                self.connect_shm(qpn, &host, &address)?
            }
            _ => return Err(TransportError::BadEndpoint("peer uses another wire".into())),
        }
        if !self.shared.mark_connected() {
            return Err(self.refuse("connect"));
        }
        Ok(())
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        validate_send_batch(wrs, &self.shared.config)?;
        if self.shared.state() != QpState::ReadyToSend {
            return Err(self.refuse("post_send"));
        }
        if !self.shared.reserve_sends(wrs.len()) {
            let depth = self.shared.config.max_send_wr;
            return Err(TransportError::QueueFull {
                queue: "send",
                depth,
            });
        }
        let posted = wrs.iter().map(|wr| PostedSend {
            wr_id: wr.wr_id,
            op: wr.op,
            sg_list: SgList::from_slice(wr.sg_list),
            signaled: wr.signaled,
        });
        if let Some(peer) = self.shared.shm_peer.get() {
            let registry = &self.domain.nic.registry;
            let stalled = shm::post_inline(registry, &self.shared, peer, posted.collect());
            self.after_post(stalled);
            return Ok(());
        }
        self.shared.lock_sq().extend(posted);
        // Manual progress: write the requests now; the NIC is woken only for leftovers.
        let written = self.link.get().is_some_and(|link| link.push());
        self.after_post(!written);
        Ok(())
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        validate_recv_batch(wrs, &self.shared.config)?;
        if self.shared.state() == QpState::Error {
            return Err(self.refuse("post_recv"));
        }
        {
            let mut rq = self.shared.lock_rq();
            let depth = self.shared.config.max_recv_wr;
            if rq.len() + wrs.len() > depth {
                return Err(TransportError::QueueFull {
                    queue: "receive",
                    depth,
                });
            }
            rq.extend(wrs.iter().map(|wr| PostedRecv {
                wr_id: wr.wr_id,
                sg_list: SgList::from_slice(wr.sg_list),
            }));
        }
        self.after_post(true);
        Ok(())
    }
}

impl SoftQp {
    /// On the shared-memory wire, copies `reads` (remote address and length, in order) into
    /// `out` back to back, as plain memory reads of the peer's mapped regions — the same
    /// bytes a batch of READs would deliver, checked the same way (rkey, bounds, right; the
    /// peer process alive before the first copy), without work requests or completions:
    /// the supernode / shared-memory case, where a one-sided read is a memory read. The
    /// copies run in order. Refused on the TCP wire, before the queue pair is connected, or
    /// once it failed; a failed check moves the queue pair to `Error` as a READ's would.
    pub fn read_direct(&self, reads: &[(RemoteAddr, usize)], out: &mut [u8]) -> Result<()> {
        let Some(peer) = self.shared.shm_peer.get() else {
            return Err(TransportError::InvalidArgument(
                "direct reads need a connected shared-memory queue pair",
            ));
        };
        if self.shared.state() != QpState::ReadyToSend {
            return Err(self.refuse("read_direct"));
        }
        let total: usize = reads.iter().map(|(_, len)| len).sum();
        if total != out.len() {
            return Err(TransportError::InvalidArgument(
                "direct reads must fill the output exactly",
            ));
        }
        if shm::read_direct(peer, reads, out) {
            return Ok(());
        }
        self.shared.mark_error();
        Err(TransportError::InvalidArgument(
            "a direct read was refused (peer gone, bad rkey, bounds or rights)",
        ))
    }
}

impl SoftQp {
    /// On the shared-memory wire, writes each `(remote, bytes)` into the peer's mapped
    /// regions as plain memory copies, in order: the bytes a batch of WRITEs would place,
    /// checked the same way as [`SoftQp::read_direct`] (peer alive, rkey, bounds, the
    /// remote-write right), without work requests or completions. Refused on the TCP wire,
    /// before the queue pair is connected, or once it failed; a failed check moves the
    /// queue pair to `Error` (the writes before it were done, as WRITEs before a failing
    /// one would be).
    pub fn write_direct(&self, writes: &[(RemoteAddr, &[u8])]) -> Result<()> {
        let Some(peer) = self.shared.shm_peer.get() else {
            return Err(TransportError::InvalidArgument(
                "direct writes need a connected shared-memory queue pair",
            ));
        };
        if self.shared.state() != QpState::ReadyToSend {
            return Err(self.refuse("write_direct"));
        }
        if shm::write_direct(peer, writes) {
            return Ok(());
        }
        self.shared.mark_error();
        Err(TransportError::InvalidArgument(
            "a direct write was refused (peer gone, bad rkey, bounds or rights)",
        ))
    }
}

impl SoftQp {
    /// Flushes what was queued if the queue pair failed meanwhile, and wakes the NIC
    /// (if parked) when it has work left.
    fn after_post(&self, nic_needed: bool) {
        if self.shared.state() == QpState::Error {
            self.shared.flush_queued();
        }
        if nic_needed {
            self.domain.nic.kick();
        }
    }
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        if let Some(ring) = &self.shared.inbound {
            ring.mark_closed();
        }
        self.domain.nic.kick();
    }
}
