//! Background JSON-lines logs: the event log ([`crate::events`]), the access log and the
//! audit log ([`crate::access_log`]).
//!
//! The request path only offers a record to a bounded channel ([`LogFeed::offer`]); it never
//! blocks: a full channel drops the record and counts it. One background thread per log
//! ([`BackgroundLog`]) polls the channel (so that a send never has to wake it), turns records
//! into lines, rotates the files by size ([`RotatingLog`]) and flushes after each drain.
//! [`BackgroundLog::close`] writes every record accepted before it was called, then flushes:
//! a clean stop loses nothing.
//!
//! Invariant: records reach the file in the order they were accepted.

mod thread;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use kvcm_optimizer::trace::events::RotatingLog;

use crate::proto::admin;
use crate::service::metrics::prometheus_name;

pub use thread::Message;

/// Records a channel holds before the request path starts dropping them.
pub const CHANNEL_CAPACITY: usize = 65_536;

/// Why a log cannot start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The log directory or its current file cannot be opened.
    #[error("{log} {path}: {source}")]
    Open {
        /// Which log ("event log", "access log", "audit log").
        log: &'static str,
        /// The log directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The writer thread cannot be started.
    #[error("starting a log writer thread: {0}")]
    Spawn(std::io::Error),
    /// The last flush on close failed (records accepted before close may be lost).
    #[error("flushing a log: {0}")]
    Flush(std::io::Error),
    /// The writer thread panicked.
    #[error("a log writer thread panicked")]
    Panicked,
}

/// Where a log's files go and how they rotate.
#[derive(Debug, Clone, Copy)]
pub struct LogFiles<'a> {
    /// What the log is called in errors ("event log").
    pub name: &'static str,
    /// The log directory.
    pub dir: &'a Path,
    /// File stem: the current file is `<stem>.jsonl`.
    pub stem: &'static str,
    /// The current file rotates before passing this size.
    pub max_file_bytes: u64,
    /// Rotated files kept besides the current one.
    pub keep_files: usize,
}

/// Cloneable handle that offers records to a log; disabled when the log is off.
#[derive(Debug)]
pub struct LogFeed<R> {
    enabled: Option<Arc<Feed<R>>>,
}

#[derive(Debug)]
struct Feed<R> {
    sender: SyncSender<Message<R>>,
    dropped: Arc<AtomicU64>,
}

impl<R> Clone for LogFeed<R> {
    fn clone(&self) -> Self {
        LogFeed {
            enabled: self.enabled.clone(),
        }
    }
}

impl<R> Default for LogFeed<R> {
    fn default() -> Self {
        LogFeed { enabled: None }
    }
}

impl<R> LogFeed<R> {
    /// A feed offering to `sender` (a log's channel; a test's own in unit tests).
    pub fn over(sender: SyncSender<Message<R>>) -> LogFeed<R> {
        let dropped = Arc::new(AtomicU64::new(0));
        LogFeed {
            enabled: Some(Arc::new(Feed { sender, dropped })),
        }
    }

    fn dropped_counter(&self) -> Arc<AtomicU64> {
        self.enabled
            .as_ref()
            .map_or_else(Arc::default, |feed| feed.dropped.clone())
    }

    /// Whether records are written.
    pub fn is_enabled(&self) -> bool {
        self.enabled.is_some()
    }

    /// Records not written so far (channel full, log closed, write failed).
    pub fn dropped(&self) -> u64 {
        self.enabled
            .as_ref()
            .map_or(0, |feed| feed.dropped.load(Ordering::Relaxed))
    }

    /// The counter of records not written, named `metric`, for GetMetrics.
    pub fn dropped_to_wire(&self, metric: &str) -> admin::MetricsData {
        use admin::metric_value::Value;
        admin::MetricsData {
            metric_name: metric.into(),
            metric_value: Some(admin::MetricValue {
                value: Some(Value::IntValue(self.dropped() as i64)),
            }),
            metric_tags: Vec::new(),
        }
    }

    /// The counter of records not written, named `metric`, in Prometheus text (named with
    /// `prefix`, see [`prometheus_name`]).
    pub fn dropped_to_prometheus(&self, prefix: &str, metric: &str) -> String {
        let name = prometheus_name(prefix, metric);
        let mut text = String::new();
        let _ = writeln!(text, "# TYPE {name} counter\n{name} {}", self.dropped());
        text
    }

    /// Offers one record; never blocks.
    pub fn offer(&self, record: R) {
        if let Some(feed) = &self.enabled {
            if feed.sender.try_send(Message::Record(record)).is_err() {
                feed.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// A running log: its writer thread and the feed that offers to it.
#[derive(Debug)]
pub struct BackgroundLog<R> {
    feed: LogFeed<R>,
    control: Option<Control<R>>,
}

/// What stops a running log: its channel and its writer thread.
type Control<R> = (SyncSender<Message<R>>, JoinHandle<std::io::Result<()>>);

impl<R: Send + 'static> BackgroundLog<R> {
    /// A log that writes nothing (its feed is disabled).
    pub fn disabled() -> Self {
        BackgroundLog {
            feed: LogFeed::default(),
            control: None,
        }
    }

    /// Opens (appending to) the log's current file and starts its writer thread, named
    /// `thread_name`, which writes each record as the line `line_of` makes of it.
    pub fn start(
        files: LogFiles<'_>,
        thread_name: &str,
        line_of: fn(R) -> Vec<u8>,
    ) -> Result<Self, LogError> {
        let log = RotatingLog::open(
            files.dir,
            files.stem,
            files.max_file_bytes,
            files.keep_files,
        )
        .map_err(|source| LogError::Open {
            log: files.name,
            path: files.dir.to_path_buf(),
            source,
        })?;
        let (sender, receiver) = mpsc::sync_channel(CHANNEL_CAPACITY);
        let feed = LogFeed::over(sender.clone());
        let dropped = feed.dropped_counter();
        let handle = std::thread::Builder::new()
            .name(thread_name.into())
            .spawn(move || thread::run(log, receiver, dropped, line_of))
            .map_err(LogError::Spawn)?;
        Ok(BackgroundLog {
            feed,
            control: Some((sender, handle)),
        })
    }
}

impl<R> BackgroundLog<R> {
    /// The handle the request path offers records through.
    pub fn feed(&self) -> LogFeed<R> {
        self.feed.clone()
    }

    /// Writes every record accepted so far, flushes and stops the writer thread. Records
    /// offered afterwards are dropped (and counted).
    pub fn close(mut self) -> Result<(), LogError> {
        self.stop()
    }

    fn stop(&mut self) -> Result<(), LogError> {
        let Some((sender, handle)) = self.control.take() else {
            return Ok(());
        };
        // Blocks only while the writer drains a full channel; an error means it already exited.
        let _ = sender.send(Message::Stop);
        drop(sender);
        match handle.join() {
            Ok(flushed) => flushed.map_err(LogError::Flush),
            Err(_) => Err(LogError::Panicked),
        }
    }
}

impl<R> Drop for BackgroundLog<R> {
    fn drop(&mut self) {
        if let Err(error) = self.stop() {
            tracing::warn!(%error, "closing a log");
        }
    }
}

/// Microseconds since the Unix epoch (0 if the clock is before it).
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}
