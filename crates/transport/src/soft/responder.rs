//! The responder half of the NIC: executes an incoming request against this domain's
//! registrations, exactly as hardware would, with no application thread involved.
//!
//! A request whose key, bounds, alignment or right is wrong gets an error response and
//! touches nothing. A SEND or WRITE-with-immediate that finds no receive buffer is not
//! executed (`None`): the caller retries it later, like an infinite RNR retry.

use super::frame::{Op, RequestHeader, ResponseHeader};
use super::queue_pair::{PostedRecv, QpShared};
use super::registry::{AtomicOp, KeyMemo, Registry, Target};
use super::scatter;
use crate::{Access, WcOpcode, WcStatus};

/// What to send back: the header and, for a READ, where its data lies.
pub(crate) type Reply = (ResponseHeader, Option<Target>);

/// Executes `header` (+ `payload`) arriving on a TCP link for queue pair `qp`; `None`
/// means "no receive buffer yet". READs resolve their key through `memo` (the frames of
/// one pass over a link's input mostly name one key).
pub(crate) fn execute(
    registry: &Registry,
    memo: &mut KeyMemo,
    qp: &QpShared,
    header: &RequestHeader,
    payload: &[u8],
) -> Option<Reply> {
    let len = u64::from(header.len);
    let remote = header.remote;
    let reply = match header.op {
        Op::Read => {
            match registry.resolve_memo(memo, remote.rkey, remote.addr, len, Access::REMOTE_READ) {
                Some(target) => (status_reply(WcStatus::Success, header.len), Some(target)),
                None => (status_reply(WcStatus::RemoteAccessError, 0), None),
            }
        }
        Op::Write => (execute_write(registry, qp, header, payload)?, None),
        Op::Send => (
            deliver(registry, qp, header.imm, Some(payload), header.len)?,
            None,
        ),
        // Shared-memory wire only (its data is already in place); on a TCP link it would
        // consume a receive for data never written.
        Op::ImmNotify => (status_reply(WcStatus::RemoteInvalidRequest, 0), None),
        Op::CompareSwap | Op::FetchAdd => (execute_atomic(registry, qp, header), None),
    };
    Some(reply)
}

/// Answers a READ smaller than a zero-copy payload straight into `out`: its response
/// header and a copy of the bytes (or an error response). Unlike [`execute`] it takes no
/// reference to the memory (two atomic operations on a count every reader shares, per
/// READ, were a tenth of a lookup's READ batch on soft-TCP).
#[inline]
pub(crate) fn answer_small_read(
    registry: &Registry,
    memo: &mut KeyMemo,
    header: &RequestHeader,
    out: &mut Vec<u8>,
) {
    let remote = header.remote;
    let len = u64::from(header.len);
    let found = registry.check_memo(memo, remote.rkey, remote.addr, len, Access::REMOTE_READ);
    let Some((mem, offset)) = found else {
        return status_reply(WcStatus::RemoteAccessError, 0).encode(out);
    };
    status_reply(WcStatus::Success, header.len).encode(out);
    // Bounds were checked against the registration, which lies inside `mem`.
    let _ = mem.append_to(offset, header.len as usize, out);
}

fn status_reply(status: WcStatus, len: u32) -> ResponseHeader {
    ResponseHeader {
        status,
        len,
        value: 0,
    }
}

fn execute_write(
    registry: &Registry,
    qp: &QpShared,
    header: &RequestHeader,
    payload: &[u8],
) -> Option<ResponseHeader> {
    if header.imm.is_some() && qp.lock_rq().is_empty() {
        return None;
    }
    let remote = header.remote;
    let target = registry.resolve(
        qp.pd,
        remote.rkey,
        remote.addr,
        payload.len() as u64,
        Access::REMOTE_WRITE,
    );
    let Some(target) = target else {
        return Some(status_reply(WcStatus::RemoteAccessError, 0));
    };
    let _ = target.mem.write(target.offset, payload);
    match header.imm {
        Some(_) => deliver(registry, qp, header.imm, None, header.len),
        None => Some(status_reply(WcStatus::Success, 0)),
    }
}

fn execute_atomic(registry: &Registry, qp: &QpShared, header: &RequestHeader) -> ResponseHeader {
    let op = match header.op {
        Op::CompareSwap => AtomicOp::CompareSwap {
            compare: header.operand,
            swap: header.swap,
        },
        _ => AtomicOp::FetchAdd(header.operand),
    };
    let remote = header.remote;
    let target = registry.resolve(qp.pd, remote.rkey, remote.addr, 8, Access::REMOTE_ATOMIC);
    match target.and_then(|target| target.run_atomic(remote.addr, op)) {
        Some(value) => ResponseHeader {
            status: WcStatus::Success,
            len: 0,
            value,
        },
        None => status_reply(WcStatus::RemoteAccessError, 0),
    }
}

/// Consumes the next receive buffer for a SEND (`payload`) or a WRITE with immediate
/// (`payload` is `None`, `len` bytes were written); `None` when no buffer is posted.
pub(crate) fn deliver(
    registry: &Registry,
    qp: &QpShared,
    imm: Option<u32>,
    payload: Option<&[u8]>,
    len: u32,
) -> Option<ResponseHeader> {
    let recv = qp.lock_rq().pop_front()?;
    let opcode = if payload.is_some() {
        WcOpcode::Recv
    } else {
        WcOpcode::RecvRdmaWithImm
    };
    let outcome = match payload {
        Some(data) => match scatter::resolve(registry, qp.pd, &recv.sg_list, Access::LOCAL_WRITE) {
            Ok(pieces) if scatter::scatter_from_bytes(&pieces, data) => Ok(()),
            Ok(_) => Err(WcStatus::LocalLengthError),
            Err(status) => Err(status),
        },
        None => Ok(()),
    };
    match outcome {
        Ok(()) => {
            qp.complete_recv(&recv, opcode, WcStatus::Success, len, imm);
            Some(status_reply(WcStatus::Success, 0))
        }
        Err(status) => Some(fail_receive(qp, &recv, opcode, status, imm)),
    }
}

/// Fails receive buffer `recv` with `status`: the queue pair breaks, what is queued is
/// flushed, and the requester is answered `RemoteInvalidRequest` (the reply returned).
pub(crate) fn fail_receive(
    qp: &QpShared,
    recv: &PostedRecv,
    opcode: WcOpcode,
    status: WcStatus,
    imm: Option<u32>,
) -> ResponseHeader {
    qp.mark_error();
    qp.complete_recv(recv, opcode, status, 0, imm);
    qp.flush_queued();
    status_reply(WcStatus::RemoteInvalidRequest, 0)
}
