//! Inline execution of send work requests on the shared-memory wire.
//!
//! Runs on the posting thread, in order, under the peer's send lock (the ring has one
//! producer). The first error completion moves the queue pair to `Error` and flushes the
//! rest of the batch.

use super::ShmPeer;
use crate::soft::frame::{Op, RequestHeader, REQUEST_LEN};
use crate::soft::queue_pair::{PostedSend, QpShared};
use crate::soft::registry::{AtomicOp, Registry};
use crate::soft::scatter::{self, Piece};
use crate::{Access, RemoteAddr, SendOp, WcStatus};
use std::sync::PoisonError;
use std::time::Instant;

/// Executes `sends` for `qp` against `peer`.
pub(crate) fn post_inline(
    registry: &Registry,
    qp: &QpShared,
    peer: &ShmPeer,
    sends: Vec<PostedSend>,
) {
    let _producer = peer
        .send_lock
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let mut failed = false;
    let gone = peer.ring.is_closed();
    for send in sends {
        if failed {
            qp.complete_send(send.wr_id, &send.op, WcStatus::WrFlushError, 0, true);
            continue;
        }
        let (status, byte_len) =
            match scatter::resolve(registry, &send.sg_list, local_need(&send.op)) {
                _ if gone => (WcStatus::RetryExceeded, 0),
                Ok(pieces) => execute(peer, &send.op, &pieces),
                Err(status) => (status, 0),
            };
        if status != WcStatus::Success {
            failed = true;
            qp.mark_error();
        }
        qp.complete_send(send.wr_id, &send.op, status, byte_len, send.signaled);
    }
    if failed {
        qp.flush_queued();
    }
}

fn local_need(op: &SendOp) -> Access {
    match op {
        SendOp::Write { .. } | SendOp::Send { .. } => Access::NONE,
        _ => Access::LOCAL_WRITE,
    }
}

fn execute(peer: &ShmPeer, op: &SendOp, pieces: &[Piece]) -> (WcStatus, u32) {
    let len = scatter::total_len(pieces);
    let Ok(len32) = u32::try_from(len) else {
        return (WcStatus::LocalLengthError, 0);
    };
    let status = match *op {
        SendOp::Read(remote) => {
            match peer.resolve(remote.rkey, remote.addr, len as u64, Access::REMOTE_READ) {
                Some(source) => {
                    scatter::scatter_from_memory(pieces, &source);
                    WcStatus::Success
                }
                None => WcStatus::RemoteAccessError,
            }
        }
        SendOp::Write { remote, imm } => write(peer, remote, imm, pieces, len32),
        SendOp::Send { imm } => send(peer, imm, pieces, len32),
        SendOp::CompareSwap {
            remote,
            compare,
            swap,
        } => atomic(
            peer,
            remote,
            pieces,
            AtomicOp::CompareSwap { compare, swap },
        ),
        SendOp::FetchAdd { remote, add } => atomic(peer, remote, pieces, AtomicOp::FetchAdd(add)),
    };
    (status, len32)
}

fn write(
    peer: &ShmPeer,
    remote: RemoteAddr,
    imm: Option<u32>,
    pieces: &[Piece],
    len: u32,
) -> WcStatus {
    let Some(destination) = peer.resolve(
        remote.rkey,
        remote.addr,
        u64::from(len),
        Access::REMOTE_WRITE,
    ) else {
        return WcStatus::RemoteAccessError;
    };
    scatter::gather_to_memory(pieces, &destination);
    match imm {
        Some(_) => push_frame(peer, &RequestHeader::new(Op::ImmNotify, len, imm), &[]),
        None => WcStatus::Success,
    }
}

fn send(peer: &ShmPeer, imm: Option<u32>, pieces: &[Piece], len: u32) -> WcStatus {
    if REQUEST_LEN + len as usize > peer.ring.max_frame() {
        return WcStatus::LocalLengthError;
    }
    let mut payload = Vec::with_capacity(len as usize);
    scatter::gather_into(pieces, &mut payload);
    push_frame(peer, &RequestHeader::new(Op::Send, len, imm), &payload)
}

fn push_frame(peer: &ShmPeer, header: &RequestHeader, payload: &[u8]) -> WcStatus {
    let mut header_bytes = Vec::with_capacity(REQUEST_LEN);
    header.encode(&mut header_bytes);
    let started = Instant::now();
    while !peer.try_push(&[&header_bytes, payload]) {
        if peer.gone() || started.elapsed() > peer.timeout {
            return WcStatus::RetryExceeded;
        }
        std::thread::yield_now();
    }
    WcStatus::Success
}

fn atomic(peer: &ShmPeer, remote: RemoteAddr, pieces: &[Piece], op: AtomicOp) -> WcStatus {
    let target = peer.resolve(remote.rkey, remote.addr, 8, Access::REMOTE_ATOMIC);
    let Some(old) = target.and_then(|target| target.run_atomic(remote.addr, op)) else {
        return WcStatus::RemoteAccessError;
    };
    scatter::scatter_from_bytes(pieces, &old.to_le_bytes());
    WcStatus::Success
}
