//! A registered inference instance: its registration, its own index key space, its usage
//! per storage type and the access clock of its keys.

use std::collections::HashMap;
use std::sync::Arc;

use kvcm_index::{BlockKey, MetaIndex};
use kvcm_storage::BlockSpec;

use super::access::{AccessClock, LivePolicy};
use super::entry::{Entry, LocationRef};
use super::error::{ManagerError, ManagerResult};
use super::journal::InstanceLog;
use super::keys::block_keys_from_tokens;
use super::quota::TypeUsage;
use super::registration::InstanceInfo;

/// One registered instance.
pub struct Instance {
    info: InstanceInfo,
    id: Arc<str>,
    usage: TypeUsage,
    /// New keys of StartWriteCache calls in flight, budgeted but maybe not indexed yet.
    pub(crate) pending_keys: std::sync::atomic::AtomicU64,
    access: AccessClock,
    /// This instance's key space.
    pub index: Arc<dyn MetaIndex<Entry>>,
    /// The change log its index writes to, closed when the instance is removed.
    log: Option<Arc<InstanceLog>>,
    /// Each spec's position in `info.specs`, by name.
    spec_positions: HashMap<String, usize>,
}

impl std::fmt::Debug for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Instance")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Instance {
    /// An instance from its (validated, normalised) registration and a fresh index of at
    /// most `max_key_count` keys (0 or negative: no cap).
    pub fn new(
        info: InstanceInfo,
        index: Arc<dyn MetaIndex<Entry>>,
        max_key_count: i64,
        policy: LivePolicy,
    ) -> Self {
        let spec_positions = info
            .specs
            .iter()
            .enumerate()
            .map(|(at, spec)| (spec.name.clone(), at))
            .collect();
        Instance {
            id: info.instance_id.as_str().into(),
            spec_positions,
            info,
            usage: TypeUsage::default(),
            pending_keys: std::sync::atomic::AtomicU64::new(0),
            access: AccessClock::new(max_key_count, policy),
            index,
            log: None,
        }
    }

    /// This instance with the change log its index writes to (see [`Instance::close_log`]).
    pub(crate) fn logged_by(mut self, log: Arc<InstanceLog>) -> Self {
        self.log = Some(log);
        self
    }

    /// Stops (`true`) or resumes recording the index's changes: a removed instance's
    /// clean-up must not land in the journal or shared store after its removal record, where
    /// a later instance of the same id would find it.
    pub(crate) fn close_log(&self, closed: bool) {
        if let Some(log) = &self.log {
            log.set_closed(closed);
        }
    }

    /// The instance id.
    pub fn id(&self) -> &Arc<str> {
        &self.id
    }

    /// The owning group's name.
    pub fn group(&self) -> &str {
        &self.info.instance_group_name
    }

    /// The registration as stored.
    pub fn info(&self) -> &InstanceInfo {
        &self.info
    }

    /// The parts of every block, in registration order.
    pub fn specs(&self) -> &[BlockSpec] {
        &self.info.specs
    }

    /// The position of the spec named `name` among [`Self::specs`].
    pub fn spec_position(&self, name: &str) -> Option<usize> {
        self.spec_positions.get(name).copied()
    }

    /// Bytes stored per storage type.
    pub fn usage(&self) -> &TypeUsage {
        &self.usage
    }

    /// When each key was last read or written.
    pub fn access(&self) -> &AccessClock {
        &self.access
    }

    /// Bytes of a stored location: the registered sizes of the parts it carries.
    pub fn location_bytes(&self, location: &LocationRef<'_>) -> i64 {
        self.spec_bytes(location.parts.iter().map(|part| usize::from(part.spec)))
    }

    /// Bytes of a block made of these specs (registration bounds the sum of every spec's
    /// size, so this never saturates for a registered instance).
    pub fn spec_bytes(&self, specs: impl Iterator<Item = usize>) -> i64 {
        specs
            .filter_map(|spec| self.info.specs.get(spec))
            .fold(0i64, |sum, spec| sum.saturating_add(spec.size.max(0)))
    }

    /// The request's block keys: `block_keys` when non-empty, else `token_ids` hashed with
    /// this instance's block size. Neither given → invalid argument.
    pub fn resolve_keys(
        &self,
        block_keys: Vec<BlockKey>,
        token_ids: &[i64],
    ) -> ManagerResult<Vec<BlockKey>> {
        if !block_keys.is_empty() {
            return Ok(block_keys);
        }
        if token_ids.is_empty() {
            return Err(ManagerError::invalid("block_keys or token_ids"));
        }
        let block_size = usize::try_from(self.info.block_size)
            .ok()
            .filter(|&b| b > 0)
            .ok_or_else(|| {
                ManagerError::invalid_because(
                    "token_ids",
                    format!(
                        "instance {} has block_size {}",
                        self.id, self.info.block_size
                    ),
                )
            })?;
        Ok(block_keys_from_tokens(token_ids, block_size))
    }
}
