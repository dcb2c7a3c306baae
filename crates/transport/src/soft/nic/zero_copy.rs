//! Large payloads skip the NIC's buffers: they are written to the socket from registered
//! memory ([`queue_payload`]) and read from it into registered memory ([`Placement`]).

use super::conn::Conn;
use crate::soft::registry::Span;
use crate::soft::scatter::{self, Piece};
use crate::sys::OutputQueue;
use std::io;

/// Payloads at least this large skip the input buffer: they are written from, and read
/// into, registered memory directly.
pub(crate) const ZERO_COPY_MIN: usize = 64 * 1024;

/// A payload being placed into `pieces`, in order, or (when refused) dropped.
#[derive(Debug)]
pub(crate) struct Placement {
    pieces: Vec<Piece>,
    index: usize,
    done: usize,
    /// Bytes still to drop (a refused payload has no pieces).
    discard: usize,
}

impl Placement {
    pub(crate) fn new(pieces: Vec<Piece>) -> Self {
        Placement {
            pieces,
            index: 0,
            done: 0,
            discard: 0,
        }
    }

    /// A refused payload of `len` bytes, read and dropped without buffering it.
    pub(crate) fn discard(len: usize) -> Self {
        Placement {
            pieces: Vec::new(),
            index: 0,
            done: 0,
            discard: len,
        }
    }

    /// Places what has arrived (reading the socket when `readable`); returns the bytes
    /// moved. [`Placement::is_done`] says when the whole payload is in place.
    pub(crate) fn advance(&mut self, conn: &mut Conn, readable: bool) -> io::Result<usize> {
        if self.discard > 0 {
            let dropped = conn.discard(self.discard, readable)?;
            self.discard -= dropped;
            return Ok(dropped);
        }
        let mut moved = 0;
        while let Some(piece) = self.pieces.get(self.index) {
            let offset = piece.target.offset + self.done;
            let placed = conn.place(&piece.target.mem, offset, piece.len - self.done, readable)?;
            moved += placed;
            self.done += placed;
            if self.done < piece.len {
                break;
            }
            self.index += 1;
            self.done = 0;
        }
        Ok(moved)
    }

    /// Whether bytes still to be placed land in `span`.
    pub(crate) fn holds(&self, span: &Span) -> bool {
        self.pieces[self.index..]
            .iter()
            .any(|piece| span.overlaps(&piece.target.mem, piece.target.offset, piece.len))
    }

    /// Whether the whole payload is in place (or dropped).
    pub(crate) fn is_done(&self) -> bool {
        self.discard == 0 && self.index == self.pieces.len()
    }
}

/// Queues the bytes of `pieces` for sending: copied when small, by reference when large.
pub(crate) fn queue_payload(pieces: &[Piece], out: &mut OutputQueue) {
    if scatter::total_len(pieces) < ZERO_COPY_MIN {
        scatter::gather_into(pieces, out.bytes());
        return;
    }
    for piece in pieces {
        // Bounds were checked when the piece was resolved; a refusal cannot happen.
        let _ = out.memory(
            std::sync::Arc::clone(&piece.target.mem),
            piece.target.offset,
            piece.len,
        );
    }
}
