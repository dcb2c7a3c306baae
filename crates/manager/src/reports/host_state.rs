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
//!   left with no block is not answered;
//! - QT_PREFIX_MATCH_WITH_MAMBA (a hybrid model: full-attention layers and mamba state) reads
//!   the instance's spec groups by the first letter of their names, as upstream: `F…` groups
//!   hold full-attention specs, `L…` groups mamba-state specs (any other letter is refused).
//!   A key holds "full" when every full-attention spec is held, "state" when every
//!   mamba-state spec is. The match is the run of full keys from the first (EaglePop pops
//!   one here), cut back to the last key that also holds state — a prefix is reusable only
//!   up to a state snapshot. Specs held on different mediums or reporters of the host
//!   combine; for `global`, kvcm's own readable locations and the peer combine with them,
//!   and the peer chosen is the one giving the longest match.

use std::time::Instant;

use kvcm_index::BlockKey;
use kvcm_storage::{ReportTier, ReportTimings};

use super::reporter::ReporterState;
use super::{lock_available, MAX_MEDIUMS};
use crate::error::{ManagerError, ManagerResult};
use crate::instance::Instance;
use crate::Manager;

/// How keys match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostMatch {
    /// QT_PREFIX_MATCH: a key matches when any location of it is held.
    Prefix,
    /// QT_PREFIX_MATCH_WITH_MAMBA: full-attention specs up to a mamba-state snapshot.
    PrefixWithMamba,
}

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
    /// How keys match.
    pub matching: HostMatch,
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

    fn holds_spec(&self, key: BlockKey, mediums: &[String], spec: &str) -> bool {
        let mut states = self.states.iter();
        states.any(|state| state.holds_spec(key, mediums, spec))
    }
}

/// A hybrid model's specs, each by name and index in the instance's registration.
struct HybridSpecs<'i> {
    full: Vec<(&'i str, u16)>,
    state: Vec<(&'i str, u16)>,
}

impl<'i> HybridSpecs<'i> {
    /// The specs of the instance's `F…` and `L…` spec groups; INVALID_ARGUMENT when a group
    /// is of another category or either kind is missing.
    fn of(instance: &'i Instance) -> ManagerResult<Self> {
        let refuse = |why: String| {
            let id = instance.id();
            let why = format!("QT_PREFIX_MATCH_WITH_MAMBA on instance {id:?}: {why}");
            ManagerError::invalid_because("query_type", why)
        };
        let index = |name: &str| instance.spec_position(name).map(|i| i as u16);
        let mut hybrid = HybridSpecs {
            full: Vec::new(),
            state: Vec::new(),
        };
        for group in &instance.info().spec_groups {
            let kind = match group.name.chars().next() {
                Some('F') => &mut hybrid.full,
                Some('L') => &mut hybrid.state,
                Some(category @ ('W' | 'C' | 'E' | 'X')) => {
                    return Err(refuse(format!(
                        "location spec group {:?} is of category {category}, which mamba matching does not support",
                        group.name
                    )))
                }
                _ => {
                    return Err(refuse(format!(
                        "location spec group {:?} is neither full attention (F…) nor mamba state (L…)",
                        group.name
                    )))
                }
            };
            for name in &group.spec_names {
                let Some(at) = index(name) else { continue };
                if !kind.iter().any(|(_, i)| *i == at) {
                    kind.push((name.as_str(), at));
                }
            }
        }
        if hybrid.full.is_empty() {
            return Err(refuse("no full-attention (F…) location spec group".into()));
        }
        if hybrid.state.is_empty() {
            return Err(refuse("no mamba-state (L…) location spec group".into()));
        }
        Ok(hybrid)
    }

    /// The matched length over `count` keys: the run of keys from the first holding every
    /// full-attention spec, less `popped`, cut back to the last key holding every
    /// mamba-state spec. `holds(i, spec)` says whether key `i` holds a spec.
    fn matched(
        &self,
        count: usize,
        popped: usize,
        holds: impl Fn(usize, (&str, u16)) -> bool,
    ) -> usize {
        let every = |i: usize, specs: &[(&str, u16)]| specs.iter().all(|s| holds(i, *s));
        let full = (0..count).take_while(|&i| every(i, &self.full)).count();
        let full = full.saturating_sub(popped);
        (1..=full)
            .rev()
            .find(|&end| every(end - 1, &self.state))
            .unwrap_or(0)
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
        if query.mediums.len() > MAX_MEDIUMS {
            return Err(ManagerError::invalid_because(
                "medium",
                format!(
                    "{} mediums: name at most {MAX_MEDIUMS}",
                    query.mediums.len()
                ),
            ));
        }
        let hybrid = match query.matching {
            HostMatch::Prefix => None,
            HostMatch::PrefixWithMamba => Some(HybridSpecs::of(instance)?),
        };
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
        if let Some(hybrid) = &hybrid {
            return self.hybrid_states(instance, query, hybrid, &hosts, popped);
        }
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
        answers.sort_by(|(_, a), (_, b)| by_local(a, b));
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

    /// [`Manager::host_cache_state`] of a hybrid model (QT_PREFIX_MATCH_WITH_MAMBA).
    fn hybrid_states(
        &self,
        instance: &Instance,
        query: HostStateQuery<'_>,
        hybrid: &HybridSpecs<'_>,
        hosts: &[Host<'_>],
        popped: usize,
    ) -> ManagerResult<Vec<HostCacheState>> {
        let (keys, mediums) = (query.keys, query.mediums);
        let local_of = |host: &Host<'_>| {
            hybrid.matched(keys.len(), popped, |i, (name, _)| {
                host.holds_spec(keys[i], mediums, name)
            })
        };
        let mut answers: Vec<(usize, HostCacheState)> = hosts
            .iter()
            .enumerate()
            .map(|(index, host)| {
                let local = local_of(host);
                let host = host.name.to_string();
                let global = local;
                (
                    index,
                    HostCacheState {
                        host,
                        local,
                        global,
                    },
                )
            })
            .filter(|(_, answer)| answer.local > 0)
            .collect();
        answers.sort_by(|(_, a), (_, b)| by_local(a, b));
        let selected = query.remote_hosts.min(answers.len());
        if selected > 0 {
            let own = self.own_readable_specs(instance, keys)?;
            for (index, answer) in answers.iter_mut().take(selected) {
                let host = &hosts[*index];
                let merged = |peer: Option<&ReporterState>| {
                    hybrid.matched(keys.len(), popped, |i, (name, at)| {
                        host.holds_spec(keys[i], mediums, name)
                            || own[i].contains(&at)
                            || peer.is_some_and(|p| p.holds_spec(keys[i], mediums, name))
                    })
                };
                let peers = hosts.iter().filter(|peer| peer.name != host.name);
                let peers = peers.filter_map(|peer| peer.l2.filter(|_| query.p2p));
                let best_peer = peers.map(|peer| merged(Some(peer))).max();
                answer.global = best_peer.unwrap_or(0).max(merged(None));
            }
        }
        Ok(answers.into_iter().map(|(_, answer)| answer).collect())
    }
}

/// The answer order: `local` descending, then host ascending.
fn by_local(a: &HostCacheState, b: &HostCacheState) -> std::cmp::Ordering {
    b.local.cmp(&a.local).then_with(|| a.host.cmp(&b.host))
}
