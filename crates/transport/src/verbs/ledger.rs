//! How many work requests a queue pair has outstanding, counted by the provider itself:
//! verbs rounds queue sizes up (kernel rxe does) and a chain it refuses midway has posted
//! its prefix, so a post that would exceed the configured depth is refused here, before
//! verbs sees it, and changes nothing.
//!
//! Sends: a signaled request's completion retires it and the unsignaled ones posted before
//! it (verbs semantics); unsignaled requests after the last signaled one stay counted until
//! a later signaled one completes. Receives: each completion retires one. An error
//! completion breaks the queue pair (every later post is refused: the ledger remembers it
//! as `broken`, which the queue pair checks instead of asking the device at every post),
//! so the ledger then just forgets what was outstanding.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::{TransportError, WcOpcode, WcStatus, WorkCompletion};

/// The outstanding work requests of one queue pair.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    sends: Mutex<Sends>,
    receives: Mutex<usize>,
    /// An error completion of the queue pair was polled: it is broken for good.
    broken: AtomicBool,
}

#[derive(Debug, Default)]
struct Sends {
    outstanding: usize,
    /// Per signaled request not yet completed: how many requests its completion retires.
    runs: VecDeque<usize>,
    /// Unsignaled requests since the last signaled one.
    tail: usize,
}

fn guard<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Ledger {
    /// Runs `post` when `signaled.len()` more send requests fit `depth`, and counts them
    /// if it succeeded; otherwise `QueueFull` and nothing is posted.
    pub fn post_sends(
        &self,
        signaled: &[bool],
        depth: usize,
        post: impl FnOnce() -> crate::Result<()>,
    ) -> crate::Result<()> {
        let mut sends = guard(&self.sends);
        if sends.outstanding + signaled.len() > depth {
            return Err(TransportError::QueueFull {
                queue: "send",
                depth,
            });
        }
        post()?;
        sends.outstanding += signaled.len();
        for &is_signaled in signaled {
            sends.tail += 1;
            if is_signaled {
                let run = std::mem::take(&mut sends.tail);
                sends.runs.push_back(run);
            }
        }
        Ok(())
    }

    /// Runs `post` when `count` more receive requests fit `depth`, and counts them if it
    /// succeeded; otherwise `QueueFull` and nothing is posted.
    pub fn post_receives(
        &self,
        count: usize,
        depth: usize,
        post: impl FnOnce() -> crate::Result<()>,
    ) -> crate::Result<()> {
        let mut receives = guard(&self.receives);
        if *receives + count > depth {
            return Err(TransportError::QueueFull {
                queue: "receive",
                depth,
            });
        }
        post()?;
        *receives += count;
        Ok(())
    }

    /// Whether an error completion of the queue pair was polled.
    pub fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Acquire)
    }

    /// Retires what one completion of this queue pair completed.
    fn complete(&self, completion: &WorkCompletion) {
        let receive = matches!(
            completion.opcode,
            WcOpcode::Recv | WcOpcode::RecvRdmaWithImm
        );
        if completion.status != WcStatus::Success {
            self.broken.store(true, Ordering::Release);
            *guard(&self.receives) = 0;
            *guard(&self.sends) = Sends::default();
        } else if receive {
            let mut receives = guard(&self.receives);
            *receives = receives.saturating_sub(1);
        } else {
            let mut sends = guard(&self.sends);
            let run = sends.runs.pop_front().unwrap_or(1);
            sends.outstanding = sends.outstanding.saturating_sub(run);
        }
    }
}

/// The ledgers of the queue pairs whose completions arrive on one completion queue.
#[derive(Debug, Default)]
pub(crate) struct Ledgers(Mutex<HashMap<u32, Arc<Ledger>>>);

impl Ledgers {
    /// Completions of queue pair `qpn` are counted into `ledger` from now on.
    pub fn register(&self, qpn: u32, ledger: Arc<Ledger>) {
        guard(&self.0).insert(qpn, ledger);
    }

    /// Forgets queue pair `qpn`.
    pub fn unregister(&self, qpn: u32) {
        guard(&self.0).remove(&qpn);
    }

    /// Counts polled completions.
    pub fn complete<'c>(&self, completions: impl IntoIterator<Item = &'c WorkCompletion>) {
        let ledgers = guard(&self.0);
        for completion in completions {
            if let Some(ledger) = ledgers.get(&completion.qpn) {
                ledger.complete(completion);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completion(opcode: WcOpcode, status: WcStatus) -> WorkCompletion {
        WorkCompletion {
            wr_id: 0,
            status,
            opcode,
            byte_len: 0,
            imm: None,
            qpn: 7,
        }
    }

    #[test]
    fn depth_counts_unsignaled_runs_until_their_signaled_completion() {
        let ledger = Arc::new(Ledger::default());
        let ledgers = Ledgers::default();
        ledgers.register(7, ledger.clone());
        let ok = || Ok(());
        ledger.post_sends(&[false, false, true], 4, ok).unwrap();
        assert!(matches!(
            ledger.post_sends(&[true, true], 4, ok),
            Err(TransportError::QueueFull { .. })
        ));
        ledger.post_sends(&[false], 4, ok).unwrap();
        ledgers.complete(&[completion(WcOpcode::Write, WcStatus::Success)]);
        ledger.post_sends(&[true, true, true], 4, ok).unwrap();
        assert!(
            ledger.post_sends(&[true], 4, ok).is_err(),
            "1 + 3 outstanding"
        );
        let refused = || Err(TransportError::InvalidArgument("x"));
        ledger.post_receives(2, 2, ok).unwrap();
        assert!(ledger.post_receives(1, 2, ok).is_err());
        ledgers.complete(&[completion(WcOpcode::Recv, WcStatus::Success)]);
        assert!(
            ledger.post_receives(1, 2, refused).is_err(),
            "a failed post"
        );
        ledger.post_receives(1, 2, ok).unwrap();
        assert!(!ledger.is_broken());
        ledgers.complete(&[completion(WcOpcode::Read, WcStatus::WrFlushError)]);
        assert!(
            ledger.is_broken(),
            "an error completion breaks the queue pair"
        );
        ledger.post_sends(&[true; 4], 4, ok).unwrap();
    }
}
