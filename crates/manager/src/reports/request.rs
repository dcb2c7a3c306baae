//! ReportEvent: the request rules (which events may share a request, what each event must
//! carry) and the application of each event to its reporter.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use kvcm_index::BlockKey;

use kvcm_storage::ReportTimings;

use super::gate::GateRefusal;
use super::reporter::Lifecycle;
use super::{
    uri, ItemResult, ReportEvent, ReportOutcome, ReportRequest, ReportedBlock, Reporter,
    MAX_MEDIUMS,
};
use crate::error::{ManagerError, ManagerResult};
use crate::instance::Instance;
use crate::sync::lock;
use crate::Manager;

impl Manager {
    /// Applies a ReportEvent request of `instance` (non-empty `events`). The whole request
    /// is refused before any effect when its shape is wrong (a SNAPSHOT beside ADD / DELETE,
    /// two SNAPSHOTs, HOST_DOWN beside anything, a bad host); otherwise each event has its
    /// own result.
    pub fn report_event(
        &self,
        instance: &Instance,
        request: &ReportRequest,
    ) -> ManagerResult<ReportOutcome> {
        check_shape(request)?;
        let timings = self.report_timings(instance, request.tier)?;
        let extra_info = self
            .shared_group(instance.group())
            .map(|group| group.extra_info.clone())
            .unwrap_or_default();
        let limit = self.limits.max_reporters_per_instance;
        let (reporter, first) =
            self.reports
                .reporter(instance.id(), request.tier, &request.host, limit)?;
        if first {
            // The lookup table marks the instance as reported for before any report of it
            // is applied, so no fast-path answer misses one (docs/lookup-table.md).
            self.published_storages_changed();
        }
        let arrival_generation = {
            let mut state = lock(&reporter.state);
            state.expire(Instant::now(), &timings);
            state.generation
        };
        let apply = Apply {
            reporter: &reporter,
            instance,
            timings: &timings,
        };
        let results: Vec<ItemResult> = request.events.iter().map(|e| apply.event(e)).collect();
        let generation = lock(&reporter.state).generation;
        let snapshot_committed = request.events.iter().zip(&results).any(|(event, result)| {
            matches!(event, ReportEvent::Snapshot(_)) && *result == ItemResult::Ok
        });
        Ok(ReportOutcome {
            results,
            generation,
            snapshot_required: generation.is_none()
                || (arrival_generation.is_none() && !snapshot_committed),
            extra_info,
        })
    }
}

/// The request-level rules, checked before any effect.
fn check_shape(request: &ReportRequest) -> ManagerResult<()> {
    if request.host.is_empty() || request.host.contains('#') {
        return Err(ManagerError::invalid_because(
            "host_ip_port",
            format!("{:?} is empty or contains '#'", request.host),
        ));
    }
    let count =
        |wanted: fn(&ReportEvent) -> bool| request.events.iter().filter(|e| wanted(e)).count();
    let snapshots = count(|e| matches!(e, ReportEvent::Snapshot(_)));
    let deltas = count(|e| matches!(e, ReportEvent::Add(_) | ReportEvent::Delete { .. }));
    let downs = count(|e| matches!(e, ReportEvent::HostDown));
    let refusal = if snapshots > 1 {
        Some("a request carries at most one EVENT_BLOCK_SNAPSHOT")
    } else if snapshots == 1 && deltas > 0 {
        Some(
            "EVENT_BLOCK_SNAPSHOT cannot share a request with EVENT_BLOCK_ADD / EVENT_BLOCK_DELETE",
        )
    } else if downs > 0 && request.events.len() > 1 {
        Some("EVENT_HOST_DOWN must be the only event of its request")
    } else {
        None
    };
    match refusal {
        Some(why) => Err(ManagerError::invalid_because("events", why)),
        None => Ok(()),
    }
}

/// One request's events applied to one reporter.
struct Apply<'a> {
    reporter: &'a Reporter,
    instance: &'a Instance,
    timings: &'a ReportTimings,
}

impl Apply<'_> {
    fn event(&self, event: &ReportEvent) -> ItemResult {
        let checked = match event {
            ReportEvent::Register { mediums } => mediums.iter().try_for_each(|m| check_medium(m)),
            ReportEvent::Add(block) => self.check_block(block),
            ReportEvent::Delete {
                medium, spec_names, ..
            } => check_medium(medium).and_then(|()| self.check_spec_names(spec_names.iter())),
            ReportEvent::Snapshot(blocks) => self.check_snapshot(blocks),
            ReportEvent::Unreadable(why) => Err(why.clone()),
            ReportEvent::Heartbeat | ReportEvent::HostDown => Ok(()),
        };
        if let Err(why) = checked {
            return ItemResult::Invalid(why);
        }
        match event {
            ReportEvent::Register { mediums } => {
                match self.state().register(Instant::now(), mediums) {
                    Ok(()) => ItemResult::Ok,
                    Err(why) => ItemResult::Invalid(why),
                }
            }
            ReportEvent::Heartbeat => match self.state().touch(Instant::now(), true) {
                true => ItemResult::Ok,
                false => ItemResult::NotRegistered,
            },
            ReportEvent::HostDown => {
                self.state().unregister();
                ItemResult::Ok
            }
            ReportEvent::Add(block) => self.delta(|state| state.add(block)),
            ReportEvent::Delete {
                key,
                medium,
                spec_names,
            } => self.delta(|state| {
                state.delete(*key, medium, spec_names);
                Ok(())
            }),
            ReportEvent::Snapshot(blocks) => self.snapshot(blocks),
            ReportEvent::Unreadable(why) => ItemResult::Invalid(why.clone()),
        }
    }

    /// The reporter's state, locked, with the timings applied.
    fn state(&self) -> std::sync::MutexGuard<'_, super::reporter::ReporterState> {
        let mut state = lock(&self.reporter.state);
        state.expire(Instant::now(), self.timings);
        state
    }

    fn drain_timeout(&self) -> Duration {
        Duration::from_millis(self.timings.snapshot_delta_drain_timeout_ms)
    }

    /// ADD / DELETE: admitted by the gate, applied unless the reporter is tombstoned (a
    /// fresh one starts now; a mutation never refreshes liveness).
    fn delta(
        &self,
        change: impl FnOnce(&mut super::reporter::ReporterState) -> Result<(), String>,
    ) -> ItemResult {
        let Ok(_turn) = self.reporter.gate.delta(self.drain_timeout()) else {
            return ItemResult::SnapshotInProgress;
        };
        let mut state = self.state();
        if !state.touch(Instant::now(), false) {
            return ItemResult::NotRegistered;
        }
        match change(&mut state) {
            Ok(()) => ItemResult::Ok,
            Err(why) => ItemResult::Invalid(why),
        }
    }

    /// SNAPSHOT: the gate's exclusive turn, the rate limit, then the replacement.
    fn snapshot(&self, blocks: &[ReportedBlock]) -> ItemResult {
        let epoch = self.state().epoch;
        let _turn = match self.reporter.gate.snapshot(self.drain_timeout()) {
            Ok(turn) => turn,
            Err(GateRefusal::SnapshotRunning | GateRefusal::TimedOut) => {
                return ItemResult::SnapshotInProgress
            }
        };
        let now = Instant::now();
        let mut state = self.state();
        if state.epoch != epoch {
            return ItemResult::SnapshotRequired;
        }
        if state.lifecycle == Lifecycle::Tombstone {
            return ItemResult::NotRegistered;
        }
        let interval = Duration::from_millis(self.timings.snapshot_min_interval_ms);
        if let Some(last) = state.last_snapshot {
            let since = now.saturating_duration_since(last);
            if since < interval {
                let left = (interval - since).as_millis().max(1);
                return ItemResult::RateLimited {
                    retry_after_ms: u64::try_from(left).unwrap_or(u64::MAX),
                };
            }
        }
        state.touch(now, false);
        state.replace_all(blocks, now);
        ItemResult::Ok
    }

    /// ADD and each SNAPSHOT item: a valid medium, at least one spec, valid names and URIs.
    fn check_block(&self, block: &ReportedBlock) -> Result<(), String> {
        check_medium(&block.medium)?;
        if block.specs.is_empty() {
            return Err(format!(
                "block {} on {:?} has no specs",
                block.key, block.medium
            ));
        }
        self.check_spec_names(block.specs.iter().map(|spec| &spec.name))?;
        block
            .specs
            .iter()
            .try_for_each(|spec| uri::check(&spec.uri))
    }

    /// SNAPSHOT: every item valid, each `block_key + medium` once, each block on at most
    /// [`MAX_MEDIUMS`] mediums.
    fn check_snapshot(&self, blocks: &[ReportedBlock]) -> Result<(), String> {
        let mut seen = HashSet::with_capacity(blocks.len());
        let mut mediums_of: HashMap<BlockKey, usize> = HashMap::new();
        for block in blocks {
            self.check_block(block)?;
            if !seen.insert((block.key, block.medium.as_str())) {
                return Err(format!(
                    "block {} on {:?} is listed twice in the snapshot",
                    block.key, block.medium
                ));
            }
            let mediums = mediums_of.entry(block.key).or_default();
            *mediums += 1;
            if *mediums > MAX_MEDIUMS {
                return Err(format!(
                    "block {} is listed on more than {MAX_MEDIUMS} mediums",
                    block.key
                ));
            }
        }
        Ok(())
    }

    /// At least one name; each non-empty, registered by the instance, and listed once.
    fn check_spec_names<'n>(&self, names: impl Iterator<Item = &'n String>) -> Result<(), String> {
        let mut seen: HashSet<&str> = HashSet::new();
        for name in names {
            if self.instance.spec_position(name).is_none() {
                return Err(format!(
                    "spec {name:?} is not registered by instance {:?}",
                    self.instance.id()
                ));
            }
            if !seen.insert(name) {
                return Err(format!("spec {name:?} is listed twice"));
            }
        }
        match seen.is_empty() {
            true => Err("no spec names".to_string()),
            false => Ok(()),
        }
    }
}

/// A medium is non-empty and free of `#` (upstream's location-id separator).
fn check_medium(medium: &str) -> Result<(), String> {
    if medium.is_empty() || medium.contains('#') {
        return Err(format!("medium {medium:?} is empty or contains '#'"));
    }
    Ok(())
}
