//! The call machinery shared by every RPC of every transport: instance pre-check, leader
//! gate, fault injection, the manager call, the status mapping (done here, once) and the
//! metrics. Handlers only convert wire requests into manager calls and results back.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::faults::Faults;
use super::metrics::Metrics;
use super::reply::Reply;
use super::rpcs::{Rpc, Service};
use crate::config::RequestLimits;
use crate::proto::meta::ErrorCode;
use kvcm_index::{BlockKey, IndexError};
use kvcm_manager::{Instance, JournalError, Manager, ManagerError, ManagerResult};

/// A trace id ending in this asks for the span timings in `header.tracer_result`.
const SPAN_TRACER_SUFFIX: &str = "__kvcm_need_span_tracer";

thread_local! {
    /// The transport call served on this thread (set by [`served_since`]).
    static CALL: RefCell<Option<Served>> = const { RefCell::new(None) };
}

/// The transport call being served on a thread.
struct Served {
    /// When it began.
    started: Instant,
    /// Its request's trace id, noted by the call machinery when the access log is on.
    trace_id: Option<String>,
}

/// Serves one transport call that began at `started` (before its request was read and
/// decoded): the RPC's response time metric counts from there. Returns what `serve` returned
/// and, when the access log is on, the request's trace id (which only the handlers know).
pub fn served_since<T>(started: Instant, serve: impl FnOnce() -> T) -> (T, Option<String>) {
    let call = Served {
        started,
        trace_id: None,
    };
    CALL.with(|cell| *cell.borrow_mut() = Some(call));
    let served = serve();
    let trace_id = CALL.with(|cell| cell.borrow_mut().take().and_then(|call| call.trace_id));
    (served, trace_id)
}

/// The start of the call served on this thread (now, outside [`served_since`]).
fn call_started() -> Instant {
    CALL.with(|cell| cell.borrow().as_ref().map(|call| call.started))
        .unwrap_or_else(Instant::now)
}

/// Notes the trace id of the call served on this thread (nothing outside [`served_since`]).
fn note_trace_id(trace_id: &str) {
    CALL.with(|cell| {
        if let Some(call) = cell.borrow_mut().as_mut() {
            call.trace_id = Some(trace_id.to_string());
        }
    });
}

/// Which service's status rules apply (wire fact sheet §8.0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rules {
    /// Meta: manager errors map to their specific codes.
    Meta,
    /// Admin (and debug): validation → INVALID_ARGUMENT, every other failure →
    /// INTERNAL_ERROR.
    Admin,
}

impl Rules {
    /// The rules of an RPC's service.
    pub fn of(rpc: &Rpc) -> Rules {
        match rpc.service {
            Service::Meta => Rules::Meta,
            Service::Admin | Service::Debug => Rules::Admin,
        }
    }
}

/// Why a call failed: the manager's error, or one of the edge's own pre-checks.
#[derive(Debug)]
pub enum Failure {
    /// The manager refused.
    Manager(ManagerError),
    /// A debug fault fired.
    InjectedFault,
    /// The request names no registered instance.
    UnknownInstance,
}

impl From<ManagerError> for Failure {
    fn from(error: ManagerError) -> Self {
        Failure::Manager(error)
    }
}

/// What every handler shares.
pub struct Core {
    /// The manager.
    pub manager: Arc<Manager>,
    /// Per-API metrics.
    pub metrics: Metrics,
    /// Debug fault injection.
    pub faults: Faults,
    /// Where UpdateLogger applies a level (`None`: the level is fixed).
    pub log_level: Option<super::LogLevelSetter>,
    /// The event log of successful meta calls.
    pub events: crate::events::EventSink,
    /// The access log: one line per transport call.
    pub access: crate::access_log::AccessSink,
    /// Live capacity curves of the served lookups.
    pub curves: std::sync::Arc<crate::curves::LiveCurves>,
    /// `kvcm.service.max_*`: what one request may ask for.
    pub limits: RequestLimits,
    /// The credentials in force: admin tokens (set by the listeners from the config, changed
    /// by the token RPCs), the manager's API keys, whether the meta API requires one.
    pub auth: super::auth::Authenticator,
    /// The lookup path, once started (its figures join the metrics).
    pub lookup: std::sync::OnceLock<std::sync::Weak<crate::lookup::LookupService>>,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core").finish_non_exhaustive()
    }
}

/// A successful result and its status message.
pub type Outcome<R> = ManagerResult<(R, String)>;

impl Core {
    /// The lookup path's figures, when it runs.
    pub fn lookup_stats(&self) -> Option<crate::lookup::stats::LookupStats> {
        let service = self.lookup.get()?.upgrade()?;
        Some(service.stats())
    }

    /// Runs one RPC: leader gate (when the table says so), fault injection (likewise), `op`,
    /// header, metrics.
    pub fn call<R: Reply>(
        &self,
        rpc: &'static Rpc,
        trace_id: &str,
        op: impl FnOnce() -> Outcome<R>,
    ) -> R {
        let (reply, elapsed) = self.answer(rpc, trace_id, rpc.leader_only, op);
        self.metrics.record(rpc.name, elapsed);
        reply
    }

    /// The reply of one RPC and how long it took (no metrics recorded).
    fn answer<R: Reply>(
        &self,
        rpc: &'static Rpc,
        trace_id: &str,
        leader_gate: bool,
        op: impl FnOnce() -> Outcome<R>,
    ) -> (R, Duration) {
        let started = call_started();
        let api = rpc.name;
        let result = if leader_gate && !self.manager.leadership().is_leader() {
            Err(Failure::Manager(ManagerError::NotLeader))
        } else if rpc.faultable && self.faults.fires(api, trace_id) {
            Err(Failure::InjectedFault)
        } else {
            op().map_err(Failure::Manager)
        };
        let (mut reply, code, message) = match result {
            Ok((reply, message)) => (reply, ErrorCode::Ok, message),
            Err(failure) => {
                let (code, message) = wire_status(&failure, api, Rules::of(rpc));
                (R::default(), code, message)
            }
        };
        if self.access.is_enabled() {
            note_trace_id(trace_id);
        }
        reply.set_header(code, message, request_id(trace_id));
        let elapsed = started.elapsed();
        let micros = elapsed.as_micros() as u64;
        if trace_id.ends_with(SPAN_TRACER_SUFFIX) {
            let spans = serde_json::json!({"name": api, "duration_us": micros, "children": []});
            reply.set_tracer_result(spans.to_string());
        }
        tracing::debug!(api, ?code, micros, "served");
        (reply, elapsed)
    }

    /// A meta RPC on one instance: a follower answers SERVER_NOT_LEADER first (§17 safe
    /// fix); an unknown instance → INSTANCE_NOT_EXIST before anything else (with an empty
    /// request id); then as [`Core::call`].
    pub fn instance_call<R: Reply>(
        &self,
        rpc: &'static Rpc,
        trace_id: &str,
        instance_id: &str,
        op: impl FnOnce(Arc<Instance>) -> Outcome<R>,
    ) -> R {
        if !self.manager.leadership().is_leader() {
            return self.call(rpc, trace_id, || Err(ManagerError::NotLeader));
        }
        let Some(instance) = self.manager.instance(instance_id) else {
            let mut reply = R::default();
            let (code, message) = wire_status(&Failure::UnknownInstance, rpc.name, Rules::of(rpc));
            if self.access.is_enabled() {
                note_trace_id(trace_id);
            }
            reply.set_header(code, message, String::new());
            self.metrics.record(rpc.name, call_started().elapsed());
            return reply;
        };
        let (id, group) = (instance.id().clone(), instance.group().to_string());
        let (reply, elapsed) = self.answer(rpc, trace_id, false, || op(instance));
        self.metrics.record_instance(rpc.name, &id, &group, elapsed);
        reply
    }
}

/// Bytes an answer spends on one location of one key beyond the instance id and spec name
/// it repeats: the URI's scheme, root, key and query, and the JSON around them.
const LOCATION_OVERHEAD: usize = 128;

/// The estimated bytes one key of `instance` adds to an answer with one location per spec.
fn answer_bytes_per_key(instance: &Instance) -> usize {
    instance
        .specs()
        .iter()
        .map(|spec| spec.name.len() + instance.id().len() + LOCATION_OVERHEAD)
        .sum()
}

/// The most keys a GetCacheLocation of `instance` may ask for before [`Core::located_keys`]
/// refuses it: `kvcm.service.max_keys_per_request`, or fewer where the answer's estimated
/// size would pass `kvcm.service.max_response_bytes` first (told to fast-path clients, which
/// send larger lookups to the server so that its refusal is the answer).
pub fn lookup_keys_allowed(limits: &RequestLimits, instance: &Instance) -> usize {
    let by_bytes = limits.max_response_bytes / answer_bytes_per_key(instance).max(1);
    limits.max_keys_per_request.min(by_bytes)
}

impl Core {
    /// Counts a served GetCacheLocation in the event log and the live capacity curves.
    pub fn record_lookup(&self, instance: &Instance, keys: &[BlockKey], token_ids: &[i64]) {
        self.events.lookup(instance, keys, token_ids);
        // Registration guarantees a positive i32 block size.
        let block_tokens = u32::try_from(instance.info().block_size).unwrap_or(1);
        self.curves
            .record(instance.id(), block_tokens, keys, token_ids);
    }

    /// The keys of a meta request (its block keys, else those of its token ids), refused
    /// beyond `kvcm.service.max_keys_per_request`.
    pub fn request_keys(
        &self,
        instance: &Instance,
        block_keys: Vec<BlockKey>,
        token_ids: &[i64],
    ) -> ManagerResult<Vec<BlockKey>> {
        let keys = instance.resolve_keys(block_keys, token_ids)?;
        let limit = self.limits.max_keys_per_request;
        if keys.len() > limit {
            let detail = format!(
                "{} keys exceed kvcm.service.max_keys_per_request = {limit}",
                keys.len()
            );
            return Err(ManagerError::invalid_because("block_keys", detail));
        }
        Ok(keys)
    }

    /// As [`Core::request_keys`], for a request answered with a location per key
    /// (placeholders of missing keys included): also refused when that answer's estimated
    /// size exceeds `kvcm.service.max_response_bytes`.
    pub fn located_keys(
        &self,
        instance: &Instance,
        block_keys: Vec<BlockKey>,
        token_ids: &[i64],
    ) -> ManagerResult<Vec<BlockKey>> {
        self.located_keys_times(instance, block_keys, token_ids, 1)
    }

    /// As [`Core::located_keys`], for an answer of up to `answers` locations per key and
    /// spec (one per backend selector).
    pub fn located_keys_times(
        &self,
        instance: &Instance,
        block_keys: Vec<BlockKey>,
        token_ids: &[i64],
        answers: usize,
    ) -> ManagerResult<Vec<BlockKey>> {
        let keys = self.request_keys(instance, block_keys, token_ids)?;
        let estimate = answer_bytes_per_key(instance)
            .saturating_mul(keys.len())
            .saturating_mul(answers.max(1));
        let limit = self.limits.max_response_bytes;
        if estimate > limit {
            let detail = format!(
                "an answer of about {estimate} bytes for {} keys exceeds kvcm.service.max_response_bytes = {limit}",
                keys.len()
            );
            return Err(ManagerError::invalid_because("block_keys", detail));
        }
        Ok(keys)
    }
}

/// The wire code and message of a failure of `api` under a service's rules: the one place
/// where errors become status codes. A bad field reads as the reference writes it,
/// `missing or invalid fields: {Api: {field}}` (and what is wrong, when known).
pub fn wire_status(failure: &Failure, api: &str, rules: Rules) -> (ErrorCode, String) {
    let error = match failure {
        Failure::InjectedFault => {
            let message = format!("{api} fail due to fault injection");
            return (ErrorCode::InternalError, message);
        }
        Failure::UnknownInstance => {
            let message = format!("get {api} metrics collector failed");
            return (ErrorCode::InstanceNotExist, message);
        }
        Failure::Manager(error) => error,
    };
    let message = match error {
        ManagerError::InvalidField { field, detail } if detail.is_empty() => {
            format!("missing or invalid fields: {{{api}: {{{field}}}}}")
        }
        ManagerError::InvalidField { field, detail } => {
            format!("missing or invalid fields: {{{api}: {{{field}}}}}: {detail}")
        }
        other => other.to_string(),
    };
    (status_code(error, rules), message)
}

/// The wire code of a manager error under a service's rules.
fn status_code(error: &ManagerError, rules: Rules) -> ErrorCode {
    match (error, rules) {
        (
            ManagerError::InvalidField { .. }
            | ManagerError::InvalidStorage(_)
            | ManagerError::Index(IndexError::InvalidArgument(_)),
            _,
        ) => ErrorCode::InvalidArgument,
        // A write refused by the shared store's fence: a newer leader took over.
        (
            ManagerError::NotLeader
            | ManagerError::Index(IndexError::Fenced { .. })
            | ManagerError::Journal(JournalError::Fenced { .. }),
            _,
        ) => ErrorCode::ServerNotLeader,
        (ManagerError::Capacity(_), _) => ErrorCode::ReachMaxEntityCapacity,
        // Upstream trunk (wire delta §4.4): the admin service answers these two as the meta
        // service does (2026-02: INTERNAL_ERROR).
        (ManagerError::Duplicate(_), _) => ErrorCode::DuplicateEntity,
        (ManagerError::InstanceNotExist(_) | ManagerError::NoReportStorage(_), _) => {
            ErrorCode::InstanceNotExist
        }
        (_, Rules::Admin) => ErrorCode::InternalError,
        (ManagerError::Unsupported(_), Rules::Meta) => ErrorCode::Unsupported,
        (_, Rules::Meta) => ErrorCode::InternalError,
    }
}

/// `<trace_id>_<unix time in µs>`.
fn request_id(trace_id: &str) -> String {
    let micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    format!("{trace_id}_{micros}")
}
