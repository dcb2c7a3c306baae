//! Helpers for hand-computed policy tests: run a block sequence, compare hits and evictions.

use super::{Access, BlockId, EvictionPolicy};

/// Per access: hit or miss, and the blocks evicted by it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Outcome(pub Vec<(bool, Vec<BlockId>)>);

impl Outcome {
    /// Parses "h m m(3) m(1,2)": `h` hit, `m` miss, parenthesised evictions.
    pub(crate) fn parse(text: &str) -> Outcome {
        let step = |token: &str| {
            let hit = token.starts_with('h');
            let evicted = token
                .split_once('(')
                .map(|(_, rest)| {
                    rest.trim_end_matches(')')
                        .split(',')
                        .map(|n| n.parse().unwrap())
                        .collect()
                })
                .unwrap_or_default();
            (hit, evicted)
        };
        Outcome(text.split_whitespace().map(step).collect())
    }
}

/// Runs plain accesses (no parent, no hint).
pub(crate) fn run_plain(policy: &mut dyn EvictionPolicy, blocks: &[BlockId]) -> Outcome {
    let accesses: Vec<Access> = blocks.iter().map(|&b| Access::plain(b)).collect();
    run(policy, &accesses)
}

/// Runs `accesses` and checks the capacity bound after each.
pub(crate) fn run(policy: &mut dyn EvictionPolicy, accesses: &[Access]) -> Outcome {
    let mut steps = Vec::new();
    for &access in accesses {
        let mut evicted = Vec::new();
        let hit = policy.access(access, &mut evicted);
        assert!(policy.len() <= policy.capacity(), "over capacity");
        steps.push((hit, evicted));
    }
    Outcome(steps)
}
