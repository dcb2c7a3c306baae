//! A hostile or broken peer on the soft-TCP wire, speaking raw bytes to a NIC: one that
//! never reads, one that sends huge length headers, unsolicited responses. Each case checks
//! what the NIC spends (CPU of its own thread, memory of the process) or that it closes the
//! link, and that the domain keeps serving others.
//!
//! Domains are opened under one lock so that each case can find its NIC thread (the one
//! thread named `kvcm-soft-nic` that appeared while its domain was opened).

mod conformance;

use conformance::Side;
use kvcm_transport::soft::{SoftConfig, SoftDomain, Wire};
use kvcm_transport::{QpConfig, QueuePair, Region};
use std::collections::HashSet;
use std::io::Write;
use std::net::TcpStream;
use std::sync::Mutex;
use std::time::Duration;

static OPENING: Mutex<()> = Mutex::new(());

/// Thread ids of this process's soft NIC threads.
fn nic_threads() -> HashSet<u32> {
    let tasks = std::fs::read_dir("/proc/self/task").expect("list threads");
    tasks
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let comm = std::fs::read_to_string(path.join("comm")).ok()?;
            let tid = path.file_name()?.to_str()?.parse().ok()?;
            (comm.trim() == "kvcm-soft-nic").then_some(tid)
        })
        .collect()
}

/// A soft-TCP domain on 127.0.0.1 and the thread id of its NIC.
fn open_tcp() -> (SoftDomain, u32) {
    let _serial = OPENING.lock().unwrap_or_else(|e| e.into_inner());
    let before = nic_threads();
    let config = SoftConfig::with_wire(Wire::Tcp).with_bind([127, 0, 0, 1].into());
    let domain = SoftDomain::open(config).expect("open soft domain");
    // The thread names itself once it runs.
    let mut new = Vec::new();
    conformance::eventually("the NIC thread to name itself", || {
        new = nic_threads().difference(&before).copied().collect();
        !new.is_empty()
    });
    assert_eq!(new.len(), 1, "one new NIC thread: {new:?}");
    (domain, new[0])
}

/// CPU time (user + system, in clock ticks) thread `tid` has used.
fn cpu_ticks(tid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).expect("stat");
    let fields: Vec<&str> = stat[stat.rfind(')').expect("comm end") + 2..]
        .split(' ')
        .collect();
    // Fields 14 and 15 of stat(5), counted after the command name (field 2).
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// CPU ticks thread `tid` uses during `window` (a measurement window, not a wait).
fn cpu_ticks_during(tid: u32, window: Duration) -> u64 {
    let start = cpu_ticks(tid);
    std::thread::sleep(window);
    cpu_ticks(tid) - start
}

/// A raw connection to the NIC of `side`, bound to its queue pair by a hello.
fn raw_link(side: &Side<SoftDomain>) -> TcpStream {
    let addr = side.domain.listen_addr().expect("TCP wire");
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.write_all(&hello(side.qp.qpn())).unwrap();
    stream
}

fn hello(qpn: u32) -> Vec<u8> {
    [b"KVTP".as_slice(), &qpn.to_le_bytes()].concat()
}

/// A 40-byte request header (see `soft/frame.rs`).
fn request(op: u8, imm: Option<u32>, len: u32, addr: u64, rkey: u32) -> Vec<u8> {
    let mut out = vec![op, u8::from(imm.is_some()), 0, 0];
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&addr.to_le_bytes());
    out.extend_from_slice(&rkey.to_le_bytes());
    out.extend_from_slice(&imm.unwrap_or(0).to_le_bytes());
    out.extend_from_slice(&[0u8; 16]);
    out
}

const READ: u8 = 1;

#[test]
fn a_peer_that_stops_reading_does_not_keep_the_nic_spinning() {
    let (domain, nic) = open_tcp();
    let side = Side::new(domain, 1 << 20, QpConfig::default());
    let remote = side.region.remote(0);
    let mut stream = raw_link(&side);
    let reads: Vec<u8> = (0..64)
        .flat_map(|_| request(READ, None, 1 << 20, remote.addr, remote.rkey))
        .collect();
    stream.write_all(&reads).unwrap();
    // Let the NIC fill both socket buffers; from then on it can only wait.
    std::thread::sleep(Duration::from_millis(300));
    let ticks = cpu_ticks_during(nic, Duration::from_secs(1));
    assert!(
        ticks < 20,
        "a NIC whose output is blocked used {ticks} ticks of CPU in 1 s"
    );
    drop(stream);
}
