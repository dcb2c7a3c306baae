//! The conformance suite on the soft provider, over both wires, plus the peer-process
//! SIGKILL case. The ignored `peer_process_entry` is the far side that the SIGKILL cases
//! start by re-executing this binary.

mod conformance;

use conformance::peer::{self, PeerProcess, PEER_LEN};
use conformance::Side;
use kvcm_transport::soft::{SoftConfig, SoftCq, SoftDomain, Wire};
use kvcm_transport::{
    CompletionQueue, QpConfig, QpEndpoint, QpState, QueuePair, Region, RemoteAddr, SendOp, SendWr,
    WcStatus, WorkCompletion,
};
use std::net::IpAddr;
use std::time::{Duration, Instant};

fn open(wire: Wire, bind: IpAddr) -> SoftDomain {
    SoftDomain::open(SoftConfig::with_wire(wire).with_bind(bind)).expect("open soft domain")
}

fn localhost() -> IpAddr {
    [127, 0, 0, 1].into()
}

#[test]
fn direct_reads_are_refused_on_the_tcp_wire() {
    let open_tcp = || open(Wire::Tcp, localhost());
    let p = conformance::Pair::new(&open_tcp, 4096);
    let read = [(
        RemoteAddr {
            addr: p.b.region.addr(),
            rkey: p.b.region.rkey(),
        },
        8,
    )];
    assert!(p.a.qp.read_direct(&read, &mut [0u8; 8]).is_err());
    let write = [(read[0].0, &[1u8; 8][..])];
    assert!(p.a.qp.write_direct(&write).is_err());
    assert_eq!(
        p.a.qp.state(),
        QpState::ReadyToSend,
        "a refused call changes nothing"
    );
}

mod tcp {
    use super::*;

    fn open_tcp() -> SoftDomain {
        open(Wire::Tcp, localhost())
    }

    conformance_suite!(SoftDomain, open_tcp);

    #[test]
    fn peer_process_sigkill_fails_in_flight_work() {
        let side = Side::new(open_tcp(), PEER_LEN, QpConfig::default());
        let process = PeerProcess::spawn(&side, "tcp", localhost(), &[]);
        peer::peer_sigkill_fails_in_flight(&side, process);
    }

    /// Sends `bytes` to the NIC at `addr` and expects it to close the connection.
    fn rejected(addr: std::net::SocketAddr, bytes: &[u8]) {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(conformance::DEADLINE))
            .unwrap();
        stream.write_all(bytes).unwrap();
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

    /// Waits for `count` completions by polling only (the manual-progress path: the
    /// polling thread drives the link, timeouts included), never arming the queue.
    fn busy_poll(cq: &SoftCq, count: usize) -> Vec<WorkCompletion> {
        let deadline = Instant::now() + conformance::DEADLINE;
        let mut got = Vec::new();
        let mut buf = [kvcm_transport::WorkCompletion::EMPTY; 8];
        while got.len() < count {
            assert!(Instant::now() < deadline, "timed out polling: {got:?}");
            let n = cq.poll(&mut buf);
            got.extend_from_slice(&buf[..n]);
            std::thread::yield_now();
        }
        got
    }

    #[test]
    fn a_silent_peer_times_out_with_retry_exceeded() {
        silent_peer_times_out(conformance::completions);
    }

    #[test]
    fn a_busy_poller_sees_a_silent_peer_time_out() {
        silent_peer_times_out(busy_poll);
    }

    #[test]
    fn busy_polling_alone_completes_requests() {
        let side = Side::new(open_tcp(), 4096, QpConfig::default());
        let peer = Side::new(open_tcp(), 4096, QpConfig::default());
        conformance::connect(&side.qp, &peer.qp);
        peer.fill(0, b"polled");
        for wr_id in 0..100 {
            let op = SendOp::Read(peer.region.remote(0));
            side.post(wr_id, op, &[side.sge(8, 6)]);
            let done = busy_poll(&side.send_cq, 1);
            assert_eq!((done[0].wr_id, done[0].status), (wr_id, WcStatus::Success));
        }
        assert_eq!(side.bytes(8, 6), b"polled");
    }

    #[test]
    fn a_poller_that_stops_without_arming_still_gets_its_completion() {
        use std::io::{Read, Write};
        let side = Side::new(open_tcp(), 4096, QpConfig::default());
        let scripted = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let text = format!(
            "soft-tcp qpn=1 addr={} token=0",
            scripted.local_addr().unwrap()
        );
        side.qp.connect(&QpEndpoint(text.into_bytes())).unwrap();
        let (mut peer, _) = scripted.accept().unwrap();
        let remote = RemoteAddr { addr: 0, rkey: 1 };
        side.post(1, SendOp::Read(remote), &[side.sge(0, 15)]);
        let mut hello_and_request = [0u8; 16 + 40];
        peer.read_exact(&mut hello_and_request).unwrap();
        let mut buf = [kvcm_transport::WorkCompletion::EMPTY];
        assert_eq!(side.send_cq.poll(&mut buf), 0, "not answered yet");
        // The last poll is over; the answer must now be taken in by the NIC thread.
        let mut response = vec![0u8; 16];
        response[4..8].copy_from_slice(&15u32.to_le_bytes());
        response.extend_from_slice(b"left to the NIC");
        peer.write_all(&response).unwrap();
        conformance::eventually("the READ data to land without a poll", || {
            side.bytes(0, 15) == b"left to the NIC"
        });
        let done = conformance::completions(&side.send_cq, 1);
        assert_eq!((done[0].wr_id, done[0].status), (1, WcStatus::Success));
    }

    #[test]
    fn a_quiet_link_is_served_while_another_keeps_the_nic_busy() {
        let server = open_tcp();
        let target = Side::new(server.clone(), 4096, QpConfig::default());
        let (busy, busy_peer) = (
            Side::new(open_tcp(), 4096, QpConfig::default()),
            Side::new(server, 4096, QpConfig::default()),
        );
        let quiet = Side::new(open_tcp(), 4096, QpConfig::default());
        conformance::connect(&busy.qp, &busy_peer.qp);
        conformance::connect(&quiet.qp, &target.qp);
        target.fill(0, b"quiet");
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let mut wr_id = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let op = SendOp::Read(busy_peer.region.remote(0));
                    busy.post(wr_id, op, &[busy.sge(0, 64)]);
                    assert_eq!(busy_poll(&busy.send_cq, 1)[0].status, WcStatus::Success);
                    wr_id += 1;
                }
            });
            for wr_id in 0..50 {
                let op = SendOp::Read(target.region.remote(0));
                quiet.post(wr_id, op, &[quiet.sge(0, 5)]);
                let done = conformance::completions(&quiet.send_cq, 1);
                assert_eq!((done[0].wr_id, done[0].status), (wr_id, WcStatus::Success));
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        assert_eq!(quiet.bytes(0, 5), b"quiet");
    }

    #[test]
    fn a_large_send_waits_for_its_receive_and_lands_scattered() {
        const LEN: usize = 1 << 20;
        let p = conformance::Pair::new(&open_tcp, 4 * LEN);
        let data = conformance::pattern(LEN, 5);
        p.a.fill(0, &data);
        p.a.post(1, SendOp::Send { imm: Some(9) }, &[p.a.sge(0, LEN as u32)]);
        conformance::no_completion(&p.b.recv_cq, Duration::from_millis(50));
        let half = (LEN / 2) as u32;
        p.b.post_recv(7, &[p.b.sge(2 * LEN, half), p.b.sge(LEN, LEN as u32)]);
        let got = conformance::completions(&p.b.recv_cq, 1)[0];
        assert_eq!(
            (got.wr_id, got.status, got.byte_len, got.imm),
            (7, WcStatus::Success, LEN as u32, Some(9))
        );
        let mut landed = p.b.bytes(2 * LEN, LEN / 2);
        landed.extend(p.b.bytes(LEN, LEN / 2));
        assert!(landed == data, "the payload landed across both elements");
        let sent = conformance::completions(&p.a.send_cq, 1)[0];
        assert_eq!((sent.wr_id, sent.status), (1, WcStatus::Success));
        p.b.post_recv(8, &[p.b.sge(0, half)]);
        p.a.post(2, SendOp::Send { imm: None }, &[p.a.sge(0, LEN as u32)]);
        let refused = conformance::completions(&p.b.recv_cq, 1)[0];
        assert_eq!(
            (refused.wr_id, refused.status),
            (8, WcStatus::LocalLengthError)
        );
        let failed = conformance::completions(&p.a.send_cq, 1)[0];
        assert_eq!(
            (failed.wr_id, failed.status),
            (2, WcStatus::RemoteInvalidRequest)
        );
        assert_eq!(p.b.qp.state(), QpState::Error);
    }

    #[test]
    fn requests_behind_a_send_without_receive_wait_for_one() {
        let p = conformance::Pair::new(&open_tcp, 4096);
        p.a.fill(0, b"early send");
        p.a.post(1, SendOp::Send { imm: None }, &[p.a.sge(0, 10)]);
        let remote = p.b.region.remote(100);
        let notify = SendOp::Write {
            remote,
            imm: Some(5),
        };
        p.a.post(2, notify, &[p.a.sge(0, 5)]);
        conformance::no_completion(&p.b.recv_cq, Duration::from_millis(50));
        conformance::no_completion(&p.a.send_cq, Duration::from_millis(1));
        p.b.post_recv(10, &[p.b.sge(0, 64)]);
        p.b.post_recv(11, &[p.b.sge(200, 64)]);
        let got = conformance::completions(&p.b.recv_cq, 2);
        let summary: Vec<_> = got.iter().map(|c| (c.wr_id, c.status, c.imm)).collect();
        assert_eq!(
            summary,
            [
                (10, WcStatus::Success, None),
                (11, WcStatus::Success, Some(5))
            ]
        );
        assert_eq!(p.b.bytes(0, 10), b"early send");
        assert_eq!(p.b.bytes(100, 5), b"early");
        let sent = conformance::completions(&p.a.send_cq, 2);
        assert!(sent.iter().all(|c| c.status == WcStatus::Success));
    }

    fn silent_peer_times_out(wait: fn(&SoftCq, usize) -> Vec<WorkCompletion>) {
        let timeout = Duration::from_millis(300);
        let config = SoftConfig::with_wire(Wire::Tcp).with_response_timeout(timeout);
        let side = Side::new(SoftDomain::open(config).unwrap(), 4096, QpConfig::default());
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let text = format!(
            "soft-tcp qpn=1 addr={} token=0",
            silent.local_addr().unwrap()
        );
        side.qp.connect(&QpEndpoint(text.into_bytes())).unwrap();
        let (_never_answers, _) = silent.accept().unwrap();
        let started = Instant::now();
        let remote = RemoteAddr {
            addr: 4096,
            rkey: 1,
        };
        side.post(1, SendOp::Read(remote), &[side.sge(0, 8)]);
        side.post(2, SendOp::Read(remote), &[side.sge(8, 8)]);
        let done = wait(&side.send_cq, 2);
        let statuses: Vec<_> = done.iter().map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(
            statuses,
            [(1, WcStatus::RetryExceeded), (2, WcStatus::WrFlushError)]
        );
        assert!(started.elapsed() >= timeout, "not before the timeout");
        assert_eq!(side.qp.state(), QpState::Error);
    }

    #[test]
    fn garbage_on_the_wire_closes_only_that_connection() {
        let domain = open_tcp();
        let addr = domain.listen_addr().unwrap();
        rejected(addr, b"GET / HTTP/1.1\r\n\r\n");
        let hello_unknown_qp = [b"KVTP".as_slice(), &999u32.to_le_bytes(), &[0; 8]].concat();
        rejected(addr, &hello_unknown_qp);
        // A stranger who does not know the victim's token cannot bind to it.
        let victim = Side::new(domain.clone(), 4096, QpConfig::default());
        let guessed_token = [0u8; 8];
        let mut bad_request = [
            b"KVTP".as_slice(),
            &victim.qp.qpn().to_le_bytes(),
            &guessed_token,
        ]
        .concat();
        bad_request.extend([99u8; 40]);
        rejected(addr, &bad_request);
        assert_eq!(victim.qp.state(), QpState::Init, "the victim is untouched");
        let healthy = Side::new(domain, 4096, QpConfig::default());
        let peer = Side::new(open_tcp(), 4096, QpConfig::default());
        conformance::connect(&healthy.qp, &peer.qp);
        peer.fill(0, b"still serving");
        healthy.post(
            1,
            SendOp::Read(peer.region.remote(0)),
            &[healthy.sge(0, 13)],
        );
        assert_eq!(
            conformance::completions(&healthy.send_cq, 1)[0].status,
            WcStatus::Success
        );
        assert_eq!(healthy.bytes(0, 13), b"still serving");
    }
}

mod shm {
    use super::*;

    fn open_shm() -> SoftDomain {
        open(Wire::Shm, localhost())
    }

    conformance_suite!(SoftDomain, open_shm);

    #[test]
    fn direct_reads_copy_what_reads_would_and_refuse_what_reads_refuse() {
        use kvcm_transport::Memory;
        let p = conformance::Pair::new(&open_shm, 8192);
        let pattern: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
        p.b.memory.write(0, &pattern).unwrap();
        let remote = |offset: u64| RemoteAddr {
            addr: p.b.region.addr() + offset,
            rkey: p.b.region.rkey(),
        };
        let reads = [(remote(64), 64), (remote(4000), 100), (remote(0), 8)];
        let mut out = vec![0u8; 172];
        p.a.qp.read_direct(&reads, &mut out).unwrap();
        let mut expected = pattern[64..128].to_vec();
        expected.extend_from_slice(&pattern[4000..4100]);
        expected.extend_from_slice(&pattern[..8]);
        assert_eq!(out, expected);
        // The output must be filled exactly; that is refused without harm.
        assert!(p.a.qp.read_direct(&reads, &mut [0u8; 10]).is_err());
        assert_eq!(p.a.qp.state(), QpState::ReadyToSend);
        // Past the region: refused, and the queue pair fails as a READ's would.
        let past = [(remote(8190), 16)];
        assert!(p.a.qp.read_direct(&past, &mut [0u8; 16]).is_err());
        assert_eq!(p.a.qp.state(), QpState::Error);
        assert!(
            p.a.qp.read_direct(&reads, &mut out).is_err(),
            "a failed pair stays failed"
        );
    }

    #[test]
    fn direct_writes_place_what_writes_would_and_refuse_what_writes_refuse() {
        use kvcm_transport::{Access, Domain, Memory};
        let p = conformance::Pair::new(&open_shm, 8192);
        let remote = |offset: u64| RemoteAddr {
            addr: p.b.region.addr() + offset,
            rkey: p.b.region.rkey(),
        };
        let (first, second) = (vec![7u8; 100], vec![9u8; 50]);
        let writes = [(remote(4000), &first[..]), (remote(10), &second[..])];
        p.a.qp.write_direct(&writes).unwrap();
        let mut seen = vec![0u8; 8192];
        p.b.memory.read(0, &mut seen).unwrap();
        assert_eq!(&seen[4000..4100], &first[..]);
        assert_eq!(&seen[10..60], &second[..]);
        assert!(seen[..10].iter().chain(&seen[60..4000]).all(|&b| b == 0));
        // A region without the remote-write right refuses, and the pair fails.
        let read_only = p.b.domain.alloc(4096).unwrap();
        let region =
            p.b.domain
                .register(&read_only, 0, 4096, Access::REMOTE_READ)
                .unwrap();
        let refused = [(
            RemoteAddr {
                addr: region.addr(),
                rkey: region.rkey(),
            },
            &first[..],
        )];
        assert!(p.a.qp.write_direct(&refused).is_err());
        assert_eq!(p.a.qp.state(), QpState::Error);
        let mut untouched = vec![1u8; 100];
        read_only.read(0, &mut untouched).unwrap();
        assert!(untouched.iter().all(|&b| b == 0), "nothing was written");
        assert!(
            p.a.qp.write_direct(&writes).is_err(),
            "a failed pair stays failed"
        );
    }

    #[test]
    fn direct_reads_refuse_a_deregistered_key() {
        use kvcm_transport::Domain;
        let p = conformance::Pair::new(&open_shm, 8192);
        let other = p.b.domain.alloc(4096).unwrap();
        let region =
            p.b.domain
                .register(&other, 0, 4096, kvcm_transport::Access::REMOTE_READ)
                .unwrap();
        let read = [(
            RemoteAddr {
                addr: region.addr(),
                rkey: region.rkey(),
            },
            64,
        )];
        p.a.qp.read_direct(&read, &mut [0u8; 64]).unwrap();
        drop(region);
        assert!(p.a.qp.read_direct(&read, &mut [0u8; 64]).is_err());
    }

    #[test]
    fn sends_to_a_peer_that_never_receives_time_out() {
        let config = SoftConfig {
            ring_capacity: 4096,
            ..SoftConfig::with_wire(Wire::Shm)
        }
        .with_response_timeout(Duration::from_millis(300));
        let p = conformance::Pair::new(&|| SoftDomain::open(config).unwrap(), 8192);
        let sg = [p.a.sge(0, 1000)];
        let send = SendOp::Send { imm: None };
        let wrs: Vec<SendWr> = (0..8)
            .map(|i| SendWr {
                wr_id: i,
                op: send,
                sg_list: &sg,
                signaled: true,
            })
            .collect();
        let started = Instant::now();
        p.a.qp.post_send(&wrs).unwrap();
        assert!(
            started.elapsed() < Duration::from_millis(300),
            "post_send does not wait for ring room"
        );
        let done = conformance::completions(&p.a.send_cq, 8);
        let first_error = done
            .iter()
            .position(|c| c.status != WcStatus::Success)
            .expect("a SEND failed");
        assert!(first_error >= 1, "the ring took some SENDs: {done:?}");
        assert_eq!(done[first_error].status, WcStatus::RetryExceeded);
        assert!(done[first_error + 1..]
            .iter()
            .all(|c| c.status == WcStatus::WrFlushError));
        assert_eq!(p.a.qp.state(), QpState::Error);
    }

    #[test]
    fn sends_that_find_the_ring_full_are_delivered_in_order_once_it_drains() {
        let config = SoftConfig {
            ring_capacity: 4096,
            ..SoftConfig::with_wire(Wire::Shm)
        };
        let p = conformance::Pair::new(&|| SoftDomain::open(config).unwrap(), 16384);
        let wrs_data: Vec<Vec<u8>> = (0..8).map(|i| conformance::pattern(1000, i)).collect();
        for (i, data) in wrs_data.iter().enumerate() {
            p.a.fill(i * 1000, data);
        }
        let sges: Vec<_> = (0..8).map(|i| p.a.sge(i * 1000, 1000)).collect();
        let wrs: Vec<SendWr> = (0..8)
            .map(|i| SendWr {
                wr_id: i as u64,
                op: SendOp::Send { imm: None },
                sg_list: &sges[i..=i],
                signaled: true,
            })
            .collect();
        p.a.qp.post_send(&wrs).unwrap();
        let mut buf = [kvcm_transport::WorkCompletion::EMPTY; 8];
        let early = p.a.send_cq.poll(&mut buf);
        assert!(
            early < 8,
            "a 4 KiB ring cannot take 8 KB of SENDs before receives"
        );
        for i in 0..8 {
            p.b.post_recv(i as u64, &[p.b.sge(i * 1000, 1000)]);
        }
        let received = conformance::completions(&p.b.recv_cq, 8);
        let order: Vec<u64> = received.iter().map(|c| c.wr_id).collect();
        assert_eq!(order, (0..8).collect::<Vec<_>>());
        for (i, data) in wrs_data.iter().enumerate() {
            assert_eq!(&p.b.bytes(i * 1000, 1000), data, "SEND {i} intact");
        }
        let sent = conformance::completions(&p.a.send_cq, 8 - early);
        assert!(sent.iter().all(|c| c.status == WcStatus::Success));
        assert_eq!(p.a.qp.state(), QpState::ReadyToSend);
    }

    #[test]
    fn send_larger_than_the_ring_is_local_length_error() {
        let config = SoftConfig {
            ring_capacity: 64 << 10,
            ..SoftConfig::with_wire(Wire::Shm)
        };
        let open_small = || SoftDomain::open(config).unwrap();
        let p = conformance::Pair::new(&open_small, 256 << 10);
        p.b.post_recv(1, &[p.b.sge(0, 128 << 10)]);
        p.a.post(7, SendOp::Send { imm: None }, &[p.a.sge(0, 64 << 10)]);
        let done = conformance::completions(&p.a.send_cq, 1);
        assert_eq!(
            (done[0].wr_id, done[0].status),
            (7, WcStatus::LocalLengthError)
        );
        assert_eq!(p.a.qp.state(), QpState::Error);
        conformance::no_completion(&p.b.recv_cq, std::time::Duration::from_millis(20));
    }

    #[test]
    fn peer_process_sigkill_fails_in_flight_work() {
        let side = Side::new(open_shm(), PEER_LEN, QpConfig::default());
        let process = PeerProcess::spawn(&side, "shm", localhost(), &[]);
        peer::peer_sigkill_fails_in_flight(&side, process);
    }
}

/// The suite through the provider-dispatching types, which the lookup path serves with.
mod any_tcp {
    use super::*;
    use kvcm_transport::any::AnyDomain;

    fn open_any() -> AnyDomain {
        open(Wire::Tcp, localhost()).into()
    }

    conformance_suite!(AnyDomain, open_any);
}

#[test]
#[ignore = "far side of the SIGKILL cases; started by them, not by the harness"]
fn peer_process_entry() {
    peer::serve_if_peer(|role, bind| {
        let wire = if role == "shm" { Wire::Shm } else { Wire::Tcp };
        open(wire, bind)
    });
}
