//! `kvcm bench`: end-to-end latency and throughput of GetCacheLocation (prefix match of 16
//! and 128 keys) over gRPC and HTTP against an in-process server, each printed beside its
//! floor measured in the same run — a bare tonic service / bare axum route answering the
//! same bytes — plus local index batch get and read_modify_write throughput on one core
//! beside a plain HashMap.

mod echo;
mod http_client;
mod index;

use std::net::SocketAddr;
use std::time::Instant;

use futures_util::future::join_all;
use hdrhistogram::Histogram;
use tokio::sync::Mutex;
use tonic::transport::Channel;

use http_client::HttpConnection;
use kvcm::config::ServerConfig;
use kvcm::proto::meta::{self, meta_service_client::MetaServiceClient};
use kvcm::service::meta::MetaHandler;

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
}

/// Latency percentiles and throughput of one case.
#[derive(Debug, Clone, Copy)]
struct Figures {
    p50_us: f64,
    p99_us: f64,
    per_second: f64,
}

const PREFIX_SIZES: [usize; 2] = [16, 128];

/// Runs every case and prints the table.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let server_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let client_runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let data_dir = std::env::temp_dir().join(format!("kvcm-bench-{}", std::process::id()));
    let config = ServerConfig {
        rpc_port: 0,
        http_port: 0,
        admin_http_port: 0,
        data_dir: data_dir.clone(),
        ..ServerConfig::default()
    };
    let (grpc, http, echo_grpc, echo_http) = server_runtime.block_on(async {
        let manager = kvcm::server::embedded_manager(&config)?;
        let handlers = kvcm::service::Handlers::new(manager, None);
        let server = kvcm::server::start(&config, handlers).await?;
        let answers = seed(&server.handlers.meta)?;
        let bodies = answers
            .iter()
            .map(|(n, a)| Ok((*n, serde_json::to_vec(a)?)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let echo_grpc = echo::spawn_grpc_echo(echo::EchoMeta { answers }).await?;
        let echo_http = echo::spawn_http_echo(bodies).await?;
        let grpc = server.addresses["grpc"];
        let http = server.addresses["http"];
        std::mem::forget(server); // serves until the process exits
        anyhow::Ok((grpc, http, echo_grpc, echo_http))
    })?;
    let local = |a: SocketAddr| SocketAddr::from(([127, 0, 0, 1], a.port()));
    println!("case                         p50 µs   p99 µs      req/s   p50 / floor");
    client_runtime.block_on(async {
        for size in PREFIX_SIZES {
            let floor = grpc_case(&args, local(echo_grpc), size).await?;
            let real = grpc_case(&args, local(grpc), size).await?;
            report(&format!("grpc echo (floor) {size}"), floor, floor);
            report(&format!("grpc prefix {size}"), real, floor);
        }
        for size in PREFIX_SIZES {
            let floor = http_case(&args, local(echo_http), &format!("/echo/{size}"), size).await?;
            let real = http_case(&args, local(http), "/api/getCacheLocation", size).await?;
            report(&format!("http echo (floor) {size}"), floor, floor);
            report(&format!("http prefix {size}"), real, floor);
        }
        anyhow::Ok(())
    })?;
    index::run(args.index_keys);
    let _ = std::fs::remove_dir_all(&data_dir);
    Ok(())
}

fn report(name: &str, figures: Figures, floor: Figures) {
    println!(
        "{name:<26} {:>8.1} {:>8.1} {:>10.0}   {:>5.2}x",
        figures.p50_us,
        figures.p99_us,
        figures.per_second,
        figures.p50_us / floor.p50_us
    );
}

/// Registers instance `bench` and commits keys 1..=128; returns the real prefix answers.
fn seed(
    meta_handler: &MetaHandler,
) -> anyhow::Result<Vec<(usize, meta::GetCacheLocationResponse)>> {
    let registered = meta_handler.register_instance(meta::RegisterInstanceRequest {
        instance_group: kvcm::server::DEFAULT_GROUP.into(),
        instance_id: "bench".into(),
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
    });
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

async fn grpc_case(args: &BenchArgs, address: SocketAddr, size: usize) -> anyhow::Result<Figures> {
    let client = MetaServiceClient::connect(format!("http://{address}")).await?;
    let request = prefix_request(size);
    let call = async |client: &MetaServiceClient<Channel>| {
        let answer = client
            .clone()
            .get_cache_location(request.clone())
            .await?
            .into_inner();
        anyhow::ensure!(
            answer.locations.len() == size,
            "{} locations",
            answer.locations.len()
        );
        anyhow::Ok(())
    };
    let latency = latency(args, async || call(&client).await).await?;
    let clients = vec![client.clone(); args.concurrency.max(1)];
    let per_second = throughput(args, clients, call).await?;
    Ok(Figures {
        per_second,
        ..latency
    })
}

async fn http_case(
    args: &BenchArgs,
    address: SocketAddr,
    path: &str,
    size: usize,
) -> anyhow::Result<Figures> {
    let body = serde_json::to_vec(&prefix_request(size))?;
    let call = async |connection: &Mutex<HttpConnection>| {
        let answer = connection.lock().await.post(path, &body).await?;
        anyhow::ensure!(answer.len() > size * 8, "short answer");
        anyhow::Ok(())
    };
    let single = Mutex::new(HttpConnection::connect(address).await?);
    let latency = latency(args, async || call(&single).await).await?;
    let mut connections = Vec::new();
    for _ in 0..args.concurrency.max(1) {
        connections.push(Mutex::new(HttpConnection::connect(address).await?));
    }
    let per_second = throughput(args, connections, call).await?;
    Ok(Figures {
        per_second,
        ..latency
    })
}

/// Sequential requests: warm-up, then `iterations` timed ones.
async fn latency(
    args: &BenchArgs,
    mut call: impl AsyncFnMut() -> anyhow::Result<()>,
) -> anyhow::Result<Figures> {
    let mut histogram = Histogram::<u64>::new(3)?;
    for i in 0..args.warmup + args.iterations {
        let started = Instant::now();
        call().await?;
        if i >= args.warmup {
            histogram.record(started.elapsed().as_nanos() as u64)?;
        }
    }
    Ok(Figures {
        p50_us: histogram.value_at_quantile(0.5) as f64 / 1000.0,
        p99_us: histogram.value_at_quantile(0.99) as f64 / 1000.0,
        per_second: 0.0,
    })
}

/// One worker per state, each doing `iterations / workers` calls; requests per second.
async fn throughput<S>(
    args: &BenchArgs,
    states: Vec<S>,
    call: impl AsyncFn(&S) -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    let per_worker = (args.iterations / states.len().max(1)).max(1);
    let started = Instant::now();
    let workers = states.iter().map(|state| async {
        for _ in 0..per_worker {
            call(state).await?;
        }
        anyhow::Ok(())
    });
    for outcome in join_all(workers).await {
        outcome?;
    }
    let elapsed = started.elapsed().as_secs_f64().max(1e-9);
    Ok((per_worker * states.len()) as f64 / elapsed)
}
