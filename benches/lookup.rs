//! The lookup path against its floors, in one run: prefix lookups of 16 and 128 keys on the
//! fast path (soft-TCP, soft-shm) vs GetCacheLocation over gRPC vs one GET on a loopback
//! redis-server, with a TCP ping-pong of the fast path's request and response sizes as the
//! floor; and the StartWriteCache + FinishWriteCache pair as RDMA messages vs over gRPC,
//! once on the default journal (fsync always) and once on a server whose journal does not
//! sync (the paths' own cost, without the disk wait both share).
//!
//! `cargo bench --bench lookup` (a real `kvcm serve` and a real `redis-server` on free
//! ports; `KVCM_BENCH_ROUNDS` sets the rounds, default 20 of 250 requests per case). Cases
//! of one comparison run in alternating blocks, so load drift hits them alike.
//!
//! On RDMA verbs too when `KVCM_VERBS_DEVICE` names a device (`--features rdma`; on kernel
//! soft-RoCE in a VM: `scripts/rxe-vm.sh`, ratios only): the server also serves its tables
//! there, and the verbs fast path is reported beside its own floor, the same batch of
//! 64-byte READs between two raw queue pairs of that device (no lookup logic).
//! `KVCM_BENCH_TABLE_BYTES=0` skips the table-size measurement (minutes in a TCG VM).
//! `KVCM_BENCH_ONLY=<text>` runs the floors and the lookup cases whose name contains the
//! text (or one of several texts separated by `|`); the write pairs too when the text
//! contains `write`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use kvcm::proto::meta;
use kvcm_client::{Client, ClientConfig, ServerAddress, Wire};
use kvcm_transport::any::{AnyCq, AnyDomain, AnyQp, AnyRegion, VerbsDevice};
use kvcm_transport::soft::{SoftConfig, SoftDomain};
use kvcm_transport::{
    Access, CompletionQueue, Domain, HostMemory, QpConfig, QueuePair, Region, SendOp, SendWr,
    WcStatus, WorkCompletion,
};

const INSTANCE: &str = "bench";
const BLOCK: usize = 250;

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

fn wait_for_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "port {port} never opened");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `kvcm serve` process, its ports and its data dir.
struct Server {
    _process: Process,
    grpc: u16,
    http: u16,
    admin: u16,
    _dir: tempfile::TempDir,
}

/// `kvcm serve` on free ports with `--env` `settings`.
fn start_server(settings: &[String]) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let (grpc, http, admin) = (free_port(), free_port(), free_port());
    let child = Command::new(env!("CARGO_BIN_EXE_kvcm"))
        .arg("serve")
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--env", &format!("kvcm.service.rpc_port={grpc}")])
        .args(["--env", &format!("kvcm.service.http_port={http}")])
        .args(["--env", &format!("kvcm.service.admin_http_port={admin}")])
        .args(settings.iter().flat_map(|s| ["--env", s.as_str()]))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("kvcm serve");
    wait_for_port(grpc);
    wait_for_port(http);
    wait_for_port(admin);
    Server {
        _process: Process(child),
        grpc,
        http,
        admin,
        _dir: dir,
    }
}

fn start_redis() -> Option<(Process, u16)> {
    let port = free_port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
        .ok()?;
    wait_for_port(port);
    Some((Process(child), port))
}

/// One request/response exchange of a case.
trait Case {
    fn name(&self) -> String;
    fn once(&mut self);
    /// What the case counted besides its latencies (the fast path's retries and fallbacks).
    fn counters(&self) -> String {
        String::new()
    }
    /// Whether the case runs on verbs (its ratio is to the verbs floor).
    fn is_verbs(&self) -> bool {
        false
    }
}

/// A fast-path prefix match; `reused` keeps one answer vector across calls
/// (`prefix_match_into`, what an engine's lookup loop does), else each call returns a new
/// one (`prefix_match`).
struct FastPath {
    client: Client,
    keys: Vec<i64>,
    wire: Wire,
    reused: Option<Vec<meta::CacheLocation>>,
}

impl Case for FastPath {
    fn name(&self) -> String {
        let form = if self.reused.is_some() { " (into)" } else { "" };
        format!("fast path {:?} prefix-{}{form}", self.wire, self.keys.len())
    }
    fn is_verbs(&self) -> bool {
        self.wire == Wire::Verbs
    }
    fn counters(&self) -> String {
        let m = self.client.metrics();
        format!(
            "  ({} lookups: {} retries, {} fallbacks, {} round trips)",
            m.hits + m.fallbacks,
            m.retries,
            m.fallbacks,
            self.client.round_trips()
        )
    }
    fn once(&mut self) {
        let found = match &mut self.reused {
            Some(out) => {
                self.client.prefix_match_into(&self.keys, out).unwrap();
                out.len()
            }
            None => self.client.prefix_match(&self.keys).unwrap().len(),
        };
        assert_eq!(found, self.keys.len());
    }
}

struct Grpc {
    runtime: tokio::runtime::Runtime,
    client: meta::meta_service_client::MetaServiceClient<tonic::transport::Channel>,
    keys: Vec<i64>,
}

impl Case for Grpc {
    fn name(&self) -> String {
        format!("gRPC GetCacheLocation prefix-{}", self.keys.len())
    }
    fn once(&mut self) {
        let request = meta::GetCacheLocationRequest {
            instance_id: INSTANCE.into(),
            query_type: meta::QueryType::QtPrefixMatch as i32,
            block_keys: self.keys.clone(),
            ..Default::default()
        };
        let answer = self
            .runtime
            .block_on(self.client.get_cache_location(request));
        assert_eq!(
            answer.unwrap().into_inner().locations.len(),
            self.keys.len()
        );
    }
}

/// A TCP ping-pong between two threads with fixed request and response sizes, both sides
/// busy-polling non-blocking sockets: the same polling mode as the fast path (whose client
/// and server NIC spin), so the floor has no wake-up cost the fast path does not pay.
struct PingPong {
    stream: TcpStream,
    request: Vec<u8>,
    response: Vec<u8>,
}

/// Fills `buffer` from a non-blocking stream, spinning (up to `spin` while nothing has
/// arrived, then blocking, as the soft NIC parks when idle); false at EOF or error.
fn spin_read(stream: &mut TcpStream, buffer: &mut [u8], spin: Option<Duration>) -> bool {
    let mut filled = 0;
    let begun = Instant::now();
    while filled < buffer.len() {
        match stream.read(&mut buffer[filled..]) {
            Ok(0) => return false,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if filled == 0 && spin.is_some_and(|spin| begun.elapsed() > spin) {
                    let blocked = stream.set_nonblocking(false).is_ok()
                        && stream.read_exact(buffer).is_ok()
                        && stream.set_nonblocking(true).is_ok();
                    return blocked;
                }
                std::hint::spin_loop()
            }
            Err(_) => return false,
        }
    }
    true
}

/// Writes all of `bytes` to a non-blocking stream, spinning; false on error.
fn spin_write(stream: &mut TcpStream, bytes: &[u8]) -> bool {
    let mut written = 0;
    while written < bytes.len() {
        match stream.write(&bytes[written..]) {
            Ok(n) => written += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(_) => return false,
        }
    }
    true
}

impl PingPong {
    fn new(request: usize, response: usize) -> PingPong {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            stream.set_nodelay(true).unwrap();
            stream.set_nonblocking(true).unwrap();
            let (mut got, answer) = (vec![0u8; request], vec![7u8; response]);
            let spin = Some(Duration::from_micros(100));
            while spin_read(&mut stream, &mut got, spin) && spin_write(&mut stream, &answer) {}
        });
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_nodelay(true).unwrap();
        stream.set_nonblocking(true).unwrap();
        PingPong {
            stream,
            request: vec![1u8; request],
            response: vec![0u8; response],
        }
    }
}

impl Case for PingPong {
    fn name(&self) -> String {
        format!(
            "TCP ping-pong {} B / {} B (busy-polled)",
            self.request.len(),
            self.response.len()
        )
    }
    fn once(&mut self) {
        assert!(spin_write(&mut self.stream, &self.request));
        assert!(spin_read(&mut self.stream, &mut self.response, None));
    }
}

struct RedisGet {
    stream: TcpStream,
    answer: Vec<u8>,
}

impl Case for RedisGet {
    fn name(&self) -> String {
        "redis-server GET (loopback)".into()
    }
    fn once(&mut self) {
        // Busy-polled like the fast path's client (redis-server itself waits in epoll).
        let get = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n";
        assert!(spin_write(&mut self.stream, get));
        let mut got = vec![0u8; self.answer.len()];
        assert!(spin_read(&mut self.stream, &mut got, None));
        assert_eq!(got, self.answer);
    }
}

/// Paired latency: the cases run in alternating blocks; returns (p50, p99) in µs per case.
fn measure(cases: &mut [Box<dyn Case>], rounds: usize) -> Vec<(f64, f64)> {
    let mut histograms: Vec<Histogram<u64>> =
        cases.iter().map(|_| Histogram::new(3).unwrap()).collect();
    for case in cases.iter_mut() {
        for _ in 0..50 {
            case.once();
        }
    }
    for _ in 0..rounds {
        for (case, histogram) in cases.iter_mut().zip(&mut histograms) {
            for _ in 0..BLOCK {
                let begun = Instant::now();
                case.once();
                histogram.record(begun.elapsed().as_nanos() as u64).unwrap();
            }
        }
    }
    histograms
        .iter()
        .map(|h| {
            (
                h.value_at_quantile(0.5) as f64 / 1e3,
                h.value_at_quantile(0.99) as f64 / 1e3,
            )
        })
        .collect()
}

fn client(grpc: u16, http: u16, wire: Option<Wire>) -> Client {
    Client::connect(ClientConfig {
        servers: vec![ServerAddress {
            grpc: format!("http://127.0.0.1:{grpc}"),
            http: format!("127.0.0.1:{http}").parse().unwrap(),
        }],
        instance_id: INSTANCE.into(),
        wire,
        api_key: None,
        tls: None,
    })
    .unwrap()
}

/// The verbs device `KVCM_VERBS_DEVICE` names (GID index `KVCM_VERBS_GID_INDEX`), when it
/// opens; otherwise the verbs cases are skipped, saying why.
fn verbs_device() -> Option<VerbsDevice> {
    let device = VerbsDevice::from_env().expect("KVCM_VERBS_GID_INDEX");
    if device.name.is_empty() {
        return None;
    }
    match AnyDomain::open_verbs(&device) {
        Ok(_) => Some(device),
        Err(error) => {
            println!("*** verbs cases skipped: {error} ***");
            None
        }
    }
}

/// `reads` 64-byte READs posted at once (the last signaled) between two raw queue pairs,
/// as the fast path posts its batch, with no lookup logic: on verbs the floor of the verbs
/// cases (two queue pairs of one device); on soft-TCP the transport's own share of the
/// fast path (two domains, so the target is served by another NIC thread, as the
/// server's table is).
struct RawReads {
    verbs: bool,
    qp: AnyQp,
    cq: AnyCq,
    local: AnyRegion,
    target: AnyRegion,
    reads: usize,
    _peer: (AnyQp, AnyCq),
    _domains: [AnyDomain; 2],
    _memory: (HostMemory, HostMemory),
}

impl RawReads {
    fn verbs(device: &VerbsDevice, reads: usize) -> RawReads {
        let domain = AnyDomain::open_verbs(device).unwrap();
        RawReads::between([domain.clone(), domain], reads, true)
    }

    fn soft_tcp(reads: usize) -> RawReads {
        let open = || AnyDomain::Soft(SoftDomain::open(SoftConfig::default()).unwrap());
        RawReads::between([open(), open()], reads, false)
    }

    /// READs from a queue pair of the first domain to one of the second.
    fn between(domains: [AnyDomain; 2], reads: usize, verbs: bool) -> Self {
        let [domain, target_domain] = &domains;
        let cq = domain.create_cq().unwrap();
        let qp = domain.create_qp(&cq, &cq, QpConfig::default()).unwrap();
        let peer_cq = target_domain.create_cq().unwrap();
        let peer = target_domain
            .create_qp(&peer_cq, &peer_cq, QpConfig::default())
            .unwrap();
        qp.connect(&peer.endpoint()).unwrap();
        peer.connect(&qp.endpoint()).unwrap();
        let len = reads * 64;
        let (mine, theirs) = (
            domain.alloc(len).unwrap(),
            target_domain.alloc(len).unwrap(),
        );
        let local = domain.register(&mine, 0, len, Access::LOCAL_WRITE).unwrap();
        let target = target_domain
            .register(&theirs, 0, len, Access::REMOTE_READ)
            .unwrap();
        RawReads {
            verbs,
            qp,
            cq,
            local,
            target,
            reads,
            _peer: (peer, peer_cq),
            _domains: domains.clone(),
            _memory: (mine, theirs),
        }
    }
}

impl Case for RawReads {
    fn name(&self) -> String {
        match self.verbs {
            true => format!("verbs floor: {} raw 64 B READs", self.reads),
            false => format!("soft-TCP alone: {} raw 64 B READs", self.reads),
        }
    }
    fn is_verbs(&self) -> bool {
        self.verbs
    }
    fn once(&mut self) {
        let sges: Vec<_> = (0..self.reads)
            .map(|i| self.local.sge(i * 64, 64))
            .collect();
        let wrs: Vec<SendWr<'_>> = sges
            .iter()
            .enumerate()
            .map(|(i, sge)| SendWr {
                wr_id: i as u64,
                op: SendOp::Read(self.target.remote(i * 64)),
                sg_list: std::slice::from_ref(sge),
                signaled: i + 1 == self.reads,
            })
            .collect();
        self.qp.post_send(&wrs).unwrap();
        let mut out = [WorkCompletion::EMPTY];
        while self.cq.poll(&mut out) == 0 {
            std::hint::spin_loop();
        }
        assert_eq!(out[0].status, WcStatus::Success);
    }
}

/// Bytes of the fast path's READ round trip for `keys` keys with one-line buckets, as the
/// soft-TCP wire carries it (`kvcm_transport` soft/frame.rs): READ lists of at most 256
/// READs — a 40-byte header plus 16 bytes per READ, answered by one 16-byte header and the
/// data — and a READ left alone after them sent as a plain one (40-byte header, 16-byte
/// answer header).
fn fast_path_sizes(keys: usize) -> (usize, usize) {
    let reads = 1 + 2 * keys;
    let frames = reads.div_ceil(256);
    let listed = if reads % 256 == 1 { reads - 1 } else { reads };
    (40 * frames + 16 * listed, 16 * frames + 64 + 2 * keys * 64)
}

/// Registers the bench instance (one spec of 1 MiB blocks) on the server at `grpc_port`;
/// the gRPC client it used.
fn register(
    runtime: &tokio::runtime::Runtime,
    grpc_port: u16,
) -> meta::meta_service_client::MetaServiceClient<tonic::transport::Channel> {
    let mut grpc = runtime
        .block_on(meta::meta_service_client::MetaServiceClient::connect(
            format!("http://127.0.0.1:{grpc_port}"),
        ))
        .unwrap();
    let registration = meta::RegisterInstanceRequest {
        instance_group: "default".into(),
        instance_id: INSTANCE.into(),
        block_size: 16,
        location_spec_infos: vec![meta::LocationSpecInfo {
            name: "tp0".into(),
            size: 1 << 20,
        }],
        model_deployment: Some(meta::ModelDeployment {
            model_name: "m".into(),
            dtype: "FP8".into(),
            tp_size: 1,
            ..Default::default()
        }),
        ..Default::default()
    };
    runtime
        .block_on(grpc.register_instance(registration))
        .unwrap();
    grpc
}

fn main() {
    let rounds: usize = std::env::var("KVCM_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(20);
    let verbs = verbs_device();
    let settings: Vec<String> = verbs
        .iter()
        .flat_map(|device| {
            [
                format!("kvcm.lookup.verbs_device={}", device.name),
                format!("kvcm.lookup.verbs_gid_index={}", device.gid_index),
            ]
        })
        .collect();
    let mut wires = vec![Wire::Tcp, Wire::Shm];
    wires.extend(verbs.iter().map(|_| Wire::Verbs));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server = start_server(&settings);
    let (grpc_port, http_port) = (server.grpc, server.http);
    let grpc = register(&runtime, grpc_port);
    let writer = client(grpc_port, http_port, None);
    let keys: Vec<i64> = (1..=128).collect();
    write(&writer, keys.clone());
    let redis = start_redis();
    println!("lookup benchmark: {rounds} rounds of {BLOCK} requests per case, p50 / p99 in µs");
    for count in [16usize, 128] {
        let (request, response) = fast_path_sizes(count);
        let mut cases: Vec<Box<dyn Case>> = vec![Box::new(PingPong::new(request, response))];
        if let Some(device) = &verbs {
            cases.push(Box::new(RawReads::verbs(device, 1 + 2 * count)));
        }
        cases.push(Box::new(RawReads::soft_tcp(1 + 2 * count)));
        for &wire in &wires {
            for reused in [None, Some(Vec::new())] {
                let client = client(grpc_port, http_port, Some(wire));
                assert!(client.fast_path_up());
                cases.push(Box::new(FastPath {
                    client,
                    keys: keys[..count].to_vec(),
                    wire,
                    reused,
                }));
            }
        }
        cases.push(Box::new(Grpc {
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
            client: grpc.clone(),
            keys: keys[..count].to_vec(),
        }));
        if let Some((_, port)) = &redis {
            let mut stream = TcpStream::connect(("127.0.0.1", *port)).unwrap();
            stream.set_nodelay(true).unwrap();
            stream
                .write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$8\r\nlocation\r\n")
                .unwrap();
            let mut ok = [0u8; 5];
            stream.read_exact(&mut ok).unwrap();
            stream.set_nonblocking(true).unwrap();
            cases.push(Box::new(RedisGet {
                stream,
                answer: b"$8\r\nlocation\r\n".to_vec(),
            }));
        } else {
            println!("*** redis-server not found: the Redis GET floor is not measured ***");
        }
        // KVCM_BENCH_ONLY=<text>[|<text>…]: only the cases whose name contains one of the
        // texts (and the floors).
        if let Ok(only) = std::env::var("KVCM_BENCH_ONLY") {
            let floors = 1 + usize::from(verbs.is_some());
            let mut index = 0;
            cases.retain(|case| {
                index += 1;
                let name = case.name();
                index <= floors || only.split('|').any(|text| name.contains(text))
            });
        }
        let figures = measure(&mut cases, rounds);
        let floor = figures[0].0;
        // The verbs cases against their own floor (the second case when verbs runs).
        let verbs_floor = verbs.as_ref().map(|_| figures[1].0);
        for (case, (p50, p99)) in cases.iter().zip(&figures) {
            let name = case.name();
            let (ratio, of) = match verbs_floor {
                Some(verbs_floor) if case.is_verbs() => (p50 / verbs_floor, "verbs floor"),
                _ => (p50 / floor, "floor"),
            };
            println!(
                "  {:<44} p50 {:>8.2}  p99 {:>8.2}  {:>5.2}x {of}{}",
                name,
                p50,
                p99,
                ratio,
                case.counters()
            );
        }
    }
    let only = std::env::var("KVCM_BENCH_ONLY").ok();
    if only.as_ref().is_some_and(|only| !only.contains("write")) {
        return;
    }
    // KVCM_BENCH_TABLE_BYTES=0 skips the 200k-block table-size measurement (minutes under
    // an emulated CPU).
    if only.is_none() && std::env::var("KVCM_BENCH_TABLE_BYTES").as_deref() != Ok("0") {
        table_bytes(&writer, grpc_port, http_port);
    }
    // The write pair twice: on the product default (every acknowledged call waits for the
    // journal's fdatasync, the same disk wait on both paths), then on a server whose
    // journal does not sync, which leaves each path's own cost.
    write_pairs("journal fsync always (default)", &server, &wires, rounds);
    let mut unsynced = settings.clone();
    unsynced.push("kvcm.journal.fsync=never".into());
    let unsynced = start_server(&unsynced);
    register(&runtime, unsynced.grpc);
    write_pairs("journal fsync never", &unsynced, &wires, rounds);
}

/// StartWriteCache + FinishWriteCache of 16 new blocks per pair over gRPC, then as RDMA
/// messages on each wire, against `server`; beside each, the server's own time per pair
/// (its manager work, from its `/metrics`), the floor no path goes below.
fn write_pairs(setting: &str, server: &Server, wires: &[Wire], rounds: usize) {
    let (grpc, http, admin) = (server.grpc, server.http, server.admin);
    let mut next = 1_000_000i64;
    let name = format!("StartWriteCache+FinishWriteCache x16, {setting}");
    let before = server_write_time(admin);
    let grpc_pair = write_pair(&client(grpc, http, None), rounds, &mut next);
    let work = server_write_time(admin).pair_since(&before);
    println!(
        "  {:<44} p50 {:>8.2}  p99 {:>8.2}  (server work {work:.2} per pair)",
        format!("gRPC {name}"),
        grpc_pair.0,
        grpc_pair.1
    );
    for &wire in wires {
        let messages = client(grpc, http, Some(wire));
        let before = server_write_time(admin);
        let (p50, p99) = write_pair(&messages, rounds, &mut next);
        let work = server_write_time(admin).pair_since(&before);
        println!(
            "  {:<44} p50 {:>8.2}  p99 {:>8.2}  {:>5.2}x gRPC  (server work {work:.2} per pair)",
            format!("RDMA messages {wire:?} {name}"),
            p50,
            p99,
            p50 / grpc_pair.0
        );
    }
}

/// The server's cumulative calls and µs of StartWriteCache and FinishWriteCache.
struct WriteTime {
    calls: [f64; 2],
    micros: [f64; 2],
}

impl WriteTime {
    /// Mean server µs of one StartWriteCache plus one FinishWriteCache since `before`.
    fn pair_since(&self, before: &WriteTime) -> f64 {
        (0..2)
            .map(|i| (self.micros[i] - before.micros[i]) / (self.calls[i] - before.calls[i]))
            .sum()
    }
}

/// Reads the per-API counters of the server's Prometheus text (`GET /metrics` on its admin
/// port).
fn server_write_time(admin: u16) -> WriteTime {
    let mut stream = TcpStream::connect(("127.0.0.1", admin)).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let value = |metric: &str, api: &str| -> f64 {
        let series = format!("kvcm_service_{metric}{{api_name=\"{api}\"}} ");
        text.lines()
            .find_map(|line| line.strip_prefix(&series))
            .map_or(0.0, |v| v.trim().parse().unwrap())
    };
    let apis = ["StartWriteCache", "FinishWriteCache"];
    let calls = apis.map(|api| value("query_counter", api));
    let means = apis.map(|api| value("query_rt_us", api));
    WriteTime {
        calls,
        micros: [calls[0] * means[0], calls[1] * means[1]],
    }
}

/// Table bytes per published block at 200k blocks of one spec, beside the index's RSS per
/// block (docs/performance.md, issue 7: 93.8 B at 1 M blocks).
fn table_bytes(writer: &Client, grpc: u16, http: u16) {
    const BLOCKS: i64 = 200_000;
    let mut first = 10_000_000i64;
    let mut pairs = Histogram::<u64>::new(3).unwrap();
    // Pairs over 40 ms and their total: those that waited for (or did) a table build.
    let (mut slow, mut slow_total) = (0, Duration::ZERO);
    while first < 10_000_000 + BLOCKS {
        let begun = Instant::now();
        write(writer, (first..first + 1000).collect());
        let took = begun.elapsed();
        pairs.record(took.as_nanos() as u64).unwrap();
        if took > Duration::from_millis(40) {
            slow += 1;
            slow_total += took;
        }
        first += 1000;
    }
    // A write call that waits for a growth, or rebuilds the table (O(published blocks)),
    // shows in the max and the slow pairs.
    println!(
        "  table fill, {} write pairs of 1000 blocks (gRPC): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; {slow} over 40 ms, {:.0} ms in all",
        pairs.len(),
        pairs.value_at_quantile(0.5) as f64 / 1e6,
        pairs.value_at_quantile(0.99) as f64 / 1e6,
        pairs.max() as f64 / 1e6,
        slow_total.as_secs_f64() * 1e3
    );
    let reader = client(grpc, http, Some(Wire::Shm));
    let blocks = BLOCKS as u64 + 128;
    let bytes = reader.table_bytes().expect("table");
    println!(
        "  lookup table: {bytes} B for {blocks} published blocks of one spec = {:.1} B per block (index RSS: 93.8 B per block, issue 7)",
        bytes as f64 / blocks as f64
    );
    cold_templates(grpc, http);
}

/// Prefix-16 lookups whose URI templates the client has not cached (fresh files each
/// time: one extra round trip) beside the same lookups warm, per wire.
fn cold_templates(grpc: u16, http: u16) {
    for wire in [Wire::Tcp, Wire::Shm] {
        let reader = client(grpc, http, Some(wire));
        let (mut cold, mut warm) = (
            Histogram::<u64>::new(3).unwrap(),
            Histogram::<u64>::new(3).unwrap(),
        );
        // 16 keys span two files of 8 blocks (the default storage): never seen before.
        for run in 0..2000i64 {
            let keys: Vec<i64> = (0..16).map(|i| 10_000_000 + run * 16 + i).collect();
            for histogram in [&mut cold, &mut warm] {
                let begun = Instant::now();
                assert_eq!(reader.prefix_match(&keys).unwrap().len(), 16);
                histogram.record(begun.elapsed().as_nanos() as u64).unwrap();
            }
        }
        let extra = reader.metrics().extra_round_trips;
        println!(
            "  {:<44} p50 {:>8.2}  p99 {:>8.2}  (warm: p50 {:.2}; {extra} extra round trips)",
            format!("fast path {wire:?} prefix-16, cold templates"),
            cold.value_at_quantile(0.5) as f64 / 1e3,
            cold.value_at_quantile(0.99) as f64 / 1e3,
            warm.value_at_quantile(0.5) as f64 / 1e3,
        );
    }
}

/// StartWriteCache + FinishWriteCache of new `keys`, all committed.
fn write(writer: &Client, keys: Vec<i64>) {
    let count = keys.len() as i32;
    let started = writer
        .start_write(meta::StartWriteCacheRequest {
            block_keys: keys,
            write_timeout_seconds: 60,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(started.locations.len() as i32, count, "every key is new");
    writer
        .finish_write(meta::FinishWriteCacheRequest {
            write_session_id: started.write_session_id,
            success_blocks: Some(meta::BlockMask {
                info: Some(meta::block_mask::Info::Offset(count)),
            }),
            ..Default::default()
        })
        .unwrap();
}

/// StartWriteCache + FinishWriteCache of 16 new blocks; (p50, p99) in µs.
fn write_pair(writer: &Client, rounds: usize, next: &mut i64) -> (f64, f64) {
    let mut histogram = Histogram::<u64>::new(3).unwrap();
    for _ in 0..rounds * 25 {
        let keys: Vec<i64> = (*next..*next + 16).collect();
        *next += 16;
        let begun = Instant::now();
        write(writer, keys);
        histogram.record(begun.elapsed().as_nanos() as u64).unwrap();
    }
    (
        histogram.value_at_quantile(0.5) as f64 / 1e3,
        histogram.value_at_quantile(0.99) as f64 / 1e3,
    )
}
