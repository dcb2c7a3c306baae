//! GetHostCacheState: for ordered block keys, how long a prefix each reporting host holds
//! (`local`), and, for the best `remote_hosts` of them, how long a prefix becomes reusable
//! when kvcm's own storages and at most one L2 peer fill its gaps (`global`).
//!
//! Rules (upstream trunk §3.6, the kvcm-defined choices in docs/compatibility.md):
//! - a host's reporters of both tiers count as one host (same `host_ip_port`); only
//!   available reporters count; `mediums`, when non-empty, restricts the reported mediums;
//! - `local` = consecutive keys from the first that the host holds; hosts whose first key
//!   misses are not answered;
//! - the `remote_hosts` hosts with the largest `local` (ties: host ascending) get `global` =
//!   the consecutive keys from the first held by the host, a SERVING location of kvcm's own
//!   storages, or (with `p2p`) the one L2 peer of another host that makes this run
//!   longest; every other host has `global == local`;
//! - answers are ordered by `local` descending, then host ascending;
//! - an instance registered with `use_eagle_pop` (upstream's EaglePop mode) gets every
//!   answered `local` and `global` one block shorter, the last matched block popped; a host
//!   left with no block is not answered.

use std::time::Instant;

use kvcm_index::BlockKey;
use kvcm_storage::{ReportTier, ReportTimings};

use super::lock_available;
use super::reporter::ReporterState;
use crate::error::ManagerResult;
use crate::instance::Instance;
use crate::Manager;

/// A GetHostCacheState query.
#[derive(Debug, Clone, Copy)]
pub struct HostStateQuery<'a> {
    /// Ordered block keys.
    pub keys: &'a [BlockKey],
    /// Mediums that count (empty: all).
    pub mediums: &'a [String],
    /// How many hosts get a remote evaluation (`global_kvs_host_count`).
    pub remote_hosts: usize,
    /// Whether an L2 peer may fill gaps (`enable_p2p`).
    pub p2p: bool,
}

/// One answered host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostCacheState {
    /// The reporter's `host:port`.
    pub host: String,
    /// Keys held locally from the first.
    pub local: usize,
    /// Keys reusable from the first after the remote evaluation (`local` without one).
    pub global: usize,
}

/// One host's available reporters (one or two tiers).
struct Host<'s> {
    name: &'s str,
    states: Vec<&'s ReporterState>,
    l2: Option<&'s ReporterState>,
}

impl Host<'_> {
    fn holds(&self, key: BlockKey, mediums: &[String]) -> bool {
        self.states.iter().any(|state| state.holds(key, mediums))
    }
}

/// The consecutive run of `keys` from `start` for which `hit` holds, plus `start`.
fn run_from(keys: &[BlockKey], start: usize, hit: impl Fn(usize, BlockKey) -> bool) -> usize {
    start
        + keys[start.min(keys.len())..]
            .iter()
            .enumerate()
            .take_while(|(i, key)| hit(start + i, **key))
            .count()
}

impl Manager {
    /// Answers a GetHostCacheState query of `instance`.
    pub fn host_cache_state(
        &self,
        instance: &Instance,
        query: HostStateQuery<'_>,
    ) -> ManagerResult<Vec<HostCacheState>> {
        if query.keys.is_empty() {
            return Ok(Vec::new());
        }
        let now = Instant::now();
        let timings = |tier| self.listed_report_timings(instance, tier);
        let tiers: [(ReportTier, Option<ReportTimings>); 2] = [
            (ReportTier::L1p5, timings(ReportTier::L1p5)),
            (ReportTier::L2, timings(ReportTier::L2)),
        ];
        let reporters = self.reports.of_instance(instance.id());
        let timings_of = |tier| tiers.iter().find(|(t, _)| *t == tier).and_then(|(_, t)| *t);
        let guards = lock_available(&reporters, timings_of, now);
        let mut hosts: Vec<Host<'_>> = Vec::new();
        for (name, tier, state) in &guards {
            if hosts.last().is_none_or(|host| host.name != *name) {
                hosts.push(Host {
                    name,
                    states: Vec::new(),
                    l2: None,
                });
            }
            let host = hosts.last_mut().expect("pushed");
            host.states.push(state);
            if *tier == ReportTier::L2 {
                host.l2 = Some(state);
            }
        }
        let (keys, mediums) = (query.keys, query.mediums);
        let popped = usize::from(instance.info().model.use_eagle_pop);
        let mut answers: Vec<(usize, HostCacheState)> = hosts
            .iter()
            .enumerate()
            .map(|(index, host)| {
                let local = run_from(keys, 0, |_, key| host.holds(key, mediums));
                (
                    index,
                    HostCacheState {
                        host: host.name.to_string(),
                        local,
                        global: local,
                    },
                )
            })
            .filter(|(_, answer)| answer.local > popped)
            .collect();
        answers.sort_by(|(_, a), (_, b)| b.local.cmp(&a.local).then_with(|| a.host.cmp(&b.host)));
        let selected = query.remote_hosts.min(answers.len());
        // kvcm's own locations matter only past the shortest selected local run.
        let start = answers[..selected].iter().map(|(_, a)| a.local).min();
        if let Some(start) = start.filter(|&start| start < keys.len()) {
            let own = self.own_readable(instance, &keys[start..])?;
            for (index, answer) in answers.iter_mut().take(selected) {
                let host = &hosts[*index];
                let base = |i: usize, key| host.holds(key, mediums) || own[i - start];
                let filled = run_from(keys, answer.local, base);
                let peers = hosts.iter().filter(|peer| peer.name != host.name);
                let best_peer = peers
                    .filter_map(|peer| peer.l2.filter(|_| query.p2p))
                    .map(|peer| {
                        run_from(keys, filled, |i, key| {
                            base(i, key) || peer.holds(key, mediums)
                        })
                    })
                    .max()
                    .unwrap_or(filled);
                answer.global = best_peer;
            }
        }
        let pop = |answer: HostCacheState| HostCacheState {
            local: answer.local - popped,
            global: answer.global - popped,
            ..answer
        };
        Ok(answers.into_iter().map(|(_, answer)| pop(answer)).collect())
    }
}
