//! `kvcm bench --memory`: what a SERVING block costs a real `kvcm serve`, everything counted
//! (index, search cache, live-block tracking, event log buffers): the server's RSS growth
//! while random blocks are written through gRPC (StartWriteCache + FinishWriteCache, 16 keys
//! a call), divided by the blocks written. The floor, measured in the same run, is the RSS
//! growth of this process holding the same URIs in a plain `HashMap<i64, Vec<String>>`.
//! Before the figures are printed, GetCacheLocation on a sample of keys must answer exactly
//! the URIs StartWriteCache handed out.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use kvcm::proto::meta;
use kvcm::proto::meta::meta_service_client::MetaServiceClient;
use tonic::transport::Channel;

/// Keys per StartWriteCache call.
const BATCH: usize = 16;
/// Calls in flight.
const IN_FLIGHT: usize = 8;
/// Blocks written before the baseline is taken (runtime buffers, first files).
const WARM_UP_BLOCKS: usize = 16_384;
/// Bytes of each part.
const PART_BYTES: i64 = 4096;
/// Blocks the server packs per file (the embedded default's `key_count_per_file`).
const KEYS_PER_FILE: usize = 8;
/// Keys checked against GetCacheLocation.
const CHECKED_KEYS: usize = 4096;

/// Settings of the memory benchmark.
#[derive(Debug, Clone)]
pub struct MemoryArgs {
    /// SERVING blocks written after the warm-up.
    pub blocks: usize,
    /// Spec counts measured, one server each.
    pub spec_counts: Vec<usize>,
    /// The `kvcm` binary to run as the server (default: this one).
    pub serve_binary: PathBuf,
}

/// Runs one server per spec count and prints the figures.
pub fn run(args: &MemoryArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    println!(
        "memory per SERVING block: {} random blocks after {WARM_UP_BLOCKS} warm-up blocks, \
         {KEYS_PER_FILE} keys per file, {PART_BYTES}-byte parts, server {}",
        args.blocks,
        args.serve_binary.display()
    );
    println!("specs   kvcm serve B/block   HashMap<i64,Vec<String>> B/block   ratio");
    for &specs in &args.spec_counts {
        let (server, floor) = runtime.block_on(measure(args, specs))?;
        println!(
            "{specs:>5}   {server:>18.1}   {floor:>32.1}   {:>5.2}x",
            server / floor
        );
    }
    Ok(())
}

/// (server bytes per block, floor bytes per block) for one spec count.
async fn measure(args: &MemoryArgs, specs: usize) -> anyhow::Result<(f64, f64)> {
    let server = Server::start(&args.serve_binary).await?;
    let mut client = MetaServiceClient::connect(format!("http://{}", server.grpc)).await?;
    register(&mut client, specs).await?;
    let mut warm_up = HashMap::new();
    write_blocks(&client, WARM_UP_BLOCKS, &mut warm_up).await?;
    drop(warm_up);
    let server_before = rss_bytes(server.child.id())?;
    let own_before = rss_bytes(std::process::id())?;
    let mut uris: HashMap<i64, Vec<String>> = HashMap::new();
    let started = Instant::now();
    write_blocks(&client, args.blocks, &mut uris).await?;
    let server_after = rss_bytes(server.child.id())?;
    let own_after = rss_bytes(std::process::id())?;
    eprintln!(
        "  {specs} specs: wrote {} blocks in {:.1} s",
        uris.len(),
        started.elapsed().as_secs_f64()
    );
    check_answers(&mut client, &uris).await?;
    let blocks = uris.len() as f64;
    let per_block = |before: u64, after: u64| after.saturating_sub(before) as f64 / blocks;
    Ok((
        per_block(server_before, server_after),
        per_block(own_before, own_after),
    ))
}

async fn register(client: &mut MetaServiceClient<Channel>, specs: usize) -> anyhow::Result<()> {
    let request = meta::RegisterInstanceRequest {
        instance_group: kvcm::server::DEFAULT_GROUP.into(),
        instance_id: "memory".into(),
        block_size: 16,
        location_spec_infos: (0..specs)
            .map(|i| meta::LocationSpecInfo {
                name: format!("tp{i}"),
                size: PART_BYTES,
            })
            .collect(),
        model_deployment: Some(meta::ModelDeployment {
            model_name: "bench".into(),
            dtype: "fp8".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let answer = client.register_instance(request).await?.into_inner();
    ensure_ok(&answer.header, "RegisterInstance")
}

/// Writes `blocks` new random blocks (SERVING when done) and records their URIs.
async fn write_blocks(
    client: &MetaServiceClient<Channel>,
    blocks: usize,
    uris: &mut HashMap<i64, Vec<String>>,
) -> anyhow::Result<()> {
    let batches = blocks.div_ceil(BATCH);
    let workers = (0..IN_FLIGHT).map(|worker| {
        let mut client = client.clone();
        let mine = (worker..batches).step_by(IN_FLIGHT).count();
        async move {
            let mut written = Vec::with_capacity(mine * BATCH);
            for _ in 0..mine {
                written.extend(write_batch(&mut client).await?);
            }
            anyhow::Ok(written)
        }
    });
    for written in futures_util::future::try_join_all(workers).await? {
        uris.extend(written);
    }
    Ok(())
}

/// One StartWriteCache of `BATCH` random keys, committed whole.
async fn write_batch(
    client: &mut MetaServiceClient<Channel>,
) -> anyhow::Result<Vec<(i64, Vec<String>)>> {
    let keys: Vec<i64> = (0..BATCH).map(|_| fastrand::i64(..)).collect();
    let started = client
        .start_write_cache(meta::StartWriteCacheRequest {
            instance_id: "memory".into(),
            block_keys: keys.clone(),
            write_timeout_seconds: 60,
            ..Default::default()
        })
        .await?
        .into_inner();
    ensure_ok(&started.header, "StartWriteCache")?;
    anyhow::ensure!(
        started.locations.len() == keys.len(),
        "random keys collided: {} of {} new",
        started.locations.len(),
        keys.len()
    );
    let finished = client
        .finish_write_cache(meta::FinishWriteCacheRequest {
            instance_id: "memory".into(),
            write_session_id: started.write_session_id,
            success_blocks: Some(meta::BlockMask {
                info: Some(meta::block_mask::Info::Offset(keys.len() as i32)),
            }),
            ..Default::default()
        })
        .await?
        .into_inner();
    ensure_ok(&finished.header, "FinishWriteCache")?;
    Ok(keys
        .into_iter()
        .zip(started.locations)
        .map(|(key, location)| {
            let specs = location.location_specs.into_iter();
            (key, specs.map(|spec| spec.uri).collect())
        })
        .collect())
}

/// GetCacheLocation answers the URIs StartWriteCache handed out, for a sample of keys.
async fn check_answers(
    client: &mut MetaServiceClient<Channel>,
    uris: &HashMap<i64, Vec<String>>,
) -> anyhow::Result<()> {
    let sample: Vec<i64> = uris.keys().take(CHECKED_KEYS).copied().collect();
    for keys in sample.chunks(128) {
        let answer = client
            .get_cache_location(meta::GetCacheLocationRequest {
                instance_id: "memory".into(),
                query_type: meta::QueryType::QtBatchGet as i32,
                block_keys: keys.to_vec(),
                ..Default::default()
            })
            .await?
            .into_inner();
        ensure_ok(&answer.header, "GetCacheLocation")?;
        for (key, location) in keys.iter().zip(answer.locations) {
            let found: Vec<String> = location.location_specs.into_iter().map(|s| s.uri).collect();
            anyhow::ensure!(
                found == uris[key],
                "key {key}: {found:?} != {:?}",
                uris[key]
            );
        }
    }
    Ok(())
}

fn ensure_ok(header: &Option<meta::CommonResponseHeader>, rpc: &str) -> anyhow::Result<()> {
    let status = header.as_ref().and_then(|h| h.status.as_ref());
    anyhow::ensure!(
        status.is_some_and(|s| s.code == meta::ErrorCode::Ok as i32),
        "{rpc}: {status:?}"
    );
    Ok(())
}

/// Resident set size of a process (`VmRSS` of /proc/<pid>/status).
fn rss_bytes(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|line| line.starts_with("VmRSS:"))
        .context("no VmRSS line")?;
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .context("VmRSS has no number")?
        .parse()?;
    Ok(kib * 1024)
}

/// A `kvcm serve` child on OS-chosen ports in a temporary data directory.
struct Server {
    child: Child,
    grpc: std::net::SocketAddr,
    data_dir: PathBuf,
}

impl Server {
    async fn start(binary: &Path) -> anyhow::Result<Server> {
        let data_dir =
            std::env::temp_dir().join(format!("kvcm-bench-memory-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&data_dir)?;
        let ready = data_dir.join("ready.json");
        let mut command = Command::new(binary);
        command.arg("serve").arg("--data-dir").arg(&data_dir);
        command.arg("--ready-file").arg(&ready);
        for port in ["rpc_port", "http_port", "admin_http_port"] {
            command.arg("--env").arg(format!("kvcm.service.{port}=0"));
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let mut server = Server {
            child,
            grpc: ([127, 0, 0, 1], 0).into(),
            data_dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        let text = loop {
            if let Ok(text) = std::fs::read_to_string(&ready) {
                break text;
            }
            anyhow::ensure!(Instant::now() < deadline, "the server wrote no ready file");
            anyhow::ensure!(server.child.try_wait()?.is_none(), "the server exited");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let addresses: HashMap<String, String> = serde_json::from_str(&text)?;
        let grpc: std::net::SocketAddr = addresses["grpc"].parse()?;
        server.grpc = ([127, 0, 0, 1], grpc.port()).into();
        Ok(server)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}
