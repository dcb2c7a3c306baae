//! The `verbs` provider against perftest on the same device, and the soft provider in the
//! same run (issue 12; on kernel soft-RoCE in the qemu guest of `scripts/rxe-vm.sh`).
//!
//! Figures, each measured the same way for every provider (two domains in this process,
//! one reliable-connected queue pair between them, the passive side idle):
//! - 64-byte READ latency: one READ outstanding, the completion queue busy-polled, p50 and
//!   p99 over `KVCM_BENCH_ITERS` (default 10 000) after 1 000 warm-up READs, one clock read
//!   per READ and a sample the difference of consecutive reads (perftest's method); beside
//!   `ib_read_lat -s 64 -n <iters>` (its `t_typical`, the median, and its 99 %).
//! - 1 MiB WRITE bandwidth: a window of `WINDOW` signaled WRITEs kept full (one posted per
//!   completion) over `KVCM_BENCH_BW_ITERS` (default 2 000) after one warm-up window;
//!   beside `ib_write_bw -s 1048576 -n <iters> -t WINDOW` (its average).
//!
//! The verbs CQ is polled in a tight loop, as perftest does; the soft provider's CQ is
//! polled yielding the CPU between empty polls, as in `benches/transport.rs` (its NIC
//! threads need the CPU). perftest runs from `PATH` (`scripts/rxe-vm.sh --with-perftest`
//! puts it there), server and client on the same device, out of band over 127.0.0.1.
//!
//! Run (the GID index is the RoCE v2 one of rxe0 in the guest):
//!
//! ```sh
//! cargo bench -p kvcm-transport --features rdma --bench verbs --no-run   # prints the path
//! KVCM_VERBS_DEVICE=rxe0 KVCM_VERBS_GID_INDEX=1 \
//!     scripts/rxe-vm.sh --with-perftest --tsc -- target/release/deps/verbs-<hash>
//! ```
//!
//! (`--tsc`: the guest's clock is the TSC, which perftest reads too; otherwise each of our
//! clock reads is a system call and an emulated HPET read under TCG.)
//!
//! `KVCM_BENCH_ROUNDS` (default 3) repeats the verbs-and-perftest figures.

use kvcm_transport::soft::{IdlePolicy, SoftConfig, SoftDomain, Wire};
use kvcm_transport::verbs::{VerbsConfig, VerbsDomain};
use kvcm_transport::{
    Access, CompletionQueue, Domain, QpConfig, QueuePair, Region, SendOp, SendWr, WcOpcode,
    WcStatus, WorkCompletion,
};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const LATENCY_BYTES: usize = 64;
const WARM_UP: usize = 1000;
const BLOCK: usize = 1 << 20;
/// Outstanding WRITEs in the bandwidth test, ours and perftest's (`-t`).
const WINDOW: usize = 16;
const PERFTEST_PORT: u16 = 18515;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// How the application waits for its completion.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Polling {
    /// A tight loop (perftest's way).
    Spin,
    /// `sched_yield` between empty polls (the soft provider's NIC threads need the CPU).
    Yield,
}

/// Two domains with a connected queue pair and a `len`-byte region on each side.
struct Pair<D: Domain> {
    cq: D::Cq,
    qp: D::Qp,
    local: D::Region,
    remote: D::Region,
    _peer: (D::Cq, D::Qp),
    _memory: (D::Memory, D::Memory),
    _domains: (D, D),
    polling: Polling,
}

impl<D: Domain> Pair<D> {
    fn new(a: D, b: D, len: usize, polling: Polling) -> Self {
        let local_memory = a.alloc(len).expect("alloc");
        let local = a
            .register(&local_memory, 0, len, Access::ALL)
            .expect("register");
        let remote_memory = b.alloc(len).expect("alloc");
        let remote = b
            .register(&remote_memory, 0, len, Access::ALL)
            .expect("register");
        let (cq, peer_cq) = (a.create_cq().expect("cq"), b.create_cq().expect("cq"));
        let qp = a.create_qp(&cq, &cq, QpConfig::default()).expect("qp");
        let peer_qp = b
            .create_qp(&peer_cq, &peer_cq, QpConfig::default())
            .expect("qp");
        qp.connect(&peer_qp.endpoint()).expect("connect");
        peer_qp.connect(&qp.endpoint()).expect("connect");
        Pair {
            cq,
            qp,
            local,
            remote,
            _peer: (peer_cq, peer_qp),
            _memory: (local_memory, remote_memory),
            _domains: (a, b),
            polling,
        }
    }

    fn post(&self, write: bool, slot: usize, len: usize) {
        let sge = [self.local.sge(slot * len, len as u32)];
        let remote = self.remote.remote(slot * len);
        let op = if write {
            SendOp::Write { remote, imm: None }
        } else {
            SendOp::Read(remote)
        };
        let wr = SendWr {
            wr_id: slot as u64,
            op,
            sg_list: &sge,
            signaled: true,
        };
        self.qp.post_send(&[wr]).expect("post_send");
    }

    /// Waits for at least one completion; returns the successful ones in `out`.
    fn wait(&self, out: &mut [WorkCompletion]) -> usize {
        loop {
            let count = self.cq.poll(out);
            if count > 0 {
                for completion in &out[..count] {
                    assert_eq!(completion.status, WcStatus::Success, "{completion:?}");
                }
                return count;
            }
            match self.polling {
                Polling::Spin => std::hint::spin_loop(),
                Polling::Yield => std::thread::yield_now(),
            }
        }
    }

    /// p50 and p99 of `iters` single 64-byte READs, in microseconds.
    fn read_latency(&self, iters: usize) -> (f64, f64) {
        let mut out = [WorkCompletion::EMPTY; 1];
        let mut once = || {
            self.post(false, 0, LATENCY_BYTES);
            self.wait(&mut out);
        };
        (0..WARM_UP).for_each(|_| once());
        // One clock read per READ, as perftest: sample i is stamp i+1 - stamp i.
        let mut stamps = Vec::with_capacity(iters + 1);
        for _ in 0..iters {
            stamps.push(Instant::now());
            once();
        }
        stamps.push(Instant::now());
        let mut samples: Vec<f64> = stamps
            .windows(2)
            .map(|pair| (pair[1] - pair[0]).as_secs_f64() * 1e6)
            .collect();
        samples.sort_by(f64::total_cmp);
        (samples[iters / 2], samples[iters * 99 / 100])
    }

    /// p50 of the cost of [`QueuePair::state`] in microseconds (the verbs provider asks
    /// the device, `ibv_query_qp`, on every post): context for the READ latency.
    fn state_cost(&self, iters: usize) -> f64 {
        let mut samples: Vec<f64> = (0..iters)
            .map(|_| {
                let started = Instant::now();
                std::hint::black_box(self.qp.state());
                started.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        median(&mut samples)
    }

    /// GB/s (10^9 bytes) of `iters` 1 MiB WRITEs with `WINDOW` outstanding.
    fn write_bandwidth(&self, iters: usize) -> f64 {
        let mut out = [WorkCompletion::EMPTY; WINDOW];
        let mut run = |iters: usize| {
            let mut posted = 0;
            let mut done = 0;
            while posted < iters.min(WINDOW) {
                self.post(true, posted, BLOCK);
                posted += 1;
            }
            while done < iters {
                let count = self.wait(&mut out);
                done += count;
                for completion in &out[..count] {
                    assert_eq!(completion.opcode, WcOpcode::Write);
                    if posted < iters {
                        self.post(true, completion.wr_id as usize, BLOCK);
                        posted += 1;
                    }
                }
            }
        };
        run(WINDOW);
        let started = Instant::now();
        run(iters);
        (iters * BLOCK) as f64 / started.elapsed().as_secs_f64() / 1e9
    }
}

fn verbs_config() -> VerbsConfig {
    VerbsConfig {
        device: std::env::var("KVCM_VERBS_DEVICE").ok(),
        port: 1,
        gid_index: env_usize("KVCM_VERBS_GID_INDEX", 0) as u8,
    }
}

fn verbs_pair(len: usize) -> Pair<VerbsDomain> {
    let open = || VerbsDomain::open(&verbs_config()).expect("open verbs domain");
    Pair::new(open(), open(), len, Polling::Spin)
}

fn soft_pair(wire: Wire, len: usize) -> Pair<SoftDomain> {
    let idle = IdlePolicy {
        spin: Duration::from_millis(5),
        ..IdlePolicy::default()
    };
    let open = || SoftDomain::open(SoftConfig::with_wire(wire).with_idle(idle)).expect("domain");
    Pair::new(open(), open(), len, Polling::Yield)
}

/// p50 of one clock read (`Instant::now`) in microseconds: every latency sample holds one.
fn clock_cost(iters: usize) -> f64 {
    let stamps: Vec<Instant> = (0..=iters).map(|_| Instant::now()).collect();
    let mut samples: Vec<f64> = stamps
        .windows(2)
        .map(|pair| (pair[1] - pair[0]).as_secs_f64() * 1e6)
        .collect();
    median(&mut samples)
}

/// perftest's figures: one server in the background, one client, on the same device.
struct Perftest {
    device: String,
    gid_index: String,
    port: u16,
}

impl Perftest {
    fn available() -> bool {
        Command::new("ib_read_lat")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok()
    }

    /// Runs `tool` with `args` as server and client; returns the client's data row
    /// and its column header.
    fn run(&mut self, tool: &str, args: &[&str]) -> Option<(String, Vec<f64>)> {
        self.port += 1;
        let common: Vec<String> = [
            "-d",
            &self.device,
            "-x",
            &self.gid_index,
            "-p",
            &self.port.to_string(),
            "-F",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(args.iter().map(|s| s.to_string()))
        .collect();
        let mut server = spawn(Command::new(tool).args(&common))?;
        if !wait_listening(self.port, Duration::from_secs(20)) {
            eprintln!(
                "perftest: {tool} server never listened on port {}",
                self.port
            );
            let _ = server.kill();
            return None;
        }
        let client = Command::new(tool).args(&common).arg("127.0.0.1").output();
        let Ok(client) = client else {
            let _ = server.kill();
            let _ = server.wait();
            return None;
        };
        if !client.status.success() {
            let _ = server.kill();
        }
        let _ = server.wait();
        let text = String::from_utf8_lossy(&client.stdout).into_owned();
        if !client.status.success() {
            eprintln!(
                "perftest: {tool} client failed ({}):\n{text}{}",
                client.status,
                String::from_utf8_lossy(&client.stderr)
            );
            return None;
        }
        let mut lines = text
            .lines()
            .skip_while(|line| !line.trim_start().starts_with("#bytes"));
        let header = lines.next()?.to_string();
        let row = lines
            .map(|line| {
                line.split_whitespace()
                    .map_while(|word| word.parse::<f64>().ok())
                    .collect::<Vec<f64>>()
            })
            .find(|numbers| numbers.len() >= 4)?;
        Some((header, row))
    }

    /// `t_typical` and the 99 % percentile of `ib_read_lat`, in microseconds.
    fn read_latency(&mut self, iters: usize) -> Option<(f64, f64)> {
        let iters = iters.to_string();
        let (header, row) = self.run("ib_read_lat", &["-s", "64", "-n", &iters])?;
        // #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%
        (header.contains("t_typical") && row.len() >= 8).then(|| (row[4], row[7]))
    }

    /// Average bandwidth of `ib_write_bw` in GB/s (10^9 bytes).
    fn write_bandwidth(&mut self, iters: usize) -> Option<f64> {
        let (iters, window) = (iters.to_string(), WINDOW.to_string());
        let (header, row) = self.run(
            "ib_write_bw",
            &[
                "-s",
                &BLOCK.to_string(),
                "-n",
                &iters,
                "-t",
                &window,
                "--report_gbits",
            ],
        )?;
        // #bytes #iterations BW peak[Gb/sec] BW average[Gb/sec] MsgRate[Mpps]
        (header.contains("Gb/sec") && row.len() >= 4).then(|| row[3] / 8.0)
    }
}

fn spawn(command: &mut Command) -> Option<Child> {
    command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|err| eprintln!("perftest: cannot start {command:?}: {err}"))
        .ok()
}

/// Whether a TCP socket listens on `port` (from /proc/net/tcp and tcp6) before `deadline`.
fn wait_listening(port: u16, within: Duration) -> bool {
    let needle = format!(":{port:04X} ");
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
            let text = std::fs::read_to_string(table).unwrap_or_default();
            let listening = text.lines().skip(1).any(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                fields.len() > 3 && fields[1].ends_with(needle.trim_end()) && fields[3] == "0A"
            });
            if listening {
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn ratio(ours: f64, theirs: Option<f64>) -> String {
    theirs.map_or("—".into(), |theirs| format!("{:.2}", ours / theirs))
}

fn figure(value: Option<f64>) -> String {
    value.map_or("—".into(), |value| format!("{value:.3}"))
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    // `cargo bench` passes `--bench`; this program takes no arguments.
    let iters = env_usize("KVCM_BENCH_ITERS", 10_000);
    let bw_iters = env_usize("KVCM_BENCH_BW_ITERS", 2_000);
    let rounds = env_usize("KVCM_BENCH_ROUNDS", 3).max(1);
    let config = verbs_config();
    let device = match VerbsDomain::open(&config) {
        Ok(domain) => domain.device_name().to_string(),
        Err(err) => {
            println!("SKIPPED verbs benchmark: no usable RDMA device ({err})");
            return;
        }
    };
    if let Some(reads) = std::env::var("KVCM_BENCH_PROFILE_READS")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
    {
        // Only the verbs READs, for a profiler or `strace -c` around this process.
        let (p50, p99) = verbs_pair(LATENCY_BYTES).read_latency(reads);
        println!("verbs 64 B READ x {reads}: p50 {p50:.2} us, p99 {p99:.2} us");
        return;
    }
    let mut perftest = Perftest::available().then(|| Perftest {
        device: device.clone(),
        gid_index: config.gid_index.to_string(),
        port: PERFTEST_PORT,
    });
    if perftest.is_none() {
        println!("perftest (ib_read_lat) not found in PATH: no reference figures");
    }
    println!(
        "=== verbs on {device} (GID index {}) vs perftest; 64 B READ x {iters}, \
         1 MiB WRITE x {bw_iters} window {WINDOW} ===",
        config.gid_index
    );
    println!(
        "{:<6} {:>28} {:>28} {:>10} | {:>12} {:>12} {:>10}",
        "round",
        "READ p50/p99 verbs [us]",
        "ib_read_lat typ/p99 [us]",
        "p50/typ",
        "WRITE verbs",
        "ib_write_bw",
        "verbs/pt"
    );
    let (mut latency_ratios, mut bandwidth_ratios) = (Vec::new(), Vec::new());
    let mut state_costs = Vec::new();
    for round in 1..=rounds {
        let theirs_lat = perftest.as_mut().and_then(|p| p.read_latency(iters));
        let latency_pair = verbs_pair(LATENCY_BYTES);
        let ours_lat = latency_pair.read_latency(iters);
        state_costs.push(latency_pair.state_cost(iters));
        drop(latency_pair);
        let theirs_bw = perftest.as_mut().and_then(|p| p.write_bandwidth(bw_iters));
        let ours_bw = verbs_pair(WINDOW * BLOCK).write_bandwidth(bw_iters);
        if let Some((typical, _)) = theirs_lat {
            latency_ratios.push(ours_lat.0 / typical);
        }
        if let Some(theirs) = theirs_bw {
            bandwidth_ratios.push(ours_bw / theirs);
        }
        println!(
            "{round:<6} {:>28} {:>28} {:>10} | {:>7.3} GB/s {:>7} GB/s {:>10}",
            format!("{:.2} / {:.2}", ours_lat.0, ours_lat.1),
            theirs_lat.map_or("—".into(), |(t, p)| format!("{t:.2} / {p:.2}")),
            ratio(ours_lat.0, theirs_lat.map(|(t, _)| t)),
            ours_bw,
            figure(theirs_bw),
            ratio(ours_bw, theirs_bw),
        );
    }
    if !latency_ratios.is_empty() {
        let latency = median(&mut latency_ratios);
        println!(
            "target: verbs 64 B READ p50 <= 1.3x ib_read_lat t_typical: median ratio {latency:.2}x -> {}",
            if latency <= 1.3 { "MET" } else { "NOT MET" }
        );
    }
    println!(
        "context: QueuePair::state() (ibv_query_qp; posts no longer call it) p50 {:.2} us",
        median(&mut state_costs)
    );
    let clocksource =
        std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .unwrap_or_default();
    println!(
        "context: one clock read (Instant::now, clocksource {}) p50 {:.2} us",
        clocksource.trim(),
        clock_cost(iters)
    );
    if !bandwidth_ratios.is_empty() {
        let bandwidth = median(&mut bandwidth_ratios);
        println!(
            "target: verbs 1 MiB WRITE >= 70% of ib_write_bw: median {:.0}% -> {}",
            bandwidth * 100.0,
            if bandwidth >= 0.7 { "MET" } else { "NOT MET" }
        );
    }
    println!("=== soft provider, same machine (yielding between empty polls) ===");
    for wire in [Wire::Tcp, Wire::Shm] {
        let (p50, p99) = soft_pair(wire, LATENCY_BYTES).read_latency(iters);
        let gbs = soft_pair(wire, WINDOW * BLOCK).write_bandwidth(bw_iters);
        println!(
            "soft-{:<4} 64 B READ p50 {p50:8.2} us  p99 {p99:8.2} us | 1 MiB WRITE {gbs:7.3} GB/s",
            format!("{wire:?}").to_lowercase()
        );
    }
}
