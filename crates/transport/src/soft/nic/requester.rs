//! The requester half of a TCP link: turns posted send work requests into request frames
//! and completes them, in order, as responses arrive.

use super::conn::Conn;
use super::LinkClosed;
use crate::soft::frame::{self, Op, RequestHeader, ResponseHeader};
use crate::soft::queue_pair::{PostedSend, QpShared};
use crate::soft::registry::Registry;
use crate::soft::scatter::{self, Piece};
use crate::{Access, QpState, SendOp, WcStatus};
use std::collections::VecDeque;
use std::sync::Arc;

/// A work request on the wire (or failed locally before reaching it).
#[derive(Debug)]
enum Pending {
    /// Sent; `scatter` receives READ data or the atomic's old value.
    Remote {
        send: PostedSend,
        scatter: Vec<Piece>,
        byte_len: u32,
    },
    /// Refused locally; completes with `status` once everything before it has.
    Failed { send: PostedSend, status: WcStatus },
}

/// The outbound connection of one queue pair.
#[derive(Debug)]
pub(crate) struct RequesterLink {
    pub(super) qp: Arc<QpShared>,
    pub(super) conn: Conn,
    outstanding: VecDeque<Pending>,
    halted: bool,
}

impl RequesterLink {
    pub(crate) fn new(qp: Arc<QpShared>, conn: Conn) -> Self {
        RequesterLink {
            qp,
            conn,
            outstanding: VecDeque::new(),
            halted: false,
        }
    }

    /// One round: issue queued requests, move bytes (reading only when `readable`),
    /// complete answered requests.
    pub(crate) fn step(&mut self, registry: &Registry, readable: bool) -> Result<bool, LinkClosed> {
        if self.qp.closed.load(std::sync::atomic::Ordering::Acquire) {
            return Err(LinkClosed);
        }
        if self.qp.state() == QpState::Error {
            return Err(self.fail_outstanding(WcStatus::WrFlushError));
        }
        let mut progress = self.issue(registry);
        let moved = self
            .conn
            .flush()
            .and_then(|sent| Ok(sent | (readable && self.conn.fill()?)));
        match moved {
            Ok(moved) => progress |= moved,
            Err(_) => return Err(self.fail_outstanding(WcStatus::RetryExceeded)),
        }
        Ok(progress | self.complete_answered()?)
    }

    /// Whether queued or buffered work is waiting (the NIC must not park).
    pub(crate) fn busy(&self) -> bool {
        self.conn.has_output() || (!self.halted && !self.qp.lock_sq().is_empty())
    }

    fn issue(&mut self, registry: &Registry) -> bool {
        let mut progress = false;
        while !self.halted {
            let Some(send) = self.qp.lock_sq().pop_front() else {
                break;
            };
            progress = true;
            let pending = encode(registry, send, &mut self.conn.output);
            self.halted = matches!(pending, Pending::Failed { .. });
            self.outstanding.push_back(pending);
        }
        progress
    }

    fn complete_answered(&mut self) -> Result<bool, LinkClosed> {
        let mut progress = false;
        while let Some(front) = self.outstanding.front() {
            if let Pending::Failed { status, .. } = front {
                let status = *status;
                return Err(self.fail_outstanding(status));
            }
            let input = self.conn.input();
            let Some(response) = ResponseHeader::decode(input) else {
                if input.len() >= frame::RESPONSE_LEN {
                    return Err(self.fail_outstanding(WcStatus::RemoteInvalidRequest));
                }
                break;
            };
            let frame_len = frame::RESPONSE_LEN + response.len as usize;
            if input.len() < frame_len {
                self.conn.reserve_frame(frame_len);
                break;
            }
            if response.status != WcStatus::Success {
                return Err(self.fail_outstanding(response.status));
            }
            self.finish_front(&response);
            self.conn.consume(frame_len);
            progress = true;
        }
        Ok(progress)
    }

    fn finish_front(&mut self, response: &ResponseHeader) {
        let Some(Pending::Remote {
            send,
            scatter,
            byte_len,
        }) = self.outstanding.pop_front()
        else {
            return;
        };
        let payload = &self.conn.input()[frame::RESPONSE_LEN..][..response.len as usize];
        match send.op {
            SendOp::Read(_) => scatter::scatter_from_bytes(&scatter, payload),
            SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => {
                scatter::scatter_from_bytes(&scatter, &response.value.to_le_bytes())
            }
            _ => true,
        };
        self.qp.complete_send(
            send.wr_id,
            &send.op,
            WcStatus::Success,
            byte_len,
            send.signaled,
        );
    }

    /// Completes the first outstanding request with `first`, flushes the rest and the
    /// queue pair; the link is finished.
    fn fail_outstanding(&mut self, first: WcStatus) -> LinkClosed {
        for (index, pending) in self.outstanding.drain(..).enumerate() {
            let status = if index == 0 {
                first
            } else {
                WcStatus::WrFlushError
            };
            let (Pending::Remote { send, .. } | Pending::Failed { send, .. }) = pending;
            self.qp.complete_send(send.wr_id, &send.op, status, 0, true);
        }
        self.qp.enter_error();
        LinkClosed
    }
}

/// Encodes `send` into `out`, or returns it as failed when its local list is bad.
fn encode(registry: &Registry, send: PostedSend, out: &mut Vec<u8>) -> Pending {
    let local_need = match send.op {
        SendOp::Write { .. } | SendOp::Send { .. } => Access::NONE,
        _ => Access::LOCAL_WRITE,
    };
    let pieces = match scatter::resolve(registry, &send.sg_list, local_need) {
        Ok(pieces) => pieces,
        Err(status) => return Pending::Failed { send, status },
    };
    let Some(len) = u32::try_from(scatter::total_len(&pieces))
        .ok()
        .filter(|&l| l <= frame::MAX_PAYLOAD)
    else {
        return Pending::Failed {
            send,
            status: WcStatus::LocalLengthError,
        };
    };
    let header = request_header(&send.op, len);
    header.encode(out);
    if header.payload_len() > 0 {
        scatter::gather_into(&pieces, out);
        return Pending::Remote {
            send,
            scatter: Vec::new(),
            byte_len: len,
        };
    }
    Pending::Remote {
        send,
        scatter: pieces,
        byte_len: len,
    }
}

fn request_header(op: &SendOp, len: u32) -> RequestHeader {
    match *op {
        SendOp::Read(remote) => RequestHeader {
            remote,
            ..RequestHeader::new(Op::Read, len, None)
        },
        SendOp::Write { remote, imm } => RequestHeader {
            remote,
            ..RequestHeader::new(Op::Write, len, imm)
        },
        SendOp::Send { imm } => RequestHeader::new(Op::Send, len, imm),
        SendOp::CompareSwap {
            remote,
            compare,
            swap,
        } => RequestHeader {
            remote,
            operand: compare,
            swap,
            ..RequestHeader::new(Op::CompareSwap, len, None)
        },
        SendOp::FetchAdd { remote, add } => RequestHeader {
            remote,
            operand: add,
            ..RequestHeader::new(Op::FetchAdd, len, None)
        },
    }
}
