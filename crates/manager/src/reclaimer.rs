//! The reclaimer (docs/capacity.md): a background thread that, every period, looks at each
//! group with a watermark (`trigger_strategy.used_percentage` in (0, 1]) and evicts SERVING
//! blocks while the group's bytes, a type's bytes (against its type quota) or an instance's
//! key count (against `max_key_count`) stays above that fraction.
//!
//! Rules:
//! - only SERVING locations are evicted, never WRITING ones;
//! - victims are chosen among a uniform sample of the instance's keys by the instance's
//!   [`AccessClock`](crate::access::AccessClock) under the configured
//!   [`LivePolicy`](crate::LivePolicy): the least recently accessed (LRU; reads and writes
//!   count), or SIEVE's order (the oldest inserted not visited since the hand last passed);
//!   suffixes go before the prefixes they extend; exact while the sample covers the
//!   instance;
//! - eviction takes the RemoveCache path (SERVING → DELETING through
//!   `move_locations_in_batches`, so the lookup table unpublishes and the journal logs it),
//!   in small index batches of one shard each so lookups never wait long behind it, with one
//!   wait for the journal per pass (the batches' records share its syncs); bytes are freed
//!   by the deleter `delay_before_delete_ms` later;
//! - fair and rate-limited: a group's byte excess is split evenly over its instances, and
//!   no instance loses more than `reclaim_step_size` blocks (default [`DEFAULT_STEP`]) per
//!   pass; keys already evicted but not yet deleted count against the excess, so a pass
//!   never evicts the same excess twice;
//! - it runs on the leader only; every eviction is reported to the reclaim listener (the
//!   event log) and counted in [`ReclaimStats`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvcm_index::BlockKey;

use super::deleter::background_batches;
use super::entry::{Entry, Location, LocationRef, LocationState};
use super::error::ManagerResult;
use super::group_config::GroupConfig;
use super::instance::Instance;
use super::storage_type::StorageType;
use super::Manager;

/// Blocks an instance may lose per pass when its group's `reclaim_step_size` is not positive.
pub const DEFAULT_STEP: usize = 256;

/// Keys sampled per block to evict, and the fewest sampled.
const SAMPLE_FACTOR: usize = 4;
const MIN_SAMPLE: usize = 64;

/// Told the keys of every eviction (the instance, the keys, in key order).
pub type ReclaimListener = Arc<dyn Fn(&Instance, &[BlockKey]) + Send + Sync>;

/// What the reclaimer did so far.
#[derive(Debug, Default)]
pub struct ReclaimStats {
    passes: AtomicU64,
    evicted: AtomicU64,
    busy_us: AtomicU64,
    held_back: AtomicU64,
}

impl ReclaimStats {
    /// Passes completed.
    pub fn passes(&self) -> u64 {
        self.passes.load(Ordering::Acquire)
    }

    /// Locations evicted.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Acquire)
    }

    /// Time spent in passes, in microseconds.
    pub fn busy_us(&self) -> u64 {
        self.busy_us.load(Ordering::Acquire)
    }

    /// Passes not run because a recovery was restoring state.
    pub fn held_back(&self) -> u64 {
        self.held_back.load(Ordering::Acquire)
    }
}

/// Evicted locations of one instance, due for deletion at the instant.
type DelayedDelete = (Instant, Arc<Instance>, Vec<(BlockKey, Location)>);

/// What the reclaimer thread keeps between passes.
#[derive(Default)]
struct ReclaimState {
    /// Evicted locations waiting out their group's `delay_before_delete_ms`.
    delayed: Vec<DelayedDelete>,
    /// Per instance: evicted keys that may still be in its index.
    in_flight: HashMap<Arc<str>, Vec<BlockKey>>,
}

/// One eviction order: up to `blocks` blocks of an instance, of any type or of one.
struct Demand {
    blocks: usize,
    only_type: Option<StorageType>,
}

/// Starts the reclaimer; it stops once the manager is dropped.
pub(crate) fn spawn_reclaimer(
    manager: Weak<Manager>,
    period: Duration,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("kvcm-reclaimer".into())
        .spawn(move || {
            super::background::lower_priority();
            let mut state = ReclaimState::default();
            loop {
                std::thread::sleep(period);
                let Some(manager) = manager.upgrade() else {
                    return;
                };
                manager.reclaim_pass(&mut state);
            }
        })
}

/// The watermark of a group: the fraction above which it is reclaimed, if it has one.
fn watermark(group: &GroupConfig) -> Option<f64> {
    let fraction = group.cache.reclaim.trigger?.used_percentage;
    (fraction > 0.0 && fraction <= 1.0).then_some(fraction)
}

/// Bytes (or keys) above `fraction` of `capacity` (none for a capacity ≤ 0; a usage that
/// overflowed counts as `i64::MAX`).
fn over(capacity: i64, used: Option<i64>, fraction: f64) -> i64 {
    if capacity <= 0 {
        return 0;
    }
    let limit = (capacity as f64 * fraction) as i64;
    used.unwrap_or(i64::MAX).saturating_sub(limit).max(0)
}

/// `a / b` rounded up, for `a ≥ 0` and `b > 0`.
fn ceil_div(a: i64, b: i64) -> i64 {
    a / b + i64::from(a % b != 0)
}

/// Blocks of `block_bytes` that cover `bytes`.
fn blocks_for(bytes: i64, block_bytes: i64) -> usize {
    usize::try_from(ceil_div(bytes, block_bytes.max(1))).unwrap_or(usize::MAX)
}

impl Manager {
    /// What the reclaimer did so far.
    pub fn reclaim_stats(&self) -> &ReclaimStats {
        &self.reclaim_stats
    }

    /// Installs the listener told about every eviction (once; later calls are ignored).
    pub fn set_reclaim_listener(&self, listener: ReclaimListener) {
        let _ = self.reclaim_listener.set(listener);
    }

    /// One pass: hands due deletes to the deleter, then (on the leader) reclaims every group.
    fn reclaim_pass(&self, state: &mut ReclaimState) {
        // Nothing while a recovery restores state: its evictions would not be logged.
        let _not_recovering = match self.recovery_gate.try_read() {
            Ok(gate) => gate,
            Err(std::sync::TryLockError::Poisoned(gate)) => gate.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                self.reclaim_stats.held_back.fetch_add(1, Ordering::AcqRel);
                return;
            }
        };
        let now = Instant::now();
        let (due, waiting) = std::mem::take(&mut state.delayed)
            .into_iter()
            .partition(|(at, ..)| *at <= now);
        state.delayed = waiting;
        for (_, instance, moved) in due {
            self.delete_later(&instance, moved);
        }
        if self.leadership.is_leader() {
            for group in self.list_groups() {
                if let Err(error) = self.reclaim_group(&group, state) {
                    tracing::warn!(%error, group = group.name, "reclaiming");
                }
            }
        }
        let busy = u64::try_from(now.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.reclaim_stats.busy_us.fetch_add(busy, Ordering::AcqRel);
        self.reclaim_stats.passes.fetch_add(1, Ordering::AcqRel);
    }

    /// Evicts from a group's instances what takes it back under its watermark.
    fn reclaim_group(&self, group: &GroupConfig, state: &mut ReclaimState) -> ManagerResult<()> {
        let Some(fraction) = watermark(group) else {
            return Ok(());
        };
        let instances: Vec<Arc<Instance>> = self
            .all_instances()
            .into_iter()
            .filter(|i| i.group() == group.name)
            .collect();
        if instances.is_empty() {
            return Ok(());
        }
        let usage = self.group_usage(&group.name);
        let capacity = group.quota.as_ref().map_or(0, |q| q.capacity);
        let shares = instances.len() as i64;
        let group_share = ceil_div(over(capacity, usage.total(), fraction), shares);
        let type_shares: Vec<(StorageType, i64)> = group
            .quota
            .iter()
            .flat_map(|q| &q.per_type)
            .map(|q| {
                let excess = over(q.capacity, usage.of(q.storage_type), fraction);
                (q.storage_type, ceil_div(excess, shares))
            })
            .filter(|(_, share)| *share > 0)
            .collect();
        let step = usize::try_from(group.cache.reclaim.step_size)
            .ok()
            .filter(|&s| s > 0)
            .unwrap_or(DEFAULT_STEP);
        let delay = Duration::from_millis(group.cache.reclaim.delay_before_delete_ms.max(0) as u64);
        for instance in &instances {
            let pending = pending_keys(instance, state)?;
            let block_bytes = instance.spec_bytes(0..instance.specs().len());
            let keys_over = over(
                group.cache.indexer.max_key_count,
                Some(i64::try_from(instance.index.len()?).unwrap_or(i64::MAX)),
                fraction,
            );
            let any = blocks_for(group_share, block_bytes).max(keys_over as usize);
            let mut demands = vec![Demand {
                blocks: any,
                only_type: None,
            }];
            demands.extend(type_shares.iter().map(|&(storage_type, share)| Demand {
                blocks: blocks_for(share, block_bytes),
                only_type: Some(storage_type),
            }));
            for demand in demands {
                let blocks = demand.blocks.saturating_sub(pending).min(step);
                self.evict(instance, blocks, demand.only_type, delay, state)?;
            }
        }
        Ok(())
    }

    /// Evicts up to `count` SERVING locations (of `only_type`, when given) of the least
    /// recently accessed sampled keys of an instance.
    fn evict(
        &self,
        instance: &Arc<Instance>,
        count: usize,
        only_type: Option<StorageType>,
        delay: Duration,
        state: &mut ReclaimState,
    ) -> ManagerResult<()> {
        if count == 0 {
            return Ok(());
        }
        let incarnations = self.storages.incarnations();
        let of_type = |location: &LocationRef<'_>| {
            only_type.is_none_or(|wanted| {
                incarnations
                    .get(location.storage)
                    .is_some_and(|i| i.storage_type.quota_type() == wanted.quota_type())
            })
        };
        let evictable = |l: &LocationRef<'_>| l.state == LocationState::Serving && of_type(l);
        let sample = instance
            .index
            .sample((count.saturating_mul(SAMPLE_FACTOR)).max(MIN_SAMPLE))?;
        let entries = instance.index.get(&sample)?;
        let candidates: Vec<BlockKey> = sample
            .iter()
            .zip(&entries)
            .filter(|(_, entry)| {
                entry
                    .as_ref()
                    .is_some_and(|e| e.locations().any(|l| evictable(&l)))
            })
            .map(|(&key, _)| key)
            .collect();
        let keys = instance.access().victims(&candidates, count);
        // What the batches before a failed one moved is DELETING already: it is handed on.
        let (moved, failed) = self.move_locations_in_batches(
            instance,
            &background_batches(instance, keys),
            LocationState::Deleting,
            &mut |_, l| evictable(&l.as_ref()),
        );
        if !moved.is_empty() {
            self.hand_on_evicted(instance, moved, delay, state);
        }
        failed
    }

    /// Reports, counts and queues for deletion the locations an eviction moved to DELETING.
    fn hand_on_evicted(
        &self,
        instance: &Arc<Instance>,
        moved: Vec<(BlockKey, Location)>,
        delay: Duration,
        state: &mut ReclaimState,
    ) {
        let mut evicted: Vec<BlockKey> = moved.iter().map(|(key, _)| *key).collect();
        evicted.dedup();
        if let Some(listener) = self.reclaim_listener.get() {
            listener(instance, &evicted);
        }
        tracing::debug!(instance = %instance.id(), blocks = moved.len(), "reclaimed");
        self.reclaim_stats
            .evicted
            .fetch_add(moved.len() as u64, Ordering::AcqRel);
        state
            .in_flight
            .entry(instance.id().clone())
            .or_default()
            .extend(evicted);
        if delay.is_zero() {
            self.delete_later(instance, moved);
        } else {
            state
                .delayed
                .push((Instant::now() + delay, instance.clone(), moved));
        }
    }
}

/// How many keys the reclaimer evicted from this instance that are still waiting for the
/// deleter (their entry still holds a DELETING location); forgets the others.
fn pending_keys(instance: &Instance, state: &mut ReclaimState) -> ManagerResult<usize> {
    let Some(keys) = state.in_flight.get_mut(instance.id()) else {
        return Ok(0);
    };
    let entries = instance.index.get(keys)?;
    let deleting = |entry: &Option<Entry>| {
        entry
            .as_ref()
            .is_some_and(|e| e.locations().any(|l| l.state == LocationState::Deleting))
    };
    let mut still = entries.iter().map(deleting);
    keys.retain(|_| still.next().unwrap_or(false));
    Ok(keys.len())
}
