//! `kvcm bench`: end-to-end latency and throughput of GetCacheLocation (prefix match of 16
//! and 128 keys) over gRPC and HTTP against an in-process server, each printed beside its
//! floor measured in the same run — a bare tonic service / bare axum route answering the
//! same bytes — plus local index batch get and read_modify_write throughput on one core
//! beside a plain HashMap. The server writes its event log as `kvcm serve` does by default
//! (`KVCM_EVENT_LOG_ENABLED=false` and the other `KVCM_EVENT_LOG_*` variables apply).
//! `kvcm bench --memory` measures memory per SERVING block instead (see `memory`),
//! `kvcm bench --reports` the cache-subscriber RPCs (see `reports`), `kvcm bench --attack`
//! the lookup latency during issue 14's attacks (see `attack`), `kvcm bench --tls` gRPC
//! over TLS beside plaintext (see `tls`), `kvcm bench --reclaim` the reclaimer (see
//! `reclaim`).

mod attack;
mod echo;
mod http_client;
mod index;
mod measure;
mod memory;
mod reclaim;
mod reports;
mod tls;

use std::net::SocketAddr;

use kvcm::config::ServerConfig;
use kvcm::proto::meta;
use kvcm::service::meta::MetaHandler;
use measure::{paired_latency, throughput, Target};

/// Settings of `kvcm bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Timed requests per latency case (after the warm-up).
    #[arg(long, default_value_t = 20_000)]
    pub iterations: usize,
    /// Untimed requests before each case.
    #[arg(long, default_value_t = 2_000)]
    pub warmup: usize,
    /// Requests in flight in the throughput runs.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Keys stored in the local index for its throughput runs.
    #[arg(long, default_value_t = 1_000_000)]
    pub index_keys: usize,
    /// Measure memory per SERVING block of a real `kvcm serve` instead of latency.
    #[arg(long)]
    pub memory: bool,
    /// With `--memory`: SERVING blocks written.
    #[arg(long, default_value_t = 1_000_000)]
    pub blocks: usize,
    /// With `--memory`: spec counts measured, one server each.
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    pub specs: Vec<usize>,
    /// With `--memory`: the `kvcm` binary to measure (default: this one).
    #[arg(long)]
    pub serve_binary: Option<std::path::PathBuf>,
    /// Measure the cache-subscriber RPCs (ReportEvent, GetHostCacheState) instead.
    #[arg(long)]
    pub reports: bool,
    /// Measure GetCacheLocation idle and during each hostile-client attack instead.
    #[arg(long)]
    pub attack: bool,
    /// Measure GetCacheLocation over gRPC with TLS beside plaintext instead.
    #[arg(long)]
    pub tls: bool,
    /// Measure the reclaimer's eviction throughput and GetCacheLocation under reclaim
    /// beside idle instead (`--blocks` SERVING blocks).
    #[arg(long)]
    pub reclaim: bool,
    /// `--reclaim`: blocks one reclaimer pass may evict (the group's `reclaim_step_size`).
    #[arg(long, default_value_t = 16_384)]
    pub reclaim_step: i32,
    /// `--reclaim`: milliseconds between reclaimer passes (`kvcm.cache_reclaimer.period_ms`).
    #[arg(long, default_value_t = 100)]
    pub reclaim_period_ms: u64,
}

const PREFIX_SIZES: [usize; 2] = [16, 128];

/// Runs every case and prints the table.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.reports {
        return reports::run();
    }
    if args.attack {
        return attack::run(&args);
    }
    if args.tls {
        return tls::run(&args);
    }
    if args.reclaim {
        return reclaim::run(&args);
    }
    if args.memory {
        let serve_binary = match args.serve_binary {
            Some(binary) => binary,
            None => std::env::current_exe()?,
        };
        return memory::run(&memory::MemoryArgs {
            blocks: args.blocks,
            spec_counts: args.specs,
            serve_binary,
        });
    }
    let (server_runtime, client_runtime) = runtimes()?;
    let data_dir = std::env::temp_dir().join(format!("kvcm-bench-{}", std::process::id()));
    let config = bench_config(&data_dir)?;
    let events = kvcm::events::EventLog::from_config(&config)?;
    let access = kvcm::access_log::AccessLog::from_config(&config)?;
    let curves = kvcm::curves::LiveCurves::new(config.capacity_curve_window_accesses);
    let logs = kvcm::service::LogSinks {
        events: events.sink(),
        access: access.sink(),
        curves: std::sync::Arc::new(curves),
    };
    let (grpc, http, echo_grpc, echo_http) = server_runtime.block_on(async {
        let (grpc, http, answers) = start_seeded(&config, logs).await?;
        let echo_http = echo::spawn_http_echo(answers.clone()).await?;
        let echo_grpc = echo::spawn_grpc_echo(echo::EchoMeta { answers }).await?;
        anyhow::Ok((grpc, http, echo_grpc, echo_http))
    })?;
    let local = |a: SocketAddr| SocketAddr::from(([127, 0, 0, 1], a.port()));
    println!("case                         p50 µs   p99 µs      req/s   p50 / floor");
    client_runtime.block_on(async {
        for size in PREFIX_SIZES {
            let targets = [
                ("grpc echo (floor)", Target::grpc(local(echo_grpc)).await?),
                ("grpc prefix", Target::grpc(local(grpc)).await?),
            ];
            compare(&args, size, &targets).await?;
        }
        for size in PREFIX_SIZES {
            let targets = [
                (
                    "http echo (floor)",
                    Target::http(local(echo_http), &format!("/echo/{size}")).await?,
                ),
                (
                    "http json echo",
                    Target::http(local(echo_http), &format!("/json-echo/{size}")).await?,
                ),
                (
                    "http prefix",
                    Target::http(local(http), "/api/getCacheLocation").await?,
                ),
            ];
            compare(&args, size, &targets).await?;
        }
        anyhow::Ok(())
    })?;
    let (sink, access_sink) = (events.sink(), access.sink());
    events.close()?;
    access.close()?;
    println!(
        "event log: {} events dropped; access log: {} lines dropped",
        sink.dropped(),
        access_sink.dropped()
    );
    index::run(args.index_keys);
    let _ = std::fs::remove_dir_all(&data_dir);
    Ok(())
}

/// The server's runtime (two workers) and the measuring client's (one thread).
fn runtimes() -> anyhow::Result<(tokio::runtime::Runtime, tokio::runtime::Runtime)> {
    let server = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let client = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    Ok((server, client))
}

/// The server's configuration: `kvcm serve`'s defaults on OS-chosen ports, data in
/// `data_dir`. `KVCM_EVENT_LOG_ENABLED=false` / `KVCM_ACCESS_LOG_ENABLED=false` /
/// `KVCM_AUDIT_LOG_ENABLED=false` measure the server without that log,
/// `KVCM_JOURNAL_FSYNC=never` (or `KVCM_JOURNAL_ENABLED=false`) with a lighter journal,
/// `KVCM_CACHE_RECLAIMER_POLICY=sieve` (or `s3fifo`) with that reclaimer.
fn bench_config(data_dir: &std::path::Path) -> anyhow::Result<ServerConfig> {
    let mut config = ServerConfig {
        rpc_port: 0,
        http_port: 0,
        admin_http_port: 0,
        data_dir: data_dir.to_path_buf(),
        ..ServerConfig::default()
    };
    let keys = kvcm::config::EVENT_LOG_KEYS
        .iter()
        .chain(&kvcm::config::ACCESS_LOG_KEYS)
        .chain(&kvcm::config::AUDIT_LOG_KEYS)
        .chain(&kvcm::config::RECLAIMER_KEYS)
        .chain(&kvcm::config::JOURNAL_KEYS);
    for key in keys {
        if let Ok(value) = std::env::var(kvcm::config::env_name(key)) {
            config.set(key, &value)?;
        }
    }
    config.validate()?;
    Ok(config)
}

/// Starts the server (on the calling runtime; it serves until the process exits) and seeds
/// instance `bench`; returns its gRPC and meta HTTP addresses and the real prefix answers.
async fn start_seeded(
    config: &ServerConfig,
    logs: kvcm::service::LogSinks,
) -> anyhow::Result<(
    SocketAddr,
    SocketAddr,
    Vec<(usize, meta::GetCacheLocationResponse)>,
)> {
    let manager = kvcm::server::embedded_manager(config)?;
    let handlers = kvcm::service::Handlers::with_logs(manager, None, logs, config.security.limits);
    let server = kvcm::server::start(config, handlers).await?;
    let answers = seed(&server.handlers.meta)?;
    let (grpc, http) = (server.addresses["grpc"], server.addresses["http"]);
    std::mem::forget(server); // serves until the process exits
    Ok((grpc, http, answers))
}

/// Measures the targets of one comparison (the first is the floor) and prints them.
async fn compare(args: &BenchArgs, size: usize, targets: &[(&str, Target)]) -> anyhow::Result<()> {
    let request = prefix_request(size);
    let only_targets: Vec<&Target> = targets.iter().map(|(_, t)| t).collect();
    let mut figures = paired_latency(args, &only_targets, &request).await?;
    for (figure, target) in figures.iter_mut().zip(&only_targets) {
        figure.per_second = throughput(args, target, &request).await?;
    }
    let floor = figures[0];
    for ((name, _), figure) in targets.iter().zip(&figures) {
        println!(
            "{:<26} {:>8.1} {:>8.1} {:>10.0}   {:>5.2}x",
            format!("{name} {size}"),
            figure.p50_us,
            figure.p99_us,
            figure.per_second,
            figure.p50_us / floor.p50_us
        );
    }
    Ok(())
}

/// Registers instance `bench` and commits keys 1..=128; returns the real prefix answers.
fn seed(
    meta_handler: &MetaHandler,
) -> anyhow::Result<Vec<(usize, meta::GetCacheLocationResponse)>> {
    let registered =
        meta_handler.register_instance(registration(kvcm::server::DEFAULT_GROUP, "bench"));
    anyhow::ensure!(ok(&registered.header), "register: {:?}", registered.header);
    let started = meta_handler.start_write_cache(meta::StartWriteCacheRequest {
        instance_id: "bench".into(),
        block_keys: (1..=128).collect(),
        write_timeout_seconds: 60,
        ..Default::default()
    });
    let finished = meta_handler.finish_write_cache(meta::FinishWriteCacheRequest {
        instance_id: "bench".into(),
        write_session_id: started.write_session_id,
        success_blocks: Some(meta::BlockMask {
            info: Some(meta::block_mask::Info::Offset(128)),
        }),
        ..Default::default()
    });
    anyhow::ensure!(ok(&finished.header), "finish: {:?}", finished.header);
    Ok(PREFIX_SIZES
        .iter()
        .map(|&size| (size, meta_handler.get_cache_location(prefix_request(size))))
        .collect())
}

/// The registration of a bench instance: block size 16, one spec `tp0` of 64 KiB.
fn registration(group: &str, instance_id: &str) -> meta::RegisterInstanceRequest {
    meta::RegisterInstanceRequest {
        instance_group: group.into(),
        instance_id: instance_id.into(),
        block_size: 16,
        location_spec_infos: vec![meta::LocationSpecInfo {
            name: "tp0".into(),
            size: 65536,
        }],
        model_deployment: Some(meta::ModelDeployment {
            model_name: "bench".into(),
            dtype: "fp8".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn ok(header: &Option<meta::CommonResponseHeader>) -> bool {
    header
        .as_ref()
        .and_then(|h| h.status.as_ref())
        .is_some_and(|s| s.code == meta::ErrorCode::Ok as i32)
}

fn prefix_request(size: usize) -> meta::GetCacheLocationRequest {
    meta::GetCacheLocationRequest {
        trace_id: "bench".into(),
        instance_id: "bench".into(),
        query_type: meta::QueryType::QtPrefixMatch as i32,
        block_keys: (1..=size as i64).collect(),
        ..Default::default()
    }
}
