//! Queue-pair state shared by the application handle, the NIC thread and (on the
//! shared-memory wire) the posting thread, plus the completion rules they all follow.
//!
//! Invariants: every accepted send work request produces exactly one completion decision
//! (success, reported only when signaled; any error, always reported); once the state is
//! `Error` it never leaves it, and everything still queued is flushed.

use super::cq::CqShared;
use super::shm::{Ring, ShmPeer};
use crate::{QpConfig, QpState, SendOp, Sge, WcOpcode, WcStatus, WorkCompletion};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

/// A work request's scatter list, owned; one element (the common case) needs no heap
/// allocation.
#[derive(Clone, Debug)]
pub(crate) enum SgList {
    One(Sge),
    Many(Vec<Sge>),
}

impl SgList {
    pub(crate) fn from_slice(sg_list: &[Sge]) -> SgList {
        match sg_list {
            [one] => SgList::One(*one),
            many => SgList::Many(many.to_vec()),
        }
    }
}

impl std::ops::Deref for SgList {
    type Target = [Sge];

    fn deref(&self) -> &[Sge] {
        match self {
            SgList::One(sge) => std::slice::from_ref(sge),
            SgList::Many(sges) => sges,
        }
    }
}

/// A send work request accepted by `post_send`, owned.
#[derive(Clone, Debug)]
pub(crate) struct PostedSend {
    pub wr_id: u64,
    pub op: SendOp,
    pub sg_list: SgList,
    pub signaled: bool,
}

/// A receive work request accepted by `post_recv`, owned.
#[derive(Clone, Debug)]
pub(crate) struct PostedRecv {
    pub wr_id: u64,
    pub sg_list: SgList,
}

/// State of one queue pair.
#[derive(Debug)]
pub(crate) struct QpShared {
    pub qpn: u32,
    /// Secret a TCP hello must carry to bind a connection to this queue pair.
    pub token: u64,
    /// The protection domain whose keys this queue pair uses and serves.
    pub pd: u32,
    pub config: QpConfig,
    state: AtomicU8,
    pub send_cq: Arc<CqShared>,
    pub recv_cq: Arc<CqShared>,
    /// Send work requests waiting for the NIC (TCP wire).
    pub sq: Mutex<VecDeque<PostedSend>>,
    /// Posted receive buffers, consumed in order.
    pub rq: Mutex<VecDeque<PostedRecv>>,
    send_outstanding: AtomicUsize,
    /// Set when the application dropped its handle; the NIC then closes the connection.
    pub closed: AtomicBool,
    /// The connected peer on the shared-memory wire.
    pub shm_peer: OnceLock<ShmPeer>,
    /// The ring same-host peers push SENDs into (shared-memory wire).
    pub inbound: Option<Ring>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl QpShared {
    pub(crate) fn new(
        (qpn, token, pd): (u32, u64, u32),
        config: QpConfig,
        (send_cq, recv_cq): (Arc<CqShared>, Arc<CqShared>),
        inbound: Option<Ring>,
    ) -> Self {
        QpShared {
            qpn,
            token,
            pd,
            config,
            state: AtomicU8::new(QpState::Init as u8),
            send_cq,
            recv_cq,
            sq: Mutex::default(),
            rq: Mutex::default(),
            send_outstanding: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            shm_peer: OnceLock::new(),
            inbound,
        }
    }

    pub(crate) fn state(&self) -> QpState {
        match self.state.load(Ordering::Acquire) {
            0 => QpState::Init,
            1 => QpState::ReadyToSend,
            _ => QpState::Error,
        }
    }

    /// Init → ReadyToSend; false if the queue pair was not in Init.
    pub(crate) fn mark_connected(&self) -> bool {
        let (init, ready) = (QpState::Init as u8, QpState::ReadyToSend as u8);
        self.state
            .compare_exchange(init, ready, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Reserves `count` send slots; false (nothing reserved) when the queue would overflow.
    pub(crate) fn reserve_sends(&self, count: usize) -> bool {
        let depth = self.config.max_send_wr;
        self.send_outstanding
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used + count <= depth).then_some(used + count)
            })
            .is_ok()
    }

    pub(crate) fn lock_sq(&self) -> MutexGuard<'_, VecDeque<PostedSend>> {
        lock(&self.sq)
    }

    pub(crate) fn lock_rq(&self) -> MutexGuard<'_, VecDeque<PostedRecv>> {
        lock(&self.rq)
    }

    /// Frees the slots of `count` send work requests that completed successfully and
    /// unsignaled (nothing to report); see `RequesterLink`'s `unreleased`.
    pub(crate) fn release_sends(&self, count: usize) {
        if count > 0 {
            self.send_outstanding.fetch_sub(count, Ordering::AcqRel);
        }
    }

    /// Reports the outcome of a send work request and frees its slot.
    pub(crate) fn complete_send(
        &self,
        wr_id: u64,
        op: &SendOp,
        status: WcStatus,
        byte_len: u32,
        signaled: bool,
    ) {
        self.send_outstanding.fetch_sub(1, Ordering::AcqRel);
        if signaled || status != WcStatus::Success {
            self.send_cq.push(self.completion(
                wr_id,
                op.completion_opcode(),
                status,
                byte_len,
                None,
            ));
        }
    }

    /// Reports a consumed receive buffer.
    pub(crate) fn complete_recv(
        &self,
        recv: &PostedRecv,
        opcode: WcOpcode,
        status: WcStatus,
        byte_len: u32,
        imm: Option<u32>,
    ) {
        self.recv_cq
            .push(self.completion(recv.wr_id, opcode, status, byte_len, imm));
    }

    fn completion(
        &self,
        wr_id: u64,
        opcode: WcOpcode,
        status: WcStatus,
        byte_len: u32,
        imm: Option<u32>,
    ) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            byte_len,
            imm,
            qpn: self.qpn,
        }
    }

    /// Moves to `Error` and flushes every queued send and receive work request.
    pub(crate) fn enter_error(&self) {
        self.mark_error();
        self.flush_queued();
    }

    /// Moves to `Error` without flushing (done before reporting the error completion, so
    /// whoever sees that completion also sees the state).
    pub(crate) fn mark_error(&self) {
        self.state.store(QpState::Error as u8, Ordering::Release);
    }

    /// Flushes what is queued (callers do this again after racing posts).
    pub(crate) fn flush_queued(&self) {
        let sends: Vec<PostedSend> = self.lock_sq().drain(..).collect();
        for send in sends {
            self.complete_send(send.wr_id, &send.op, WcStatus::WrFlushError, 0, true);
        }
        let recvs: Vec<PostedRecv> = self.lock_rq().drain(..).collect();
        for recv in recvs {
            self.complete_recv(&recv, WcOpcode::Recv, WcStatus::WrFlushError, 0, None);
        }
    }
}
