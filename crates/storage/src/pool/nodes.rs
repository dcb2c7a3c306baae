//! The members of one memory pool: every node that joined, one slot per incarnation.
//!
//! A node joins with its id and endpoint and gets a fresh slot whose `range_id` (a random
//! 64-bit number) names that incarnation in every URI placed on it. A slot is live while
//! its node heartbeats: after [`MISSED_HEARTBEATS`] intervals without one it is dead, its
//! allocator is dropped and nothing is placed on it again. A node that joins again (after a
//! restart, or after being declared dead) gets a new slot; its earlier live slot dies at
//! once.
//!
//! Invariants: slots are never removed or reused, so a slot index in a stored address names
//! one incarnation forever; only live slots hold an allocator; a rejoining node's share of
//! new blocks ramps up linearly over the ramp time.

use std::time::{Duration, Instant};

use crate::allocator::{AllocError, PoolAllocator};
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
}

impl Default for PoolTiming {
    fn default() -> Self {
        PoolTiming {
            heartbeat: Duration::from_millis(500),
            rejoin_ramp: Duration::from_secs(30),
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
    /// Bytes of the blocks placed on it (0 once dead).
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
    last_heartbeat: Instant,
    joined: Instant,
    /// The node had an earlier incarnation: its share of new blocks ramps up.
    ramps: bool,
}

/// Every slot of one pool.
#[derive(Debug, Default)]
pub(crate) struct Nodes {
    pub(crate) slots: Vec<Slot>,
    pub(crate) timing: PoolTiming,
}

impl Nodes {
    /// Adds a slot for `join`; returns its membership and the slots of the node's earlier
    /// incarnations that died because of it.
    pub(crate) fn join(
        &mut self,
        join: PoolNodeJoin,
        now: Instant,
    ) -> Result<(PoolMembership, Vec<u32>), StorageError> {
        check_join(&join)?;
        let allocator = PoolAllocator::new(join.capacity).map_err(|error| {
            StorageError::InvalidRequest(format!("pool node capacity {}: {error}", join.capacity))
        })?;
        if u32::try_from(self.slots.len()).is_err() {
            return Err(StorageError::InvalidRequest("2^32 pool node joins".into()));
        }
        let mut retired = Vec::new();
        let mut ramps = false;
        for (index, slot) in self.slots.iter_mut().enumerate() {
            if slot.node_id == join.node_id {
                ramps = true;
                if slot.allocator.take().is_some() {
                    retired.push(index as u32);
                }
            }
        }
        let range_id = self.unused_range_id();
        self.slots.push(Slot {
            node_id: join.node_id,
            endpoint: join.endpoint,
            range_id,
            capacity: join.capacity,
            allocator: Some(allocator),
            last_heartbeat: now,
            joined: now,
            ramps,
        });
        let membership = PoolMembership {
            range_id,
            heartbeat: self.timing.heartbeat,
        };
        Ok((membership, retired))
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
        node_id: &str,
        range_id: u64,
        now: Instant,
    ) -> Result<(), StorageError> {
        let slot = self
            .slots
            .iter_mut()
            .find(|slot| slot.range_id == range_id && slot.node_id == node_id)
            .filter(|slot| slot.allocator.is_some());
        match slot {
            Some(slot) => {
                slot.last_heartbeat = now;
                Ok(())
            }
            None => Err(StorageError::UnknownPoolNode(format!(
                "{node_id} (range {range_id}) is not a live member: join again"
            ))),
        }
    }

    /// Declares dead every live slot whose last heartbeat is older than
    /// [`MISSED_HEARTBEATS`] intervals; returns their indexes.
    pub(crate) fn reap(&mut self, now: Instant) -> Vec<u32> {
        let limit = self.timing.heartbeat * MISSED_HEARTBEATS;
        let mut died = Vec::new();
        for (index, slot) in self.slots.iter_mut().enumerate() {
            let silent = now.saturating_duration_since(slot.last_heartbeat) > limit;
            if silent && slot.allocator.take().is_some() {
                died.push(index as u32);
            }
        }
        died
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

    /// Places `size` bytes on live slot `slot`.
    pub(crate) fn allocate(&mut self, slot: usize, size: u64) -> Result<u64, AllocError> {
        let allocator = self.slots[slot].allocator.as_mut();
        allocator.map_or(Err(AllocError::Full { size }), |a| a.allocate(size))
    }

    /// Frees the allocation at `offset` of slot `slot` (nothing to do on a dead slot, whose
    /// allocator is gone).
    pub(crate) fn free(&mut self, slot: usize, offset: u64) -> Result<(), AllocError> {
        match self.slots.get_mut(slot).and_then(|s| s.allocator.as_mut()) {
            Some(allocator) => allocator.free(offset).map(|_| ()),
            None => Ok(()),
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
                used: slot.allocator.as_ref().map_or(0, PoolAllocator::used_bytes),
                live: slot.allocator.is_some(),
            })
            .collect()
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
