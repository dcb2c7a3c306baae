//! Reported locations as GetCacheLocation candidates (upstream trunk §3.5 "query
//! visibility" applies to GetCacheLocation too): a key a visible reporter holds is a hit,
//! and its reported locations are drawn among beside kvcm's own.
//!
//! Rules (kvcm-defined choices marked in docs/compatibility.md):
//! - a candidate is one reporter's block on one medium, of an available reporter whose
//!   tier's event-report storage the group lists and has enabled; each weighs 1, in every
//!   weight mode (the 2026-02 "other types" weight);
//! - the answered location is the drawn reporter's: the drawn medium's specs first, then the
//!   specs of its other mediums whose names were not answered yet (upstream merges the
//!   locations of the drawn one's storage);
//! - the reporters of the instance stay locked for the lookup, so one answer sees each
//!   reporter at one instant.

use std::sync::MutexGuard;
use std::time::Instant;

use kvcm_index::BlockKey;
use kvcm_storage::ReportTier;

use super::reporter::ReporterState;
use super::{lock_available, ReporterEntry};
use crate::instance::Instance;
use crate::storage_type::StorageType;
use crate::Manager;

/// The read weight of every reported location.
const REPORTED_WEIGHT: u32 = 1;

/// A drawn reported location: which reporter (in [`ReportedSources`] order) and which of
/// its mediums holding the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReportedChoice {
    reporter: usize,
    medium: usize,
}

/// A reported location as GetCacheLocation answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReportedLocation {
    /// Its tier's storage type.
    pub storage_type: StorageType,
    /// Its parts: the spec's index in the instance's registration and the stored URI.
    pub parts: Vec<(u16, String)>,
}

/// The visible reporters of one instance, locked for one lookup.
pub(crate) struct ReportedSources<'r> {
    visible: Vec<(&'r str, ReportTier, MutexGuard<'r, ReporterState>)>,
}

impl Manager {
    /// The reporters of `instance` (held by the caller while [`ReportedSources`] borrow
    /// them); empty for an instance nobody reported for.
    pub(crate) fn reporters_of(&self, instance: &Instance) -> Vec<ReporterEntry> {
        self.reports.of_instance(instance.id())
    }

    /// Whether anyone reported for `instance` in this process (the fast lookup path then
    /// sends its queries to the server, which sees the reports).
    pub fn has_reporters(&self, instance: &Instance) -> bool {
        self.reports.knows_instance(instance.id())
    }
}

impl<'r> ReportedSources<'r> {
    /// Locks the visible ones of `reporters` (of `instance`) at `now`.
    pub(crate) fn lock(
        manager: &Manager,
        instance: &Instance,
        reporters: &'r [ReporterEntry],
        now: Instant,
    ) -> Self {
        if reporters.is_empty() {
            return ReportedSources {
                visible: Vec::new(),
            };
        }
        let timings = |tier| manager.listed_report_timings(instance, tier);
        ReportedSources {
            visible: lock_available(reporters, timings, now),
        }
    }

    /// Offers every visible reported location of `key` to `offer` with its weight.
    pub(crate) fn offer(&self, key: BlockKey, mut offer: impl FnMut(ReportedChoice, u32)) {
        for (reporter, (_, _, state)) in self.visible.iter().enumerate() {
            let Some(mediums) = state.blocks.get(&key) else {
                continue;
            };
            for medium in 0..mediums.len() {
                offer(ReportedChoice { reporter, medium }, REPORTED_WEIGHT);
            }
        }
    }

    /// The location answered for `choice` of `key`; `None` when it holds no spec the
    /// instance registers (a spec name is checked when it is reported, so only a changed
    /// registration could leave one).
    pub(crate) fn location(
        &self,
        instance: &Instance,
        key: BlockKey,
        choice: ReportedChoice,
    ) -> Option<ReportedLocation> {
        let (_, tier, state) = self.visible.get(choice.reporter)?;
        let mediums = state.blocks.get(&key)?;
        let drawn = mediums.get(choice.medium)?;
        let others = mediums.iter().enumerate();
        let others = others.filter(|(i, _)| *i != choice.medium).map(|(_, m)| m);
        let mut parts: Vec<(u16, String)> = Vec::new();
        // One bit per registered spec: answered already (from an earlier medium).
        let mut answered = vec![0u64; instance.specs().len().div_ceil(64)];
        for spec in std::iter::once(drawn).chain(others).flat_map(|m| &m.specs) {
            let Some(index) = instance.spec_position(&spec.name) else {
                continue;
            };
            let (word, bit) = (index / 64, 1u64 << (index % 64));
            if answered[word] & bit == 0 {
                answered[word] |= bit;
                parts.push((index as u16, spec.uri.clone()));
            }
        }
        let storage_type = match tier {
            ReportTier::L1p5 => StorageType::EventReportL1p5,
            ReportTier::L2 => StorageType::EventReportL2,
        };
        (!parts.is_empty()).then_some(ReportedLocation {
            storage_type,
            parts,
        })
    }
}
