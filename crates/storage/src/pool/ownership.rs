//! The ownership feed of an isolating node incarnation: which tenant holds which runs of
//! its region, passed to the node in heartbeat answers so that it gives each tenant access
//! to its own runs only, and the runs a tenant gave up kept out of use until the node said
//! it applied their release.
//!
//! Each feed has a random id; versions count its changes from 1. The node tells, in each
//! heartbeat, the feed and the last version of it it applied ([`Applied`]; nothing at
//! first); the answer carries the changes after it, at most [`MAX_CHANGES`] at once, or —
//! when the node names another feed (a manager restarted while the node kept its region:
//! the versions it applied were another process's), a version this feed has not reached,
//! or one older than the kept log — a snapshot: every owned run as a grant, replacing all
//! the node holds. A snapshot is not paged: it lists every owned run (a 1 TiB region holds
//! at most 524,288 runs of 2 MiB).
//!
//! Invariants: a released run is reclaimed (placeable for any tenant again) only once the
//! node applied a version of this feed at or after its release; replaying the changes of
//! every answer in order, snapshots replacing, gives the allocator's owned runs at that
//! version.

use std::collections::VecDeque;

use crate::allocator::{OwnedRun, OwnershipChange, PoolAllocator};

/// Most changes one answer carries (a node further behind catches up over heartbeats).
pub const MAX_CHANGES: usize = 4096;
/// Most changes kept for nodes that are behind; older ones are answered by a snapshot.
const KEPT_CHANGES: usize = 65_536;

/// What a node says it applied: a feed's id (0: none) and the last version of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Applied {
    /// The feed.
    pub feed: u64,
    /// The version.
    pub version: u64,
}

/// What a node is told about ownership in a heartbeat answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnershipUpdate {
    /// The feed's id.
    pub feed: u64,
    /// The version the node has applied once it applied this update.
    pub version: u64,
    /// `changes` is every owned run (as grants), replacing all the node holds.
    pub snapshot: bool,
    /// The changes, oldest first.
    pub changes: Vec<OwnershipChange>,
}

/// The feed of one node incarnation.
#[derive(Debug)]
pub(crate) struct Feed {
    /// Random, never 0.
    id: u64,
    /// Version of the last change logged.
    version: u64,
    /// The latest changes with their versions, oldest first.
    log: VecDeque<(u64, OwnershipChange)>,
    /// Runs released and not reclaimed yet: (version of the release, offset), oldest first.
    releases: VecDeque<(u64, u64)>,
    /// Most changes per answer, and kept ([`MAX_CHANGES`], [`KEPT_CHANGES`]; smaller in
    /// tests).
    limits: (usize, usize),
}

impl Feed {
    /// A feed over `allocator`, which reports ownership from now on: its first changes
    /// grant what it holds already (the adopted parts of a resumed incarnation).
    pub(crate) fn start(allocator: &mut PoolAllocator) -> Feed {
        Feed::with_limits(allocator, (MAX_CHANGES, KEPT_CHANGES))
    }

    fn with_limits(allocator: &mut PoolAllocator, limits: (usize, usize)) -> Feed {
        allocator.report_ownership();
        Feed {
            id: fastrand::u64(1..),
            version: 0,
            log: VecDeque::new(),
            releases: VecDeque::new(),
            limits,
        }
    }

    /// The answer to a node that applied `applied`; first reclaims the runs whose release
    /// it applied.
    pub(crate) fn update(
        &mut self,
        allocator: &mut PoolAllocator,
        applied: Applied,
    ) -> OwnershipUpdate {
        self.absorb(allocator);
        let known = applied.feed == self.id && applied.version <= self.version;
        if !known {
            return self.snapshot(allocator);
        }
        let applied = applied.version;
        while let Some(&(version, offset)) = self.releases.front() {
            if version > applied {
                break;
            }
            allocator.reclaim(offset);
            self.releases.pop_front();
        }
        let oldest = self.log.front().map_or(self.version + 1, |&(v, _)| v);
        if applied + 1 < oldest {
            return self.snapshot(allocator);
        }
        let after = (applied + 1 - oldest) as usize;
        let sent = self.log.iter().skip(after).take(self.limits.0);
        let changes: Vec<(u64, OwnershipChange)> = sent.copied().collect();
        OwnershipUpdate {
            feed: self.id,
            version: changes.last().map_or(applied, |&(version, _)| version),
            snapshot: false,
            changes: changes.into_iter().map(|(_, change)| change).collect(),
        }
    }

    /// Every owned run now, as of the last version.
    fn snapshot(&self, allocator: &PoolAllocator) -> OwnershipUpdate {
        OwnershipUpdate {
            feed: self.id,
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
            if self.log.len() > self.limits.1 {
                self.log.pop_front();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::SLAB_BYTES;

    /// Applies `update` to `held` (offset → run) as a node does.
    fn apply(held: &mut std::collections::BTreeMap<u64, OwnedRun>, update: &OwnershipUpdate) {
        if update.snapshot {
            held.clear();
        }
        for change in &update.changes {
            match *change {
                OwnershipChange::Granted(run) => held.insert(run.offset, run),
                OwnershipChange::Released(run) => held.remove(&run.offset),
            };
        }
    }

    #[test]
    fn answers_page_trimmed_logs_and_other_feeds_get_snapshots_and_releases_wait() {
        let mut allocator = PoolAllocator::new(16 * SLAB_BYTES).unwrap();
        let mut feed = Feed::with_limits(&mut allocator, (3, 5));
        let offsets: Vec<u64> = (0..8)
            .map(|tenant| allocator.allocate(tenant, SLAB_BYTES).unwrap())
            .collect();
        // 8 grants, 5 kept: a node that applied nothing of this feed gets a snapshot.
        let mut held = std::collections::BTreeMap::new();
        let first = feed.update(&mut allocator, Applied::default());
        assert!(first.snapshot);
        assert_eq!((first.version, first.changes.len()), (8, 8));
        apply(&mut held, &first);
        allocator.free(offsets[0]).unwrap();
        allocator.free(offsets[1]).unwrap();
        let at = |version| Applied {
            feed: first.feed,
            version,
        };
        // The releases, versions 9 and 10.
        let released = feed.update(&mut allocator, at(8));
        assert_eq!((released.snapshot, released.version), (false, 10));
        apply(&mut held, &released);
        assert_eq!(
            allocator.stats().held_bytes,
            2 * SLAB_BYTES,
            "until 10 is applied"
        );
        for tenant in 8..12 {
            let offset = allocator.allocate(tenant, SLAB_BYTES).unwrap();
            assert!(offset >= 2 * SLAB_BYTES, "a held run is placed for no one");
        }
        let page = feed.update(&mut allocator, at(10));
        assert_eq!(
            (page.version, page.changes.len()),
            (13, 3),
            "3 of the 4 grants"
        );
        apply(&mut held, &page);
        assert_eq!(
            allocator.stats().held_bytes,
            0,
            "10 applied: 0 and 1 reclaimed"
        );
        let rest = feed.update(&mut allocator, at(13));
        apply(&mut held, &rest);
        assert_eq!(rest.version, 14);
        let owned: Vec<OwnedRun> = allocator.owned_runs().collect();
        assert_eq!(held.values().copied().collect::<Vec<_>>(), owned);
        // Behind the kept log, past the feed's version, or another feed: a snapshot, and a
        // release not reclaimed on a version of another feed.
        allocator.free(offsets[2]).unwrap();
        for stale in [
            at(3),
            at(99),
            Applied {
                feed: first.feed ^ 1,
                version: 15,
            },
        ] {
            let update = feed.update(&mut allocator, stale);
            assert!(update.snapshot, "{stale:?}");
            assert_eq!(update.version, 15);
            assert_eq!(update.changes.len(), owned.len() - 1);
            assert_eq!(allocator.stats().held_bytes, SLAB_BYTES, "{stale:?}");
        }
        let current = feed.update(&mut allocator, at(15));
        assert!(!current.snapshot && current.changes.is_empty());
        assert_eq!(allocator.stats().held_bytes, 0);
    }
}
