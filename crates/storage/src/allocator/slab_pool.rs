//! The free slab pool: the runs of whole slabs no class span and no large allocation owns.
//!
//! Invariants: free runs never overlap, never touch (a freed run is merged with free
//! neighbours at once), and lie inside `0..slab_count`; `by_start` and `by_length` hold the
//! same runs; `free_bytes` is the sum of their byte lengths (the last slab may be partial).

use std::collections::{BTreeMap, BTreeSet};

use super::SLAB_BYTES;

/// A run of whole slabs: slabs `start..start + slabs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SlabRun {
    /// Index of the first slab.
    pub start: u64,
    /// Number of slabs, at least 1.
    pub slabs: u64,
}

/// How the region is cut into slabs: all `SLAB_BYTES` long except the last, which holds what
/// is left of the capacity.
#[derive(Debug, Clone, Copy)]
pub(super) struct SlabGeometry {
    /// Bytes of the region, a multiple of `GRANULE`.
    pub capacity: u64,
    /// Number of slabs, `capacity.div_ceil(SLAB_BYTES)`.
    pub slab_count: u64,
}

impl SlabGeometry {
    pub fn new(capacity: u64) -> Self {
        SlabGeometry {
            capacity,
            slab_count: capacity.div_ceil(SLAB_BYTES),
        }
    }

    /// Byte offset of the first byte of slab `slab`; saturates for the end of a region
    /// that reaches near `u64::MAX`.
    pub fn slab_offset(&self, slab: u64) -> u64 {
        slab.saturating_mul(SLAB_BYTES)
    }

    /// Bytes of a run of slabs, shorter than `slabs * SLAB_BYTES` when it ends with a partial
    /// last slab.
    pub fn run_bytes(&self, run: SlabRun) -> u64 {
        let start = self.slab_offset(run.start);
        let end = self.slab_offset(run.start + run.slabs).min(self.capacity);
        end - start
    }
}

/// The free runs, found by start (for merging) and by length (for best fit).
#[derive(Debug)]
pub(super) struct SlabPool {
    geometry: SlabGeometry,
    /// Free runs: start slab → slab count.
    by_start: BTreeMap<u64, u64>,
    /// The same runs as (slab count, start slab), shortest first.
    by_length: BTreeSet<(u64, u64)>,
    free_bytes: u64,
}

impl SlabPool {
    /// A pool where every slab of `geometry` is free.
    pub fn new(geometry: SlabGeometry) -> Self {
        let mut pool = SlabPool {
            geometry,
            by_start: BTreeMap::new(),
            by_length: BTreeSet::new(),
            free_bytes: 0,
        };
        pool.insert(SlabRun {
            start: 0,
            slabs: geometry.slab_count,
        });
        pool
    }

    pub fn geometry(&self) -> SlabGeometry {
        self.geometry
    }

    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    pub fn free_run_count(&self) -> usize {
        self.by_start.len()
    }

    /// Takes `slabs` slabs holding at least `min_bytes` bytes from the start of the shortest
    /// free run that has them (best fit, lowest start among equals).
    pub fn take(&mut self, slabs: u64, min_bytes: u64) -> Option<SlabRun> {
        let (run_slabs, run_start) = self
            .by_length
            .range((slabs, 0)..)
            .copied()
            .find(|&(_, start)| self.geometry.run_bytes(SlabRun { start, slabs }) >= min_bytes)?;
        self.remove(SlabRun {
            start: run_start,
            slabs: run_slabs,
        });
        if run_slabs > slabs {
            self.insert(SlabRun {
                start: run_start + slabs,
                slabs: run_slabs - slabs,
            });
        }
        Some(SlabRun {
            start: run_start,
            slabs,
        })
    }

    /// Takes exactly the slabs of `run` out of the free run holding them all; false (nothing
    /// taken) when no free run does.
    pub fn take_exact(&mut self, run: SlabRun) -> bool {
        let holder = self.by_start.range(..=run.start).next_back();
        let Some((&start, &slabs)) = holder else {
            return false;
        };
        if start + slabs < run.start + run.slabs {
            return false;
        }
        self.remove(SlabRun { start, slabs });
        if start < run.start {
            self.insert(SlabRun {
                start,
                slabs: run.start - start,
            });
        }
        let end = run.start + run.slabs;
        if end < start + slabs {
            self.insert(SlabRun {
                start: end,
                slabs: start + slabs - end,
            });
        }
        true
    }

    /// Returns a run to the pool, merged with the free runs just before and after it.
    pub fn give_back(&mut self, run: SlabRun) {
        let mut merged = run;
        let before = self.by_start.range(..run.start).next_back();
        if let Some((&start, &slabs)) = before {
            if start + slabs == run.start {
                self.remove(SlabRun { start, slabs });
                merged = SlabRun {
                    start,
                    slabs: slabs + merged.slabs,
                };
            }
        }
        let after_start = run.start + run.slabs;
        if let Some(&slabs) = self.by_start.get(&after_start) {
            self.remove(SlabRun {
                start: after_start,
                slabs,
            });
            merged.slabs += slabs;
        }
        self.insert(merged);
    }

    /// Bytes of the longest free run (0 when none is free).
    pub fn largest_run_bytes(&self) -> u64 {
        // Only the run ending with a partial last slab is shorter than its slab count says,
        // and by less than one slab, so the longest run by bytes is among those with the
        // most slabs: the longest by slabs and, if as long, the one before it.
        let mut longest = self.by_length.iter().rev().take(2);
        let first = longest.next();
        let second = longest
            .next()
            .filter(|run| Some(run.0) == first.map(|f| f.0));
        [first, second]
            .into_iter()
            .flatten()
            .map(|&(slabs, start)| self.geometry.run_bytes(SlabRun { start, slabs }))
            .max()
            .unwrap_or(0)
    }

    /// The free runs, lowest start first.
    #[cfg(test)]
    pub fn free_runs(&self) -> impl Iterator<Item = SlabRun> + '_ {
        self.by_start
            .iter()
            .map(|(&start, &slabs)| SlabRun { start, slabs })
    }

    fn insert(&mut self, run: SlabRun) {
        self.by_start.insert(run.start, run.slabs);
        self.by_length.insert((run.slabs, run.start));
        self.free_bytes += self.geometry.run_bytes(run);
    }

    fn remove(&mut self, run: SlabRun) {
        self.by_start.remove(&run.start);
        self.by_length.remove(&(run.slabs, run.start));
        self.free_bytes -= self.geometry.run_bytes(run);
    }
}
