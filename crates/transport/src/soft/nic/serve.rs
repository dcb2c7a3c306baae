//! The responder half of a TCP link: executes incoming requests and answers in order.

use super::conn::Conn;
use super::zero_copy::{self, Placement, ZERO_COPY_MIN};
use super::LinkClosed;
use crate::soft::frame::{self, Op, RequestHeader, ResponseHeader};
use crate::soft::queue_pair::QpShared;
use crate::soft::registry::{Registry, Target};
use crate::soft::responder;
use crate::soft::scatter::Piece;
use crate::sys::OutputQueue;
use crate::{Access, WcStatus};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A link that moved bytes this recently is hot: a busy NIC reads it without asking epoll.
const HOT_WINDOW: Duration = Duration::from_millis(1);

/// The inbound connection of one queue pair.
#[derive(Debug)]
pub(crate) struct ResponderLink {
    pub(super) qp: Arc<QpShared>,
    pub(super) conn: Conn,
    /// A large WRITE payload being placed straight into its target (or dropped), and the
    /// status to answer once it is.
    placing: Option<(Placement, WcStatus)>,
    /// When the link last moved bytes.
    last_traffic: Option<Instant>,
}

impl ResponderLink {
    pub(crate) fn new(qp: Arc<QpShared>, conn: Conn) -> Self {
        ResponderLink {
            qp,
            conn,
            placing: None,
            last_traffic: None,
        }
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
        let filled = if readable && self.placing.is_none() {
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

    /// Whether buffered output is waiting (the NIC must not park).
    pub(crate) fn busy(&self) -> bool {
        self.conn.has_output()
    }

    fn serve(&mut self, registry: &Registry, readable: bool) -> Result<bool, LinkClosed> {
        let mut progress = false;
        while self.continue_placement(readable)? {
            let (input, output) = self.conn.parts();
            if input.len() < frame::REQUEST_LEN {
                return Ok(progress);
            }
            let Some(header) = RequestHeader::decode(input) else {
                return Err(self.peer_gone());
            };
            let frame_len = frame::REQUEST_LEN + header.payload_len();
            if input.len() < frame_len {
                if !self.start_placement(registry, &header) {
                    self.conn.reserve_frame(frame_len);
                    return Ok(progress);
                }
                progress = true;
                continue;
            }
            let payload = &input[frame::REQUEST_LEN..frame_len];
            let Some((response, data)) = responder::execute(registry, &self.qp, &header, payload)
            else {
                return Ok(progress);
            };
            append_response(output, &response, data);
            self.conn.consume(frame_len);
            progress = true;
        }
        Ok(progress)
    }

    /// Places a large plain WRITE's payload straight into its target, or drops it unread
    /// into any buffer when the target is refused; false when the request is not a large
    /// plain WRITE (it is then buffered whole).
    fn start_placement(&mut self, registry: &Registry, header: &RequestHeader) -> bool {
        let len = header.payload_len();
        if header.op != Op::Write || header.imm.is_some() || len < ZERO_COPY_MIN {
            return false;
        }
        let remote = header.remote;
        let target = registry.resolve(remote.rkey, remote.addr, len as u64, Access::REMOTE_WRITE);
        let placement = match target {
            Some(target) => (
                Placement::new(vec![Piece { target, len }]),
                WcStatus::Success,
            ),
            None => (Placement::discard(len), WcStatus::RemoteAccessError),
        };
        self.conn.consume(frame::REQUEST_LEN);
        self.placing = Some(placement);
        true
    }

    /// Advances the WRITE payload being placed and answers it once complete; Ok(false)
    /// while it waits for more bytes.
    fn continue_placement(&mut self, readable: bool) -> Result<bool, LinkClosed> {
        let Some((placing, status)) = &mut self.placing else {
            return Ok(true);
        };
        let status = *status;
        match placing.advance(&mut self.conn, readable) {
            Err(_) => Err(self.peer_gone()),
            Ok(_) if !placing.is_done() => Ok(false),
            Ok(_) => {
                self.placing = None;
                let done = ResponseHeader {
                    status,
                    len: 0,
                    value: 0,
                };
                done.encode(self.conn.output.bytes());
                Ok(true)
            }
        }
    }

    fn peer_gone(&self) -> LinkClosed {
        self.qp.enter_error();
        LinkClosed
    }
}

fn append_response(out: &mut OutputQueue, response: &ResponseHeader, data: Option<Target>) {
    response.encode(out.bytes());
    if let Some(target) = data {
        zero_copy::queue_payload(
            &[Piece {
                target,
                len: response.len as usize,
            }],
            out,
        );
    }
}
