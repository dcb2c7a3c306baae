//! The requester half of a TCP link: turns posted send work requests into request frames
//! and completes them, in order, as responses arrive. Small READs queued back to back go
//! out as one READ list when the peer NIC takes lists (see `frame`); each still completes
//! as its own work request.

use super::conn::Conn;
use super::zero_copy::{self, Placement, ZERO_COPY_MIN};
use super::LinkClosed;
use crate::soft::frame::{self, Op, ReadEntry, RequestHeader, ResponseHeader};
use crate::soft::queue_pair::{PostedSend, QpShared};
use crate::soft::registry::{KeyMemo, Registry};
use crate::soft::scatter::{self, Pieces};
use crate::sys::OutputQueue;
use crate::{Access, QpState, SendOp, WcStatus};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A work request on the wire (or failed locally before reaching it).
#[derive(Debug)]
enum Pending {
    /// Sent; `scatter` receives READ data or the atomic's old value. `frame_reads`: how
    /// many requests the answer to its frame answers — 1 for a frame of its own, a list's
    /// length for a list's first READ, 0 for the list's others.
    Remote {
        send: PostedSend,
        scatter: Pieces,
        byte_len: u32,
        frame_reads: usize,
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
    /// The sends being encoded, taken from the queue pair's send queue (kept to reuse its
    /// allocation).
    issuing: VecDeque<PostedSend>,
    halted: bool,
    /// The payload of the front READ response, being placed into its scatter list.
    placing: Option<Placement>,
    /// Longest time without bytes moving either way while requests are outstanding.
    timeout: Duration,
    /// When bytes last moved (or the first request went out after a quiet spell).
    last_answer: Instant,
    /// Unsignaled sends completed successfully whose slots are not yet freed: freed in one
    /// step at the end of a pass, and before any completion is reported (so an application
    /// that sees a completion may post as many sends as it just saw complete).
    unreleased: usize,
    /// The peer NIC answers READ lists.
    lists: bool,
}

impl RequesterLink {
    pub(crate) fn new(qp: Arc<QpShared>, conn: Conn, timeout: Duration, lists: bool) -> Self {
        RequesterLink {
            qp,
            conn,
            outstanding: VecDeque::new(),
            issuing: VecDeque::new(),
            halted: false,
            placing: None,
            timeout,
            last_answer: Instant::now(),
            unreleased: 0,
            lists,
        }
    }

    /// One round: issue queued requests, move bytes (reading only when `readable`),
    /// complete answered requests. Only moved bytes count as an answer for the timeout.
    pub(crate) fn step(&mut self, registry: &Registry, readable: bool) -> Result<bool, LinkClosed> {
        if self.qp.closed.load(std::sync::atomic::Ordering::Acquire) {
            return Err(LinkClosed);
        }
        if self.qp.state() == QpState::Error {
            return Err(self.finish_broken());
        }
        let mut progress = self.issue(registry);
        let buffer = readable && self.placing.is_none();
        let moved = self
            .conn
            .flush()
            .and_then(|sent| Ok(sent | (buffer && self.conn.fill()?)));
        match moved {
            Ok(true) => {
                progress = true;
                self.last_answer = Instant::now();
            }
            Ok(false) => {}
            Err(_) => return Err(self.fail_outstanding(WcStatus::RetryExceeded)),
        }
        progress |= self.complete_answered(readable)?;
        if !self.outstanding.is_empty() && self.last_answer.elapsed() > self.timeout {
            return Err(self.fail_outstanding(WcStatus::RetryExceeded));
        }
        Ok(progress)
    }

    /// Whether queued work or writable output is waiting (the NIC must not park); output
    /// the socket would not take waits for epoll to report it writable.
    pub(crate) fn busy(&self) -> bool {
        self.conn.output_ready() || (!self.halted && !self.qp.lock_sq().is_empty())
    }

    /// Whether a step could do anything: work is queued or responses are awaited.
    pub(crate) fn wants_progress(&self) -> bool {
        !self.outstanding.is_empty() || self.busy() || self.conn.has_output()
    }

    /// Encodes the queued sends, taken from the send queue under one lock; what follows a
    /// send refused locally goes back to the queue's front (flushed when the queue pair
    /// fails).
    fn issue(&mut self, registry: &Registry) -> bool {
        if self.halted {
            return false;
        }
        std::mem::swap(&mut *self.qp.lock_sq(), &mut self.issuing);
        let progress = !self.issuing.is_empty();
        // The local keys of the sends issued in one pass are looked up once each.
        let mut memo = KeyMemo::new(self.qp.pd);
        while let Some(send) = self.issuing.pop_front() {
            if self.outstanding.is_empty() {
                self.last_answer = Instant::now();
            }
            let listed = self.list_len(&send);
            let failed = if listed >= 2 {
                self.issue_list(registry, &mut memo, send, listed)
            } else {
                match encode(registry, &mut memo, send, &mut self.conn.output) {
                    failed @ Pending::Failed { .. } => Some(failed),
                    sent => {
                        self.outstanding.push_back(sent);
                        None
                    }
                }
            };
            if let Some(failed) = failed {
                self.outstanding.push_back(failed);
                self.halted = true;
                let mut queue = self.qp.lock_sq();
                self.issuing.append(&mut queue);
                std::mem::swap(&mut *queue, &mut self.issuing);
                break;
            }
        }
        progress
    }

    /// Completes the answered requests in order, then frees the slots of those that
    /// completed unsignaled.
    fn complete_answered(&mut self, readable: bool) -> Result<bool, LinkClosed> {
        let answered = self.complete_in_order(readable);
        self.release_unsignaled();
        answered
    }

    /// Frees the slots counted in `unreleased`.
    fn release_unsignaled(&mut self) {
        self.qp.release_sends(std::mem::take(&mut self.unreleased));
    }

    /// How many sends from `send` on (it, then the front of `issuing`) go out as one READ
    /// list: the small READs that lead, within a list's limits; 0 when fewer than two do
    /// or the peer takes no lists.
    fn list_len(&self, send: &PostedSend) -> usize {
        if !self.lists {
            return 0;
        }
        let (mut count, mut bytes) = (0, 0u64);
        for next in std::iter::once(send).chain(&self.issuing) {
            let len: u64 = next.sg_list.iter().map(|sge| u64::from(sge.len)).sum();
            let fits = count < frame::MAX_READ_LIST
                && bytes + len <= u64::from(frame::MAX_READ_LIST_BYTES);
            if !matches!(next.op, SendOp::Read(_)) || !fits {
                break;
            }
            (count, bytes) = (count + 1, bytes + len);
        }
        if count >= 2 {
            count
        } else {
            0
        }
    }

    /// Encodes `first` and the next `listed - 1` sends of `issuing` (READs, see
    /// [`Self::list_len`]) as one READ list and queues them as outstanding. A READ whose
    /// local list is bad ends the list before it and is returned as failed (the READs
    /// after it stay queued).
    fn issue_list(
        &mut self,
        registry: &Registry,
        memo: &mut KeyMemo,
        first: PostedSend,
        listed: usize,
    ) -> Option<Pending> {
        let at = self.conn.output.bytes().len();
        self.conn
            .output
            .bytes()
            .extend_from_slice(&[0; frame::REQUEST_LEN]);
        let head = self.outstanding.len();
        let (mut count, mut bytes, mut failed) = (0, 0u32, None);
        let mut first_remote = None;
        let mut next = Some(first);
        while let Some(send) = next.take() {
            let SendOp::Read(remote) = send.op else {
                self.issuing.push_front(send);
                break;
            };
            let pieces =
                match scatter::resolve_pieces(registry, memo, &send.sg_list, Access::LOCAL_WRITE) {
                    Ok(pieces) => pieces,
                    Err(status) => {
                        failed = Some(Pending::Failed { send, status });
                        break;
                    }
                };
            // Within the list's limits (`list_len`), so it fits in a u32.
            let len = scatter::total_len(&pieces) as u32;
            first_remote.get_or_insert(remote);
            ReadEntry { remote, len }.encode(self.conn.output.bytes());
            self.outstanding.push_back(Pending::Remote {
                send,
                scatter: pieces,
                byte_len: len,
                frame_reads: 0,
            });
            (count, bytes) = (count + 1, bytes + len);
            if count < listed {
                next = self.issuing.pop_front();
            }
        }
        let out = self.conn.output.bytes();
        if count == 0 {
            out.truncate(at);
            return failed;
        }
        let header = match (count, first_remote) {
            // Cut to one READ by a local failure: sent as a plain READ, answered as one.
            (1, Some(remote)) => {
                out.truncate(at + frame::REQUEST_LEN);
                RequestHeader {
                    remote,
                    ..RequestHeader::new(Op::Read, bytes, None)
                }
            }
            _ => RequestHeader::read_list(count, bytes),
        };
        out[at..at + frame::REQUEST_LEN].copy_from_slice(&header.to_bytes());
        if let Some(Pending::Remote { frame_reads, .. }) = self.outstanding.get_mut(head) {
            *frame_reads = count;
        }
        failed
    }

    /// Completes answered requests front first; unsignaled successes are left counted in
    /// `unreleased` (the caller frees them).
    fn complete_in_order(&mut self, readable: bool) -> Result<bool, LinkClosed> {
        let mut progress = false;
        while self.continue_placement(readable)? {
            let Some(front) = self.outstanding.front() else {
                if !self.conn.input().is_empty() {
                    // Bytes nobody asked for: the peer is broken; the link cannot go on.
                    return Err(self.fail_outstanding(WcStatus::RemoteInvalidRequest));
                }
                break;
            };
            let expected_len = match front {
                Pending::Failed { status, .. } => {
                    let status = *status;
                    return Err(self.fail_outstanding(status));
                }
                Pending::Remote { frame_reads, .. } if *frame_reads != 1 => {
                    let reads = *frame_reads;
                    if !self.complete_list(reads)? {
                        break;
                    }
                    progress = true;
                    continue;
                }
                Pending::Remote { send, byte_len, .. } => match send.op {
                    SendOp::Read(_) => *byte_len,
                    _ => 0,
                },
            };
            let input = self.conn.input();
            let Some(response) = ResponseHeader::decode(input) else {
                if input.len() >= frame::RESPONSE_LEN {
                    return Err(self.fail_outstanding(WcStatus::RemoteInvalidRequest));
                }
                break;
            };
            if response.status != WcStatus::Success {
                return Err(self.fail_outstanding(response.status));
            }
            if response.len != expected_len {
                // A READ answered with more or fewer bytes than asked, or data on a
                // response that carries none.
                return Err(self.fail_outstanding(WcStatus::RemoteInvalidRequest));
            }
            let frame_len = frame::RESPONSE_LEN + response.len as usize;
            if input.len() < frame_len {
                if response.len as usize >= ZERO_COPY_MIN {
                    self.start_placement(&response)?;
                    progress = true;
                    continue;
                }
                self.conn.reserve_frame(frame_len);
                break;
            }
            self.finish_front(&response);
            self.conn.consume(frame_len);
            progress = true;
        }
        Ok(progress)
    }

    /// Completes the `reads` READs of the list at the front from its answer: those it
    /// answered get their bytes; if it stopped early, the next fails with its status and
    /// the rest are flushed. Ok(false) while the answer has not all arrived.
    fn complete_list(&mut self, reads: usize) -> Result<bool, LinkClosed> {
        if reads == 0 {
            // A list's later READ at the front: never, as a list completes as a whole.
            return Err(self.fail_outstanding(WcStatus::RemoteInvalidRequest));
        }
        let input = self.conn.input();
        let Some(response) = ResponseHeader::decode(input) else {
            if input.len() >= frame::RESPONSE_LEN {
                return Err(self.fail_outstanding(WcStatus::RemoteInvalidRequest));
            }
            return Ok(false);
        };
        let answered = usize::try_from(response.value).unwrap_or(usize::MAX);
        let whole = response.status == WcStatus::Success;
        let answered_len: u64 = self
            .outstanding
            .iter()
            .take(answered.min(reads))
            .map(|pending| match pending {
                Pending::Remote { byte_len, .. } => u64::from(*byte_len),
                // A list holds only sent READs.
                Pending::Failed { .. } => 0,
            })
            .sum();
        if answered > reads || whole != (answered == reads) {
            return Err(self.fail_outstanding(WcStatus::RemoteInvalidRequest));
        }
        if u64::from(response.len) != answered_len {
            return Err(self.fail_outstanding(WcStatus::RemoteInvalidRequest));
        }
        let frame_len = frame::RESPONSE_LEN + response.len as usize;
        if input.len() < frame_len {
            self.conn.reserve_frame(frame_len);
            return Ok(false);
        }
        let mut payload = &input[frame::RESPONSE_LEN..frame_len];
        for pending in self.outstanding.iter().take(answered) {
            if let Pending::Remote {
                scatter, byte_len, ..
            } = pending
            {
                let (bytes, rest) = payload.split_at(*byte_len as usize);
                // The scatter list holds the READ's length, resolved when it was sent.
                let _ = scatter::scatter_from_bytes(scatter, bytes);
                payload = rest;
            }
        }
        self.conn.consume(frame_len);
        for _ in 0..answered {
            self.complete_front();
        }
        if !whole {
            return Err(self.fail_outstanding(response.status));
        }
        Ok(true)
    }

    /// Advances the payload being placed; Ok(false) while it waits for more bytes.
    fn continue_placement(&mut self, readable: bool) -> Result<bool, LinkClosed> {
        let Some(placing) = &mut self.placing else {
            return Ok(true);
        };
        match placing.advance(&mut self.conn, readable) {
            Err(_) => Err(self.fail_outstanding(WcStatus::RetryExceeded)),
            Ok(moved) if !placing.is_done() => {
                if moved > 0 {
                    self.last_answer = Instant::now();
                }
                Ok(false)
            }
            Ok(_) => {
                self.placing = None;
                self.complete_front();
                Ok(true)
            }
        }
    }

    /// Starts placing the front READ's payload straight into its scatter list.
    fn start_placement(&mut self, response: &ResponseHeader) -> Result<(), LinkClosed> {
        let pieces = match self.outstanding.front() {
            Some(Pending::Remote { scatter, .. }) => scatter.to_vec(),
            _ => Vec::new(),
        };
        if scatter::total_len(&pieces) != response.len as usize {
            return Err(self.fail_outstanding(WcStatus::RemoteInvalidRequest));
        }
        self.conn.consume(frame::RESPONSE_LEN);
        self.placing = Some(Placement::new(pieces));
        Ok(())
    }

    /// Scatters a buffered response's payload (READ data or atomic value), then completes.
    fn finish_front(&mut self, response: &ResponseHeader) {
        // The length was checked against the request, so the scatter list holds it all.
        if let Some(Pending::Remote { send, scatter, .. }) = self.outstanding.front() {
            let payload = &self.conn.input()[frame::RESPONSE_LEN..][..response.len as usize];
            let _ = match send.op {
                SendOp::Read(_) => scatter::scatter_from_bytes(scatter, payload),
                SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => {
                    scatter::scatter_from_bytes(scatter, &response.value.to_le_bytes())
                }
                _ => true,
            };
        }
        self.complete_front();
    }

    fn complete_front(&mut self) {
        if let Some(Pending::Remote { send, byte_len, .. }) = self.outstanding.pop_front() {
            if !send.signaled {
                // A success with nothing to report: its slot is freed with the pass's others.
                self.unreleased += 1;
                return;
            }
            self.release_unsignaled();
            let signaled = true;
            self.qp
                .complete_send(send.wr_id, &send.op, WcStatus::Success, byte_len, signaled);
        }
    }

    /// The queue pair broke elsewhere (its inbound link closed, a receive failed): answers
    /// that already arrived still complete (a peer's error answer and its closing the
    /// other link race), then what is left is flushed.
    fn finish_broken(&mut self) -> LinkClosed {
        let filled = self.placing.is_none() && self.conn.fill().is_ok();
        if let Err(closed) = self.complete_answered(filled) {
            return closed;
        }
        self.fail_outstanding(WcStatus::WrFlushError)
    }

    /// Completes the first outstanding request with `first`, flushes the rest and the
    /// queue pair; the link is finished.
    fn fail_outstanding(&mut self, first: WcStatus) -> LinkClosed {
        self.release_unsignaled();
        self.qp.mark_error();
        for (index, pending) in self.outstanding.drain(..).enumerate() {
            let status = if index == 0 {
                first
            } else {
                WcStatus::WrFlushError
            };
            let (Pending::Remote { send, .. } | Pending::Failed { send, .. }) = pending;
            self.qp.complete_send(send.wr_id, &send.op, status, 0, true);
        }
        self.qp.flush_queued();
        LinkClosed
    }
}

/// Encodes `send` into `out`, or returns it as failed when its local list is bad.
fn encode(
    registry: &Registry,
    memo: &mut KeyMemo,
    send: PostedSend,
    out: &mut OutputQueue,
) -> Pending {
    let local_need = match send.op {
        SendOp::Write { .. } | SendOp::Send { .. } => Access::NONE,
        _ => Access::LOCAL_WRITE,
    };
    let pieces = match scatter::resolve_pieces(registry, memo, &send.sg_list, local_need) {
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
    header.encode(out.bytes());
    if header.payload_len() > 0 {
        zero_copy::queue_payload(&pieces, out);
        return Pending::Remote {
            send,
            scatter: Pieces::Empty,
            byte_len: len,
            frame_reads: 1,
        };
    }
    Pending::Remote {
        send,
        scatter: pieces,
        byte_len: len,
        frame_reads: 1,
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
