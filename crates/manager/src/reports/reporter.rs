//! One reporter's state: its lifecycle (liveness from heartbeats, tombstones), its mediums,
//! its generation and the blocks it reported, and the rules that change them.
//!
//! Invariants:
//! - every stored spec's URI carries exactly one `s_version`, the generation current when it
//!   was stored;
//! - a successful snapshot replaces the whole block set, so after one every stored spec
//!   carries the committed generation or a later delta's (the same generation): upstream's
//!   "strict" visibility holds by construction, and a location fully of an older generation
//!   cannot exist;
//! - a tombstoned reporter holds no blocks, no mediums and no generation.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use kvcm_index::{BlockKey, BuildMixHasher};
use kvcm_storage::ReportTimings;

use super::uri;
use super::{ReportedBlock, ReportedSpec, MAX_MEDIUMS};

/// A reporter's blocks: per key, one entry per medium.
pub type Blocks = HashMap<BlockKey, Vec<MediumSpecs>, BuildMixHasher>;

/// Where a reporter is in its life (in this process).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    /// Created by a request none of whose events was valid yet: invisible, lazily
    /// initialised by the first valid event.
    Fresh,
    /// Registered (explicitly or lazily); `heartbeat` is when it last proved alive.
    Live {
        /// The last REGISTER / HEARTBEAT (or the lazy initialisation).
        heartbeat: Instant,
    },
    /// Unregistered by HOST_DOWN or by the cleanup grace: only REGISTER revives it.
    Tombstone,
}

/// One stored spec of a reported location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSpec {
    /// Spec name (registered by the instance).
    pub name: String,
    /// The reporter's URI with kvcm's `s_version` appended.
    pub uri: String,
}

/// The specs a reporter holds of one block on one medium, by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediumSpecs {
    /// The medium.
    pub medium: String,
    /// Specs sorted by name, never empty.
    pub specs: Vec<StoredSpec>,
}

impl MediumSpecs {
    /// Whether it holds the spec named `name`.
    pub fn holds(&self, name: &str) -> bool {
        let by_name = |s: &StoredSpec| s.name.as_str().cmp(name);
        self.specs.binary_search_by(by_name).is_ok()
    }
}

/// A reporter's state (guarded by its mutex).
#[derive(Debug)]
pub struct ReporterState {
    /// Lifecycle.
    pub lifecycle: Lifecycle,
    /// Raised whenever the lifecycle starts anew or ends (REGISTER after a tombstone,
    /// HOST_DOWN, cleanup): a snapshot that waited across a change answers SNAPSHOT_REQUIRED.
    pub epoch: u64,
    /// Mediums declared by REGISTER.
    pub mediums: BTreeSet<String>,
    /// The current generation, once a delta or snapshot created one.
    pub generation: Option<u128>,
    /// When the last successful snapshot committed (the rate limit counts from it).
    pub last_snapshot: Option<Instant>,
    /// Reported blocks: per key, one entry per medium.
    pub blocks: Blocks,
}

impl ReporterState {
    /// A reporter never seen in this process.
    pub fn fresh() -> Self {
        ReporterState {
            lifecycle: Lifecycle::Fresh,
            epoch: 0,
            mediums: BTreeSet::new(),
            generation: None,
            last_snapshot: None,
            blocks: Blocks::default(),
        }
    }

    /// Applies the timings at `now`: a live reporter past heartbeat timeout + cleanup grace
    /// is unregistered (tombstone, metadata cleaned).
    pub fn expire(&mut self, now: Instant, timings: &ReportTimings) {
        if let Lifecycle::Live { heartbeat } = self.lifecycle {
            let grace = timings
                .heartbeat_timeout_ms
                .saturating_add(timings.cleanup_grace_ms);
            if now.saturating_duration_since(heartbeat) > Duration::from_millis(grace) {
                self.unregister();
            }
        }
    }

    /// Whether queries see this reporter at `now`: live and within the heartbeat timeout.
    pub fn available(&self, now: Instant, timings: &ReportTimings) -> bool {
        match self.lifecycle {
            Lifecycle::Live { heartbeat } => {
                let timeout = Duration::from_millis(timings.heartbeat_timeout_ms);
                now.saturating_duration_since(heartbeat) <= timeout
            }
            Lifecycle::Fresh | Lifecycle::Tombstone => false,
        }
    }

    /// HOST_DOWN (or cleanup): tombstone, everything forgotten.
    pub fn unregister(&mut self) {
        self.lifecycle = Lifecycle::Tombstone;
        self.epoch += 1;
        self.mediums.clear();
        self.generation = None;
        self.last_snapshot = None;
        self.blocks = Blocks::default();
    }

    /// REGISTER: (re)starts the lifecycle after a tombstone, refreshes liveness, merges
    /// mediums; refused (nothing changes) when the reporter would know more than
    /// [`MAX_MEDIUMS`].
    pub fn register(&mut self, now: Instant, mediums: &[String]) -> Result<(), String> {
        let new = mediums.iter().filter(|m| !self.mediums.contains(*m));
        let known = self.mediums.len() + new.collect::<BTreeSet<_>>().len();
        if known > MAX_MEDIUMS {
            return Err(format!(
                "a reporter registers at most {MAX_MEDIUMS} mediums; this would make {known}"
            ));
        }
        if self.lifecycle == Lifecycle::Tombstone {
            self.epoch += 1;
        }
        self.lifecycle = Lifecycle::Live { heartbeat: now };
        self.mediums.extend(mediums.iter().cloned());
        Ok(())
    }

    /// HEARTBEAT (and the lazy start of a mutation): false for a tombstone. A mutation
    /// passes `refresh = false`: it starts a fresh reporter but never refreshes liveness.
    pub fn touch(&mut self, now: Instant, refresh: bool) -> bool {
        match self.lifecycle {
            Lifecycle::Tombstone => false,
            Lifecycle::Fresh => {
                self.lifecycle = Lifecycle::Live { heartbeat: now };
                true
            }
            Lifecycle::Live { .. } if refresh => {
                self.lifecycle = Lifecycle::Live { heartbeat: now };
                true
            }
            Lifecycle::Live { .. } => true,
        }
    }

    /// The generation, created now if there is none.
    pub fn generation(&mut self) -> u128 {
        *self.generation.get_or_insert_with(new_generation)
    }

    /// ADD: merges `specs` into the block's specs on `medium` by name; refused (nothing
    /// changes) when the block would be on more than [`MAX_MEDIUMS`] mediums.
    pub fn add(&mut self, block: &ReportedBlock) -> Result<(), String> {
        let generation = self.generation();
        let stored = self.blocks.entry(block.key).or_default();
        let position = match stored.iter().position(|m| m.medium == block.medium) {
            Some(position) => position,
            None if stored.len() >= MAX_MEDIUMS => {
                return Err(format!(
                    "block {} is reported on {MAX_MEDIUMS} mediums already: delete one first",
                    block.key
                ))
            }
            None => {
                stored.push(MediumSpecs {
                    medium: block.medium.clone(),
                    specs: Vec::new(),
                });
                stored.len() - 1
            }
        };
        let specs = &mut stored[position].specs;
        for spec in &block.specs {
            let stored_spec = versioned(spec, generation);
            match specs.binary_search_by(|s| s.name.as_str().cmp(&spec.name)) {
                Ok(at) => specs[at] = stored_spec,
                Err(at) => specs.insert(at, stored_spec),
            }
        }
        Ok(())
    }

    /// DELETE: removes the named specs of the block on `medium`; missing ones are fine.
    pub fn delete(&mut self, key: BlockKey, medium: &str, spec_names: &[String]) {
        self.generation();
        let Some(stored) = self.blocks.get_mut(&key) else {
            return;
        };
        for location in stored.iter_mut().filter(|m| m.medium == medium) {
            location
                .specs
                .retain(|spec| !spec_names.contains(&spec.name));
        }
        stored.retain(|m| !m.specs.is_empty());
        if stored.is_empty() {
            self.blocks.remove(&key);
        }
    }

    /// SNAPSHOT: the reporter's complete block set under a new generation (omitted blocks
    /// are cleaned now: metadata only).
    pub fn replace_all(&mut self, blocks: &[ReportedBlock], now: Instant) {
        let generation = new_generation();
        self.generation = Some(generation);
        self.last_snapshot = Some(now);
        let mut replaced =
            Blocks::with_capacity_and_hasher(blocks.len(), BuildMixHasher::default());
        for block in blocks {
            let mut specs: Vec<StoredSpec> = block
                .specs
                .iter()
                .map(|s| versioned(s, generation))
                .collect();
            specs.sort_by(|a, b| a.name.cmp(&b.name));
            replaced.entry(block.key).or_default().push(MediumSpecs {
                medium: block.medium.clone(),
                specs,
            });
        }
        self.blocks = replaced;
    }

    /// Whether the block has a location on a medium `mediums` allows (all when empty).
    pub fn holds(&self, key: BlockKey, mediums: &[String]) -> bool {
        self.blocks.get(&key).is_some_and(|stored| {
            stored
                .iter()
                .any(|m| mediums.is_empty() || mediums.contains(&m.medium))
        })
    }

    /// Whether the block has spec `spec` on a medium `mediums` allows (all when empty).
    pub fn holds_spec(&self, key: BlockKey, mediums: &[String], spec: &str) -> bool {
        self.blocks.get(&key).is_some_and(|stored| {
            let mut allowed = stored
                .iter()
                .filter(|m| mediums.is_empty() || mediums.contains(&m.medium));
            allowed.any(|m| m.holds(spec))
        })
    }
}

/// A new random generation (never 0, so that its 32-hex form is never all zeros).
fn new_generation() -> u128 {
    loop {
        let generation = fastrand::u128(..);
        if generation != 0 {
            return generation;
        }
    }
}

fn versioned(spec: &ReportedSpec, generation: u128) -> StoredSpec {
    StoredSpec {
        name: spec.name.clone(),
        uri: uri::with_version(&spec.uri, generation),
    }
}
