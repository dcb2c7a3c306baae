//! The change log of one instance's index: each committed batch becomes one
//! [`Record::Entries`] of the journal, with every entry turned into what outlives the
//! process ([`durable_entry`]).

use std::sync::{Arc, RwLock};

use kvcm_index::{Change, ChangeLog, IndexError, LogTicket};
use kvcm_storage::DurableAddress;

use super::record::{DurableEntry, ObjectName, Record};
use super::{JournalError, JournalSlot};
use crate::entry::{Entry, Location};
use crate::storages::Incarnations;
use crate::sync::{read_lock, write_lock};

/// Logs an instance's index batches to the manager's journal (nothing until it is open).
#[derive(Debug)]
pub(crate) struct InstanceLog {
    instance_id: Arc<str>,
    journal: JournalSlot,
    incarnations: Incarnations,
    /// Set when the instance is removed: later batches are not recorded. Appends hold it
    /// for reading across the check and the write, so closing waits for those in flight.
    closed: RwLock<bool>,
}

impl InstanceLog {
    /// The log of `instance_id`'s batches.
    pub fn new(instance_id: Arc<str>, journal: JournalSlot, incarnations: Incarnations) -> Self {
        InstanceLog {
            instance_id,
            journal,
            incarnations,
            closed: RwLock::new(false),
        }
    }

    /// Records nothing while closed (the instance is being removed; its removal record is
    /// the last word on its entries).
    pub fn set_closed(&self, closed: bool) {
        *write_lock(&self.closed) = closed;
    }
}

/// Ticket of a batch that was not logged (the journal was not open).
const UNLOGGED: LogTicket = LogTicket(0);

impl ChangeLog<Entry> for InstanceLog {
    fn append(&self, changes: &[Change<'_, Entry>]) -> Result<LogTicket, IndexError> {
        let Some(journal) = self.journal.get() else {
            return Ok(UNLOGGED);
        };
        let closed = read_lock(&self.closed);
        if *closed {
            return Ok(UNLOGGED);
        }
        let changes = changes
            .iter()
            .map(|(key, entry)| {
                (
                    *key,
                    entry.and_then(|e| durable_entry(e, &self.incarnations)),
                )
            })
            .collect();
        let record = Record::Entries {
            instance_id: self.instance_id.to_string(),
            changes,
        };
        journal.append(&record).map_err(index_error)
    }

    fn wait_durable(&self, ticket: LogTicket) -> Result<(), IndexError> {
        match self.journal.get() {
            Some(journal) if ticket != UNLOGGED => journal.wait(ticket).map_err(index_error),
            _ => Ok(()),
        }
    }
}

/// A journal error as the index reports it (a fenced write stays recognisable as one).
fn index_error(error: JournalError) -> IndexError {
    match error {
        JournalError::Fenced { token } => IndexError::Fenced { token },
        too_large @ JournalError::RecordTooLarge { .. } => {
            IndexError::InvalidArgument(too_large.to_string())
        }
        other => IndexError::Backend(other.to_string()),
    }
}

/// What of `entry` outlives the process: its locations on storages whose addresses survive
/// (as is, or named), with the names; `None` when no location does.
pub(crate) fn durable_entry(entry: &Entry, incarnations: &Incarnations) -> Option<DurableEntry> {
    let mut names: Vec<ObjectName> = Vec::new();
    let mut kept: Vec<Location> = Vec::with_capacity(entry.len());
    'locations: for location in entry.locations() {
        let Some(incarnation) = incarnations.get(location.storage) else {
            continue;
        };
        let mut location_names = Vec::new();
        for part in location.parts {
            match incarnation.backend.durable_address(part.address) {
                DurableAddress::AsIs => {}
                DurableAddress::Lost => continue 'locations,
                DurableAddress::Named(name) => {
                    let known = |n: &ObjectName| n.names(location.storage, part.address);
                    if !names.iter().chain(&location_names).any(known) {
                        location_names.push(ObjectName {
                            storage: location.storage,
                            object: part.address.object,
                            generation: part.address.generation,
                            name,
                        });
                    }
                }
            }
        }
        names.append(&mut location_names);
        kept.push(location.to_owned());
    }
    (!kept.is_empty()).then(|| DurableEntry {
        entry: Entry::new(kept),
        names,
    })
}
