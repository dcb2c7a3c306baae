//! The default index factory: one in-memory `LocalIndex` per instance, sized from the
//! group's `meta_indexer_config`; with a positive `meta_cache_policy_config.capacity` (MiB)
//! it sits behind a `CachedIndex` search cache of about that size.

use std::sync::Arc;

use kvcm_index::{
    CacheConfig, CachedIndex, LocalIndex, LocalIndexConfig, MetaIndex, MAX_SHARD_BITS,
};

use super::entry::Entry;
use super::error::{ManagerError, ManagerResult};
use super::group_config::IndexerConfig;
use super::IndexFactory;

/// A factory of `LocalIndex` key spaces.
pub fn local_index_factory() -> IndexFactory {
    Arc::new(|config, log| {
        let local = LocalIndex::with_log(local_config(config)?, log)?;
        let index: Arc<dyn MetaIndex<Entry>> = match cache_config(config)? {
            Some(cache) => Arc::new(CachedIndex::new(local, cache)?),
            None => Arc::new(local),
        };
        Ok(index)
    })
}

/// Checks the settings an index is opened with, so that a group whose instances could not
/// be opened is refused when it is created or updated (INVALID_ARGUMENT naming the field).
/// `shared_store`: the node's shared store URI, when its metadata is kept on Redis.
pub fn check_indexer_config(
    config: &IndexerConfig,
    shared_store: Option<&str>,
) -> ManagerResult<()> {
    check_backend(config, shared_store)?;
    local_config(config)?;
    cache_config(config)?;
    Ok(())
}

/// `meta_storage_backend_config`. The working index of every instance is in memory; where
/// its entries are kept is the node's choice (its journal, or the shared store on Redis).
/// - `local`: the reference's `storage_uri` of a local backend, `file:///path` or empty, is
///   accepted and unused;
/// - `redis`: accepted on a node whose metadata is on the shared store (the entries are on
///   Redis, as the setting asks); its `storage_uri`, when set, must name the same server
///   (host, port, database) — per-group Redis servers are not supported. Refused otherwise.
fn check_backend(config: &IndexerConfig, shared_store: Option<&str>) -> ManagerResult<()> {
    let backend = &config.backend;
    let field = "meta_indexer_config.meta_storage_backend_config.storage_type";
    let uri_field = "meta_indexer_config.meta_storage_backend_config.storage_uri";
    let uri = &backend.storage_uri;
    if backend.storage_type.eq_ignore_ascii_case("redis") {
        let Some(store) = shared_store else {
            return Err(ManagerError::invalid_because(
                field,
                "\"redis\": this node keeps its metadata in its local journal; run it with \
                 kvcm.registry_storage.uri=redis://... to keep every entry on Redis",
            ));
        };
        if !uri.is_empty() && !same_redis_server(uri, store) {
            return Err(ManagerError::invalid_because(
                uri_field,
                format!(
                    "{:?}: entries are kept on this node's shared store ({}); per-group Redis \
                     servers are not supported",
                    kvcm_index::redis::redacted_uri(uri),
                    kvcm_index::redis::redacted_uri(store)
                ),
            ));
        }
        return Ok(());
    }
    if !backend.storage_type.eq_ignore_ascii_case("local") {
        return Err(ManagerError::invalid_because(
            field,
            format!(
                "{:?}: only \"local\" and \"redis\" are supported",
                backend.storage_type
            ),
        ));
    }
    if !uri.is_empty() && !uri.starts_with("file://") {
        return Err(ManagerError::invalid_because(
            uri_field,
            format!("{uri:?}: a local backend takes file:///path or nothing"),
        ));
    }
    Ok(())
}

/// Whether two Redis URIs name the same server and database.
fn same_redis_server(a: &str, b: &str) -> bool {
    let server = |uri: &str| {
        kvcm_index::redis::parse_uri(uri)
            .ok()
            .map(|u| (u.host, u.port, u.handshake.db))
    };
    matches!((server(a), server(b)), (Some(a), Some(b)) if a == b)
}

/// Bytes one cached entry is assumed to take (key, shared entry, LRU links).
const CACHED_ENTRY_BYTES: i64 = 256;

/// The search cache of `meta_cache_policy_config`: `None` when absent or of capacity 0;
/// only the `lru` type exists.
fn cache_config(config: &IndexerConfig) -> ManagerResult<Option<CacheConfig>> {
    let policy = &config.cache_policy;
    if policy.capacity <= 0 {
        return Ok(None);
    }
    if !policy.kind.eq_ignore_ascii_case("lru") {
        return Err(ManagerError::invalid_because(
            "meta_cache_policy_config.type",
            format!("{:?}: only \"lru\" is supported", policy.kind),
        ));
    }
    let shard_bits = u32::try_from(policy.cache_shard_bits)
        .ok()
        .filter(|&bits| bits <= MAX_SHARD_BITS)
        .ok_or_else(|| {
            ManagerError::invalid_because(
                "meta_cache_policy_config.cache_shard_bits",
                format!("{} is not in 0..={MAX_SHARD_BITS}", policy.cache_shard_bits),
            )
        })?;
    let entries = policy.capacity.saturating_mul(1 << 20) / CACHED_ENTRY_BYTES;
    Ok(Some(CacheConfig {
        shard_bits,
        capacity: usize::try_from(entries).unwrap_or(usize::MAX),
    }))
}

/// `mutex_shard_num` (a power of two; 0 = default) becomes the shard count; a positive
/// `max_key_count` caps the key count (0 or negative = no cap).
fn local_config(config: &IndexerConfig) -> ManagerResult<LocalIndexConfig> {
    let defaults = LocalIndexConfig::default();
    let shard_bits = match u64::try_from(config.mutex_shard_num) {
        Ok(0) => defaults.shard_bits,
        Ok(n) if n.is_power_of_two() && n.trailing_zeros() <= MAX_SHARD_BITS => n.trailing_zeros(),
        _ => {
            return Err(ManagerError::invalid_because(
                "meta_indexer_config.mutex_shard_num",
                format!(
                    "{} is not a power of two up to 2^{MAX_SHARD_BITS}",
                    config.mutex_shard_num
                ),
            ))
        }
    };
    let max_key_count = u64::try_from(config.max_key_count)
        .ok()
        .filter(|&n| n > 0)
        .unwrap_or(u64::MAX);
    Ok(LocalIndexConfig {
        shard_bits,
        max_key_count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group_config::SearchCachePolicy;
    use kvcm_index::{Change, ChangeLog, IndexError, LogTicket};

    /// A change log that keeps nothing.
    struct Unlogged;

    impl ChangeLog<Entry> for Unlogged {
        fn append(&self, _: &[Change<'_, Entry>]) -> Result<LogTicket, IndexError> {
            Ok(LogTicket(0))
        }

        fn wait_durable(&self, _: LogTicket) -> Result<(), IndexError> {
            Ok(())
        }
    }

    #[test]
    fn shard_count_must_be_a_power_of_two() {
        let mut config = IndexerConfig {
            mutex_shard_num: 16,
            max_key_count: 100,
            ..Default::default()
        };
        let local = local_config(&config).expect("16 shards");
        assert_eq!((local.shard_bits, local.max_key_count), (4, 100));
        config.mutex_shard_num = 12;
        assert!(local_config(&config).is_err());
        config.mutex_shard_num = -4;
        assert!(local_config(&config).is_err());
    }

    #[test]
    fn local_is_accepted_and_redis_only_on_the_shared_store() {
        let mut config = IndexerConfig::default();
        config.backend.storage_type = "LOCAL".into();
        check_indexer_config(&config, None).expect("local");
        config.backend.storage_uri = "file:///var/kvcm/index".into();
        check_indexer_config(&config, None).expect("the reference's local persistence URI");
        config.backend.storage_uri = "redis://h:1".into();
        assert!(check_indexer_config(&config, None).is_err());
        config.backend.storage_uri.clear();
        for refused in ["redis", "rocksdb", ""] {
            config.backend.storage_type = refused.into();
            let error = check_indexer_config(&config, None).unwrap_err().to_string();
            assert!(error.contains("storage_type"), "{refused}: {error}");
        }
        let store = Some("redis://:secret@h:1/0");
        config.backend.storage_type = "redis".into();
        check_indexer_config(&config, store).expect("entries on the shared store");
        config.backend.storage_uri = "redis://h:1?cluster_name=c".into();
        check_indexer_config(&config, store).expect("the same server, other parameters");
        config.backend.storage_uri = "redis://other:1".into();
        let error = check_indexer_config(&config, store)
            .unwrap_err()
            .to_string();
        assert!(error.contains("storage_uri"), "{error}");
        assert!(
            !error.contains("secret"),
            "passwords stay out of messages: {error}"
        );
    }

    #[test]
    fn the_search_cache_is_sized_in_mib_and_must_be_lru() {
        let mut config = IndexerConfig::default();
        assert_eq!(cache_config(&config).unwrap(), None);
        config.cache_policy = SearchCachePolicy {
            capacity: 1,
            kind: "LRU".into(),
            cache_shard_bits: 2,
            high_pri_pool_ratio: 0.0,
        };
        let cache = cache_config(&config).unwrap().expect("enabled");
        assert_eq!((cache.shard_bits, cache.capacity), (2, 4096));
        config.cache_policy.kind = "lfu".into();
        assert!(cache_config(&config).is_err());
        config.cache_policy.kind = "lru".into();
        config.cache_policy.cache_shard_bits = 40;
        assert!(cache_config(&config).is_err());
        assert!(
            local_index_factory()(&config, Arc::new(Unlogged)).is_err(),
            "the factory refuses it too"
        );
    }
}
