//! The background liveness sweep: reporters past their heartbeat timeout + cleanup grace
//! are unregistered (tombstoned, their blocks freed) even when nobody reports for them or
//! queries their instance, so a host that died for good costs no memory. The sweep runs
//! every `liveness_check_interval_ms` — the shortest of the registered event-report
//! storages (upstream trunk's field; 1 s when there are none) — and takes each reporter's
//! state lock only as long as one expiry check.

use std::sync::Weak;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvcm_storage::{ReportTimings, StorageSpec};

use super::reporter::Lifecycle;
use crate::sync::{lock, read_lock};
use crate::Manager;

/// Bounds of the sweep period, whatever the storages say.
const MIN_PERIOD: Duration = Duration::from_millis(10);
const MAX_PERIOD: Duration = Duration::from_secs(60);

impl Manager {
    /// Unregisters every reporter expired at `now`; how many were.
    pub fn sweep_reporters(&self, now: Instant) -> usize {
        let instances: Vec<_> = read_lock(&self.reports.by_instance)
            .keys()
            .cloned()
            .collect();
        let mut unregistered = 0;
        for id in instances {
            let Some(instance) = self.instance(&id) else {
                continue;
            };
            for ((_, tier), reporter) in self.reports.of_instance(&id) {
                let Some(timings) = self.listed_report_timings(&instance, tier) else {
                    continue; // a hidden tier (storage disabled or unlisted) is left alone
                };
                let mut state = lock(&reporter.state);
                let live = matches!(state.lifecycle, Lifecycle::Live { .. });
                state.expire(now, &timings);
                unregistered += usize::from(live && state.lifecycle == Lifecycle::Tombstone);
            }
        }
        unregistered
    }

    /// How long the sweeper waits between passes.
    fn sweep_period(&self) -> Duration {
        let intervals = self
            .storages
            .list()
            .into_iter()
            .filter_map(|config| match config.spec {
                StorageSpec::EventReport { timings, .. } => {
                    Some(timings.liveness_check_interval_ms)
                }
                _ => None,
            });
        let shortest = intervals
            .min()
            .unwrap_or(ReportTimings::default().liveness_check_interval_ms);
        Duration::from_millis(shortest).clamp(MIN_PERIOD, MAX_PERIOD)
    }
}

/// Starts the sweeper; it ends with the manager.
pub(crate) fn spawn_reporter_sweep(manager: Weak<Manager>) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("kvcm-report-sweep".into())
        .spawn(move || loop {
            let Some(period) = manager.upgrade().map(|m| m.sweep_period()) else {
                return;
            };
            std::thread::sleep(period);
            let Some(manager) = manager.upgrade() else {
                return;
            };
            manager.sweep_reporters(Instant::now());
        })
}
