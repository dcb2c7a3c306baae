//! Conversions between the admin wire `StorageConfig` and the storage crate's typed config,
//! and the `storage_configs` JSON of RegisterInstance (wire fact sheet §15).

use kvcm_storage::{ReportTier, ReportTimings, StorageConfig, StorageSpec};
use serde_json::{json, Value};

use super::admin;
use super::admin::storage_config::StorageSpec as WireSpec;

/// Why a wire storage config cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StorageConfigError {
    /// No backend-specific spec is set.
    #[error("storage {0:?} has no storage spec")]
    MissingSpec(String),
    /// The `local` spec has no backend.
    #[error("storage {0:?}: the local storage type is not supported")]
    LocalUnsupported(String),
    /// An event-report spec without its tier, or an event-report tier without its spec.
    #[error("storage {0:?}: storage_type {1} does not go with its storage spec (an event_report spec needs ST_EVENT_REPORT_L1P5 or ST_EVENT_REPORT_L2, and only it)")]
    EventReportType(String, i32),
    /// A negative event-report timing.
    #[error("storage {0:?}: storage_spec.{1} {2} is negative")]
    NegativeTiming(String, &'static str, i64),
}

/// The wire numbers of `ST_EVENT_REPORT_L1P5` and `ST_EVENT_REPORT_L2`.
const EVENT_REPORT_TYPES: [(ReportTier, i32); 2] = [(ReportTier::L1p5, 7), (ReportTier::L2, 8)];

/// The tier a wire `storage_type` names, if it names one.
fn report_tier(storage_type: i32) -> Option<ReportTier> {
    EVENT_REPORT_TYPES
        .iter()
        .find(|(_, number)| *number == storage_type)
        .map(|(tier, _)| *tier)
}

/// The timings of a wire event-report spec: 0 = the default, negative refused.
fn timings_from_wire(
    name: &str,
    spec: &admin::EventReportStorageSpec,
) -> Result<ReportTimings, StorageConfigError> {
    let defaults = ReportTimings::default();
    let ms = |field: &'static str, value: i64, default: u64| match value {
        0 => Ok(default),
        v if v < 0 => Err(StorageConfigError::NegativeTiming(
            name.to_string(),
            field,
            v,
        )),
        v => Ok(v as u64),
    };
    Ok(ReportTimings {
        heartbeat_timeout_ms: ms(
            "heartbeat_timeout_ms",
            spec.heartbeat_timeout_ms,
            defaults.heartbeat_timeout_ms,
        )?,
        cleanup_grace_ms: ms(
            "cleanup_grace_ms",
            spec.cleanup_grace_ms,
            defaults.cleanup_grace_ms,
        )?,
        liveness_check_interval_ms: ms(
            "liveness_check_interval_ms",
            spec.liveness_check_interval_ms,
            defaults.liveness_check_interval_ms,
        )?,
        snapshot_min_interval_ms: ms(
            "snapshot_min_interval_ms",
            spec.snapshot_min_interval_ms,
            defaults.snapshot_min_interval_ms,
        )?,
        snapshot_delta_drain_timeout_ms: ms(
            "snapshot_delta_drain_timeout_ms",
            spec.snapshot_delta_drain_timeout_ms,
            defaults.snapshot_delta_drain_timeout_ms,
        )?,
    })
}

/// The typed config of a wire storage config.
pub fn from_wire(wire: &admin::StorageConfig) -> Result<StorageConfig, StorageConfigError> {
    let name = wire.global_unique_name.clone();
    let tier = report_tier(wire.storage_type);
    let is_event_report = matches!(wire.storage_spec, Some(WireSpec::EventReport(_)));
    if is_event_report != tier.is_some() {
        return Err(StorageConfigError::EventReportType(name, wire.storage_type));
    }
    let spec = match wire.storage_spec.clone() {
        None => return Err(StorageConfigError::MissingSpec(name)),
        Some(WireSpec::Local(_)) => return Err(StorageConfigError::LocalUnsupported(name)),
        Some(WireSpec::Nfs(nfs)) => StorageSpec::Nfs {
            root_path: nfs.root_path,
            key_count_per_file: nfs.key_count_per_file,
        },
        Some(WireSpec::Threefs(fs)) => StorageSpec::ThreeFs {
            cluster_name: fs.cluster_name,
            mountpoint: fs.mountpoint,
            root_dir: fs.root_dir,
            key_count_per_file: fs.key_count_per_file,
            touch_file_when_create: fs.touch_file_when_create,
        },
        Some(WireSpec::Vcnsthreefs(fs)) => StorageSpec::VcnsThreeFs {
            mountpoint: fs.mountpoint,
            root_dir: fs.root_dir,
            remote_host: fs.remote_host,
            remote_port: fs.remote_port,
            meta_storage_uri: fs.meta_storage_uri,
        },
        Some(WireSpec::Mooncake(mc)) => StorageSpec::Mooncake {
            local_hostname: mc.local_hostname,
            metadata_connstring: mc.metadata_connstring,
            protocol: mc.protocol,
            rdma_device: mc.rdma_device,
            master_service_entry: mc.master_service_entry,
        },
        Some(WireSpec::TairMemPool(pool)) => StorageSpec::TairMemPool {
            domain: pool.domain,
            timeout: pool.timeout,
            enable_vipserver: pool.enable_vipserver,
            service_discovery_url: pool.service_discovery_url,
            media_type: pool.media_type,
        },
        Some(WireSpec::Dummy(dummy)) => StorageSpec::Dummy {
            root_path: dummy.root_path,
            key_count_per_file: dummy.key_count_per_file,
        },
        Some(WireSpec::EventReport(spec)) => StorageSpec::EventReport {
            tier: tier.ok_or_else(|| StorageConfigError::EventReportType(name.clone(), 0))?,
            timings: timings_from_wire(&name, &spec)?,
        },
    };
    Ok(StorageConfig {
        global_unique_name: name,
        spec,
        check_storage_available_when_open: wire.check_storage_available_when_open,
    })
}

/// The wire storage config of a typed config (what ListStorage answers); `storage_type` is
/// set for event-report storages only.
pub fn to_wire(config: &StorageConfig) -> admin::StorageConfig {
    let mut storage_type = 0;
    let spec = match config.spec.clone() {
        StorageSpec::Nfs {
            root_path,
            key_count_per_file,
        } => WireSpec::Nfs(admin::NfsStorageSpec {
            root_path,
            key_count_per_file,
        }),
        StorageSpec::ThreeFs {
            cluster_name,
            mountpoint,
            root_dir,
            key_count_per_file,
            touch_file_when_create,
        } => WireSpec::Threefs(admin::ThreeFsStorageSpec {
            cluster_name,
            mountpoint,
            root_dir,
            key_count_per_file,
            touch_file_when_create,
        }),
        StorageSpec::VcnsThreeFs {
            mountpoint,
            root_dir,
            remote_host,
            remote_port,
            meta_storage_uri,
        } => WireSpec::Vcnsthreefs(admin::VcnsThreeFsStorageSpec {
            mountpoint,
            root_dir,
            remote_host,
            remote_port,
            meta_storage_uri,
            ..Default::default()
        }),
        StorageSpec::Mooncake {
            local_hostname,
            metadata_connstring,
            protocol,
            rdma_device,
            master_service_entry,
        } => WireSpec::Mooncake(admin::MooncakeStorageSpec {
            local_hostname,
            metadata_connstring,
            protocol,
            rdma_device,
            master_service_entry,
        }),
        StorageSpec::TairMemPool {
            domain,
            timeout,
            enable_vipserver,
            service_discovery_url,
            media_type,
        } => WireSpec::TairMemPool(admin::TairMemPoolStorageSpec {
            domain,
            timeout,
            enable_vipserver,
            service_discovery_url,
            media_type,
        }),
        StorageSpec::Dummy {
            root_path,
            key_count_per_file,
        } => WireSpec::Dummy(admin::DummyStorageSpec {
            root_path,
            key_count_per_file,
        }),
        StorageSpec::EventReport { tier, timings } => {
            storage_type = EVENT_REPORT_TYPES
                .iter()
                .find(|(known, _)| *known == tier)
                .map_or(0, |(_, number)| *number);
            let ms = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
            WireSpec::EventReport(admin::EventReportStorageSpec {
                heartbeat_timeout_ms: ms(timings.heartbeat_timeout_ms),
                cleanup_grace_ms: ms(timings.cleanup_grace_ms),
                liveness_check_interval_ms: ms(timings.liveness_check_interval_ms),
                snapshot_min_interval_ms: ms(timings.snapshot_min_interval_ms),
                snapshot_delta_drain_timeout_ms: ms(timings.snapshot_delta_drain_timeout_ms),
            })
        }
    };
    admin::StorageConfig {
        global_unique_name: config.global_unique_name.clone(),
        storage_spec: Some(spec),
        check_storage_available_when_open: config.check_storage_available_when_open,
        storage_type,
    }
}

/// The `storage_configs` JSON text: one element per (storage, is available), dummy storages
/// left out as upstream does (server-internal: clients have no SDK for them).
pub fn storage_configs_json(statuses: &[(StorageConfig, bool)]) -> String {
    let items = statuses
        .iter()
        .filter_map(|(config, available)| storage_config_json(config, *available));
    Value::Array(items.collect()).to_string()
}

/// One element of the `storage_configs` JSON array (`None` for a dummy storage).
pub fn storage_config_json(config: &StorageConfig, is_available: bool) -> Option<Value> {
    let (kind, spec) = match &config.spec {
        StorageSpec::Nfs {
            root_path,
            key_count_per_file,
        } => (
            "file",
            json!({"root_path": root_path, "key_count_per_file": key_count_per_file}),
        ),
        StorageSpec::ThreeFs {
            cluster_name,
            mountpoint,
            root_dir,
            key_count_per_file,
            ..
        } => (
            "hf3fs",
            json!({"cluster_name": cluster_name, "mountpoint": mountpoint,
                   "root_dir": root_dir, "key_count_per_file": key_count_per_file}),
        ),
        StorageSpec::VcnsThreeFs {
            mountpoint,
            root_dir,
            remote_host,
            remote_port,
            meta_storage_uri,
        } => (
            "vcns_hf3fs",
            json!({"cluster_name": "", "mountpoint": mountpoint, "root_dir": root_dir,
                   "key_count_per_file": 1, "remote_host": remote_host,
                   "remote_port": remote_port, "meta_storage_uri": meta_storage_uri}),
        ),
        StorageSpec::Mooncake {
            local_hostname,
            metadata_connstring,
            protocol,
            rdma_device,
            master_service_entry,
        } => (
            "mooncake",
            json!({"local_hostname": local_hostname, "metadata_connstring": metadata_connstring,
                   "protocol": protocol, "rdma_device": rdma_device,
                   "master_server_entry": master_service_entry}),
        ),
        StorageSpec::TairMemPool {
            domain,
            timeout,
            enable_vipserver,
            ..
        } => (
            "pace",
            json!({"enable_vipserver": enable_vipserver, "domain": domain, "timeout": timeout}),
        ),
        StorageSpec::EventReport { timings, .. } => (
            "event_report",
            json!({"heartbeat_timeout_ms": timings.heartbeat_timeout_ms,
                   "cleanup_grace_ms": timings.cleanup_grace_ms}),
        ),
        StorageSpec::Dummy { .. } => return None,
    };
    Some(json!({"type": kind, "is_available": is_available,
           "global_unique_name": config.global_unique_name, "storage_spec": spec}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nfs_round_trip_and_json_shape() {
        let wire = admin::StorageConfig {
            global_unique_name: "nfs_01".into(),
            storage_spec: Some(WireSpec::Nfs(admin::NfsStorageSpec {
                root_path: "/tmp/nfs/".into(),
                key_count_per_file: 8,
            })),
            check_storage_available_when_open: false,
            storage_type: 0,
        };
        let config = from_wire(&wire).expect("valid nfs config");
        let value = storage_config_json(&config, true).expect("an nfs storage is printed");
        assert_eq!(value["type"], "file");
        assert_eq!(value["is_available"], true);
        assert_eq!(value["global_unique_name"], "nfs_01");
        assert_eq!(value["storage_spec"]["root_path"], "/tmp/nfs/");
        assert_eq!(value["storage_spec"]["key_count_per_file"], 8);
    }

    #[test]
    fn a_dummy_storage_round_trips_and_is_left_out_of_storage_configs() {
        let wire = admin::StorageConfig {
            global_unique_name: "dm".into(),
            storage_spec: Some(WireSpec::Dummy(admin::DummyStorageSpec {
                root_path: "/dummy".into(),
                key_count_per_file: 4,
            })),
            check_storage_available_when_open: true,
            storage_type: 0,
        };
        let config = from_wire(&wire).expect("valid dummy config");
        assert_eq!(to_wire(&config), wire);
        assert_eq!(storage_configs_json(&[(config, true)]), "[]");
    }

    #[test]
    fn missing_and_local_specs_are_rejected() {
        let mut wire = admin::StorageConfig {
            global_unique_name: "x".into(),
            ..Default::default()
        };
        assert!(matches!(
            from_wire(&wire),
            Err(StorageConfigError::MissingSpec(_))
        ));
        wire.storage_spec = Some(WireSpec::Local(admin::LocalStorageSpec {}));
        assert!(matches!(
            from_wire(&wire),
            Err(StorageConfigError::LocalUnsupported(_))
        ));
    }
}
