//! [`EventSink`]: the request path's side of the event log. Emitting builds a [`Record`] and
//! offers it with a non-blocking `try_send`; a full (or closed) channel drops it and counts it
//! in `event_log.dropped`. A disabled sink does nothing and allocates nothing.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::Arc;

use kvcm_index::BlockKey;

use super::record::{now_us, Record};
use super::thread::Message;
use crate::proto::admin;
use kvcm_manager::{Instance, WriteStart};

use crate::service::metrics::prometheus_name;

/// Name of the counter of records that were not written.
pub const DROPPED_METRIC: &str = "event_log.dropped";

/// Cloneable handle that emits records; disabled when the log is off.
#[derive(Debug, Clone, Default)]
pub struct EventSink {
    enabled: Option<Arc<Enabled>>,
}

#[derive(Debug)]
struct Enabled {
    sender: SyncSender<Message>,
    dropped: Arc<AtomicU64>,
}

impl EventSink {
    /// A sink that emits nothing.
    pub fn disabled() -> EventSink {
        EventSink::default()
    }

    pub(super) fn new(sender: SyncSender<Message>) -> EventSink {
        let dropped = Arc::new(AtomicU64::new(0));
        EventSink {
            enabled: Some(Arc::new(Enabled { sender, dropped })),
        }
    }

    pub(super) fn dropped_counter(&self) -> Arc<AtomicU64> {
        self.enabled
            .as_ref()
            .map_or_else(Arc::default, |e| e.dropped.clone())
    }

    /// Whether records are written.
    pub fn is_enabled(&self) -> bool {
        self.enabled.is_some()
    }

    /// Records not written so far (channel full, log closed, write failed).
    pub fn dropped(&self) -> u64 {
        self.enabled
            .as_ref()
            .map_or(0, |e| e.dropped.load(Ordering::Relaxed))
    }

    /// Offers one record; never blocks.
    pub fn emit(&self, record: Record) {
        if let Some(enabled) = &self.enabled {
            if enabled.sender.try_send(Message::Record(record)).is_err() {
                enabled.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// A copy of `keys` when the log is on (StartWriteCache consumes its keys).
    pub fn keys_if_enabled(&self, keys: &[BlockKey]) -> Option<Vec<BlockKey>> {
        self.is_enabled().then(|| keys.to_vec())
    }

    /// Emits a successful GetCacheLocation of `keys` (resolved from `token_ids` if those
    /// were sent instead).
    pub fn lookup(&self, instance: &Instance, keys: &[BlockKey], token_ids: &[i64]) {
        if !self.is_enabled() {
            return;
        }
        // Registration guarantees a positive i32 block size.
        let block_tokens = u32::try_from(instance.info().block_size).unwrap_or(0);
        self.emit(Record::Lookup {
            ts_us: now_us(),
            instance: instance.id().clone(),
            keys: keys.to_vec(),
            block_tokens,
            input_tokens: (!token_ids.is_empty()).then_some(token_ids.len() as u64),
        });
    }

    /// Emits a successful StartWriteCache: the requested `keys` the answer's mask marks
    /// absent are the session's blocks. `keys` is `None` when the log is off.
    pub fn write_started(
        &self,
        instance: &Instance,
        keys: Option<Vec<BlockKey>>,
        started: &WriteStart,
    ) {
        let Some(keys) = keys else {
            return;
        };
        let new_keys = keys
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !started.mask.contains(*i))
            .map(|(_, key)| key)
            .collect();
        self.emit(Record::WriteStarted {
            ts_us: now_us(),
            instance: instance.id().clone(),
            keys: new_keys,
            session: started.session_id.clone(),
        });
    }

    /// Emits a successful FinishWriteCache of `session` with the keys it committed.
    pub fn write_finished(&self, instance: &Instance, session: &str, committed: Vec<BlockKey>) {
        if !self.is_enabled() {
            return;
        }
        self.emit(Record::WriteFinished {
            ts_us: now_us(),
            instance: instance.id().clone(),
            session: session.to_string(),
            keys: committed,
        });
    }

    /// Emits an eviction by the reclaimer.
    pub fn reclaimed(&self, instance: &Instance, keys: &[BlockKey]) {
        if !self.is_enabled() {
            return;
        }
        self.emit(Record::Reclaimed {
            ts_us: now_us(),
            instance: instance.id().clone(),
            keys: keys.to_vec(),
        });
    }

    /// The `event_log.dropped` counter for GetMetrics.
    pub fn to_wire(&self) -> Vec<admin::MetricsData> {
        use admin::metric_value::Value;
        vec![admin::MetricsData {
            metric_name: DROPPED_METRIC.into(),
            metric_value: Some(admin::MetricValue {
                value: Some(Value::IntValue(self.dropped() as i64)),
            }),
            metric_tags: Vec::new(),
        }]
    }

    /// The `event_log.dropped` counter in Prometheus text (named with `prefix`, see
    /// [`prometheus_name`]).
    pub fn to_prometheus(&self, prefix: &str) -> String {
        let name = prometheus_name(prefix, DROPPED_METRIC);
        let mut text = String::new();
        let _ = writeln!(text, "# TYPE {name} counter\n{name} {}", self.dropped());
        text
    }
}
