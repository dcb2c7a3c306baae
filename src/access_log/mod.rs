//! The access log: one JSON line per RPC served over gRPC or HTTP (time, client address,
//! transport, API, trace id, request id, status, cost in µs; the request and response bodies
//! behind `kvcm.access_log.bodies`, secrets redacted), written to `access.jsonl` under
//! `<data_dir>/access` and rotated by size like the event log ([`crate::logs`]).
//!
//! The transports ([`crate::service`]'s gRPC and HTTP edges) begin an [`AccessLine`] when a
//! call arrives and finish it once its answer is ready; the request path pays one
//! non-blocking channel send per call (a full channel drops the line and counts it in
//! `access_log.dropped`), and with bodies on the encoding of both bodies as JSON. Parsing
//! and redacting the bodies, and writing, happen on the log's own thread.
//!
//! Invariants: a line is written for every RPC call a transport answered, refusals included
//! (over HTTP: a body too large, too slow or not JSON); lines reach the file in the order the
//! calls finished; no logged body shows a password, token or key ([`redact`]).
//! Not logged: `GET /metrics` and `GET /api/healthy` (probes, not RPCs), the lookup path's
//! RDMA messages.

mod record;
mod redact;

use std::net::SocketAddr;
use std::time::Instant;

use serde::Serialize;

pub use record::{AccessRecord, Transport};

use crate::config::ServerConfig;
use crate::logs::{now_us, BackgroundLog, LogError, LogFeed, LogFiles};
use crate::proto::admin;
use crate::service::rpcs::Rpc;

/// File stem of the access log.
pub const ACCESS_STEM: &str = "access";

/// Name of the counter of lines that were not written.
pub const DROPPED_METRIC: &str = "access_log.dropped";

/// What a body too large to log is written as (its size follows).
const TRUNCATED_MEMBER: &str = "kvcm_truncated_bytes";

/// The running access log.
#[derive(Debug)]
pub struct AccessLog {
    log: BackgroundLog<AccessRecord>,
    sink: AccessSink,
}

impl AccessLog {
    /// A log that writes nothing.
    pub fn disabled() -> AccessLog {
        AccessLog {
            log: BackgroundLog::disabled(),
            sink: AccessSink::default(),
        }
    }

    /// The log `kvcm serve` writes under this configuration (disabled when
    /// `kvcm.access_log.enabled` is false).
    pub fn from_config(config: &ServerConfig) -> Result<AccessLog, LogError> {
        let settings = &config.access_log;
        if !settings.files.enabled {
            return Ok(AccessLog::disabled());
        }
        let dir = config.access_log_dir();
        let files = LogFiles {
            name: "access log",
            dir: &dir,
            stem: ACCESS_STEM,
            max_file_bytes: settings.files.max_file_bytes,
            keep_files: settings.files.keep_files,
        };
        let log = BackgroundLog::start(files, "kvcm-access-log", record::line_of)?;
        let sink = AccessSink {
            feed: log.feed(),
            max_body_bytes: settings.bodies.then_some(settings.max_body_bytes),
        };
        Ok(AccessLog { log, sink })
    }

    /// The handle the transports log through.
    pub fn sink(&self) -> AccessSink {
        self.sink.clone()
    }

    /// Writes every line accepted so far, flushes and stops the writer thread.
    pub fn close(self) -> Result<(), LogError> {
        self.log.close()
    }
}

/// Cloneable handle the transports log through; disabled when the log is off.
#[derive(Debug, Clone, Default)]
pub struct AccessSink {
    feed: LogFeed<AccessRecord>,
    /// `Some(kvcm.access_log.max_body_bytes)` when bodies are logged.
    max_body_bytes: Option<usize>,
}

impl AccessSink {
    /// A sink that logs nothing.
    pub fn disabled() -> AccessSink {
        AccessSink::default()
    }

    /// Whether lines are written.
    pub fn is_enabled(&self) -> bool {
        self.feed.is_enabled()
    }

    /// Lines not written so far (channel full, log closed, write failed).
    pub fn dropped(&self) -> u64 {
        self.feed.dropped()
    }

    /// The `access_log.dropped` counter for GetMetrics.
    pub fn to_wire(&self) -> Vec<admin::MetricsData> {
        vec![self.feed.dropped_to_wire(DROPPED_METRIC)]
    }

    /// The `access_log.dropped` counter in Prometheus text (names prefixed with `prefix`).
    pub fn to_prometheus(&self, prefix: &str) -> String {
        self.feed.dropped_to_prometheus(prefix, DROPPED_METRIC)
    }

    /// Begins the line of a call of `rpc` that arrived now (`None` when the log is off).
    pub fn begin(
        &self,
        rpc: &'static Rpc,
        transport: Transport,
        client: Option<SocketAddr>,
    ) -> Option<AccessLine> {
        self.is_enabled().then(|| AccessLine {
            started: Instant::now(),
            max_body_bytes: self.max_body_bytes,
            record: AccessRecord {
                begin_us: now_us(),
                client,
                transport,
                rpc,
                trace_id: String::new(),
                status_code: None,
                request_id: String::new(),
                http_status: None,
                cost_us: 0,
                request: None,
                response: None,
            },
        })
    }
}

/// The line of one call, from its arrival to its answer.
#[derive(Debug)]
pub struct AccessLine {
    started: Instant,
    max_body_bytes: Option<usize>,
    record: AccessRecord,
}

impl AccessLine {
    /// Whether the bodies are logged (so worth encoding).
    pub fn wants_bodies(&self) -> bool {
        self.max_body_bytes.is_some()
    }

    /// Logs the request's JSON, when bodies are logged.
    pub fn request_json(&mut self, json: &[u8]) {
        self.record.request = self.body(json);
    }

    /// Logs the request message as JSON, when bodies are logged.
    pub fn request_message(&mut self, request: &impl Serialize) {
        if self.wants_bodies() {
            let json = serde_json::to_vec(request).unwrap_or_default();
            self.request_json(&json);
        }
    }

    /// Logs the response's JSON, when bodies are logged.
    pub fn response_json(&mut self, json: &[u8]) {
        self.record.response = self.body(json);
    }

    /// Finishes the line with what the call answered and offers it to the log: the
    /// request's trace id (as the handlers saw it), the answer header's code and request id
    /// (`None` when no handler ran), the HTTP status (HTTP only).
    pub fn finish(
        mut self,
        sink: &AccessSink,
        trace_id: Option<String>,
        status: Option<(i32, &str)>,
        http_status: Option<u16>,
    ) {
        let record = &mut self.record;
        record.cost_us = u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX);
        record.trace_id = trace_id.unwrap_or_default();
        if let Some((code, request_id)) = status {
            record.status_code = Some(code);
            record.request_id = request_id.to_string();
        }
        record.http_status = http_status;
        sink.feed.offer(self.record);
    }

    /// A body to log: `None` when bodies are off, the truncation marker beyond the limit.
    fn body(&self, json: &[u8]) -> Option<Vec<u8>> {
        let max = self.max_body_bytes?;
        if json.len() <= max {
            return Some(json.to_vec());
        }
        Some(format!("{{\"{TRUNCATED_MEMBER}\":{}}}", json.len()).into_bytes())
    }
}
