//! The hook a write-ahead log plugs into an index: every committed batch is handed to a
//! [`ChangeLog`] while the batch's keys are still locked, and the writer waits for the log's
//! durability only after the locks are released.
//!
//! Invariants a backend keeps with a change log attached:
//! - `append` is called once per batch that changes anything, after every check that can
//!   refuse the batch (the key cap) and before memory changes; a refused `append` leaves the
//!   index unchanged and the write fails with its error;
//! - per key, appends happen in the order the key's values change in memory (the key is
//!   locked across both), so replaying the log in append order ends in the memory state;
//! - `wait_durable` is called after the locks are released: a slow disk holds up only the
//!   writers of that batch, and concurrent batches share one flush (group commit).
//!
//! Readers may observe a change before it is durable (it is in memory first); a write call
//! returns only once its change is.

use crate::{BlockKey, IndexError};

/// Which append a writer waits for: log positions grow with each append.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct LogTicket(pub u64);

/// One change of a batch: the key's new value, `None` for a removal.
pub type Change<'a, V> = (BlockKey, Option<&'a V>);

/// Where an index records its committed changes.
pub trait ChangeLog<V>: Send + Sync {
    /// Records one batch (under the batch's locks); refuses when the log cannot take it.
    fn append(&self, changes: &[Change<'_, V>]) -> Result<LogTicket, IndexError>;
    /// Returns once the append of `ticket` — and so every earlier append — is durable (or
    /// fails when it cannot become so).
    fn wait_durable(&self, ticket: LogTicket) -> Result<(), IndexError>;
}
