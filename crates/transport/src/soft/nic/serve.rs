//! The responder half of a TCP link: executes incoming requests and answers in order.

use super::conn::Conn;
use super::LinkClosed;
use crate::soft::frame::{self, RequestHeader, ResponseHeader};
use crate::soft::queue_pair::QpShared;
use crate::soft::registry::Registry;
use crate::soft::responder;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The inbound connection of one queue pair.
#[derive(Debug)]
pub(crate) struct ResponderLink {
    pub(super) qp: Arc<QpShared>,
    pub(super) conn: Conn,
}

impl ResponderLink {
    /// One round: read requests (when `readable`), execute what can run, write responses.
    pub(crate) fn step(&mut self, registry: &Registry, readable: bool) -> Result<bool, LinkClosed> {
        if self.qp.closed.load(Ordering::Acquire) {
            return Err(LinkClosed);
        }
        let filled = if readable {
            self.conn.fill()
        } else {
            Ok(false)
        };
        let mut progress = match filled {
            Ok(progress) => progress,
            Err(_) => return Err(self.peer_gone()),
        };
        progress |= self.serve(registry)?;
        match self.conn.flush() {
            Ok(sent) => Ok(progress | sent),
            Err(_) => Err(self.peer_gone()),
        }
    }

    /// Whether buffered output is waiting (the NIC must not park).
    pub(crate) fn busy(&self) -> bool {
        self.conn.has_output()
    }

    fn serve(&mut self, registry: &Registry) -> Result<bool, LinkClosed> {
        let mut progress = false;
        loop {
            let (input, output) = self.conn.parts();
            if input.len() < frame::REQUEST_LEN {
                return Ok(progress);
            }
            let Some(header) = RequestHeader::decode(input) else {
                return Err(self.peer_gone());
            };
            let frame_len = frame::REQUEST_LEN + header.payload_len();
            if input.len() < frame_len {
                self.conn.reserve_frame(frame_len);
                return Ok(progress);
            }
            let payload = &input[frame::REQUEST_LEN..frame_len];
            let Some((response, data)) = responder::execute(registry, &self.qp, &header, payload)
            else {
                return Ok(progress);
            };
            append_response(output, &response, data.as_ref());
            self.conn.consume(frame_len);
            progress = true;
        }
    }

    fn peer_gone(&self) -> LinkClosed {
        self.qp.enter_error();
        LinkClosed
    }
}

fn append_response(
    out: &mut Vec<u8>,
    response: &ResponseHeader,
    data: Option<&crate::soft::registry::Target>,
) {
    response.encode(out);
    if let Some(target) = data {
        let _ = target
            .mem
            .append_to(target.offset, response.len as usize, out);
    }
}
