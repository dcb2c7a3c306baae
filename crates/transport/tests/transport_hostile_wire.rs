//! A hostile or broken peer on the soft-TCP wire, speaking raw bytes to a NIC: one that
//! never reads, huge length headers, wrong-length and unsolicited responses, shared-memory
//! only requests, second hellos, hello floods, early hellos, addresses near `u64::MAX`. Each case checks
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

/// A raw connection to the NIC of `side`, bound to its queue pair by a hello. The queue
/// pair is first connected to a listener that never answers (kept open in the result):
/// only a connected queue pair takes an inbound link.
fn raw_link(side: &Side<SoftDomain>) -> (TcpStream, std::net::TcpListener) {
    use kvcm_transport::QpEndpoint;
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let text = format!(
        "soft-tcp qpn=1 addr={} token=0",
        silent.local_addr().unwrap()
    );
    side.qp.connect(&QpEndpoint(text.into_bytes())).unwrap();
    let addr = side.domain.listen_addr().expect("TCP wire");
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.write_all(&hello(side)).unwrap();
    (stream, silent)
}

/// The hello for `side`'s queue pair, with the token from its endpoint.
fn hello(side: &Side<SoftDomain>) -> Vec<u8> {
    let endpoint = String::from_utf8(side.qp.endpoint().0).unwrap();
    let token = endpoint
        .split_whitespace()
        .find_map(|word| word.strip_prefix("token="))
        .expect("token in the endpoint");
    let token = u64::from_str_radix(token, 16).unwrap();
    [
        b"KVTP".as_slice(),
        &side.qp.qpn().to_le_bytes(),
        &token.to_le_bytes(),
    ]
    .concat()
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
    let (mut stream, _silent) = raw_link(&side);
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

const WRITE: u8 = 2;

/// Reads one 16-byte response header, or `None` if the link closed first.
fn try_response(stream: &mut TcpStream) -> Option<(u8, u32)> {
    use std::io::Read;
    stream
        .set_read_timeout(Some(conformance::DEADLINE))
        .unwrap();
    let mut header = [0u8; 16];
    stream.read_exact(&mut header).ok()?;
    Some((
        header[0],
        u32::from_le_bytes(header[4..8].try_into().unwrap()),
    ))
}

/// Reads one 16-byte response header (status code, payload length) within the deadline.
fn response(stream: &mut TcpStream) -> (u8, u32) {
    try_response(stream).expect("a response")
}

/// Peak resident memory of this process, in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .expect("VmHWM");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_huge_write_with_immediate_is_never_buffered_whole() {
    let (domain, _) = open_tcp();
    let side = Side::new(domain, 4096, QpConfig::default());
    let before = peak_rss_kib();
    let (mut stream, _silent) = raw_link(&side);
    // 256 MiB to an unknown rkey: read and dropped as it arrives, then refused.
    let len = 256 << 20;
    stream
        .write_all(&request(WRITE, Some(7), len, 0, 0xdead))
        .unwrap();
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..len >> 20 {
        stream.write_all(&zeros).unwrap();
    }
    let (status, payload) = response(&mut stream);
    assert_eq!((status, payload), (3, 0), "RemoteAccessError, no payload");
    let grown = peak_rss_kib().saturating_sub(before);
    assert!(grown < 128 * 1024, "peak memory grew by {grown} KiB");
}

#[test]
fn a_large_write_with_immediate_lands_in_place_and_consumes_a_receive() {
    use kvcm_transport::{SendOp, WcOpcode, WcStatus};
    let len = 256 * 1024;
    let pair = conformance::Pair::new(&|| open_tcp().0, len);
    let data = conformance::pattern(len, 5);
    pair.a.fill(0, &data);
    pair.b.post_recv(10, &[pair.b.sge(0, 8)]);
    let remote = pair.b.region.remote(0);
    let op = SendOp::Write {
        remote,
        imm: Some(0xabcd),
    };
    pair.a.post(1, op, &[pair.a.sge(0, len as u32)]);
    let sent = conformance::completions(&pair.a.send_cq, 1);
    assert_eq!(sent[0].status, WcStatus::Success);
    let got = conformance::completions(&pair.b.recv_cq, 1);
    assert_eq!(
        (
            got[0].wr_id,
            got[0].status,
            got[0].opcode,
            got[0].byte_len,
            got[0].imm
        ),
        (
            10,
            WcStatus::Success,
            WcOpcode::RecvRdmaWithImm,
            len as u32,
            Some(0xabcd)
        )
    );
    assert_eq!(pair.b.bytes(0, len), data);
}

/// Resident memory of this process now, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_peer_streaming_reads_it_never_reads_back_gets_backpressure() {
    let (domain, _) = open_tcp();
    let side = Side::new(domain, 64 * 1024, QpConfig::default());
    let remote = side.region.remote(0);
    let before = rss_kib();
    let (mut stream, _silent) = raw_link(&side);
    // 4000 buffered (copied) READs of 60 KiB: 160 KB asking for 240 MB of answers.
    let reads: Vec<u8> = (0..4000)
        .flat_map(|_| request(READ, None, 60 * 1024, remote.addr, remote.rkey))
        .collect();
    stream
        .set_write_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    // The NIC may stop reading before all of it is in: a timed-out write is expected.
    let _ = stream.write_all(&reads);
    // Give an unbounded NIC time to copy them all (a measurement window, not a wait).
    std::thread::sleep(Duration::from_millis(500));
    let grown = rss_kib().saturating_sub(before);
    assert!(grown < 64 * 1024, "resident memory grew by {grown} KiB");
    drop(stream);
}

/// A queue pair of a fresh domain connected to a scripted peer (a plain TCP socket that
/// has read the hello; `extra`: more fields of its endpoint); returns both.
fn scripted_peer(extra: &str) -> (Side<SoftDomain>, TcpStream) {
    use kvcm_transport::QpEndpoint;
    use std::io::Read;
    let side = Side::new(open_tcp().0, 4096, QpConfig::default());
    let scripted = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let text = format!(
        "soft-tcp qpn=1 addr={} token=0{extra}",
        scripted.local_addr().unwrap()
    );
    side.qp.connect(&QpEndpoint(text.into_bytes())).unwrap();
    let (mut peer, _) = scripted.accept().unwrap();
    peer.read_exact(&mut [0u8; 16]).unwrap();
    (side, peer)
}

/// A success response header with `len` payload bytes.
fn success(len: u32) -> Vec<u8> {
    let mut out = vec![0u8; 16];
    out[4..8].copy_from_slice(&len.to_le_bytes());
    out
}

#[test]
fn a_read_answered_with_the_wrong_length_fails_and_leaves_memory_alone() {
    use kvcm_transport::{RemoteAddr, SendOp, WcStatus};
    use std::io::Read;
    let (side, mut peer) = scripted_peer("");
    side.fill(0, b"untouched bytes");
    let remote = RemoteAddr { addr: 0, rkey: 1 };
    side.post(1, SendOp::Read(remote), &[side.sge(0, 15)]);
    peer.read_exact(&mut [0u8; 40]).unwrap();
    let mut short = success(5);
    short.extend_from_slice(b"short");
    peer.write_all(&short).unwrap();
    let done = conformance::completions(&side.send_cq, 1);
    assert_eq!(
        (done[0].wr_id, done[0].status),
        (1, WcStatus::RemoteInvalidRequest)
    );
    assert_eq!(side.bytes(0, 15), b"untouched bytes");
    assert_eq!(side.qp.state(), kvcm_transport::QpState::Error);
}

#[test]
fn an_unsolicited_response_breaks_the_link() {
    use kvcm_transport::QpState;
    let (side, mut peer) = scripted_peer("");
    peer.write_all(&success(0)).unwrap();
    conformance::eventually("the queue pair to break", || {
        side.qp.state() == QpState::Error
    });
}

#[test]
fn an_immediate_notification_on_tcp_is_refused_and_consumes_no_receive() {
    use kvcm_transport::CompletionQueue;
    let (domain, _) = open_tcp();
    let side = Side::new(domain, 4096, QpConfig::default());
    side.post_recv(3, &[side.sge(0, 8)]);
    let (mut stream, _silent) = raw_link(&side);
    // Op 6: "the data of a WRITE with immediate is already in place" (shared memory only).
    stream.write_all(&request(6, Some(9), 8, 0, 0)).unwrap();
    let (status, len) = response(&mut stream);
    assert_eq!((status, len), (4, 0), "RemoteInvalidRequest");
    let mut out = [kvcm_transport::WorkCompletion::EMPTY];
    assert_eq!(side.recv_cq.poll(&mut out), 0, "no receive consumed");
}

#[test]
fn addresses_near_the_top_of_the_address_space_are_refused_not_wrapped() {
    use kvcm_transport::{RemoteAddr, SendOp, WcStatus};
    let pair = conformance::Pair::new(&|| open_tcp().0, 4096);
    // Offsets past the region wrap instead of panicking; the NIC refuses the address.
    let wrapped = pair.b.region.remote(usize::MAX);
    pair.a.post(1, SendOp::Read(wrapped), &[pair.a.sge(0, 8)]);
    let done = conformance::completions(&pair.a.send_cq, 1);
    assert_eq!(done[0].status, WcStatus::RemoteAccessError);
    let pair = conformance::Pair::new(&|| open_tcp().0, 4096);
    let rkey = pair.b.region.rkey();
    let top = RemoteAddr {
        addr: u64::MAX - 3,
        rkey,
    };
    pair.a.post(2, SendOp::Read(top), &[pair.a.sge(0, 8)]);
    let done = conformance::completions(&pair.a.send_cq, 1);
    assert_eq!(done[0].status, WcStatus::RemoteAccessError);
}

/// Expects the NIC to close `stream` (EOF) within the deadline.
fn closed_by_nic(stream: &mut TcpStream) {
    use std::io::Read;
    stream
        .set_read_timeout(Some(conformance::DEADLINE))
        .unwrap();
    let mut sink = [0u8; 64];
    // Bytes the NIC never read turn its close into a reset.
    match stream.read(&mut sink) {
        Ok(got) => assert_eq!(got, 0, "NIC closed the link"),
        Err(e) => assert_eq!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset,
            "closed, not {e}"
        ),
    }
}

#[test]
fn a_second_inbound_link_for_a_queue_pair_is_refused() {
    let (domain, _) = open_tcp();
    let side = Side::new(domain, 4096, QpConfig::default());
    let (mut first, _silent) = raw_link(&side);
    let mut second = TcpStream::connect(side.domain.listen_addr().unwrap()).unwrap();
    second.write_all(&hello(&side)).unwrap();
    closed_by_nic(&mut second);
    // The first link still works: a READ of 8 bytes is answered.
    let remote = side.region.remote(0);
    first
        .write_all(&request(READ, None, 8, remote.addr, remote.rkey))
        .unwrap();
    assert_eq!(response(&mut first), (0, 8));
}

#[test]
fn a_hello_flood_is_capped_and_served_queue_pairs_still_bind() {
    use kvcm_transport::QpEndpoint;
    let (domain, _) = open_tcp();
    let side = Side::new(domain, 4096, QpConfig::default());
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let text = format!(
        "soft-tcp qpn=1 addr={} token=0",
        silent.local_addr().unwrap()
    );
    side.qp.connect(&QpEndpoint(text.into_bytes())).unwrap();
    let addr = side.domain.listen_addr().unwrap();
    let mut flood: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    // Connections past the cap are closed at once, without a hello.
    closed_by_nic(flood.last_mut().unwrap());
    drop(flood);
    // Once the NIC has seen the flood go (a client retries while it is still full), a
    // proper hello binds and is served.
    let remote = side.region.remote(0);
    let mut opening = hello(&side);
    opening.extend(request(READ, None, 8, remote.addr, remote.rkey));
    let mut served = false;
    conformance::eventually("a hello after the flood to be served", || {
        let mut link = TcpStream::connect(addr).unwrap();
        served = link.write_all(&opening).is_ok() && try_response(&mut link) == Some((0, 8));
        served
    });
    assert!(served);
}

#[test]
fn a_hello_for_a_connecting_queue_pair_waits_without_spinning_then_is_served() {
    use kvcm_transport::QpEndpoint;
    let (domain, nic) = open_tcp();
    let side = Side::new(domain, 4096, QpConfig::default());
    let remote = side.region.remote(0);
    let mut link = TcpStream::connect(side.domain.listen_addr().unwrap()).unwrap();
    let mut opening = hello(&side);
    opening.extend(request(READ, None, 8, remote.addr, remote.rkey));
    link.write_all(&opening).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let ticks = cpu_ticks_during(nic, Duration::from_millis(500));
    assert!(
        ticks < 10,
        "a waiting hello cost the NIC {ticks} ticks in 0.5 s"
    );
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let text = format!(
        "soft-tcp qpn=1 addr={} token=0",
        silent.local_addr().unwrap()
    );
    side.qp.connect(&QpEndpoint(text.into_bytes())).unwrap();
    assert_eq!(response(&mut link), (0, 8), "served once connected");
}

/// A region of `len` bytes, all `fill`, registered in `side`'s protection domain with
/// remote read and write rights (beside the side's own region), and its memory.
fn remote_region(
    side: &Side<SoftDomain>,
    len: usize,
    fill: u8,
) -> (kvcm_transport::HostMemory, kvcm_transport::soft::SoftRegion) {
    use kvcm_transport::{Access, Domain, Memory};
    let memory = side.domain.alloc(len).expect("alloc");
    memory.write(0, &vec![fill; len]).expect("fill");
    let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let region = side
        .domain
        .register(&memory, 0, len, access)
        .expect("register");
    (memory, region)
}

/// What a withdrawal test keeps: a raw peer that asked for one operation over the whole
/// of a fresh region (its side and the silent listener kept alive), the region to withdraw
/// and its memory.
struct Started {
    _side: Side<SoftDomain>,
    memory: kvcm_transport::HostMemory,
    region: kvcm_transport::soft::SoftRegion,
    stream: TcpStream,
    _silent: std::net::TcpListener,
}

/// A raw peer's request `op` over the whole of a fresh region of `len` bytes, all `fill`.
fn started(op: u8, len: usize, fill: u8) -> Started {
    let (domain, _) = open_tcp();
    let side = Side::new(domain, 4096, QpConfig::default());
    let (memory, region) = remote_region(&side, len, fill);
    let remote = region.remote(0);
    let (mut stream, silent) = raw_link(&side);
    stream
        .write_all(&request(op, None, len as u32, remote.addr, remote.rkey))
        .unwrap();
    Started {
        _side: side,
        memory,
        region,
        stream,
        _silent: silent,
    }
}

/// Drops `region` on another thread; fails the test unless the drop returns within the
/// deadline (a withdrawal waits for the NIC to fence the region off).
fn withdraw(region: kvcm_transport::soft::SoftRegion) {
    let (done, returned) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(region);
        let _ = done.send(());
    });
    returned
        .recv_timeout(conformance::DEADLINE)
        .expect("deregistration returns while a peer stalls");
}

/// Everything the NIC still sends on `stream` until it closes it (EOF or reset).
fn rest_until_closed(stream: &mut TcpStream) -> Vec<u8> {
    use std::io::Read;
    stream
        .set_read_timeout(Some(conformance::DEADLINE))
        .unwrap();
    let mut got = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got,
            Err(e) => panic!("the NIC should close the link, not: {e}"),
        }
    }
}

#[test]
fn a_read_being_answered_is_cut_off_when_its_region_is_withdrawn() {
    use kvcm_transport::Memory;
    // Far more than both socket buffers hold: most of the answer stays queued in the NIC,
    // by reference to the region's memory, while the peer reads nothing.
    let len = 32 << 20;
    let Started {
        memory,
        region,
        mut stream,
        _side,
        _silent,
    } = started(READ, len, 0x11);
    assert_eq!(response(&mut stream), (0, len as u32), "the answer started");
    withdraw(region);
    // The memory's next owner (another protection domain, say) writes its own bytes.
    memory.write(0, &vec![0xbb; len]).unwrap();
    let rest = rest_until_closed(&mut stream);
    assert!(
        rest.len() < len,
        "the answer was cut short, not sent whole ({} bytes)",
        rest.len()
    );
    let leaked = rest.iter().filter(|&&byte| byte != 0x11).count();
    assert_eq!(
        leaked, 0,
        "bytes written after the withdrawal reached the peer"
    );
}

#[test]
fn a_write_being_placed_is_cut_off_when_its_region_is_withdrawn() {
    use kvcm_transport::Memory;
    let len = 8 << 20;
    let Started {
        memory,
        region,
        mut stream,
        _side,
        _silent,
    } = started(WRITE, len, 0);
    // The first MiB arrives and is placed; the rest waits in the peer.
    stream.write_all(&vec![0x22; 1 << 20]).unwrap();
    conformance::eventually("the first MiB placed", || {
        let mut last = [0u8; 1];
        memory.read((1 << 20) - 1, &mut last).unwrap();
        last[0] == 0x22
    });
    withdraw(region);
    // The rest comes after the withdrawal: none of it may land.
    let _ = stream.write_all(&vec![0x33; len - (1 << 20)]);
    closed_by_nic(&mut stream);
    let mut placed = vec![0u8; len];
    memory.read(0, &mut placed).unwrap();
    let late = placed.iter().filter(|&&byte| byte == 0x33).count();
    assert_eq!(
        late, 0,
        "bytes sent after the withdrawal landed in its memory"
    );
    assert!(placed[..1 << 20].iter().all(|&byte| byte == 0x22));
}

const READ_LIST: u8 = 7;

/// A READ list frame (see `soft/frame.rs`): a header whose operand counts the entries,
/// then 16-byte entries of address, key and length.
fn read_list(entries: &[(u64, u32, u32)]) -> Vec<u8> {
    let total = entries.iter().map(|&(_, _, len)| len).sum();
    let mut out = request(READ_LIST, None, total, 0, 0);
    out[24..32].copy_from_slice(&(entries.len() as u64).to_le_bytes());
    for &(addr, rkey, len) in entries {
        out.extend_from_slice(&addr.to_le_bytes());
        out.extend_from_slice(&rkey.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
    }
    out
}

/// One response read whole: status code, entries answered, payload.
fn list_response(stream: &mut TcpStream) -> (u8, u64, Vec<u8>) {
    use std::io::Read;
    let mut header = [0u8; 16];
    stream.read_exact(&mut header).expect("a response");
    let len = u32::from_le_bytes(header[4..8].try_into().unwrap());
    let mut payload = vec![0u8; len as usize];
    stream.read_exact(&mut payload).expect("its payload");
    let answered = u64::from_le_bytes(header[8..].try_into().unwrap());
    (header[0], answered, payload)
}

const REMOTE_ACCESS_ERROR: u8 = 3;

#[test]
fn a_read_list_is_answered_in_order_up_to_its_first_refused_entry() {
    let (domain, _) = open_tcp();
    let side = Side::new(domain, 4096, QpConfig::default());
    let bytes = conformance::pattern(4096, 3);
    side.fill(0, &bytes);
    let (base, rkey) = (side.region.remote(0).addr, side.region.rkey());
    let (mut stream, _silent) = raw_link(&side);
    stream
        .write_all(&read_list(&[(base, rkey, 64), (base + 1000, rkey, 24)]))
        .unwrap();
    let whole = [&bytes[..64], &bytes[1000..1024]].concat();
    assert_eq!(list_response(&mut stream), (0, 2, whole));
    // A bad key third: the two before it are answered, with the third's status; the one
    // after it is not.
    let entries = [
        (base + 64, rkey, 32),
        (base + 128, rkey, 32),
        (base, 0xdead, 32),
        (base, rkey, 32),
    ];
    stream.write_all(&read_list(&entries)).unwrap();
    let answered = bytes[64..96].iter().chain(&bytes[128..160]).copied();
    let expected = (REMOTE_ACCESS_ERROR, 2, answered.collect());
    assert_eq!(list_response(&mut stream), expected);
    // Past the region's end first: nothing answered.
    let past = read_list(&[(base + 4090, rkey, 64), (base, rkey, 8)]);
    stream.write_all(&past).unwrap();
    assert_eq!(
        list_response(&mut stream),
        (REMOTE_ACCESS_ERROR, 0, Vec::new())
    );
    // Entries that do not add up to the length the header asks for: a malformed frame.
    let mut bad = read_list(&[(base, rkey, 64), (base + 64, rkey, 64)]);
    bad[4..8].copy_from_slice(&100u32.to_le_bytes());
    stream.write_all(&bad).unwrap();
    closed_by_nic(&mut stream);
}

/// Posts four signaled READs of 64, 32, 16 and 8 bytes in one call (remote addresses
/// 0x1000, 0x1100, …, key 77; local offsets 0, 128, 256, 384).
fn post_four_reads(side: &Side<SoftDomain>) {
    use kvcm_transport::{RemoteAddr, SendOp, SendWr};
    let lens = [64u32, 32, 16, 8];
    let sges: Vec<_> = (0..4).map(|i| side.sge(i * 128, lens[i])).collect();
    let wrs: Vec<SendWr> = (0..4)
        .map(|i| SendWr {
            wr_id: i as u64,
            op: SendOp::Read(RemoteAddr {
                addr: 0x1000 + 0x100 * i as u64,
                rkey: 77,
            }),
            sg_list: &sges[i..=i],
            signaled: true,
        })
        .collect();
    side.qp.post_send(&wrs).unwrap();
}

#[test]
fn small_reads_posted_together_go_out_as_one_list_and_still_complete_one_by_one() {
    use kvcm_transport::WcStatus;
    use std::io::Read;
    let (side, mut peer) = scripted_peer(" lists=1");
    post_four_reads(&side);
    let mut frame = [0u8; 40 + 4 * 16];
    peer.read_exact(&mut frame).unwrap();
    let expected: Vec<(u64, u32, u32)> = [64, 32, 16, 8]
        .into_iter()
        .enumerate()
        .map(|(i, len)| (0x1000 + 0x100 * i as u64, 77, len))
        .collect();
    assert_eq!(
        frame.to_vec(),
        read_list(&expected),
        "one list of four READs"
    );
    // The peer answers the first two and refuses the third.
    let data = conformance::pattern(96, 9);
    let mut answer = vec![REMOTE_ACCESS_ERROR, 0, 0, 0];
    answer.extend_from_slice(&96u32.to_le_bytes());
    answer.extend_from_slice(&2u64.to_le_bytes());
    answer.extend_from_slice(&data);
    peer.write_all(&answer).unwrap();
    let done = conformance::completions(&side.send_cq, 4);
    let outcomes: Vec<_> = done.iter().map(|wc| (wc.wr_id, wc.status)).collect();
    let failed = [WcStatus::RemoteAccessError, WcStatus::WrFlushError];
    assert_eq!(
        outcomes,
        [
            (0, WcStatus::Success),
            (1, WcStatus::Success),
            (2, failed[0]),
            (3, failed[1])
        ]
    );
    assert_eq!((done[0].byte_len, done[1].byte_len), (64, 32));
    assert_eq!(side.bytes(0, 64), data[..64]);
    assert_eq!(side.bytes(128, 32), data[64..]);
}

#[test]
fn a_list_carries_at_most_256_reads_and_the_rest_follow_in_the_next() {
    use kvcm_transport::{RemoteAddr, SendOp, SendWr, WcStatus};
    use std::io::Read;
    let (side, mut peer) = scripted_peer(" lists=1");
    let sges: Vec<_> = (0..300).map(|i| side.sge(i * 8, 8)).collect();
    let wrs: Vec<SendWr> = (0..300)
        .map(|i| SendWr {
            wr_id: i as u64,
            op: SendOp::Read(RemoteAddr {
                addr: 8 * i as u64,
                rkey: 5,
            }),
            sg_list: &sges[i..=i],
            signaled: i == 299,
        })
        .collect();
    side.qp.post_send(&wrs).unwrap();
    for (entries, first) in [(256usize, 0u64), (44, 256)] {
        let mut frame = vec![0u8; 40 + 16 * entries];
        peer.read_exact(&mut frame).unwrap();
        let expected: Vec<(u64, u32, u32)> = (0..entries as u64)
            .map(|i| (8 * (first + i), 5, 8))
            .collect();
        assert_eq!(frame, read_list(&expected), "a list of {entries}");
        // Every READ answered: the count of entries in the header's value, then the bytes.
        let mut answer = success(8 * entries as u32);
        answer[8..].copy_from_slice(&(entries as u64).to_le_bytes());
        answer.resize(16 + 8 * entries, 0xAB);
        peer.write_all(&answer).unwrap();
    }
    let done = conformance::completions(&side.send_cq, 1);
    assert_eq!((done[0].wr_id, done[0].status), (299, WcStatus::Success));
}

#[test]
fn a_peer_that_takes_no_lists_gets_one_frame_per_read() {
    use std::io::Read;
    let (side, mut peer) = scripted_peer("");
    post_four_reads(&side);
    let mut frames = [0u8; 4 * 40];
    peer.read_exact(&mut frames).unwrap();
    for (i, len) in [64, 32, 16, 8].into_iter().enumerate() {
        let expected = request(READ, None, len, 0x1000 + 0x100 * i as u64, 77);
        assert_eq!(frames[i * 40..][..40], expected, "READ {i}");
    }
    for len in [64, 32, 16, 8] {
        peer.write_all(&success(len)).unwrap();
        peer.write_all(&vec![1u8; len as usize]).unwrap();
    }
    let done = conformance::completions(&side.send_cq, 4);
    assert!(done
        .iter()
        .all(|wc| wc.status == kvcm_transport::WcStatus::Success));
    assert_eq!(side.bytes(384, 8), [1u8; 8]);
}

#[test]
fn a_list_answer_that_claims_more_entries_or_bytes_than_asked_breaks_the_link() {
    use kvcm_transport::WcStatus;
    use std::io::Read;
    // (status, entries answered, payload bytes) for a list of four READs of 120 bytes.
    for (status, answered, len) in [(0u8, 5u64, 120u32), (0, 3, 112), (0, 4, 100), (3, 4, 120)] {
        let (side, mut peer) = scripted_peer(" lists=1");
        side.fill(0, &[0xEE; 64]);
        post_four_reads(&side);
        peer.read_exact(&mut [0u8; 40 + 4 * 16]).unwrap();
        let mut answer = vec![status, 0, 0, 0];
        answer.extend_from_slice(&len.to_le_bytes());
        answer.extend_from_slice(&answered.to_le_bytes());
        answer.extend_from_slice(&vec![1u8; len as usize]);
        peer.write_all(&answer).unwrap();
        let done = conformance::completions(&side.send_cq, 4);
        assert_eq!(
            (done[0].wr_id, done[0].status),
            (0, WcStatus::RemoteInvalidRequest),
            "{status} {answered} {len}"
        );
        assert_eq!(side.bytes(0, 64), [0xEE; 64], "memory left alone");
    }
}

#[test]
fn silent_connections_make_room_for_a_peer_that_sends_its_hello() {
    use std::io::Read;
    let (domain, _) = open_tcp();
    let side = Side::new(domain, 4096, QpConfig::default());
    let remote = side.region.remote(0);
    let addr = side.domain.listen_addr().expect("TCP wire");
    // More silent connections than the NIC keeps waiting for a hello (256).
    let silent: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    let (mut stream, _listener) = raw_link(&side);
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(&request(READ, None, 8, remote.addr, remote.rkey))
        .unwrap();
    let mut answer = [0u8; 16 + 8];
    stream
        .read_exact(&mut answer)
        .expect("a READ answered on the link bound after 300 silent connections");
    assert_eq!(answer[..16], success(8), "a success header: {answer:?}");
    // The oldest silent connections were closed to make room (before their own 2 s).
    let mut first = &silent[0];
    first
        .set_read_timeout(Some(Duration::from_millis(1500)))
        .unwrap();
    let closed = match first.read(&mut [0u8; 1]) {
        Ok(0) => true,
        Err(error) => error.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(_) => false,
    };
    assert!(
        closed,
        "the oldest silent connection was closed to make room"
    );
}
