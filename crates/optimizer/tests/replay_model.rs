//! Replay model checks: hand-computed prefix hits, LRU by stack distances == LRU by direct
//! simulation, Belady >= every policy on random traces, and the acceptance figures on the
//! Mooncake fixture.

use std::path::PathBuf;

use kvcm_optimizer::model::Workload;
use kvcm_optimizer::policy::PolicyKind;
use kvcm_optimizer::rng::SplitMix64;
use kvcm_optimizer::sim::{capacity_for_target, replay, Config, LruCurve};
use kvcm_optimizer::trace::Request;

/// Random requests whose keys come from a small alphabet, so prefixes are often shared.
fn random_workload(seed: u64) -> Workload {
    let mut rng = SplitMix64::new(seed);
    let requests: Vec<Request> = (0..60)
        .map(|_| {
            let len = 1 + rng.below(6);
            let blocks: Vec<u64> = (0..len).map(|_| rng.below(3) as u64).collect();
            Request::untimed(&blocks, len as u64 * 4 - rng.below(4) as u64)
        })
        .collect();
    Workload::from_requests(&requests, 4).unwrap()
}

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/data/mooncake_synthetic_trace.jsonl")
}

#[test]
fn prefix_hits_stop_at_the_first_missing_block() {
    // Capacity 3, LRU. Request 1 [a b c]: all miss. Request 2 [a x c]: a hits, x misses;
    // c is cached but under another prefix (it is a different block), so 1 hit of 3.
    // The accesses of request 2 evict b and c (LRU order a, x, c2 newest).
    // Request 3 [a b c]: a hits, b was evicted -> 1 hit. Tokens: 10 per block, last block 5.
    let requests = [
        Request::untimed(&[1, 2, 3], 25),
        Request::untimed(&[1, 9, 3], 25),
        Request::untimed(&[1, 2, 3], 25),
    ];
    let workload = Workload::from_requests(&requests, 10).unwrap();
    let stats = replay(&workload, &Config::single(PolicyKind::Lru, 3), 1);
    assert_eq!((stats.hit_blocks, stats.requested_blocks), (2, 9));
    assert_eq!((stats.hit_tokens, stats.requested_tokens), (20, 75));
    assert_eq!(stats.blocks_written_main, 7);
    assert_eq!(stats.prefix_hit_lengths.counts(), &[1, 2]);
}

#[test]
fn hand_computed_hit_rates_for_every_policy() {
    // Capacity 2 over seven single-block requests 1 2 1 3 1 2 3 (blocks are roots).
    // Expected hits per policy, traced by hand from each policy's rules (docs/optimizer.md).
    // Random-LRU depends on its samples; its hand-computed test (samples covering the cache)
    // is in policy/random_lru.rs.
    let blocks = [1, 2, 1, 3, 1, 2, 3];
    let requests: Vec<Request> = blocks.iter().map(|&b| Request::untimed(&[b], 1)).collect();
    let workload = Workload::from_requests(&requests, 1).unwrap();
    let expected = [
        (PolicyKind::Lru, 2),     // hits: the 2nd and 3rd access to 1
        (PolicyKind::LeafLru, 2), // no parents: same as LRU
        (PolicyKind::Fifo, 1),    // 1 hit once, then 3 pushes 1 out
        (PolicyKind::Lfu, 2),     // 1 becomes frequent and stays
        (PolicyKind::S3fifo, 2),  // 1 promoted to main on its hit
        (PolicyKind::Sieve, 2),   // 1 visited survives the hand
        (PolicyKind::Arc, 3),     // 2's B1 ghost hit raises p: T2's 1 goes, T1's 3 stays
        (PolicyKind::Belady, 3),  // does not admit 3 (furthest next use): 1, 1, 2 hit
    ];
    for (policy, hits) in expected {
        let stats = replay(&workload, &Config::single(policy, 2), 1);
        assert_eq!(stats.hit_blocks, hits, "{policy:?}");
    }
}

#[test]
fn lru_by_stack_distances_equals_lru_by_direct_simulation() {
    for seed in 0..40 {
        let workload = random_workload(seed);
        let curve = LruCurve::compute(&workload);
        for capacity in 0..=workload.unique_blocks() {
            let stats = replay(&workload, &Config::single(PolicyKind::Lru, capacity), 1);
            assert_eq!(
                curve.hit_blocks(capacity),
                stats.hit_blocks,
                "seed {seed} c {capacity}"
            );
            assert_eq!(curve.token_hit_rate(capacity), stats.token_hit_rate());
        }
    }
}

#[test]
fn belady_is_at_least_every_policy_on_random_traces() {
    for seed in 100..160 {
        let workload = random_workload(seed);
        for capacity in [1, 2, 3, 5, 8] {
            let best = replay(&workload, &Config::single(PolicyKind::Belady, capacity), 1);
            for policy in PolicyKind::ALL {
                let stats = replay(&workload, &Config::single(policy, capacity), 1);
                assert!(
                    best.hit_blocks >= stats.hit_blocks,
                    "seed {seed} capacity {capacity}: belady {} < {policy:?} {}",
                    best.hit_blocks,
                    stats.hit_blocks
                );
            }
        }
    }
}

#[test]
fn fixture_lru_sweep_matches_the_acceptance_figures() {
    let workload = Workload::load(&[fixture()], None, None).unwrap();
    assert_eq!(workload.unique_blocks(), 43_924);
    assert_eq!(workload.block_tokens(), 512);
    let curve = LruCurve::compute(&workload);
    let expected = [
        (5, 0.1548),
        (10, 0.2598),
        (20, 0.3905),
        (40, 0.5446),
        (60, 0.6124),
        (80, 0.6353),
        (100, 0.6396),
    ];
    for (percent, rate) in expected {
        let capacity = workload.unique_blocks() * percent / 100;
        let direct = replay(&workload, &Config::single(PolicyKind::Lru, capacity), 1);
        assert!(
            (direct.block_hit_rate() - rate).abs() <= 0.0005,
            "{percent}%"
        );
        assert_eq!(curve.hit_blocks(capacity), direct.hit_blocks, "{percent}%");
    }
}

#[test]
fn target_capacity_is_the_smallest_reaching_the_rate() {
    let workload = random_workload(7);
    let curve = LruCurve::compute(&workload);
    let infinite = curve.block_hit_rate(workload.unique_blocks());
    for policy in PolicyKind::ALL {
        let capacity = capacity_for_target(&workload, &curve, policy, 0.9 * infinite).unwrap();
        let at = |c| replay(&workload, &Config::single(policy, c), 1).block_hit_rate();
        assert!(at(capacity) >= 0.9 * infinite, "{policy:?}");
        if policy != PolicyKind::Fifo && capacity > 0 {
            assert!(at(capacity - 1) < 0.9 * infinite, "{policy:?}");
        }
    }
    assert_eq!(
        capacity_for_target(&workload, &curve, PolicyKind::Lru, 1.5),
        None
    );
    assert_eq!(
        capacity_for_target(&workload, &curve, PolicyKind::Sieve, 1.5),
        None
    );
}

#[test]
fn two_tier_counts_writes_per_tier_and_promotes_on_hit() {
    // Memory 1 block in front of main 2 blocks, LRU. Single-block requests 1 2 1:
    // 1 -> memory (write mem). 2 -> memory, 1 demoted to main (write mem, write main).
    // 1: hit in main -> promoted to memory (write mem), 2 demoted (write main).
    let requests: Vec<Request> = [1, 2, 1]
        .iter()
        .map(|&b| Request::untimed(&[b], 1))
        .collect();
    let workload = Workload::from_requests(&requests, 1).unwrap();
    let config = Config {
        policy: PolicyKind::Lru,
        capacity: 2,
        memory_capacity: Some(1),
    };
    let stats = replay(&workload, &config, 1);
    assert_eq!(stats.hit_blocks, 1);
    assert_eq!(stats.memory_hit_blocks, 0);
    assert_eq!(
        (stats.blocks_written_memory, stats.blocks_written_main),
        (3, 2)
    );
}

#[test]
fn extreme_timestamps_fall_in_the_first_and_last_window() {
    let mut first = Request::untimed(&[1], 1);
    let mut last = Request::untimed(&[1], 1);
    first.timestamp_us = 0;
    last.timestamp_us = u64::MAX;
    let workload = Workload::from_requests(&[first, last], 1).unwrap();
    let stats = replay(&workload, &Config::single(PolicyKind::Lru, 1), 4);
    let requested: Vec<u64> = stats.windows.iter().map(|w| w.requested_blocks).collect();
    assert_eq!(requested, [1, 0, 0, 1]);
    assert_eq!(stats.windows[3].hit_blocks, 1);
}

#[test]
fn reuse_distances_count_distinct_blocks_since_the_last_use() {
    // Blocks 1, 2, 1, 3, 2: the second 1 has depth 2 (1 and 2 since its use), the second 2
    // has depth 3 (2, 1, 3). Three cold accesses.
    let requests: Vec<Request> = [1, 2, 1, 3, 2]
        .iter()
        .map(|&b| Request::untimed(&[b], 1))
        .collect();
    let workload = Workload::from_requests(&requests, 1).unwrap();
    let curve = LruCurve::compute(&workload);
    assert_eq!(curve.cold_accesses(), 3);
    assert_eq!(curve.reuse_distances().counts(), &[0, 0, 2]);
    assert_eq!(curve.hit_blocks(2), 1);
    assert_eq!(curve.hit_blocks(3), 2);
}

#[test]
fn instances_never_share_blocks() {
    let mut a = Request::untimed(&[1, 2], 2);
    let mut b = Request::untimed(&[1, 2], 2);
    a.instance = "a".to_string();
    b.instance = "b".to_string();
    let workload = Workload::from_requests(&[a, b], 1).unwrap();
    assert_eq!((workload.instances(), workload.unique_blocks()), (2, 4));
    let stats = replay(&workload, &Config::single(PolicyKind::Lru, 10), 1);
    assert_eq!(stats.hit_blocks, 0);
}

#[test]
fn two_tier_lru_hits_like_one_lru_of_the_combined_size() {
    // Memory holds the most recent blocks, main the next most recent (demotions arrive in
    // recency order), so exclusive LRU tiers hit exactly like one LRU of both sizes.
    for seed in 200..220 {
        let workload = random_workload(seed);
        let curve = LruCurve::compute(&workload);
        for (memory, main) in [(0, 3), (1, 2), (2, 5), (4, 1), (3, 0)] {
            let config = Config {
                policy: PolicyKind::Lru,
                capacity: main,
                memory_capacity: Some(memory),
            };
            let stats = replay(&workload, &config, 1);
            assert_eq!(
                stats.hit_blocks,
                curve.hit_blocks(memory + main),
                "seed {seed}"
            );
            assert!(stats.memory_hit_blocks <= stats.hit_blocks, "seed {seed}");
            if memory == 0 {
                assert_eq!(stats.memory_hit_blocks, 0, "seed {seed}");
            }
        }
    }
}

#[test]
fn leaf_lru_keeps_the_prefix_that_lru_throws_away() {
    // Capacity 2: [a b], [c], [a b]. LRU evicts a (the oldest) for c, leaving b without its
    // prefix: 0 hits. Leaf-LRU may only evict leaves (b, c): it evicts b, keeps a: 1 hit.
    let requests = [
        Request::untimed(&[1, 2], 2),
        Request::untimed(&[3], 1),
        Request::untimed(&[1, 2], 2),
    ];
    let workload = Workload::from_requests(&requests, 1).unwrap();
    let hits = |policy| replay(&workload, &Config::single(policy, 2), 1).hit_blocks;
    assert_eq!(hits(PolicyKind::Lru), 0);
    assert_eq!(hits(PolicyKind::LeafLru), 1);
}

#[test]
fn lfu_evicts_a_resident_block_before_admitting_the_newcomer() {
    // Mooncake trace, one block per request: 1 1 2 2 3 3 3 3, capacity 2. 1 and 2 reach
    // count 2; classic LFU lets 3 evict 1 (least recent of the least frequent), then 3 hits
    // three times: 5 hits of 8.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lfu.jsonl");
    let lines: Vec<String> = [1, 1, 2, 2, 3, 3, 3, 3]
        .iter()
        .enumerate()
        .map(|(i, b)| format!(r#"{{"timestamp": {i}, "input_length": 512, "hash_ids": [{b}]}}"#))
        .collect();
    std::fs::write(&path, lines.join("\n")).unwrap();
    let workload = Workload::load(&[path], None, None).unwrap();
    let stats = replay(&workload, &Config::single(PolicyKind::Lfu, 2), 1);
    assert_eq!((stats.hit_blocks, stats.requested_blocks), (5, 8));
    assert_eq!(stats.block_hit_rate(), 0.625);
}

#[test]
fn fixture_lfu_sweep_matches_an_independent_classic_lfu_replay() {
    let workload = Workload::load(&[fixture()], None, None).unwrap();
    for (percent, rate) in [(5, 0.1051), (20, 0.3271), (60, 0.6195)] {
        let capacity = workload.unique_blocks() * percent / 100;
        let stats = replay(&workload, &Config::single(PolicyKind::Lfu, capacity), 1);
        let got = stats.block_hit_rate();
        assert!((got - rate).abs() <= 0.0005, "{percent}%: {got:.4}");
    }
}

#[test]
fn target_search_survives_beladys_anomaly() {
    // The classic FIFO anomaly trace 1 2 3 4 1 2 5 1 2 3 4 5 (single-block requests): FIFO
    // hits 3 at capacity 3 but only 2 at capacity 4 (and 0 at 2, 7 at 5). A plain binary
    // search for 3 hits probes 2 (no), then 4 (no) and answers 5; the smallest is 3.
    let blocks = [1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5];
    let requests: Vec<Request> = blocks.iter().map(|&b| Request::untimed(&[b], 1)).collect();
    let workload = Workload::from_requests(&requests, 1).unwrap();
    let hits = |c| replay(&workload, &Config::single(PolicyKind::Fifo, c), 1).hit_blocks;
    assert_eq!((hits(2), hits(3), hits(4), hits(5)), (0, 3, 2, 7));
    let curve = LruCurve::compute(&workload);
    let target = 3.0 / 12.0;
    assert_eq!(
        capacity_for_target(&workload, &curve, PolicyKind::Fifo, target),
        Some(3)
    );
}
