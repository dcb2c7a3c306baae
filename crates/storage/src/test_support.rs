//! Builders of storage configs and allocation requests for the crate's unit tests.

use crate::{BlockSpec, BlockToAllocate, StorageConfig, StorageSpec};

/// A storage `store_1` with this spec, not probed at open.
pub(crate) fn config(spec: StorageSpec) -> StorageConfig {
    StorageConfig {
        global_unique_name: "store_1".to_string(),
        spec,
        check_storage_available_when_open: false,
    }
}

/// An NFS spec rooted at `root_path`, 8 blocks per file.
pub(crate) fn nfs(root_path: &str) -> StorageSpec {
    StorageSpec::Nfs {
        root_path: root_path.to_string(),
        key_count_per_file: 8,
    }
}

/// Parts named `tp0`, `tp1`, ... with these sizes.
pub(crate) fn specs(sizes: &[i64]) -> Vec<BlockSpec> {
    let named = sizes.iter().enumerate();
    let spec = |(i, &size): (usize, &i64)| BlockSpec {
        name: format!("tp{i}"),
        size,
    };
    named.map(spec).collect()
}

/// One block per key, each carrying the parts `spec_indexes`.
pub(crate) fn blocks(keys: &[i64], spec_indexes: &[usize]) -> Vec<BlockToAllocate> {
    let block = |&key: &i64| BlockToAllocate {
        key,
        spec_indexes: spec_indexes.to_vec(),
    };
    keys.iter().map(block).collect()
}
