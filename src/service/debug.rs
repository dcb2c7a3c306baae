//! DebugService: fault injection switches (wire fact sheet §5). Not leader-gated; the
//! request id is left empty as in the reference.

use std::sync::Arc;

use kvcm_manager::ManagerError;

use super::core::{wire_status, Core, Failure, Rules};
use super::faults::Trigger;
use super::reply::Reply;
use super::rpcs::{self, Rpc};
use crate::proto::{debug, meta::ErrorCode};

/// Handlers of DebugService.
#[derive(Debug, Clone)]
pub struct DebugHandler {
    pub(super) core: Arc<Core>,
}

fn done(message: &str) -> debug::CommonResponse {
    let mut reply = debug::CommonResponse::default();
    reply.set_header(ErrorCode::Ok, message.to_string(), String::new());
    reply
}

fn refused(rpc: &Rpc, error: ManagerError) -> debug::CommonResponse {
    let (code, message) = wire_status(&Failure::Manager(error), rpc.name, Rules::of(rpc));
    let mut reply = debug::CommonResponse::default();
    reply.set_header(code, message, String::new());
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
            return refused(
                &rpcs::debug::INJECT_FAULT,
                ManagerError::invalid("api_name"),
            );
        }
        if debug::FaultType::try_from(request.fault_type).is_err() {
            let detail = format!("{} is not a FaultType", request.fault_type);
            let unknown = ManagerError::invalid_because("fault_type", detail);
            return refused(&rpcs::debug::INJECT_FAULT, unknown);
        }
        let trigger = match debug::FaultTriggerStrategy::try_from(request.fault_trigger_strategy) {
            Ok(debug::FaultTriggerStrategy::Once) => Trigger::AtCall(request.trigger_at_call),
            Ok(debug::FaultTriggerStrategy::Always) => Trigger::Always,
            Err(_) => {
                let detail = format!(
                    "{} is not a FaultTriggerStrategy",
                    request.fault_trigger_strategy
                );
                let unknown = ManagerError::invalid_because("fault_trigger_strategy", detail);
                return refused(&rpcs::debug::INJECT_FAULT, unknown);
            }
        };
        self.core.faults.inject(request.api_name, trigger);
        done("Fault injected")
    }

    /// RemoveFault: unknown name → INVALID_ARGUMENT.
    pub fn remove_fault(&self, request: debug::RemoveFaultRequest) -> debug::CommonResponse {
        if self.core.faults.remove(&request.api_name) {
            done("Fault removed")
        } else {
            let unknown = ManagerError::invalid_because("api_name", "no fault is set for it");
            refused(&rpcs::debug::REMOVE_FAULT, unknown)
        }
    }

    /// ClearFaults.
    pub fn clear_faults(&self, _request: debug::ClearFaultsRequest) -> debug::CommonResponse {
        self.core.faults.clear();
        done("Faults cleared")
    }
}
