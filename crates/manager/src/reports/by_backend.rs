//! GetCacheLocationsByBackend (upstream trunk §3.7): per key, one location per selector —
//! a storage type and how to choose among its locations.
//!
//! Rules (kvcm-defined choices marked in docs/compatibility.md):
//! - kvcm's own storage types take WEIGHTED_RANDOM only: the key's SERVING locations on
//!   available storages of that type, drawn by read weight as GetCacheLocation draws;
//! - event-report types choose among the available reporters of that tier. WEIGHTED_RANDOM
//!   draws one reporter holding the key (all weigh alike); V6D_PREFIX / V6D_COVERAGE choose
//!   one reporter for the whole request — the longest run of held keys from the first /
//!   the most keys held — ties broken by endpoint (the authority of the reporter's first
//!   matching URI, then its host) ascending, and answer its location of each key it holds;
//! - a reporter's location of a key is its first medium (by name) holding the asked spec
//!   (any spec when none is asked); with a spec asked only that spec is answered;
//! - a selector that finds nothing for a key adds nothing to that key's answer.

use std::time::Instant;

use kvcm_index::BlockKey;
use kvcm_storage::ReportTier;

use super::lock_available;
use super::reporter::{MediumSpecs, ReporterState};
use crate::error::ManagerResult;
use crate::instance::Instance;
use crate::read::BlockLocation;
use crate::storage_type::StorageType;
use crate::Manager;

/// How a selector chooses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelectStrategy {
    /// By weight, per key.
    WeightedRandom,
    /// One reporter: the longest run of held keys from the first.
    Prefix,
    /// One reporter: the most keys held.
    Coverage,
}

/// One selector of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendSelector {
    /// The storage type chosen from.
    pub storage_type: StorageType,
    /// How.
    pub strategy: SelectStrategy,
}

/// One answered location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChosenLocation {
    /// A location on one of kvcm's storages.
    Stored(BlockLocation),
    /// A reporter's location.
    Reported {
        /// Its tier's storage type.
        storage_type: StorageType,
        /// Its specs: name and URI (with `s_version`).
        specs: Vec<(String, String)>,
    },
}

/// The query of GetCacheLocationsByBackend.
#[derive(Debug, Clone, Copy)]
pub struct BackendQuery<'a> {
    /// The keys.
    pub keys: &'a [BlockKey],
    /// Empty, or the spec asked for each key.
    pub spec_names: &'a [String],
    /// The selectors, in answer order.
    pub selectors: &'a [BackendSelector],
}

impl Manager {
    /// Answers a GetCacheLocationsByBackend query of `instance`: per key, the chosen
    /// locations in selector order. The edge has checked the request's shape.
    pub fn locations_by_backend(
        &self,
        instance: &Instance,
        query: BackendQuery<'_>,
    ) -> ManagerResult<Vec<Vec<ChosenLocation>>> {
        let mut answers: Vec<Vec<ChosenLocation>> = vec![Vec::new(); query.keys.len()];
        for selector in query.selectors {
            let chosen = match tier_of(selector.storage_type) {
                None => self
                    .readable_of_type(
                        instance,
                        selector.storage_type,
                        query.keys,
                        query.spec_names,
                    )?
                    .into_iter()
                    .map(|found| found.map(ChosenLocation::Stored))
                    .collect(),
                Some(tier) => self.reported_choice(instance, tier, selector, query),
            };
            for (answer, found) in answers.iter_mut().zip(chosen) {
                answer.extend(found);
            }
        }
        Ok(answers)
    }

    /// Per key, the location a reported-tier selector chooses.
    fn reported_choice(
        &self,
        instance: &Instance,
        tier: ReportTier,
        selector: &BackendSelector,
        query: BackendQuery<'_>,
    ) -> Vec<Option<ChosenLocation>> {
        let none = || vec![None; query.keys.len()];
        let Some(timings) = self.listed_report_timings(instance, tier) else {
            return none();
        };
        let now = Instant::now();
        let reporters = self.reports.of_instance(instance.id());
        let of_tier = |reporter_tier| (reporter_tier == tier).then_some(timings);
        let guards = lock_available(&reporters, of_tier, now);
        let wanted = |i: usize| query.spec_names.get(i).map(String::as_str);
        let render = |found: Option<&MediumSpecs>, i: usize| {
            found.map(|medium| ChosenLocation::Reported {
                storage_type: selector.storage_type,
                specs: medium
                    .specs
                    .iter()
                    .filter(|spec| wanted(i).is_none_or(|name| spec.name == name))
                    .map(|spec| (spec.name.clone(), spec.uri.clone()))
                    .collect(),
            })
        };
        let keys = 0..query.keys.len();
        match selector.strategy {
            SelectStrategy::WeightedRandom => keys
                .map(|i| {
                    let holders: Vec<&MediumSpecs> = guards
                        .iter()
                        .filter_map(|(_, _, state)| located(state, &query, i))
                        .collect();
                    let drawn =
                        (!holders.is_empty()).then(|| holders[fastrand::usize(..holders.len())]);
                    render(drawn, i)
                })
                .collect(),
            SelectStrategy::Prefix | SelectStrategy::Coverage => {
                let scored = guards.iter().map(|(host, _, state)| {
                    let held: Vec<bool> = keys
                        .clone()
                        .map(|i| located(state, &query, i).is_some())
                        .collect();
                    let score = match selector.strategy {
                        SelectStrategy::Prefix => held.iter().take_while(|h| **h).count(),
                        _ => held.iter().filter(|h| **h).count(),
                    };
                    let first = keys.clone().find_map(|i| located(state, &query, i));
                    (score, endpoint(first, host), state)
                });
                let best = scored
                    .filter(|(score, ..)| *score > 0)
                    .min_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
                match best {
                    Some((_, _, state)) => {
                        keys.map(|i| render(located(state, &query, i), i)).collect()
                    }
                    None => none(),
                }
            }
        }
    }
}

/// The tier of an event-report storage type.
fn tier_of(storage_type: StorageType) -> Option<ReportTier> {
    match storage_type {
        StorageType::EventReportL1p5 => Some(ReportTier::L1p5),
        StorageType::EventReportL2 => Some(ReportTier::L2),
        _ => None,
    }
}

/// A reporter's location of the `i`-th query key (of its asked spec, when there is one).
fn located<'s>(
    state: &'s ReporterState,
    query: &BackendQuery<'_>,
    i: usize,
) -> Option<&'s MediumSpecs> {
    location(
        state,
        query.keys[i],
        query.spec_names.get(i).map(String::as_str),
    )
}

/// A reporter's location of `key`: its first medium (by name) holding `spec` (any when
/// `None`).
fn location<'s>(
    state: &'s ReporterState,
    key: BlockKey,
    spec: Option<&str>,
) -> Option<&'s MediumSpecs> {
    let stored = state.blocks.get(&key)?;
    let holding = stored
        .iter()
        .filter(|medium| spec.is_none_or(|name| medium.holds(name)));
    holding.min_by(|a, b| a.medium.cmp(&b.medium))
}

/// A reporter's endpoint: the authority of its first matching URI, else its host.
fn endpoint(first: Option<&MediumSpecs>, host: &str) -> String {
    let uri = first
        .and_then(|medium| medium.specs.first())
        .map(|spec| spec.uri.as_str());
    let authority = uri
        .and_then(|uri| uri.split_once("://"))
        .map(|(_, rest)| rest.split(['/', '?']).next().unwrap_or(""));
    match authority {
        Some(authority) if !authority.is_empty() => authority.to_string(),
        _ => host.to_string(),
    }
}
