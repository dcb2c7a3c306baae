//! Debug fault injection (wire fact sheet §5): while a fault is set for an API, its calls
//! fail with INTERNAL_ERROR — always, or only for the call whose trace id ends in
//! `_<trigger_at_call>` (a non-numeric suffix simply does not match).

use std::collections::HashMap;
use std::sync::Mutex;

/// When an injected fault fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// Every call.
    Always,
    /// Calls whose trace id suffix after the last `_` is this number.
    AtCall(i32),
}

/// The active faults, by API name.
#[derive(Debug, Default)]
pub struct Faults {
    active: Mutex<HashMap<String, Trigger>>,
}

impl Faults {
    /// Sets (or replaces) the fault of an API.
    pub fn inject(&self, api_name: String, trigger: Trigger) {
        self.lock().insert(api_name, trigger);
    }

    /// Removes an API's fault; false when it had none.
    pub fn remove(&self, api_name: &str) -> bool {
        self.lock().remove(api_name).is_some()
    }

    /// Removes every fault.
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// Whether a call of `api_name` with this trace id must fail.
    pub fn fires(&self, api_name: &str, trace_id: &str) -> bool {
        let active = self.lock();
        match active.get(api_name) {
            None => false,
            Some(Trigger::Always) => true,
            Some(Trigger::AtCall(n)) => {
                trace_id
                    .rsplit_once('_')
                    .and_then(|(_, suffix)| suffix.parse::<i32>().ok())
                    == Some(*n)
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Trigger>> {
        kvcm_manager::sync::lock(&self.active)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_fires_only_on_its_call_number() {
        let faults = Faults::default();
        faults.inject("GetCacheLocation".into(), Trigger::AtCall(3));
        assert!(faults.fires("GetCacheLocation", "trace_3"));
        assert!(!faults.fires("GetCacheLocation", "trace_4"));
        assert!(!faults.fires("GetCacheLocation", "trace_x"));
        assert!(!faults.fires("GetCacheLocation", "no-suffix"));
        assert!(!faults.fires("StartWriteCache", "trace_3"));
        assert!(faults.remove("GetCacheLocation"));
        assert!(!faults.remove("GetCacheLocation"));
    }
}
