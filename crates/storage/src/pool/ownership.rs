//! The ownership feed of an isolating node incarnation: which tenant holds which runs of
//! its region, passed to the node in heartbeat answers so that it gives each tenant access
//! to its own runs only, and the runs a tenant gave up kept out of use until the node said
//! it applied their release.
//!
//! The node tells, in each heartbeat, the last version it applied (0 at first); the answer
//! carries the changes after it, at most [`MAX_CHANGES`] at once, or — when the node is
//! behind the kept log, or names a version this feed never had — a snapshot: every owned
//! run as a grant, replacing all the node holds. Versions count changes from 1.
//!
//! Invariants: a released run is reclaimed (placeable for any tenant again) only once the
//! node applied a version at or after its release; replaying the changes of every answer
//! in order, snapshots replacing, gives the allocator's owned runs at that version.

use std::collections::VecDeque;

use crate::allocator::{OwnedRun, OwnershipChange, PoolAllocator};

/// Most changes one answer carries (a node further behind catches up over heartbeats).
pub const MAX_CHANGES: usize = 4096;
/// Most changes kept for nodes that are behind; older ones are answered by a snapshot.
const KEPT_CHANGES: usize = 65_536;

/// What a node is told about ownership in a heartbeat answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnershipUpdate {
    /// The version the node has applied once it applied this update.
    pub version: u64,
    /// `changes` is every owned run (as grants), replacing all the node holds.
    pub snapshot: bool,
    /// The changes, oldest first.
    pub changes: Vec<OwnershipChange>,
}

/// The feed of one node incarnation.
#[derive(Debug, Default)]
pub(crate) struct Feed {
    /// Version of the last change logged.
    version: u64,
    /// The latest changes with their versions, oldest first.
    log: VecDeque<(u64, OwnershipChange)>,
    /// Runs released and not reclaimed yet: (version of the release, offset), oldest first.
    releases: VecDeque<(u64, u64)>,
}

impl Feed {
    /// A feed over `allocator`, which reports ownership from now on: its first changes
    /// grant what it holds already (the adopted parts of a resumed incarnation).
    pub(crate) fn start(allocator: &mut PoolAllocator) -> Feed {
        allocator.report_ownership();
        Feed::default()
    }

    /// The answer to a node that applied version `applied`; first reclaims the runs whose
    /// release it applied.
    pub(crate) fn update(
        &mut self,
        allocator: &mut PoolAllocator,
        applied: u64,
    ) -> OwnershipUpdate {
        self.absorb(allocator);
        let known = applied <= self.version;
        while let Some(&(version, offset)) = self.releases.front() {
            if !known || version > applied {
                break;
            }
            allocator.reclaim(offset);
            self.releases.pop_front();
        }
        let oldest = self.log.front().map_or(self.version + 1, |&(v, _)| v);
        if known && applied + 1 >= oldest {
            let after = (applied + 1 - oldest) as usize;
            let changes: Vec<(u64, OwnershipChange)> = self
                .log
                .iter()
                .skip(after)
                .take(MAX_CHANGES)
                .copied()
                .collect();
            return OwnershipUpdate {
                version: changes.last().map_or(applied, |&(version, _)| version),
                snapshot: false,
                changes: changes.into_iter().map(|(_, change)| change).collect(),
            };
        }
        OwnershipUpdate {
            version: self.version,
            snapshot: true,
            changes: allocator
                .owned_runs()
                .map(OwnershipChange::Granted)
                .collect(),
        }
    }

    /// Logs the changes `allocator` recorded since the last call.
    fn absorb(&mut self, allocator: &mut PoolAllocator) {
        for change in allocator.take_changes() {
            self.version += 1;
            if let OwnershipChange::Released(OwnedRun { offset, .. }) = change {
                self.releases.push_back((self.version, offset));
            }
            self.log.push_back((self.version, change));
            if self.log.len() > KEPT_CHANGES {
                self.log.pop_front();
            }
        }
    }
}
