//! The responder half of the NIC: executes an incoming request against this domain's
//! registrations, exactly as hardware would, with no application thread involved.
//!
//! A request whose key, bounds, alignment or right is wrong gets an error response and
//! touches nothing. A SEND or WRITE-with-immediate that finds no receive buffer is not
//! executed (`None`): the caller retries it later, like an infinite RNR retry.

use super::frame::{Op, RequestHeader, ResponseHeader};
use super::queue_pair::{PostedRecv, QpShared};
use super::registry::{AtomicOp, Registry};
use super::scatter;
use crate::{Access, WcOpcode, WcStatus};

/// Executes `header` (+ `payload`) arriving on a TCP link for queue pair `qp`, other than
/// a READ (answered by the link itself, from registered memory); `None` means "no receive
/// buffer yet".
pub(crate) fn execute(
    registry: &Registry,
    qp: &QpShared,
    header: &RequestHeader,
    payload: &[u8],
) -> Option<ResponseHeader> {
    let response = match header.op {
        // The link answers READs and READ lists itself (`serve`); none is routed here.
        Op::Read | Op::ReadList => status_reply(WcStatus::RemoteInvalidRequest, 0),
        Op::Write => execute_write(registry, qp, header, payload)?,
        Op::Send => deliver(registry, qp, header.imm, Some(payload), header.len)?,
        // Shared-memory wire only (its data is already in place); on a TCP link it would
        // consume a receive for data never written.
        Op::ImmNotify => status_reply(WcStatus::RemoteInvalidRequest, 0),
        Op::CompareSwap | Op::FetchAdd => execute_atomic(registry, qp, header),
    };
    Some(response)
}

/// A response with `status` and `len` (the bytes that follow it).
pub(crate) fn status_reply(status: WcStatus, len: u32) -> ResponseHeader {
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
