//! Soft completion queue: a locked FIFO plus an eventfd that is rung only when armed.
//!
//! Invariant: while `armed` is set or completions are queued after an `arm`, the eventfd
//! is readable; pushing never makes a syscall unless a waiter armed the queue.
//!
//! Manual progress: the queue knows the wires whose completions it receives
//! ([`Progress`] drivers, held weakly). A `poll` that finds the queue empty drives them
//! itself before answering, so a busy-polling application completes its requests without
//! waiting for the NIC thread to be scheduled. The NIC thread keeps driving them too, so a
//! queue nobody polls still fills.

use crate::sys::EventFd;
use crate::{CompletionQueue, Result, WorkCompletion};
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, TryLockError, Weak};

/// Work a thread polling a completion queue may drive itself instead of the NIC thread.
pub(crate) trait Progress: Send + Sync + std::fmt::Debug {
    /// Moves what can move without blocking (never waits for a lock); true if it did.
    fn progress(&self) -> bool;

    /// The poller is about to sleep: the NIC thread takes the work back at once.
    fn release(&self);
}

/// State shared by the application handle and the NIC.
#[derive(Debug)]
pub(crate) struct CqShared {
    queue: Mutex<VecDeque<WorkCompletion>>,
    armed: AtomicBool,
    event: EventFd,
    /// Wires whose completions land here; dead ones are pruned when one is added.
    drivers: Mutex<Vec<Weak<dyn Progress>>>,
}

impl CqShared {
    /// Appends a completion and rings the eventfd when a waiter armed it.
    pub(crate) fn push(&self, completion: WorkCompletion) {
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back(completion);
        if self.armed.load(Ordering::SeqCst) && self.armed.swap(false, Ordering::SeqCst) {
            self.event.ring();
        }
    }

    /// Lets pollers of this queue drive `driver`.
    pub(crate) fn add_driver(&self, driver: Weak<dyn Progress>) {
        let mut drivers = self.drivers.lock().unwrap_or_else(PoisonError::into_inner);
        drivers.retain(|known| known.strong_count() > 0);
        drivers.push(driver);
    }

    /// Drives every live driver unless another poller is doing so; true if one moved.
    fn drive(&self) -> bool {
        let drivers = match self.drivers.try_lock() {
            Ok(drivers) => drivers,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return false,
        };
        let mut moved = false;
        for driver in drivers.iter().filter_map(Weak::upgrade) {
            moved |= driver.progress();
        }
        moved
    }

    /// Hands every driver back to the NIC thread (a waiter armed the queue).
    fn release_drivers(&self) {
        let drivers = self.drivers.lock().unwrap_or_else(PoisonError::into_inner);
        drivers
            .iter()
            .filter_map(Weak::upgrade)
            .for_each(|driver| driver.release());
    }

    fn drain(&self, out: &mut [WorkCompletion]) -> usize {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        crate::api::drain_completions(&mut queue, out)
    }

    fn is_empty(&self) -> bool {
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }
}

/// A completion queue of the soft provider.
#[derive(Clone, Debug)]
pub struct SoftCq {
    pub(crate) shared: Arc<CqShared>,
}

impl SoftCq {
    pub(crate) fn new() -> Result<Self> {
        let shared = CqShared {
            queue: Mutex::new(VecDeque::new()),
            armed: AtomicBool::new(false),
            event: EventFd::new()?,
            drivers: Mutex::default(),
        };
        Ok(SoftCq {
            shared: Arc::new(shared),
        })
    }
}

impl CompletionQueue for SoftCq {
    fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        match self.shared.drain(out) {
            0 if self.shared.drive() => self.shared.drain(out),
            found => found,
        }
    }

    fn arm(&self) -> Result<bool> {
        self.shared.release_drivers();
        self.shared.event.drain();
        self.shared.armed.store(true, Ordering::SeqCst);
        if self.shared.is_empty() {
            return Ok(false);
        }
        if self.shared.armed.swap(false, Ordering::SeqCst) {
            self.shared.event.ring();
        }
        Ok(true)
    }

    fn event_fd(&self) -> RawFd {
        self.shared.event.raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::poll_readable;
    use crate::{WcOpcode, WcStatus};
    use std::time::Duration;

    fn completion(wr_id: u64) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            byte_len: 0,
            imm: None,
            qpn: 1,
        }
    }

    #[test]
    fn poll_returns_completions_in_order() {
        let cq = SoftCq::new().unwrap();
        (1..=3).for_each(|id| cq.shared.push(completion(id)));
        let mut out = [completion(0); 2];
        assert_eq!(cq.poll(&mut out), 2);
        assert_eq!((out[0].wr_id, out[1].wr_id), (1, 2));
        assert_eq!(cq.poll(&mut out), 1);
        assert_eq!(out[0].wr_id, 3);
        assert_eq!(cq.poll(&mut out), 0);
    }

    #[test]
    fn wait_wakes_on_a_push_from_another_thread_and_times_out_when_empty() {
        let cq = SoftCq::new().unwrap();
        assert!(!cq.wait(Duration::from_millis(5)).unwrap());
        let pusher = {
            let shared = Arc::clone(&cq.shared);
            std::thread::spawn(move || shared.push(completion(9)))
        };
        assert!(cq.wait(Duration::from_secs(10)).unwrap());
        pusher.join().unwrap();
    }

    /// A wire that completes one request per drive, with `pending` requests left.
    #[derive(Debug)]
    struct FakeWire {
        cq: Arc<CqShared>,
        pending: Mutex<u64>,
        released: AtomicBool,
    }

    impl Progress for FakeWire {
        fn progress(&self) -> bool {
            let mut pending = self.pending.lock().unwrap();
            if *pending == 0 {
                return false;
            }
            self.cq.push(completion(*pending));
            *pending -= 1;
            true
        }

        fn release(&self) {
            self.released.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn an_empty_poll_drives_the_wires_and_arm_hands_them_back() {
        let cq = SoftCq::new().unwrap();
        let wire = Arc::new(FakeWire {
            cq: Arc::clone(&cq.shared),
            pending: Mutex::new(2),
            released: AtomicBool::new(false),
        });
        cq.shared
            .add_driver(Arc::downgrade(&wire) as Weak<dyn Progress>);
        let mut out = [completion(0); 4];
        assert_eq!(cq.poll(&mut out), 1, "the poll itself completed one");
        assert_eq!(out[0].wr_id, 2);
        assert_eq!(cq.poll(&mut out), 1);
        assert_eq!(cq.poll(&mut out), 0, "nothing left to drive");
        assert!(!wire.released.load(Ordering::SeqCst));
        assert!(!cq.arm().unwrap());
        assert!(
            wire.released.load(Ordering::SeqCst),
            "arm hands the wire back"
        );
        drop(wire);
        assert_eq!(cq.poll(&mut out), 0, "a dropped wire is skipped");
    }

    #[test]
    fn armed_event_fd_is_readable_once_a_completion_arrives() {
        let cq = SoftCq::new().unwrap();
        assert!(!cq.arm().unwrap());
        assert_eq!(poll_readable(&[cq.event_fd()], 0).unwrap(), 0);
        cq.shared.push(completion(1));
        assert_eq!(poll_readable(&[cq.event_fd()], 0).unwrap(), 1);
        assert!(cq.arm().unwrap(), "arming with completions queued says so");
        assert_eq!(poll_readable(&[cq.event_fd()], 0).unwrap(), 1);
    }
}
