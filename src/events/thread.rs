//! The writer thread: receives records in acceptance order, turns them into schema-v1 lines,
//! and flushes after each drain of the channel (a quiet server has everything on disk within
//! [`IDLE_POLL`]).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Duration;

use kvcm_optimizer::trace::events::{Event, EventLogWriter, EventType};

use super::record::{event, key_bits, Record};

/// What the channel carries.
#[derive(Debug)]
pub enum Message {
    /// A record to write.
    Record(Record),
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
pub fn run(
    writer: EventLogWriter,
    receiver: Receiver<Message>,
    dropped: Arc<AtomicU64>,
) -> io::Result<()> {
    let mut state = WriterState {
        writer,
        dropped,
        failing: false,
    };
    let mut pause = BUSY_POLL;
    loop {
        let mut wrote = false;
        loop {
            match receiver.try_recv() {
                Ok(Message::Record(record)) => {
                    state.write(record);
                    wrote = true;
                }
                Ok(Message::Stop) => {
                    let late = receiver.try_iter().count() as u64;
                    state.dropped.fetch_add(late, Ordering::Relaxed);
                    return state.writer.flush();
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return state.writer.flush(),
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
    writer: EventLogWriter,
    dropped: Arc<AtomicU64>,
    /// Whether the last write failed (a failure is logged once until a write succeeds).
    failing: bool,
}

impl WriterState {
    fn write(&mut self, record: Record) {
        let event = line_of(record);
        let written = self.writer.write(&event);
        self.note(written);
    }

    fn flush(&mut self) {
        let flushed = self.writer.flush();
        self.note(flushed);
    }

    fn note(&mut self, result: io::Result<()>) {
        match result {
            Ok(()) => self.failing = false,
            Err(error) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                if !self.failing {
                    tracing::warn!(%error, "writing the event log; events are being dropped");
                }
                self.failing = true;
            }
        }
    }
}

/// The schema-v1 line of a record.
fn line_of(record: Record) -> Event {
    match record {
        Record::Lookup {
            ts_us,
            instance,
            keys,
            block_tokens,
            input_tokens,
        } => {
            let keys = keys.into_iter().map(key_bits).collect();
            let mut line = event(EventType::GetCacheLocation, ts_us, &instance, keys);
            line.block_tokens = Some(block_tokens);
            line.input_tokens = input_tokens;
            line
        }
        Record::WriteStarted {
            ts_us,
            instance,
            keys,
            session,
        } => {
            let keys: Vec<u64> = keys.into_iter().map(key_bits).collect();
            let mut line = event(EventType::StartWriteCache, ts_us, &instance, keys);
            line.write_session = Some(session);
            line
        }
        Record::WriteFinished {
            ts_us,
            instance,
            session,
            keys,
        } => {
            let keys = keys.into_iter().map(key_bits).collect();
            let mut line = event(EventType::FinishWriteCache, ts_us, &instance, keys);
            line.write_session = Some(session);
            line
        }
        Record::Reclaimed {
            ts_us,
            instance,
            keys,
        } => event(
            EventType::Reclaim,
            ts_us,
            &instance,
            keys.into_iter().map(key_bits).collect(),
        ),
    }
}
