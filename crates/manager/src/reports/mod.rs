//! Reported locations (upstream trunk's ReportEvent): cache subscribers — engines, Vineyard —
//! report which blocks they hold, under a reporter identity `instance + tier + host`; queries
//! count them per host (GetHostCacheState) or answer them per key
//! (GetCacheLocationsByBackend).
//!
//! A reporter's state lives in this process only, as upstream keeps it: a restart forgets
//! every reporter, and the next valid event of each starts it anew (no REGISTER needed).
//! The tiers' timings come from the event-report storages the instance's group lists in
//! `event_report_storage_candidates` (at most one per tier).
//!
//! Invariants:
//! - one request is applied event by event, in order; an event either takes full effect or
//!   none (its item result says which);
//! - a snapshot runs alone among its reporter's mutations ([`gate`]); different reporters
//!   never wait for each other;
//! - a query sees a reporter only while it is live and within its heartbeat timeout; past
//!   timeout + cleanup grace the reporter is unregistered (checked when its reporter or
//!   any query of its instance touches it, and by the background [`sweep`]);
//! - at most [`MAX_MEDIUMS`] mediums: registered by one reporter, holding one block of one
//!   reporter, and named by one GetHostCacheState — so no check or query scans a list a
//!   client can grow without bound.

mod by_backend;
mod gate;
mod host_state;
mod in_lookup;
mod reporter;
mod request;
mod sweep;
#[cfg(test)]
mod tests;
mod uri;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Instant;

use kvcm_index::BlockKey;
use kvcm_storage::{ReportTier, ReportTimings, StorageSpec};

use crate::error::{ManagerError, ManagerResult};

/// Most mediums a reporter registers, one block is reported on by one reporter, and one
/// GetHostCacheState names.
pub const MAX_MEDIUMS: usize = 64;
use crate::instance::Instance;
use crate::sync::{lock, read_lock, write_lock};
use crate::Manager;

pub use by_backend::{BackendQuery, BackendSelector, ChosenLocation, SelectStrategy};
pub use host_state::{HostCacheState, HostMatch, HostStateQuery};
pub(crate) use in_lookup::{ReportedChoice, ReportedLocation, ReportedSources};

use gate::Gate;
use reporter::ReporterState;
pub(crate) use sweep::spawn_reporter_sweep;

/// One spec of a reported block, as the reporter sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportedSpec {
    /// Spec name (must be registered by the instance).
    pub name: String,
    /// The reporter's URI (kvcm appends `s_version`).
    pub uri: String,
}

/// A block on one medium with its specs (ADD, and each item of a SNAPSHOT).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportedBlock {
    /// The block key.
    pub key: BlockKey,
    /// The medium (`gpu`, `memory`, `disk`, …).
    pub medium: String,
    /// Its specs.
    pub specs: Vec<ReportedSpec>,
}

/// One event of a ReportEvent request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReportEvent {
    /// EVENT_NODE_REGISTER.
    Register {
        /// Mediums the reporter declares.
        mediums: Vec<String>,
    },
    /// EVENT_HEARTBEAT.
    Heartbeat,
    /// EVENT_BLOCK_ADD.
    Add(ReportedBlock),
    /// EVENT_BLOCK_DELETE.
    Delete {
        /// The block key.
        key: BlockKey,
        /// The medium.
        medium: String,
        /// Spec names to remove.
        spec_names: Vec<String>,
    },
    /// EVENT_BLOCK_SNAPSHOT: the reporter's complete block set.
    Snapshot(Vec<ReportedBlock>),
    /// EVENT_HOST_DOWN.
    HostDown,
    /// An item the edge could not read (type and payload disagree, a bad block key): its
    /// result is INVALID_ARGUMENT with this reason.
    Unreadable(String),
}

/// The result of one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ItemResult {
    /// Applied.
    Ok,
    /// Refused, nothing changed: the reason.
    Invalid(String),
    /// The reporter is tombstoned in this process: REGISTER first.
    NotRegistered,
    /// Another snapshot runs, or the wait for the other side timed out.
    SnapshotInProgress,
    /// A successful snapshot was too recent.
    RateLimited {
        /// How long until a snapshot is accepted.
        retry_after_ms: u64,
    },
    /// The reporter's lifecycle changed while the snapshot waited.
    SnapshotRequired,
}

/// One ReportEvent request (the instance is passed beside it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportRequest {
    /// Which tier reports.
    pub tier: ReportTier,
    /// The reporter's `host:port` (no `#`).
    pub host: String,
    /// Its events, in order (non-empty).
    pub events: Vec<ReportEvent>,
}

/// What a ReportEvent request did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportOutcome {
    /// One result per event.
    pub results: Vec<ItemResult>,
    /// The reporter's generation after the request (`None`: none, e.g. after HOST_DOWN).
    pub generation: Option<u128>,
    /// True while the reporter has no generation, and on the request that created one by a
    /// delta; false after a successful snapshot.
    pub snapshot_required: bool,
    /// The group's `extra_info`.
    pub extra_info: String,
}

/// One reporter: its gate and its state.
#[derive(Debug)]
pub(crate) struct Reporter {
    gate: Gate,
    state: Mutex<ReporterState>,
}

/// Reporters of one instance, by host then tier (the order ties are broken in).
type InstanceReporters = BTreeMap<(String, ReportTier), Arc<Reporter>>;

/// One reporter with its identity within its instance.
pub(crate) type ReporterEntry = ((String, ReportTier), Arc<Reporter>);

/// The states of `reporters` a query sees at `now`, locked, in their order: those of a tier
/// that has `timings` (an enabled storage), expired first, kept while available.
fn lock_available(
    reporters: &[ReporterEntry],
    timings: impl Fn(ReportTier) -> Option<ReportTimings>,
    now: Instant,
) -> Vec<(&str, ReportTier, MutexGuard<'_, ReporterState>)> {
    let mut available = Vec::with_capacity(reporters.len());
    for ((host, tier), reporter) in reporters {
        let Some(timings) = timings(*tier) else {
            continue;
        };
        let mut state = lock(&reporter.state);
        state.expire(now, &timings);
        if state.available(now, &timings) {
            available.push((host.as_str(), *tier, state));
        }
    }
    available
}

/// Every reporter of the process.
#[derive(Debug, Default)]
pub struct Reports {
    by_instance: RwLock<HashMap<Arc<str>, InstanceReporters>>,
}

impl Reports {
    /// The reporter of an identity, created fresh when new — unless the instance already
    /// has `limit` reporters (REACH_MAX_ENTITY_CAPACITY naming the key). The flag is true
    /// when it is the instance's first reporter.
    fn reporter(
        &self,
        instance: &Arc<str>,
        tier: ReportTier,
        host: &str,
        limit: usize,
    ) -> ManagerResult<(Arc<Reporter>, bool)> {
        let id = (host.to_string(), tier);
        let known = read_lock(&self.by_instance)
            .get(instance)
            .and_then(|r| r.get(&id))
            .cloned();
        if let Some(found) = known {
            return Ok((found, false));
        }
        let mut all = write_lock(&self.by_instance);
        let reporters = all.entry(instance.clone()).or_default();
        if !reporters.contains_key(&id) && reporters.len() >= limit {
            return Err(ManagerError::Capacity(format!(
                "instance {instance:?} has {limit} reporters (kvcm.service.max_reporters_per_instance)"
            )));
        }
        let first = reporters.is_empty();
        let reporter = reporters.entry(id).or_insert_with(|| {
            Arc::new(Reporter {
                gate: Gate::default(),
                state: Mutex::new(ReporterState::fresh()),
            })
        });
        Ok((reporter.clone(), first))
    }

    /// Whether the instance has a reporter (in any state).
    fn knows_instance(&self, instance: &str) -> bool {
        read_lock(&self.by_instance)
            .get(instance)
            .is_some_and(|reporters| !reporters.is_empty())
    }

    /// The reporters of an instance, by host then tier.
    fn of_instance(&self, instance: &str) -> Vec<ReporterEntry> {
        read_lock(&self.by_instance)
            .get(instance)
            .map(|reporters| {
                let pairs = reporters.iter();
                pairs.map(|(id, r)| (id.clone(), r.clone())).collect()
            })
            .unwrap_or_default()
    }

    /// Forgets an instance's reporters (RemoveInstance).
    pub(crate) fn forget_instance(&self, instance: &str) {
        write_lock(&self.by_instance).remove(instance);
    }
}

impl Manager {
    /// The timings of the event-report storage of `tier` that the instance's group lists;
    /// INSTANCE_NOT_EXIST when it lists none (as upstream answers).
    fn report_timings(
        &self,
        instance: &Instance,
        tier: ReportTier,
    ) -> ManagerResult<ReportTimings> {
        self.listed_report_timings(instance, tier).ok_or_else(|| {
            ManagerError::NoReportStorage(format!(
                "the group {1:?} of instance {0:?} lists no registered event-report storage of tier {tier:?} in event_report_storage_candidates",
                instance.id(),
                instance.group()
            ))
        })
    }

    /// As [`Manager::report_timings`], `None` when absent or disabled by the admin (a
    /// disabled event-report storage takes no reports and its reporters are hidden).
    fn listed_report_timings(
        &self,
        instance: &Instance,
        tier: ReportTier,
    ) -> Option<ReportTimings> {
        let group = self.shared_group(instance.group())?;
        let listed = self
            .storages
            .statuses(&group.event_report_storage_candidates);
        listed
            .into_iter()
            .find_map(|(config, available)| match config.spec {
                StorageSpec::EventReport {
                    tier: listed,
                    timings,
                } if listed == tier && available => Some(timings),
                _ => None,
            })
    }
}
