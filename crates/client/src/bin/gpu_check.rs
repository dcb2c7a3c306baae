//! `kvcm-gpu-check` (feature `cuda`): blocks in GPU memory put to and got back from a pool
//! node (soft-shm and soft-TCP) and the file tier through the pinned staging ring, every
//! byte verified, bandwidths printed beside the cudaMemcpy floors (pinned host ⇄ device)
//! measured in the same run, with the path each tier's bytes took.
//!
//! It runs its own kvcm server in-process (an embedded pool node of 1 GiB and the default
//! file storage, in a temporary data directory), so a GPU machine needs nothing but this
//! binary and the NVIDIA driver: `scripts/gpu-check.sh --build` builds it where cargo is,
//! `scripts/gpu-check.sh` runs it. Exit status 0 when every round trip verified.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use kvcm_client::{
    cuda_present, ClientConfig, CudaDevice, DeviceRange, GetOutcome, PutOutcome, ServerAddress,
    TransferConfig, TransferEngine, Wire,
};
use serde_json::{json, Value};

/// Bytes per block.
const BLOCK: usize = 1 << 20;
/// Blocks per put / get.
const BATCH: usize = 64;
/// Staging slots and their size.
const SLOTS: usize = 2;
const SLOT_BYTES: usize = 16 << 20;
/// Rounds per tier (best one reported).
const ROUNDS: usize = 3;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(reason) => {
            eprintln!("gpu-check: FAILED: {reason}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let started = Instant::now();
    // The server first: on a machine without a GPU the check still shows it starts.
    let server = Server::start()?;
    println!(
        "in-process kvcm server up (gRPC {}, embedded pool of 1 GiB)",
        server.grpc
    );
    if !cuda_present() {
        return Err("no CUDA driver (libcuda) can be loaded here: run it on a GPU machine".into());
    }
    let ctx = CudaContext::new(0).map_err(text)?;
    let stream = ctx.new_stream().map_err(text)?;
    let bytes = BLOCK * BATCH;
    let (htod, dtoh) = floors(&ctx, &stream, bytes)?;
    println!(
        "cudaMemcpy floors, {} MiB pinned: host→device {htod:.2} GB/s, device→host {dtoh:.2} GB/s",
        bytes >> 20
    );
    let pattern: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
    let source = stream.clone_htod(&pattern).map_err(text)?;
    let mut target = stream.alloc_zeros::<u8>(bytes).map_err(text)?;
    let mut device = CudaDevice::new(0, SLOTS, SLOT_BYTES).map_err(|e| e.to_string())?;
    println!(
        "{:<14} {:>9} {:>9} {:>8} {:>8}  path",
        "tier", "put GB/s", "get GB/s", "put/h2d", "get/d2h"
    );
    let mut next_key = 1i64;
    for (name, instance, wire) in [
        ("pool soft-shm", "gpu-pool", Wire::Shm),
        ("pool soft-tcp", "gpu-pool", Wire::Tcp),
        ("file tier", "gpu-file", Wire::Tcp),
    ] {
        let mut engine = server.engine(instance, wire)?;
        let (mut put, mut get, mut path) = (f64::MAX, f64::MAX, String::new());
        for _ in 0..ROUNDS {
            stream.memset_zeros(&mut target).map_err(text)?;
            stream.synchronize().map_err(text)?;
            let keys: Vec<i64> = (next_key..next_key + BATCH as i64).collect();
            next_key += BATCH as i64;
            let round = round_trip(&mut engine, &mut device, &stream, &source, &target, &keys)?;
            let back = stream.clone_dtoh(&target).map_err(text)?;
            if back != pattern {
                return Err(format!(
                    "{name}: the bytes read back differ from those written"
                ));
            }
            put = put.min(round.0);
            get = get.min(round.1);
            path = round.2;
        }
        let (put, get) = (gbps(bytes, put), gbps(bytes, get));
        println!(
            "{name:<14} {put:>9.2} {get:>9.2} {:>8.2} {:>8.2}  {path}",
            put / dtoh,
            get / htod
        );
    }
    println!(
        "every byte verified; {:.1} s in all",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn text(error: impl std::fmt::Display) -> String {
    error.to_string()
}

fn gbps(bytes: usize, seconds: f64) -> f64 {
    bytes as f64 / seconds / 1e9
}

/// Seconds of pinned host → device and device → host copies of `bytes` (best of 3), as
/// GB/s.
fn floors(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    bytes: usize,
) -> Result<(f64, f64), String> {
    // SAFETY: flags 0 (cached pinned memory); its bytes are only copied, never read as data.
    let mut pinned = unsafe { ctx.alloc_pinned_with_flags::<u8>(bytes, 0) }.map_err(text)?;
    let mut device = stream.alloc_zeros::<u8>(bytes).map_err(text)?;
    let (mut htod, mut dtoh) = (f64::MAX, f64::MAX);
    for _ in 0..3 {
        let started = Instant::now();
        stream.memcpy_htod(&pinned, &mut device).map_err(text)?;
        stream.synchronize().map_err(text)?;
        htod = htod.min(started.elapsed().as_secs_f64());
        let started = Instant::now();
        stream.memcpy_dtoh(&device, &mut pinned).map_err(text)?;
        stream.synchronize().map_err(text)?;
        dtoh = dtoh.min(started.elapsed().as_secs_f64());
    }
    Ok((gbps(bytes, htod), gbps(bytes, dtoh)))
}

/// The device ranges of `BATCH` blocks of `slice`.
fn ranges(slice: &CudaSlice<u8>, stream: &Arc<CudaStream>) -> Vec<Vec<DeviceRange>> {
    let (base, _synced) = slice.device_ptr(stream);
    (0..BATCH)
        .map(|i| {
            vec![DeviceRange {
                addr: base + (i * BLOCK) as u64,
                len: BLOCK,
            }]
        })
        .collect()
}

/// One put of `source` and one get into `target`: seconds of each and the path taken.
fn round_trip(
    engine: &mut TransferEngine,
    device: &mut CudaDevice,
    stream: &Arc<CudaStream>,
    source: &CudaSlice<u8>,
    target: &CudaSlice<u8>,
    keys: &[i64],
) -> Result<(f64, f64, String), String> {
    let started = Instant::now();
    let put = engine
        .put_device_blocks(keys, &ranges(source, stream), device)
        .map_err(text)?;
    let put_seconds = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let got = engine
        .get_device_blocks(keys, &ranges(target, stream), device)
        .map_err(text)?;
    let get_seconds = started.elapsed().as_secs_f64();
    let path = match (&put[0], &got[0]) {
        (PutOutcome::Written(path), GetOutcome::Hit(_)) => path.to_string(),
        other => return Err(format!("block 0: {other:?}")),
    };
    if let Some(bad) = put.iter().find(|o| !matches!(o, PutOutcome::Written(_))) {
        return Err(format!("a put: {bad:?}"));
    }
    if let Some(bad) = got.iter().find(|o| !matches!(o, GetOutcome::Hit(_))) {
        return Err(format!("a get: {bad:?}"));
    }
    Ok((put_seconds, get_seconds, path))
}

/// The in-process kvcm server: its runtime thread, addresses and data directory.
struct Server {
    grpc: SocketAddr,
    http: SocketAddr,
    dir: std::path::PathBuf,
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Starts it (embedded pool of 1 GiB) and registers the check's instances.
    fn start() -> Result<Server, String> {
        let dir = std::env::temp_dir().join(format!("kvcm-gpu-check-{}", std::process::id()));
        let mut config = kvcm::config::ServerConfig {
            rpc_port: 0,
            http_port: 0,
            admin_http_port: 0,
            data_dir: dir.clone(),
            ..Default::default()
        };
        config.pool.embedded_size = 1 << 30;
        let (ready, addresses) = std::sync::mpsc::channel();
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || serve(config, ready, stopped));
        let (grpc, http, admin) = addresses
            .recv_timeout(Duration::from_secs(60))
            .map_err(|_| "the in-process server did not start".to_string())??;
        let server = Server {
            grpc,
            http,
            dir,
            stop: Some(stop),
            thread: Some(thread),
        };
        server.prepare(admin)?;
        Ok(server)
    }

    /// A files-only group and the two instances (one 1 MiB spec each).
    fn prepare(&self, admin: SocketAddr) -> Result<(), String> {
        let files = json!({"name": "files", "storage_candidates": ["default_file"],
            "global_quota_group_name": "files", "quota": {"capacity": "1000000000000"},
            "cache_config": {"reclaim_strategy": {"storage_unique_name": "default_file"},
                "data_storage_strategy": "CPS_PREFER_3FS",
                "meta_indexer_config": {"mutex_shard_num": 16,
                    "meta_cache_policy_config": {"type": "lru"},
                    "meta_storage_backend_config": {"storage_type": "local"}}},
            "version": 1});
        post(
            admin,
            "createInstanceGroup",
            json!({ "instance_group": files }),
        )?;
        for (instance, group) in [("gpu-pool", "default"), ("gpu-file", "files")] {
            let body = json!({"instance_group": group, "instance_id": instance, "block_size": 16,
                "location_spec_infos": [{"name": "tp0", "size": BLOCK}],
                "model_deployment": {"model_name": "m", "dtype": "FP8", "tp_size": 1}});
            post(self.http, "registerInstance", body)?;
        }
        Ok(())
    }

    fn engine(&self, instance: &str, wire: Wire) -> Result<TransferEngine, String> {
        let client = ClientConfig {
            servers: vec![ServerAddress {
                grpc: format!("http://{}", self.grpc),
                http: self.http,
            }],
            instance_id: instance.into(),
            wire: Some(Wire::Tcp),
            api_key: None,
            tls: None,
        };
        let config = TransferConfig {
            pool_wire: wire,
            ..TransferConfig::default()
        };
        TransferEngine::connect(client, config).map_err(text)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

type Addresses = Result<(SocketAddr, SocketAddr, SocketAddr), String>;

/// The server's thread: starts it, reports its addresses, serves until told to stop.
fn serve(
    config: kvcm::config::ServerConfig,
    ready: std::sync::mpsc::Sender<Addresses>,
    stop: std::sync::mpsc::Receiver<()>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return drop(ready.send(Err(error.to_string()))),
    };
    let started = runtime.block_on(async {
        let manager = kvcm::server::embedded_manager(&config).map_err(text)?;
        let handlers = kvcm::service::Handlers::new(manager, None);
        kvcm::server::start(&config, handlers).await.map_err(text)
    });
    let server = match started {
        Ok(server) => server,
        Err(reason) => return drop(ready.send(Err(reason))),
    };
    let address = |name| SocketAddr::from((Ipv4Addr::LOCALHOST, server.addresses[name].port()));
    let _ = ready.send(Ok((
        address("grpc"),
        address("http"),
        address("admin_http"),
    )));
    runtime.block_on(async {
        // Serves until the check drops its end of the stop channel.
        let _ = tokio::task::spawn_blocking(move || stop.recv()).await;
        let _ = server.stop().await;
    });
}

fn post(address: SocketAddr, rpc: &str, body: Value) -> Result<(), String> {
    let route = format!("/api/{rpc}");
    let answer: Value = kvcm::http_json::post_json(address, &route, &body, Duration::from_secs(10))
        .map_err(|e| format!("{rpc}: {e}"))?;
    match answer["header"]["status"]["code"].as_str() {
        Some("OK") => Ok(()),
        _ => Err(format!("{rpc}: {answer}")),
    }
}
