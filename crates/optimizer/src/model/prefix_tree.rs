//! [`PrefixTree`]: interns request key lists into tree nodes, one tree per instance.
//!
//! A node is one block: (parent node or instance root, block key). Node ids are dense
//! (0, 1, 2, ...) in order of first appearance, which is what the policies index by.
//! Edges carry one block each: a block is the unit of caching, so there is nothing to gain
//! from compressing single-child chains.

use std::collections::HashMap;

use crate::policy::BlockId;

/// Prefix tree of blocks for all instances of a trace.
#[derive(Debug, Default)]
pub struct PrefixTree {
    /// (parent reference, key) -> node. Parent references: node id, or `ROOT_BASE + instance`.
    children: HashMap<(u64, u64), BlockId>,
    parents: Vec<Option<BlockId>>,
    instances: HashMap<String, u64>,
}

/// Parent references at or above this value are instance roots.
const ROOT_BASE: u64 = 1 << 32;

impl PrefixTree {
    /// An empty tree.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends to `out` the node of every key of `keys` under `instance`, creating the missing
    /// nodes. Returns `None` (and leaves the tree unchanged) if the ids would pass `u32::MAX`.
    pub fn intern(&mut self, instance: &str, keys: &[u64], out: &mut Vec<BlockId>) -> Option<()> {
        if self.parents.len() + keys.len() >= BlockId::MAX as usize {
            return None;
        }
        let mut parent_ref = self.root_of(instance);
        let mut parent = None;
        for &key in keys {
            let next_id = self.parents.len() as BlockId;
            let node = *self.children.entry((parent_ref, key)).or_insert(next_id);
            if node == next_id {
                self.parents.push(parent);
            }
            out.push(node);
            parent = Some(node);
            parent_ref = u64::from(node);
        }
        Some(())
    }

    /// The parent of `block`; `None` for a block at an instance root or an unknown block.
    pub fn parent(&self, block: BlockId) -> Option<BlockId> {
        self.parents.get(block as usize).copied().flatten()
    }

    /// Number of blocks (nodes) in the tree.
    pub fn len(&self) -> usize {
        self.parents.len()
    }

    /// Whether the tree has no block.
    pub fn is_empty(&self) -> bool {
        self.parents.is_empty()
    }

    /// Number of instances seen.
    pub fn instances(&self) -> usize {
        self.instances.len()
    }

    /// The parents of all blocks, indexed by block id.
    pub fn into_parents(self) -> Vec<Option<BlockId>> {
        self.parents
    }

    fn root_of(&mut self, instance: &str) -> u64 {
        let next = ROOT_BASE + self.instances.len() as u64;
        match self.instances.get(instance) {
            Some(&root) => root,
            None => {
                self.instances.insert(instance.to_string(), next);
                next
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_prefixes_share_nodes_and_same_key_under_other_prefix_is_new() {
        let mut tree = PrefixTree::new();
        let mut out = Vec::new();
        tree.intern("", &[10, 11, 12], &mut out).unwrap();
        tree.intern("", &[10, 11, 13], &mut out).unwrap();
        tree.intern("", &[11], &mut out).unwrap();
        assert_eq!(out, vec![0, 1, 2, 0, 1, 3, 4]);
        assert_eq!(tree.parent(2), Some(1));
        assert_eq!(tree.parent(3), Some(1));
        assert_eq!(tree.parent(0), None);
        assert_eq!(tree.parent(4), None);
        assert_eq!(tree.len(), 5);
    }

    #[test]
    fn instances_have_separate_trees() {
        let mut tree = PrefixTree::new();
        let mut out = Vec::new();
        tree.intern("a", &[1, 2], &mut out).unwrap();
        tree.intern("b", &[1, 2], &mut out).unwrap();
        assert_eq!(out, vec![0, 1, 2, 3]);
        assert_eq!(tree.instances(), 2);
    }
}
