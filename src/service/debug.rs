//! DebugService: fault injection switches (wire fact sheet §5). Not leader-gated; the
//! request id is left empty as in the reference.

use std::sync::Arc;

use super::core::Core;
use super::faults::Trigger;
use super::reply::Reply;
use crate::proto::{debug, meta::ErrorCode};

/// Handlers of DebugService.
#[derive(Debug, Clone)]
pub struct DebugHandler {
    core: Arc<Core>,
}

fn answer(code: ErrorCode, message: &str) -> debug::CommonResponse {
    let mut reply = debug::CommonResponse::default();
    reply.set_header(code, message.to_string(), String::new());
    reply
}

impl DebugHandler {
    /// Handlers over the shared core.
    pub fn new(core: Arc<Core>) -> Self {
        DebugHandler { core }
    }

    /// InjectFault: sets or replaces the fault of `api_name`.
    pub fn inject_fault(&self, request: debug::InjectFaultRequest) -> debug::CommonResponse {
        if request.api_name.is_empty() {
            return answer(
                ErrorCode::InvalidArgument,
                "missing or invalid fields: {InjectFault: {api_name}}",
            );
        }
        let trigger = match debug::FaultTriggerStrategy::try_from(request.fault_trigger_strategy) {
            Ok(debug::FaultTriggerStrategy::Once) => Trigger::AtCall(request.trigger_at_call),
            _ => Trigger::Always,
        };
        self.core.faults.inject(request.api_name, trigger);
        answer(ErrorCode::Ok, "Fault injected")
    }

    /// RemoveFault: unknown name → INVALID_ARGUMENT.
    pub fn remove_fault(&self, request: debug::RemoveFaultRequest) -> debug::CommonResponse {
        if self.core.faults.remove(&request.api_name) {
            answer(ErrorCode::Ok, "Fault removed")
        } else {
            answer(
                ErrorCode::InvalidArgument,
                "no fault is set for this api_name",
            )
        }
    }

    /// ClearFaults.
    pub fn clear_faults(&self, _request: debug::ClearFaultsRequest) -> debug::CommonResponse {
        self.core.faults.clear();
        answer(ErrorCode::Ok, "Faults cleared")
    }
}
