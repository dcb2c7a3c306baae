//! Transport benchmark: soft-TCP and soft-shm against their floors, measured in the same run.
//!
//! - 64-byte READ round trip (criterion median, plus p50 / p99 from 20 000 timed samples)
//!   beside a 64-byte TCP ping-pong between two threads in the same polling mode: every
//!   waiting thread busy-polls, yielding the CPU between empty polls.
//! - 4 KiB and 1 MiB READ and WRITE bandwidth, batched (16 work requests per post),
//!   beside memcpy bandwidth of the same block size and a raw TCP stream.
//!
//! Run: `cargo bench -p kvcm-transport --bench transport` (add `-- --quick` for a short run;
//! set `KVCM_BENCH_SUMMARY_ONLY=1` to print only the summary).
//! The summary table at the end prints each figure, its floor and the ratio.

use criterion::{Criterion, Throughput};
use kvcm_transport::soft::{IdlePolicy, SoftConfig, SoftCq, SoftDomain, SoftQp, SoftRegion, Wire};
use kvcm_transport::{
    Access, CompletionQueue, Domain, HostMemory, QpConfig, QueuePair, Region, SendOp, SendWr,
    WcStatus, WorkCompletion,
};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BATCH: usize = 16;
const SAMPLES: usize = 20_000;
const BLOCKS: [usize; 2] = [4096, 1 << 20];

/// Two soft domains on one wire, with a connected queue pair and a region on each side.
struct Link {
    _domains: (SoftDomain, SoftDomain),
    _local: HostMemory,
    local_region: SoftRegion,
    _remote: HostMemory,
    remote_region: SoftRegion,
    cq: SoftCq,
    qp: SoftQp,
    _peer: (SoftCq, SoftQp),
}

impl Link {
    fn new(wire: Wire) -> Self {
        Self::with_nics(wire, false)
    }

    /// With `one_nic`, both queue pairs live in one domain: one NIC thread serves both
    /// ends, so the path has two polling threads (application, NIC), like the floor.
    fn with_nics(wire: Wire, one_nic: bool) -> Self {
        let idle = IdlePolicy {
            spin: Duration::from_millis(5),
            ..IdlePolicy::default()
        };
        let open =
            || SoftDomain::open(SoftConfig::with_wire(wire).with_idle(idle)).expect("domain");
        let a = open();
        let b = if one_nic { a.clone() } else { open() };
        let len = BATCH << 20;
        let local = a.alloc(len).unwrap();
        let local_region = a.register(&local, 0, len, Access::ALL).unwrap();
        let remote = b.alloc(len).unwrap();
        let remote_region = b.register(&remote, 0, len, Access::ALL).unwrap();
        let (cq, peer_cq) = (a.create_cq().unwrap(), b.create_cq().unwrap());
        let qp = a.create_qp(&cq, &cq, QpConfig::default()).unwrap();
        let peer_qp = b
            .create_qp(&peer_cq, &peer_cq, QpConfig::default())
            .unwrap();
        qp.connect(&peer_qp.endpoint()).unwrap();
        peer_qp.connect(&qp.endpoint()).unwrap();
        Link {
            _domains: (a, b),
            _local: local,
            local_region,
            _remote: remote,
            remote_region,
            cq,
            qp,
            _peer: (peer_cq, peer_qp),
        }
    }

    /// Posts `BATCH` (or 1) operations of `len` bytes and busy-polls until all complete.
    fn run(&self, write: bool, len: usize, count: usize) {
        let sges: Vec<_> = (0..count)
            .map(|i| self.local_region.sge(i * len, len as u32))
            .collect();
        let wrs: Vec<SendWr> = (0..count)
            .map(|i| {
                let remote = self.remote_region.remote(i * len);
                let op = if write {
                    SendOp::Write { remote, imm: None }
                } else {
                    SendOp::Read(remote)
                };
                SendWr {
                    wr_id: i as u64,
                    op,
                    sg_list: &sges[i..=i],
                    signaled: i + 1 == count,
                }
            })
            .collect();
        self.qp.post_send(&wrs).expect("post");
        busy_poll(&self.cq);
    }
}

fn busy_poll(cq: &SoftCq) {
    let mut out = [WorkCompletion::EMPTY];
    while cq.poll(&mut out) == 0 {
        std::thread::yield_now();
    }
    assert_eq!(out[0].status, WcStatus::Success);
}

/// A 64-byte TCP ping-pong between two busy-polling threads: the latency floor.
struct PingPong {
    client: TcpStream,
    stop: Arc<AtomicBool>,
    server: Option<std::thread::JoinHandle<()>>,
}

impl PingPong {
    fn new() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server_stream, _) = listener.accept().unwrap();
        for stream in [&client, &server_stream] {
            stream.set_nodelay(true).unwrap();
            stream.set_nonblocking(true).unwrap();
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let server = std::thread::spawn(move || {
            let mut stream = server_stream;
            let mut buf = [0u8; 64];
            while !flag.load(Ordering::Relaxed) {
                if read_exact_polling(&mut stream, &mut buf, &flag) {
                    write_all_polling(&mut stream, &buf);
                }
            }
        });
        PingPong {
            client,
            stop,
            server: Some(server),
        }
    }

    fn round_trip(&mut self) {
        let mut buf = [7u8; 64];
        write_all_polling(&mut self.client, &buf);
        read_exact_polling(&mut self.client, &mut buf, &self.stop);
    }
}

impl Drop for PingPong {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(server) = self.server.take() {
            server.join().unwrap();
        }
    }
}

fn read_exact_polling(stream: &mut TcpStream, buf: &mut [u8], stop: &AtomicBool) -> bool {
    let mut got = 0;
    while got < buf.len() {
        match stream.read(&mut buf[got..]) {
            Ok(0) => return false,
            Ok(n) => got += n,
            Err(_) if stop.load(Ordering::Relaxed) => return false,
            Err(_) => std::thread::yield_now(),
        }
    }
    true
}

fn write_all_polling(stream: &mut TcpStream, mut buf: &[u8]) {
    while !buf.is_empty() {
        match stream.write(buf) {
            Ok(n) => buf = &buf[n..],
            Err(_) => std::thread::yield_now(),
        }
    }
}

/// Raw TCP stream bandwidth over loopback in blocks of `len`: a reference for the TCP wire.
fn tcp_stream_seconds(len: usize, blocks: usize) -> f64 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    let sink = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 20];
        let mut left = len * blocks;
        while left > 0 {
            left -= server.read(&mut buf).unwrap();
        }
        server.write_all(&[1]).unwrap();
    });
    let block = vec![3u8; len];
    let started = Instant::now();
    for _ in 0..blocks {
        client.write_all(&block).unwrap();
    }
    client.read_exact(&mut [0u8; 1]).unwrap();
    let elapsed = started.elapsed().as_secs_f64();
    sink.join().unwrap();
    elapsed
}

fn memcpy_seconds(len: usize, rounds: usize) -> f64 {
    let source = vec![5u8; len * BATCH];
    let mut destination = vec![0u8; len * BATCH];
    let started = Instant::now();
    for _ in 0..rounds {
        destination.copy_from_slice(std::hint::black_box(&source));
        std::hint::black_box(&mut destination);
    }
    started.elapsed().as_secs_f64()
}

/// Runs `measure` while one more thread busy-polls (yielding), as the soft-TCP path has
/// three polling threads (application, two NICs) where the ping-pong floor has two.
fn with_extra_poller<T>(measure: impl FnOnce() -> T) -> T {
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                std::thread::yield_now();
            }
        });
        let result = measure();
        stop.store(true, Ordering::Relaxed);
        result
    })
}

fn percentiles(mut op: impl FnMut()) -> (f64, f64) {
    (0..1000).for_each(|_| op());
    let mut samples: Vec<f64> = (0..SAMPLES)
        .map(|_| {
            let started = Instant::now();
            op();
            started.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    (samples[SAMPLES / 2], samples[SAMPLES * 99 / 100])
}

fn bandwidth_gbs(len: usize, mut op: impl FnMut()) -> f64 {
    op();
    let rounds = (256 << 20) / (len * BATCH) + 4;
    let started = Instant::now();
    (0..rounds).for_each(|_| op());
    (rounds * len * BATCH) as f64 / started.elapsed().as_secs_f64() / 1e9
}

fn latency_benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("read_64B_round_trip");
    let mut ping = PingPong::new();
    group.bench_function("floor_tcp_ping_pong", |b| b.iter(|| ping.round_trip()));
    drop(ping);
    for wire in [Wire::Tcp, Wire::Shm] {
        let link = Link::new(wire);
        group.bench_function(format!("soft_{wire:?}").to_lowercase(), |b| {
            b.iter(|| link.run(false, 64, 1))
        });
    }
    group.finish();
}

fn bandwidth_benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("bandwidth_batched");
    for len in BLOCKS {
        group.throughput(Throughput::Bytes((len * BATCH) as u64));
        group.bench_function(format!("floor_memcpy/{len}"), |b| {
            b.iter_custom(|iters| Duration::from_secs_f64(memcpy_seconds(len, iters as usize)))
        });
        for wire in [Wire::Tcp, Wire::Shm] {
            let link = Link::new(wire);
            for write in [false, true] {
                let name = format!(
                    "soft_{wire:?}_{}/{len}",
                    if write { "write" } else { "read" }
                );
                group.bench_function(name.to_lowercase(), |b| {
                    b.iter(|| link.run(write, len, BATCH))
                });
            }
        }
    }
    group.finish();
}

/// Prints every figure beside its floor, measured now, and the ratio.
fn summary() {
    println!("\n=== transport summary (floors measured in this run) ===");
    let mut ping = PingPong::new();
    let (floor50, floor99) = percentiles(|| ping.round_trip());
    println!("64 B TCP ping-pong floor        p50 {floor50:7.2} us  p99 {floor99:7.2} us");
    let (busy50, busy99) = with_extra_poller(|| percentiles(|| ping.round_trip()));
    drop(ping);
    println!("  (context) floor + 1 polling thread  p50 {busy50:7.2} us  p99 {busy99:7.2} us");
    let one_nic = Link::with_nics(Wire::Tcp, true);
    let (p50, p99) = percentiles(|| one_nic.run(false, 64, 1));
    drop(one_nic);
    println!("  (context) soft-tcp, both ends on one NIC  p50 {p50:7.2} us  p99 {p99:7.2} us  p50/floor {:.2}x", p50 / floor50);
    for wire in [Wire::Tcp, Wire::Shm] {
        let link = Link::new(wire);
        let (p50, p99) = percentiles(|| link.run(false, 64, 1));
        println!(
            "64 B READ soft-{:<4}             p50 {p50:7.2} us  p99 {p99:7.2} us  p50/floor {:.2}x",
            format!("{wire:?}").to_lowercase(),
            p50 / floor50
        );
    }
    for len in BLOCKS {
        let memcpy = (len * BATCH * 64) as f64 / memcpy_seconds(len, 64) / 1e9;
        let blocks = (256 << 20) / len;
        let tcp = (len * blocks) as f64 / tcp_stream_seconds(len, blocks) / 1e9;
        println!("{len:>8} B floors: memcpy {memcpy:6.2} GB/s, raw TCP stream {tcp:6.2} GB/s");
        for wire in [Wire::Tcp, Wire::Shm] {
            let link = Link::new(wire);
            for write in [false, true] {
                let gbs = bandwidth_gbs(len, || link.run(write, len, BATCH));
                println!(
                    "{len:>8} B {} soft-{:<4} {gbs:6.2} GB/s  vs memcpy {:5.1}%  vs TCP stream {:5.1}%",
                    if write { "WRITE" } else { "READ " },
                    format!("{wire:?}").to_lowercase(),
                    100.0 * gbs / memcpy,
                    100.0 * gbs / tcp
                );
            }
        }
    }
}

fn main() {
    if std::env::var_os("KVCM_BENCH_SUMMARY_ONLY").is_none() {
        let mut criterion = Criterion::default()
            .sample_size(20)
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(2))
            .configure_from_args();
        latency_benches(&mut criterion);
        bandwidth_benches(&mut criterion);
        criterion.final_summary();
    }
    summary();
}
