//! The writer thread of a background log: receives records in acceptance order, turns each
//! into one line, and flushes after each drain of the channel (a quiet server has everything
//! on disk within [`IDLE_POLL`]).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Duration;

use kvcm_optimizer::trace::events::RotatingLog;

/// What the channel carries.
#[derive(Debug)]
pub enum Message<R> {
    /// A record to write.
    Record(R),
    /// Write what is queued, flush and exit.
    Stop,
}

/// Pause between drains while records keep coming.
const BUSY_POLL: Duration = Duration::from_millis(1);
/// Longest pause between drains of an idle channel (the pause doubles while idle).
const IDLE_POLL: Duration = Duration::from_millis(20);

/// Runs until [`Message::Stop`] (or until every sender is gone); returns the last flush.
///
/// The thread polls instead of blocking on the channel: a blocked receiver would make every
/// request-path send pay for waking it. It drains the channel, flushes, then pauses
/// ([`BUSY_POLL`], doubling up to [`IDLE_POLL`] while nothing arrives).
pub fn run<R>(
    log: RotatingLog,
    receiver: Receiver<Message<R>>,
    dropped: Arc<AtomicU64>,
    line_of: fn(R) -> Vec<u8>,
) -> io::Result<()> {
    let mut state = WriterState {
        log,
        dropped,
        failing: false,
    };
    let mut pause = BUSY_POLL;
    loop {
        let mut wrote = false;
        loop {
            match receiver.try_recv() {
                Ok(Message::Record(record)) => {
                    state.write(&line_of(record));
                    wrote = true;
                }
                Ok(Message::Stop) => {
                    let late = receiver.try_iter().count() as u64;
                    state.dropped.fetch_add(late, Ordering::Relaxed);
                    return state.log.flush();
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return state.log.flush(),
            }
        }
        pause = if wrote {
            state.flush();
            BUSY_POLL
        } else {
            (pause * 2).min(IDLE_POLL)
        };
        std::thread::sleep(pause);
    }
}

struct WriterState {
    log: RotatingLog,
    dropped: Arc<AtomicU64>,
    /// Whether the last write failed (a failure is logged once until a write succeeds).
    failing: bool,
}

impl WriterState {
    fn write(&mut self, line: &[u8]) {
        let written = self.log.write_line(line);
        self.note(written);
    }

    fn flush(&mut self) {
        let flushed = self.log.flush();
        self.note(flushed);
    }

    fn note(&mut self, result: io::Result<()>) {
        match result {
            Ok(()) => self.failing = false,
            Err(error) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                if !self.failing {
                    tracing::warn!(%error, "writing a log file; records are being dropped");
                }
                self.failing = true;
            }
        }
    }
}
