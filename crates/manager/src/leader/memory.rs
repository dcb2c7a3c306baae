//! `memory://`: a process-local lease lock. It elects among the electors of one process
//! only, so it suits a single node (the embedded default); every rule comes from
//! [`Slot`] under one mutex.

use super::lock::{LockResult, Slot, SlotStore};
use crate::sync::lock;
use std::sync::Mutex;

/// A lease lock in this process's memory.
#[derive(Debug, Default)]
pub struct MemoryLock {
    slot: Mutex<Slot>,
}

impl SlotStore for MemoryLock {
    fn change<T>(&self, change: impl Fn(&mut Slot) -> T) -> LockResult<T> {
        Ok(change(&mut lock(&self.slot)))
    }

    fn read(&self) -> LockResult<Slot> {
        Ok(lock(&self.slot).clone())
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
