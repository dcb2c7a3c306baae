//! The embedded default: one node, leader at once (on the default `memory://` lock, or as
//! soon as it wins the configured lock), group `default` whose only storage is a
//! `file` backend under the data directory. With `kvcm.pool.size` (`--pool-size`) the group
//! also has a memory pool, `default_pool`, preferred for writes (the server runs its one
//! node); a full pool passes writes to the file storage.
//!
//! With the journal on (the default), the manager first recovers what the data directory's
//! journal holds; the defaults are then added only where missing. On the shared store
//! (`kvcm.registry_storage.uri=redis://…`) all of this happens when the node wins the lead.

use std::path::Path;
use std::sync::Arc;

use super::ServerError;
use crate::config::ServerConfig;
use kvcm_manager::{local_index_factory, Manager, ManagerDeps};
use kvcm_storage::{StorageConfig, StorageSpec};

use crate::proto::admin;
use crate::service::group_from_wire;

/// Name of the embedded default group.
pub const DEFAULT_GROUP: &str = "default";
/// Name of the embedded default storage.
pub const DEFAULT_STORAGE: &str = "default_file";
/// Name of the embedded memory pool (with `kvcm.pool.size`).
pub const DEFAULT_POOL: &str = "default_pool";
/// Blocks packed per file by the default storage.
const DEFAULT_KEYS_PER_FILE: i32 = 8;

/// A manager with the embedded default storage and group registered.
pub fn embedded_manager(config: &ServerConfig) -> Result<Arc<Manager>, ServerError> {
    let manager = Manager::new(ManagerDeps {
        storage_probe_interval: config.storage_probe_interval(),
        open_index: local_index_factory(),
        node_id: super::election::node_id(config),
        pool_timing: config.pool.timing(),
        reclaim_period: config.reclaimer.period(),
        reclaim_policy: config.reclaimer.live_policy().unwrap_or_default(),
        limits: config.security.manager,
        allowed_roots: config.security.allowed_roots.clone(),
    })?;
    match config.journal.shared_store() {
        Some(uri) => lead_on_shared_store(config, &manager, uri)?,
        None => {
            // Each node recovers its own journal before it campaigns (nothing is shared
            // between nodes' local journals); a node that wins then serves what it recovered.
            if let Some(journal) = config.journal.journal(&config.data_dir) {
                let report = manager.open_journal(journal)?;
                report_recovery(&report);
            }
            super::election::join(config, &manager)?;
            add_defaults(config, &manager)?;
        }
    }
    Ok(manager)
}

/// On the shared store a node holds nothing until it wins the lead: the promotion hook
/// fences older leaders out, restores what the store holds and adds the defaults where
/// missing. A node that loses the lead holds a stale copy: it restarts
/// ([`super::request_restart`]) and comes back as a follower.
fn lead_on_shared_store(
    config: &ServerConfig,
    manager: &Arc<Manager>,
    uri: &str,
) -> Result<(), ServerError> {
    let store = manager.connect_shared_store(uri)?;
    let weak = Arc::downgrade(manager);
    let settings = config.clone();
    manager
        .leadership()
        .set_on_promote(Arc::new(move |promotion| {
            let manager = weak
                .upgrade()
                .ok_or_else(|| "the manager is gone".to_string())?;
            let promoted = manager
                .promote_shared(&store, promotion.fencing_token)
                .map_err(|e| e.to_string())
                .and_then(|report| {
                    report_recovery(&report);
                    add_defaults(&settings, &manager).map_err(|e| e.to_string())
                });
            if promoted.is_err() && manager.journal_stats().is_some() {
                // Restored, then failed: the copy in memory cannot serve as it is.
                let why = "taking over the shared store failed half-way";
                super::request_restart(why, std::time::Duration::ZERO);
            }
            promoted
        }));
    let weak = Arc::downgrade(manager);
    manager.leadership().add_on_demote(Arc::new(move || {
        // Leaving the process-local lock every node starts on (before `join`) drops a lead
        // that loaded nothing; only a node that took the store over holds a stale copy. A
        // resignation is the process stopping: nothing to restart.
        let Some(manager) = weak.upgrade() else {
            return;
        };
        let leadership = manager.leadership();
        if manager.journal_stats().is_some() && !leadership.is_resigned() {
            let why = "this node lost the lead; its copy of the shared store is stale";
            super::request_restart(why, leadership.campaign_pause_left());
        }
    }));
    tracing::info!(
        store = %kvcm_index::redis::redacted_uri(uri),
        "metadata on the shared store: this node serves it once it wins the lead"
    );
    // A process restarted after a LeaderDemote keeps the rest of its campaign pause.
    let hold_off_ms = std::env::var(super::RESTART_HOLD_OFF_ENV)
        .ok()
        .and_then(|ms| ms.parse::<u64>().ok())
        .unwrap_or(0);
    if hold_off_ms > 0 {
        tracing::info!(
            hold_off_ms,
            "restarted after a demotion: not campaigning before then"
        );
        manager
            .leadership()
            .hold_off(std::time::Duration::from_millis(hold_off_ms));
    }
    super::election::join(config, manager)
}

/// Adds the embedded default storage(s) and group where missing (a recovered registry may
/// hold them already, possibly changed by an admin).
fn add_defaults(config: &ServerConfig, manager: &Manager) -> Result<(), ServerError> {
    let root = block_root(&config.data_dir)?;
    let mut group = default_group();
    let mut storages = vec![default_storage(&root)];
    if config.pool.embedded_size > 0 {
        storages.push(default_pool());
        group.storage_candidates.insert(0, DEFAULT_POOL.into());
        if let Some(cache) = group.cache_config.as_mut() {
            cache.data_storage_strategy = admin::CachePreferStrategy::CpsPreferTairMempool as i32;
        }
    }
    let registered = manager.list_storages();
    for storage in storages {
        let name = &storage.global_unique_name;
        if !registered.iter().any(|s| &s.global_unique_name == name) {
            manager.add_storage(storage)?;
        }
    }
    if manager.group(DEFAULT_GROUP).is_err() {
        let group = group_from_wire(group).map_err(ServerError::Bootstrap)?;
        manager.create_group(group)?;
    }
    Ok(())
}

/// Logs what recovery restored, cut and skipped.
fn report_recovery(report: &kvcm_manager::RecoveryReport) {
    tracing::info!(
        snapshot = ?report.snapshot,
        segments = report.segments,
        records = report.records,
        registry_objects = report.registry_objects,
        entries = report.entries,
        dropped_locations = report.dropped_locations,
        cleaned_locations = report.cleaned_locations,
        removed_locations = report.removed_locations,
        over_cap_entries = report.over_cap_entries,
        "journal recovered"
    );
    for cut in &report.cut {
        tracing::warn!(%cut, "journal: a damaged tail was cut");
    }
    for skipped in &report.skipped {
        tracing::warn!(%skipped, "journal: skipped on recovery");
    }
}

/// `<data_dir>/blocks/` as an absolute path (created), ending in `/` as NFS roots must.
fn block_root(data_dir: &Path) -> Result<String, ServerError> {
    let blocks = data_dir.join("blocks");
    std::fs::create_dir_all(&blocks).map_err(|source| ServerError::DataDir {
        path: blocks.clone(),
        source,
    })?;
    let absolute = blocks
        .canonicalize()
        .map_err(|source| ServerError::DataDir {
            path: blocks,
            source,
        })?;
    Ok(format!("{}/", absolute.display()))
}

fn default_storage(root_path: &str) -> StorageConfig {
    StorageConfig {
        global_unique_name: DEFAULT_STORAGE.into(),
        spec: StorageSpec::Nfs {
            root_path: root_path.into(),
            key_count_per_file: DEFAULT_KEYS_PER_FILE,
        },
        check_storage_available_when_open: true,
    }
}

fn default_pool() -> StorageConfig {
    StorageConfig {
        global_unique_name: DEFAULT_POOL.into(),
        spec: StorageSpec::TairMemPool {
            domain: "embedded".into(),
            timeout: 0,
            enable_vipserver: false,
            service_discovery_url: String::new(),
            media_type: 0,
        },
        check_storage_available_when_open: false,
    }
}

fn default_group() -> admin::InstanceGroup {
    admin::InstanceGroup {
        name: DEFAULT_GROUP.into(),
        storage_candidates: vec![DEFAULT_STORAGE.into()],
        global_quota_group_name: DEFAULT_GROUP.into(),
        max_instance_count: 0,
        quota: Some(admin::InstanceGroupQuota {
            capacity: i64::MAX,
            quota_config: Vec::new(),
        }),
        cache_config: Some(admin::CacheConfig {
            reclaim_strategy: Some(admin::CacheReclaimStrategy {
                storage_unique_name: DEFAULT_STORAGE.into(),
                reclaim_policy: admin::ReclaimPolicy::PolicyLru as i32,
                ..Default::default()
            }),
            // No strategy names NFS; PREFER_3FS falls back to the first candidate.
            data_storage_strategy: admin::CachePreferStrategy::CpsPrefer3fs as i32,
            meta_indexer_config: Some(admin::MetaIndexerConfig {
                max_key_count: 0,
                mutex_shard_num: 256,
                batch_key_size: 64,
                mutex_enabled: None,
                meta_storage_backend_config: Some(admin::MetaStorageBackendConfig {
                    storage_type: "local".into(),
                    storage_uri: String::new(),
                }),
                meta_cache_policy_config: Some(admin::MetaCachePolicyConfig {
                    r#type: "lru".into(),
                    capacity: 0,
                    ..Default::default()
                }),
            }),
        }),
        user_data: String::new(),
        version: 1,
        ..Default::default()
    }
}
