//! Two-phase writes (wire fact sheet §12): StartWriteCache allocates WRITING locations for
//! absent keys under a session; FinishWriteCache commits the successful ones (SERVING) and
//! hands the rest to the deleter. Expiry and demotion fail a whole session.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvcm_index::{BlockKey, Modify};
use kvcm_storage::{AllocationRequest, BlockToAllocate, DataStorage, StorageError, StorageKind};

use super::entry::{Entry, Location, LocationId, LocationState, Part, StorageHandle};
use super::error::{ManagerError, ManagerResult};
use super::feed::StateChange;
use super::group_config::PreferStrategy;
use super::instance::Instance;
use super::mask::BlockMask;
use super::quota::{Budget, NoRoom, PendingKeys};
use super::read::{BlockLocation, RenderedPart};
use super::sessions::{OpenRefusal, PendingWrite, Session};
use super::storage_type::StorageType;
use super::storages::Incarnation;
use super::Manager;

/// How long a session with nothing to write is kept.
const EMPTY_SESSION_LIFETIME: Duration = Duration::from_secs(10);

/// When failing a session's blocks failed, how long until the next attempt.
const FAIL_RETRY_DELAY: Duration = Duration::from_millis(200);
/// Keys per journal record when writes are failed: bounded records, since failing follows
/// a commit whose one record may have been refused as too large.
const UNWRITE_BATCH: usize = 1024;

/// A new WRITING location of a key and the location as handed out.
type NewLocation = (BlockKey, Location, BlockLocation);

/// StartWriteCache's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct WriteStart {
    /// The session to finish.
    pub session_id: String,
    /// Which requested blocks are already present (§10.3).
    pub mask: BlockMask,
    /// One location per block to write, in request order.
    pub locations: Vec<BlockLocation>,
    /// Why some absent blocks got no location (a quota or the key cap; they are marked
    /// present in `mask`, as the reference marks every block it hands no location);
    /// `None` when every absent block got one.
    pub refused: Option<String>,
}

impl Manager {
    /// Opens a write session for the absent keys among `keys`. `spec_groups`, when non-empty,
    /// names one location spec group per key, restricting the parts allocated for it.
    pub fn start_write(
        &self,
        instance: &Arc<Instance>,
        keys: Vec<BlockKey>,
        spec_groups: &[String],
        timeout_seconds: i32,
    ) -> ManagerResult<WriteStart> {
        self.start_write_replicas(instance, keys, spec_groups, timeout_seconds, 1)
    }

    /// [`Manager::start_write`] asking for `min_replicas` replicas per key (trunk's
    /// `min_replica_count`; 0 reads as 1): a key is skipped, counted present, when it has
    /// enough (see [`needs_location`]); any other key gets one new location, on a storage
    /// that holds none of its locations yet. A key that every candidate storage already
    /// holds is skipped too (a second copy on the same storage adds no redundancy).
    pub fn start_write_replicas(
        &self,
        instance: &Arc<Instance>,
        keys: Vec<BlockKey>,
        spec_groups: &[String],
        timeout_seconds: i32,
        min_replicas: usize,
    ) -> ManagerResult<WriteStart> {
        let min_replicas = min_replicas.max(1);
        let spec_indexes = spec_indexes_per_key(instance, keys.len(), spec_groups)?;
        let entries = instance.index.get(&keys)?;
        instance.access().touch(&keys);
        let mut present: Vec<bool> = entries
            .iter()
            .map(|e| !needs_location(e.as_ref(), min_replicas))
            .collect();
        let mut prefix_eligible = self.weighted_presence(instance, &entries);
        mark_repeats_present(&keys, &mut present, &mut prefix_eligible);
        let blocks = absent_blocks(&keys, &present, spec_indexes);
        if blocks.is_empty() {
            let deadline = Instant::now() + EMPTY_SESSION_LIFETIME;
            let session_id = self.open_session(instance, &[], deadline)?;
            return Ok(WriteStart {
                session_id,
                mask: BlockMask::from_presence(present, &prefix_eligible),
                locations: Vec::new(),
                refused: None,
            });
        }
        let held = held_storages(&keys, &entries, &blocks);
        let new_key = new_keys(&keys, &entries, &blocks);
        let (placement, pending_keys) =
            self.allocate_somewhere(instance, &blocks, &held, &new_key)?;
        let refused = placement.refusal.clone();
        let new_locations = self.insert_batches(instance, placement.batches, &blocks, min_replicas);
        drop(pending_keys); // the new keys are in the index now, or given up
        let new_locations = new_locations?;
        let written: HashSet<BlockKey> = new_locations.iter().map(|(k, ..)| *k).collect();
        instance
            .access()
            .inserted(&keys, |key| written.contains(&key));
        for (i, key) in keys.iter().enumerate() {
            if !present[i] && !written.contains(key) {
                (present[i], prefix_eligible[i]) = (true, true);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(timeout_seconds.max(0) as u64);
        let session_id = self.open_session(instance, &new_locations, deadline)?;
        let locations = new_locations.into_iter().map(|(.., l)| l).collect();
        Ok(WriteStart {
            session_id,
            mask: BlockMask::from_presence(present, &prefix_eligible),
            locations,
            refused,
        })
    }

    /// Inserts the WRITING locations of every allocated batch (see
    /// [`Manager::insert_writing`]) and returns those inserted in the order of `blocks`.
    /// When a batch fails, the later ones are freed and the earlier ones failed, so that no
    /// location stays WRITING without a session.
    fn insert_batches(
        &self,
        instance: &Arc<Instance>,
        batches: Vec<(Incarnation, Vec<NewLocation>)>,
        blocks: &[BlockToAllocate],
        min_replicas: usize,
    ) -> ManagerResult<Vec<NewLocation>> {
        let mut inserted: Vec<NewLocation> = Vec::new();
        let mut batches = batches.into_iter();
        while let Some((incarnation, allocated)) = batches.next() {
            let backend = incarnation.backend.as_ref();
            match self.insert_writing(instance, backend, allocated, min_replicas) {
                Ok(won) => inserted.extend(won),
                Err(error) => {
                    for (incarnation, rest) in batches {
                        uncount(instance, &rest);
                        free_locations(incarnation.backend.as_ref(), rest.iter().map(|(.., l)| l));
                    }
                    let writes: Vec<PendingWrite> = inserted
                        .iter()
                        .map(|(key, location, _)| PendingWrite::of(*key, location))
                        .collect();
                    let writes: Vec<&PendingWrite> = writes.iter().collect();
                    if let Err(cleanup) = self.fail_or_retry(instance, &writes) {
                        tracing::warn!(%cleanup, "failing the blocks of a start that failed");
                    }
                    return Err(error);
                }
            }
        }
        let order: HashMap<BlockKey, usize> =
            blocks.iter().enumerate().map(|(i, b)| (b.key, i)).collect();
        inserted.sort_by_key(|(key, ..)| order.get(key).copied());
        Ok(inserted)
    }

    /// For each entry: whether it has a location of read weight > 0 (§8.5: only those count
    /// for the pure-prefix form of the mask; none does while no storage is available).
    fn weighted_presence(&self, instance: &Instance, entries: &[Option<Entry>]) -> Vec<bool> {
        let group = self.shared_group(instance.group());
        let candidates = group
            .as_deref()
            .map_or(&[][..], |g| g.storage_candidates.as_slice());
        let Ok(weights) = self.storages.read_weights(candidates) else {
            return vec![false; entries.len()];
        };
        entries
            .iter()
            .map(|e| {
                e.as_ref()
                    .is_some_and(|e| e.locations().any(|l| weights.weight(&l) > 0))
            })
            .collect()
    }

    /// Opens the session that owns these new WRITING locations; a node that lost leadership
    /// meanwhile (its open sessions already failed) fails this one too.
    fn open_session(
        &self,
        instance: &Arc<Instance>,
        new_locations: &[(BlockKey, Location, BlockLocation)],
        deadline: Instant,
    ) -> ManagerResult<String> {
        let writes = new_locations
            .iter()
            .map(|(key, l, _)| PendingWrite::of(*key, l))
            .collect();
        let session = Session {
            instance: instance.clone(),
            writes,
            deadline,
        };
        let per_instance = self.limits.max_sessions_per_instance;
        self.sessions
            .open(session, per_instance, || self.leadership.is_leader())
            .map_err(|(refused, why)| {
                self.fail_session(refused);
                match why {
                    OpenRefusal::NotAllowed => ManagerError::NotLeader,
                    OpenRefusal::PerInstanceLimit(limit) => ManagerError::Capacity(format!(
                        "instance {:?} holds {limit} open write sessions \
                         (kvcm.service.max_sessions_per_instance)",
                        instance.id()
                    )),
                }
            })
    }

    /// Commits the session's blocks in `success` (positions in the session's location list)
    /// and deletes the others. An invalid mask leaves the session open.
    pub fn finish_write(
        &self,
        instance: &Instance,
        session_id: &str,
        success: &BlockMask,
    ) -> ManagerResult<Vec<BlockKey>> {
        self.finish_write_with_checksums(instance, session_id, success, &[])
    }

    /// [`Manager::finish_write`] storing the writer's checksums with the committed locations:
    /// `checksums` is empty (none) or has one list per location of the session, each empty or
    /// one checksum per part of that location. A list of another shape is refused
    /// (INVALID_ARGUMENT naming `locations`) and leaves the session open.
    pub fn finish_write_with_checksums(
        &self,
        instance: &Instance,
        session_id: &str,
        success: &BlockMask,
        checksums: &[Vec<u64>],
    ) -> ManagerResult<Vec<BlockKey>> {
        let session = self.sessions.take_checked(session_id, |session| {
            if session.instance.id() != instance.id() {
                return Err(ManagerError::invalid_because(
                    "instance_id",
                    format!("session belongs to {}", session.instance.id()),
                ));
            }
            // A session of an earlier instance of this id (removed since): committing would
            // put blocks in an index nothing deletes any more. It fails at its deadline.
            if !std::ptr::eq(Arc::as_ptr(&session.instance), instance) {
                return Err(ManagerError::invalid_because(
                    "write_session_id",
                    format!(
                        "the session belongs to an earlier instance of {}, removed since",
                        instance.id()
                    ),
                ));
            }
            check_checksums(&session.writes, checksums)
                .map_err(|detail| ManagerError::invalid_because("locations", detail))?;
            success
                .check_len(session.writes.len())
                .map_err(|detail| ManagerError::invalid_because("success_blocks", detail))
        })?;
        let checksums_of: HashMap<LocationId, &[u64]> = session
            .writes
            .iter()
            .zip(checksums)
            .filter(|(_, sums)| !sums.is_empty())
            .map(|(write, sums)| (write.location_id, sums.as_slice()))
            .collect();
        let (committed, failed): (Vec<_>, Vec<_>) = session
            .writes
            .iter()
            .enumerate()
            .partition(|(j, _)| success.contains(*j));
        let committed: Vec<&PendingWrite> = committed.into_iter().map(|(_, w)| w).collect();
        let failed: Vec<&PendingWrite> = failed.into_iter().map(|(_, w)| w).collect();
        let failing = self.fail_or_retry(&session.instance, &failed);
        let moved = match self.commit_writes(&session.instance, &committed, &checksums_of) {
            Ok(moved) => moved,
            Err(error) => {
                // Never leave a consumed session's blocks WRITING: fail the commits too.
                if let Err(cleanup) = self.fail_or_retry(&session.instance, &committed) {
                    tracing::warn!(%cleanup, "failing blocks of a session whose commit failed");
                }
                return Err(error);
            }
        };
        failing?;
        if moved.len() < committed.len() {
            return Err(ManagerError::Partial(format!(
                "{} of {} committed blocks vanished before FinishWriteCache",
                committed.len() - moved.len(),
                committed.len()
            )));
        }
        Ok(committed.iter().map(|write| write.key).collect())
    }

    /// Fails a session whose StartWriteCache answer never reached its caller and removes
    /// its blocks before returning: afterwards its keys are as absent as before the call
    /// (a retry over another path allocates them again instead of finding them present).
    pub fn abandon_write(&self, instance: &Instance, session_id: &str) -> ManagerResult<()> {
        let session = self.sessions.take_checked(session_id, |session| {
            if session.instance.id() != instance.id() {
                return Err(ManagerError::invalid_because(
                    "instance_id",
                    format!("session belongs to {}", session.instance.id()),
                ));
            }
            Ok(())
        })?;
        let writes: Vec<&PendingWrite> = session.writes.iter().collect();
        let (moved, unwritten) = self.unwrite(&session.instance, &writes);
        self.delete_at_once(&session.instance, moved);
        if unwritten.is_err() {
            self.retry_failing(&session.instance, &writes);
        }
        unwritten
    }

    /// Fails every block of an expired or abandoned session.
    pub(crate) fn fail_session(&self, session: Session) {
        let writes: Vec<&PendingWrite> = session.writes.iter().collect();
        if let Err(error) = self.fail_or_retry(&session.instance, &writes) {
            tracing::warn!(%error, "failing an expired write session");
        }
    }

    /// Fails these writes; when that fails, queues them as a session that expires after
    /// [`FAIL_RETRY_DELAY`], so that no block stays WRITING without a session.
    fn fail_or_retry(
        &self,
        instance: &Arc<Instance>,
        writes: &[&PendingWrite],
    ) -> ManagerResult<()> {
        let failed = self.fail_writes(instance, writes);
        if failed.is_err() {
            self.retry_failing(instance, writes);
        }
        failed
    }

    /// Queues `writes` as a session that expires after [`FAIL_RETRY_DELAY`], to be failed
    /// again (those already failed are not selected twice: they are no longer WRITING).
    fn retry_failing(&self, instance: &Arc<Instance>, writes: &[&PendingWrite]) {
        self.sessions.requeue(Session {
            instance: instance.clone(),
            writes: writes.iter().map(|w| (*w).clone()).collect(),
            deadline: Instant::now() + FAIL_RETRY_DELAY,
        });
    }

    /// WRITING → DELETING for these writes, then queues the deletion of those that moved
    /// (durably, even when a later batch failed).
    fn fail_writes(&self, instance: &Arc<Instance>, writes: &[&PendingWrite]) -> ManagerResult<()> {
        let (moved, unwritten) = self.unwrite(instance, writes);
        self.delete_later(instance, moved);
        unwritten
    }

    /// Moves the WRITING locations of `writes` to DELETING, [`UNWRITE_BATCH`] keys per
    /// journal record (failing a session whose commit record was too large must not need
    /// one as large); returns those that moved durably and, when a batch failed, its error.
    fn unwrite(
        &self,
        instance: &Instance,
        writes: &[&PendingWrite],
    ) -> (Vec<(BlockKey, Location)>, ManagerResult<()>) {
        let (mut keys, ids) = writes_by_key(writes);
        // Keys of one lock group together: each batch locks as few shards as it can.
        keys.sort_unstable_by_key(|&key| (instance.index.lock_group(key), key));
        let batches: Vec<Vec<BlockKey>> = keys.chunks(UNWRITE_BATCH).map(<[_]>::to_vec).collect();
        let to = LocationState::Deleting;
        self.move_locations_in_batches(instance, &batches, to, &mut |key, location| {
            location.state == LocationState::Writing
                && ids
                    .get(&key)
                    .is_some_and(|ids| ids.contains(&location.as_ref().id()))
        })
    }

    /// Moves the WRITING locations of `writes` to SERVING with their checksums; returns
    /// those that moved. A commit needs every part on a live pool node (checked under the
    /// key's lock, see `pools`): the blocks of a node that died are refused.
    fn commit_writes(
        &self,
        instance: &Instance,
        writes: &[&PendingWrite],
        checksums: &HashMap<LocationId, &[u64]>,
    ) -> ManagerResult<Vec<(BlockKey, Location)>> {
        let (keys, ids) = writes_by_key(writes);
        self.move_locations(
            instance,
            &keys,
            LocationState::Serving,
            &mut |key, location| {
                let id = location.as_ref().id();
                let selected = location.state == LocationState::Writing
                    && ids.get(&key).is_some_and(|ids| ids.contains(&id))
                    && self.location_held(location);
                if selected {
                    if let Some(sums) = checksums.get(&id) {
                        location.checksums = sums.to_vec();
                    }
                }
                selected
            },
        )
    }

    /// Moves every location selected by `select` to state `to` (one compare-and-set per
    /// key, each change published inside it); returns the moved locations in their new state.
    /// `select` may amend the location it selects (a commit stores its checksums).
    pub(crate) fn move_locations(
        &self,
        instance: &Instance,
        keys: &[BlockKey],
        to: LocationState,
        select: &mut dyn FnMut(BlockKey, &mut Location) -> bool,
    ) -> ManagerResult<Vec<(BlockKey, Location)>> {
        let (moved, result) =
            self.move_locations_in_batches(instance, &[keys.to_vec()], to, select);
        result.map(|()| moved)
    }

    /// [`Manager::move_locations`] over each of `batches` in turn (each under its own locks,
    /// as background writers batch by lock group), waiting for the journal once, after the
    /// last: a reclaimer's pass of many small batches shares its syncs. Returns what moved
    /// and, when a batch failed, its error: the batches before it stay moved (and are
    /// returned when durable), it and those after it do not.
    pub(crate) fn move_locations_in_batches(
        &self,
        instance: &Instance,
        batches: &[Vec<BlockKey>],
        to: LocationState,
        select: &mut dyn FnMut(BlockKey, &mut Location) -> bool,
    ) -> (Vec<(BlockKey, Location)>, ManagerResult<()>) {
        let mut moved = Vec::new();
        let mut visible = Vec::new();
        let mut modify = |key, current: Option<&Entry>| {
            let Some(entry) = current else {
                return Modify::Keep;
            };
            let mut locations = entry.to_locations();
            let mut changed = false;
            for location in locations.iter_mut() {
                if !select(key, location) {
                    continue;
                }
                self.feed.publish(StateChange {
                    instance_id: instance.id().clone(),
                    key,
                    location_id: location.as_ref().id(),
                    from: Some(location.state),
                    to: Some(to),
                });
                changed |= location.state != to;
                if location.state != to
                    && (location.state == LocationState::Serving || to == LocationState::Serving)
                {
                    visible.push(key);
                }
                location.state = to;
                moved.push((key, location.clone()));
            }
            if changed {
                Modify::Put(Entry::new(locations))
            } else {
                Modify::Keep
            }
        };
        let result = match instance
            .index
            .read_modify_write_batches(batches, &mut modify)
        {
            Ok(()) => Ok(()),
            Err(stopped) => {
                let applied: HashSet<BlockKey> = batches[..stopped.applied]
                    .iter()
                    .flatten()
                    .copied()
                    .collect();
                visible.retain(|key| applied.contains(key));
                // Moves that are not durable are not handed on: a restart may bring their
                // locations back as they were, so their bytes must stay.
                moved.retain(|(key, _)| stopped.durable && applied.contains(key));
                Err(stopped.error.into())
            }
        };
        // Readers of the lookup table see SERVING only: tell the publisher about the keys
        // whose SERVING set changed, before anyone is answered.
        visible.dedup();
        self.published_keys_changed(instance, &visible);
        (moved, result)
    }

    /// Adds one WRITING location per allocated block whose key still needs one (checked
    /// under the index lock: a concurrent StartWriteCache may have won the key meanwhile) and
    /// returns those inserted; frees the allocation of the others, or of all on failure.
    fn insert_writing(
        &self,
        instance: &Instance,
        backend: &dyn DataStorage,
        allocated: Vec<(BlockKey, Location, BlockLocation)>,
        min_replicas: usize,
    ) -> ManagerResult<Vec<(BlockKey, Location, BlockLocation)>> {
        let by_key: HashMap<BlockKey, &Location> =
            allocated.iter().map(|(k, l, _)| (*k, l)).collect();
        let keys: Vec<BlockKey> = allocated.iter().map(|(k, ..)| *k).collect();
        let mut taken = HashSet::new();
        let change = |key: BlockKey, from, to| StateChange {
            instance_id: instance.id().clone(),
            key,
            location_id: by_key[&key].as_ref().id(),
            from,
            to,
        };
        let inserted =
            instance
                .index
                .read_modify_write(&keys, &mut |key, current: Option<&Entry>| {
                    if !needs_location(current, min_replicas) {
                        taken.insert(key);
                        return Modify::Keep;
                    }
                    // Published under the key's lock, before anyone can move the location.
                    self.feed
                        .publish(change(key, None, Some(LocationState::Writing)));
                    let mut locations = current.map_or_else(Vec::new, Entry::to_locations);
                    locations.push((*by_key[&key]).clone());
                    Modify::Put(Entry::new(locations))
                });
        if let Err(error) = inserted {
            // Nothing was stored: retract what the feed was told.
            for key in keys.iter().filter(|key| !taken.contains(key)) {
                self.feed
                    .publish(change(*key, Some(LocationState::Writing), None));
            }
            uncount(instance, &allocated);
            free_locations(backend, allocated.iter().map(|(.., l)| l));
            return Err(error.into());
        }
        let (lost, won): (Vec<_>, Vec<_>) =
            allocated.into_iter().partition(|(k, ..)| taken.contains(k));
        uncount(instance, &lost);
        free_locations(backend, lost.iter().map(|(.., l)| l));
        Ok(won)
    }

    /// Allocates each block on the first storage of [`Manager::write_candidates`] that has
    /// room and does not hold one of its key's locations yet (`held`, per block): blocks go
    /// in batches, one per storage (a full one, such as a pool whose nodes are full, or one
    /// where a block's place holds a file kvcm does not own, passes to the next). Each block
    /// is budgeted against the quotas first ([`Budget`]): one over its type's quota passes
    /// to the next storage, one over the group quota or the key cap is refused. A block that
    /// every candidate already holds is left out of the answer (its key is skipped), and so
    /// is a refused one (the reason comes back with the batches); a block no storage had
    /// bytes for fails the whole call, freeing what was allocated, and so does a call whose
    /// every block was refused. Runs inside the group's write gate and counts the placed
    /// blocks' bytes in the usage (and their new keys as pending) before leaving it, so the
    /// next write's budget sees them.
    fn allocate_somewhere<'a>(
        &self,
        instance: &'a Instance,
        blocks: &[BlockToAllocate],
        held: &[Vec<StorageHandle>],
        new_key: &[bool],
    ) -> ManagerResult<(Placement, PendingKeys<'a>)> {
        let _gate = self.write_gates.enter(instance.group());
        let placement = self.place(instance, blocks, held, new_key)?;
        let placed: HashSet<BlockKey> = placement
            .batches
            .iter()
            .flat_map(|(_, allocated)| allocated.iter().map(|(key, ..)| *key))
            .collect();
        for (_, allocated) in &placement.batches {
            count(instance, allocated);
        }
        let new_keys = blocks
            .iter()
            .zip(new_key)
            .filter(|(block, &new)| new && placed.contains(&block.key))
            .count();
        Ok((placement, PendingKeys::hold(instance, new_keys as u64)))
    }

    /// The placement of [`Manager::allocate_somewhere`], before it is counted.
    fn place(
        &self,
        instance: &Instance,
        blocks: &[BlockToAllocate],
        held: &[Vec<StorageHandle>],
        new_key: &[bool],
    ) -> ManagerResult<Placement> {
        let (candidates, budget) = self.write_candidates(instance)?;
        let mut rationing = Rationing::new(budget, instance, blocks, held, new_key);
        let mut placement = Placement::default();
        let mut remaining: Vec<usize> = (0..blocks.len()).collect();
        let mut storage_full = vec![false; blocks.len()];
        let mut last_full = None;
        for (handle, incarnation) in candidates {
            let storage_type = incarnation.storage_type;
            let (here, later) = rationing.split(remaining, handle, storage_type);
            remaining = later;
            if here.is_empty() {
                continue;
            }
            let batch: Vec<BlockToAllocate> = here.iter().map(|&i| blocks[i].clone()).collect();
            match allocate(instance, handle, &incarnation, &batch, &self.nonces) {
                Ok(allocated) => placement.batches.push((incarnation, allocated)),
                Err(ManagerError::Storage(
                    StorageError::Full(why) | StorageError::Foreign(why),
                )) => {
                    rationing.give_back(&here, storage_type);
                    here.iter().for_each(|&i| storage_full[i] = true);
                    remaining.extend(here);
                    remaining.sort_unstable();
                    last_full = Some(why);
                }
                Err(other) => {
                    placement.free();
                    return Err(other);
                }
            }
        }
        if remaining.iter().any(|&i| storage_full[i]) {
            placement.free();
            return Err(ManagerError::NoSpace(last_full.unwrap_or_else(|| {
                "no storage of the group fits its strategy".to_string()
            })));
        }
        placement.refusal = rationing.refusal(&remaining);
        match (&placement.refusal, placement.batches.is_empty()) {
            (Some(why), true) => Err(ManagerError::NoSpace(why.clone())),
            _ => Ok(placement),
        }
    }

    /// The storages a write of this instance may go to, in order (wire fact sheet §16.3),
    /// and the write's budget: the group quota must have room; candidates are the group's
    /// registered, available storages whose type quota has room; the group's preference
    /// strategy puts its type first (and, for ALWAYS_*, only that type).
    fn write_candidates(
        &self,
        instance: &Instance,
    ) -> ManagerResult<(Vec<(StorageHandle, Incarnation)>, Budget)> {
        let group = self.group(instance.group())?;
        let budget = self.write_budget(&group, instance)?;
        let candidates: Vec<_> = self
            .storages
            .available(&group.storage_candidates)
            .into_iter()
            .filter(|(_, incarnation)| budget.type_has_room(incarnation.backend.kind()))
            .collect();
        let (wanted, strict) = preferred_kind(group.cache.prefer);
        let (preferred, others): (Vec<_>, Vec<_>) = candidates
            .into_iter()
            .partition(|(_, incarnation)| Some(incarnation.backend.kind()) == wanted);
        let mut ordered = preferred;
        if !strict {
            ordered.extend(others);
        }
        if ordered.is_empty() {
            return Err(ManagerError::NoSpace(format!(
                "no available storage of group {:?} fits its strategy",
                group.name
            )));
        }
        Ok((ordered, budget))
    }
}

/// The quota side of [`Manager::allocate_somewhere`]: each block's bytes and whether its key
/// is new, the write's [`Budget`], and why blocks were refused.
struct Rationing<'a> {
    budget: Budget,
    bytes: Vec<i64>,
    new_key: &'a [bool],
    held: &'a [Vec<StorageHandle>],
    over_type_quota: Vec<bool>,
    type_reason: Option<String>,
    refused: Option<String>,
}

impl<'a> Rationing<'a> {
    fn new(
        budget: Budget,
        instance: &Instance,
        blocks: &[BlockToAllocate],
        held: &'a [Vec<StorageHandle>],
        new_key: &'a [bool],
    ) -> Self {
        let bytes = blocks
            .iter()
            .map(|b| instance.spec_bytes(b.spec_indexes.iter().copied()))
            .collect();
        Rationing {
            budget,
            bytes,
            new_key,
            held,
            over_type_quota: vec![false; blocks.len()],
            type_reason: None,
            refused: None,
        }
    }

    /// Splits the remaining blocks for one storage: those it takes (budgeted), and those
    /// left for later storages (held here, or over this type's quota). Blocks over the group
    /// quota or the key cap are in neither: they are refused.
    fn split(
        &mut self,
        remaining: Vec<usize>,
        handle: StorageHandle,
        storage_type: StorageType,
    ) -> (Vec<usize>, Vec<usize>) {
        let (mut here, mut later) = (Vec::new(), Vec::new());
        for i in remaining {
            if self.held[i].contains(&handle) {
                later.push(i);
                continue;
            }
            match self
                .budget
                .take(storage_type, self.bytes[i], self.new_key[i])
            {
                Ok(()) => here.push(i),
                Err(NoRoom::Type(why)) => {
                    later.push(i);
                    self.over_type_quota[i] = true;
                    self.type_reason = Some(why);
                }
                Err(NoRoom::Refused(why)) => self.refused = Some(why),
            }
        }
        (here, later)
    }

    /// Returns the budget of blocks a storage could not place after all.
    fn give_back(&mut self, blocks: &[usize], storage_type: StorageType) {
        for &i in blocks {
            self.budget
                .give_back(storage_type, self.bytes[i], self.new_key[i]);
        }
    }

    /// Why blocks got no location, if any did: refused ones, or `unplaced` ones that were
    /// over a type quota on every storage they tried.
    fn refusal(self, unplaced: &[usize]) -> Option<String> {
        let over_type = unplaced.iter().any(|&i| self.over_type_quota[i]);
        self.refused.or(self.type_reason.filter(|_| over_type))
    }
}

/// What [`Manager::allocate_somewhere`] placed: one batch per storage, and why some blocks
/// were refused (`None`: none was).
#[derive(Default)]
struct Placement {
    batches: Vec<(Incarnation, Vec<NewLocation>)>,
    refusal: Option<String>,
}

impl Placement {
    /// Frees every allocation (none of them entered the index).
    fn free(&self) {
        for (incarnation, allocated) in &self.batches {
            free_locations(
                incarnation.backend.as_ref(),
                allocated.iter().map(|(.., l)| l),
            );
        }
    }
}

/// Counts new locations in their instance's usage.
fn count(instance: &Instance, allocated: &[NewLocation]) {
    for (_, location, rendered) in allocated {
        let bytes = instance.location_bytes(&location.as_ref());
        instance.usage().add(rendered.storage_type, bytes);
    }
}

/// Takes counted locations back out of the usage (their allocation is freed before they
/// entered the index).
fn uncount(instance: &Instance, allocated: &[NewLocation]) {
    for (_, location, rendered) in allocated {
        let bytes = instance.location_bytes(&location.as_ref());
        instance.usage().add(rendered.storage_type, -bytes);
    }
}

/// The backend kind a strategy asks for, and whether it is required (ALWAYS_*) rather than
/// preferred (PREFER_*).
fn preferred_kind(strategy: PreferStrategy) -> (Option<StorageKind>, bool) {
    match strategy {
        PreferStrategy::Unspecified => (None, false),
        PreferStrategy::Always(storage_type) => (storage_type.kind(), true),
        PreferStrategy::Prefer(storage_type) => (storage_type.kind(), false),
    }
}

/// For each of `key_count` keys, the indexes of the specs to allocate: all of them, or
/// those of the key's location spec group.
fn spec_indexes_per_key(
    instance: &Instance,
    key_count: usize,
    spec_groups: &[String],
) -> ManagerResult<Vec<Vec<usize>>> {
    let all: Vec<usize> = (0..instance.specs().len()).collect();
    if spec_groups.is_empty() {
        return Ok(vec![all; key_count]);
    }
    if spec_groups.len() != key_count {
        return Err(ManagerError::Refused(format!(
            "{} location_spec_group_names for {key_count} keys",
            spec_groups.len()
        )));
    }
    spec_groups
        .iter()
        .map(|name| {
            let group = instance
                .info()
                .spec_groups
                .iter()
                .find(|g| &g.name == name)
                .ok_or_else(|| {
                    ManagerError::Refused(format!("location spec group {name:?} is not registered"))
                })?;
            Ok(all
                .iter()
                .copied()
                .filter(|&i| group.spec_names.contains(&instance.specs()[i].name))
                .collect())
        })
        .collect()
}

/// Frees the bytes of locations that never entered the index.
fn free_locations<'a>(
    backend: &dyn DataStorage,
    locations: impl Iterator<Item = &'a BlockLocation>,
) {
    let uris = locations
        .flat_map(|l| l.parts.iter())
        .map(|part| part.uri.clone());
    free_uris(backend, uris.collect());
}

/// Frees allocated URIs that no location will hold (nothing to do for none).
fn free_uris(backend: &dyn DataStorage, uris: Vec<String>) {
    if uris.is_empty() {
        return;
    }
    if let Err(free_error) = backend.delete(&uris) {
        tracing::warn!(%free_error, "freeing an unused allocation failed");
    }
}

/// Whether a key whose entry is `entry` needs a new location when `min_replicas` (≥ 1)
/// replicas are asked. With 1 (the 2026-02 rule) any location makes the key present. With
/// more, its SERVING and WRITING locations count: a write in flight counts toward the target,
/// so that a repeated or concurrent StartWriteCache does not allocate beyond it.
fn needs_location(entry: Option<&Entry>, min_replicas: usize) -> bool {
    let Some(entry) = entry else {
        return true;
    };
    if min_replicas <= 1 {
        return entry.is_empty();
    }
    let replicas = entry
        .locations()
        .filter(|l| matches!(l.state, LocationState::Serving | LocationState::Writing))
        .count();
    replicas < min_replicas
}

/// Per block to allocate: the storages that already hold a SERVING or WRITING location of
/// its key (a new replica goes elsewhere).
fn held_storages(
    keys: &[BlockKey],
    entries: &[Option<Entry>],
    blocks: &[BlockToAllocate],
) -> Vec<Vec<StorageHandle>> {
    let by_key: HashMap<BlockKey, &Entry> = keys
        .iter()
        .zip(entries)
        .filter_map(|(key, entry)| Some((*key, entry.as_ref()?)))
        .collect();
    blocks
        .iter()
        .map(|block| {
            by_key.get(&block.key).map_or_else(Vec::new, |entry| {
                entry
                    .locations()
                    .filter(|l| matches!(l.state, LocationState::Serving | LocationState::Writing))
                    .map(|l| l.storage)
                    .collect()
            })
        })
        .collect()
}

/// Per block to allocate: whether its key is not in the index yet (it then takes one key of
/// the instance's `max_key_count`).
fn new_keys(keys: &[BlockKey], entries: &[Option<Entry>], blocks: &[BlockToAllocate]) -> Vec<bool> {
    let present: HashSet<BlockKey> = keys
        .iter()
        .zip(entries)
        .filter(|(_, entry)| entry.is_some())
        .map(|(key, _)| *key)
        .collect();
    blocks.iter().map(|b| !present.contains(&b.key)).collect()
}

/// Marks every repeat of a key inside one request as present (and prefix-eligible), so
/// that only its first copy is allocated and the mask says the repeats need no write.
fn mark_repeats_present(keys: &[BlockKey], present: &mut [bool], prefix_eligible: &mut [bool]) {
    let mut seen = HashSet::with_capacity(keys.len());
    for (i, key) in keys.iter().enumerate() {
        if !seen.insert(*key) && !present[i] {
            (present[i], prefix_eligible[i]) = (true, true);
        }
    }
}

/// The blocks to allocate: the absent keys, in request order, with their parts.
fn absent_blocks(
    keys: &[BlockKey],
    present: &[bool],
    spec_indexes: Vec<Vec<usize>>,
) -> Vec<BlockToAllocate> {
    keys.iter()
        .zip(present)
        .zip(spec_indexes)
        .filter(|((_, &present), _)| !present)
        .map(|((&key, _), spec_indexes)| BlockToAllocate { key, spec_indexes })
        .collect()
}

/// Allocates the blocks and builds their WRITING locations, with the URIs handed out.
fn allocate(
    instance: &Instance,
    handle: StorageHandle,
    incarnation: &Incarnation,
    blocks: &[BlockToAllocate],
    nonces: &AtomicU32,
) -> ManagerResult<Vec<(BlockKey, Location, BlockLocation)>> {
    let request = AllocationRequest {
        instance_id: instance.id(),
        specs: instance.specs(),
        blocks,
    };
    let allocated = incarnation.backend.allocate(&request)?;
    let complete = allocated.len() == blocks.len()
        && blocks
            .iter()
            .zip(&allocated)
            .all(|(block, placed)| block.spec_indexes.len() == placed.len());
    if !complete {
        // Never keep what a backend placed for an answer that cannot be used.
        let uris = allocated.iter().flatten().map(|p| p.uri.clone()).collect();
        free_uris(incarnation.backend.as_ref(), uris);
        return Err(ManagerError::Partial(format!(
            "storage {} placed {} of {} blocks, or not every part of them",
            incarnation.name,
            allocated.len(),
            blocks.len()
        )));
    }
    Ok(blocks
        .iter()
        .zip(allocated)
        .map(|(block, specs)| {
            let spec_ids = block.spec_indexes.iter().map(|&i| i as u16);
            let parts: Vec<Part> = spec_ids
                .clone()
                .zip(&specs)
                .map(|(spec, placed)| Part {
                    spec,
                    address: placed.address,
                })
                .collect();
            let rendered = BlockLocation {
                storage_type: incarnation.storage_type,
                spec_count: specs.len(),
                parts: spec_ids
                    .zip(specs)
                    .map(|(spec, placed)| RenderedPart {
                        spec,
                        uri: placed.uri,
                    })
                    .collect(),
            };
            let location = Location {
                storage: handle,
                state: LocationState::Writing,
                nonce: next_nonce(nonces),
                parts,
                checksums: Vec::new(),
            };
            (block.key, location, rendered)
        })
        .collect())
}

/// The next location nonce from `nonces`: never 0 (an empty slot of the lookup table), also
/// once the counter wraps after 2^32 allocations (a server's lifetime count: recovery carries
/// it on).
pub(crate) fn next_nonce(nonces: &AtomicU32) -> u32 {
    loop {
        let nonce = nonces.fetch_add(1, Ordering::Relaxed);
        if nonce != 0 {
            return nonce;
        }
    }
}

/// The keys of `writes` and the ids of their locations per key.
fn writes_by_key(writes: &[&PendingWrite]) -> (Vec<BlockKey>, HashMap<BlockKey, Vec<LocationId>>) {
    let mut ids: HashMap<BlockKey, Vec<LocationId>> = HashMap::new();
    for write in writes {
        ids.entry(write.key).or_default().push(write.location_id);
    }
    (ids.keys().copied().collect(), ids)
}

/// Checks the shape of FinishWriteCache's checksums against the session's writes.
fn check_checksums(writes: &[PendingWrite], checksums: &[Vec<u64>]) -> Result<(), String> {
    if checksums.is_empty() {
        return Ok(());
    }
    if checksums.len() != writes.len() {
        return Err(format!(
            "{} locations carry checksums but the session has {} locations",
            checksums.len(),
            writes.len()
        ));
    }
    for (position, (write, sums)) in writes.iter().zip(checksums).enumerate() {
        if !sums.is_empty() && sums.len() != write.parts {
            return Err(format!(
                "location {position} carries {} checksums for {} parts (one per part, or none)",
                sums.len(),
                write.parts
            ));
        }
    }
    Ok(())
}
