//! proto ⇄ domain for the admin objects: instance groups, registrations, accounts and
//! storage types. One function per direction and object; wire validation (a required
//! sub-message absent, an enum number without a name) happens here, nowhere else.

use kvcm_manager::group_config::{
    CacheConfig, GroupQuota, IndexBackend, IndexerConfig, PreferStrategy, ReclaimPolicy,
    ReclaimStrategy, ReclaimTrigger, SearchCachePolicy, TypeQuota,
};
use kvcm_manager::registration::{DefaultQuery, ModelDeployment, SpecGroup};
use kvcm_manager::{
    AccountRole, GroupConfig, InstanceInfo, ManagerError, ManagerResult, StorageType,
};
use kvcm_storage::BlockSpec;

use crate::proto::{admin, meta};

/// The wire numbers of the storage types (upstream trunk numbers 6 for ST_DUMMY, 7 and 8
/// for the event-report types; 9, ST_TAIRMEMPOOL_SSD, has no domain type).
const STORAGE_TYPE_NUMBERS: [(StorageType, i32); 9] = [
    (StorageType::Unspecified, 0),
    (StorageType::ThreeFs, 1),
    (StorageType::Mooncake, 2),
    (StorageType::TairMemPool, 3),
    (StorageType::Nfs, 4),
    (StorageType::VcnsThreeFs, 5),
    (StorageType::Dummy, 6),
    (StorageType::EventReportL1p5, 7),
    (StorageType::EventReportL2, 8),
];

/// The wire number of upstream trunk's `ST_TAIRMEMPOOL_SSD`, which kvcm does not serve.
const TAIRMEMPOOL_SSD: i32 = 9;

/// Why kvcm refuses `ST_TAIRMEMPOOL_SSD` and the strategies that name it.
const NO_SSD_MEDIUM: &str =
    "is not served by kvcm: its memory-pool nodes serve memory regions, there is no SSD medium";

/// The domain storage type of a wire number.
pub fn storage_type(number: i32, field: &'static str) -> ManagerResult<StorageType> {
    if number == TAIRMEMPOOL_SSD {
        let why = format!("ST_TAIRMEMPOOL_SSD ({number}) {NO_SSD_MEDIUM}");
        return Err(ManagerError::invalid_because(field, why));
    }
    STORAGE_TYPE_NUMBERS
        .iter()
        .find(|(_, wire)| *wire == number)
        .map(|(storage_type, _)| *storage_type)
        .ok_or_else(|| {
            ManagerError::invalid_because(field, format!("{number} is not a StorageType"))
        })
}

/// The wire number of a storage type.
pub fn storage_type_number(storage_type: StorageType) -> i32 {
    STORAGE_TYPE_NUMBERS
        .iter()
        .find(|(known, _)| *known == storage_type)
        .map_or(0, |(_, wire)| *wire)
}

/// The domain group of a wire group.
pub fn group_from_wire(group: admin::InstanceGroup) -> ManagerResult<GroupConfig> {
    let cache = group.cache_config.unwrap_or_default();
    Ok(GroupConfig {
        name: group.name,
        storage_candidates: group.storage_candidates,
        quota_group_name: group.global_quota_group_name,
        max_instance_count: group.max_instance_count,
        quota: group.quota.map(quota_from_wire).transpose()?,
        cache: CacheConfig {
            reclaim: reclaim_from_wire(cache.reclaim_strategy.unwrap_or_default())?,
            prefer: prefer_from_wire(cache.data_storage_strategy)?,
            indexer: indexer_from_wire(cache.meta_indexer_config.unwrap_or_default()),
        },
        user_data: group.user_data,
        version: group.version,
        extra_info: group.extra_info,
        revisit_interval_buckets: group.revisit_interval_buckets,
        event_report_storage_candidates: group.event_report_storage_candidates,
    })
}

fn quota_from_wire(quota: admin::InstanceGroupQuota) -> ManagerResult<GroupQuota> {
    let per_type = quota.quota_config.into_iter().map(|q| {
        Ok(TypeQuota {
            storage_type: storage_type(q.storage_type, "quota.quota_config.storage_type")?,
            capacity: q.capacity,
        })
    });
    Ok(GroupQuota {
        capacity: quota.capacity,
        per_type: per_type.collect::<ManagerResult<_>>()?,
    })
}

fn reclaim_from_wire(reclaim: admin::CacheReclaimStrategy) -> ManagerResult<ReclaimStrategy> {
    use admin::ReclaimPolicy as Wire;
    let policy = match Wire::try_from(reclaim.reclaim_policy) {
        Ok(Wire::PolicyUnspecified) => ReclaimPolicy::Unspecified,
        Ok(Wire::PolicyLru) => ReclaimPolicy::Lru,
        Ok(Wire::PolicyLfu) => ReclaimPolicy::Lfu,
        Ok(Wire::PolicyTtl) => ReclaimPolicy::Ttl,
        Err(_) => {
            return Err(ManagerError::invalid_because(
                "cache_config.reclaim_strategy.reclaim_policy",
                format!("{} is not a ReclaimPolicy", reclaim.reclaim_policy),
            ))
        }
    };
    Ok(ReclaimStrategy {
        storage_unique_name: reclaim.storage_unique_name,
        policy,
        trigger: reclaim.trigger_strategy.map(|t| ReclaimTrigger {
            used_size: t.used_size,
            used_percentage: t.used_percentage,
        }),
        trigger_period_seconds: reclaim.trigger_period_seconds,
        step_size: reclaim.reclaim_step_size,
        step_percentage: reclaim.reclaim_step_percentage,
        delay_before_delete_ms: reclaim.delay_before_delete_ms,
    })
}

fn prefer_from_wire(strategy: i32) -> ManagerResult<PreferStrategy> {
    use admin::CachePreferStrategy as Cps;
    use PreferStrategy::{Always, Prefer};
    Ok(match Cps::try_from(strategy) {
        Ok(Cps::CpsUnspecified) => PreferStrategy::Unspecified,
        Ok(Cps::CpsAlways3fs) => Always(StorageType::ThreeFs),
        Ok(Cps::CpsPrefer3fs) => Prefer(StorageType::ThreeFs),
        Ok(Cps::CpsAlwaysMooncake) => Always(StorageType::Mooncake),
        Ok(Cps::CpsPreferMooncake) => Prefer(StorageType::Mooncake),
        Ok(Cps::CpsAlwaysTairMempool) => Always(StorageType::TairMemPool),
        Ok(Cps::CpsPreferTairMempool) => Prefer(StorageType::TairMemPool),
        Ok(Cps::CpsAlwaysVcns3fs) => Always(StorageType::VcnsThreeFs),
        Ok(Cps::CpsPreferVcns3fs) => Prefer(StorageType::VcnsThreeFs),
        Ok(ssd @ (Cps::CpsAlwaysTairMempoolSsd | Cps::CpsPreferTairMempoolSsd)) => {
            return Err(ManagerError::invalid_because(
                "cache_config.data_storage_strategy",
                format!("{} {NO_SSD_MEDIUM}", ssd.as_str_name()),
            ))
        }
        Err(_) => {
            return Err(ManagerError::invalid_because(
                "cache_config.data_storage_strategy",
                format!("{strategy} is not a CachePreferStrategy"),
            ))
        }
    })
}

fn indexer_from_wire(indexer: admin::MetaIndexerConfig) -> IndexerConfig {
    let backend = indexer.meta_storage_backend_config.unwrap_or_default();
    let policy = indexer.meta_cache_policy_config.unwrap_or_default();
    IndexerConfig {
        max_key_count: indexer.max_key_count,
        mutex_shard_num: indexer.mutex_shard_num,
        batch_key_size: indexer.batch_key_size,
        mutex_disabled: indexer.mutex_enabled == Some(false),
        backend: IndexBackend {
            storage_type: backend.storage_type,
            storage_uri: backend.storage_uri,
        },
        cache_policy: SearchCachePolicy {
            capacity: policy.capacity,
            kind: policy.r#type,
            cache_shard_bits: policy.cache_shard_bits,
            high_pri_pool_ratio: policy.high_pri_pool_ratio,
        },
    }
}

/// The wire group of a stored group.
pub fn group_to_wire(group: &GroupConfig) -> admin::InstanceGroup {
    let reclaim = &group.cache.reclaim;
    let indexer = &group.cache.indexer;
    admin::InstanceGroup {
        name: group.name.clone(),
        storage_candidates: group.storage_candidates.clone(),
        global_quota_group_name: group.quota_group_name.clone(),
        max_instance_count: group.max_instance_count,
        quota: group.quota.as_ref().map(|q| admin::InstanceGroupQuota {
            capacity: q.capacity,
            quota_config: q
                .per_type
                .iter()
                .map(|t| admin::QuotaConfig {
                    storage_type: storage_type_number(t.storage_type),
                    capacity: t.capacity,
                })
                .collect(),
        }),
        cache_config: Some(admin::CacheConfig {
            reclaim_strategy: Some(admin::CacheReclaimStrategy {
                storage_unique_name: reclaim.storage_unique_name.clone(),
                reclaim_policy: reclaim_policy_number(reclaim.policy),
                trigger_strategy: reclaim.trigger.map(|t| admin::TriggerStrategy {
                    used_size: t.used_size,
                    used_percentage: t.used_percentage,
                }),
                trigger_period_seconds: reclaim.trigger_period_seconds,
                reclaim_step_size: reclaim.step_size,
                reclaim_step_percentage: reclaim.step_percentage,
                delay_before_delete_ms: reclaim.delay_before_delete_ms,
            }),
            data_storage_strategy: prefer_number(group.cache.prefer),
            meta_indexer_config: Some(admin::MetaIndexerConfig {
                max_key_count: indexer.max_key_count,
                mutex_shard_num: indexer.mutex_shard_num,
                batch_key_size: indexer.batch_key_size,
                // Absent means true upstream: only a disabled mutex is printed.
                mutex_enabled: indexer.mutex_disabled.then_some(false),
                meta_storage_backend_config: Some(admin::MetaStorageBackendConfig {
                    storage_type: indexer.backend.storage_type.clone(),
                    storage_uri: indexer.backend.storage_uri.clone(),
                }),
                meta_cache_policy_config: Some(admin::MetaCachePolicyConfig {
                    capacity: indexer.cache_policy.capacity,
                    r#type: indexer.cache_policy.kind.clone(),
                    cache_shard_bits: indexer.cache_policy.cache_shard_bits,
                    high_pri_pool_ratio: indexer.cache_policy.high_pri_pool_ratio,
                }),
            }),
        }),
        user_data: group.user_data.clone(),
        version: group.version,
        extra_info: group.extra_info.clone(),
        revisit_interval_buckets: group.revisit_interval_buckets.clone(),
        event_report_storage_candidates: group.event_report_storage_candidates.clone(),
    }
}

fn reclaim_policy_number(policy: ReclaimPolicy) -> i32 {
    use admin::ReclaimPolicy as Wire;
    let wire = match policy {
        ReclaimPolicy::Unspecified => Wire::PolicyUnspecified,
        ReclaimPolicy::Lru => Wire::PolicyLru,
        ReclaimPolicy::Lfu => Wire::PolicyLfu,
        ReclaimPolicy::Ttl => Wire::PolicyTtl,
    };
    wire as i32
}

fn prefer_number(strategy: PreferStrategy) -> i32 {
    use admin::CachePreferStrategy as Cps;
    use PreferStrategy::{Always, Prefer};
    let wire = match strategy {
        PreferStrategy::Unspecified => Cps::CpsUnspecified,
        Always(StorageType::ThreeFs) => Cps::CpsAlways3fs,
        Prefer(StorageType::ThreeFs) => Cps::CpsPrefer3fs,
        Always(StorageType::Mooncake) => Cps::CpsAlwaysMooncake,
        Prefer(StorageType::Mooncake) => Cps::CpsPreferMooncake,
        Always(StorageType::TairMemPool) => Cps::CpsAlwaysTairMempool,
        Prefer(StorageType::TairMemPool) => Cps::CpsPreferTairMempool,
        Always(StorageType::VcnsThreeFs) => Cps::CpsAlwaysVcns3fs,
        Prefer(StorageType::VcnsThreeFs) => Cps::CpsPreferVcns3fs,
        // No wire strategy names these types; the edge never builds them.
        Always(
            StorageType::Nfs
            | StorageType::Unspecified
            | StorageType::EventReportL1p5
            | StorageType::EventReportL2
            | StorageType::Dummy,
        )
        | Prefer(
            StorageType::Nfs
            | StorageType::Unspecified
            | StorageType::EventReportL1p5
            | StorageType::EventReportL2
            | StorageType::Dummy,
        ) => Cps::CpsUnspecified,
    };
    wire as i32
}

/// The domain registration of a RegisterInstance request (checked by the manager).
pub fn registration_from_wire(
    request: meta::RegisterInstanceRequest,
) -> ManagerResult<InstanceInfo> {
    let model = request
        .model_deployment
        .ok_or_else(|| ManagerError::invalid("model_deployment"))?;
    Ok(InstanceInfo {
        quota_group_name: String::new(),
        instance_group_name: request.instance_group,
        instance_id: request.instance_id,
        block_size: request.block_size,
        specs: request
            .location_spec_infos
            .into_iter()
            .map(|s| BlockSpec {
                name: s.name,
                size: s.size,
            })
            .collect(),
        model: ModelDeployment {
            model_name: model.model_name,
            dtype: model.dtype,
            use_mla: model.use_mla,
            tp_size: model.tp_size,
            dp_size: model.dp_size,
            lora_name: model.lora_name,
            pp_size: model.pp_size,
            extra: model.extra,
            user_data: model.user_data,
            use_eagle_pop: model.use_eagle_pop,
        },
        spec_groups: request
            .location_spec_groups
            .into_iter()
            .map(|g| SpecGroup {
                name: g.name,
                spec_names: g.spec_names,
            })
            .collect(),
        default_query: default_query_from_wire(request.default_query_type)?,
    })
}

/// The wire numbers of the default query types (upstream trunk `QueryType`).
const DEFAULT_QUERY_NUMBERS: [(DefaultQuery, meta::QueryType); 5] = [
    (DefaultQuery::Unspecified, meta::QueryType::QtUnspecified),
    (DefaultQuery::BatchGet, meta::QueryType::QtBatchGet),
    (DefaultQuery::PrefixMatch, meta::QueryType::QtPrefixMatch),
    (
        DefaultQuery::ReverseRollSwMatch,
        meta::QueryType::QtReverseRollSwMatch,
    ),
    (
        DefaultQuery::PrefixMatchWithMamba,
        meta::QueryType::QtPrefixMatchWithMamba,
    ),
];

fn default_query_from_wire(number: i32) -> ManagerResult<DefaultQuery> {
    let found = DEFAULT_QUERY_NUMBERS
        .iter()
        .find(|(_, wire)| *wire as i32 == number);
    found.map(|(query, _)| *query).ok_or_else(|| {
        ManagerError::invalid_because("default_query_type", format!("{number} is not a QueryType"))
    })
}

/// The wire number of a default query type.
pub fn default_query_number(query: DefaultQuery) -> i32 {
    let found = DEFAULT_QUERY_NUMBERS
        .iter()
        .find(|(known, _)| *known == query);
    found.map_or(0, |(_, wire)| *wire as i32)
}

/// The wire form of a stored registration.
pub fn instance_info_to_wire(info: &InstanceInfo) -> meta::InstanceInfo {
    let model = &info.model;
    meta::InstanceInfo {
        quota_group_name: info.quota_group_name.clone(),
        instance_group_name: info.instance_group_name.clone(),
        instance_id: info.instance_id.clone(),
        block_size: info.block_size,
        location_spec_infos: info
            .specs
            .iter()
            .map(|s| meta::LocationSpecInfo {
                name: s.name.clone(),
                size: s.size,
            })
            .collect(),
        model_deployment: Some(meta::ModelDeployment {
            model_name: model.model_name.clone(),
            dtype: model.dtype.clone(),
            use_mla: model.use_mla,
            tp_size: model.tp_size,
            dp_size: model.dp_size,
            lora_name: model.lora_name.clone(),
            pp_size: model.pp_size,
            extra: model.extra.clone(),
            user_data: model.user_data.clone(),
            use_eagle_pop: model.use_eagle_pop,
        }),
        location_spec_groups: info
            .spec_groups
            .iter()
            .map(|g| meta::LocationSpecGroup {
                name: g.name.clone(),
                spec_names: g.spec_names.clone(),
            })
            .collect(),
        default_query_type: default_query_number(info.default_query),
    }
}

/// The domain role of a wire role number.
pub fn account_role(number: i32) -> ManagerResult<AccountRole> {
    match admin::AccountRole::try_from(number) {
        Ok(admin::AccountRole::RoleUser) => Ok(AccountRole::User),
        Ok(admin::AccountRole::RoleAdmin) => Ok(AccountRole::Admin),
        Ok(admin::AccountRole::RoleOperator) => Ok(AccountRole::Operator),
        Err(_) => Err(ManagerError::invalid_because(
            "role",
            format!("{number} is not an AccountRole"),
        )),
    }
}

/// The wire number of a role.
pub fn account_role_number(role: AccountRole) -> i32 {
    let wire = match role {
        AccountRole::User => admin::AccountRole::RoleUser,
        AccountRole::Admin => admin::AccountRole::RoleAdmin,
        AccountRole::Operator => admin::AccountRole::RoleOperator,
    };
    wire as i32
}
