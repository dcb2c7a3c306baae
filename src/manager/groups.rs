//! Admin operations on storages, instance groups and instances (wire fact sheet §16.1-16.2).

use std::sync::Arc;

use super::error::{invalid, ManagerError, ManagerResult};
use super::instance::Instance;
use super::local_index::check_indexer_config;
use super::Manager;
use crate::proto::{admin, meta};
use crate::sync::{read_lock, write_lock};

impl Manager {
    /// Registers and opens a storage.
    pub fn add_storage(&self, config: admin::StorageConfig) -> ManagerResult<()> {
        self.storages.add(config)
    }

    /// Replaces a storage's config.
    pub fn update_storage(&self, config: admin::StorageConfig) -> ManagerResult<()> {
        self.storages.update(config)
    }

    /// Forgets a storage.
    pub fn remove_storage(&self, name: &str) -> ManagerResult<()> {
        self.storages.remove(name)
    }

    /// Enables or disables a storage.
    pub fn set_storage_available(&self, name: &str, available: bool) -> ManagerResult<()> {
        self.storages.set_available(name, available)
    }

    /// Every registered storage.
    pub fn list_storages(&self) -> Vec<admin::StorageConfig> {
        self.storages.list()
    }

    /// Creates an instance group.
    pub fn create_group(&self, group: admin::InstanceGroup) -> ManagerResult<()> {
        validate_group("CreateInstanceGroup", &group)?;
        let mut groups = write_lock(&self.groups);
        if groups.contains_key(&group.name) {
            return Err(ManagerError::AlreadyExists(format!(
                "instance group {:?} already exists",
                group.name
            )));
        }
        groups.insert(group.name.clone(), Arc::new(group));
        Ok(())
    }

    /// Replaces a group whose stored version is `current_version` by one with a newer version.
    pub fn update_group(
        &self,
        group: admin::InstanceGroup,
        current_version: i64,
    ) -> ManagerResult<()> {
        validate_group("UpdateInstanceGroup", &group)?;
        let mut groups = write_lock(&self.groups);
        let stored = groups
            .get(&group.name)
            .ok_or_else(|| unknown_group(&group.name))?;
        if stored.version != current_version || group.version <= stored.version {
            return Err(ManagerError::Refused(format!(
                "version conflict: stored {}, current_version {current_version}, new {}",
                stored.version, group.version
            )));
        }
        groups.insert(group.name.clone(), Arc::new(group));
        Ok(())
    }

    /// Removes a group (its instances stay registered).
    pub fn remove_group(&self, name: &str) -> ManagerResult<()> {
        write_lock(&self.groups)
            .remove(name)
            .map(drop)
            .ok_or_else(|| unknown_group(name))
    }

    /// A group's config.
    pub fn group(&self, name: &str) -> ManagerResult<admin::InstanceGroup> {
        self.shared_group(name)
            .map(|group| (*group).clone())
            .ok_or_else(|| unknown_group(name))
    }

    /// A group's config as stored (shared; the groups lock is released on return).
    pub(crate) fn shared_group(&self, name: &str) -> Option<Arc<admin::InstanceGroup>> {
        read_lock(&self.groups).get(name).cloned()
    }

    /// Registers an instance (idempotent for an identical registration); returns the
    /// `storage_configs` JSON of its group.
    pub fn register_instance(
        &self,
        request: meta::RegisterInstanceRequest,
    ) -> ManagerResult<String> {
        let info = validated_registration(request)?;
        let group = self.group(&info.instance_group_name)?;
        let mut instances = write_lock(&self.instances);
        if let Some(existing) = instances.get(&info.instance_id) {
            if !existing.same_identity(&info) {
                return Err(ManagerError::Duplicate(format!(
                    "instance {:?} is registered with a different model or layout",
                    info.instance_id
                )));
            }
            let group = self.group(existing.group()).unwrap_or(group);
            return Ok(self
                .storages
                .storage_configs_json(&group.storage_candidates));
        }
        let indexer = group
            .cache_config
            .as_ref()
            .and_then(|c| c.meta_indexer_config.clone())
            .unwrap_or_default();
        let index = (self.open_index)(&indexer)
            .map_err(|error| ManagerError::Refused(format!("opening the index: {error}")))?;
        let info = meta::InstanceInfo {
            quota_group_name: group.global_quota_group_name.clone(),
            ..info
        };
        let instance = Arc::new(Instance::new(info, index));
        instances.insert(instance.id().to_string(), instance);
        Ok(self
            .storages
            .storage_configs_json(&group.storage_candidates))
    }

    /// Unregisters an instance and deletes all its cache.
    pub fn remove_instance(&self, instance_id: &str) -> ManagerResult<()> {
        let instance = write_lock(&self.instances)
            .remove(instance_id)
            .ok_or_else(|| ManagerError::InstanceNotExist(instance_id.to_string()))?;
        self.remove_all(&instance)
    }

    /// The registrations of a group's instances, by id.
    pub fn list_instances(&self, group: &str) -> Vec<meta::InstanceInfo> {
        let mut infos: Vec<meta::InstanceInfo> = read_lock(&self.instances)
            .values()
            .filter(|i| i.group() == group)
            .map(|i| i.info().clone())
            .collect();
        infos.sort_by(|a, b| a.instance_id.cmp(&b.instance_id));
        infos
    }
}

fn unknown_group(name: &str) -> ManagerError {
    ManagerError::NotFound(format!("instance group {name:?} does not exist"))
}

/// The group validation rules of the reference's CreateInstanceGroup.
fn validate_group(api: &str, group: &admin::InstanceGroup) -> ManagerResult<()> {
    let cache = group.cache_config.as_ref();
    let indexer = cache.and_then(|c| c.meta_indexer_config.as_ref());
    let checks = [
        (group.name.is_empty(), "instance_group.name"),
        (
            group.storage_candidates.is_empty(),
            "instance_group.storage_candidates",
        ),
        (
            group.global_quota_group_name.is_empty(),
            "instance_group.global_quota_group_name",
        ),
        (cache.is_none(), "instance_group.cache_config"),
        (
            cache.is_some_and(|c| c.data_storage_strategy == 0),
            "cache_config.data_storage_strategy",
        ),
        (
            cache.is_some_and(|c| {
                c.reclaim_strategy
                    .as_ref()
                    .is_none_or(|r| r.storage_unique_name.is_empty())
            }),
            "cache_config.reclaim_strategy.storage_unique_name",
        ),
        (
            cache.is_some_and(|_| {
                indexer
                    .and_then(|i| i.meta_storage_backend_config.as_ref())
                    .is_none_or(|b| b.storage_type.is_empty())
            }),
            "meta_indexer_config.meta_storage_backend_config.storage_type",
        ),
        (
            cache.is_some_and(|_| {
                indexer
                    .and_then(|i| i.meta_cache_policy_config.as_ref())
                    .is_none_or(|p| p.r#type.is_empty())
            }),
            "meta_indexer_config.meta_cache_policy_config.type",
        ),
    ];
    first_failure(api, &checks)?;
    first_failure(api, &enum_checks(group))?;
    check_indexer_config(&indexer.cloned().unwrap_or_default())
}

/// Every enum field of a group must hold a number with a name: an unnamed number would be
/// stored and make every later answer that prints the group unencodable.
fn enum_checks(group: &admin::InstanceGroup) -> [(bool, &'static str); 3] {
    let cache = group.cache_config.as_ref();
    let mut quota_types = group.quota.iter().flat_map(|q| &q.quota_config);
    [
        (
            cache.is_some_and(|c| {
                admin::CachePreferStrategy::try_from(c.data_storage_strategy).is_err()
            }),
            "cache_config.data_storage_strategy",
        ),
        (
            cache
                .and_then(|c| c.reclaim_strategy.as_ref())
                .is_some_and(|r| admin::ReclaimPolicy::try_from(r.reclaim_policy).is_err()),
            "cache_config.reclaim_strategy.reclaim_policy",
        ),
        (
            quota_types.any(|q| admin::StorageType::try_from(q.storage_type).is_err()),
            "quota.quota_config.storage_type",
        ),
    ]
}

/// `InvalidArgument` naming the first field whose check failed.
fn first_failure(api: &str, checks: &[(bool, &str)]) -> ManagerResult<()> {
    match checks.iter().find(|(failed, _)| *failed) {
        Some((_, field)) => Err(invalid(api, field)),
        None => Ok(()),
    }
}

/// Whether a name can be a path component and a URI host/path part: non-empty, not `.` or
/// `..`, without `/ ? # & =`, white space or control characters (the storage backends build
/// paths and URIs from instance ids and spec names).
fn usable_name(name: &str) -> bool {
    let breaks_uris = |c: char| matches!(c, '/' | '?' | '#' | '&' | '=');
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| breaks_uris(c) || c.is_whitespace() || c.is_control())
}

/// Whether some item occurs twice.
fn has_repeats<'a>(mut items: impl Iterator<Item = &'a String>) -> bool {
    let mut seen = std::collections::HashSet::new();
    !items.all(|item| seen.insert(item))
}

/// Spec groups sorted by name with sorted spec names; `None` when a group has no name or
/// names a spec that is not registered.
fn normalised_spec_groups(
    mut groups: Vec<meta::LocationSpecGroup>,
    specs: &[meta::LocationSpecInfo],
) -> Option<Vec<meta::LocationSpecGroup>> {
    let known = |name: &String| specs.iter().any(|s| &s.name == name);
    for group in &mut groups {
        group.spec_names.sort();
        if group.name.is_empty() || !group.spec_names.iter().all(known) {
            return None;
        }
    }
    groups.sort_by(|a, b| a.name.cmp(&b.name));
    Some(groups)
}

/// The stored form of a registration: required fields checked, spec groups sorted by name
/// with sorted spec names that all name registered specs.
fn validated_registration(
    request: meta::RegisterInstanceRequest,
) -> ManagerResult<meta::InstanceInfo> {
    const API: &str = "RegisterInstance";
    let model = request.model_deployment.as_ref();
    let checks = [
        (request.instance_group.is_empty(), "instance_group"),
        (!usable_name(&request.instance_id), "instance_id"),
        (request.block_size <= 0, "block_size"),
        (model.is_none(), "model_deployment"),
        (
            model.is_some_and(|m| m.model_name.is_empty()),
            "model_deployment.model_name",
        ),
        (
            model.is_some_and(|m| m.dtype.is_empty()),
            "model_deployment.dtype",
        ),
        (
            request.location_spec_infos.is_empty(),
            "location_spec_infos",
        ),
        (
            !request
                .location_spec_infos
                .iter()
                .all(|s| usable_name(&s.name)),
            "location_spec_infos.name",
        ),
        (
            request.location_spec_infos.iter().any(|s| s.size <= 0),
            "location_spec_infos.size",
        ),
        (
            has_repeats(request.location_spec_infos.iter().map(|s| &s.name)),
            "location_spec_infos.name (repeated)",
        ),
    ];
    first_failure(API, &checks)?;
    let groups = normalised_spec_groups(request.location_spec_groups, &request.location_spec_infos)
        .ok_or_else(|| invalid(API, "location_spec_groups"))?;
    Ok(meta::InstanceInfo {
        quota_group_name: String::new(),
        instance_group_name: request.instance_group,
        instance_id: request.instance_id,
        block_size: request.block_size,
        location_spec_infos: request.location_spec_infos,
        model_deployment: request.model_deployment,
        location_spec_groups: groups,
    })
}
