//! A registered inference instance: its registration, its own index key space, and the
//! derived data the hot paths need (block specs, the miss placeholder).

use std::sync::Arc;

use kvcm_index::{BlockKey, MetaIndex};
use kvcm_storage::BlockSpec;

use super::entry::Entry;
use super::error::{invalid, ManagerError, ManagerResult};
use super::keys::block_keys_from_tokens;
use super::quota::TypeUsage;
use crate::proto::meta;

/// One registered instance.
pub struct Instance {
    info: meta::InstanceInfo,
    id: Arc<str>,
    specs: Vec<BlockSpec>,
    placeholder: meta::CacheLocation,
    usage: TypeUsage,
    /// This instance's key space.
    pub index: Arc<dyn MetaIndex<Entry>>,
}

impl std::fmt::Debug for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Instance")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Instance {
    /// An instance from its (validated, normalised) registration and a fresh index.
    pub fn new(info: meta::InstanceInfo, index: Arc<dyn MetaIndex<Entry>>) -> Self {
        let specs: Vec<BlockSpec> = info
            .location_spec_infos
            .iter()
            .map(|s| BlockSpec {
                name: s.name.clone(),
                size: s.size,
            })
            .collect();
        let placeholder = meta::CacheLocation {
            r#type: meta::StorageType::StUnspecified as i32,
            spec_size: specs.len() as i32,
            location_specs: specs
                .iter()
                .map(|s| meta::LocationSpec {
                    name: s.name.clone(),
                    uri: String::new(),
                })
                .collect(),
        };
        Instance {
            id: info.instance_id.as_str().into(),
            info,
            specs,
            placeholder,
            usage: TypeUsage::default(),
            index,
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
    pub fn info(&self) -> &meta::InstanceInfo {
        &self.info
    }

    /// The parts of every block, in registration order.
    pub fn specs(&self) -> &[BlockSpec] {
        &self.specs
    }

    /// Bytes stored per storage type.
    pub fn usage(&self) -> &TypeUsage {
        &self.usage
    }

    /// Bytes of a stored location: the registered sizes of the parts it carries.
    pub fn location_bytes(&self, location: &meta::CacheLocation) -> i64 {
        location
            .location_specs
            .iter()
            .filter_map(|part| self.specs.iter().find(|s| s.name == part.name))
            .fold(0i64, |sum, spec| sum.saturating_add(spec.size.max(0)))
    }

    /// The entry BATCH_GET and sliding-window queries return for a miss.
    pub fn placeholder(&self) -> &meta::CacheLocation {
        &self.placeholder
    }

    /// The request's block keys: `block_keys` when non-empty, else `token_ids` hashed with
    /// this instance's block size. Neither given → invalid argument.
    pub fn resolve_keys(
        &self,
        api: &str,
        block_keys: Vec<BlockKey>,
        token_ids: &[i64],
    ) -> ManagerResult<Vec<BlockKey>> {
        if !block_keys.is_empty() {
            return Ok(block_keys);
        }
        if token_ids.is_empty() {
            return Err(invalid(api, "block_keys or token_ids"));
        }
        let block_size = usize::try_from(self.info.block_size)
            .ok()
            .filter(|&b| b > 0)
            .ok_or_else(|| {
                ManagerError::InvalidArgument(format!(
                    "{{{api}: {{token_ids}}}}: instance {} has block_size {}",
                    self.id, self.info.block_size
                ))
            })?;
        Ok(block_keys_from_tokens(token_ids, block_size))
    }

    /// Whether a re-registration carries the same identity (everything but the group and
    /// `model_deployment.user_data`).
    pub fn same_identity(&self, other: &meta::InstanceInfo) -> bool {
        let strip = |info: &meta::InstanceInfo| {
            let mut model = info.model_deployment.clone().unwrap_or_default();
            model.user_data.clear();
            (
                info.block_size,
                info.location_spec_infos.clone(),
                model,
                info.location_spec_groups.clone(),
            )
        };
        strip(&self.info) == strip(other)
    }
}
