//! The fast path answers exactly as GetCacheLocation over gRPC: a randomized workload
//! against a real `kvcm serve` (writes with and without spec groups, failed and abandoned
//! writes, removals, trims, table growth, a storage disabled and re-enabled, every storage
//! disabled, the reclaimer evicting half the keys), with random queries of all three types
//! after every step, on both soft wires and, where a device exists, on verbs;
//! and keys with a replica on each storage (`min_replica_count`), whose readable set the
//! fast path must draw from exactly as gRPC does; and keys cache subscribers report
//! (ReportEvent), which the fast path leaves to the server.

mod common;
mod lookup_common;

use common::TestServer;
use kvcm::proto::meta;
use kvcm_client::{Client, Wire};
use lookup_common::*;

/// Keys the workload draws from (enough to grow the table past its first generation).
const UNIVERSE: i64 = 400;
/// Workload steps.
const STEPS: usize = 120;
/// Queries compared after each step.
const QUERIES: usize = 6;

/// A non-empty list of distinct keys.
fn random_keys(rng: &mut fastrand::Rng, max: usize) -> Vec<i64> {
    let count = rng.usize(1..=max);
    let start = rng.i64(0..UNIVERSE);
    let mut keys: Vec<i64> = match rng.u8(0..3) {
        // A run of consecutive keys (prefixes hit), random keys, or a run with holes.
        0 => (start..start + count as i64).collect(),
        1 => (0..count).map(|_| rng.i64(0..UNIVERSE)).collect(),
        _ => (start..start + count as i64)
            .filter(|k| k % 7 != 3)
            .collect(),
    };
    let mut seen = std::collections::HashSet::new();
    keys.retain(|k| seen.insert(*k));
    if keys.is_empty() {
        keys.push(start);
    }
    keys
}

fn random_query(rng: &mut fastrand::Rng) -> meta::GetCacheLocationRequest {
    let keys = random_keys(rng, 40);
    let query_type = rng.i32(1..=3);
    let sw_size = rng.i32(0..=keys.len() as i32 + 1);
    let block_mask = match rng.u8(0..4) {
        0 => None,
        1 => Some(meta::BlockMask {
            info: Some(meta::block_mask::Info::Offset(rng.i32(0..4))),
        }),
        2 => Some(meta::BlockMask {
            info: Some(meta::block_mask::Info::BoolMasks(meta::BoolMasksType {
                values: (0..rng.usize(0..8)).map(|_| rng.bool()).collect(),
            })),
        }),
        _ => Some(meta::BlockMask::default()),
    };
    let location_spec_names = match rng.u8(0..4) {
        0 => vec!["tp1".to_string()],
        1 => vec!["tp0".to_string(), "nope".to_string()],
        _ => Vec::new(),
    };
    meta::GetCacheLocationRequest {
        trace_id: "eq".into(),
        instance_id: INSTANCE.into(),
        query_type,
        block_keys: keys,
        token_ids: Vec::new(),
        block_mask,
        sw_size,
        location_spec_names,
    }
}

/// The gRPC answer: locations, or the error code.
async fn grpc_answer(
    server: &TestServer,
    request: meta::GetCacheLocationRequest,
) -> Result<Vec<meta::CacheLocation>, i32> {
    let mut grpc = server.meta().await;
    let answer = grpc
        .get_cache_location(request)
        .await
        .expect("grpc")
        .into_inner();
    let code = answer.header.and_then(|h| h.status).map_or(0, |s| s.code);
    if code == meta::ErrorCode::Ok as i32 {
        Ok(answer.locations)
    } else {
        Err(code)
    }
}

fn fast_answer(
    client: &Client,
    request: &meta::GetCacheLocationRequest,
) -> Result<Vec<meta::CacheLocation>, i32> {
    client
        .get_cache_location(request.clone())
        .map_err(|error| match error {
            kvcm_client::ClientError::Server { code, .. } => code,
            other => panic!("client failed: {other}"),
        })
}

/// The fast answer written into `reused`, a vector kept across queries (so a stale
/// location, spec or string left from an earlier answer would show).
fn fast_answer_into(
    client: &Client,
    request: &meta::GetCacheLocationRequest,
    reused: &mut Vec<meta::CacheLocation>,
) -> Result<Vec<meta::CacheLocation>, i32> {
    match client.get_cache_location_into(request, reused) {
        Ok(()) => Ok(reused.clone()),
        Err(kvcm_client::ClientError::Server { code, .. }) => Err(code),
        Err(other) => panic!("client failed: {other}"),
    }
}

/// One workload step.
async fn step(server: &TestServer, rng: &mut fastrand::Rng, disabled: &mut [bool; 2]) {
    let writable = disabled.contains(&false);
    match rng.u8(0..100) {
        0..=44 if writable => {
            let keys = random_keys(rng, 24);
            let groups: Vec<&str> = if rng.bool() {
                keys.iter()
                    .map(|_| if rng.bool() { "only_tp1" } else { "" })
                    .collect()
            } else {
                Vec::new()
            };
            // An empty group name is not a group: use the spec group for all or none.
            let groups: Vec<&str> = if groups.iter().any(|g| g.is_empty()) {
                Vec::new()
            } else {
                groups
            };
            let started = start(server, &keys, &groups, 30).await;
            let locations = started["locations"].as_array().cloned().unwrap_or_default();
            let successes = locations.iter().map(|_| rng.u8(0..10) != 0).collect();
            // Some writers give checksums (those keys are asked of the server).
            let checksums = if rng.u8(0..4) == 0 {
                with_checksums(&locations, rng)
            } else {
                serde_json::Value::Null
            };
            finish_checksummed(server, &started["write_session_id"], successes, checksums).await;
        }
        45..=54 if writable => {
            // Abandoned writes stay WRITING (invisible), then expire.
            let keys = random_keys(rng, 8);
            start(server, &keys, &[], rng.i64(0..3)).await;
        }
        0..=79 => remove(server, &random_keys(rng, 16)).await,
        80..=81 => {
            let answer = server
                .meta_http(
                    "trimCache",
                    serde_json::json!({"instance_id": INSTANCE, "strategy": "TS_REMOVE_ALL_CACHE"}),
                )
                .await;
            assert_eq!(common::code(&answer), "OK", "{answer}");
        }
        _ => {
            let which = rng.usize(0..2);
            disabled[which] = !disabled[which];
            set_available(server, STORAGES[which], !disabled[which]).await;
        }
    }
}

/// StartWriteCache's `locations` with a random checksum on every part.
fn with_checksums(locations: &[serde_json::Value], rng: &mut fastrand::Rng) -> serde_json::Value {
    let mut locations = locations.to_vec();
    for location in &mut locations {
        for spec in location["location_specs"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            spec["checksum"] = serde_json::json!(rng.u64(..).to_string());
        }
    }
    serde_json::Value::Array(locations)
}

/// Writes every key of the universe with both storages enabled (those not cached yet get
/// locations): more keys than the first generation's 64 buckets × 3 slots hold, so the
/// table grows whatever the hash seed and the random steps before did.
async fn grow(server: &TestServer, disabled: &mut [bool; 2]) {
    for (which, storage) in STORAGES.iter().enumerate() {
        if disabled[which] {
            disabled[which] = false;
            set_available(server, storage, true).await;
        }
    }
    let keys: Vec<i64> = (0..UNIVERSE).collect();
    let started = start(server, &keys, &[], 30).await;
    let count = started["locations"].as_array().map_or(0, Vec::len);
    finish(server, &started["write_session_id"], vec![true; count]).await;
}

/// Lets the reclaimer evict down to half the universe (a key cap of [`UNIVERSE`] under a
/// watermark of 0.5), waits until it has, then stops it again.
async fn reclaim_half(server: &TestServer) {
    let set = |cap: i64, watermark: f64| {
        common::update_group(server, GROUP, move |group| {
            let cache = &mut group["cache_config"];
            cache["meta_indexer_config"]["max_key_count"] = serde_json::json!(cap);
            cache["reclaim_strategy"]["trigger_strategy"] =
                serde_json::json!({ "used_percentage": watermark });
        })
    };
    set(UNIVERSE, 0.5).await;
    let evicted = common::wait_until(std::time::Duration::from_secs(20), async || {
        let metrics = server.admin_http("getMetrics", serde_json::json!({})).await;
        let keys = metrics["metrics"]
            .as_array()?
            .iter()
            .find(|m| m["metric_name"] == "capacity.instance_keys")?["metric_value"]["float_value"]
            .as_f64()?;
        (keys <= (UNIVERSE / 2) as f64).then_some(())
    })
    .await;
    assert!(evicted.is_some(), "the reclaimer evicted down to half");
    set(0, 1.0).await;
}

fn equivalence_on(wire: Wire, seed: u64, settings: &[&str]) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let server = runtime.block_on(async {
        let mut all = vec!["kvcm.cache_reclaimer.period_ms=20"];
        all.extend_from_slice(settings);
        let server = TestServer::start_with(&all).await;
        prepare(&server).await;
        server
    });
    let client = client(&server, wire);
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut disabled = [false; 2];
    let mut compared = 0;
    let mut with_uris = 0;
    let mut with_sums = 0;
    let mut reused = Vec::new();
    for step_number in 0..STEPS {
        if step_number == STEPS / 2 {
            runtime.block_on(grow(&server, &mut disabled));
        }
        if step_number == STEPS / 2 + 1 {
            runtime.block_on(reclaim_half(&server));
        }
        runtime.block_on(step(&server, &mut rng, &mut disabled));
        for _ in 0..QUERIES {
            let request = random_query(&mut rng);
            let fast = fast_answer(&client, &request);
            let into = fast_answer_into(&client, &request, &mut reused);
            let slow = runtime.block_on(grpc_answer(&server, request.clone()));
            assert_eq!(fast, slow, "step {step_number}, seed {seed}, {request:?}");
            assert_eq!(
                into, slow,
                "into, step {step_number}, seed {seed}, {request:?}"
            );
            compared += 1;
            let uri = |l: &meta::CacheLocation| l.location_specs.iter().any(|s| !s.uri.is_empty());
            let sum =
                |l: &meta::CacheLocation| l.location_specs.iter().any(|s| s.checksum.is_some());
            with_sums += usize::from(
                slow.as_ref()
                    .is_ok_and(|locations| locations.iter().any(sum)),
            );
            with_uris += usize::from(slow.is_ok_and(|locations| locations.iter().any(uri)));
        }
    }
    let metrics = client.metrics();
    eprintln!("{wire:?}: {compared} queries compared ({with_uris} with hits, {with_sums} with checksums); fast-path metrics {metrics:?}");
    assert!(with_sums > 0, "some answers carried checksums");
    assert!(
        with_uris > compared / 8,
        "too few answers had hits: {with_uris} of {compared}"
    );
    assert!(
        metrics.hits > compared as u64 / 2,
        "the fast path answered most queries: {metrics:?}"
    );
    assert!(
        client.table_epoch().is_some_and(|epoch| epoch > 1),
        "the table grew at least once"
    );
}

#[test]
fn fast_path_answers_equal_grpc_on_soft_tcp() {
    equivalence_on(Wire::Tcp, 0x5eed_0001, &[]);
}

#[test]
fn fast_path_answers_equal_grpc_on_soft_shm() {
    equivalence_on(Wire::Shm, 0x5eed_0002, &[]);
}

/// The same workload on real verbs: the server also serves its tables on the RDMA device
/// `KVCM_VERBS_DEVICE` (GID index `KVCM_VERBS_GID_INDEX`) and the client reads them there.
/// Needs a build with feature `rdma` and a device (`.ci/rxe-verbs` runs it on kernel
/// soft-RoCE in a VM); without either it says loudly that it skipped, and a named device
/// that does not open fails it.
#[test]
fn fast_path_answers_equal_grpc_on_verbs_or_loud_skip() {
    let Some(settings) = common::verbs_settings("the fast path on verbs") else {
        return;
    };
    let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
    equivalence_on(Wire::Verbs, 0x5eed_0003, &settings);
}

/// The URIs of each answered location (one string per location, its parts joined).
fn answer_uris(answer: &[meta::CacheLocation]) -> Vec<String> {
    answer
        .iter()
        .map(|l| {
            let uris: Vec<&str> = l.location_specs.iter().map(|s| s.uri.as_str()).collect();
            uris.join(" ")
        })
        .collect()
}

/// Keys with a replica on each storage: over repeated batch gets the fast path draws from
/// the same set of readable locations as gRPC (both replicas while both storages serve,
/// only the enabled one's while the other is disabled).
fn replicas_on(wire: Wire) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let server = runtime.block_on(async {
        let server = TestServer::start().await;
        prepare(&server).await;
        server
    });
    let keys: Vec<i64> = (1..=8).collect();
    for _ in 0..2 {
        let body = serde_json::json!({"instance_id": INSTANCE, "block_keys": keys,
            "write_timeout_seconds": 30, "min_replica_count": 2});
        let started = runtime.block_on(server.meta_http("startWriteCache", body));
        let count = started["locations"].as_array().map_or(0, Vec::len);
        assert_eq!(count, keys.len(), "a replica per key: {started}");
        runtime.block_on(finish(
            &server,
            &started["write_session_id"],
            vec![true; count],
        ));
    }
    let client = client(&server, wire);
    let request = meta::GetCacheLocationRequest {
        instance_id: INSTANCE.into(),
        query_type: meta::QueryType::QtBatchGet as i32,
        block_keys: keys.clone(),
        ..Default::default()
    };
    for disabled in [None, Some(STORAGES[0])] {
        if let Some(storage) = disabled {
            runtime.block_on(set_available(&server, storage, false));
        }
        let mut seen_fast = vec![std::collections::BTreeSet::new(); keys.len()];
        let mut seen_grpc = seen_fast.clone();
        for _ in 0..40 {
            let fast = fast_answer(&client, &request).expect("fast answer");
            let slow = runtime
                .block_on(grpc_answer(&server, request.clone()))
                .expect("grpc answer");
            for (i, uri) in answer_uris(&fast).into_iter().enumerate() {
                seen_fast[i].insert(uri);
            }
            for (i, uri) in answer_uris(&slow).into_iter().enumerate() {
                seen_grpc[i].insert(uri);
            }
        }
        let replicas = if disabled.is_some() { 1 } else { 2 };
        for (key, (fast, slow)) in keys.iter().zip(seen_fast.iter().zip(&seen_grpc)) {
            assert_eq!(fast, slow, "key {key} on {wire:?}, {disabled:?} disabled");
            assert_eq!(fast.len(), replicas, "key {key}: {fast:?}");
            if let Some(storage) = disabled {
                assert!(fast.iter().all(|uri| !uri.contains(storage)), "{fast:?}");
            }
        }
    }
    assert!(client.metrics().hits > 0, "the fast path answered");
}

#[test]
fn replicated_keys_answer_the_same_readable_set_on_soft_tcp() {
    replicas_on(Wire::Tcp);
}

#[test]
fn replicated_keys_answer_the_same_readable_set_on_soft_shm() {
    replicas_on(Wire::Shm);
}

/// Keys kvcm stores (the lower half of the universe) and keys a subscriber reports (the
/// upper half): each key has one candidate, so every answer is determined.
fn reported_on(wire: Wire) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let server = runtime.block_on(async {
        let server = TestServer::start().await;
        prepare(&server).await;
        add_reporting(&server).await;
        let own: Vec<i64> = (0..UNIVERSE / 2).collect();
        let started = start(&server, &own, &[], 30).await;
        finish(&server, &started["write_session_id"], vec![true; own.len()]).await;
        server
    });
    let client = client(&server, wire);
    let mut rng = fastrand::Rng::with_seed(7);
    let mut compare = |queries: usize| {
        for _ in 0..queries {
            let request = random_query(&mut rng);
            let fast = fast_answer(&client, &request);
            let slow = runtime.block_on(grpc_answer(&server, request.clone()));
            assert_eq!(fast, slow, "{wire:?}, {request:?}");
        }
    };
    compare(20);
    let before = client.metrics();
    // (A query the server refuses, as a bad `sw_size`, is asked of it.)
    assert!(before.hits >= 10, "the fast path answered: {before:?}");
    let reported: Vec<i64> = (UNIVERSE / 2..UNIVERSE).collect();
    runtime.block_on(report_keys(&server, "sub:1", &reported));
    compare(60);
    let after = client.metrics();
    assert_eq!(
        (after.hits, after.fallbacks - before.fallbacks),
        (before.hits, 60),
        "the server answered every query once reports arrived: {after:?}"
    );
    let all: Vec<i64> = (0..UNIVERSE).collect();
    let found = client.prefix_match(&all).expect("prefix match");
    assert_eq!(found.len(), UNIVERSE as usize, "own and reported keys");
    let last = &found[UNIVERSE as usize - 1];
    assert_eq!(last.r#type, meta::StorageType::StEventReportL1p5 as i32);
}

#[test]
fn reported_keys_are_answered_as_grpc_answers_them_on_soft_tcp() {
    reported_on(Wire::Tcp);
}

#[test]
fn reported_keys_are_answered_as_grpc_answers_them_on_soft_shm() {
    reported_on(Wire::Shm);
}
