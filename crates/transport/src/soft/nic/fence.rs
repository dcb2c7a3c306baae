//! Deregistration as a fence: once a registration with remote rights is withdrawn, no
//! inbound link touches its bytes again.
//!
//! The registry stops resolving a key at once, but an inbound link may still hold bytes it
//! resolved before: a large WRITE's payload being placed as it arrives, a large READ's
//! answer queued by reference until the socket takes it. Whoever withdraws a remote
//! registration posts its [`Span`] here and waits; the NIC thread, between two rounds (a
//! key a round resolved is used only within that round, except by those two), cuts every
//! inbound link still holding a byte of a posted span — its queue pair enters the error
//! state, as a hardware NIC breaks a queue pair on an access fault — and then lets the
//! waiters go.
//!
//! Links are matched by the bytes they hold, not by key: a link holding the same bytes under
//! another registration (of another protection domain, or made after the withdrawal) is
//! cut too — more than needed, never less.
//!
//! Invariant: when [`Fence::wait`] returns for a span, no inbound link holds its memory,
//! and the registry resolves it for no one. A NIC thread that stops (or dies) releases
//! every waiter, present and future: with no thread, no link moves bytes.

use crate::soft::registry::Span;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

/// Spans withdrawn and not yet fenced off, shared by withdrawers and the NIC thread.
#[derive(Debug, Default)]
pub(crate) struct Fence {
    state: Mutex<State>,
    passed: Condvar,
    /// Set while `state.spans` is not empty (read by the NIC without locking).
    pending: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    /// Spans posted so far (the last one's ticket).
    posted: u64,
    /// Tickets up to this one are fenced off.
    passed: u64,
    /// Spans posted and not yet taken by the NIC.
    spans: Vec<Span>,
    /// The NIC thread is gone.
    closed: bool,
}

impl Fence {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Posts a withdrawn span; returns the ticket to wait for.
    pub(crate) fn post(&self, span: Span) -> u64 {
        let mut state = self.state();
        state.posted += 1;
        state.spans.push(span);
        // SeqCst pairs with the NIC's park: it sets `parked`, then reads this.
        self.pending.store(true, Ordering::SeqCst);
        state.posted
    }

    /// Blocks until the NIC fenced off `ticket` (or is gone).
    pub(crate) fn wait(&self, ticket: u64) {
        let mut state = self.state();
        while state.passed < ticket && !state.closed {
            state = self
                .passed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Whether spans wait to be fenced off.
    pub(crate) fn pending(&self) -> bool {
        self.pending.load(Ordering::SeqCst)
    }

    /// The NIC's side: the spans posted so far and the ticket that covers them.
    pub(crate) fn take(&self) -> (u64, Vec<Span>) {
        let mut state = self.state();
        self.pending.store(false, Ordering::SeqCst);
        (state.posted, std::mem::take(&mut state.spans))
    }

    /// The NIC's side: every span up to `ticket` is fenced off.
    pub(crate) fn pass(&self, ticket: u64) {
        let mut state = self.state();
        state.passed = state.passed.max(ticket);
        self.passed.notify_all();
    }

    /// The NIC's side: the thread is gone; no waiter waits any longer.
    pub(crate) fn close(&self) {
        self.state().closed = true;
        self.passed.notify_all();
    }
}
