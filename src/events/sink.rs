//! [`EventSink`]: the request path's side of the event log. Emitting builds a [`Record`] and
//! offers it with a non-blocking `try_send`; a full (or closed) channel drops it and counts it
//! in `event_log.dropped`. A disabled sink does nothing and allocates nothing.

use kvcm_index::BlockKey;

use super::record::Record;
use crate::logs::{now_us, LogFeed};
use crate::proto::admin;
use kvcm_manager::{Instance, WriteStart};

/// Name of the counter of records that were not written.
pub const DROPPED_METRIC: &str = "event_log.dropped";

/// Cloneable handle that emits records; disabled when the log is off.
#[derive(Debug, Clone, Default)]
pub struct EventSink {
    feed: LogFeed<Record>,
}

impl EventSink {
    /// A sink that emits nothing.
    pub fn disabled() -> EventSink {
        EventSink::default()
    }

    pub(super) fn new(feed: LogFeed<Record>) -> EventSink {
        EventSink { feed }
    }

    /// Whether records are written.
    pub fn is_enabled(&self) -> bool {
        self.feed.is_enabled()
    }

    /// Records not written so far (channel full, log closed, write failed).
    pub fn dropped(&self) -> u64 {
        self.feed.dropped()
    }

    /// Offers one record; never blocks.
    pub fn emit(&self, record: Record) {
        self.feed.offer(record);
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
        vec![self.feed.dropped_to_wire(DROPPED_METRIC)]
    }

    /// The `event_log.dropped` counter in Prometheus text (names prefixed with `prefix`).
    pub fn to_prometheus(&self, prefix: &str) -> String {
        self.feed.dropped_to_prometheus(prefix, DROPPED_METRIC)
    }
}
