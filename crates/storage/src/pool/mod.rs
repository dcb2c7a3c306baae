//! The memory-pool backend (`ST_TAIRMEMPOOL`, `pace://` URIs): block parts placed in the
//! registered regions of pool nodes (`kvcm pool`), which clients read and write with
//! one-sided operations.
//!
//! The storage itself holds no bytes: nodes join it by name ([`MemPool::join`]), heartbeat,
//! and die when they stop ([`MemPool::reap`]). Each block goes to one live node (all its
//! parts together), chosen at random with rejoining nodes weighted down while they ramp up;
//! each part gets its bytes from that node's size-class allocator. Addresses are
//! `PartAddress { object: slot, block: offset / GRANULE }`, so a node region is at most
//! [`MAX_NODE_CAPACITY`] bytes.
//!
//! Invariants: a part's address names one node incarnation forever (slots are never
//! reused); nothing is placed on a dead slot; freeing a part of a dead slot does nothing
//! (its region went away with the node).

mod nodes;
mod ownership;
mod uri;

use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Instant;

pub use self::nodes::{
    PoolMembership, PoolNodeJoin, PoolNodeStatus, PoolTiming, MISSED_HEARTBEATS,
};
pub use self::ownership::{Applied, OwnershipUpdate, MAX_CHANGES};
pub use self::uri::{PoolPartUri, MEDIA_DRAM};

use self::nodes::Nodes;
use crate::allocator::{AdoptedPart, AllocError, Tenant, GRANULE, GRANULE_SHIFT};
use crate::packing::check_request;
use crate::{
    AllocatedSpec, AllocationRequest, DataStorage, NamedPart, PartAddress, PartRef, StorageConfig,
    StorageError, StorageKind, UriTemplate,
};

/// Largest node region: offsets are stored in 32 bits of [`GRANULE`]s.
pub const MAX_NODE_CAPACITY: u64 = (u32::MAX as u64 + 1) * GRANULE;

/// A memory pool: its config and its members.
#[derive(Debug)]
pub struct MemPool {
    config: StorageConfig,
    nodes: RwLock<Nodes>,
}

impl MemPool {
    /// The backend of a validated `TairMemPool` config, with no member yet.
    pub(crate) fn new(config: StorageConfig) -> Self {
        MemPool {
            config,
            nodes: RwLock::default(),
        }
    }

    /// Sets the heartbeat interval and rejoin ramp (before nodes join).
    pub fn set_timing(&self, timing: PoolTiming) {
        self.write().timing = timing;
    }

    /// Adds a node incarnation; returns its membership and the slots of its earlier
    /// incarnations that died because of it (their blocks are gone).
    pub fn join(&self, join: PoolNodeJoin) -> Result<(PoolMembership, Vec<u32>), StorageError> {
        if join.capacity > MAX_NODE_CAPACITY {
            return Err(StorageError::InvalidRequest(format!(
                "pool node capacity {} is above {MAX_NODE_CAPACITY}",
                join.capacity
            )));
        }
        self.write().join(join, Instant::now())
    }

    /// Records a heartbeat of a node that applied ownership version `applied`; answers
    /// what it is to apply next when it isolates its tenants. An unknown or dead
    /// incarnation is `UnknownPoolNode`.
    pub fn heartbeat(
        &self,
        (node_id, range_id): (&str, u64),
        applied: Applied,
    ) -> Result<Option<OwnershipUpdate>, StorageError> {
        self.write()
            .heartbeat((node_id, range_id), applied, Instant::now())
    }

    /// The tenant number of instance `instance_id` in this pool (a new one the first time;
    /// numbers are this process's: a restarted server numbers anew).
    pub fn tenant(&self, instance_id: &str) -> Result<Tenant, StorageError> {
        self.write().tenant(instance_id)
    }

    /// Declares dead the nodes that missed [`MISSED_HEARTBEATS`] heartbeats; returns their
    /// slots.
    pub fn reap(&self) -> Vec<u32> {
        self.write().reap(Instant::now())
    }

    /// Declares every live or awaited incarnation dead (the pool storage was replaced or
    /// removed); returns their slots, whose blocks the caller removes.
    pub fn retire_all(&self) -> Vec<u32> {
        self.write().retire_all()
    }

    /// Every incarnation that ever joined, in slot order.
    pub fn nodes(&self) -> Vec<PoolNodeStatus> {
        self.read().statuses()
    }

    /// Whether the part at `address` is on a live node.
    pub fn holds(&self, address: &PartAddress) -> bool {
        let nodes = self.read();
        let slot = nodes.slots.get(address.object as usize);
        slot.is_some_and(|slot| slot.allocator.is_some())
    }

    /// The node slot of a part's address.
    pub fn slot_of(address: &PartAddress) -> u32 {
        address.object
    }

    fn read(&self) -> RwLockReadGuard<'_, Nodes> {
        self.nodes.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Nodes> {
        self.nodes.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The URI of a part at `address`, when its slot exists.
    fn part_uri(&self, address: &PartAddress, size: u64) -> Option<PoolPartUri> {
        let nodes = self.read();
        let slot = nodes.slots.get(address.object as usize)?;
        Some(PoolPartUri {
            storage_name: self.config.global_unique_name.clone(),
            node_id: slot.node_id.clone(),
            range_id: slot.range_id,
            offset: u64::from(address.block) * GRANULE,
            size,
        })
    }

    /// Places every part of one block on one live node; `None` when no node has room.
    fn place_block(
        &self,
        nodes: &mut Nodes,
        (tenant, sizes): (Tenant, &[u64]),
        now: Instant,
    ) -> Option<(usize, Vec<u64>)> {
        let mut full = Vec::new();
        while let Some(slot) = nodes.choose(now, &full) {
            let mut offsets = Vec::with_capacity(sizes.len());
            for &size in sizes {
                match nodes.allocate(slot, tenant, size) {
                    Ok(offset) => offsets.push(offset),
                    Err(_) => break,
                }
            }
            if offsets.len() == sizes.len() {
                return Some((slot, offsets));
            }
            for offset in offsets {
                let _ = nodes.free(slot, offset);
            }
            full.push(slot);
        }
        None
    }

    fn check_uri(&self, uri: &str) -> Result<PoolPartUri, StorageError> {
        let part = PoolPartUri::parse(uri)?;
        if part.storage_name != self.config.global_unique_name {
            return Err(StorageError::InvalidUri {
                uri: uri.to_string(),
                reason: "not a location of this pool".into(),
            });
        }
        Ok(part)
    }
}

impl DataStorage for MemPool {
    fn config(&self) -> &StorageConfig {
        &self.config
    }

    fn kind(&self) -> StorageKind {
        StorageKind::TairMemPool
    }

    fn allocate(
        &self,
        request: &AllocationRequest<'_>,
    ) -> Result<Vec<Vec<AllocatedSpec>>, StorageError> {
        check_request(request)?;
        let now = Instant::now();
        let mut nodes = self.write();
        let tenant = nodes.tenant(request.instance_id)?;
        let mut placed: Vec<(usize, Vec<u64>)> = Vec::with_capacity(request.blocks.len());
        for block in request.blocks {
            let sizes: Vec<u64> = block
                .spec_indexes
                .iter()
                .map(|&i| request.specs[i].size as u64)
                .collect();
            let Some(place) = self.place_block(&mut nodes, (tenant, &sizes), now) else {
                for (slot, offsets) in placed {
                    offsets.into_iter().for_each(|o| drop(nodes.free(slot, o)));
                }
                return Err(StorageError::Full(format!(
                    "no live node of pool {:?} has room for a block of {} bytes",
                    self.config.global_unique_name,
                    sizes.iter().sum::<u64>()
                )));
            };
            placed.push(place);
        }
        drop(nodes);
        let blocks = request.blocks.iter().zip(placed);
        Ok(blocks
            .map(|(block, (slot, offsets))| {
                let parts = block.spec_indexes.iter().zip(offsets);
                parts
                    .map(|(&index, offset)| {
                        let spec = &request.specs[index];
                        let address = PartAddress {
                            object: slot as u32,
                            block: (offset / GRANULE) as u32,
                            generation: 0,
                        };
                        let mut uri = String::new();
                        if let Some(part) = self.part_uri(&address, spec.size as u64) {
                            part.write(&mut uri);
                        }
                        AllocatedSpec {
                            name: spec.name.clone(),
                            uri,
                            address,
                        }
                    })
                    .collect()
            })
            .collect())
    }

    fn write_uri(&self, part: &PartRef<'_>, out: &mut String) -> bool {
        match self.part_uri(&part.address, part.spec.size as u64) {
            Some(uri) => {
                uri.write(out);
                true
            }
            None => false,
        }
    }

    /// The part's URI with its offset as the template's block number (granules: a shift
    /// by `GRANULE_SHIFT`), so the parts of one size on one node share head and tail.
    fn uri_template(&self, part: &PartRef<'_>) -> Option<UriTemplate> {
        let uri = self.part_uri(&part.address, part.spec.size as u64)?;
        let (mut head, mut tail) = (String::new(), String::new());
        uri.write_head(&mut head);
        uri.write_tail(&mut tail);
        Some(UriTemplate {
            head,
            block: Some(part.address.block),
            block_shift: GRANULE_SHIFT,
            tail,
        })
    }

    /// Frees the parts' bytes on their nodes (nothing for parts of dead nodes); refuses, before
    /// freeing anything, URIs that are not this pool's.
    fn delete(&self, uris: &[String]) -> Result<(), StorageError> {
        let parts: Vec<PoolPartUri> = uris
            .iter()
            .map(|uri| self.check_uri(uri))
            .collect::<Result<_, _>>()?;
        let mut nodes = self.write();
        for part in parts {
            let slot = nodes
                .slots
                .iter()
                .position(|s| s.range_id == part.range_id && s.node_id == part.node_id);
            let Some(slot) = slot else { continue };
            if let Err(AllocError::UnknownAllocation { offset }) = nodes.free(slot, part.offset) {
                return Err(StorageError::InvalidRequest(format!(
                    "nothing is allocated at offset {offset} of pool node {}",
                    part.node_id
                )));
            }
        }
        Ok(())
    }

    /// Healthy while at least one node is live.
    fn check_health(&self) -> Result<(), StorageError> {
        if self.read().any_live() {
            return Ok(());
        }
        Err(StorageError::Unavailable(format!(
            "pool {:?} has no live node",
            self.config.global_unique_name
        )))
    }

    /// A part of a live (or awaiting) incarnation is named by it (`<range_id>/<node_id>`):
    /// a restarted manager adopts it, and finds it again if the node resumes that
    /// incarnation; a dead one's is lost.
    fn durable_address(&self, address: PartAddress) -> crate::DurableAddress {
        let nodes = self.read();
        match nodes.slots.get(address.object as usize) {
            Some(slot) if nodes.holds_or_awaits(address.object as usize) => {
                crate::DurableAddress::Named(incarnation_name(slot.range_id, &slot.node_id))
            }
            _ => crate::DurableAddress::Lost,
        }
    }

    /// Takes back a part of the incarnation `name` names into its awaiting slot (see
    /// `nodes`): not readable until the node resumes that incarnation.
    fn adopt(&self, part: &NamedPart<'_>) -> Result<PartAddress, StorageError> {
        let name = part.name;
        let (range_id, node_id) = parse_incarnation_name(name).ok_or_else(|| {
            StorageError::InvalidRequest(format!("{name:?} names no pool node incarnation"))
        })?;
        let mut nodes = self.write();
        let adopted = AdoptedPart {
            offset: u64::from(part.block) * GRANULE,
            size: part.size,
            tenant: nodes.tenant(part.instance_id)?,
        };
        let slot = nodes.adopt((node_id, range_id), adopted, Instant::now())?;
        Ok(PartAddress {
            object: slot as u32,
            block: part.block,
            generation: 0,
        })
    }

    fn as_pool(&self) -> Option<&MemPool> {
        Some(self)
    }
}

/// The durable name of a node incarnation: its `range_id` in 16 hex digits, `/`, its node
/// id (node ids hold no `/`).
fn incarnation_name(range_id: u64, node_id: &str) -> String {
    format!("{range_id:016x}/{node_id}")
}

/// The `(range_id, node_id)` an [`incarnation_name`] names.
fn parse_incarnation_name(name: &str) -> Option<(u64, &str)> {
    let (range, node_id) = name.split_once('/')?;
    let hex = range.len() == 16 && range.bytes().all(|b| b.is_ascii_hexdigit());
    let range_id = u64::from_str_radix(range, 16).ok()?;
    (hex && !node_id.is_empty()).then_some((range_id, node_id))
}

#[cfg(test)]
mod tests;
