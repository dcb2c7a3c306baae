//! The per-reporter gate that serialises a snapshot against deltas (ADD / DELETE): a
//! snapshot closes the gate to new deltas, waits for the admitted ones to finish, runs
//! alone, and reopens it; a delta arriving meanwhile waits for the snapshot. Both waits are
//! bounded by the storage's `snapshot_delta_drain_timeout_ms`; a second snapshot while one
//! runs is refused at once.
//!
//! Invariant: while a [`SnapshotTurn`] lives no [`DeltaTurn`] does, and at most one
//! [`SnapshotTurn`] lives. Turns release on drop, so a panic cannot leave the gate shut.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

use crate::sync::lock;

/// Why a turn was not granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateRefusal {
    /// Another snapshot runs.
    SnapshotRunning,
    /// The wait for the other side exceeded the drain timeout.
    TimedOut,
}

#[derive(Debug, Default)]
struct Turns {
    deltas: usize,
    snapshot: bool,
}

/// One reporter's gate.
#[derive(Debug, Default)]
pub struct Gate {
    turns: Mutex<Turns>,
    changed: Condvar,
}

/// A delta's admission; released on drop.
#[derive(Debug)]
pub struct DeltaTurn<'g>(&'g Gate);

/// A snapshot's exclusive turn; released on drop.
#[derive(Debug)]
pub struct SnapshotTurn<'g>(&'g Gate);

impl Gate {
    /// Admits a delta once no snapshot runs, waiting at most `timeout`.
    pub fn delta(&self, timeout: Duration) -> Result<DeltaTurn<'_>, GateRefusal> {
        let turns = lock(&self.turns);
        let (mut turns, waited) = self
            .changed
            .wait_timeout_while(turns, timeout, |turns| turns.snapshot)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if waited.timed_out() && turns.snapshot {
            return Err(GateRefusal::TimedOut);
        }
        turns.deltas += 1;
        Ok(DeltaTurn(self))
    }

    /// Closes the gate and waits at most `timeout` for the admitted deltas; refused at once
    /// when another snapshot runs.
    pub fn snapshot(&self, timeout: Duration) -> Result<SnapshotTurn<'_>, GateRefusal> {
        let mut turns = lock(&self.turns);
        if turns.snapshot {
            return Err(GateRefusal::SnapshotRunning);
        }
        turns.snapshot = true;
        let (mut turns, waited) = self
            .changed
            .wait_timeout_while(turns, timeout, |turns| turns.deltas > 0)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if waited.timed_out() && turns.deltas > 0 {
            turns.snapshot = false;
            drop(turns);
            self.changed.notify_all();
            return Err(GateRefusal::TimedOut);
        }
        Ok(SnapshotTurn(self))
    }
}

impl Drop for DeltaTurn<'_> {
    fn drop(&mut self) {
        lock(&self.0.turns).deltas -= 1;
        self.0.changed.notify_all();
    }
}

impl Drop for SnapshotTurn<'_> {
    fn drop(&mut self) {
        lock(&self.0.turns).snapshot = false;
        self.0.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::thread;

    const SHORT: Duration = Duration::from_millis(30);
    const LONG: Duration = Duration::from_secs(30);

    #[test]
    fn a_snapshot_waits_for_admitted_deltas_and_gives_up_after_the_timeout() {
        let gate = Gate::default();
        let delta = gate.delta(SHORT).expect("open gate");
        assert_eq!(gate.snapshot(SHORT).err(), Some(GateRefusal::TimedOut));
        // The failed snapshot reopened the gate.
        let second = gate.delta(SHORT).expect("reopened");
        drop((delta, second));
        let turn = gate.snapshot(SHORT).expect("drained");
        assert_eq!(
            gate.snapshot(LONG).err(),
            Some(GateRefusal::SnapshotRunning)
        );
        assert_eq!(gate.delta(SHORT).err(), Some(GateRefusal::TimedOut));
        drop(turn);
        assert!(gate.delta(SHORT).is_ok());
    }

    #[test]
    fn a_waiting_snapshot_runs_when_the_last_delta_ends_and_deltas_wait_for_it() {
        let gate = Gate::default();
        let delta = gate.delta(SHORT).expect("open gate");
        let (started, snapshot_began) = mpsc::channel();
        thread::scope(|scope| {
            let snapshot = scope.spawn(|| {
                let turn = gate.snapshot(LONG);
                started.send(()).expect("send");
                turn.map(drop)
            });
            // Wait until the snapshot has closed the gate: a new delta then times out.
            while gate.delta(Duration::ZERO).map(drop).is_ok() {
                thread::yield_now();
            }
            assert!(snapshot_began.try_recv().is_err(), "still draining");
            drop(delta);
            assert_eq!(snapshot.join().expect("joined"), Ok(()));
        });
        assert!(gate.delta(SHORT).is_ok());
    }
}
