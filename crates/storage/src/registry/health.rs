//! The background health-probe thread: runs a probe round every interval until stopped.
//!
//! Invariant: dropping a [`HealthProber`] stops and joins its thread, so no probe runs after.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// Set to true to stop the thread; the condvar wakes it early.
type StopSignal = (Mutex<bool>, Condvar);

/// A running probe thread.
#[derive(Debug)]
pub(crate) struct HealthProber {
    stop: Arc<StopSignal>,
    thread: Option<JoinHandle<()>>,
}

impl HealthProber {
    /// Runs `probe_round` now and then every `interval` on a new thread.
    pub(crate) fn start(
        interval: Duration,
        probe_round: impl Fn() + Send + 'static,
    ) -> std::io::Result<Self> {
        let stop: Arc<StopSignal> = Arc::new((Mutex::new(false), Condvar::new()));
        let signal = stop.clone();
        let thread = std::thread::Builder::new()
            .name("kvcm-storage-health".to_string())
            .spawn(move || {
                let (stopped, wake) = &*signal;
                loop {
                    probe_round();
                    let guard = stopped.lock().unwrap_or_else(PoisonError::into_inner);
                    let waited = wake.wait_timeout_while(guard, interval, |stopped| !*stopped);
                    let (guard, _) = waited.unwrap_or_else(PoisonError::into_inner);
                    if *guard {
                        return;
                    }
                }
            })?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for HealthProber {
    fn drop(&mut self) {
        let (stopped, wake) = &*self.stop;
        *stopped.lock().unwrap_or_else(PoisonError::into_inner) = true;
        wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
