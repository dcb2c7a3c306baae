//! `memory://`: a process-local lease lock. It elects among the electors of one process
//! only, so it suits a single node (the embedded default); every rule comes from
//! [`Slot`] under one mutex.

use std::sync::Mutex;
use std::time::Duration;

use super::lock::{now_ms, HolderRecord, LeaseLock, LeaseToken, LockResult, NodeEndpoint, Slot};
use crate::sync::lock;

/// A lease lock in this process's memory.
#[derive(Debug, Default)]
pub struct MemoryLock {
    slot: Mutex<Slot>,
}

impl LeaseLock for MemoryLock {
    fn try_acquire(
        &self,
        candidate: &NodeEndpoint,
        lease: Duration,
    ) -> LockResult<Option<LeaseToken>> {
        Ok(lock(&self.slot).acquire(candidate, lease, now_ms()))
    }

    fn renew(
        &self,
        holder: &NodeEndpoint,
        fencing_token: u64,
        lease: Duration,
    ) -> LockResult<LeaseToken> {
        lock(&self.slot).renew(holder, fencing_token, lease, now_ms())
    }

    fn release(&self, node_id: &str, fencing_token: u64) -> LockResult<bool> {
        Ok(lock(&self.slot).release(node_id, fencing_token))
    }

    fn current_holder(&self) -> LockResult<Option<HolderRecord>> {
        Ok(lock(&self.slot).live_holder(now_ms()).cloned())
    }
}

#[cfg(test)]
mod tests {
    use super::super::lock::conformance;
    use super::*;

    #[test]
    fn two_lockers_exclude_each_other() {
        let shared = MemoryLock::default();
        conformance::two_lockers_exclude_each_other(&shared, &shared);
    }

    #[test]
    fn an_expired_lease_is_taken_over() {
        let shared = MemoryLock::default();
        conformance::an_expired_lease_is_taken_over(&shared, &shared);
    }

    #[test]
    fn an_expired_lease_is_not_renewed() {
        conformance::an_expired_lease_is_not_renewed(&MemoryLock::default());
    }
}
