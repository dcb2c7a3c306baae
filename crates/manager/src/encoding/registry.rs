//! The encodings of registry objects: storage configs, instance groups, instance
//! registrations and accounts. Every field is written, so an object decodes to exactly what
//! was encoded. Each value is written in the oldest version that holds it: a group without
//! upstream trunk's fields is v1 byte for byte (the committed fixture), one with them v2 (v3
//! with event-report candidates); an event-report storage is v3, a dummy storage v5, every
//! other storage v1 (a pool with trunk fields v4).

use kvcm_storage::{BlockSpec, ReportTier, ReportTimings, StorageConfig, StorageSpec};

use super::{DecodeError, Encode, Kind, Reader, Writer};
use crate::accounts::{Account, AccountRole};
use crate::api_keys::ApiKey;
use crate::group_config::{
    CacheConfig, GroupConfig, GroupQuota, IndexBackend, IndexerConfig, PreferStrategy,
    ReclaimPolicy, ReclaimStrategy, ReclaimTrigger, SearchCachePolicy, TypeQuota,
};
use crate::password::StoredPassword;
use crate::registration::{DefaultQuery, InstanceInfo, ModelDeployment, SpecGroup};
use crate::storage_type::StorageType;

fn storage_type_of(code: u8) -> Result<StorageType, DecodeError> {
    StorageType::ALL
        .get(usize::from(code))
        .copied()
        .ok_or(DecodeError::Invalid("an unknown storage type"))
}

fn write_storage_type(out: &mut Writer, storage_type: StorageType) {
    out.u8(storage_type.index() as u8);
}

impl Encode for StorageConfig {
    const KIND: Kind = Kind::Storage;

    /// v3 for an event-report storage, v4 for a pool with a discovery URL or a media type,
    /// v5 for a dummy storage (all upstream trunk), else v1.
    fn version(&self) -> u8 {
        match &self.spec {
            StorageSpec::EventReport { .. } => 3,
            StorageSpec::Dummy { .. } => 5,
            StorageSpec::TairMemPool {
                service_discovery_url,
                media_type,
                ..
            } if !service_discovery_url.is_empty() || *media_type != 0 => 4,
            _ => 1,
        }
    }

    fn write_body(&self, out: &mut Writer) {
        out.str(&self.global_unique_name);
        out.bool(self.check_storage_available_when_open);
        match &self.spec {
            StorageSpec::Nfs {
                root_path,
                key_count_per_file,
            } => {
                out.u8(0);
                out.str(root_path);
                out.i32(*key_count_per_file);
            }
            StorageSpec::ThreeFs {
                cluster_name,
                mountpoint,
                root_dir,
                key_count_per_file,
                touch_file_when_create,
            } => {
                out.u8(1);
                out.str(cluster_name);
                out.str(mountpoint);
                out.str(root_dir);
                out.i32(*key_count_per_file);
                out.bool(*touch_file_when_create);
            }
            StorageSpec::VcnsThreeFs {
                mountpoint,
                root_dir,
                remote_host,
                remote_port,
                meta_storage_uri,
            } => {
                out.u8(2);
                out.str(mountpoint);
                out.str(root_dir);
                out.str(remote_host);
                out.i32(*remote_port);
                out.str(meta_storage_uri);
            }
            StorageSpec::Mooncake {
                local_hostname,
                metadata_connstring,
                protocol,
                rdma_device,
                master_service_entry,
            } => {
                out.u8(3);
                for text in [
                    local_hostname,
                    metadata_connstring,
                    protocol,
                    rdma_device,
                    master_service_entry,
                ] {
                    out.str(text);
                }
            }
            StorageSpec::TairMemPool {
                domain,
                timeout,
                enable_vipserver,
                service_discovery_url,
                media_type,
            } => {
                out.u8(4);
                out.str(domain);
                out.i32(*timeout);
                out.bool(*enable_vipserver);
                if self.version() >= 4 {
                    out.str(service_discovery_url);
                    out.i32(*media_type);
                }
            }
            StorageSpec::Dummy {
                root_path,
                key_count_per_file,
            } => {
                out.u8(6);
                out.str(root_path);
                out.i32(*key_count_per_file);
            }
            StorageSpec::EventReport { tier, timings } => {
                out.u8(5);
                out.u8(match tier {
                    ReportTier::L1p5 => 0,
                    ReportTier::L2 => 1,
                });
                for ms in [
                    timings.heartbeat_timeout_ms,
                    timings.cleanup_grace_ms,
                    timings.liveness_check_interval_ms,
                    timings.snapshot_min_interval_ms,
                    timings.snapshot_delta_drain_timeout_ms,
                ] {
                    out.u64(ms);
                }
            }
        }
    }

    fn read_body(input: &mut Reader<'_>, version: u8) -> Result<Self, DecodeError> {
        let global_unique_name = input.string()?;
        let check_storage_available_when_open = input.bool()?;
        let spec = match input.u8()? {
            0 => StorageSpec::Nfs {
                root_path: input.string()?,
                key_count_per_file: input.i32()?,
            },
            1 => StorageSpec::ThreeFs {
                cluster_name: input.string()?,
                mountpoint: input.string()?,
                root_dir: input.string()?,
                key_count_per_file: input.i32()?,
                touch_file_when_create: input.bool()?,
            },
            2 => StorageSpec::VcnsThreeFs {
                mountpoint: input.string()?,
                root_dir: input.string()?,
                remote_host: input.string()?,
                remote_port: input.i32()?,
                meta_storage_uri: input.string()?,
            },
            3 => StorageSpec::Mooncake {
                local_hostname: input.string()?,
                metadata_connstring: input.string()?,
                protocol: input.string()?,
                rdma_device: input.string()?,
                master_service_entry: input.string()?,
            },
            4 => StorageSpec::TairMemPool {
                domain: input.string()?,
                timeout: input.i32()?,
                enable_vipserver: input.bool()?,
                service_discovery_url: if version >= 4 {
                    input.string()?
                } else {
                    String::new()
                },
                media_type: if version >= 4 { input.i32()? } else { 0 },
            },
            5 if version >= 3 => StorageSpec::EventReport {
                tier: match input.u8()? {
                    0 => ReportTier::L1p5,
                    1 => ReportTier::L2,
                    _ => return Err(DecodeError::Invalid("an unknown event-report tier")),
                },
                timings: ReportTimings {
                    heartbeat_timeout_ms: input.u64()?,
                    cleanup_grace_ms: input.u64()?,
                    liveness_check_interval_ms: input.u64()?,
                    snapshot_min_interval_ms: input.u64()?,
                    snapshot_delta_drain_timeout_ms: input.u64()?,
                },
            },
            6 if version >= 5 => StorageSpec::Dummy {
                root_path: input.string()?,
                key_count_per_file: input.i32()?,
            },
            _ => return Err(DecodeError::Invalid("an unknown storage spec")),
        };
        let config = StorageConfig {
            global_unique_name,
            spec,
            check_storage_available_when_open,
        };
        if version >= 4 && config.version() != version {
            // Each value is written in the oldest version that holds it.
            return Err(DecodeError::Invalid(
                "a storage in a newer version than its fields need",
            ));
        }
        Ok(config)
    }
}

fn reclaim_policy_code(policy: ReclaimPolicy) -> u8 {
    match policy {
        ReclaimPolicy::Unspecified => 0,
        ReclaimPolicy::Lru => 1,
        ReclaimPolicy::Lfu => 2,
        ReclaimPolicy::Ttl => 3,
    }
}

fn reclaim_policy_of(code: u8) -> Result<ReclaimPolicy, DecodeError> {
    match code {
        0 => Ok(ReclaimPolicy::Unspecified),
        1 => Ok(ReclaimPolicy::Lru),
        2 => Ok(ReclaimPolicy::Lfu),
        3 => Ok(ReclaimPolicy::Ttl),
        _ => Err(DecodeError::Invalid("an unknown reclaim policy")),
    }
}

fn write_prefer(out: &mut Writer, prefer: PreferStrategy) {
    let (code, storage_type) = match prefer {
        PreferStrategy::Unspecified => (0, StorageType::Unspecified),
        PreferStrategy::Always(storage_type) => (1, storage_type),
        PreferStrategy::Prefer(storage_type) => (2, storage_type),
    };
    out.u8(code);
    write_storage_type(out, storage_type);
}

fn read_prefer(input: &mut Reader<'_>) -> Result<PreferStrategy, DecodeError> {
    let code = input.u8()?;
    let storage_type = storage_type_of(input.u8()?)?;
    match code {
        0 => Ok(PreferStrategy::Unspecified),
        1 => Ok(PreferStrategy::Always(storage_type)),
        2 => Ok(PreferStrategy::Prefer(storage_type)),
        _ => Err(DecodeError::Invalid("an unknown prefer strategy")),
    }
}

fn write_cache(out: &mut Writer, cache: &CacheConfig) {
    let reclaim = &cache.reclaim;
    out.str(&reclaim.storage_unique_name);
    out.u8(reclaim_policy_code(reclaim.policy));
    out.option(reclaim.trigger.as_ref(), |out, trigger| {
        out.i64(trigger.used_size);
        out.f64(trigger.used_percentage);
    });
    for value in [
        reclaim.trigger_period_seconds,
        reclaim.step_size,
        reclaim.step_percentage,
        reclaim.delay_before_delete_ms,
    ] {
        out.i32(value);
    }
    write_prefer(out, cache.prefer);
    let indexer = &cache.indexer;
    out.i64(indexer.max_key_count);
    out.i64(indexer.mutex_shard_num);
    out.i64(indexer.batch_key_size);
    out.str(&indexer.backend.storage_type);
    out.str(&indexer.backend.storage_uri);
    let policy = &indexer.cache_policy;
    out.i64(policy.capacity);
    out.str(&policy.kind);
    out.i32(policy.cache_shard_bits);
    out.f64(policy.high_pri_pool_ratio);
}

fn read_cache(input: &mut Reader<'_>) -> Result<CacheConfig, DecodeError> {
    let reclaim = ReclaimStrategy {
        storage_unique_name: input.string()?,
        policy: reclaim_policy_of(input.u8()?)?,
        trigger: input.option(|input| {
            Ok(ReclaimTrigger {
                used_size: input.i64()?,
                used_percentage: input.f64()?,
            })
        })?,
        trigger_period_seconds: input.i32()?,
        step_size: input.i32()?,
        step_percentage: input.i32()?,
        delay_before_delete_ms: input.i32()?,
    };
    let prefer = read_prefer(input)?;
    let indexer = IndexerConfig {
        max_key_count: input.i64()?,
        mutex_shard_num: input.i64()?,
        batch_key_size: input.i64()?,
        backend: IndexBackend {
            storage_type: input.string()?,
            storage_uri: input.string()?,
        },
        cache_policy: SearchCachePolicy {
            capacity: input.i64()?,
            kind: input.string()?,
            cache_shard_bits: input.i32()?,
            high_pri_pool_ratio: input.f64()?,
        },
        // A v4 group body carries it at its end.
        mutex_disabled: false,
    };
    Ok(CacheConfig {
        reclaim,
        prefer,
        indexer,
    })
}

impl GroupConfig {
    /// The oldest encoding version that holds this group: 1 unless a trunk field is set
    /// (v2 appends upstream trunk's `extra_info` and `revisit_interval_buckets`, v3 its
    /// `event_report_storage_candidates`, v4 its `mutex_enabled = false`).
    fn group_version(&self) -> u8 {
        if self.cache.indexer.mutex_disabled {
            4
        } else if !self.event_report_storage_candidates.is_empty() {
            3
        } else if self.extra_info.is_empty() && self.revisit_interval_buckets.is_empty() {
            1
        } else {
            2
        }
    }
}

impl Encode for GroupConfig {
    const KIND: Kind = Kind::Group;

    fn version(&self) -> u8 {
        self.group_version()
    }

    fn write_body(&self, out: &mut Writer) {
        out.str(&self.name);
        out.list(&self.storage_candidates, |out, name| out.str(name));
        out.str(&self.quota_group_name);
        out.i64(self.max_instance_count);
        out.option(self.quota.as_ref(), |out, quota| {
            out.i64(quota.capacity);
            out.list(&quota.per_type, |out, limit| {
                write_storage_type(out, limit.storage_type);
                out.i64(limit.capacity);
            });
        });
        write_cache(out, &self.cache);
        out.str(&self.user_data);
        out.i64(self.version);
        if self.group_version() >= 2 {
            out.str(&self.extra_info);
            out.str(&self.revisit_interval_buckets);
        }
        if self.group_version() >= 3 {
            out.list(&self.event_report_storage_candidates, |out, name| {
                out.str(name)
            });
        }
        if self.group_version() >= 4 {
            out.bool(self.cache.indexer.mutex_disabled);
        }
    }

    fn read_body(input: &mut Reader<'_>, version: u8) -> Result<Self, DecodeError> {
        let mut group = GroupConfig {
            name: input.string()?,
            storage_candidates: input.list(Reader::string)?,
            quota_group_name: input.string()?,
            max_instance_count: input.i64()?,
            quota: input.option(|input| {
                Ok(GroupQuota {
                    capacity: input.i64()?,
                    per_type: input.list(|input| {
                        Ok(TypeQuota {
                            storage_type: storage_type_of(input.u8()?)?,
                            capacity: input.i64()?,
                        })
                    })?,
                })
            })?,
            cache: read_cache(input)?,
            user_data: input.string()?,
            version: input.i64()?,
            extra_info: String::new(),
            revisit_interval_buckets: String::new(),
            event_report_storage_candidates: Vec::new(),
        };
        if version >= 2 {
            group.extra_info = input.string()?;
            group.revisit_interval_buckets = input.string()?;
        }
        if version >= 3 {
            group.event_report_storage_candidates = input.list(Reader::string)?;
        }
        if version >= 4 {
            group.cache.indexer.mutex_disabled = input.bool()?;
        }
        if group.group_version() != version {
            // Each value is written in the oldest version that holds it.
            return Err(DecodeError::Invalid(
                "a group in a newer version than its fields need",
            ));
        }
        Ok(group)
    }
}

/// The format's codes of the default query types (v3).
const DEFAULT_QUERIES: [DefaultQuery; 5] = [
    DefaultQuery::Unspecified,
    DefaultQuery::BatchGet,
    DefaultQuery::PrefixMatch,
    DefaultQuery::ReverseRollSwMatch,
    DefaultQuery::PrefixMatchWithMamba,
];

impl Encode for InstanceInfo {
    const KIND: Kind = Kind::Instance;

    /// v4 with `use_eagle_pop`, v3 with a default query type (both upstream trunk), else v1.
    fn version(&self) -> u8 {
        if self.model.use_eagle_pop {
            4
        } else if self.default_query != DefaultQuery::Unspecified {
            3
        } else {
            1
        }
    }

    fn write_body(&self, out: &mut Writer) {
        out.str(&self.quota_group_name);
        out.str(&self.instance_group_name);
        out.str(&self.instance_id);
        out.i32(self.block_size);
        out.list(&self.specs, |out, spec| {
            out.str(&spec.name);
            out.i64(spec.size);
        });
        let model = &self.model;
        out.str(&model.model_name);
        out.str(&model.dtype);
        out.bool(model.use_mla);
        out.i32(model.tp_size);
        out.i32(model.dp_size);
        out.str(&model.lora_name);
        out.i32(model.pp_size);
        out.str(&model.extra);
        out.str(&model.user_data);
        out.list(&self.spec_groups, |out, group| {
            out.str(&group.name);
            out.list(&group.spec_names, |out, name| out.str(name));
        });
        if self.version() >= 3 {
            let code = DEFAULT_QUERIES
                .iter()
                .position(|q| *q == self.default_query);
            out.u8(code.unwrap_or(0) as u8);
        }
        if self.version() >= 4 {
            out.bool(self.model.use_eagle_pop);
        }
    }

    fn read_body(input: &mut Reader<'_>, version: u8) -> Result<Self, DecodeError> {
        let mut info = InstanceInfo {
            quota_group_name: input.string()?,
            instance_group_name: input.string()?,
            instance_id: input.string()?,
            block_size: input.i32()?,
            specs: input.list(|input| {
                Ok(BlockSpec {
                    name: input.string()?,
                    size: input.i64()?,
                })
            })?,
            model: ModelDeployment {
                model_name: input.string()?,
                dtype: input.string()?,
                use_mla: input.bool()?,
                tp_size: input.i32()?,
                dp_size: input.i32()?,
                lora_name: input.string()?,
                pp_size: input.i32()?,
                extra: input.string()?,
                user_data: input.string()?,
                use_eagle_pop: false,
            },
            spec_groups: input.list(|input| {
                Ok(SpecGroup {
                    name: input.string()?,
                    spec_names: input.list(Reader::string)?,
                })
            })?,
            default_query: DefaultQuery::Unspecified,
        };
        if version >= 3 {
            let code = usize::from(input.u8()?);
            info.default_query = *DEFAULT_QUERIES
                .get(code)
                .ok_or(DecodeError::Invalid("an unknown default query type"))?;
        }
        if version >= 4 {
            info.model.use_eagle_pop = input.bool()?;
        }
        if version >= 3 && info.version() != version {
            // Each value is written in the oldest version that holds it.
            return Err(DecodeError::Invalid(
                "an instance in another version than its fields need",
            ));
        }
        Ok(info)
    }
}

impl Encode for Account {
    const KIND: Kind = Kind::Account;

    /// v6 for ROLE_OPERATOR, else v1.
    fn version(&self) -> u8 {
        if self.role == AccountRole::Operator {
            6
        } else {
            1
        }
    }

    fn write_body(&self, out: &mut Writer) {
        out.str(&self.user_name);
        out.str(self.password.as_stored());
        out.u8(match self.role {
            AccountRole::User => 0,
            AccountRole::Admin => 1,
            AccountRole::Operator => 2,
        });
    }

    fn read_body(input: &mut Reader<'_>, version: u8) -> Result<Self, DecodeError> {
        let account = Account {
            user_name: input.string()?,
            password: StoredPassword::parse(input.string()?),
            role: match input.u8()? {
                0 => AccountRole::User,
                1 => AccountRole::Admin,
                2 => AccountRole::Operator,
                _ => return Err(DecodeError::Invalid("an unknown account role")),
            },
        };
        if account.version() != version {
            // Each value is written in the oldest version that holds it.
            return Err(DecodeError::Invalid(
                "an account in another version than its role needs",
            ));
        }
        Ok(account)
    }
}

impl Encode for ApiKey {
    const KIND: Kind = Kind::ApiKey;

    /// API keys exist from v6 on.
    fn version(&self) -> u8 {
        6
    }

    fn write_body(&self, out: &mut Writer) {
        out.str(&self.id);
        out.str(&self.user_name);
        out.bytes(&self.digest);
        out.list(&self.instances, |out, id| out.str(id));
        out.u64(self.created_ms);
        out.u64(self.expires_ms);
    }

    fn read_body(input: &mut Reader<'_>, version: u8) -> Result<Self, DecodeError> {
        if version < 6 {
            return Err(DecodeError::Invalid("an API key before v6"));
        }
        Ok(ApiKey {
            id: input.string()?,
            user_name: input.string()?,
            digest: input.array::<32>()?,
            instances: input.list(Reader::string)?,
            created_ms: input.u64()?,
            expires_ms: input.u64()?,
        })
    }
}
