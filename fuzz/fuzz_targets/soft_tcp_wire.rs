//! A hostile peer on the soft-TCP wire (`kvcm_transport::soft`): after a valid hello, the
//! input becomes request frames sent to a queue pair's NIC over a real loopback socket.
//! Frames are built from 16-byte descriptors so that the fuzzer reaches the responder's
//! checks with real keys: each names an op byte (any value), an immediate flag, a length,
//! and a target — the open region, a read-only guard region, bytes next to the open region
//! that no region covers, or a raw address and key; a READ list (op 7) gets entries from
//! its descriptor. A first byte of 0xFF sends the rest
//! verbatim instead. After the peer half-closes, the test reads until the NIC closes the
//! link; then the guard region and the unregistered bytes must be as they were, and the
//! process must be alive (a panic on the NIC thread aborts it).
#![no_main]

use kvcm_transport::soft::{SoftConfig, SoftDomain, Wire};
use kvcm_transport::{
    Access, Domain, HostMemory, Memory, QpConfig, QpEndpoint, QueuePair, RecvWr, Region,
};
use libfuzzer_sys::fuzz_target;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::OnceLock;
use std::time::Duration;

/// Bytes of the open region, of the unregistered gap after it, of the guard region.
const OPEN: usize = 16 << 10;
const GAP: usize = 16 << 10;
const GUARD: usize = 16 << 10;
/// The guard's and the gap's bytes.
const PATTERN: u8 = 0xA5;
/// Longest wait for the NIC to close a link the peer half-closed.
const DRAIN: Duration = Duration::from_secs(2);

struct Responder {
    domain: SoftDomain,
    memory: HostMemory,
    open: <SoftDomain as Domain>::Region,
    guard: <SoftDomain as Domain>::Region,
    /// Queue pairs are connected here (see [`silent_peer`]): only a connected queue pair
    /// takes an inbound link.
    silent: SocketAddr,
}

/// A listener that accepts connections and never answers; it keeps the latest 64 open
/// (the queue pairs of older inputs are gone by then).
fn silent_peer() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("silent listener");
    let addr = listener.local_addr().expect("its address");
    std::thread::spawn(move || {
        let mut open = std::collections::VecDeque::new();
        for stream in listener.incoming().flatten() {
            if open.len() == 64 {
                open.pop_front();
            }
            open.push_back(stream);
        }
    });
    addr
}

fn responder() -> &'static Responder {
    static WIRE: OnceLock<Responder> = OnceLock::new();
    WIRE.get_or_init(|| {
        let config = SoftConfig::with_wire(Wire::Tcp).with_bind([127, 0, 0, 1].into());
        let domain = SoftDomain::open(config).expect("a soft-TCP domain");
        let memory = domain.alloc(OPEN + GAP + GUARD).expect("memory");
        let open = domain
            .register(&memory, 0, OPEN, Access::ALL)
            .expect("open region");
        let guard = domain
            .register(&memory, OPEN + GAP, GUARD, Access::REMOTE_READ)
            .expect("guard region");
        memory
            .write(OPEN, &[PATTERN; GAP + GUARD])
            .expect("pattern");
        let silent = silent_peer();
        Responder {
            domain,
            memory,
            open,
            guard,
            silent,
        }
    })
}

/// The hello binding a connection to `qp`: magic, queue pair number, token.
fn hello(qp: &impl QueuePair) -> Vec<u8> {
    let endpoint = String::from_utf8(qp.endpoint().0).expect("a text endpoint");
    let token = endpoint
        .split_whitespace()
        .find_map(|word| word.strip_prefix("token="))
        .expect("a token in the endpoint");
    let token = u64::from_str_radix(token, 16).expect("a hex token");
    [
        b"KVTP".as_slice(),
        &qp.qpn().to_le_bytes(),
        &token.to_le_bytes(),
    ]
    .concat()
}

/// The request frames one 16-byte descriptor stands for (see the module doc).
fn frame(wire: &Responder, d: &[u8; 16], out: &mut Vec<u8>) {
    let (op, imm) = (d[0], d[1] & 1 != 0);
    let len = u32::from(u16::from_le_bytes([d[2], d[3]]));
    let offset = u64::from(u32::from_le_bytes([d[4], d[5], d[6], d[7]]));
    let operand = u64::from_le_bytes(d[8..16].try_into().expect("8 bytes"));
    let (addr, rkey) = match d[1] >> 1 & 3 {
        0 => (wire.open.addr() + offset % OPEN as u64, wire.open.rkey()),
        1 => (wire.guard.addr() + offset % GUARD as u64, wire.guard.rkey()),
        2 => (
            wire.open.addr() + OPEN as u64 + offset % GAP as u64,
            wire.open.rkey(),
        ),
        _ => (operand, offset as u32),
    };
    // A READ list (op 7) counts 1–8 entries (d[15]) in its operand: READs of `len` bytes
    // at the target, `len` apart; its length is theirs in all, one more when d[14] is odd.
    let entries = 1 + u64::from(d[15] % 8);
    let (len_field, operand) = match op {
        7 => (len * entries as u32 + u32::from(d[14] & 1), entries),
        _ => (len, operand),
    };
    out.extend_from_slice(&[op, u8::from(imm), 0, 0]);
    out.extend_from_slice(&len_field.to_le_bytes());
    out.extend_from_slice(&addr.to_le_bytes());
    out.extend_from_slice(&rkey.to_le_bytes());
    out.extend_from_slice(&(operand as u32).to_le_bytes());
    out.extend_from_slice(&operand.to_le_bytes());
    out.extend_from_slice(&(!operand).to_le_bytes());
    match op {
        // WRITE and SEND carry their payload.
        2 | 3 => out.resize(out.len() + len as usize, d[15]),
        7 => {
            for entry in 0..entries {
                out.extend_from_slice(&(addr.wrapping_add(entry * u64::from(len))).to_le_bytes());
                out.extend_from_slice(&rkey.to_le_bytes());
                out.extend_from_slice(&len.to_le_bytes());
            }
        }
        _ => {}
    }
}

fn frames(wire: &Responder, input: &[u8]) -> Vec<u8> {
    if let Some(raw) = input.strip_prefix(&[0xFF]) {
        return raw.to_vec();
    }
    let mut out = Vec::new();
    for chunk in input.chunks_exact(16) {
        frame(wire, chunk.try_into().expect("16 bytes"), &mut out);
    }
    out
}

/// Sends `bytes` on a fresh link to a fresh queue pair, then half-closes and reads until
/// the NIC closes the link (or [`DRAIN`] passes).
fn exchange(wire: &Responder, bytes: &[u8]) {
    let domain = &wire.domain;
    let send_cq = domain.create_cq().expect("send cq");
    let recv_cq = domain.create_cq().expect("recv cq");
    let qp = domain
        .create_qp(&send_cq, &recv_cq, QpConfig::default())
        .expect("qp");
    let silent = format!("soft-tcp qpn=1 addr={} token=0", wire.silent);
    qp.connect(&QpEndpoint(silent.into_bytes()))
        .expect("connect");
    let sges: Vec<_> = (0..4).map(|i| wire.open.sge(i * 4096, 4096)).collect();
    let receives: Vec<RecvWr<'_>> = sges
        .iter()
        .enumerate()
        .map(|(i, sge)| RecvWr {
            wr_id: i as u64,
            sg_list: std::slice::from_ref(sge),
        })
        .collect();
    qp.post_recv(&receives).expect("receives");
    let mut stream = TcpStream::connect(domain.listen_addr().expect("TCP wire")).expect("link");
    stream.set_read_timeout(Some(DRAIN)).expect("timeout");
    // The NIC may close the link at any point of a hostile stream: errors end the send.
    let _ = stream
        .write_all(&hello(&qp))
        .and_then(|()| stream.write_all(bytes))
        .and_then(|()| stream.shutdown(Shutdown::Write));
    let mut sink = [0u8; 64 << 10];
    while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
}

fuzz_target!(|input: &[u8]| {
    let wire = responder();
    exchange(wire, &frames(wire, input));
    let mut after = vec![0u8; GAP + GUARD];
    wire.memory.read(OPEN, &mut after).expect("read back");
    assert!(
        after.iter().all(|&b| b == PATTERN),
        "a peer changed bytes of the guard region or outside every region"
    );
});
