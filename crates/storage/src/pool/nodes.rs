//! The members of one memory pool: every node that joined, one slot per incarnation.
//!
//! A node joins with its id and endpoint and gets a fresh slot whose `range_id` (a random
//! 64-bit number) names that incarnation in every URI placed on it. A slot is live while
//! its node heartbeats: after [`MISSED_HEARTBEATS`] intervals without one it is dead, its
//! allocator is dropped and nothing is placed on it again. A node that joins again (after a
//! restart, or after being declared dead) gets a new slot; its earlier live slot dies at
//! once.
//!
//! Resuming after a manager restart: the write-ahead log names each pool part by its node
//! and `range_id`, so the restarted manager adopts the parts into an *awaiting* slot of
//! that incarnation (nothing placed or read there, not live). A node whose process kept its
//! region joins again naming the incarnation it had (`resume_range_id`): the awaiting slot
//! becomes live again with the same `range_id`, its allocator holding the adopted parts,
//! and the blocks are found again. A node that does not come back within the resume window
//! (counted from the first reap after the restart: the reaper starts once recovery is
//! over), or joins without naming it (a restarted node: its memory is gone), lets the
//! awaiting slot die like a dead node's.
//!
//! Tenants: every instance that places blocks in the pool gets a [`Tenant`] number, the same
//! on every node, so that a node's slabs each hold one instance's parts (see `allocator`).
//!
//! Invariants: slots are never removed or reused, so a slot index in a stored address names
//! one incarnation forever; a tenant number names one instance for the process's life; only
//! live slots hold an allocator, only awaiting ones adopted parts, and no slab of an
//! awaiting slot holds two tenants' parts; a rejoining node's share of new blocks ramps up
//! linearly over the ramp time (a resumed node's does not: it kept its blocks).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use super::ownership::{Applied, Feed, OwnershipUpdate};
use crate::allocator::{AdoptedPart, AllocError, PoolAllocator, Tenant, SLAB_BYTES};
use crate::names::check_name;
use crate::StorageError;

/// Heartbeat intervals without a heartbeat after which a node is dead.
pub const MISSED_HEARTBEATS: u32 = 3;
/// Longest node id or endpoint accepted.
const MAX_NAME: usize = 255;

/// How often nodes heartbeat and how long a rejoining node's share takes to ramp up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolTiming {
    /// The heartbeat interval nodes are told to keep.
    pub heartbeat: Duration,
    /// How long a node that joins again takes to reach its full share of new blocks.
    pub rejoin_ramp: Duration,
    /// How long, after a manager restart, the blocks of a node's earlier incarnation wait
    /// for it to resume before they are removed (counted from the first reap).
    pub resume_window: Duration,
}

impl Default for PoolTiming {
    fn default() -> Self {
        PoolTiming {
            heartbeat: Duration::from_millis(500),
            rejoin_ramp: Duration::from_secs(30),
            resume_window: Duration::from_secs(30),
        }
    }
}

/// What a node says when it joins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolNodeJoin {
    /// Stable id of the node (the `node_id` URI parameter).
    pub node_id: String,
    /// Where clients reach its queue-pair listener (`host:port`).
    pub endpoint: String,
    /// Bytes of its region.
    pub capacity: u64,
    /// The incarnation this node had and whose region it kept (its process did not
    /// restart), to resume after a manager restart.
    pub resume_range_id: Option<u64>,
    /// The node isolates its tenants: its heartbeats are answered with who owns what
    /// (`ownership`), and a run a tenant gave up is placed again only once the node applied
    /// that.
    pub isolated: bool,
}

/// What a joined node is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolMembership {
    /// Names this incarnation (the `range_id` URI parameter).
    pub range_id: u64,
    /// How often to heartbeat.
    pub heartbeat: Duration,
}

/// One incarnation of a node, as the pool reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolNodeStatus {
    /// The node's id.
    pub node_id: String,
    /// Its queue-pair listener.
    pub endpoint: String,
    /// This incarnation.
    pub range_id: u64,
    /// Bytes of its region.
    pub capacity: u64,
    /// Bytes of the blocks placed on it (0 once dead; while awaiting its node after a
    /// manager restart, the bytes of the parts adopted for it).
    pub used: u64,
    /// Whether it heartbeats.
    pub live: bool,
}

/// One incarnation of a node.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) node_id: String,
    pub(crate) endpoint: String,
    pub(crate) range_id: u64,
    pub(crate) capacity: u64,
    /// Present while live.
    pub(crate) allocator: Option<PoolAllocator>,
    /// Present while live, when the node isolates its tenants.
    feed: Option<Feed>,
    /// Present while awaiting its node after a manager restart.
    awaiting: Option<Awaiting>,
    /// The last heartbeat.
    last_heartbeat: Instant,
    joined: Instant,
    /// The node had an earlier incarnation: its share of new blocks ramps up.
    ramps: bool,
}

/// An incarnation adopted from an earlier manager process, awaiting its node.
#[derive(Debug, Default)]
struct Awaiting {
    /// The adopted parts: offset → size and tenant.
    parts: BTreeMap<u64, (u64, Tenant)>,
    /// When the resume window opened: at the first reap after adoption (the reaper starts
    /// with the listeners, once recovery is over, so a long recovery does not eat into it).
    since: Option<Instant>,
}

/// Every slot of one pool.
#[derive(Debug, Default)]
pub(crate) struct Nodes {
    pub(crate) slots: Vec<Slot>,
    pub(crate) timing: PoolTiming,
    /// The tenant number of each instance that placed or adopted a part.
    pub(crate) tenants: HashMap<String, Tenant>,
}

impl Nodes {
    /// The tenant number of instance `instance_id` (a new one the first time; numbers are
    /// never given back, so a process numbers at most 2^32 instances).
    pub(crate) fn tenant(&mut self, instance_id: &str) -> Result<Tenant, StorageError> {
        if let Some(&tenant) = self.tenants.get(instance_id) {
            return Ok(tenant);
        }
        let tenant = Tenant::try_from(self.tenants.len()).map_err(|_| {
            StorageError::Full("the pool has numbered 2^32 instances already".into())
        })?;
        self.tenants.insert(instance_id.to_string(), tenant);
        Ok(tenant)
    }

    /// Adds a slot for `join`; returns its membership and the slots of the node's earlier
    /// incarnations that died because of it.
    pub(crate) fn join(
        &mut self,
        join: PoolNodeJoin,
        now: Instant,
    ) -> Result<(PoolMembership, Vec<u32>), StorageError> {
        check_join(&join)?;
        let mut allocator = PoolAllocator::new(join.capacity).map_err(|error| {
            StorageError::InvalidRequest(format!("pool node capacity {}: {error}", join.capacity))
        })?;
        if u32::try_from(self.slots.len()).is_err() {
            return Err(StorageError::InvalidRequest("2^32 pool node joins".into()));
        }
        if let Some(resumed) = self.resume(&join, now) {
            return Ok(resumed);
        }
        let mut retired = Vec::new();
        let mut ramps = false;
        for (index, slot) in self.slots.iter_mut().enumerate() {
            if slot.node_id == join.node_id {
                ramps = true;
                if slot.die() {
                    retired.push(index as u32);
                }
            }
        }
        let range_id = self.unused_range_id();
        let feed = join.isolated.then(|| Feed::start(&mut allocator));
        self.slots.push(Slot {
            node_id: join.node_id,
            endpoint: join.endpoint,
            range_id,
            capacity: join.capacity,
            allocator: Some(allocator),
            feed,
            awaiting: None,
            last_heartbeat: now,
            joined: now,
            ramps,
        });
        Ok((self.membership(range_id), retired))
    }

    fn membership(&self, range_id: u64) -> PoolMembership {
        PoolMembership {
            range_id,
            heartbeat: self.timing.heartbeat,
        }
    }

    /// Brings back the awaiting slot of the incarnation `join` names, when there is one
    /// and its adopted parts fit the node's region; the node's other live slots die.
    /// `None`: nothing to resume (the join makes a new incarnation).
    fn resume(&mut self, join: &PoolNodeJoin, now: Instant) -> Option<(PoolMembership, Vec<u32>)> {
        let range_id = join.resume_range_id?;
        let index = self.slots.iter().position(|slot| {
            slot.node_id == join.node_id && slot.range_id == range_id && slot.awaiting.is_some()
        })?;
        let parts: Vec<AdoptedPart> = self.slots[index]
            .awaiting
            .as_ref()
            .map(|awaiting| awaiting.parts.iter().map(AdoptedPart::from).collect())
            .unwrap_or_default();
        let mut allocator = PoolAllocator::with_adopted(join.capacity, &parts).ok()?;
        let feed = join.isolated.then(|| Feed::start(&mut allocator));
        let mut retired = Vec::new();
        for (other, slot) in self.slots.iter_mut().enumerate() {
            if other != index && slot.node_id == join.node_id && slot.die() {
                retired.push(other as u32);
            }
        }
        let slot = &mut self.slots[index];
        slot.awaiting = None;
        slot.allocator = Some(allocator);
        slot.feed = feed;
        slot.endpoint.clone_from(&join.endpoint);
        slot.capacity = join.capacity;
        slot.last_heartbeat = now;
        slot.joined = now;
        slot.ramps = false;
        Some((self.membership(range_id), retired))
    }

    /// Takes back `part` of incarnation `range_id` of `node_id`, placed by an earlier
    /// manager process, into that incarnation's awaiting slot (made now if needed); returns
    /// the slot. Refused for an incarnation that is live or dead in this process, for a
    /// part overlapping one already adopted, and for one sharing a slab with another
    /// tenant's (written before the pool placed instances in slabs of their own: that part
    /// is lost, the others resume).
    pub(crate) fn adopt(
        &mut self,
        (node_id, range_id): (&str, u64),
        part: AdoptedPart,
        now: Instant,
    ) -> Result<usize, StorageError> {
        let AdoptedPart {
            offset,
            size,
            tenant,
        } = part;
        let refuse = |why: &str| {
            StorageError::InvalidRequest(format!(
                "cannot adopt {size} bytes at {offset} of pool node {node_id} (range {range_id}): {why}"
            ))
        };
        let end = offset.checked_add(size).filter(|_| size > 0);
        let end = end.ok_or_else(|| refuse("empty or past the end of the address space"))?;
        let found = self
            .slots
            .iter()
            .position(|slot| slot.range_id == range_id && slot.node_id == node_id);
        let index = match found {
            Some(index) => index,
            None => {
                check_name("node_id", node_id).map_err(StorageError::InvalidRequest)?;
                self.slots.push(Slot {
                    node_id: node_id.to_string(),
                    endpoint: String::new(),
                    range_id,
                    capacity: 0,
                    allocator: None,
                    feed: None,
                    awaiting: Some(Awaiting::default()),
                    last_heartbeat: now,
                    joined: now,
                    ramps: false,
                });
                self.slots.len() - 1
            }
        };
        let parts = &mut self.slots[index]
            .awaiting
            .as_mut()
            .ok_or_else(|| refuse("that incarnation is not awaiting its node"))?
            .parts;
        let before = parts.range(..=offset).next_back();
        let after = parts.range(offset..).next();
        if before.is_some_and(|(&o, &(s, _))| o + s > offset)
            || after.is_some_and(|(&o, _)| o < end)
        {
            return Err(refuse("it overlaps a part adopted already"));
        }
        let first_slab = offset / SLAB_BYTES * SLAB_BYTES;
        let past_last_slab = ((end - 1) / SLAB_BYTES)
            .saturating_add(1)
            .saturating_mul(SLAB_BYTES);
        let neighbours = parts.range(..past_last_slab).rev();
        let mut sharing = neighbours.take_while(|(&o, &(s, _))| o + s > first_slab);
        if sharing.any(|(_, &(_, other))| other != tenant) {
            return Err(refuse("it shares a slab with another instance's part"));
        }
        parts.insert(offset, (size, tenant));
        Ok(index)
    }

    fn unused_range_id(&self) -> u64 {
        loop {
            let candidate = fastrand::u64(1..);
            if self.slots.iter().all(|slot| slot.range_id != candidate) {
                return candidate;
            }
        }
    }

    /// Records a heartbeat of the live incarnation `range_id` of `node_id`; an unknown or
    /// dead incarnation is refused (the node must join again).
    pub(crate) fn heartbeat(
        &mut self,
        (node_id, range_id): (&str, u64),
        applied: Applied,
        now: Instant,
    ) -> Result<Option<OwnershipUpdate>, StorageError> {
        let slot = self
            .slots
            .iter_mut()
            .find(|slot| slot.range_id == range_id && slot.node_id == node_id);
        match slot {
            Some(Slot {
                allocator: Some(allocator),
                feed,
                last_heartbeat,
                ..
            }) => {
                *last_heartbeat = now;
                Ok(feed.as_mut().map(|feed| feed.update(allocator, applied)))
            }
            _ => Err(StorageError::UnknownPoolNode(format!(
                "{node_id} (range {range_id}) is not a live member: join again"
            ))),
        }
    }

    /// Every slot that was live or awaited, now dead.
    pub(crate) fn retire_all(&mut self) -> Vec<u32> {
        let mut died = Vec::new();
        for (index, slot) in self.slots.iter_mut().enumerate() {
            if slot.die() {
                died.push(index as u32);
            }
        }
        died
    }

    /// Declares dead every live slot whose last heartbeat is older than
    /// [`MISSED_HEARTBEATS`] intervals, and every awaiting slot older than the resume
    /// window; returns their indexes.
    pub(crate) fn reap(&mut self, now: Instant) -> Vec<u32> {
        let limit = self.timing.heartbeat * MISSED_HEARTBEATS;
        let window = self.timing.resume_window;
        let mut died = Vec::new();
        for (index, slot) in self.slots.iter_mut().enumerate() {
            let over = match &mut slot.awaiting {
                Some(awaiting) => {
                    let since = *awaiting.since.get_or_insert(now);
                    now.saturating_duration_since(since) > window
                }
                None => now.saturating_duration_since(slot.last_heartbeat) > limit,
            };
            if over && slot.die() {
                died.push(index as u32);
            }
        }
        died
    }

    /// Whether slot `index` is live or awaiting its node.
    pub(crate) fn holds_or_awaits(&self, index: usize) -> bool {
        self.slots
            .get(index)
            .is_some_and(|slot| slot.allocator.is_some() || slot.awaiting.is_some())
    }

    /// Whether any slot is live.
    pub(crate) fn any_live(&self) -> bool {
        self.slots.iter().any(|slot| slot.allocator.is_some())
    }

    /// The live slot to place the next block on: a weighted random choice, each live slot
    /// weighted by its ramp (1 unless it rejoined less than the ramp time ago); `skip`
    /// lists slots already found full for this block.
    pub(crate) fn choose(&self, now: Instant, skip: &[usize]) -> Option<usize> {
        let weights: Vec<(usize, f64)> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(index, slot)| slot.allocator.is_some() && !skip.contains(index))
            .map(|(index, slot)| (index, self.ramp(slot, now)))
            .collect();
        let total: f64 = weights.iter().map(|(_, w)| w).sum();
        if total <= 0.0 {
            return weights.first().map(|(index, _)| *index);
        }
        let mut pick = fastrand::f64() * total;
        for (index, weight) in &weights {
            if pick < *weight {
                return Some(*index);
            }
            pick -= weight;
        }
        weights.last().map(|(index, _)| *index)
    }

    /// A slot's share factor: ramps from 0 to 1 over the ramp time after a rejoin.
    fn ramp(&self, slot: &Slot, now: Instant) -> f64 {
        let ramp = self.timing.rejoin_ramp;
        if !slot.ramps || ramp.is_zero() {
            return 1.0;
        }
        let since = now.saturating_duration_since(slot.joined);
        (since.as_secs_f64() / ramp.as_secs_f64()).min(1.0)
    }

    /// Places `size` bytes for `tenant` on live slot `slot`.
    pub(crate) fn allocate(
        &mut self,
        slot: usize,
        tenant: Tenant,
        size: u64,
    ) -> Result<u64, AllocError> {
        let allocator = self.slots[slot].allocator.as_mut();
        allocator.map_or(Err(AllocError::Full { size }), |a| a.allocate(tenant, size))
    }

    /// Frees the allocation at `offset` of slot `slot` (an awaiting slot forgets the part;
    /// nothing to do on a dead slot, whose allocator is gone).
    pub(crate) fn free(&mut self, slot: usize, offset: u64) -> Result<(), AllocError> {
        let Some(slot) = self.slots.get_mut(slot) else {
            return Ok(());
        };
        match (&mut slot.allocator, &mut slot.awaiting) {
            (Some(allocator), _) => allocator.free(offset).map(|_| ()),
            (None, Some(awaiting)) => awaiting
                .parts
                .remove(&offset)
                .map(|_| ())
                .ok_or(AllocError::UnknownAllocation { offset }),
            (None, None) => Ok(()),
        }
    }

    /// Every slot as reported.
    pub(crate) fn statuses(&self) -> Vec<PoolNodeStatus> {
        self.slots
            .iter()
            .map(|slot| PoolNodeStatus {
                node_id: slot.node_id.clone(),
                endpoint: slot.endpoint.clone(),
                range_id: slot.range_id,
                capacity: slot.capacity,
                used: match (&slot.allocator, &slot.awaiting) {
                    (Some(allocator), _) => allocator.used_bytes(),
                    (None, Some(awaiting)) => awaiting.parts.values().map(|&(size, _)| size).sum(),
                    (None, None) => 0,
                },
                live: slot.allocator.is_some(),
            })
            .collect()
    }
}

impl Slot {
    /// Ends this incarnation (live or awaiting); false when it was dead already.
    fn die(&mut self) -> bool {
        self.feed = None;
        let was_live = self.allocator.take().is_some();
        let was_awaiting = self.awaiting.take().is_some();
        was_live || was_awaiting
    }
}

fn check_join(join: &PoolNodeJoin) -> Result<(), StorageError> {
    let refuse = StorageError::InvalidRequest;
    check_name("node_id", &join.node_id).map_err(refuse)?;
    if join.node_id.len() > MAX_NAME || join.endpoint.len() > MAX_NAME {
        return Err(refuse(format!(
            "node_id and endpoint must be at most {MAX_NAME} bytes"
        )));
    }
    if join.endpoint.is_empty()
        || join
            .endpoint
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(refuse(format!(
            "endpoint {:?} is not host:port",
            join.endpoint
        )));
    }
    Ok(())
}
