//! The server's event log: one line per successful GetCacheLocation, StartWriteCache and
//! FinishWriteCache and per reclaimer eviction, in the optimizer's schema v1
//! (`kvcm_optimizer::trace::events`), so that a production day can be replayed by
//! `kvcm optimize --format events`.
//!
//! The request path only builds a [`Record`] and offers it to the log's bounded channel
//! ([`EventSink`], over [`crate::logs`]); it never blocks: a full channel drops the record and
//! counts it in `event_log.dropped`. The log's thread writes schema-v1 lines to
//! `events.jsonl`, rotated by size; a clean stop loses nothing.
//!
//! The reclaimer's evictions are logged too (`reclaim` lines, through the manager's reclaim
//! listener that [`crate::service::Handlers::with_logs`] installs).
//!
//! Invariants: records reach the file in the order they were accepted; a FinishWriteCache
//! record carries the keys the manager committed (a subset of its session's StartWriteCache
//! keys).

mod line;
mod record;
mod sink;

use std::path::Path;

use kvcm_optimizer::trace::events::EVENTS_STEM;

pub use record::Record;
pub use sink::{EventSink, DROPPED_METRIC};

use crate::config::ServerConfig;
use crate::logs::{BackgroundLog, LogError, LogFiles};

/// The running event log: its writer thread and the sink that feeds it.
#[derive(Debug)]
pub struct EventLog(BackgroundLog<Record>);

impl EventLog {
    /// A log that writes nothing (its sink is disabled).
    pub fn disabled() -> EventLog {
        EventLog(BackgroundLog::disabled())
    }

    /// The log `kvcm serve` writes under this configuration (disabled when
    /// `kvcm.event_log.enabled` is false).
    pub fn from_config(config: &ServerConfig) -> Result<EventLog, LogError> {
        let settings = &config.event_log;
        if !settings.enabled {
            return Ok(EventLog::disabled());
        }
        let dir = config.event_log_dir();
        EventLog::start(&dir, settings.max_file_bytes, settings.keep_files)
    }

    /// Opens (appending to) the log in `dir` and starts its writer thread.
    pub fn start(dir: &Path, max_file_bytes: u64, keep_files: usize) -> Result<EventLog, LogError> {
        let files = LogFiles {
            name: "event log",
            dir,
            stem: EVENTS_STEM,
            max_file_bytes,
            keep_files,
        };
        BackgroundLog::start(files, "kvcm-event-log", line::line_of).map(EventLog)
    }

    /// The handle the request path emits through.
    pub fn sink(&self) -> EventSink {
        EventSink::new(self.0.feed())
    }

    /// Writes every record accepted so far, flushes and stops the writer thread. Records
    /// offered afterwards are dropped (and counted).
    pub fn close(self) -> Result<(), LogError> {
        self.0.close()
    }
}

#[cfg(test)]
mod tests;
