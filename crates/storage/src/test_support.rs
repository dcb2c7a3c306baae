//! Builders of allocation requests for the crate's unit tests.

use crate::{BlockSpec, BlockToAllocate};

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
