//! The default index factory: one in-memory `LocalIndex` per instance, sized from the
//! group's `meta_indexer_config`.

use std::sync::Arc;

use kvcm_index::{LocalIndex, LocalIndexConfig, MetaIndex, MAX_SHARD_BITS};

use super::entry::Entry;
use super::error::{ManagerError, ManagerResult};
use super::IndexFactory;
use crate::proto::admin;

/// A factory of `LocalIndex` key spaces.
pub fn local_index_factory() -> IndexFactory {
    Arc::new(|config| {
        let index: Arc<dyn MetaIndex<Entry>> = Arc::new(LocalIndex::new(local_config(config)?)?);
        Ok(index)
    })
}

/// `mutex_shard_num` (a power of two; 0 = default) becomes the shard count; a positive
/// `max_key_count` caps the key count (0 or negative = no cap).
fn local_config(config: &admin::MetaIndexerConfig) -> ManagerResult<LocalIndexConfig> {
    let defaults = LocalIndexConfig::default();
    let shard_bits = match u64::try_from(config.mutex_shard_num) {
        Ok(0) => defaults.shard_bits,
        Ok(n) if n.is_power_of_two() && n.trailing_zeros() <= MAX_SHARD_BITS => n.trailing_zeros(),
        _ => {
            return Err(ManagerError::InvalidArgument(format!(
            "meta_indexer_config.mutex_shard_num {} is not a power of two up to 2^{MAX_SHARD_BITS}",
            config.mutex_shard_num
        )))
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

    #[test]
    fn shard_count_must_be_a_power_of_two() {
        let mut config = admin::MetaIndexerConfig {
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
}
