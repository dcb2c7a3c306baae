//! Property check of the `EvictionPolicy` contract for every policy, on random sequences of
//! accesses (with parents and oracle hints) and removals: what a policy reports as held
//! always equals the set implied by its own hit/evict answers, and it never exceeds capacity.

use std::collections::HashSet;

use kvcm_optimizer::policy::{Access, BlockId, EvictionPolicy, PolicyKind};
use kvcm_optimizer::rng::SplitMix64;

const BLOCKS: usize = 24;

/// Applies one random step; updates `held` from the policy's answers.
fn random_step(
    policy: &mut dyn EvictionPolicy,
    held: &mut HashSet<BlockId>,
    rng: &mut SplitMix64,
    time: u64,
) {
    let block = rng.below(BLOCKS) as BlockId;
    if rng.below(8) == 0 {
        assert_eq!(policy.remove(block), held.remove(&block), "remove {block}");
        return;
    }
    let access = Access {
        block,
        parent: (block > 0 && rng.below(2) == 0).then_some(block / 2),
        next_use: (rng.below(4) != 0).then(|| time + 1 + rng.below(50) as u64),
    };
    let mut evicted = Vec::new();
    let hit = policy.access(access, &mut evicted);
    assert_eq!(hit, held.contains(&block), "hit answer for {block}");
    held.insert(block);
    for victim in &evicted {
        assert!(held.remove(victim), "evicted {victim}, which was not held");
    }
    let unique: HashSet<_> = evicted.iter().collect();
    assert_eq!(
        unique.len(),
        evicted.len(),
        "a block evicted twice in one call"
    );
}

#[test]
fn every_policy_keeps_its_contract_on_random_operations() {
    for policy_kind in PolicyKind::ALL {
        for seed in 0..30 {
            let mut rng = SplitMix64::new(seed);
            let capacity = rng.below(10);
            let mut policy = policy_kind.build(capacity);
            let mut held = HashSet::new();
            for time in 0..400 {
                random_step(policy.as_mut(), &mut held, &mut rng, time);
                assert!(policy.len() <= capacity, "{policy_kind:?} over capacity");
                assert_eq!(policy.len(), held.len(), "{policy_kind:?} seed {seed} len");
                for block in 0..BLOCKS as BlockId {
                    assert_eq!(
                        policy.contains(block),
                        held.contains(&block),
                        "{policy_kind:?} seed {seed} time {time} block {block}"
                    );
                }
            }
        }
    }
}
