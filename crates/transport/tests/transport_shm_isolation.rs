//! The shared-memory wire between users: an owner process that is not dumpable and a peer
//! process of another, non-root user (uid/gid 65534). The peer connects a queue pair and
//! READs a region of that queue pair's protection domain; it cannot obtain the memory of
//! another protection domain from the owner's broker, cannot open any of the owner's
//! descriptors through `/proc/<owner pid>/fd/<n>`, and cannot reopen a read-only
//! descriptor it was handed as read-write.
//!
//! Both far sides are this test binary re-executed (the ignored `*_entry` tests, selected
//! by [`ROLE_ENV`]); the parent only orchestrates. Switching the peer's user needs root:
//! without it the test says loudly that it was skipped, and why.

mod conformance;

use conformance::{completions, pattern, shout};
use kvcm_transport::soft::probe::{self, Object, Refusal, Reply};
use kvcm_transport::soft::{SoftConfig, SoftDomain, Wire};
use kvcm_transport::{
    Access, Domain, Memory, QpConfig, QpEndpoint, QueuePair, Region, RemoteAddr, SendOp, WcStatus,
};
use std::io::{BufRead, BufReader, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// Selects the role ("owner" / "peer") of a re-executed test binary.
const ROLE_ENV: &str = "KVCM_SHM_ISOLATION_ROLE";
/// What the owner announced, handed to the peer.
const OWNER_ENV: &str = "KVCM_SHM_ISOLATION_OWNER";
/// The user and group the peer runs as.
const NOBODY: u32 = 65534;
/// Bytes of the owner's regions.
const LEN: usize = 64 << 10;
/// The peer's last line when every check held.
const PASSED: &str = "PEER CHECKS PASSED";

fn open_shm() -> SoftDomain {
    SoftDomain::open(SoftConfig::with_wire(Wire::Shm)).expect("open shm domain")
}

/// The effective uid of this process.
fn uid() -> u32 {
    std::fs::metadata("/proc/self")
        .expect("stat /proc/self")
        .uid()
}

/// The first directory on the way to `path` (or `path` itself) that user `NOBODY`
/// (an "other" here) cannot traverse or execute.
fn not_reachable_by_others(path: &Path) -> Option<String> {
    for ancestor in path.ancestors().skip(1) {
        let mode = std::fs::metadata(ancestor).ok()?.permissions().mode();
        if mode & 0o001 == 0 {
            return Some(format!(
                "{} is not traversable by others",
                ancestor.display()
            ));
        }
    }
    let mode = std::fs::metadata(path).ok()?.permissions().mode();
    (mode & 0o005 != 0o005)
        .then(|| format!("{} is not readable+executable by others", path.display()))
}

fn reexec(role: &str, entry: &str) -> Command {
    let exe = std::env::current_exe().expect("test binary path");
    let mut command = Command::new(exe);
    command
        .args([entry, "--exact", "--ignored", "--nocapture"])
        .env(ROLE_ENV, role);
    command
}

#[test]
fn a_peer_of_another_user_gets_only_what_its_protection_domain_may_touch() {
    let skipped = "SKIPPED a_peer_of_another_user_gets_only_what_its_protection_domain_may_touch";
    if uid() != 0 {
        shout(&format!(
            "{skipped}: it must run as root to start the peer as uid {NOBODY} (running as uid {})",
            uid()
        ));
        return;
    }
    let exe = std::env::current_exe().expect("test binary path");
    if let Some(why) = not_reachable_by_others(&exe) {
        shout(&format!(
            "{skipped}: uid {NOBODY} cannot execute the test binary: {why}"
        ));
        return;
    }
    let mut owner = reexec("owner", "isolation_owner_entry")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the owner");
    let mut owner_lines = BufReader::new(owner.stdout.take().expect("owner stdout")).lines();
    let announced = owner_lines
        .by_ref()
        .map(|line| line.expect("owner stdout"))
        .find_map(|line| line.strip_prefix("OWNER ").map(str::to_string))
        .expect("the owner exited without announcing itself");
    let peer = reexec("peer", "isolation_peer_entry")
        .env(OWNER_ENV, &announced)
        .uid(NOBODY)
        .gid(NOBODY)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("run the peer");
    let output = format!(
        "peer stdout:\n{}\npeer stderr:\n{}",
        String::from_utf8_lossy(&peer.stdout),
        String::from_utf8_lossy(&peer.stderr)
    );
    drop(owner.stdin.take()); // the owner exits at end of input
    owner_lines.for_each(drop); // and reports to its stdout until then
    let owner_status = owner.wait().expect("reap the owner");
    assert!(peer.status.success(), "the peer failed\n{output}");
    assert!(
        String::from_utf8_lossy(&peer.stdout).contains(PASSED),
        "the peer did not run its checks\n{output}"
    );
    assert!(owner_status.success(), "the owner failed: {owner_status}");
}

/// The owner's announcement: its queue pair's endpoint, then region A (the queue pair's
/// protection domain, remote read only) and region B (another protection domain).
struct Announcement {
    endpoint: QpEndpoint,
    a: RemoteAddr,
    b: RemoteAddr,
}

impl Announcement {
    fn encode(&self) -> String {
        let endpoint = String::from_utf8(self.endpoint.0.clone()).expect("utf8 endpoint");
        let (a, b) = (self.a, self.b);
        format!("{endpoint}|{} {}|{} {}", a.addr, a.rkey, b.addr, b.rkey)
    }

    fn decode(text: &str) -> Self {
        let parts: Vec<&str> = text.split('|').collect();
        let remote = |part: &str| {
            let (addr, rkey) = part.split_once(' ').expect("addr rkey");
            RemoteAddr {
                addr: addr.parse().expect("addr"),
                rkey: rkey.parse().expect("rkey"),
            }
        };
        Announcement {
            endpoint: QpEndpoint(parts[0].as_bytes().to_vec()),
            a: remote(parts[1]),
            b: remote(parts[2]),
        }
    }
}

#[test]
#[ignore = "the owner side of the isolation test; started by it, not by the harness"]
fn isolation_owner_entry() {
    if std::env::var(ROLE_ENV).as_deref() != Ok("owner") {
        return;
    }
    kvcm_transport::set_dumpable(false).expect("prctl");
    assert!(
        !kvcm_transport::is_dumpable().unwrap(),
        "the owner is not dumpable"
    );
    let domain = open_shm();
    let other = domain.new_pd().expect("second protection domain");
    let memory_a = domain.alloc(LEN).expect("alloc");
    memory_a.write(0, &pattern(LEN, 7)).expect("fill");
    let region_a = domain
        .register(&memory_a, 0, LEN, Access::REMOTE_READ)
        .expect("register A");
    let memory_b = other.alloc(LEN).expect("alloc");
    memory_b.write(0, &pattern(LEN, 9)).expect("fill");
    let region_b = other
        .register(&memory_b, 0, LEN, Access::ALL)
        .expect("register B");
    let (send_cq, recv_cq) = (domain.create_cq().unwrap(), domain.create_cq().unwrap());
    let qp = domain
        .create_qp(&send_cq, &recv_cq, QpConfig::default())
        .expect("qp");
    let announcement = Announcement {
        endpoint: qp.endpoint(),
        a: region_a.remote(0),
        b: region_b.remote(0),
    };
    println!("OWNER {}", announcement.encode());
    // Serve until the parent closes our input.
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}

/// Opening `path` fails as a permission error.
fn open_is_denied(path: &str) -> Result<(), String> {
    match std::fs::File::open(path) {
        Ok(_) => Err(format!("{path} opened")),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => Ok(()),
        Err(e) => Err(format!("{path}: {e}, not a permission error")),
    }
}

#[test]
#[ignore = "the peer side of the isolation test; started by it, not by the harness"]
fn isolation_peer_entry() {
    if std::env::var(ROLE_ENV).as_deref() != Ok("peer") {
        return;
    }
    assert_eq!(uid(), NOBODY, "the peer runs as another user");
    let owner = Announcement::decode(&std::env::var(OWNER_ENV).expect("owner announcement"));
    let broker = probe::broker_of(&owner.endpoint).expect("a shm endpoint");

    // The queue pair's own protection domain: READ succeeds.
    let side = conformance::Side::new(open_shm(), LEN, QpConfig::default());
    side.qp
        .connect(&owner.endpoint)
        .expect("connect to the owner");
    side.post(1, SendOp::Read(owner.a), &[side.sge(0, LEN as u32)]);
    let done = completions(&side.send_cq, 1);
    assert_eq!(done[0].status, WcStatus::Success, "READ of region A");
    assert!(side.bytes(0, LEN) == pattern(LEN, 7), "region A's bytes");

    // (a) The memory of another protection domain: the key table shows its descriptor
    // number, the broker refuses it.
    let fd_a = probe::key_memfd(&owner.endpoint, owner.a.rkey)
        .unwrap()
        .expect("A is live");
    let fd_b = probe::key_memfd(&owner.endpoint, owner.b.rkey)
        .unwrap()
        .expect("B is live");
    let ask = |object| probe::request(&broker.name, broker.qpn, broker.token, object).unwrap();
    match ask(Object::Memory(fd_b)) {
        Reply::Refused(Refusal::NotInPd) => {}
        other => panic!("memory of another protection domain: {other:?}"),
    }

    // (b) No descriptor of the owner through /proc: not the ones the key table names,
    // nor any other.
    let fds = (0..256).chain([fd_a, fd_b]);
    for fd in fds {
        open_is_denied(&format!("/proc/{}/fd/{fd}", broker.pid)).unwrap();
    }

    // A read-only descriptor cannot be reopened read-write through our own /proc entry.
    let Reply::Granted(read_only, false) = ask(Object::Memory(fd_a)) else {
        panic!("region A (remote read only) is handed out read-only");
    };
    let reopen = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/self/fd/{}", read_only.as_raw_fd()));
    let denied = reopen.map(drop).map_err(|e| e.raw_os_error());
    assert_eq!(denied, Err(Some(libc::EACCES)), "reopen read-write");

    // And the queue pair cannot READ B either (refused by its own checks first).
    side.post(2, SendOp::Read(owner.b), &[side.sge(0, 64)]);
    let done = completions(&side.send_cq, 1);
    assert_eq!(
        done[0].status,
        WcStatus::RemoteAccessError,
        "READ of region B"
    );
    println!("{PASSED}");
}
