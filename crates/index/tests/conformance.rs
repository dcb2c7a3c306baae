//! The conformance suite on the local backend.

use kvcm_index::{conformance, CacheConfig, CachedIndex, LocalIndex, LocalIndexConfig};

#[test]
fn local_index_with_256_shards_conforms() {
    conformance::run_all(|max_key_count| {
        LocalIndex::new(LocalIndexConfig {
            shard_bits: 8,
            max_key_count,
        })
        .expect("config")
    });
}

#[test]
fn local_index_with_one_shard_conforms() {
    conformance::run_all(|max_key_count| {
        LocalIndex::new(LocalIndexConfig {
            shard_bits: 0,
            max_key_count,
        })
        .expect("config")
    });
}

fn cached_local(max_key_count: u64, capacity: usize) -> CachedIndex<LocalIndex<u64>, u64> {
    let inner = LocalIndex::new(LocalIndexConfig {
        shard_bits: 6,
        max_key_count,
    })
    .expect("config");
    CachedIndex::new(
        inner,
        CacheConfig {
            shard_bits: 3,
            capacity,
        },
    )
    .expect("cache config")
}

#[test]
fn cached_local_index_conforms() {
    conformance::run_all(|max_key_count| cached_local(max_key_count, 100_000));
}

#[test]
fn cached_local_index_with_a_tiny_cache_conforms() {
    conformance::run_all(|max_key_count| cached_local(max_key_count, 5));
}
