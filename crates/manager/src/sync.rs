//! Lock helpers shared by the manager and the service edge.
//!
//! Every lock in this crate guards data that a critical section leaves consistent at each
//! step (single assignments, map inserts and removes), so a panic elsewhere never leaves it
//! half-updated: the helpers recover the guard from a poisoned lock instead of propagating
//! the panic into every later request.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `mutex`, recovering from poisoning.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Takes `lock` shared, recovering from poisoning.
pub fn read_lock<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Takes `lock` exclusively, recovering from poisoning.
pub fn write_lock<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
