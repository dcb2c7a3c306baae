//! Admin operations on storages, instance groups and instances (wire fact sheet §16.1-16.2).

use std::sync::Arc;

use kvcm_storage::StorageConfig;

use super::entry::StorageHandle;
use super::error::{ManagerError, ManagerResult};
use super::group_config::{revisit_buckets, GroupConfig, PreferStrategy, ReclaimStrategy};
use super::instance::Instance;
use super::journal::{InstanceLog, Record};
use super::local_index::check_indexer_config;
use super::registration::InstanceInfo;
use super::storage_type::StorageType;
use super::storages::StorageHealth;
use super::Manager;
use crate::sync::{lock, read_lock, write_lock};

/// A group's registered storages with whether each is available (RegisterInstance answers
/// them as `storage_configs`).
pub type StorageStatuses = Vec<(StorageConfig, bool)>;

impl Manager {
    /// Registers and opens a storage.
    pub fn add_storage(&self, config: StorageConfig) -> ManagerResult<()> {
        self.storages.check_files_dir(&config)?;
        self.register_storage(config, false)
    }

    /// [`Manager::add_storage`] for a storage the journal registered, kept rather than
    /// dropped with its blocks: an NFS root without a trailing `/` whose files land where a
    /// root may not be (accepted before that check existed) with a warning; one whose
    /// availability probe fails (a mount not up yet) unhealthy until a probe passes.
    pub(crate) fn restore_storage(&self, config: StorageConfig) -> ManagerResult<()> {
        if let Err(error) = self.storages.check_files_dir(&config) {
            tracing::warn!(storage = %config.global_unique_name, %error,
                "restored a storage that AddStorage would refuse today: update its root_path");
        }
        self.register_storage(config, true)
    }

    fn register_storage(&self, config: StorageConfig, recovered: bool) -> ManagerResult<()> {
        let _ordered = lock(&self.storage_admin);
        let log = self.storage_logger(&config);
        match recovered {
            true => self.storages.add_recovered(config.clone(), &log)?,
            false => self.storages.add(config.clone(), &log)?,
        }
        self.published_storages_changed();
        Ok(())
    }

    /// Replaces a storage's config (a pool's old node incarnations die with their blocks:
    /// `Manager::retire_pool`).
    pub fn update_storage(&self, config: StorageConfig) -> ManagerResult<()> {
        self.storages.check_files_dir(&config)?;
        let _ordered = lock(&self.storage_admin);
        let replaced = self.storages.backend(&config.global_unique_name);
        self.storages
            .update(config.clone(), &self.storage_logger(&config))?;
        self.published_storages_changed();
        self.retire_pool(replaced);
        Ok(())
    }

    /// Logs `config` with the handle of its new incarnation (before it takes writes).
    fn storage_logger<'a>(
        &'a self,
        config: &'a StorageConfig,
    ) -> impl Fn(StorageHandle) -> ManagerResult<()> + 'a {
        move |handle| {
            let config = config.clone();
            self.journal_log(&Record::Storage { handle, config })
        }
    }

    /// Forgets a storage (a pool's node incarnations die with their blocks:
    /// `Manager::retire_pool`).
    pub fn remove_storage(&self, name: &str) -> ManagerResult<()> {
        let _ordered = lock(&self.storage_admin);
        let removed = self.storages.backend(name);
        self.storages.remove(name)?;
        self.published_storages_changed();
        let logged = self.journal_log(&Record::StorageRemoved(name.to_string()));
        // Retired even when the record failed: the storage is gone from this process.
        self.retire_pool(removed);
        logged
    }

    /// Enables or disables a storage (journaled: the choice survives a restart).
    pub fn set_storage_available(&self, name: &str, available: bool) -> ManagerResult<()> {
        let _ordered = lock(&self.storage_admin);
        self.storages.set_available(name, available)?;
        self.published_storages_changed();
        let name = name.to_string();
        self.journal_log(&Record::StorageAvailability { name, available })
    }

    /// Every registered storage, by name.
    pub fn list_storages(&self) -> Vec<StorageConfig> {
        self.storages.list()
    }

    /// Every registered storage's admin state and latest health probe, by name.
    pub fn storage_health(&self) -> Vec<StorageHealth> {
        self.storages.health()
    }

    /// Creates an instance group.
    pub fn create_group(&self, group: GroupConfig) -> ManagerResult<()> {
        validate_group(&group, self.shared_store_uri())?;
        self.check_candidate_kinds(&group)?;
        let mut groups = write_lock(&self.groups);
        if groups.contains_key(&group.name) {
            return Err(ManagerError::AlreadyExists(format!(
                "instance group {:?} already exists",
                group.name
            )));
        }
        let ticket = self.journal_append(&Record::Group(group.clone()))?;
        groups.insert(group.name.clone(), Arc::new(group));
        drop(groups);
        self.published_storages_changed();
        self.journal_wait(ticket)
    }

    /// Replaces a group whose stored version is `current_version` by one with a newer version.
    pub fn update_group(&self, group: GroupConfig, current_version: i64) -> ManagerResult<()> {
        validate_group(&group, self.shared_store_uri())?;
        self.check_candidate_kinds(&group)?;
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
        let ticket = self.journal_append(&Record::Group(group.clone()))?;
        groups.insert(group.name.clone(), Arc::new(group));
        drop(groups);
        self.published_storages_changed();
        self.journal_wait(ticket)
    }

    /// Removes a group that no registered instance belongs to (INVALID_ARGUMENT naming them
    /// otherwise: an instance without its group could not be restored after a restart, and
    /// its blocks would be lost with it).
    pub fn remove_group(&self, name: &str) -> ManagerResult<()> {
        let mut groups = write_lock(&self.groups);
        if !groups.contains_key(name) {
            return Err(unknown_group(name));
        }
        let mut members: Vec<String> = read_lock(&self.instances)
            .values()
            .filter(|instance| instance.group() == name)
            .map(|instance| instance.id().to_string())
            .collect();
        if !members.is_empty() {
            members.sort();
            return Err(ManagerError::invalid_because(
                "name",
                format!(
                    "instance group {name:?} still has {} registered instance(s) ({}): remove them first",
                    members.len(),
                    members.join(", ")
                ),
            ));
        }
        let ticket = self.journal_append(&Record::GroupRemoved(name.to_string()))?;
        groups.remove(name);
        drop(groups);
        self.published_storages_changed();
        self.journal_wait(ticket)
    }

    /// The registered storages a group names are of the right kind: no event-report storage
    /// among its write candidates, only event-report storages (at most one per tier) among
    /// its event-report candidates. A name not registered (yet) is not judged, as for
    /// write candidates.
    fn check_candidate_kinds(&self, group: &GroupConfig) -> ManagerResult<()> {
        let kind_of = |name: &String| {
            let backend = self.storages.backend(name)?;
            Some(StorageType::of(backend.kind()))
        };
        let mut writes = group.storage_candidates.iter();
        if let Some(name) = writes.find(|n| kind_of(n).is_some_and(|t| t.is_event_report())) {
            return Err(ManagerError::invalid_because(
                "instance_group.storage_candidates",
                format!("{name:?} is an event-report storage (list it in event_report_storage_candidates)"),
            ));
        }
        let mut tiers = Vec::new();
        for name in &group.event_report_storage_candidates {
            match kind_of(name) {
                None => {}
                Some(tier) if tier.is_event_report() && !tiers.contains(&tier) => tiers.push(tier),
                Some(tier) if tier.is_event_report() => {
                    return Err(ManagerError::invalid_because(
                        "instance_group.event_report_storage_candidates",
                        format!("{name:?} is a second event-report storage of its tier"),
                    ))
                }
                Some(_) => {
                    return Err(ManagerError::invalid_because(
                        "instance_group.event_report_storage_candidates",
                        format!("{name:?} is not an event-report storage"),
                    ))
                }
            }
        }
        Ok(())
    }

    /// A group's config.
    pub fn group(&self, name: &str) -> ManagerResult<Arc<GroupConfig>> {
        self.shared_group(name).ok_or_else(|| unknown_group(name))
    }

    /// Every group, by name.
    pub fn list_groups(&self) -> Vec<Arc<GroupConfig>> {
        read_lock(&self.groups).values().cloned().collect()
    }

    /// A group's config as stored (shared; the groups lock is released on return).
    pub(crate) fn shared_group(&self, name: &str) -> Option<Arc<GroupConfig>> {
        read_lock(&self.groups).get(name).cloned()
    }

    /// Registers an instance (idempotent for an identical registration); returns the
    /// registered storages of its group.
    pub fn register_instance(&self, info: InstanceInfo) -> ManagerResult<StorageStatuses> {
        let info = info.validated()?;
        // Held until the instance is in the map: its group is not removed meanwhile.
        let groups = read_lock(&self.groups);
        let group = groups
            .get(&info.instance_group_name)
            .cloned()
            .ok_or_else(|| unknown_group(&info.instance_group_name))?;
        let mut instances = write_lock(&self.instances);
        if let Some(existing) = instances.get(&info.instance_id) {
            if let Some(field) = existing.info().identity_difference(&info) {
                return Err(ManagerError::Duplicate(format!(
                    "instance {:?} is registered with a different {field}",
                    info.instance_id
                )));
            }
            let group = groups.get(existing.group()).cloned().unwrap_or(group);
            return Ok(self.storages.statuses(&group.storage_candidates));
        }
        let limit = self.limits.max_instances_per_group;
        if instances
            .values()
            .filter(|i| i.group() == group.name)
            .count()
            >= limit
        {
            return Err(ManagerError::Capacity(format!(
                "instance group {:?} holds {limit} instances (kvcm.service.max_instances_per_group)",
                group.name
            )));
        }
        let log = Arc::new(InstanceLog::new(
            info.instance_id.as_str().into(),
            self.journal.clone(),
            self.storages.incarnations(),
        ));
        let index =
            (self.open_index)(&group.cache.indexer, log.clone()).map_err(|error| match error {
                ManagerError::Index(source) => ManagerError::OpenIndex(source),
                other => other,
            })?;
        let info = InstanceInfo {
            quota_group_name: group.quota_group_name.clone(),
            ..info
        };
        let ticket = self.journal_append(&Record::Instance(info.clone()))?;
        let instance = Arc::new(
            Instance::new(
                info,
                index,
                group.cache.indexer.max_key_count,
                self.reclaim_policy,
            )
            .logged_by(log),
        );
        instances.insert(instance.id().to_string(), instance);
        drop((instances, groups));
        self.journal_wait(ticket)?;
        Ok(self.storages.statuses(&group.storage_candidates))
    }

    /// Unregisters an instance and deletes all its cache. Once its removal is recorded it
    /// is removed: a failure to delete its cache then (an index outage) is retried in the
    /// background until it succeeds, not answered.
    pub fn remove_instance(&self, instance_id: &str) -> ManagerResult<()> {
        let (instance, ticket) = self.record_removal(instance_id)?;
        // A record not known durable keeps the blocks: a restart may bring the instance back.
        self.journal_wait(ticket)?;
        self.delete_removed(instance);
        Ok(())
    }

    /// RemoveInstance up to its deletion: the removal record is appended (its ticket
    /// returned), the instance leaves the map, is unpublished and counts as unfinished (a
    /// snapshot records it as removed with its entries, so a restart deletes them).
    pub(crate) fn record_removal(
        &self,
        instance_id: &str,
    ) -> ManagerResult<(Arc<Instance>, Option<kvcm_index::LogTicket>)> {
        let mut instances = write_lock(&self.instances);
        if !instances.contains_key(instance_id) {
            return Err(ManagerError::InstanceNotExist(instance_id.to_string()));
        }
        // Closed first: no batch of the instance's lands after its removal record.
        let instance = instances[instance_id].clone();
        instance.close_log(true);
        let ticket = match self.journal_append(&Record::InstanceRemoved(instance_id.to_string())) {
            Ok(ticket) => ticket,
            Err(error) => {
                instance.close_log(false);
                return Err(error);
            }
        };
        instances.remove(instance_id);
        // Under the map's lock: a snapshot sees the instance registered or unfinished. Only
        // the local journal's snapshots need them.
        if self.journal_takes_snapshots() {
            self.track_unfinished(instance.clone());
        }
        drop(instances);
        // Gone from the map: nothing of it stays published or reported, whatever the wait
        // says.
        if let Some(publication) = self.publication.get() {
            publication.instance_removed(&instance);
        }
        self.reports.forget_instance(instance_id);
        Ok((instance, ticket))
    }

    /// The registrations of a group's instances, by id.
    pub fn list_instances(&self, group: &str) -> Vec<InstanceInfo> {
        let mut infos: Vec<InstanceInfo> = read_lock(&self.instances)
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

/// The group validation rules of the reference's CreateInstanceGroup (fields named as in
/// the request).
fn validate_group(group: &GroupConfig, shared_store: Option<&str>) -> ManagerResult<()> {
    let names = [
        ("instance_group.name", &group.name),
        (
            "instance_group.global_quota_group_name",
            &group.quota_group_name,
        ),
    ];
    crate::registration::bounded_names(names.into_iter())?;
    let cache = &group.cache;
    let indexer = &cache.indexer;
    let checks = [
        (group.name.is_empty(), "instance_group.name"),
        (
            group.storage_candidates.is_empty(),
            "instance_group.storage_candidates",
        ),
        (
            group.quota_group_name.is_empty(),
            "instance_group.global_quota_group_name",
        ),
        (
            cache.prefer == PreferStrategy::Unspecified,
            "cache_config.data_storage_strategy",
        ),
        (
            cache.reclaim.storage_unique_name.is_empty(),
            "cache_config.reclaim_strategy.storage_unique_name",
        ),
        (
            indexer.backend.storage_type.is_empty(),
            "meta_indexer_config.meta_storage_backend_config.storage_type",
        ),
        (
            indexer.cache_policy.kind.is_empty(),
            "meta_indexer_config.meta_cache_policy_config.type",
        ),
    ];
    if let Some((_, field)) = checks.iter().find(|(failed, _)| *failed) {
        return Err(ManagerError::invalid(field));
    }
    if revisit_buckets(&group.revisit_interval_buckets).is_none() {
        return Err(ManagerError::invalid_because(
            "instance_group.revisit_interval_buckets",
            format!(
                "{:?} is not a list of increasing positive seconds like \"1,5,30,60\"",
                group.revisit_interval_buckets
            ),
        ));
    }
    check_report_candidates(group)?;
    check_reclaim(&cache.reclaim)?;
    check_indexer_config(indexer, shared_store)
}

/// Event-report candidates are non-empty distinct names, and no quota is of an event-report
/// type (kvcm allocates nothing there).
fn check_report_candidates(group: &GroupConfig) -> ManagerResult<()> {
    let names = &group.event_report_storage_candidates;
    for (i, name) in names.iter().enumerate() {
        if name.is_empty() || names[..i].contains(name) {
            return Err(ManagerError::invalid_because(
                "instance_group.event_report_storage_candidates",
                format!("{name:?} is empty or listed twice"),
            ));
        }
    }
    let quotas = group.quota.iter().flat_map(|q| &q.per_type);
    if let Some(quota) = quotas
        .into_iter()
        .find(|q| q.storage_type.is_event_report())
    {
        return Err(ManagerError::invalid_because(
            "quota.quota_config.storage_type",
            format!("{:?} holds no bytes kvcm allocates", quota.storage_type),
        ));
    }
    Ok(())
}

/// The reclaimer's settings: a watermark is a fraction in [0, 1] (0 = none), the delete
/// delay is not negative.
fn check_reclaim(reclaim: &ReclaimStrategy) -> ManagerResult<()> {
    if let Some(trigger) = reclaim.trigger {
        if !(0.0..=1.0).contains(&trigger.used_percentage) {
            return Err(ManagerError::invalid_because(
                "cache_config.reclaim_strategy.trigger_strategy.used_percentage",
                format!(
                    "{} is not a fraction in [0, 1] (0.8 = 80%; 0 = no watermark)",
                    trigger.used_percentage
                ),
            ));
        }
    }
    if reclaim.delay_before_delete_ms < 0 {
        return Err(ManagerError::invalid_because(
            "cache_config.reclaim_strategy.delay_before_delete_ms",
            "negative",
        ));
    }
    Ok(())
}
