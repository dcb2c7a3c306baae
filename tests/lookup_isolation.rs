//! Data-path isolation of the lookup path against a real `kvcm serve` (docs/security.md):
//! a queue pair opens only with a fresh bootstrap token, reads only the table of the
//! instance its bootstrap named (another instance's header address and rkey, known or
//! guessed, fail as a bad key), carries messages of that instance only, and is torn down
//! once the key its bootstrap showed is revoked — on the soft-TCP and shared-memory wires,
//! and on verbs where a device exists (`.ci/rxe-verbs`);
//! and a client process of another, non-root user maps nothing of another instance on
//! shared memory. Raw queue pairs stand for a hostile client (the client library would
//! never try).

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::other_user::{self, euid, NOBODY, PASSED};
use common::{code, http_exchange, registration, wait_until_blocking, TestServer};
use kvcm::lookup::grants::{parse_token, Token};
use kvcm::lookup::messages::{self, Request, Status};
use kvcm::lookup::BootstrapAnswer;
use kvcm::proto::meta;
use kvcm_client::Wire;
use kvcm_transport::any::{AnyCq, AnyDomain, AnyQp, AnyRegion};
use kvcm_transport::{
    exchange_endpoints, Access, CompletionQueue, Domain, HostMemory, Memory, QpConfig, QpEndpoint,
    QueuePair, RecvWr, Region, RemoteAddr, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
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

async fn post(server: &TestServer, listener: &str, route: &str, body: Value) -> (u16, Value) {
    server.post_as(listener, route, &body, Some(ROOT)).await
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

/// `answer`'s header address and rkey on `wire`.
fn header_of(answer: &BootstrapAnswer, wire: Wire) -> RemoteAddr {
    let rkey = answer
        .wires
        .iter()
        .find(|w| w.wire == wire.index())
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
    /// The server's queue-pair endpoint.
    remote: QpEndpoint,
    qp: AnyQp,
    cq: AnyCq,
    memory: HostMemory,
    region: AnyRegion,
    _domain: AnyDomain,
    /// The handshake connection (on verbs the server tears the queue pair down when it
    /// closes).
    hangup: Option<TcpStream>,
}

/// Sends `hello` and connects; `Err` when the server closes the connection instead.
fn connect_raw(connect: &str, wire: Wire, hello: &[u8]) -> Result<RawQp, String> {
    let domain = wire.open_domain(WAIT).expect("domain");
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
        remote,
        qp,
        cq,
        memory,
        region,
        _domain: domain,
        hangup: Some(stream),
    })
}

/// A queue pair opened with `answer`'s token.
fn open(answer: &BootstrapAnswer, wire: Wire) -> RawQp {
    let token = parse_token(&answer.qp_token).expect("token");
    let hello = kvcm::lookup::qp_hello(wire.index() as u8, &token);
    connect_raw(&answer.connect, wire, &hello).expect("a fresh token opens a queue pair")
}

impl RawQp {
    /// Whether a 64-byte READ at `remote` succeeds (a refused one breaks the queue pair).
    fn read(&self, remote: RemoteAddr) -> bool {
        if let (Wire::Shm, Some(qp)) = (self.wire, self.qp.as_soft()) {
            let mut out = [0u8; 64];
            return qp.read_direct(&[(remote, 64)], &mut out).is_ok();
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
            let mut out = [WorkCompletion::EMPTY];
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
    let wire = Wire::Tcp.index() as u8;
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

#[test]
fn queue_pairs_beyond_an_instances_share_or_the_total_are_refused() {
    let runtime = runtime();
    let server = runtime.block_on(server_with(&[
        "kvcm.lookup.max_queue_pairs=3",
        "kvcm.lookup.max_queue_pairs_per_instance=2",
    ]));
    let try_open = |instance: &str| {
        let answer = runtime.block_on(bootstrap(&server, instance, "none"));
        let token = parse_token(&answer.qp_token).expect("token");
        let hello = kvcm::lookup::qp_hello(Wire::Tcp.index() as u8, &token);
        connect_raw(&answer.connect, Wire::Tcp, &hello).map(|qp| (qp, answer))
    };
    let mine: Vec<_> = (0..2)
        .map(|_| try_open(MINE).expect("within the instance's share"))
        .collect();
    assert!(try_open(MINE).is_err(), "a third of one instance");
    let (theirs, answer) = try_open(THEIRS).expect("another instance has room");
    assert!(theirs.read(header_of(&answer, Wire::Tcp)), "and it reads");
    assert!(try_open(THEIRS).is_err(), "a fourth in all");
    for (qp, answer) in &mine {
        assert!(
            qp.read(header_of(answer, Wire::Tcp)),
            "the admitted still read"
        );
    }
}

fn reads_only_its_instance(wire: Wire, settings: &[&str]) {
    let runtime = runtime();
    let server = runtime.block_on(server_with(settings));
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
    // A refused READ breaks its queue pair: each guess gets a fresh one, which first reads
    // its own table (so the refusal is the guess's).
    for guess in guesses {
        let mine = runtime.block_on(bootstrap(&server, MINE, "none"));
        let qp = open(&mine, wire);
        assert!(qp.read(header_of(&mine, wire)), "a fresh queue pair reads");
        assert!(!qp.read(guess), "guessed rkey {:#x}", guess.rkey);
    }
    // Its messages may name its own instance only.
    let qp = open(&runtime.block_on(bootstrap(&server, MINE, "none")), wire);
    assert_eq!(qp.call(&remove(THEIRS)), Some(Status::Unauthenticated));
    assert_eq!(qp.call(&remove(MINE)), Some(Status::Ok));
}

#[test]
fn a_queue_pair_reads_only_its_instance_on_soft_tcp() {
    reads_only_its_instance(Wire::Tcp, &[]);
}

#[test]
fn a_queue_pair_reads_only_its_instance_on_soft_shm() {
    reads_only_its_instance(Wire::Shm, &[]);
}

/// On verbs the NIC checks the keys: the instance's table is registered in a protection
/// domain of its own (`ibv_alloc_pd`), and the queue pair is created in it.
#[test]
fn a_queue_pair_reads_only_its_instance_on_verbs_or_loud_skip() {
    if let Some(settings) = common::verbs_settings("lookup isolation on verbs") {
        let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
        reads_only_its_instance(Wire::Verbs, &settings);
    }
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

fn revocation_tears_down(wire: Wire, settings: &[&str]) {
    let runtime = runtime();
    let mut all = AUTH.to_vec();
    all.extend_from_slice(settings);
    let server = runtime.block_on(server_with(&all));
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
    revocation_tears_down(Wire::Tcp, &[]);
}

#[test]
fn a_revoked_keys_queue_pairs_are_torn_down_on_soft_shm() {
    revocation_tears_down(Wire::Shm, &[]);
}

/// A verbs queue pair never notices a client that is gone; its handshake connection
/// closing does tear the server's queue pair down (the client's READs then fail).
#[test]
fn a_verbs_queue_pair_is_torn_down_when_its_client_hangs_up_or_loud_skip() {
    let Some(settings) = common::verbs_settings("verbs hang-up") else {
        return;
    };
    let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
    let runtime = runtime();
    let server = runtime.block_on(server_with(&settings));
    let answer = runtime.block_on(bootstrap(&server, MINE, "none"));
    let mut qp = open(&answer, Wire::Verbs);
    let header = header_of(&answer, Wire::Verbs);
    assert!(qp.read(header), "it reads while connected");
    let kept = open(
        &runtime.block_on(bootstrap(&server, MINE, "none")),
        Wire::Verbs,
    );
    drop(qp.hangup.take());
    let torn_down = wait_until_blocking(WAIT, || (!qp.read(header)).then_some(()));
    assert!(torn_down.is_some(), "still reads {WAIT:?} after hanging up");
    assert!(kept.read(header), "the other client reads on");
    assert!(server.log().contains("its client hung up"), "logged");
}

#[test]
fn a_revoked_keys_queue_pairs_are_torn_down_on_verbs_or_loud_skip() {
    if let Some(settings) = common::verbs_settings("queue-pair revocation on verbs") {
        let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
        revocation_tears_down(Wire::Verbs, &settings);
    }
}

/// Hands the re-executed client what it may use: `{"mine": <bootstrap of MINE>,
/// "theirs": [header address, rkey]}` (the other instance's exact header, as if leaked).
const PEER_ENV: &str = "KVCM_LOOKUP_ISOLATION_PEER";

#[test]
fn a_client_of_another_user_maps_nothing_of_another_instance_on_shared_memory() {
    if other_user::cannot_run(
        "a_client_of_another_user_maps_nothing_of_another_instance_on_shared_memory",
    ) {
        return;
    }
    let runtime = runtime();
    let server = runtime.block_on(server_with(&[]));
    let mine = runtime.block_on(bootstrap(&server, MINE, "none"));
    let theirs = header_of(
        &runtime.block_on(bootstrap(&server, THEIRS, "none")),
        Wire::Shm,
    );
    let handed = json!({"mine": mine, "theirs": [theirs.addr, theirs.rkey]});
    other_user::run_as_nobody("shm_client_entry", PEER_ENV, &handed.to_string());
}

#[test]
#[ignore = "the hostile client of the shared-memory isolation test; started by it"]
fn shm_client_entry() {
    use kvcm_transport::soft::probe::{self, Object, Refusal, Reply};
    let Ok(handed) = std::env::var(PEER_ENV) else {
        return;
    };
    assert_eq!(euid(), NOBODY, "the client runs as another user");
    let handed: Value = serde_json::from_str(&handed).expect("handed json");
    let mine: BootstrapAnswer = serde_json::from_value(handed["mine"].clone()).expect("mine");
    let theirs = RemoteAddr {
        addr: handed["theirs"][0].as_u64().expect("addr"),
        rkey: handed["theirs"][1].as_u64().expect("rkey") as u32,
    };
    let qp = open(&mine, Wire::Shm);
    assert!(qp.read(header_of(&mine, Wire::Shm)), "its own table");
    // The other table's memory: the server's key table shows its descriptor number (any
    // peer of the domain sees registration metadata), its broker refuses it.
    let broker = probe::broker_of(&qp.remote).expect("a shm endpoint");
    let fd = probe::key_memfd(&qp.remote, theirs.rkey)
        .expect("key table")
        .expect("the other header is live");
    match probe::request(&broker.name, broker.qpn, broker.token, Object::Memory(fd)) {
        Ok(Reply::Refused(Refusal::NotInPd)) => {}
        other => panic!("the other instance's table memory: {other:?}"),
    }
    // Nor any descriptor of the server through /proc.
    other_user::proc_is_closed(broker.pid.into(), [fd]);
    assert!(!qp.read(theirs), "the other table through the queue pair");
    println!("{PASSED}");
}
