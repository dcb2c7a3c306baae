//! The conformance suite on the local backend.

use kvcm_index::{conformance, LocalIndex, LocalIndexConfig};

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
