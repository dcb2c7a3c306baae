//! Data-path isolation of the lookup path against a real `kvcm serve` (docs/security.md):
//! a queue pair opens only with a fresh bootstrap token, reads only the table of the
//! instance its bootstrap named (another instance's header address and rkey, known or
//! guessed, fail as a bad key), carries messages of that instance only, and is torn down
//! once the key its bootstrap showed is revoked — on the soft-TCP and shared-memory wires.
//! Raw queue pairs stand for a hostile client (the client library would never try).

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{code, http_exchange, registration, wait_until_blocking, TestServer};
use kvcm::lookup::grants::{parse_token, Token};
use kvcm::lookup::messages::{self, Request, Status};
use kvcm::lookup::BootstrapAnswer;
use kvcm::proto::meta;
use kvcm_transport::soft::{SoftConfig, SoftCq, SoftDomain, SoftQp, SoftRegion, Wire};
use kvcm_transport::{
    exchange_endpoints, Access, CompletionQueue, Domain, HostMemory, Memory, QpConfig, QueuePair,
    RecvWr, Region, RemoteAddr, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
};
use serde_json::{json, Value};

const ROOT: &str = "root-token";
const AUTH: [&str; 2] = [
    "kvcm.service.admin_auth_token=root-token",
    "kvcm.auth.meta=required",
];
const MINE: &str = "inst-a";
const THEIRS: &str = "inst-b";
/// How long a hostile client waits for an answer.
const WAIT: Duration = Duration::from_secs(10);

const BLANK: WorkCompletion = WorkCompletion {
    wr_id: 0,
    status: WcStatus::Success,
    opcode: WcOpcode::Recv,
    byte_len: 0,
    imm: None,
    qpn: 0,
};

async fn post(server: &TestServer, listener: &str, route: &str, body: Value) -> (u16, Value) {
    let header = format!("Authorization: Bearer {ROOT}");
    let bytes = body.to_string().into_bytes();
    let (status, _, answer) = http_exchange(
        server.address(listener),
        "POST",
        route,
        &[header.as_str()],
        &bytes,
    )
    .await;
    (
        status,
        serde_json::from_slice(&answer).unwrap_or(Value::Null),
    )
}

/// A server (with `settings`) and instances [`MINE`] and [`THEIRS`].
async fn server_with(settings: &[&str]) -> TestServer {
    let server = TestServer::start_with(settings).await;
    for instance in [MINE, THEIRS] {
        let (status, answer) = post(
            &server,
            "http",
            "/api/registerInstance",
            registration(instance, 4),
        )
        .await;
        assert_eq!((status, code(&answer)), (200, "OK"), "{answer}");
    }
    server
}

/// The bootstrap of `instance`, with `bearer`.
async fn bootstrap(server: &TestServer, instance: &str, bearer: &str) -> BootstrapAnswer {
    let header = format!("Authorization: Bearer {bearer}");
    let body = json!({ "instance_id": instance }).to_string().into_bytes();
    let (status, _, answer) = http_exchange(
        server.address("http"),
        "POST",
        kvcm::lookup::ROUTE,
        &[header.as_str()],
        &body,
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
    serde_json::from_slice(&answer).expect("bootstrap answer")
}

fn wire_index(wire: Wire) -> usize {
    match wire {
        Wire::Tcp => kvcm::lookup::WIRE_SOFT_TCP,
        Wire::Shm => kvcm::lookup::WIRE_SOFT_SHM,
    }
}

/// `answer`'s header address and rkey on `wire`.
fn header_of(answer: &BootstrapAnswer, wire: Wire) -> RemoteAddr {
    let rkey = answer
        .wires
        .iter()
        .find(|w| w.wire == wire_index(wire))
        .expect("wire served")
        .header_rkey;
    RemoteAddr {
        addr: answer.header_addr,
        rkey,
    }
}

/// A queue pair connected by hand, as a hostile client would.
struct RawQp {
    wire: Wire,
    qp: SoftQp,
    cq: SoftCq,
    memory: HostMemory,
    region: SoftRegion,
    _domain: SoftDomain,
}

/// Sends `hello` and connects; `Err` when the server closes the connection instead.
fn connect_raw(connect: &str, wire: Wire, hello: &[u8]) -> Result<RawQp, String> {
    let domain = SoftDomain::open(SoftConfig::with_wire(wire)).expect("domain");
    let cq = domain.create_cq().expect("cq");
    let qp = domain.create_qp(&cq, &cq, QpConfig::default()).expect("qp");
    let mut stream = TcpStream::connect(connect).expect("connect");
    stream.set_read_timeout(Some(WAIT)).expect("timeout");
    stream.write_all(hello).expect("hello");
    let remote = exchange_endpoints(&mut stream, &qp.endpoint()).map_err(|e| e.to_string())?;
    qp.connect(&remote).map_err(|e| e.to_string())?;
    let memory = domain.alloc(1 << 16).expect("memory");
    let region = domain
        .register(&memory, 0, 1 << 16, Access::LOCAL_WRITE)
        .expect("region");
    Ok(RawQp {
        wire,
        qp,
        cq,
        memory,
        region,
        _domain: domain,
    })
}

/// A queue pair opened with `answer`'s token.
fn open(answer: &BootstrapAnswer, wire: Wire) -> RawQp {
    let token = parse_token(&answer.qp_token).expect("token");
    let hello = kvcm::lookup::qp_hello(wire_index(wire) as u8, &token);
    connect_raw(&answer.connect, wire, &hello).expect("a fresh token opens a queue pair")
}

impl RawQp {
    /// Whether a 64-byte READ at `remote` succeeds (a refused one breaks the queue pair).
    fn read(&self, remote: RemoteAddr) -> bool {
        if self.wire == Wire::Shm {
            let mut out = [0u8; 64];
            return self.qp.read_direct(&[(remote, 64)], &mut out).is_ok();
        }
        let posted = self.qp.post_send(&[SendWr {
            wr_id: 1,
            op: SendOp::Read(remote),
            sg_list: &[self.region.sge(0, 64)],
            signaled: true,
        }]);
        if posted.is_err() {
            return false;
        }
        self.completion()
            .is_some_and(|c| c.status == WcStatus::Success)
    }

    fn completion(&self) -> Option<WorkCompletion> {
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            let mut out = [BLANK];
            if self.cq.poll(&mut out) == 1 {
                return Some(out[0]);
            }
            std::hint::spin_loop();
        }
        None
    }

    /// Sends `request` as a message; the reply's status.
    fn call(&self, request: &Request) -> Option<Status> {
        let message = messages::encode_request(7, request).expect("encodes");
        self.memory.write(1 << 15, &message).expect("write");
        self.qp
            .post_recv(&[RecvWr {
                wr_id: 0,
                sg_list: &[self.region.sge(0, 1 << 15)],
            }])
            .ok()?;
        self.qp
            .post_send(&[SendWr {
                wr_id: 1,
                op: SendOp::Send { imm: None },
                sg_list: &[self.region.sge(1 << 15, message.len() as u32)],
                signaled: true,
            }])
            .ok()?;
        let (mut sent, mut reply) = (false, None);
        while !sent || reply.is_none() {
            let completion = self.completion()?;
            if completion.status != WcStatus::Success {
                return None;
            }
            match completion.opcode {
                WcOpcode::Recv => reply = Some(completion.byte_len as usize),
                _ => sent = true,
            }
        }
        let mut bytes = vec![0u8; reply?];
        self.memory.read(0, &mut bytes).expect("read");
        messages::peek_status(&bytes)
    }
}

fn remove(instance: &str) -> Request {
    Request::Remove(meta::RemoveCacheRequest {
        instance_id: instance.to_string(),
        block_keys: vec![1],
        ..Default::default()
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("runtime")
}

#[test]
fn a_queue_pair_opens_only_with_a_fresh_bootstrap_token() {
    let runtime = runtime();
    let server = runtime.block_on(server_with(&[]));
    let answer = runtime.block_on(bootstrap(&server, MINE, "none"));
    let token = parse_token(&answer.qp_token).expect("token");
    let wire = wire_index(Wire::Tcp) as u8;
    let zero: Token = [0; 16];
    let mut flipped = token;
    flipped[15] ^= 1;
    for (what, hello) in [
        ("the old hello without a token", b"KVQP\x00".to_vec()),
        ("a zero token", kvcm::lookup::qp_hello(wire, &zero).to_vec()),
        (
            "a token one bit off",
            kvcm::lookup::qp_hello(wire, &flipped).to_vec(),
        ),
    ] {
        let refused = connect_raw(&answer.connect, Wire::Tcp, &hello);
        assert!(refused.is_err(), "{what} opened a queue pair");
    }
    let hello = kvcm::lookup::qp_hello(wire, &token);
    let qp = connect_raw(&answer.connect, Wire::Tcp, &hello).expect("the token opens one");
    assert!(qp.read(header_of(&answer, Wire::Tcp)), "and it reads");
    assert!(
        connect_raw(&answer.connect, Wire::Tcp, &hello).is_err(),
        "a replayed token opens nothing"
    );
}

fn reads_only_its_instance(wire: Wire) {
    let runtime = runtime();
    let server = runtime.block_on(server_with(&[]));
    let mine = runtime.block_on(bootstrap(&server, MINE, "none"));
    let theirs = runtime.block_on(bootstrap(&server, THEIRS, "none"));
    let qp = open(&mine, wire);
    assert!(qp.read(header_of(&mine, wire)), "its own table");
    assert!(
        !qp.read(header_of(&theirs, wire)),
        "another instance's table, with its exact address and rkey"
    );
    // Guessed keys: the other table's rkey with every other generation near it.
    let theirs_header = header_of(&theirs, wire);
    let guesses = (1..=32u32).map(|g| RemoteAddr {
        rkey: theirs_header.rkey ^ (g << 14),
        ..theirs_header
    });
    let qp = open(&runtime.block_on(bootstrap(&server, MINE, "none")), wire);
    for guess in guesses {
        assert!(!qp.read(guess), "guessed rkey {:#x}", guess.rkey);
    }
    // Its messages may name its own instance only.
    let qp = open(&runtime.block_on(bootstrap(&server, MINE, "none")), wire);
    assert_eq!(qp.call(&remove(THEIRS)), Some(Status::Unauthenticated));
    assert_eq!(qp.call(&remove(MINE)), Some(Status::Ok));
}

#[test]
fn a_queue_pair_reads_only_its_instance_on_soft_tcp() {
    reads_only_its_instance(Wire::Tcp);
}

#[test]
fn a_queue_pair_reads_only_its_instance_on_soft_shm() {
    reads_only_its_instance(Wire::Shm);
}

/// A new key of a ROLE_USER account on [`MINE`]: (id, text).
async fn client_key(server: &TestServer, user: &str) -> (String, String) {
    let account = json!({"user_name": user, "password": "pw", "role": "ROLE_USER"});
    let (status, answer) = post(server, "admin_http", "/api/addAccount", account).await;
    assert_eq!((status, code(&answer)), (200, "OK"), "{answer}");
    let body = json!({"user_name": user, "instance_ids": [MINE], "expires_at_ms": 0});
    let (status, answer) = post(server, "admin_http", "/api/createApiKey", body).await;
    assert_eq!((status, code(&answer)), (200, "OK"), "{answer}");
    (
        answer["key_id"].as_str().expect("key_id").to_string(),
        answer["api_key"].as_str().expect("api_key").to_string(),
    )
}

fn revocation_tears_down(wire: Wire) {
    let runtime = runtime();
    let server = runtime.block_on(server_with(&AUTH));
    let (revoked_id, revoked) = runtime.block_on(client_key(&server, "eng"));
    let (_, kept) = runtime.block_on(client_key(&server, "other"));
    let answer = runtime.block_on(bootstrap(&server, MINE, &revoked));
    let doomed = open(&answer, wire);
    let header = header_of(&answer, wire);
    assert!(doomed.read(header), "the key's queue pair reads");
    let kept_answer = runtime.block_on(bootstrap(&server, MINE, &kept));
    let survivor = open(&kept_answer, wire);
    let (status, answer) = runtime.block_on(post(
        &server,
        "admin_http",
        "/api/revokeApiKey",
        json!({ "key_id": revoked_id }),
    ));
    assert_eq!((status, code(&answer)), (200, "OK"), "{answer}");
    let torn_down = wait_until_blocking(WAIT, || (!doomed.read(header)).then_some(()));
    assert!(
        torn_down.is_some(),
        "the revoked key's queue pair still reads after {WAIT:?}"
    );
    // The other key's clients bootstrap again (on shared memory the table was rebuilt)
    // and read.
    drop(survivor);
    let again = runtime.block_on(bootstrap(&server, MINE, &kept));
    assert!(open(&again, wire).read(header_of(&again, wire)));
    assert!(
        server.log().contains("lookup queue pair torn down"),
        "the teardown is logged"
    );
}

#[test]
fn a_revoked_keys_queue_pairs_are_torn_down_on_soft_tcp() {
    revocation_tears_down(Wire::Tcp);
}

#[test]
fn a_revoked_keys_queue_pairs_are_torn_down_on_soft_shm() {
    revocation_tears_down(Wire::Shm);
}
