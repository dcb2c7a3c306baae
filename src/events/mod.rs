//! The server's event log: one line per successful GetCacheLocation, StartWriteCache and
//! FinishWriteCache and per reclaimer eviction, in the optimizer's schema v1
//! (`kvcm_optimizer::trace::events`), so that a production day can be replayed by
//! `kvcm optimize --format events`.
//!
//! The request path only builds a [`Record`] and offers it to a bounded channel
//! ([`EventSink`]); it never blocks: a full channel drops the record and counts it in
//! `event_log.dropped`. One background thread ([`EventLog`]) polls the channel (so that a send
//! never has to wake it), turns records into lines, rotates the files by size and flushes
//! after each drain. [`EventLog::close`] writes every record accepted before it was called,
//! then flushes: a clean stop loses nothing.
//!
//! The reclaimer's evictions are logged too (`reclaim` lines, through the manager's reclaim
//! listener that [`crate::service::Handlers::with_events`] installs).
//!
//! Invariants: records reach the file in the order they were accepted; a FinishWriteCache
//! record carries the keys the manager committed (a subset of its session's StartWriteCache
//! keys).

mod record;
mod sink;
mod thread;

use std::path::Path;
use std::sync::mpsc;
use std::thread::JoinHandle;

use kvcm_optimizer::trace::events::EventLogWriter;

pub use record::Record;
pub use sink::{EventSink, DROPPED_METRIC};

use crate::config::ServerConfig;
use thread::Message;

/// Records the channel holds before the request path starts dropping them.
pub const CHANNEL_CAPACITY: usize = 65_536;

/// Why the event log cannot start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum EventLogError {
    /// The log directory or its current file cannot be opened.
    #[error("event log {path}: {source}")]
    Open {
        /// The log directory.
        path: std::path::PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The writer thread cannot be started.
    #[error("starting the event log writer thread: {0}")]
    Spawn(std::io::Error),
    /// The last flush on close failed (events accepted before close may be lost).
    #[error("flushing the event log: {0}")]
    Flush(std::io::Error),
    /// The writer thread panicked.
    #[error("the event log writer thread panicked")]
    Panicked,
}

/// The running event log: the writer thread and the sink that feeds it.
#[derive(Debug)]
pub struct EventLog {
    sink: EventSink,
    control: Option<(mpsc::SyncSender<Message>, JoinHandle<std::io::Result<()>>)>,
}

impl EventLog {
    /// A log that writes nothing (its sink is disabled).
    pub fn disabled() -> EventLog {
        EventLog {
            sink: EventSink::disabled(),
            control: None,
        }
    }

    /// The log `kvcm serve` writes under this configuration (disabled when
    /// `kvcm.event_log.enabled` is false).
    pub fn from_config(config: &ServerConfig) -> Result<EventLog, EventLogError> {
        let settings = &config.event_log;
        if !settings.enabled {
            return Ok(EventLog::disabled());
        }
        let dir = config.event_log_dir();
        EventLog::start(&dir, settings.max_file_bytes, settings.keep_files)
    }

    /// Opens (appending to) the log in `dir` and starts its writer thread.
    pub fn start(
        dir: &Path,
        max_file_bytes: u64,
        keep_files: usize,
    ) -> Result<EventLog, EventLogError> {
        let writer = EventLogWriter::open(dir, max_file_bytes, keep_files).map_err(|source| {
            EventLogError::Open {
                path: dir.to_path_buf(),
                source,
            }
        })?;
        let (sender, receiver) = mpsc::sync_channel(CHANNEL_CAPACITY);
        let sink = EventSink::new(sender.clone());
        let dropped = sink.dropped_counter();
        let handle = std::thread::Builder::new()
            .name("kvcm-event-log".into())
            .spawn(move || thread::run(writer, receiver, dropped))
            .map_err(EventLogError::Spawn)?;
        Ok(EventLog {
            sink,
            control: Some((sender, handle)),
        })
    }

    /// The handle the request path emits through.
    pub fn sink(&self) -> EventSink {
        self.sink.clone()
    }

    /// Writes every record accepted so far, flushes and stops the writer thread. Records
    /// offered afterwards are dropped (and counted).
    pub fn close(mut self) -> Result<(), EventLogError> {
        self.stop()
    }

    fn stop(&mut self) -> Result<(), EventLogError> {
        let Some((sender, handle)) = self.control.take() else {
            return Ok(());
        };
        // Blocks only while the writer drains a full channel; an error means it already exited.
        let _ = sender.send(Message::Stop);
        drop(sender);
        match handle.join() {
            Ok(flushed) => flushed.map_err(EventLogError::Flush),
            Err(_) => Err(EventLogError::Panicked),
        }
    }
}

impl Drop for EventLog {
    fn drop(&mut self) {
        if let Err(error) = self.stop() {
            tracing::warn!(%error, "closing the event log");
        }
    }
}

#[cfg(test)]
mod tests;
