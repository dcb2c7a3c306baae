//! The access log and the audit log.
//!
//! **Access log**: one JSON line per RPC served over gRPC or HTTP (time, client address,
//! transport, API, caller, trace id, request id, status, cost in µs; the request and response
//! bodies behind `kvcm.access_log.bodies`, secrets redacted), written to `access.jsonl` under
//! `<data_dir>/access` and rotated by size like the event log ([`crate::logs`]).
//!
//! **Audit log**: the same line, always with both bodies (redacted), for every admin and
//! debug call that can change state ([`audited`]) and for every admin or debug request
//! refused for its bearer token; `audit.jsonl` under `<data_dir>/audit`.
//!
//! The transports ([`crate::service`]'s gRPC and HTTP edges) begin an [`AccessLine`] when a
//! call arrives and finish it once its answer is ready; the request path pays one
//! non-blocking channel send per log (a full channel drops the line and counts it in
//! `access_log.dropped` / `audit_log.dropped`), and when bodies are logged the encoding of
//! both as JSON. Parsing and redacting the bodies, and writing, happen on each log's thread.
//!
//! Invariants: a line is written for every RPC call a transport answered, refusals included
//! (over HTTP: a body too large, too slow or not JSON, a missing or wrong admin token); lines
//! reach each file in the order the calls finished; no logged body shows a password, token
//! or key ([`redact`]). Not logged: `GET /metrics` and `GET /api/healthy` when answered
//! (probes, not RPCs), the lookup path's RDMA messages.

mod record;
mod redact;

use std::borrow::Cow;
use std::net::SocketAddr;
use std::time::Instant;

use serde::Serialize;

pub use record::{AccessRecord, Transport};

use crate::config::ServerConfig;
use crate::logs::{now_us, BackgroundLog, LogError, LogFeed, LogFiles};
use crate::proto::admin;
use crate::service::rpcs::{self, Rpc, Service};

/// File stem of the access log.
pub const ACCESS_STEM: &str = "access";

/// File stem of the audit log.
pub const AUDIT_STEM: &str = "audit";

/// Name of the counter of access-log lines that were not written.
pub const DROPPED_METRIC: &str = "access_log.dropped";

/// Name of the counter of audit-log lines that were not written.
pub const AUDIT_DROPPED_METRIC: &str = "audit_log.dropped";

/// What a body too large to log is written as (its size follows).
const TRUNCATED_MEMBER: &str = "kvcm_truncated_bytes";

/// Whether calls of `rpc` go to the audit log: admin and debug calls that can change state
/// (the RPC table's access column says which only read).
pub fn audited(rpc: &Rpc) -> bool {
    rpc.service != Service::Meta && !rpc.access.reads_only()
}

/// The running access and audit logs.
#[derive(Debug)]
pub struct AccessLog {
    access: BackgroundLog<AccessRecord>,
    audit: BackgroundLog<AccessRecord>,
    sink: AccessSink,
}

impl AccessLog {
    /// The logs `kvcm serve` writes under this configuration (each off when its
    /// `enabled` key is false).
    pub fn from_config(config: &ServerConfig) -> Result<AccessLog, LogError> {
        let settings = &config.access_log;
        let access = start(
            "access log",
            ACCESS_STEM,
            &config.access_log_dir(),
            &settings.files,
        )?;
        let audit = start(
            "audit log",
            AUDIT_STEM,
            &config.audit_log_dir(),
            &config.audit_log,
        )?;
        let sink = AccessSink {
            access: access.feed(),
            audit: audit.feed(),
            bodies: settings.bodies,
            max_body_bytes: settings.max_body_bytes,
        };
        Ok(AccessLog {
            access,
            audit,
            sink,
        })
    }

    /// The handle the transports log through.
    pub fn sink(&self) -> AccessSink {
        self.sink.clone()
    }

    /// Writes every line accepted so far, flushes and stops the writer threads.
    pub fn close(self) -> Result<(), LogError> {
        let (access, audit) = (self.access.close(), self.audit.close());
        access.and(audit)
    }
}

/// One of the two logs, or a disabled one.
fn start(
    name: &'static str,
    stem: &'static str,
    dir: &std::path::Path,
    settings: &crate::config::LogFilesConfig,
) -> Result<BackgroundLog<AccessRecord>, LogError> {
    if !settings.enabled {
        return Ok(BackgroundLog::disabled());
    }
    let files = LogFiles {
        name,
        dir,
        stem,
        max_file_bytes: settings.max_file_bytes,
        keep_files: settings.keep_files,
    };
    BackgroundLog::start(files, &format!("kvcm-{stem}-log"), record::line_of)
}

/// Cloneable handle the transports log through; disabled when both logs are off.
#[derive(Debug, Clone)]
pub struct AccessSink {
    access: LogFeed<AccessRecord>,
    audit: LogFeed<AccessRecord>,
    /// `kvcm.access_log.bodies`.
    bodies: bool,
    /// `kvcm.access_log.max_body_bytes` (audit lines too).
    max_body_bytes: usize,
}

impl Default for AccessSink {
    fn default() -> Self {
        AccessSink {
            access: LogFeed::default(),
            audit: LogFeed::default(),
            bodies: false,
            max_body_bytes: crate::config::AccessLogConfig::default().max_body_bytes,
        }
    }
}

impl AccessSink {
    /// Whether either log is written.
    pub fn is_enabled(&self) -> bool {
        self.access.is_enabled() || self.audit.is_enabled()
    }

    /// Access-log lines not written so far (channel full, log closed, write failed).
    pub fn dropped(&self) -> u64 {
        self.access.dropped()
    }

    /// The `access_log.dropped` and `audit_log.dropped` counters for GetMetrics.
    pub fn to_wire(&self) -> Vec<admin::MetricsData> {
        vec![
            self.access.dropped_to_wire(DROPPED_METRIC),
            self.audit.dropped_to_wire(AUDIT_DROPPED_METRIC),
        ]
    }

    /// The same counters in Prometheus text (names prefixed with `prefix`).
    pub fn to_prometheus(&self, prefix: &str) -> String {
        self.access.dropped_to_prometheus(prefix, DROPPED_METRIC)
            + &self
                .audit
                .dropped_to_prometheus(prefix, AUDIT_DROPPED_METRIC)
    }

    /// Begins the line of a call of `rpc` that arrived now (`None` when both logs are off).
    pub fn begin(
        &self,
        rpc: &'static Rpc,
        transport: Transport,
        client: Option<SocketAddr>,
    ) -> Option<AccessLine> {
        let audited = self.audit.is_enabled() && audited(rpc);
        self.is_enabled().then(|| AccessLine {
            started: Instant::now(),
            audited,
            record: new_record(rpc.service, rpc.name.into(), transport, client),
        })
    }

    /// Logs, in both logs, a request to `path` of an admin or debug listener refused for its
    /// bearer token (`reason`); the answer was HTTP 401 (or gRPC UNAUTHENTICATED).
    pub fn unauthorized(
        &self,
        service: Service,
        path: &str,
        transport: Transport,
        client: Option<SocketAddr>,
        reason: &str,
    ) {
        if !self.is_enabled() {
            return;
        }
        let record = new_record(service, api_name_of(service, path), transport, client);
        self.refused(record, 401, "unauthorized", reason);
    }

    /// Logs, in both logs, a call of `rpc` by `caller` refused because its credential may not
    /// make it (`reason`); the answer was HTTP 403 (or gRPC PERMISSION_DENIED).
    pub fn forbidden(
        &self,
        rpc: &Rpc,
        transport: Transport,
        client: Option<SocketAddr>,
        caller: &str,
        reason: &str,
    ) {
        self.forbidden_path(rpc.service, rpc.route, transport, client, caller, reason);
    }

    /// As [`AccessSink::forbidden`], for a request to `path` of `service`'s listener.
    pub fn forbidden_path(
        &self,
        service: Service,
        path: &str,
        transport: Transport,
        client: Option<SocketAddr>,
        caller: &str,
        reason: &str,
    ) {
        if !self.is_enabled() {
            return;
        }
        let mut record = new_record(service, api_name_of(service, path), transport, client);
        record.caller = Some(caller.to_string());
        self.refused(record, 403, "forbidden", reason);
    }

    fn refused(&self, mut record: AccessRecord, http_status: u16, error: &str, reason: &str) {
        let transport = record.transport;
        record.http_status = (transport == Transport::Http).then_some(http_status);
        let answer = serde_json::json!({"error": error, "kvcm_reason": reason});
        record.response = Some(answer.to_string().into_bytes());
        self.audit.offer(record.clone());
        record.response = None;
        self.access.offer(record);
    }
}

/// The name of the RPC whose route `path` is, else the path.
fn api_name_of(service: Service, path: &str) -> Cow<'static, str> {
    rpcs::ALL
        .iter()
        .find(|rpc| rpc.service == service && rpc.route == path)
        .map_or_else(|| Cow::Owned(path.to_string()), |rpc| rpc.name.into())
}

fn new_record(
    service: Service,
    api_name: Cow<'static, str>,
    transport: Transport,
    client: Option<SocketAddr>,
) -> AccessRecord {
    AccessRecord {
        begin_us: now_us(),
        client,
        transport,
        service,
        api_name,
        caller: None,
        trace_id: String::new(),
        status_code: None,
        request_id: String::new(),
        http_status: None,
        cost_us: 0,
        request: None,
        response: None,
    }
}

/// The line of one call, from its arrival to its answer.
#[derive(Debug)]
pub struct AccessLine {
    started: Instant,
    /// Whether the call goes to the audit log too.
    audited: bool,
    record: AccessRecord,
}

impl AccessLine {
    /// Whether the bodies are logged (so worth encoding): by the access log's setting, or
    /// always for an audited call.
    pub fn wants_bodies(&self, sink: &AccessSink) -> bool {
        sink.bodies || self.audited
    }

    /// Notes the fingerprint of the admin token that authenticated the call.
    pub fn set_caller(&mut self, caller: Option<String>) {
        self.record.caller = caller;
    }

    /// Logs the request's JSON, when bodies are logged.
    pub fn request_json(&mut self, sink: &AccessSink, json: &[u8]) {
        self.record.request = self.body(sink, json);
    }

    /// Logs the request message as JSON, when bodies are logged.
    pub fn request_message(&mut self, sink: &AccessSink, request: &impl Serialize) {
        if self.wants_bodies(sink) {
            let json = serde_json::to_vec(request).unwrap_or_default();
            self.request_json(sink, &json);
        }
    }

    /// Logs the response's JSON, when bodies are logged.
    pub fn response_json(&mut self, sink: &AccessSink, json: &[u8]) {
        self.record.response = self.body(sink, json);
    }

    /// Finishes the line with what the call answered and offers it to the logs: the
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
        if self.audited {
            sink.audit.offer(self.record.clone());
        }
        if sink.access.is_enabled() {
            if !sink.bodies {
                (self.record.request, self.record.response) = (None, None);
            }
            sink.access.offer(self.record);
        }
    }

    /// A body to log: `None` when bodies are not logged, the truncation marker beyond the
    /// limit.
    fn body(&self, sink: &AccessSink, json: &[u8]) -> Option<Vec<u8>> {
        if !self.wants_bodies(sink) {
            return None;
        }
        if json.len() <= sink.max_body_bytes {
            return Some(json.to_vec());
        }
        let marker = format!("{{\"{TRUNCATED_MEMBER}\":{}}}", json.len());
        Some(marker.into_bytes())
    }
}
