//! A peer in another process: the test binary re-executes one of its own (ignored) tests
//! with [`ROLE_ENV`] set, and that test serves as the far side until it is killed.

use super::*;
use kvcm_transport::{exchange_endpoints, QpEndpoint, RemoteAddr};
use std::io::{BufRead, BufReader, Read};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};

/// Selects the peer role ("tcp" / "shm") in the re-executed test binary.
pub const ROLE_ENV: &str = "KVCM_TRANSPORT_PEER";
/// Address the peer binds (its NIC and the out-of-band listener). Default 127.0.0.1.
pub const BIND_ENV: &str = "KVCM_TRANSPORT_PEER_BIND";
/// Bytes of the peer's region.
pub const PEER_LEN: usize = 16 << 20;

/// Serves as a peer if [`ROLE_ENV`] is set: opens a domain with `open(role, bind)`, fills
/// its region with `pattern(PEER_LEN, 42)`, connects one queue pair over an out-of-band
/// TCP exchange and then waits until the parent closes the connection (or kills it).
pub fn serve_if_peer<D: Domain>(open: impl Fn(&str, IpAddr) -> D) {
    let Ok(role) = std::env::var(ROLE_ENV) else {
        return;
    };
    let bind: IpAddr = std::env::var(BIND_ENV)
        .map_or(Ok([127, 0, 0, 1].into()), |b| b.parse())
        .expect("bind address");
    let side = Side::new(open(&role, bind), PEER_LEN, QpConfig::default());
    side.fill(0, &pattern(PEER_LEN, 42));
    let listener = TcpListener::bind((bind, 0)).expect("out-of-band listener");
    println!("PEER_PORT {}", listener.local_addr().unwrap().port());
    let (mut stream, _) = listener.accept().expect("parent connects");
    let remote = exchange_endpoints(&mut stream, &side.qp.endpoint()).expect("exchange");
    side.qp.connect(&remote).expect("connect to parent");
    let target = side.region.remote(0);
    let region = QpEndpoint(format!("{} {}", target.addr, target.rkey).into_bytes());
    exchange_endpoints(&mut stream, &region).expect("send region");
    let _ = stream.read(&mut [0u8; 1]);
}

/// A running peer process, connected to `side`.
pub struct PeerProcess {
    pub child: Child,
    pub control: TcpStream,
    /// Byte 0 of the peer's region.
    pub remote: RemoteAddr,
}

impl PeerProcess {
    /// Starts the peer (`wrapper` prefixes the command, e.g. `ip netns exec ns`) and
    /// connects `side`'s queue pair to it.
    pub fn spawn<D: Domain>(side: &Side<D>, role: &str, bind: IpAddr, wrapper: &[&str]) -> Self {
        let exe = std::env::current_exe().expect("test binary path");
        let mut argv: Vec<String> = wrapper.iter().map(|s| s.to_string()).collect();
        argv.push(exe.display().to_string());
        argv.extend(
            ["peer_process_entry", "--exact", "--ignored", "--nocapture"].map(String::from),
        );
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .env(ROLE_ENV, role)
            .env(BIND_ENV, bind.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn peer process");
        let port = read_port(&mut child);
        let mut control = TcpStream::connect((bind, port)).expect("connect to peer");
        let endpoint = exchange_endpoints(&mut control, &side.qp.endpoint()).expect("exchange");
        side.qp.connect(&endpoint).expect("connect to peer");
        let region = exchange_endpoints(&mut control, &QpEndpoint(Vec::new())).expect("region");
        let text = String::from_utf8(region.0).expect("utf8");
        let (addr, rkey) = text.split_once(' ').expect("addr rkey");
        let remote = RemoteAddr {
            addr: addr.parse().unwrap(),
            rkey: rkey.parse().unwrap(),
        };
        PeerProcess {
            child,
            control,
            remote,
        }
    }

    /// SIGKILLs the peer and reaps it.
    pub fn kill(mut self) {
        self.child.kill().expect("SIGKILL peer");
        self.child.wait().expect("reap peer");
    }
}

fn read_port(child: &mut Child) -> u16 {
    let stdout = child.stdout.take().expect("piped stdout");
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("peer stdout");
        if let Some(port) = line.strip_prefix("PEER_PORT ") {
            return port.trim().parse().expect("port");
        }
    }
    panic!("peer exited without announcing its port");
}

/// The SIGKILL case: READs race the peer's death; all complete (data intact or an
/// error), the queue pair breaks, later posts are refused, nothing hangs.
pub fn peer_sigkill_fails_in_flight<D: Domain>(side: &Side<D>, peer: PeerProcess) {
    let remote = peer.remote;
    side.post(0, SendOp::Read(remote), &[side.sge(0, 4096)]);
    let first = completions(&side.send_cq, 1);
    assert_eq!(
        first[0].status,
        kvcm_transport::WcStatus::Success,
        "peer serves before the kill"
    );
    assert_eq!(side.bytes(0, 4096), pattern(PEER_LEN, 42)[..4096]);
    let sges: Vec<Sge> = (0..16).map(|i| side.sge(i << 20, 1 << 20)).collect();
    let wrs: Vec<SendWr> = (0..16)
        .map(|i| SendWr {
            wr_id: 1 + i as u64,
            op: SendOp::Read(RemoteAddr {
                addr: remote.addr + (i << 20) as u64,
                rkey: remote.rkey,
            }),
            sg_list: &sges[i..=i],
            signaled: true,
        })
        .collect();
    side.qp.post_send(&wrs).unwrap();
    peer.kill();
    cases::expect_peer_gone(side, 1..17, remote);
}
