//! Inline execution of send work requests on the shared-memory wire.
//!
//! Runs on the posting thread, in order, under the peer's send lock (the ring has one
//! producer). The first error completion moves the queue pair to `Error` and flushes the
//! rest of the batch.
//!
//! A SEND (or WRITE-with-immediate notification) that finds the peer's ring full does not
//! block the posting thread: it and everything posted after it wait in the queue pair's
//! send queue, which the NIC thread retries every round ([`retry_stalled`]) until the ring
//! has room or the peer's timeout since the stall began fails the head with
//! `RetryExceeded`. Invariant: while the send queue is not empty, new posts join its tail,
//! so execution stays in posting order.

use super::{Memo, ShmPeer};
use crate::soft::frame::{Op, RequestHeader, REQUEST_LEN};
use crate::soft::queue_pair::{PostedSend, QpShared};
use crate::soft::registry::{AtomicOp, KeyMemo, Registry};
use crate::soft::scatter::{self, Piece};
use crate::sys::SharedMemory;
use crate::{Access, RemoteAddr, SendOp, WcStatus};
use std::collections::VecDeque;
use std::sync::PoisonError;

/// What executing one request came to.
enum Outcome {
    /// Completed with this status and byte count.
    Done(WcStatus, u32),
    /// The peer's ring has no room now: retry later.
    RingFull,
}

/// How draining the send queue ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Drained {
    /// Everything completed.
    Empty,
    /// The head waits for ring room.
    Stalled,
    /// A request failed: the queue pair is in `Error`; the rest must be flushed.
    Failed,
}

/// Executes `sends` for `qp` against `peer`; true when some wait for ring room (the NIC
/// must then retry them: see [`retry_stalled`]).
pub(crate) fn post_inline(
    registry: &Registry,
    qp: &QpShared,
    peer: &ShmPeer,
    sends: Vec<PostedSend>,
) -> bool {
    let _producer = peer
        .send_lock
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let mut queue = qp.lock_sq();
    queue.extend(sends);
    let drained = drain(registry, qp, peer, &mut queue);
    drop(queue);
    finish(qp, drained)
}

/// Copies `reads` from the peer's regions into `out`, in order (see `SoftQp::read_direct`);
/// false when the peer is gone or a read is refused.
pub(crate) fn read_direct(peer: &ShmPeer, reads: &[(RemoteAddr, usize)], out: &mut [u8]) -> bool {
    let mut at = 0;
    copy_direct(
        peer,
        reads.iter().copied(),
        Access::REMOTE_READ,
        |mem, offset, len| {
            let copied = mem.read(offset, &mut out[at..at + len]).is_ok();
            at += len;
            copied
        },
    )
}

/// Copies `writes` into the peer's regions, in order (see `SoftQp::write_direct`); false
/// when the peer is gone or a write is refused (the writes before it were done).
pub(crate) fn write_direct(peer: &ShmPeer, writes: &[(RemoteAddr, &[u8])]) -> bool {
    let ranges = writes.iter().map(|(remote, data)| (*remote, data.len()));
    let mut next = writes.iter();
    copy_direct(peer, ranges, Access::REMOTE_WRITE, |mem, offset, _| {
        next.next()
            .is_some_and(|(_, data)| mem.write(offset, data).is_ok())
    })
}

/// Checks each range (peer alive first, then rkey, bounds and `right`) and hands its
/// mapped memory and offset to `copy`, in order; false at the first refusal.
fn copy_direct(
    peer: &ShmPeer,
    ranges: impl Iterator<Item = (RemoteAddr, usize)>,
    right: Access,
    mut copy: impl FnMut(&SharedMemory, usize, usize) -> bool,
) -> bool {
    if peer.gone() {
        return false;
    }
    let mut memo = Memo::default();
    for (remote, len) in ranges {
        let Some((mem, offset)) =
            peer.locate(&mut memo, remote.rkey, remote.addr, len as u64, right)
        else {
            return false;
        };
        if !copy(mem, offset, len) {
            return false;
        }
    }
    true
}

/// Retries the sends of `qp` that wait for ring room (NIC thread); true on progress.
pub(crate) fn retry_stalled(registry: &Registry, qp: &QpShared, peer: &ShmPeer) -> bool {
    let Ok(_producer) = peer.send_lock.try_lock() else {
        return false; // a posting thread is draining the queue itself
    };
    let mut queue = qp.lock_sq();
    if queue.is_empty() {
        return false;
    }
    let before = queue.len();
    let drained = drain(registry, qp, peer, &mut queue);
    let progress = queue.len() != before;
    drop(queue);
    finish(qp, drained);
    progress
}

/// Flushes after a failure; true when sends still wait for ring room.
fn finish(qp: &QpShared, drained: Drained) -> bool {
    if drained == Drained::Failed {
        qp.flush_queued();
    }
    drained == Drained::Stalled
}

/// Executes queued sends in order until one waits for ring room or fails (a stall past
/// the peer's timeout fails with `RetryExceeded`).
fn drain(
    registry: &Registry,
    qp: &QpShared,
    peer: &ShmPeer,
    queue: &mut VecDeque<PostedSend>,
) -> Drained {
    // Checked once per batch, before any access: a peer that exited since the last batch
    // fails it (its memory still maps, but nobody keeps it current any more). A peer that
    // dies while the batch runs is read as it was when it died, a moment inside the batch.
    let gone = peer.gone();
    let mut memo = Memo::default();
    let mut local = KeyMemo::new(qp.pd);
    let mut pieces = Vec::new();
    while let Some(send) = queue.front() {
        let need = local_need(&send.op);
        let resolved =
            scatter::resolve_into(registry, &mut local, &send.sg_list, need, &mut pieces);
        let outcome = match resolved {
            _ if gone => Outcome::Done(WcStatus::RetryExceeded, 0),
            Ok(()) => execute(peer, &mut memo, &send.op, &pieces),
            Err(status) => Outcome::Done(status, 0),
        };
        let (status, byte_len) = match outcome {
            Outcome::RingFull if !peer.stall_expired() => return Drained::Stalled,
            Outcome::RingFull => (WcStatus::RetryExceeded, 0),
            Outcome::Done(status, byte_len) => (status, byte_len),
        };
        peer.end_stall();
        let Some(send) = queue.pop_front() else { break };
        if status != WcStatus::Success {
            qp.mark_error();
            qp.complete_send(send.wr_id, &send.op, status, 0, true);
            return Drained::Failed;
        }
        qp.complete_send(send.wr_id, &send.op, status, byte_len, send.signaled);
    }
    Drained::Empty
}

fn local_need(op: &SendOp) -> Access {
    match op {
        SendOp::Write { .. } | SendOp::Send { .. } => Access::NONE,
        _ => Access::LOCAL_WRITE,
    }
}

fn execute(peer: &ShmPeer, memo: &mut Memo, op: &SendOp, pieces: &[Piece]) -> Outcome {
    let len = scatter::total_len(pieces);
    let Ok(len32) = u32::try_from(len) else {
        return Outcome::Done(WcStatus::LocalLengthError, 0);
    };
    let status = match *op {
        SendOp::Read(remote) => {
            match peer.resolve(
                memo,
                remote.rkey,
                remote.addr,
                len as u64,
                Access::REMOTE_READ,
            ) {
                Some(source) => {
                    scatter::scatter_from_memory(pieces, &source);
                    WcStatus::Success
                }
                None => WcStatus::RemoteAccessError,
            }
        }
        SendOp::Write { remote, imm } => return write(peer, memo, remote, imm, pieces, len32),
        SendOp::Send { imm } => return send(peer, imm, pieces, len32),
        SendOp::CompareSwap {
            remote,
            compare,
            swap,
        } => atomic(
            peer,
            remote,
            pieces,
            AtomicOp::CompareSwap { compare, swap },
            memo,
        ),
        SendOp::FetchAdd { remote, add } => {
            atomic(peer, remote, pieces, AtomicOp::FetchAdd(add), memo)
        }
    };
    Outcome::Done(status, len32)
}

fn write(
    peer: &ShmPeer,
    memo: &mut Memo,
    remote: RemoteAddr,
    imm: Option<u32>,
    pieces: &[Piece],
    len: u32,
) -> Outcome {
    let Some(destination) = peer.resolve(
        memo,
        remote.rkey,
        remote.addr,
        u64::from(len),
        Access::REMOTE_WRITE,
    ) else {
        return Outcome::Done(WcStatus::RemoteAccessError, 0);
    };
    // A retry after a full ring writes the same bytes again before notifying.
    scatter::gather_to_memory(pieces, &destination);
    match imm {
        Some(_) => push_frame(peer, &RequestHeader::new(Op::ImmNotify, len, imm), &[], len),
        None => Outcome::Done(WcStatus::Success, len),
    }
}

fn send(peer: &ShmPeer, imm: Option<u32>, pieces: &[Piece], len: u32) -> Outcome {
    if REQUEST_LEN + len as usize > peer.ring.max_frame() {
        return Outcome::Done(WcStatus::LocalLengthError, 0);
    }
    let mut payload = Vec::with_capacity(len as usize);
    scatter::gather_into(pieces, &mut payload);
    push_frame(peer, &RequestHeader::new(Op::Send, len, imm), &payload, len)
}

fn push_frame(peer: &ShmPeer, header: &RequestHeader, payload: &[u8], len: u32) -> Outcome {
    let mut header_bytes = Vec::with_capacity(REQUEST_LEN);
    header.encode(&mut header_bytes);
    if peer.try_push(&[&header_bytes, payload]) {
        return Outcome::Done(WcStatus::Success, len);
    }
    if peer.gone() {
        return Outcome::Done(WcStatus::RetryExceeded, 0);
    }
    Outcome::RingFull
}

fn atomic(
    peer: &ShmPeer,
    remote: RemoteAddr,
    pieces: &[Piece],
    op: AtomicOp,
    memo: &mut Memo,
) -> WcStatus {
    let target = peer.resolve(memo, remote.rkey, remote.addr, 8, Access::REMOTE_ATOMIC);
    let Some(old) = target.and_then(|target| target.run_atomic(remote.addr, op)) else {
        return WcStatus::RemoteAccessError;
    };
    scatter::scatter_from_bytes(pieces, &old.to_le_bytes());
    WcStatus::Success
}
