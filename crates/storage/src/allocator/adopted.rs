//! Adopted runs: slabs holding parts that an earlier process placed (a restarted manager
//! whose pool node kept its memory). A run holds exactly its adopted parts: no new part is
//! placed in it, and it goes back to the free slab pool when its last part is freed.
//!
//! Invariants: the parts of a run lie inside its slabs, never overlap and belong to one
//! tenant; runs never share a slab (parts touching a common slab belong to one run).

use std::collections::BTreeMap;

use super::slab_pool::SlabRun;
use super::{AllocError, Tenant, GRANULE, SLAB_BYTES};

/// A part an earlier process placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct AdoptedPart {
    /// Its offset in the region.
    pub offset: u64,
    /// The bytes requested for it.
    pub size: u64,
    /// Whom it was placed for.
    pub tenant: Tenant,
}

impl From<(&u64, &(u64, Tenant))> for AdoptedPart {
    /// From an entry of a map offset → (size, tenant).
    fn from((&offset, &(size, tenant)): (&u64, &(u64, Tenant))) -> Self {
        AdoptedPart {
            offset,
            size,
            tenant,
        }
    }
}

/// A run of slabs and the adopted parts in it.
#[derive(Debug)]
pub(super) struct AdoptedRun {
    /// The slabs.
    pub run: SlabRun,
    /// Live parts: offset → requested size.
    parts: BTreeMap<u64, u64>,
}

impl AdoptedRun {
    /// Number of live parts.
    pub fn part_count(&self) -> usize {
        self.parts.len()
    }

    /// Sum of the live parts' requested sizes.
    pub fn used_bytes(&self) -> u64 {
        self.parts.values().sum()
    }

    /// Forgets the part at `offset`; returns its requested size (`None`: no part there).
    pub fn release(&mut self, offset: u64) -> Option<u64> {
        self.parts.remove(&offset)
    }
}

/// Groups `parts` of a region of `capacity` bytes into adopted runs with their tenant,
/// lowest first; refuses parts that are empty, unaligned, outside the region, overlapping
/// or touching a slab another tenant's part touches.
pub(super) fn adopted_runs(
    capacity: u64,
    parts: &[AdoptedPart],
) -> Result<Vec<(Tenant, AdoptedRun)>, AllocError> {
    let mut sorted = parts.to_vec();
    sorted.sort_unstable();
    let mut runs: Vec<(Tenant, AdoptedRun)> = Vec::new();
    let mut end_of_last = 0;
    for &AdoptedPart {
        offset,
        size,
        tenant,
    } in &sorted
    {
        let refuse = |reason| AllocError::BadAdoption {
            offset,
            size,
            reason,
        };
        let end = offset.checked_add(size).filter(|&end| end <= capacity);
        let end = end.ok_or_else(|| refuse("outside the region"))?;
        if size == 0 {
            return Err(refuse("empty"));
        }
        if offset % GRANULE != 0 {
            return Err(refuse("not granule-aligned"));
        }
        if offset < end_of_last {
            return Err(refuse("overlaps another part"));
        }
        end_of_last = end;
        let (first, last) = (offset / SLAB_BYTES, (end - 1) / SLAB_BYTES);
        let touched = runs
            .last_mut()
            .filter(|(_, run)| first < run.run.start + run.run.slabs);
        match touched {
            Some((owner, _)) if *owner != tenant => {
                return Err(refuse("shares a slab with another tenant's part"));
            }
            Some((_, run)) => {
                run.run.slabs = run.run.slabs.max(last + 1 - run.run.start);
                run.parts.insert(offset, size);
            }
            None => runs.push((
                tenant,
                AdoptedRun {
                    run: SlabRun {
                        start: first,
                        slabs: last + 1 - first,
                    },
                    parts: BTreeMap::from([(offset, size)]),
                },
            )),
        }
    }
    Ok(runs)
}
