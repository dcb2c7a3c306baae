//! The responder half of a TCP link: executes incoming requests and answers in order.
//!
//! Payloads of [`ZERO_COPY_MIN`] bytes or more are never buffered whole (a buffered frame
//! is smaller than that plus its header, whatever its header claims): a WRITE's goes
//! straight into its target (with an immediate, once a receive buffer is there to consume),
//! a SEND's straight into the receive buffer it consumes, and a refused one is read and
//! dropped. A large SEND or WRITE-with-immediate that finds no receive buffer leaves its
//! payload in the socket (TCP flow control holds the sender back); while any
//! request waits for a receive buffer the link is out of the NIC's epoll set, until a
//! receive is posted (`post_recv` wakes the NIC). While the socket does not take the
//! responses (a peer that does not read), the link is watched for writability and does
//! not keep the NIC awake; once [`OUTPUT_CAP`](super::conn::OUTPUT_CAP) bytes of answers
//! wait, it takes no more requests (nor reads the socket) until they drain.

use super::conn::Conn;
use super::zero_copy::{Placement, ZERO_COPY_MIN};
use super::LinkClosed;
use crate::soft::frame::{self, Op, ReadEntry, RequestHeader};
use crate::soft::queue_pair::{PostedRecv, QpShared};
use crate::soft::registry::{KeyMemo, Registry, Span};
use crate::soft::responder;
use crate::soft::scatter::{self, Piece};
use crate::sys::{Epoll, OutputQueue, READ, WRITE};
use crate::{Access, WcOpcode, WcStatus};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A link that moved bytes this recently is hot: a busy NIC reads it without asking epoll.
const HOT_WINDOW: Duration = Duration::from_millis(1);

/// What to do once a placed payload is all in.
#[derive(Debug)]
enum Placed {
    /// Answer with this status (a large WRITE).
    Answer(WcStatus),
    /// Already answered (a refused payload, answered when its header arrived): drop it.
    Refused,
    /// Complete this receive buffer (a large SEND or WRITE-with-immediate), then answer
    /// success.
    Receive {
        recv: PostedRecv,
        opcode: WcOpcode,
        imm: Option<u32>,
        len: u32,
    },
}

/// How a frame that has not fully arrived is handled.
enum Start {
    /// Its payload is being placed (or dropped) as it arrives.
    Placing,
    /// It is small enough to buffer whole.
    Buffer,
    /// A large SEND or WRITE-with-immediate with no receive buffer posted: leave it in
    /// the socket.
    AwaitReceive,
}

/// The inbound connection of one queue pair.
#[derive(Debug)]
pub(crate) struct ResponderLink {
    pub(super) qp: Arc<QpShared>,
    pub(super) conn: Conn,
    /// A large payload being placed straight into registered memory (or dropped).
    placing: Option<(Placement, Placed)>,
    /// When the link last moved bytes.
    last_traffic: Option<Instant>,
    /// A SEND or WRITE-with-immediate waits for a receive buffer.
    awaiting_receive: bool,
    /// The socket's interest in the NIC's epoll set ([`READ`] when the link is created).
    interest: u32,
}

impl ResponderLink {
    pub(crate) fn new(qp: Arc<QpShared>, conn: Conn) -> Self {
        ResponderLink {
            qp,
            conn,
            placing: None,
            last_traffic: None,
            awaiting_receive: false,
            interest: READ,
        }
    }

    /// Stops watching the socket for input while a request waits for a receive buffer
    /// (what follows it would keep the socket readable and the NIC spinning) and resumes
    /// once one is posted; watches it for writability while its output is blocked.
    pub(crate) fn sync_watch(&mut self, epoll: &Epoll) -> Result<(), LinkClosed> {
        let read =
            (!self.awaiting_receive || !self.qp.lock_rq().is_empty()) && !self.conn.output_full();
        let want = if read { READ } else { 0 } | if self.conn.output_blocked() { WRITE } else { 0 };
        if epoll
            .update(self.conn.raw_fd(), self.interest, want)
            .is_err()
        {
            return Err(self.peer_gone());
        }
        self.interest = want;
        Ok(())
    }

    /// Whether the link moved bytes within [`HOT_WINDOW`] before `now`.
    pub(crate) fn hot(&self, now: Instant) -> bool {
        self.last_traffic
            .is_some_and(|at| now.saturating_duration_since(at) < HOT_WINDOW)
    }

    /// One round at `now`: read requests (when `readable`), execute what can run, write
    /// responses.
    pub(crate) fn step(
        &mut self,
        registry: &Registry,
        readable: bool,
        now: Instant,
    ) -> Result<bool, LinkClosed> {
        if self.qp.closed.load(Ordering::Acquire) {
            return Err(LinkClosed);
        }
        let filled = if readable && self.placing.is_none() && !self.conn.output_full() {
            self.conn.fill()
        } else {
            Ok(false)
        };
        let mut progress = match filled {
            Ok(progress) => progress,
            Err(_) => return Err(self.peer_gone()),
        };
        progress |= self.serve(registry, readable)?;
        let progress = match self.conn.flush() {
            Ok(sent) => progress | sent,
            Err(_) => return Err(self.peer_gone()),
        };
        if progress {
            self.last_traffic = Some(now);
        }
        Ok(progress)
    }

    /// Whether output is waiting that could be written now, or a receive was posted for a
    /// message this link waits to place (the NIC must not park: while it waits for a
    /// receive the socket is out of the epoll set, so only this check sees a receive posted
    /// as the NIC goes to park); blocked output waits for epoll to report the socket
    /// writable.
    pub(crate) fn busy(&self) -> bool {
        self.conn.output_ready() || (self.awaiting_receive && !self.qp.lock_rq().is_empty())
    }

    fn serve(&mut self, registry: &Registry, readable: bool) -> Result<bool, LinkClosed> {
        let mut progress = false;
        self.awaiting_receive = false;
        // A key deregistered during this pass is served to the pass's end, as a NIC serves
        // requests already in flight.
        let mut memo = KeyMemo::new(self.qp.pd);
        while self.continue_placement(readable)? {
            if self.conn.output_full() {
                // Backpressure: no more requests until the peer reads its answers.
                return Ok(progress);
            }
            let (input, output) = self.conn.parts();
            if input.len() < frame::REQUEST_LEN {
                return Ok(progress);
            }
            let Some(header) = RequestHeader::decode(input) else {
                return Err(self.peer_gone());
            };
            let frame_len = frame::REQUEST_LEN + header.payload_len();
            if input.len() < frame_len {
                match self.start_placement(registry, &header) {
                    Start::Placing => progress = true,
                    Start::Buffer => {
                        self.conn.reserve_frame(frame_len);
                        return Ok(progress);
                    }
                    Start::AwaitReceive => {
                        self.awaiting_receive = true;
                        return Ok(progress);
                    }
                }
                continue;
            }
            if header.op == Op::Read {
                answer_read(registry, &mut memo, &header, output);
            } else if header.op == Op::ReadList {
                let entries = &input[frame::REQUEST_LEN..frame_len];
                if !answer_read_list(registry, &mut memo, &header, entries, output) {
                    return Err(self.peer_gone());
                }
            } else {
                let payload = &input[frame::REQUEST_LEN..frame_len];
                let Some(response) = responder::execute(registry, &self.qp, &header, payload)
                else {
                    // No receive buffer: the frame waits, and so does what follows it.
                    self.awaiting_receive = true;
                    return Ok(progress);
                };
                response.encode(output.bytes());
            }
            self.conn.consume(frame_len);
            progress = true;
        }
        Ok(progress)
    }

    /// Starts placing a large WRITE's or SEND's payload as it arrives (a refused one is
    /// dropped unread into any buffer); other frames (all smaller) are buffered whole.
    fn start_placement(&mut self, registry: &Registry, header: &RequestHeader) -> Start {
        let len = header.payload_len();
        let placement = match header.op {
            _ if len < ZERO_COPY_MIN => return Start::Buffer,
            Op::Write => match self.write_placement(registry, header) {
                Some(placement) => placement,
                None => return Start::AwaitReceive,
            },
            Op::Send => {
                // Popped apart from the match: a failing receive locks the queue again.
                let recv = self.qp.lock_rq().pop_front();
                match recv {
                    Some(recv) => self.send_placement(registry, header, recv),
                    None => return Start::AwaitReceive,
                }
            }
            _ => return Start::Buffer,
        };
        self.conn.consume(frame::REQUEST_LEN);
        self.placing = Some(match placement {
            (placement, Placed::Answer(status)) if status != WcStatus::Success => {
                // The requester learns of the refusal without first sending the rest.
                responder::status_reply(status, 0).encode(self.conn.output.bytes());
                (placement, Placed::Refused)
            }
            placed => placed,
        });
        Start::Placing
    }

    /// A SEND's payload goes into `recv`'s buffers; a receive that is too small or not
    /// writable fails (breaking the queue pair, as `responder::deliver` does) and the
    /// payload is dropped.
    fn send_placement(
        &self,
        registry: &Registry,
        header: &RequestHeader,
        recv: PostedRecv,
    ) -> (Placement, Placed) {
        let len = header.payload_len();
        let status =
            match scatter::resolve(registry, self.qp.pd, &recv.sg_list, Access::LOCAL_WRITE) {
                Ok(pieces) if scatter::total_len(&pieces) >= len => {
                    let placed = Placed::Receive {
                        recv,
                        opcode: WcOpcode::Recv,
                        imm: header.imm,
                        len: header.len,
                    };
                    return (Placement::new(scatter::truncate(pieces, len)), placed);
                }
                Ok(_) => WcStatus::LocalLengthError,
                Err(status) => status,
            };
        let answer = responder::fail_receive(&self.qp, &recv, WcOpcode::Recv, status, header.imm);
        (Placement::discard(len), Placed::Answer(answer.status))
    }

    /// Advances the payload being placed and answers it once complete; Ok(false) while
    /// it waits for more bytes.
    fn continue_placement(&mut self, readable: bool) -> Result<bool, LinkClosed> {
        let Some((placing, _)) = &mut self.placing else {
            return Ok(true);
        };
        match placing.advance(&mut self.conn, readable) {
            Err(_) => return Err(self.peer_gone()),
            Ok(_) if !placing.is_done() => return Ok(false),
            Ok(_) => {}
        }
        let status = match self.placing.take() {
            Some((
                _,
                Placed::Receive {
                    recv,
                    opcode,
                    imm,
                    len,
                },
            )) => {
                self.qp
                    .complete_recv(&recv, opcode, WcStatus::Success, len, imm);
                WcStatus::Success
            }
            Some((_, Placed::Answer(status))) => status,
            Some((_, Placed::Refused)) => return Ok(true),
            None => WcStatus::Success,
        };
        responder::status_reply(status, 0).encode(self.conn.output.bytes());
        Ok(true)
    }

    /// A large WRITE goes straight into its target, or is dropped when refused; one with
    /// an immediate consumes a receive buffer once placed (`None`: none is posted yet).
    fn write_placement(
        &self,
        registry: &Registry,
        header: &RequestHeader,
    ) -> Option<(Placement, Placed)> {
        let (remote, len) = (header.remote, header.payload_len());
        let Some(target) = registry.resolve(
            self.qp.pd,
            remote.rkey,
            remote.addr,
            len as u64,
            Access::REMOTE_WRITE,
        ) else {
            let refused = Placed::Answer(WcStatus::RemoteAccessError);
            return Some((Placement::discard(len), refused));
        };
        let placed = match header.imm {
            None => Placed::Answer(WcStatus::Success),
            Some(imm) => Placed::Receive {
                recv: self.qp.lock_rq().pop_front()?,
                opcode: WcOpcode::RecvRdmaWithImm,
                imm: Some(imm),
                len: header.len,
            },
        };
        Some((Placement::new(vec![Piece { target, len }]), placed))
    }

    /// Whether this link holds bytes of one of `spans`: a payload being placed into them,
    /// or an answer queued from them.
    pub(crate) fn holds_any(&self, spans: &[Span]) -> bool {
        let placing = self.placing.as_ref().map(|(placement, _)| placement);
        spans.iter().any(|span| {
            placing.is_some_and(|placement| placement.holds(span))
                || self
                    .conn
                    .output
                    .memory_segments()
                    .any(|(mem, offset, len)| span.overlaps(mem, offset, len))
        })
    }

    fn peer_gone(&self) -> LinkClosed {
        self.qp.enter_error();
        LinkClosed
    }
}

/// Answers a READ into `out`: its response header, then its bytes — copied from the
/// memory `memo` lends when smaller than [`ZERO_COPY_MIN`] (no reference count is touched
/// per READ: a lookup sends dozens of small READs to one memory), queued by reference
/// otherwise (the output holds the memory until the bytes are sent) — or an error
/// response (bad key, bounds, protection domain or right) and no bytes.
fn answer_read(
    registry: &Registry,
    memo: &mut KeyMemo,
    header: &RequestHeader,
    out: &mut OutputQueue,
) {
    let remote = header.remote;
    let len = header.len as usize;
    let found = registry.check_memo(
        memo,
        remote.rkey,
        remote.addr,
        u64::from(header.len),
        Access::REMOTE_READ,
    );
    let Some((mem, offset)) = found else {
        return responder::status_reply(WcStatus::RemoteAccessError, 0).encode(out.bytes());
    };
    responder::status_reply(WcStatus::Success, header.len).encode(out.bytes());
    // Bounds were checked against the registration, which lies inside `mem`.
    let _ = if len < ZERO_COPY_MIN {
        mem.append_to(offset, len, out.bytes())
    } else {
        out.memory(Arc::clone(mem), offset, len)
    };
}

/// Answers a READ list into `out`: one response counting the entries answered, then their
/// bytes in order — every entry's, or those before the first one refused (bad key, bounds,
/// protection domain or right; the response carries that status). The answer is never
/// larger than [`frame::MAX_READ_LIST_BYTES`], so it is copied, not queued by reference.
/// `false` (nothing written): the entries do not add up to the length the header asks
/// for, a malformed frame.
fn answer_read_list(
    registry: &Registry,
    memo: &mut KeyMemo,
    header: &RequestHeader,
    entries: &[u8],
    out: &mut OutputQueue,
) -> bool {
    let asked: u64 = ReadEntry::decode_all(entries)
        .map(|entry| u64::from(entry.len))
        .sum();
    if asked != u64::from(header.len) {
        return false;
    }
    let out = out.bytes();
    let at = out.len();
    out.extend_from_slice(&[0; frame::RESPONSE_LEN]);
    let mut response = responder::status_reply(WcStatus::Success, 0);
    for entry in ReadEntry::decode_all(entries) {
        let (remote, len) = (entry.remote, entry.len);
        let found = registry.check_memo(
            memo,
            remote.rkey,
            remote.addr,
            u64::from(len),
            Access::REMOTE_READ,
        );
        // Bounds were checked against the registration, which lies inside `mem`.
        if found.is_none_or(|(mem, offset)| mem.append_to(offset, len as usize, out).is_err()) {
            response.status = WcStatus::RemoteAccessError;
            break;
        }
        response.len += len;
        response.value += 1;
    }
    out[at..at + frame::RESPONSE_LEN].copy_from_slice(&response.to_bytes());
    true
}
