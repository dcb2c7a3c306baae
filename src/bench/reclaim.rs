//! `kvcm bench --reclaim`: the reclaimer's eviction throughput, and GetCacheLocation
//! prefix-16 over gRPC while it evicts beside idle (issue 11's benchmark).
//!
//! One in-process server (the embedded default, journal and logs as configured, reclaimer
//! period `--reclaim-period-ms`, default 100); instance `bench` of group `default` holds
//! `--blocks` SERVING blocks (default 1 M) under `max_key_count` = that many, delete delay 0
//! and `--reclaim-step` blocks per pass (default 16,384). Each round alternates two blocks
//! of lookups on one gRPC connection: idle (watermark 1.0, nothing to evict), then under
//! reclaim (the watermark lowered to [`LOWERED`]: lookups until 20% of the blocks are
//! evicted, or [`IDLE_LOOKUPS`] of them when the reclaimer is paced slower than that);
//! then the evicted keys are written again (not measured). The floor is a bare tonic echo
//! of the same answer, measured in the same run. The lookups stamp keys 1..=16, so the
//! sampled LRU keeps them: every lookup answers the same 16 blocks.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use kvcm::proto::{admin, meta};
use kvcm::service::Handlers;
use kvcm_manager::Manager;

use super::measure::Target;
use super::{bench_config, echo, ok, prefix_request, registration, runtimes, BenchArgs};

/// The lowered watermark.
const LOWERED: f64 = 0.8;
/// Rounds (idle block, reclaim block).
const ROUNDS: usize = 3;
/// Keys per StartWriteCache while filling.
const WRITE_BATCH: usize = 4096;
/// Lookups of the idle block.
const IDLE_LOOKUPS: usize = 20_000;
/// Prefix length of the lookups.
const PREFIX: usize = 16;
/// How long evictions and deletions may take before the benchmark fails.
const GIVE_UP: Duration = Duration::from_secs(120);

/// What one round measured.
struct Round {
    idle: Histogram<u64>,
    reclaiming: Histogram<u64>,
    evicted: u64,
    /// From the lowered watermark to the last eviction.
    eviction_time: Duration,
    /// The reclaimer's own time in its passes meanwhile.
    busy: Duration,
}

/// Runs the rounds and prints the table.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let (server_runtime, client_runtime) = runtimes()?;
    let data_dir = std::env::temp_dir().join(format!("kvcm-bench-reclaim-{}", std::process::id()));
    let outcome = measure(args, &server_runtime, &client_runtime, &data_dir);
    let _ = std::fs::remove_dir_all(&data_dir);
    outcome
}

fn measure(
    args: &BenchArgs,
    server_runtime: &tokio::runtime::Runtime,
    client_runtime: &tokio::runtime::Runtime,
    data_dir: &std::path::Path,
) -> anyhow::Result<()> {
    let mut config = bench_config(data_dir)?;
    let period = args.reclaim_period_ms.to_string();
    config.set("kvcm.cache_reclaimer.period_ms", &period)?;
    let blocks = args.blocks;
    let manager = kvcm::server::embedded_manager(&config)?;
    let handlers = Handlers::new(manager.clone(), None);
    let (grpc, echo_grpc, handlers) = server_runtime.block_on(async {
        let server = kvcm::server::start(&config, handlers).await?;
        let handlers = server.handlers.clone();
        let grpc = server.addresses["grpc"];
        std::mem::forget(server); // serves until the process exits
        let registered = handlers
            .meta
            .register_instance(registration(kvcm::server::DEFAULT_GROUP, "bench"));
        anyhow::ensure!(ok(&registered.header), "register: {:?}", registered.header);
        set_capacity(&handlers, blocks, 1.0, args.reclaim_step)?;
        let started = Instant::now();
        fill(&handlers, blocks)?;
        println!(
            "filled {blocks} blocks in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        let answer = handlers.meta.get_cache_location(prefix_request(PREFIX));
        let echo = echo::spawn_grpc_echo(echo::EchoMeta {
            answers: vec![(PREFIX, answer)],
        })
        .await?;
        // The server and the echo serve on this runtime until the process exits.
        anyhow::Ok((grpc, echo, handlers))
    })?;
    let local = |a: SocketAddr| SocketAddr::from(([127, 0, 0, 1], a.port()));
    let request = prefix_request(PREFIX);
    let mut rounds = Vec::new();
    let floor = client_runtime.block_on(async {
        let (target, floor) = (
            Target::grpc(local(grpc)).await?,
            Target::grpc(local(echo_grpc)).await?,
        );
        let body = serde_json::to_vec(&request)?;
        for _ in 0..args.warmup {
            target.call(&request, &body).await?;
            floor.call(&request, &body).await?;
        }
        let mut floor_histogram = Histogram::<u64>::new(3)?;
        for round in 0..ROUNDS {
            let idle = lookups(&target, &request, IDLE_LOOKUPS, || false).await?;
            record(&floor, &request, IDLE_LOOKUPS / 4, &mut floor_histogram).await?;
            let reclaimed = reclaim_block(&manager, &handlers, &target, &request, args).await?;
            println!(
                "round {}: evicted {} blocks in {:.2} s ({:.2} s in passes) under {} lookups",
                round + 1,
                reclaimed.evicted,
                reclaimed.eviction_time.as_secs_f64(),
                reclaimed.busy.as_secs_f64(),
                reclaimed.reclaiming.len()
            );
            let evicted = reclaimed.evicted as usize;
            rounds.push(Round { idle, ..reclaimed });
            set_capacity(&handlers, blocks, 1.0, args.reclaim_step)?;
            deleted(&manager, blocks.saturating_sub(evicted)).await?;
            fill(&handlers, blocks)?;
        }
        anyhow::Ok(floor_histogram)
    })?;
    report(&rounds, &floor);
    Ok(())
}

/// One reclaim block: lowers the watermark, measures lookups until the evictions are done
/// (or [`IDLE_LOOKUPS`] of them, when the reclaimer is paced slower than the lookups).
async fn reclaim_block(
    manager: &Arc<Manager>,
    handlers: &Handlers,
    target: &Target,
    request: &meta::GetCacheLocationRequest,
    args: &BenchArgs,
) -> anyhow::Result<Round> {
    let stats = manager.reclaim_stats();
    let (before, busy_before) = (stats.evicted(), stats.busy_us());
    let wanted = reclaimed_count(args.blocks) as u64;
    let started = Instant::now();
    set_capacity(handlers, args.blocks, LOWERED, args.reclaim_step)?;
    let done = || stats.evicted() - before >= wanted;
    let reclaiming = lookups(target, request, IDLE_LOOKUPS, done).await?;
    let (evicted, eviction_time) = (stats.evicted() - before, started.elapsed());
    anyhow::ensure!(
        evicted > 0,
        "the reclaimer evicted nothing during {IDLE_LOOKUPS} lookups"
    );
    // The pass that made the last eviction adds its time when it ends.
    let passes = stats.passes();
    while stats.passes() == passes {
        anyhow::ensure!(started.elapsed() < GIVE_UP, "a reclaimer pass never ended");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(Round {
        idle: Histogram::new(3)?,
        reclaiming,
        evicted,
        eviction_time,
        busy: Duration::from_micros(stats.busy_us() - busy_before),
    })
}

/// Blocks a lowered watermark evicts.
fn reclaimed_count(blocks: usize) -> usize {
    blocks - (blocks as f64 * LOWERED) as usize
}

/// Waits until the deleter left `keys` keys in `bench`.
async fn deleted(manager: &Manager, keys: usize) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let held = manager
            .capacity_report()
            .into_iter()
            .flat_map(|group| group.instances)
            .find(|i| &*i.instance_id == "bench")
            .map_or(0, |i| i.keys);
        if held as usize <= keys {
            return Ok(());
        }
        anyhow::ensure!(started.elapsed() < GIVE_UP, "{held} keys left, not {keys}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Times up to `count` lookups, stopping early once `stop` says so (each answer must hold
/// the whole prefix).
async fn lookups(
    target: &Target,
    request: &meta::GetCacheLocationRequest,
    count: usize,
    stop: impl Fn() -> bool,
) -> anyhow::Result<Histogram<u64>> {
    let mut histogram = Histogram::<u64>::new(3)?;
    let body = serde_json::to_vec(request)?;
    for _ in 0..count {
        if stop() {
            break;
        }
        let started = Instant::now();
        target.call(request, &body).await?;
        histogram.record(started.elapsed().as_nanos() as u64)?;
    }
    Ok(histogram)
}

/// Times `count` calls of `target` into `histogram`.
async fn record(
    target: &Target,
    request: &meta::GetCacheLocationRequest,
    count: usize,
    histogram: &mut Histogram<u64>,
) -> anyhow::Result<()> {
    let body = serde_json::to_vec(request)?;
    for _ in 0..count {
        let started = Instant::now();
        target.call(request, &body).await?;
        histogram.record(started.elapsed().as_nanos() as u64)?;
    }
    Ok(())
}

/// Sets group `default`'s key cap, watermark, step and delete delay.
fn set_capacity(
    handlers: &Handlers,
    max_keys: usize,
    watermark: f64,
    step: i32,
) -> anyhow::Result<()> {
    let answer = handlers
        .admin
        .get_instance_group(admin::GetInstanceGroupRequest {
            name: kvcm::server::DEFAULT_GROUP.into(),
            ..Default::default()
        });
    let mut group = answer
        .instance_group
        .ok_or_else(|| anyhow::anyhow!("no group: {:?}", answer.header))?;
    let cache = group.cache_config.get_or_insert_with(Default::default);
    let indexer = cache
        .meta_indexer_config
        .get_or_insert_with(Default::default);
    indexer.max_key_count = max_keys as i64;
    let reclaim = cache.reclaim_strategy.get_or_insert_with(Default::default);
    reclaim.trigger_strategy = Some(admin::TriggerStrategy {
        used_size: 0,
        used_percentage: watermark,
    });
    reclaim.reclaim_step_size = step;
    reclaim.delay_before_delete_ms = 0;
    let current_version = group.version;
    group.version += 1;
    let updated = handlers
        .admin
        .update_instance_group(admin::UpdateInstanceGroupRequest {
            instance_group: Some(group),
            current_version,
            ..Default::default()
        });
    let code = updated.header.as_ref().and_then(|h| h.status.as_ref());
    anyhow::ensure!(
        code.is_some_and(|s| s.code == admin::ErrorCode::Ok as i32),
        "update group: {:?}",
        updated.header
    );
    Ok(())
}

/// Writes keys 1..=`blocks` of `bench` that it does not hold (two-phase, committed).
fn fill(handlers: &Handlers, blocks: usize) -> anyhow::Result<()> {
    let keys: Vec<i64> = (1..=blocks as i64).collect();
    for batch in keys.chunks(WRITE_BATCH) {
        let started = handlers
            .meta
            .start_write_cache(meta::StartWriteCacheRequest {
                instance_id: "bench".into(),
                block_keys: batch.to_vec(),
                write_timeout_seconds: 60,
                ..Default::default()
            });
        anyhow::ensure!(ok(&started.header), "start: {:?}", started.header);
        if started.locations.is_empty() {
            continue; // every key of the batch is held
        }
        let finished = handlers
            .meta
            .finish_write_cache(meta::FinishWriteCacheRequest {
                instance_id: "bench".into(),
                write_session_id: started.write_session_id,
                success_blocks: Some(meta::BlockMask {
                    info: Some(meta::block_mask::Info::Offset(
                        started.locations.len() as i32
                    )),
                }),
                ..Default::default()
            });
        anyhow::ensure!(ok(&finished.header), "finish: {:?}", finished.header);
    }
    Ok(())
}

/// Prints each round and the medians.
fn report(rounds: &[Round], floor: &Histogram<u64>) {
    let us = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    let floor_p50 = us(floor, 0.5);
    println!(
        "grpc echo (floor) prefix-{PREFIX}: p50 {floor_p50:.1} µs, p99 {:.1} µs",
        us(floor, 0.99)
    );
    println!(
        "round  idle p50/p99 µs   reclaim p50/p99 µs   p99 ratio   evicted/s wall   evicted/s busy"
    );
    let (mut ratios, mut rates, mut busy_rates, mut idle_p50) = (vec![], vec![], vec![], vec![]);
    for (i, round) in rounds.iter().enumerate() {
        let ratio = us(&round.reclaiming, 0.99) / us(&round.idle, 0.99);
        let rate = round.evicted as f64 / round.eviction_time.as_secs_f64();
        let busy_rate = round.evicted as f64 / round.busy.as_secs_f64().max(1e-9);
        println!(
            "{:>5}  {:>7.1} / {:>7.1}   {:>8.1} / {:>8.1}   {:>8.2}x   {:>14.0}   {:>14.0}",
            i + 1,
            us(&round.idle, 0.5),
            us(&round.idle, 0.99),
            us(&round.reclaiming, 0.5),
            us(&round.reclaiming, 0.99),
            ratio,
            rate,
            busy_rate
        );
        ratios.push(ratio);
        rates.push(rate);
        busy_rates.push(busy_rate);
        idle_p50.push(us(&round.idle, 0.5));
    }
    println!(
        "median: p99 under reclaim / idle {:.2}x (target ≤ 1.5x); eviction {:.0} blocks/s wall, {:.0} blocks/s of pass time; idle p50 / floor {:.2}x",
        median(&mut ratios),
        median(&mut rates),
        median(&mut busy_rates),
        median(&mut idle_p50) / floor_p50
    );
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
