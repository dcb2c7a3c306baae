//! Verbs reliable-connected queue pair: creation, connection (INIT → RTR → RTS) and posting.

use super::cq::{CqInner, VerbsCq};
use super::device::ProtectionDomain;
use super::ledger::Ledger;
use crate::api::{validate_recv_batch, validate_send_batch};
use crate::{
    QpConfig, QpEndpoint, QpState, QueuePair, RecvWr, Result, SendOp, SendWr, Sge, TransportError,
};
use rdma_sys::*;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Where a verbs queue pair is reached: its number, port LID, GID and first PSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct VerbsAddress {
    qpn: u32,
    lid: u16,
    gid: [u8; 16],
    psn: u32,
}

impl VerbsAddress {
    fn encode(&self) -> QpEndpoint {
        let gid: String = self.gid.iter().map(|b| format!("{b:02x}")).collect();
        QpEndpoint(
            format!(
                "verbs qpn={} lid={} gid={gid} psn={}",
                self.qpn, self.lid, self.psn
            )
            .into_bytes(),
        )
    }

    fn decode(endpoint: &QpEndpoint) -> Result<Self> {
        let bad = || TransportError::BadEndpoint("not a verbs endpoint".into());
        let text = std::str::from_utf8(&endpoint.0).map_err(|_| bad())?;
        let mut words = text.split_whitespace();
        if words.next() != Some("verbs") {
            return Err(bad());
        }
        let fields: std::collections::HashMap<&str, &str> =
            words.filter_map(|w| w.split_once('=')).collect();
        let field = |name: &str| fields.get(name).copied().ok_or_else(bad);
        let hex = field("gid")?;
        let mut gid = [0u8; 16];
        if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        for (index, byte) in gid.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[index * 2..index * 2 + 2], 16).map_err(|_| bad())?;
        }
        Ok(VerbsAddress {
            qpn: field("qpn")?.parse().map_err(|_| bad())?,
            lid: field("lid")?.parse().map_err(|_| bad())?,
            gid,
            psn: field("psn")?.parse().map_err(|_| bad())?,
        })
    }
}

/// Port facts a queue pair needs to connect.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PortInfo {
    pub(crate) port: u8,
    pub(crate) lid: u16,
    pub(crate) mtu: ibv_mtu::Type,
    pub(crate) gid: [u8; 16],
    pub(crate) gid_index: u8,
}

/// A reliable-connected queue pair of the verbs provider.
#[derive(Debug)]
pub struct VerbsQp {
    raw: NonNull<ibv_qp>,
    config: QpConfig,
    port: PortInfo,
    /// Send and receive completion queues (their ledgers count this QP's completions).
    cqs: (Arc<CqInner>, Arc<CqInner>),
    /// Outstanding work requests (the configured depths are enforced here) and whether an
    /// error completion broke the queue pair.
    ledger: Arc<Ledger>,
    /// Whether `connect` reached RTS (posts check this and the ledger instead of asking
    /// the device: an `ibv_query_qp` system call per post).
    connected: AtomicBool,
    /// Work-request and scatter buffers reused by every post (no allocation per post).
    sends: Mutex<Scratch<ibv_send_wr>>,
    receives: Mutex<Scratch<ibv_recv_wr>>,
    _pd: Arc<ProtectionDomain>,
}

/// The raw work requests and scatter lists of one post, kept between posts. Their
/// pointers (`next`, `sg_list`) are only meaningful during the post that set them, under
/// the mutex that holds this.
struct Scratch<T> {
    wrs: Vec<T>,
    sges: Vec<ibv_sge>,
    signaled: Vec<bool>,
}

impl<T> std::fmt::Debug for Scratch<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scratch")
            .field("wrs", &self.wrs.len())
            .field("sges", &self.sges.len())
            .finish()
    }
}

impl<T> Default for Scratch<T> {
    fn default() -> Self {
        Scratch {
            wrs: Vec::new(),
            sges: Vec::new(),
            signaled: Vec::new(),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

// SAFETY: verbs objects are thread safe; the QP is owned and destroyed once in `Drop`. The
// scratch buffers hold raw pointers only during a post, under their mutex.
unsafe impl Send for VerbsQp {}
// SAFETY: see `Send`; ibv_post_send / ibv_post_recv may be called concurrently (each post
// takes its scratch buffer's mutex).
unsafe impl Sync for VerbsQp {}

impl VerbsQp {
    pub(crate) fn create(
        pd: &Arc<ProtectionDomain>,
        send_cq: &VerbsCq,
        recv_cq: &VerbsCq,
        config: QpConfig,
        port: PortInfo,
    ) -> Result<Self> {
        let depth = |n: usize| u32::try_from(n).ok().filter(|&n| n > 0);
        let cap = ibv_qp_cap {
            max_send_wr: depth(config.max_send_wr)
                .ok_or(TransportError::InvalidArgument("max_send_wr"))?,
            max_recv_wr: depth(config.max_recv_wr)
                .ok_or(TransportError::InvalidArgument("max_recv_wr"))?,
            max_send_sge: depth(config.max_sge)
                .ok_or(TransportError::InvalidArgument("max_sge"))?,
            max_recv_sge: depth(config.max_sge)
                .ok_or(TransportError::InvalidArgument("max_sge"))?,
            max_inline_data: 0,
        };
        // SAFETY: ibv_qp_init_attr is plain old data; all-zero is valid (null pointers).
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = send_cq.inner.raw.as_ptr();
        init.recv_cq = recv_cq.inner.raw.as_ptr();
        init.cap = cap;
        init.qp_type = ibv_qp_type::IBV_QPT_RC;
        // The completion queues must hold every completion this QP can have outstanding.
        send_cq.inner.reserve(config.max_send_wr)?;
        if let Err(error) = recv_cq.inner.reserve(config.max_recv_wr) {
            send_cq.inner.release(config.max_send_wr);
            return Err(error);
        }
        // SAFETY: live PD and CQs (held below for the QP's life); `init` is initialised.
        let raw = unsafe { ibv_create_qp(pd.raw.as_ptr(), &mut init) };
        let Some(raw) = NonNull::new(raw) else {
            let error = TransportError::last_os("ibv_create_qp");
            send_cq.inner.release(config.max_send_wr);
            recv_cq.inner.release(config.max_recv_wr);
            return Err(error);
        };
        let qp = VerbsQp {
            raw,
            config,
            port,
            cqs: (Arc::clone(&send_cq.inner), Arc::clone(&recv_cq.inner)),
            ledger: Arc::default(),
            connected: AtomicBool::new(false),
            sends: Mutex::default(),
            receives: Mutex::default(),
            _pd: Arc::clone(pd),
        };
        let qpn = qp.qpn();
        qp.cqs.0.ledgers.register(qpn, qp.ledger.clone());
        qp.cqs.1.ledgers.register(qpn, qp.ledger.clone());
        qp.to_init()?;
        Ok(qp)
    }

    fn modify(
        &self,
        attr: &mut ibv_qp_attr,
        mask: ibv_qp_attr_mask,
        what: &'static str,
    ) -> Result<()> {
        // SAFETY: live QP; `attr` is initialised for every bit in `mask`.
        let rc = unsafe { ibv_modify_qp(self.raw.as_ptr(), attr, mask.0 as i32) };
        if rc != 0 {
            return Err(TransportError::io(
                what,
                std::io::Error::from_raw_os_error(rc),
            ));
        }
        Ok(())
    }

    fn to_init(&self) -> Result<()> {
        let mut attr = zeroed_attr();
        attr.qp_state = ibv_qp_state::IBV_QPS_INIT;
        attr.port_num = self.port.port;
        attr.qp_access_flags = super::region::verbs_access(crate::Access::ALL);
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
            | ibv_qp_attr_mask::IBV_QP_PORT
            | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
        self.modify(&mut attr, mask, "modify QP to INIT")
    }

    fn to_rtr(&self, remote: &VerbsAddress) -> Result<()> {
        let mut attr = zeroed_attr();
        attr.qp_state = ibv_qp_state::IBV_QPS_RTR;
        attr.path_mtu = self.port.mtu;
        attr.dest_qp_num = remote.qpn;
        attr.rq_psn = remote.psn;
        attr.max_dest_rd_atomic = 16;
        attr.min_rnr_timer = 12;
        attr.ah_attr.dlid = remote.lid;
        attr.ah_attr.port_num = self.port.port;
        if remote.gid != [0; 16] {
            attr.ah_attr.is_global = 1;
            attr.ah_attr.grh.dgid.raw = remote.gid;
            attr.ah_attr.grh.sgid_index = self.port.gid_index;
            attr.ah_attr.grh.hop_limit = 64;
        }
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_AV
            | ibv_qp_attr_mask::IBV_QP_PATH_MTU
            | ibv_qp_attr_mask::IBV_QP_DEST_QPN
            | ibv_qp_attr_mask::IBV_QP_RQ_PSN
            | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
            | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut attr, mask, "modify QP to RTR")
    }

    fn to_rts(&self) -> Result<()> {
        let mut attr = zeroed_attr();
        attr.qp_state = ibv_qp_state::IBV_QPS_RTS;
        // Transport timer 4.096 µs · 2^14 ≈ 67 ms, retried `TRANSPORT_RETRIES` times: a peer
        // that stops answering fails the outstanding requests in about half a second.
        attr.timeout = 14;
        attr.retry_cnt = TRANSPORT_RETRIES;
        // A responder without receive buffers (RNR NAK) is waited for indefinitely (7).
        attr.rnr_retry = 7;
        attr.sq_psn = self.psn();
        attr.max_rd_atomic = 16;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_TIMEOUT
            | ibv_qp_attr_mask::IBV_QP_RETRY_CNT
            | ibv_qp_attr_mask::IBV_QP_RNR_RETRY
            | ibv_qp_attr_mask::IBV_QP_SQ_PSN
            | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut attr, mask, "modify QP to RTS")
    }

    /// The first PSN of this QP's send queue (derived from its number).
    fn psn(&self) -> u32 {
        self.qpn().wrapping_mul(2_654_435_761) & 0x00ff_ffff
    }

    fn refuse(&self, action: &'static str) -> TransportError {
        TransportError::QpState {
            qpn: self.qpn(),
            state: self.state(),
            action,
        }
    }
}

/// Transport-timer retries before a request fails with `RETRY_EXC_ERR`. 6, not the
/// 3-bit maximum 7: in the InfiniBand spec only the RNR retry count gives 7 the meaning
/// "infinite", but kernel rxe (`rxe_comp.c`, `COMPST_ERROR_RETRY`) never decrements a retry
/// count of 7 either, so with 7 a requester whose responder vanished retransmits forever
/// and its queue pair never breaks (docs/rxe-vm.md). 6 means 6 retries everywhere.
const TRANSPORT_RETRIES: u8 = 6;

fn zeroed_attr() -> ibv_qp_attr {
    // SAFETY: ibv_qp_attr is plain old data; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

/// Fills `sges` with every element of `lists`, in order (one flat array: each work request
/// points at its run).
fn fill_sges<'a>(sges: &mut Vec<ibv_sge>, lists: impl Iterator<Item = &'a [Sge]>) {
    sges.clear();
    for sge in lists.flatten() {
        sges.push(ibv_sge {
            addr: sge.addr,
            length: sge.len,
            lkey: sge.lkey,
        });
    }
}

/// Fills opcode, remote address and immediate of `raw` from `op`.
fn set_operation(raw: &mut ibv_send_wr, op: &SendOp) {
    use ibv_wr_opcode::*;
    let (opcode, imm) = match *op {
        SendOp::Read(remote) => {
            raw.wr.rdma = rdma_t {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            };
            (IBV_WR_RDMA_READ, None)
        }
        SendOp::Write { remote, imm } => {
            raw.wr.rdma = rdma_t {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            };
            (
                if imm.is_some() {
                    IBV_WR_RDMA_WRITE_WITH_IMM
                } else {
                    IBV_WR_RDMA_WRITE
                },
                imm,
            )
        }
        SendOp::Send { imm } => (
            if imm.is_some() {
                IBV_WR_SEND_WITH_IMM
            } else {
                IBV_WR_SEND
            },
            imm,
        ),
        SendOp::CompareSwap {
            remote,
            compare,
            swap,
        } => {
            raw.wr.atomic = atomic_t {
                remote_addr: remote.addr,
                compare_add: compare,
                swap,
                rkey: remote.rkey,
            };
            (IBV_WR_ATOMIC_CMP_AND_SWP, None)
        }
        SendOp::FetchAdd { remote, add } => {
            raw.wr.atomic = atomic_t {
                remote_addr: remote.addr,
                compare_add: add,
                swap: 0,
                rkey: remote.rkey,
            };
            (IBV_WR_ATOMIC_FETCH_AND_ADD, None)
        }
    };
    raw.opcode = opcode;
    if let Some(imm) = imm {
        raw.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
    }
}

impl QueuePair for VerbsQp {
    fn qpn(&self) -> u32 {
        // SAFETY: live QP; `qp_num` is fixed at creation.
        unsafe { self.raw.as_ref() }.qp_num
    }

    fn state(&self) -> QpState {
        let mut attr = zeroed_attr();
        // SAFETY: ibv_qp_init_attr is plain old data; all-zero is valid.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        let mask = ibv_qp_attr_mask::IBV_QP_STATE.0 as i32;
        // SAFETY: live QP; out-parameters are live.
        let rc = unsafe { ibv_query_qp(self.raw.as_ptr(), &mut attr, mask, &mut init) };
        match (rc, attr.qp_state) {
            (0, ibv_qp_state::IBV_QPS_RTS) => QpState::ReadyToSend,
            (
                0,
                ibv_qp_state::IBV_QPS_RESET
                | ibv_qp_state::IBV_QPS_INIT
                | ibv_qp_state::IBV_QPS_RTR,
            ) => QpState::Init,
            _ => QpState::Error,
        }
    }

    fn endpoint(&self) -> QpEndpoint {
        VerbsAddress {
            qpn: self.qpn(),
            lid: self.port.lid,
            gid: self.port.gid,
            psn: self.psn(),
        }
        .encode()
    }

    fn connect(&self, remote: &QpEndpoint) -> Result<()> {
        if self.state() != QpState::Init {
            return Err(self.refuse("connect"));
        }
        let remote = VerbsAddress::decode(remote)?;
        self.to_rtr(&remote)?;
        self.to_rts()?;
        self.connected.store(true, Ordering::Release);
        Ok(())
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        validate_send_batch(wrs, &self.config)?;
        if !self.connected.load(Ordering::Acquire) || self.ledger.is_broken() {
            return Err(self.refuse("post_send"));
        }
        let mut scratch = lock(&self.sends);
        let Scratch {
            wrs: raw,
            sges,
            signaled,
        } = &mut *scratch;
        fill_sges(sges, wrs.iter().map(|wr| wr.sg_list));
        signaled.clear();
        signaled.extend(wrs.iter().map(|wr| wr.signaled));
        raw.clear();
        let mut at = 0;
        for wr in wrs {
            // SAFETY: ibv_send_wr is plain old data; all-zero is valid (null `next`).
            let mut entry: ibv_send_wr = unsafe { std::mem::zeroed() };
            entry.wr_id = wr.wr_id;
            // `sges` is not changed again before the post: the pointer stays valid.
            entry.sg_list = sges.as_mut_ptr().wrapping_add(at);
            entry.num_sge = wr.sg_list.len() as i32;
            at += wr.sg_list.len();
            entry.send_flags = if wr.signaled {
                ibv_send_flags::IBV_SEND_SIGNALED.0
            } else {
                0
            };
            set_operation(&mut entry, &wr.op);
            raw.push(entry);
        }
        self.ledger
            .post_sends(signaled, self.config.max_send_wr, || {
                post_chain(raw, |first, bad| {
                    // SAFETY: live QP; the chain and its scatter lists live until the call
                    // returns (verbs copies work requests into the send queue).
                    unsafe { ibv_post_send(self.raw.as_ptr(), first, bad) }
                })
                .map_err(|rc| post_error(rc, "send", self.config.max_send_wr))
            })
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        validate_recv_batch(wrs, &self.config)?;
        if self.ledger.is_broken() {
            return Err(self.refuse("post_recv"));
        }
        let mut scratch = lock(&self.receives);
        let Scratch { wrs: raw, sges, .. } = &mut *scratch;
        fill_sges(sges, wrs.iter().map(|wr| wr.sg_list));
        raw.clear();
        let mut at = 0;
        for wr in wrs {
            raw.push(ibv_recv_wr {
                wr_id: wr.wr_id,
                next: std::ptr::null_mut(),
                // `sges` is not changed again before the post: the pointer stays valid.
                sg_list: sges.as_mut_ptr().wrapping_add(at),
                num_sge: wr.sg_list.len() as i32,
            });
            at += wr.sg_list.len();
        }
        self.ledger
            .post_receives(wrs.len(), self.config.max_recv_wr, || {
                post_chain(raw, |first, bad| {
                    // SAFETY: as in `post_send`.
                    unsafe { ibv_post_recv(self.raw.as_ptr(), first, bad) }
                })
                .map_err(|rc| post_error(rc, "receive", self.config.max_recv_wr))
            })
    }
}

/// A work request type that verbs chains through `next`.
trait Chained {
    fn set_next(&mut self, next: *mut Self);
}

impl Chained for ibv_send_wr {
    fn set_next(&mut self, next: *mut Self) {
        self.next = next;
    }
}

impl Chained for ibv_recv_wr {
    fn set_next(&mut self, next: *mut Self) {
        self.next = next;
    }
}

/// Links `raw` into a chain and posts it with `post`; Err(rc) if verbs refused.
fn post_chain<T: Chained>(
    raw: &mut [T],
    post: impl FnOnce(*mut T, *mut *mut T) -> i32,
) -> std::result::Result<(), i32> {
    for index in 1..raw.len() {
        let next: *mut T = &mut raw[index];
        raw[index - 1].set_next(next);
    }
    let Some(first) = raw.first_mut() else {
        return Ok(());
    };
    let mut bad = std::ptr::null_mut();
    match post(first, &mut bad) {
        0 => Ok(()),
        rc => Err(rc),
    }
}

fn post_error(rc: i32, queue: &'static str, depth: usize) -> TransportError {
    if rc == libc::ENOMEM {
        return TransportError::QueueFull { queue, depth };
    }
    TransportError::io("post work request", std::io::Error::from_raw_os_error(rc))
}

impl Drop for VerbsQp {
    fn drop(&mut self) {
        let qpn = self.qpn();
        self.cqs.0.ledgers.unregister(qpn);
        self.cqs.1.ledgers.unregister(qpn);
        // SAFETY: created in `create`, destroyed once, before the CQs and PD it holds.
        unsafe { ibv_destroy_qp(self.raw.as_ptr()) };
        self.cqs.0.release(self.config.max_send_wr);
        self.cqs.1.release(self.config.max_recv_wr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_round_trips_and_garbage_is_refused() {
        let address = VerbsAddress {
            qpn: 17,
            lid: 3,
            gid: [0xfe; 16],
            psn: 0x123456,
        };
        assert_eq!(VerbsAddress::decode(&address.encode()).unwrap(), address);
        for text in [
            "",
            "verbs qpn=1",
            "soft-tcp qpn=1 addr=1.2.3.4:5",
            "verbs qpn=1 lid=1 gid=zz psn=1",
            // 32 bytes, not ASCII: slicing two bytes at a time would split a character.
            "verbs qpn=1 lid=1 gid=a\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}a psn=1",
            // 32 bytes, "+f" parses as a radix-16 number.
            "verbs qpn=1 lid=1 gid=+f000000000000000000000000000000 psn=1",
        ] {
            assert!(
                VerbsAddress::decode(&QpEndpoint(text.as_bytes().to_vec())).is_err(),
                "{text}"
            );
        }
    }
}
