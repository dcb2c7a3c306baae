//! The data plane against its floors, in one run: put / get bandwidth of batches of 64
//! blocks of 64 KiB, 1 MiB and 4 MiB through the client's TransferEngine — to a pool node
//! over soft-shm and soft-TCP, and to the file tier (O_DIRECT) — each beside its floor
//! measured in the same run: memcpy of the same bytes (shm), a raw loopback TCP stream of
//! the same bytes (TCP), a sequential O_DIRECT `pwrite` / `pread` loop of the same bytes
//! to one file in the server's data directory, where the file tier's blocks go (file: a
//! write floor for puts, a read floor for gets). Rows: the default
//! (checksums on), `shm-nosum` (checksums off: their cost), `shm-staged` (blocks in "device"
//! memory through the staging ring, HostStaging with two slots of a quarter batch: the
//! ring's cost without a GPU), `tcp-zc` / `tcp-zc-nosum` (the host buffers registered with
//! the engine: zero-copy over soft-TCP, with and without checksums), `file-reg` (the same
//! registration on the file tier: io_uring registered buffers), `tcp-iso` / `tcp-zc-iso`
//! (`pool-tcp` / `tcp-zc` on a second server with `kvcm.auth.meta = required`: its pool
//! node isolates instances, so the engine shows an API key, opens its queue pairs with a
//! ticket in its instance's protection domain and learns its runs' keys with a runs
//! request — the cost of isolation). `shm-x4` (64 KiB and 1 MiB blocks): four engines, a
//! thread each, put and then get a batch each at once over soft-shm — what batches in
//! flight together reach (their control-plane calls share journal syncs); its floor is a
//! memcpy of all four batches' bytes.
//!
//! `cargo bench --bench data_plane` (a real `kvcm serve --pool-size 1G` on free ports;
//! `KVCM_BENCH_ROUNDS` sets the rounds per case, default 5; `KVCM_BENCH_PREFAULT=1` backs
//! the pool's region at start, `kvcm.pool.prefault`, instead of as blocks land;
//! `KVCM_BENCH_SIZES=65536,1048576` and `KVCM_BENCH_CASES=pool-shm,tcp-zc` run only those
//! block sizes and rows, comma-separated). Figures
//! include the control plane (StartWriteCache / FinishWriteCache, the lookup), as an engine
//! sees them. Each case prints its best round and, as `put worst`, its slowest put (where
//! first-touch faults of a lazily backed region show).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kvcm_client::{
    ClientConfig, DeviceRange, DirectMode, FileIoConfig, GetOutcome, HostStaging, PutOutcome,
    ServerAddress, TransferConfig, TransferEngine, TransferPath, Wire,
};
use kvcm_data::AlignedBuf;
use serde_json::{json, Value};

/// Blocks per put / get.
const BATCH: usize = 64;
/// Engines putting (and getting) a batch at once in the `shm-x4` row.
const IN_FLIGHT: usize = 4;

/// A child process killed on drop.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// The admin token of the server that requires meta auth.
const ROOT: &str = "bench-root";

fn post(port: u16, rpc: &str, body: Value, bearer: Option<&str>) -> Value {
    let route = format!("/api/{rpc}");
    let deadline = Duration::from_secs(10);
    kvcm::http_json::post_json_with(local(port), &route, &body, deadline, bearer, None).unwrap()
}

/// A running `kvcm serve` of the bench and the API key its engines show (`Some` when it
/// requires meta auth).
struct Server {
    _process: Process,
    grpc: u16,
    http: u16,
    key: Option<String>,
    /// The data directory (the embedded file storage lies below it).
    dir: tempfile::TempDir,
}

/// `kvcm serve --pool-size 1G` (its region backed at start when `prefault`; requiring meta
/// auth, with a key reaching every instance, when `isolated`), a file-only group `files`,
/// and one instance per block size on each.
fn start_server(sizes: &[usize], prefault: bool, isolated: bool) -> Server {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (grpc, http, admin) = (free_port(), free_port(), free_port());
    let bearer = isolated.then_some(ROOT);
    let auth = match isolated {
        true => [
            "kvcm.auth.meta=required",
            "kvcm.service.admin_auth_token=bench-root",
        ],
        false => ["kvcm.auth.meta=off", "kvcm.service.admin_auth_token="],
    };
    let child = Command::new(env!("CARGO_BIN_EXE_kvcm"))
        .args(["serve", "--pool-size", "1G", "--data-dir"])
        .arg(dir.path())
        .args(["--env", auth[0], "--env", auth[1]])
        .args(["--env", &format!("kvcm.pool.prefault={prefault}")])
        .args(["--env", &format!("kvcm.service.rpc_port={grpc}")])
        .args(["--env", &format!("kvcm.service.http_port={http}")])
        .args(["--env", &format!("kvcm.service.admin_http_port={admin}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("kvcm serve");
    let process = Process(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while kvcm::http_json::post_json_with::<Value>(
        local(http),
        kvcm::pool::NODES_ROUTE,
        &json!({"storage": kvcm::server::DEFAULT_POOL}),
        Duration::from_secs(1),
        bearer,
        None,
    )
    .map_or(true, |nodes| {
        nodes["nodes"].as_array().is_none_or(|n| n.is_empty())
    }) {
        assert!(Instant::now() < deadline, "the embedded pool never joined");
        std::thread::sleep(Duration::from_millis(20));
    }
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
        json!({"instance_group": files}),
        bearer,
    );
    let mut instances = Vec::new();
    for &size in sizes {
        for (group, tier) in [("default", "pool"), ("files", "file")] {
            let body = json!({"instance_group": group, "instance_id": instance(tier, size),
                "block_size": 16, "location_spec_infos": [{"name": "tp0", "size": size}],
                "model_deployment": {"model_name": "m", "dtype": "FP8", "tp_size": 1}});
            post(http, "registerInstance", body, bearer);
            instances.push(instance(tier, size));
        }
    }
    let key = isolated.then(|| {
        let account = json!({"user_name": "bench", "password": "pw", "role": "ROLE_USER"});
        post(admin, "addAccount", account, bearer);
        let body = json!({"user_name": "bench", "instance_ids": instances, "expires_at_ms": 0});
        let answer = post(admin, "createApiKey", body, bearer);
        answer["api_key"].as_str().expect("api_key").to_string()
    });
    Server {
        _process: process,
        grpc,
        http,
        key,
        dir,
    }
}

fn instance(tier: &str, size: usize) -> String {
    format!("{tier}-{size}")
}

fn engine(server: &Server, instance: String, wire: Wire, checksums: bool) -> TransferEngine {
    let client = ClientConfig {
        servers: vec![ServerAddress {
            grpc: format!("http://127.0.0.1:{}", server.grpc),
            http: local(server.http),
        }],
        instance_id: instance,
        wire: Some(Wire::Tcp),
        api_key: server.key.clone(),
        tls: None,
    };
    let config = TransferConfig {
        pool_wire: wire,
        staging_bytes: 64 << 20,
        checksums,
        file_io: FileIoConfig {
            direct: DirectMode::Auto,
            ..FileIoConfig::default()
        },
        ..TransferConfig::default()
    };
    TransferEngine::connect(client, config).unwrap()
}

/// Seconds of one put and one get of `BATCH` blocks (new keys each round, removed after):
/// from and into the host buffers, or the device's memory through its staging ring; and
/// the path every block took.
fn put_get(
    engine: &mut TransferEngine,
    buffers: &mut [AlignedBuf],
    device: Option<&mut HostStaging>,
    first_key: i64,
) -> (f64, f64, TransferPath) {
    let keys: Vec<i64> = (first_key..first_key + BATCH as i64).collect();
    let (put_seconds, get_seconds, path) = match device {
        None => host_put_get(engine, buffers, &keys),
        Some(device) => staged_put_get(engine, device, &keys),
    };
    engine
        .client()
        .remove(kvcm::proto::meta::RemoveCacheRequest {
            block_keys: keys,
            ..Default::default()
        })
        .unwrap();
    (put_seconds, get_seconds, path)
}

/// Checks that every block was written and hit, by one path; returns it.
fn assert_all(put: &[PutOutcome], got: &[GetOutcome]) -> TransferPath {
    let PutOutcome::Written(path) = put[0] else {
        panic!("{:?}", put[0]);
    };
    assert!(
        put.iter().all(|o| *o == PutOutcome::Written(path)),
        "{put:?}"
    );
    assert!(got.iter().all(|o| *o == GetOutcome::Hit(path)), "{got:?}");
    path
}

fn staged_put_get(
    engine: &mut TransferEngine,
    device: &mut HostStaging,
    keys: &[i64],
) -> (f64, f64, TransferPath) {
    let size = device.memory().len() / BATCH;
    let ranges: Vec<Vec<DeviceRange>> = (0..BATCH)
        .map(|i| {
            vec![DeviceRange {
                addr: (i * size) as u64,
                len: size,
            }]
        })
        .collect();
    let started = Instant::now();
    let put = engine.put_device_blocks(keys, &ranges, device).unwrap();
    let put_seconds = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let got = engine.get_device_blocks(keys, &ranges, device).unwrap();
    let get_seconds = started.elapsed().as_secs_f64();
    (put_seconds, get_seconds, assert_all(&put, &got))
}

fn host_put_get(
    engine: &mut TransferEngine,
    buffers: &mut [AlignedBuf],
    keys: &[i64],
) -> (f64, f64, TransferPath) {
    let blocks: Vec<Vec<&[u8]>> = buffers.iter().map(|b| vec![b.as_slice()]).collect();
    let started = Instant::now();
    let put = engine.put_blocks(keys, &blocks).unwrap();
    let put_seconds = started.elapsed().as_secs_f64();
    let mut outs: Vec<Vec<&mut [u8]>> =
        buffers.iter_mut().map(|b| vec![b.as_mut_slice()]).collect();
    let started = Instant::now();
    let got = engine.get_blocks(keys, &mut outs).unwrap();
    let get_seconds = started.elapsed().as_secs_f64();
    (put_seconds, get_seconds, assert_all(&put, &got))
}

/// Best seconds of [`IN_FLIGHT`] engines (a thread each, over soft-shm, checksums on)
/// putting a batch of `size`-byte blocks each at once, and then getting them, over
/// `rounds` rounds (keys from `first_key` on, removed after each round): (put, get, the
/// path taken). A phase lasts from the barrier that starts it to the last engine's finish.
fn in_flight(
    server: &Server,
    size: usize,
    rounds: usize,
    first_key: i64,
) -> (f64, f64, TransferPath) {
    let barrier = std::sync::Barrier::new(IN_FLIGHT + 1);
    let (starts, finishes, path) = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..IN_FLIGHT)
            .map(|thread| {
                let barrier = &barrier;
                scope.spawn(move || {
                    let mut engine = engine(server, instance("pool", size), Wire::Shm, true);
                    let mut buffers: Vec<AlignedBuf> =
                        (0..BATCH).map(|_| AlignedBuf::new(size)).collect();
                    let mut finished = Vec::with_capacity(rounds);
                    let mut path = None;
                    for round in 0..rounds {
                        let first = first_key + ((round * IN_FLIGHT + thread) * BATCH) as i64;
                        let keys: Vec<i64> = (first..first + BATCH as i64).collect();
                        barrier.wait();
                        let blocks: Vec<Vec<&[u8]>> =
                            buffers.iter().map(|b| vec![b.as_slice()]).collect();
                        let put = engine.put_blocks(&keys, &blocks).unwrap();
                        let put_done = Instant::now();
                        barrier.wait();
                        let mut outs: Vec<Vec<&mut [u8]>> =
                            buffers.iter_mut().map(|b| vec![b.as_mut_slice()]).collect();
                        let got = engine.get_blocks(&keys, &mut outs).unwrap();
                        finished.push((put_done, Instant::now()));
                        path = Some(assert_all(&put, &got));
                        let removal = kvcm::proto::meta::RemoveCacheRequest {
                            block_keys: keys,
                            ..Default::default()
                        };
                        engine.client().remove(removal).unwrap();
                    }
                    (finished, path)
                })
            })
            .collect();
        let mut starts = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            barrier.wait();
            let put_start = Instant::now();
            barrier.wait();
            starts.push((put_start, Instant::now()));
        }
        let done: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
        let path = done[0].1.expect("a round ran");
        let finishes: Vec<_> = done.into_iter().map(|(finished, _)| finished).collect();
        (starts, finishes, path)
    });
    let (mut put, mut get) = (f64::MAX, f64::MAX);
    for (round, (put_start, get_start)) in starts.iter().enumerate() {
        let last = |phase: fn(&(Instant, Instant)) -> Instant| {
            finishes
                .iter()
                .map(|f| phase(&f[round]))
                .max()
                .expect("engines")
        };
        put = put.min(last(|f| f.0).duration_since(*put_start).as_secs_f64());
        get = get.min(last(|f| f.1).duration_since(*get_start).as_secs_f64());
    }
    (put, get, path)
}

/// Seconds of a sequential O_DIRECT `pwrite` of `blocks` back to back into a new file below
/// `dir`, and of a `pread` of them back (best of 3 each). Each round writes a file of its
/// own, removed after it, so that the floor allocates its blocks as a put does.
fn direct_floor(dir: &std::path::Path, blocks: &mut [AlignedBuf]) -> Floor {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let (mut put, mut get) = (f64::MAX, f64::MAX);
    for round in 0..3 {
        let path = dir.join(format!("direct-floor-{round}"));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .expect("a new O_DIRECT file in the data directory");
        let started = Instant::now();
        let mut offset = 0u64;
        for block in blocks.iter() {
            file.write_all_at(block.as_slice(), offset).expect("pwrite");
            offset += block.len() as u64;
        }
        put = put.min(started.elapsed().as_secs_f64());
        let started = Instant::now();
        let mut offset = 0u64;
        for block in blocks.iter_mut() {
            file.read_exact_at(block.as_mut_slice(), offset)
                .expect("pread");
            offset += block.len() as u64;
        }
        get = get.min(started.elapsed().as_secs_f64());
        drop(file);
        std::fs::remove_file(&path).expect("remove the floor's file");
    }
    Floor { put, get }
}

/// Seconds to memcpy `bytes` bytes (best of 3).
fn memcpy_floor(bytes: usize) -> f64 {
    let source = vec![7u8; bytes];
    let mut target = vec![0u8; bytes];
    (0..3)
        .map(|_| {
            let started = Instant::now();
            target.copy_from_slice(&source);
            std::hint::black_box(&target);
            started.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min)
}

/// Seconds to stream `bytes` bytes over a loopback TCP connection (best of 3).
fn tcp_floor(bytes: usize) -> f64 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let sink = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut buffer = vec![0u8; 1 << 20];
        let mut left = 3 * bytes;
        while left > 0 {
            let got = stream.read(&mut buffer).unwrap();
            assert!(got > 0);
            left -= got;
        }
        stream.write_all(b"k").unwrap();
    });
    let mut stream = TcpStream::connect(address).unwrap();
    let data = vec![7u8; bytes];
    let mut best = f64::MAX;
    for _ in 0..3 {
        let started = Instant::now();
        stream.write_all(&data).unwrap();
        best = best.min(started.elapsed().as_secs_f64());
    }
    let mut ack = [0u8; 1];
    stream.read_exact(&mut ack).unwrap();
    sink.join().unwrap();
    best
}

/// What a row measures.
#[derive(Clone, Copy)]
enum Case {
    /// Host buffers, checksums on (the default).
    Host,
    /// Host buffers, checksums off.
    NoChecksums,
    /// Through the staging ring.
    Staged,
    /// Host buffers registered with the engine (zero-copy on TCP, io_uring registered
    /// buffers on files), checksums on.
    Registered,
    /// Host buffers registered with the engine, checksums off.
    RegisteredNoChecksums,
}

/// Whether `name` is among the comma-separated names of environment variable `var` (all
/// are when it is unset).
fn selected(var: &str, name: &str) -> bool {
    std::env::var(var).map_or(true, |only| only.split(',').any(|n| n == name))
}

fn gbps(bytes: usize, seconds: f64) -> f64 {
    bytes as f64 / seconds / 1e9
}

/// One row of the table: blocks of `size` bytes, `bytes` moved per put (and per get), the
/// floors' seconds for them (a put's, a get's).
struct Row<'a> {
    size: usize,
    name: &'a str,
    bytes: usize,
    floor: Floor,
}

/// Seconds of a floor's put and get of the same bytes (the same for memcpy and a stream).
#[derive(Clone, Copy)]
struct Floor {
    put: f64,
    get: f64,
}

impl Floor {
    fn both(seconds: f64) -> Floor {
        Floor {
            put: seconds,
            get: seconds,
        }
    }
}

impl Row<'_> {
    /// Prints the row for the best put and get and the slowest put (seconds; `None`:
    /// not measured, printed as `-`).
    fn print(&self, (put, get, put_worst): (f64, f64, Option<f64>), path: Option<TransferPath>) {
        let bytes = self.bytes;
        let (put_floor, get_floor) = (gbps(bytes, self.floor.put), gbps(bytes, self.floor.get));
        let floor = if self.floor.put == self.floor.get {
            format!("{put_floor:.2}")
        } else {
            format!("{put_floor:.2}/{get_floor:.2}")
        };
        let worst = put_worst.map_or("-".to_string(), |w| format!("{:.2}", gbps(bytes, w)));
        println!(
            "{:<8} {:<12} {:>9.2} {:>9.2} {:>11} {:>8.2} {:>8.2} {:>9}  {}",
            format!("{}K", self.size >> 10),
            self.name,
            gbps(bytes, put),
            gbps(bytes, get),
            floor,
            gbps(bytes, put) / put_floor,
            gbps(bytes, get) / get_floor,
            worst,
            path.map_or("-".to_string(), |p| p.to_string()),
        );
    }
}

fn main() {
    let rounds: usize = std::env::var("KVCM_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    let sizes = [64 << 10, 1 << 20, 4 << 20];
    let prefault = std::env::var("KVCM_BENCH_PREFAULT").as_deref() == Ok("1");
    let open = start_server(&sizes, prefault, false);
    let isolated = start_server(&sizes, prefault, true);
    let pool = if prefault {
        "pool region prefaulted"
    } else {
        "pool region backed as blocks land"
    };
    println!(
        "data plane, batches of {BATCH} blocks, best of {rounds} rounds and the slowest put (GB/s; ratio to the floor; {pool})"
    );
    println!(
        "{:<8} {:<12} {:>9} {:>9} {:>11} {:>8} {:>8} {:>9}  path taken",
        "block", "case", "put", "get", "floor", "put/fl", "get/fl", "put worst"
    );
    let mut next_key = 1i64;
    for size in sizes {
        if !selected("KVCM_BENCH_SIZES", &size.to_string()) {
            continue;
        }
        let bytes = BATCH * size;
        let mut buffers: Vec<AlignedBuf> = (0..BATCH).map(|_| AlignedBuf::new(size)).collect();
        for (i, buffer) in buffers.iter_mut().enumerate() {
            buffer.as_mut_slice().fill(i as u8);
        }
        // Device memory of the staged case: two slots of a quarter batch each.
        let mut device = HostStaging::new(bytes, 2, bytes / 4);
        device.memory().fill(7);
        let memcpy = Floor::both(memcpy_floor(bytes));
        let tcp = Floor::both(tcp_floor(bytes));
        let direct = direct_floor(open.dir.path(), &mut buffers);
        let (shm, tcp_zc, zc_nosum) = (Wire::Shm, Case::Registered, Case::RegisteredNoChecksums);
        let cases = [
            ("pool-shm", &open, "pool", shm, memcpy, Case::Host),
            ("shm-nosum", &open, "pool", shm, memcpy, Case::NoChecksums),
            ("shm-staged", &open, "pool", shm, memcpy, Case::Staged),
            ("pool-tcp", &open, "pool", Wire::Tcp, tcp, Case::Host),
            ("tcp-zc", &open, "pool", Wire::Tcp, tcp, tcp_zc),
            ("tcp-zc-nosum", &open, "pool", Wire::Tcp, tcp, zc_nosum),
            ("tcp-iso", &isolated, "pool", Wire::Tcp, tcp, Case::Host),
            ("tcp-zc-iso", &isolated, "pool", Wire::Tcp, tcp, tcp_zc),
            ("file", &open, "file", Wire::Tcp, direct, Case::Host),
            (
                "file-reg",
                &open,
                "file",
                Wire::Tcp,
                direct,
                Case::Registered,
            ),
        ];
        for (name, server, tier, wire, floor, case) in cases {
            if !selected("KVCM_BENCH_CASES", name) {
                continue;
            }
            let checksums = !matches!(case, Case::NoChecksums | Case::RegisteredNoChecksums);
            let mut engine = engine(server, instance(tier, size), wire, checksums);
            if matches!(case, Case::Registered | Case::RegisteredNoChecksums) {
                for buffer in &mut buffers {
                    let bytes = buffer.as_mut_slice();
                    // SAFETY: the buffers outlive the engine (dropped at the end of this
                    // iteration) and are never reallocated.
                    unsafe { engine.register_memory(bytes.as_mut_ptr(), bytes.len()) }.unwrap();
                }
            }
            // Best rounds, and the slowest put (a put landing on pool pages never touched
            // pays their first-touch faults unless the region was prefaulted).
            let (mut put, mut get, mut put_worst) = (f64::MAX, f64::MAX, 0f64);
            let mut path = None;
            for _ in 0..rounds {
                let staged = matches!(case, Case::Staged).then_some(&mut device);
                let (p, g, taken) = put_get(&mut engine, &mut buffers, staged, next_key);
                next_key += BATCH as i64;
                (put, get, put_worst) = (put.min(p), get.min(g), put_worst.max(p));
                assert!(path.is_none_or(|known| known == taken), "the path changed");
                path = Some(taken);
            }
            let row = Row {
                size,
                name,
                bytes,
                floor,
            };
            row.print((put, get, Some(put_worst)), path);
        }
        // Four batches in flight at once (4 MiB blocks would not fit the pool four times).
        if size <= 1 << 20 && selected("KVCM_BENCH_CASES", "shm-x4") {
            let (put, get, path) = in_flight(&open, size, rounds, next_key);
            next_key += (rounds * IN_FLIGHT * BATCH) as i64;
            let bytes = IN_FLIGHT * bytes;
            let row = Row {
                size,
                name: "shm-x4",
                bytes,
                floor: Floor::both(memcpy_floor(bytes)),
            };
            row.print((put, get, None), Some(path));
        }
    }
    println!(
        "file rows: floor = sequential O_DIRECT pwrite / pread of the same bytes (write/read)"
    );
}
