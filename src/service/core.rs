//! The call machinery shared by every RPC of every transport: instance pre-check, leader
//! gate, fault injection, the manager call, the status mapping (done here, once) and the
//! metrics. Handlers only convert wire requests into manager calls and results back.

use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::faults::Faults;
use super::metrics::Metrics;
use super::reply::Reply;
use crate::proto::meta::ErrorCode;
use kvcm_manager::{Instance, Manager, ManagerError, ManagerResult};

/// A trace id ending in this asks for the span timings in `header.tracer_result`.
const SPAN_TRACER_SUFFIX: &str = "__kvcm_need_span_tracer";

/// APIs subject to debug fault injection (as in the reference).
const FAULTABLE: [&str; 3] = ["GetCacheLocation", "StartWriteCache", "FinishWriteCache"];

thread_local! {
    /// When the transport call served on this thread began (set by [`served_since`]).
    static CALL_STARTED: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Serves one transport call that began at `started` (before its request was read and
/// decoded): the RPC's response time metric counts from there.
pub fn served_since<T>(started: Instant, serve: impl FnOnce() -> T) -> T {
    CALL_STARTED.with(|cell| cell.set(Some(started)));
    let served = serve();
    CALL_STARTED.with(|cell| cell.set(None));
    served
}

/// The start of the call served on this thread (now, outside [`served_since`]).
fn call_started() -> Instant {
    CALL_STARTED.with(Cell::get).unwrap_or_else(Instant::now)
}

/// Which service's status rules apply (wire fact sheet §8.0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rules {
    /// Meta: manager errors map to their specific codes.
    Meta,
    /// Admin: validation → INVALID_ARGUMENT, every other failure → INTERNAL_ERROR.
    Admin,
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
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core").finish_non_exhaustive()
    }
}

/// A successful result and its status message.
pub type Outcome<R> = ManagerResult<(R, String)>;

impl Core {
    /// Runs one RPC: leader gate (when `leader_only`), fault injection, `op`, header, metrics.
    pub fn call<R: Reply>(
        &self,
        api: &'static str,
        trace_id: &str,
        rules: Rules,
        leader_only: bool,
        op: impl FnOnce() -> Outcome<R>,
    ) -> R {
        let (reply, elapsed) = self.answer(api, trace_id, rules, leader_only, op);
        self.metrics.record(api, elapsed);
        reply
    }

    /// The reply of one RPC and how long it took (no metrics recorded).
    fn answer<R: Reply>(
        &self,
        api: &'static str,
        trace_id: &str,
        rules: Rules,
        leader_only: bool,
        op: impl FnOnce() -> Outcome<R>,
    ) -> (R, Duration) {
        let started = call_started();
        let result = if leader_only && !self.manager.leadership().is_leader() {
            Err(wire_status(&ManagerError::NotLeader, api, rules))
        } else if FAULTABLE.contains(&api) && self.faults.fires(api, trace_id) {
            Err((
                ErrorCode::InternalError,
                format!("{api} fail due to fault injection"),
            ))
        } else {
            op().map_err(|error| wire_status(&error, api, rules))
        };
        let (mut reply, code, message) = match result {
            Ok((reply, message)) => (reply, ErrorCode::Ok, message),
            Err((code, message)) => (R::default(), code, message),
        };
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
        api: &'static str,
        trace_id: &str,
        instance_id: &str,
        op: impl FnOnce(Arc<Instance>) -> Outcome<R>,
    ) -> R {
        if !self.manager.leadership().is_leader() {
            return self.call(api, trace_id, Rules::Meta, true, || {
                Err(ManagerError::NotLeader)
            });
        }
        let Some(instance) = self.manager.instance(instance_id) else {
            let mut reply = R::default();
            let message = format!("get {api} metrics collector failed");
            reply.set_header(ErrorCode::InstanceNotExist, message, String::new());
            self.metrics.record(api, call_started().elapsed());
            return reply;
        };
        let (id, group) = (instance.id().clone(), instance.group().to_string());
        let (reply, elapsed) = self.answer(api, trace_id, Rules::Meta, false, || op(instance));
        self.metrics.record_instance(api, &id, &group, elapsed);
        reply
    }
}

/// The wire code and message of a manager error raised by `api` under a service's rules:
/// the one place where errors become status codes. A bad field reads as the reference writes
/// it, `{Api: {field}}` (and what is wrong, when known).
pub fn wire_status(error: &ManagerError, api: &str, rules: Rules) -> (ErrorCode, String) {
    let message = match error {
        ManagerError::InvalidField { field, detail } if detail.is_empty() => {
            format!("{{{api}: {{{field}}}}}")
        }
        ManagerError::InvalidField { field, detail } => format!("{{{api}: {{{field}}}}}: {detail}"),
        other => other.to_string(),
    };
    (status_code(error, rules), message)
}

/// The wire code of a manager error under a service's rules.
fn status_code(error: &ManagerError, rules: Rules) -> ErrorCode {
    match (error, rules) {
        (ManagerError::InvalidField { .. } | ManagerError::InvalidStorage(_), _) => {
            ErrorCode::InvalidArgument
        }
        (ManagerError::NotLeader, _) => ErrorCode::ServerNotLeader,
        (_, Rules::Admin) => ErrorCode::InternalError,
        (ManagerError::Unsupported(_), Rules::Meta) => ErrorCode::Unsupported,
        (ManagerError::Duplicate(_), Rules::Meta) => ErrorCode::DuplicateEntity,
        (ManagerError::InstanceNotExist(_), Rules::Meta) => ErrorCode::InstanceNotExist,
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
