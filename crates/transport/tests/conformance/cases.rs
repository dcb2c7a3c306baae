//! The cases of the conformance suite. Each takes a factory of fresh domains.

use super::*;
use kvcm_transport::{HostMemory, QpState, RemoteAddr, TransportError, WcOpcode, WcStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

type Open<'a, D> = &'a dyn Fn() -> D;

fn read(remote: RemoteAddr) -> SendOp {
    SendOp::Read(remote)
}

fn write(remote: RemoteAddr) -> SendOp {
    SendOp::Write { remote, imm: None }
}

pub fn read_and_write_move_bytes<D: Domain>(open: Open<D>) {
    let p = Pair::new(open, 8192);
    p.b.fill(100, &pattern(300, 1));
    p.a.post(1, read(p.b.region.remote(100)), &[p.a.sge(0, 300)]);
    let done = completions(&p.a.send_cq, 1);
    assert_eq!(
        (done[0].wr_id, done[0].status, done[0].opcode),
        (1, WcStatus::Success, WcOpcode::Read)
    );
    assert_eq!(done[0].byte_len, 300);
    assert_eq!(p.a.bytes(0, 300), pattern(300, 1));

    p.a.fill(4096, &pattern(64, 2));
    p.a.post(2, write(p.b.region.remote(5000)), &[p.a.sge(4096, 64)]);
    assert_eq!(completions(&p.a.send_cq, 1)[0].status, WcStatus::Success);
    assert_eq!(p.b.bytes(5000, 64), pattern(64, 2));
    assert_eq!(
        p.b.bytes(4999, 1),
        [0],
        "bytes before the target are untouched"
    );
}

pub fn scatter_gather_lists<D: Domain>(open: Open<D>) {
    let p = Pair::new(open, 8192);
    p.b.fill(0, &pattern(100, 3));
    let scatter = [p.a.sge(10, 30), p.a.sge(1000, 50), p.a.sge(3000, 20)];
    p.a.post(1, read(p.b.region.remote(0)), &scatter);
    assert_eq!(completions(&p.a.send_cq, 1)[0].byte_len, 100);
    let mut got = p.a.bytes(10, 30);
    got.extend(p.a.bytes(1000, 50));
    got.extend(p.a.bytes(3000, 20));
    assert_eq!(got, pattern(100, 3));

    let gather = [p.a.sge(1000, 50), p.a.sge(10, 30)];
    p.a.post(2, write(p.b.region.remote(6000)), &gather);
    completions(&p.a.send_cq, 1);
    assert_eq!(p.b.bytes(6000, 50), pattern(100, 3)[30..80]);
    assert_eq!(p.b.bytes(6050, 30), pattern(100, 3)[..30]);
}

pub fn send_recv_and_immediates<D: Domain>(open: Open<D>) {
    let p = Pair::new(open, 8192);
    p.b.post_recv(10, &[p.b.sge(0, 100), p.b.sge(200, 100)]);
    p.b.post_recv(11, &[p.b.sge(1000, 64)]);
    p.b.post_recv(12, &[p.b.sge(2000, 64)]);
    p.a.fill(4000, &pattern(150, 4));
    p.a.post(1, SendOp::Send { imm: None }, &[p.a.sge(4000, 150)]);
    p.a.post(2, SendOp::Send { imm: Some(0xfeed) }, &[p.a.sge(4000, 10)]);
    p.a.fill(4500, &pattern(32, 5));
    p.a.post(
        3,
        SendOp::Write {
            remote: p.b.region.remote(3000),
            imm: Some(77),
        },
        &[p.a.sge(4500, 32)],
    );
    let sends = completions(&p.a.send_cq, 3);
    assert!(
        sends.iter().all(|c| c.status == WcStatus::Success),
        "{sends:?}"
    );
    let recvs = completions(&p.b.recv_cq, 3);
    assert_eq!(
        (
            recvs[0].wr_id,
            recvs[0].opcode,
            recvs[0].byte_len,
            recvs[0].imm
        ),
        (10, WcOpcode::Recv, 150, None)
    );
    assert_eq!(
        (recvs[1].wr_id, recvs[1].byte_len, recvs[1].imm),
        (11, 10, Some(0xfeed))
    );
    assert_eq!(
        (recvs[2].wr_id, recvs[2].opcode, recvs[2].imm),
        (12, WcOpcode::RecvRdmaWithImm, Some(77))
    );
    let mut got = p.b.bytes(0, 100);
    got.extend(p.b.bytes(200, 50));
    assert_eq!(got, pattern(150, 4));
    assert_eq!(
        p.b.bytes(3000, 32),
        pattern(32, 5),
        "WRITE data is in place at its completion"
    );
}

pub fn atomics_return_old_values<D: Domain>(open: Open<D>) {
    let p = Pair::new(open, 4096);
    p.b.fill(64, &10u64.to_le_bytes());
    let word = p.b.region.remote(64);
    let old = [p.a.sge(0, 8)];
    p.a.post(
        1,
        SendOp::FetchAdd {
            remote: word,
            add: 5,
        },
        &old,
    );
    completions(&p.a.send_cq, 1);
    assert_eq!(p.a.bytes(0, 8), 10u64.to_le_bytes());
    p.a.post(
        2,
        SendOp::CompareSwap {
            remote: word,
            compare: 99,
            swap: 1,
        },
        &old,
    );
    assert_eq!(
        completions(&p.a.send_cq, 1)[0].opcode,
        WcOpcode::CompareSwap
    );
    assert_eq!(
        p.a.bytes(0, 8),
        15u64.to_le_bytes(),
        "failed CAS returns the current value"
    );
    assert_eq!(p.b.memory.load_u64(64).unwrap(), 15);
    p.a.post(
        3,
        SendOp::CompareSwap {
            remote: word,
            compare: 15,
            swap: 1,
        },
        &old,
    );
    completions(&p.a.send_cq, 1);
    assert_eq!(p.b.memory.load_u64(64).unwrap(), 1);
}

pub fn unsignaled_requests_complete_silently<D: Domain>(open: Open<D>) {
    let p = Pair::new(open, 4096);
    p.a.fill(0, &pattern(80, 6));
    let sges: Vec<Sge> = (0..10).map(|i| p.a.sge(i * 8, 8)).collect();
    let mut wrs: Vec<SendWr> = (0..10)
        .map(|i| SendWr {
            wr_id: i as u64,
            op: write(p.b.region.remote(i * 8)),
            sg_list: &sges[i..=i],
            signaled: false,
        })
        .collect();
    wrs[9].signaled = true;
    p.a.qp.post_send(&wrs).unwrap();
    let done = completions(&p.a.send_cq, 1);
    assert_eq!(done[0].wr_id, 9);
    assert_eq!(p.b.bytes(0, 80), pattern(80, 6));
    no_completion(&p.a.send_cq, Duration::from_millis(20));
}

pub fn batch_completes_in_order<D: Domain>(open: Open<D>) {
    let p = Pair::new(open, 65536);
    p.b.fill(0, &pattern(65536, 7));
    let sges: Vec<Sge> = (0..64).map(|i| p.a.sge(i * 1024, 1024)).collect();
    let wrs: Vec<SendWr> = (0..64)
        .map(|i| SendWr {
            wr_id: 1000 + i as u64,
            op: read(p.b.region.remote(i * 1024)),
            sg_list: &sges[i..=i],
            signaled: true,
        })
        .collect();
    p.a.qp.post_send(&wrs).unwrap();
    let done = completions(&p.a.send_cq, 64);
    let ids: Vec<u64> = done.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, (1000..1064).collect::<Vec<_>>());
    assert_eq!(p.a.bytes(0, 65536), pattern(65536, 7));
}

/// Posts `op` and expects exactly one completion with `status`, then a broken QP.
fn expect_failure<D: Domain>(side: &Side<D>, op: SendOp, sg_list: &[Sge], status: WcStatus) {
    side.post(1, op, sg_list);
    let done = completions(&side.send_cq, 1);
    assert_eq!((done[0].wr_id, done[0].status), (1, status), "{done:?}");
    eventually("queue pair error state", || {
        side.qp.state() == QpState::Error
    });
    let err = side
        .qp
        .post_send(&[SendWr {
            wr_id: 2,
            op,
            sg_list,
            signaled: true,
        }])
        .unwrap_err();
    assert!(matches!(err, TransportError::QpState { .. }), "{err}");
}

pub fn bad_rkey_is_remote_access_error<D: Domain>(open: Open<D>) {
    let p = Pair::new(open, 4096);
    let mut remote = p.b.region.remote(0);
    remote.rkey ^= 0x5a5a;
    p.a.fill(0, &[9; 16]);
    expect_failure(
        &p.a,
        write(remote),
        &[p.a.sge(0, 16)],
        WcStatus::RemoteAccessError,
    );
    assert_eq!(p.b.bytes(0, 16), [0; 16]);
}

pub fn out_of_bounds_is_remote_access_error<D: Domain>(open: Open<D>) {
    let p = Pair::new(open, 4096);
    let mut beyond = p.b.region.remote(4090);
    expect_failure(
        &p.a,
        read(beyond),
        &[p.a.sge(0, 16)],
        WcStatus::RemoteAccessError,
    );
    let q = Pair::new(open, 4096);
    beyond = q.b.region.remote(0);
    beyond.addr -= 8;
    expect_failure(
        &q.a,
        write(beyond),
        &[q.a.sge(0, 16)],
        WcStatus::RemoteAccessError,
    );
}

pub fn missing_access_rights_are_refused<D: Domain>(open: Open<D>) {
    let p = Pair::new(open, 4096);
    let extra = p.b.domain.alloc(4096).unwrap();
    let read_only =
        p.b.domain
            .register(&extra, 0, 4096, Access::REMOTE_READ)
            .unwrap();
    expect_failure(
        &p.a,
        write(read_only.remote(0)),
        &[p.a.sge(0, 8)],
        WcStatus::RemoteAccessError,
    );
    drop(read_only);
    let q = Pair::new(open, 4096);
    let no_atomic =
        q.b.domain
            .register(&extra, 0, 4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let no_atomic = no_atomic.expect("range is free again after deregistration");
    let faa = SendOp::FetchAdd {
        remote: no_atomic.remote(0),
        add: 1,
    };
    expect_failure(&q.a, faa, &[q.a.sge(0, 8)], WcStatus::RemoteAccessError);
    assert_eq!(extra.load_u64(0).unwrap(), 0);
}

pub fn deregistered_region_is_unreachable<D: Domain>(open: Open<D>) {
    let p = Pair::new(open, 4096);
    let extra = p.b.domain.alloc(4096).unwrap();
    let region = p.b.domain.register(&extra, 0, 4096, Access::ALL).unwrap();
    let remote = region.remote(0);
    p.a.post(1, read(remote), &[p.a.sge(0, 8)]);
    assert_eq!(completions(&p.a.send_cq, 1)[0].status, WcStatus::Success);
    drop(region);
    p.a.post(2, read(remote), &[p.a.sge(0, 8)]);
    assert_eq!(
        completions(&p.a.send_cq, 1)[0].status,
        WcStatus::RemoteAccessError
    );
    // Locally too: a scatter element under a deregistered lkey is refused.
    let q = Pair::new(open, 4096);
    q.b.fill(0, &[7; 8]);
    let local = q.a.domain.alloc(4096).unwrap();
    let local_region = q.a.domain.register(&local, 0, 4096, Access::ALL).unwrap();
    let stale = local_region.sge(0, 8);
    drop(local_region);
    expect_failure(
        &q.a,
        read(q.b.region.remote(0)),
        &[stale],
        WcStatus::LocalProtectionError,
    );
    assert_eq!(
        local.load_u64(0).unwrap(),
        0,
        "nothing was written through the stale key"
    );
}

pub fn bad_lkey_is_local_protection_error<D: Domain>(open: Open<D>) {
    let p = Pair::new(open, 4096);
    let mut sge = p.a.sge(0, 8);
    sge.lkey ^= 0x77;
    expect_failure(
        &p.a,
        read(p.b.region.remote(0)),
        &[sge],
        WcStatus::LocalProtectionError,
    );
    let q = Pair::new(open, 4096);
    let beyond = q.a.sge(4090, 16);
    expect_failure(
        &q.a,
        write(q.b.region.remote(0)),
        &[beyond],
        WcStatus::LocalProtectionError,
    );
}

/// Keys work only within their protection domain: a queue pair reaches the peer's regions
/// of its peer queue pair's protection domain, and uses local keys of its own.
pub fn protection_domains_isolate_keys<D: Domain>(open: Open<D>) {
    let p = Pair::new(open, 4096);
    let other_pd = p.b.domain.new_pd().expect("new pd");
    let foreign = other_pd.alloc(4096).unwrap();
    foreign.write(0, &[5; 8]).unwrap();
    let foreign_region = other_pd.register(&foreign, 0, 4096, Access::ALL).unwrap();
    expect_failure(
        &p.a,
        read(foreign_region.remote(0)),
        &[p.a.sge(0, 8)],
        WcStatus::RemoteAccessError,
    );
    assert_eq!(p.a.bytes(0, 8), [0; 8], "nothing was read");

    // A queue pair of the other protection domain reads its regions, and only those.
    let a = Side::new(open(), 4096, QpConfig::default());
    let cq = other_pd.create_cq().unwrap();
    let qp = other_pd
        .create_qp(&cq, &cq, QpConfig::default())
        .expect("qp in the new pd");
    connect(&a.qp, &qp);
    a.post(1, read(foreign_region.remote(0)), &[a.sge(0, 8)]);
    assert_eq!(completions(&a.send_cq, 1)[0].status, WcStatus::Success);
    assert_eq!(a.bytes(0, 8), [5; 8]);
    a.fill(100, &[6; 8]);
    expect_failure(
        &a,
        write(p.b.region.remote(0)),
        &[a.sge(100, 8)],
        WcStatus::RemoteAccessError,
    );
    assert_eq!(p.b.bytes(0, 8), [0; 8], "nothing was written");

    // The same bytes registered in both protection domains (overlapping ranges, as a
    // memory-pool node registers each instance's runs beside its whole region): each
    // registration reaches them through queue pairs of its own domain only.
    p.b.fill(16, &[9; 8]);
    let shared = other_pd
        .register(&p.b.memory, 0, 4096, Access::ALL)
        .expect("another protection domain registers bytes this one registered");
    let c = Side::new(open(), 4096, QpConfig::default());
    let qp = other_pd
        .create_qp(&cq, &cq, QpConfig::default())
        .expect("another qp in the new pd");
    connect(&c.qp, &qp);
    c.post(2, read(shared.remote(16)), &[c.sge(200, 8)]);
    assert_eq!(completions(&c.send_cq, 1)[0].status, WcStatus::Success);
    assert_eq!(c.bytes(200, 8), [9; 8]);
    let d = Side::new(open(), 4096, QpConfig::default());
    let first_cq = p.b.domain.create_cq().unwrap();
    let qp =
        p.b.domain
            .create_qp(&first_cq, &first_cq, QpConfig::default())
            .expect("a qp in the first pd");
    connect(&d.qp, &qp);
    expect_failure(
        &d,
        read(shared.remote(16)),
        &[d.sge(0, 8)],
        WcStatus::RemoteAccessError,
    );

    // Locally: a scatter element of another protection domain is refused.
    let q = Pair::new(open, 4096);
    let local_pd = q.a.domain.new_pd().unwrap();
    let local = local_pd.alloc(4096).unwrap();
    let local_region = local_pd.register(&local, 0, 4096, Access::ALL).unwrap();
    q.b.fill(0, &[7; 8]);
    expect_failure(
        &q.a,
        read(q.b.region.remote(0)),
        &[local_region.sge(0, 8)],
        WcStatus::LocalProtectionError,
    );
    assert_eq!(local.load_u64(0).unwrap(), 0, "nothing was written");
}

/// Posts one signaled READ per `(remote, local list)`, all in one batch; the wr ids (their
/// positions) and statuses of their completions, in order.
fn read_batch_statuses<D: Domain>(
    side: &Side<D>,
    reads: &[(RemoteAddr, &[Sge])],
) -> Vec<(u64, WcStatus)> {
    let wrs: Vec<SendWr> = reads
        .iter()
        .enumerate()
        .map(|(i, &(remote, sg_list))| SendWr {
            wr_id: i as u64,
            op: read(remote),
            sg_list,
            signaled: true,
        })
        .collect();
    side.qp.post_send(&wrs).unwrap();
    completions(&side.send_cq, reads.len())
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect()
}

/// The completions of a batch of four whose second request fails with `failure`: the
/// first done, the last two flushed.
fn second_of_four_failed(failure: WcStatus) -> [(u64, WcStatus); 4] {
    [
        (0, WcStatus::Success),
        (1, failure),
        (2, WcStatus::WrFlushError),
        (3, WcStatus::WrFlushError),
    ]
}

/// A request refused locally (its scatter element names a bad lkey) in the middle of one
/// posted batch: the requests before it complete, it fails, the rest are flushed, in order.
pub fn local_error_mid_batch_flushes_the_rest<D: Domain>(open: Open<D>) {
    let p = Pair::new(open, 4096);
    p.b.fill(0, &[5; 32]);
    let good = p.a.sge(0, 8);
    let mut bad = p.a.sge(8, 8);
    bad.lkey ^= 0x77;
    let lists = [[good], [bad], [p.a.sge(16, 8)], [p.a.sge(24, 8)]];
    let reads: Vec<_> = (0..4)
        .map(|i| (p.b.region.remote(8 * i), &lists[i][..]))
        .collect();
    assert_eq!(
        read_batch_statuses(&p.a, &reads),
        second_of_four_failed(WcStatus::LocalProtectionError)
    );
    assert_eq!(p.a.bytes(0, 8), [5; 8], "the request before it was done");
    assert_eq!(p.a.bytes(16, 16), [0; 16], "the flushed ones moved nothing");
    eventually("queue pair error state", || {
        p.a.qp.state() == QpState::Error
    });
}

pub fn error_flushes_the_rest_and_breaks_the_qp<D: Domain>(open: Open<D>) {
    let p = Pair::new(open, 4096);
    let mut bad = p.b.region.remote(0);
    bad.rkey ^= 1;
    let sg = [p.a.sge(0, 8)];
    let remotes = [
        p.b.region.remote(0),
        bad,
        p.b.region.remote(8),
        p.b.region.remote(16),
    ];
    let reads: Vec<_> = remotes.iter().map(|&remote| (remote, &sg[..])).collect();
    assert_eq!(
        read_batch_statuses(&p.a, &reads),
        second_of_four_failed(WcStatus::RemoteAccessError)
    );
    assert_eq!(p.a.qp.state(), QpState::Error);
    assert!(p
        .a
        .qp
        .post_recv(&[RecvWr {
            wr_id: 9,
            sg_list: &sg
        }])
        .is_err());
}

pub fn misuse_is_refused_without_effect<D: Domain>(open: Open<D>) {
    let p = Pair::new(open, 4096);
    let invalid = |result: kvcm_transport::Result<()>| {
        assert!(
            matches!(result, Err(TransportError::InvalidArgument(_))),
            "{result:?}"
        );
    };
    let post_one = |op: SendOp, sg_list: &[Sge]| {
        p.a.qp.post_send(&[SendWr {
            wr_id: 1,
            op,
            sg_list,
            signaled: true,
        }])
    };
    let zero = [p.a.sge(0, 0)];
    invalid(post_one(read(p.b.region.remote(0)), &zero));
    invalid(post_one(read(p.b.region.remote(0)), &[]));
    let unaligned = SendOp::FetchAdd {
        remote: p.b.region.remote(4),
        add: 1,
    };
    invalid(post_one(unaligned, &[p.a.sge(0, 8)]));
    let wide = SendOp::FetchAdd {
        remote: p.b.region.remote(8),
        add: 1,
    };
    invalid(post_one(wide, &[p.a.sge(0, 16)]));
    invalid(p.a.qp.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: &zero,
    }]));
    assert!(p.a.domain.alloc(0).is_err());
    assert!(p.a.domain.register(&p.a.memory, 0, 0, Access::ALL).is_err());
    assert!(p
        .a
        .domain
        .register(&p.a.memory, 4000, 200, Access::ALL)
        .is_err());
    assert!(
        p.a.domain
            .register(&p.a.memory, 0, 8, Access::REMOTE_WRITE)
            .is_err(),
        "remote write needs local write"
    );
    assert!(
        p.a.memory.fetch_add_u64(3, 1).is_err(),
        "unaligned local atomic"
    );
    // A QP that is not connected refuses sends; connecting twice is refused.
    let lonely =
        p.a.domain
            .create_qp(&p.a.send_cq, &p.a.recv_cq, QpConfig::default())
            .unwrap();
    let err = lonely.post_send(&[SendWr {
        wr_id: 1,
        op: read(p.b.region.remote(0)),
        sg_list: &[p.a.sge(0, 8)],
        signaled: true,
    }]);
    assert!(
        matches!(err, Err(TransportError::QpState { .. })),
        "{err:?}"
    );
    assert!(p.a.qp.connect(&p.b.qp.endpoint()).is_err());
    assert!(lonely
        .connect(&kvcm_transport::QpEndpoint(b"nonsense".to_vec()))
        .is_err());
    no_completion(&p.a.send_cq, Duration::from_millis(20));
    assert_eq!(
        p.a.qp.state(),
        QpState::ReadyToSend,
        "refused calls changed nothing"
    );
}

pub fn overlapping_registration_is_refused<D: Domain>(open: Open<D>) {
    let domain = open();
    let memory = domain.alloc(8192).unwrap();
    let first = domain.register(&memory, 0, 4096, Access::ALL).unwrap();
    let err = domain
        .register(&memory, 4000, 1000, Access::ALL)
        .unwrap_err();
    assert!(
        matches!(err, TransportError::OverlappingRegistration { .. }),
        "{err}"
    );
    let second = domain
        .register(&memory, 4096, 4096, Access::REMOTE_READ)
        .unwrap();
    assert_ne!(first.rkey(), second.rkey());
    drop(first);
    assert!(
        domain.register(&memory, 0, 4096, Access::ALL).is_ok(),
        "deregistration frees the range"
    );
}

pub fn receive_too_small_is_local_length_error<D: Domain>(open: Open<D>) {
    let p = Pair::new(open, 4096);
    p.b.post_recv(5, &[p.b.sge(0, 16)]);
    p.a.post(1, SendOp::Send { imm: None }, &[p.a.sge(0, 64)]);
    let recv = completions(&p.b.recv_cq, 1);
    // Providers differ in the receive's status: a local length error (the soft provider,
    // mlx5), or the invalid-request error the responder NAKs with (kernel rxe, seen in the
    // rxe VM). Either way the receive fails and nothing is scattered.
    assert_eq!(recv[0].wr_id, 5);
    assert!(
        matches!(
            recv[0].status,
            WcStatus::LocalLengthError | WcStatus::RemoteInvalidRequest
        ),
        "{:?}",
        recv[0].status
    );
    assert_eq!(p.b.bytes(0, 16), [0; 16], "nothing was scattered");
}

pub fn queue_depth_is_enforced<D: Domain>(open: Open<D>) {
    let config = QpConfig {
        max_send_wr: 4,
        max_recv_wr: 2,
        max_sge: 2,
    };
    let p = Pair::with_config(open, 4096, config);
    let sg = [p.a.sge(0, 8)];
    let wrs: Vec<SendWr> = (0..5)
        .map(|i| SendWr {
            wr_id: i,
            op: read(p.b.region.remote(0)),
            sg_list: &sg,
            signaled: true,
        })
        .collect();
    assert!(matches!(
        p.a.qp.post_send(&wrs),
        Err(TransportError::QueueFull { .. })
    ));
    let three = [p.a.sge(0, 8), p.a.sge(8, 8), p.a.sge(16, 8)];
    let err = p.a.qp.post_send(&[SendWr {
        wr_id: 1,
        op: read(p.b.region.remote(0)),
        sg_list: &three,
        signaled: true,
    }]);
    assert!(matches!(err, Err(TransportError::InvalidArgument(_))));
    let recvs: Vec<RecvWr> = (0..3)
        .map(|i| RecvWr {
            wr_id: i,
            sg_list: &sg,
        })
        .collect();
    assert!(matches!(
        p.b.qp.post_recv(&recvs),
        Err(TransportError::QueueFull { .. })
    ));
    p.a.qp.post_send(&wrs[..4]).unwrap();
    assert_eq!(completions(&p.a.send_cq, 4).len(), 4);
    p.a.qp
        .post_send(&wrs[..4])
        .expect("slots are free again after completion");
    completions(&p.a.send_cq, 4);
    // Unsignaled requests are retired by the signaled completion after them: once it is
    // seen, the whole depth can be posted again at once.
    let quiet: Vec<SendWr> = (0..4)
        .map(|i| SendWr {
            signaled: i == 3,
            ..wrs[i]
        })
        .collect();
    for round in 0..3 {
        p.a.qp.post_send(&quiet).unwrap_or_else(|e| {
            panic!("round {round}: the slots of a completed batch are free: {e}")
        });
        assert_eq!(completions(&p.a.send_cq, 1)[0].wr_id, 3);
    }
}

pub fn many_qps_many_outstanding<D: Domain>(open: Open<D>) {
    let (a, b) = (open(), open());
    let len = 64 * 1024;
    let memory_b = b.alloc(len).unwrap();
    let region_b = b.register(&memory_b, 0, len, Access::ALL).unwrap();
    memory_b.write(0, &pattern(len, 8)).unwrap();
    let memory_a = a.alloc(len * 16).unwrap();
    let region_a = a.register(&memory_a, 0, len * 16, Access::ALL).unwrap();
    let cq_a = a.create_cq().unwrap();
    let cq_b = b.create_cq().unwrap();
    let qps: Vec<_> = (0..16)
        .map(|_| {
            let qa = a.create_qp(&cq_a, &cq_a, QpConfig::default()).unwrap();
            let qb = b.create_qp(&cq_b, &cq_b, QpConfig::default()).unwrap();
            connect(&qa, &qb);
            (qa, qb)
        })
        .collect();
    for (q, (qa, _)) in qps.iter().enumerate() {
        let sges: Vec<Sge> = (0..256)
            .map(|i| region_a.sge(q * len + i * 256, 256))
            .collect();
        let wrs: Vec<SendWr> = (0..256)
            .map(|i| SendWr {
                wr_id: (q * 1000 + i) as u64,
                op: read(region_b.remote(i * 256)),
                sg_list: &sges[i..=i],
                signaled: true,
            })
            .collect();
        qa.post_send(&wrs).unwrap();
    }
    let done = completions(&cq_a, 16 * 256);
    assert!(done.iter().all(|c| c.status == WcStatus::Success));
    for (q, (qa, _)) in qps.iter().enumerate() {
        let ids: Vec<u64> = done
            .iter()
            .filter(|c| c.qpn == qa.qpn())
            .map(|c| c.wr_id)
            .collect();
        assert_eq!(
            ids,
            (0..256).map(|i| (q * 1000 + i) as u64).collect::<Vec<_>>(),
            "per-QP order"
        );
        let mut got = vec![0u8; len];
        memory_a.read(q * len, &mut got).unwrap();
        assert!(got == pattern(len, 8), "qp {q} data");
    }
}

pub fn atomics_under_contention_are_exact<D: Domain + 'static>(open: Open<D>) {
    const CLIENTS: usize = 4;
    const ADDS: usize = 500;
    const LOCAL_ADDS: u64 = 20_000;
    let server = Arc::new(open());
    let memory = server.alloc(4096).unwrap();
    let region = server.register(&memory, 0, 4096, Access::ALL).unwrap();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let side = Side::new(open(), 4096, QpConfig::default());
            let cq = server.create_cq().unwrap();
            let qp = server.create_qp(&cq, &cq, QpConfig::default()).unwrap();
            connect(&side.qp, &qp);
            (side, qp, cq)
        })
        .collect();
    let word = region.remote(8);
    let local_adds = || {
        (0..LOCAL_ADDS).for_each(|_| {
            memory.fetch_add_u64(8, 1).unwrap();
        })
    };
    // The soft providers make CPU and remote atomics on one word atomic with each other. On
    // verbs that holds only for devices with IBV_ATOMIC_GLOB; rxe (and most HCAs) offer
    // IBV_ATOMIC_HCA — remote atomics are atomic among themselves only (rxe lost 2 of 22,000
    // adds in a CI run) — so there the local adds run after the remote ones.
    let concurrent_local = server.provider_name() != "verbs";
    std::thread::scope(|scope| {
        if concurrent_local {
            scope.spawn(local_adds);
        }
        for (side, _, _) in &clients {
            scope.spawn(move || {
                for batch in 0..ADDS / 50 {
                    let sges: Vec<Sge> = (0..50).map(|i| side.sge(i * 8, 8)).collect();
                    let wrs: Vec<SendWr> = (0..50)
                        .map(|i| SendWr {
                            wr_id: (batch * 50 + i) as u64,
                            op: SendOp::FetchAdd {
                                remote: word,
                                add: 1,
                            },
                            sg_list: &sges[i..=i],
                            signaled: true,
                        })
                        .collect();
                    side.qp.post_send(&wrs).unwrap();
                    assert!(completions(&side.send_cq, 50)
                        .iter()
                        .all(|c| c.status == WcStatus::Success));
                }
            });
        }
    });
    if !concurrent_local {
        local_adds();
    }
    assert_eq!(
        memory.load_u64(8).unwrap(),
        (CLIENTS * ADDS) as u64 + LOCAL_ADDS
    );
}

pub fn transfers_of_64_mib<D: Domain>(open: Open<D>) {
    const LEN: usize = 64 << 20;
    let p = Pair::new(open, LEN);
    let data = pattern(LEN, 9);
    p.a.fill(0, &data);
    p.a.post(1, write(p.b.region.remote(0)), &[p.a.sge(0, LEN as u32)]);
    assert_eq!(completions(&p.a.send_cq, 1)[0].status, WcStatus::Success);
    assert!(p.b.bytes(0, LEN) == data, "64 MiB WRITE landed intact");
    p.a.fill(0, &[0; 4096]);
    p.b.fill(LEN - 4096, &[0xab; 4096]);
    p.a.post(2, read(p.b.region.remote(0)), &[p.a.sge(0, LEN as u32)]);
    let done = completions(&p.a.send_cq, 1);
    assert_eq!(
        (done[0].status, done[0].byte_len),
        (WcStatus::Success, LEN as u32)
    );
    let mut expected = data;
    expected[LEN - 4096..].fill(0xab);
    assert!(p.a.bytes(0, LEN) == expected, "64 MiB READ landed intact");
}

pub fn large_scatter_gather_and_large_errors<D: Domain>(open: Open<D>) {
    const PIECE: usize = 100 << 10;
    let p = Pair::new(open, 8 * PIECE);
    p.b.fill(0, &pattern(3 * PIECE, 11));
    let scatter = [
        p.a.sge(PIECE, PIECE as u32),
        p.a.sge(5 * PIECE, PIECE as u32),
        p.a.sge(3 * PIECE, PIECE as u32),
    ];
    p.a.post(1, read(p.b.region.remote(0)), &scatter);
    assert_eq!(completions(&p.a.send_cq, 1)[0].byte_len, 3 * PIECE as u32);
    let mut got = p.a.bytes(PIECE, PIECE);
    got.extend(p.a.bytes(5 * PIECE, PIECE));
    got.extend(p.a.bytes(3 * PIECE, PIECE));
    assert!(
        got == pattern(3 * PIECE, 11),
        "large READ scattered over three elements"
    );
    let gather = [
        p.a.sge(3 * PIECE, PIECE as u32),
        p.a.sge(PIECE, PIECE as u32),
    ];
    p.a.post(2, write(p.b.region.remote(4 * PIECE)), &gather);
    completions(&p.a.send_cq, 1);
    assert!(p.b.bytes(4 * PIECE, 2 * PIECE) == [&got[2 * PIECE..], &got[..PIECE]].concat());
    let mut bad = p.b.region.remote(0);
    bad.rkey ^= 0x33;
    expect_failure(
        &p.a,
        write(bad),
        &[p.a.sge(0, 4 * PIECE as u32)],
        WcStatus::RemoteAccessError,
    );
    assert!(
        p.b.bytes(0, PIECE) == pattern(PIECE, 11),
        "a refused large WRITE wrote nothing"
    );
    let q = Pair::new(open, 8 * PIECE);
    let beyond = q.b.region.remote(6 * PIECE);
    expect_failure(
        &q.a,
        read(beyond),
        &[q.a.sge(0, 4 * PIECE as u32)],
        WcStatus::RemoteAccessError,
    );
}

pub fn peer_gone_mid_flight_fails_outstanding<D: Domain>(open: Open<D>) {
    let Pair { a, b } = Pair::new(open, 1 << 20);
    let probe = b.region.remote(0);
    // SENDs wait at the peer for receive buffers that never come: they are in flight
    // (on the shared-memory wire they are already delivered to the peer's ring).
    let sg = [a.sge(0, 64)];
    let sends: Vec<SendWr> = (0..8)
        .map(|i| SendWr {
            wr_id: i,
            op: SendOp::Send { imm: None },
            sg_list: &sg,
            signaled: true,
        })
        .collect();
    a.qp.post_send(&sends).unwrap();
    drop(b);
    expect_peer_gone(&a, 0..8, probe);
}

/// After the peer vanished: the queue pair breaks, every request in `outstanding`
/// completes exactly once (an error unless it finished before the loss), later posts are
/// refused, and nothing hangs. `probe` is an address that was valid at the peer.
pub fn expect_peer_gone<D: Domain>(
    a: &Side<D>,
    outstanding: std::ops::Range<u64>,
    probe: RemoteAddr,
) {
    let mut probes = 0u64;
    eventually("the loss of the peer to break the queue pair", || {
        if a.qp.state() == QpState::Error {
            return true;
        }
        probes += 1;
        let wr = SendWr {
            wr_id: 1 << 40 | probes,
            op: SendOp::Read(probe),
            sg_list: &[a.sge(8, 8)],
            signaled: false,
        };
        let _ = a.qp.post_send(&[wr]);
        false
    });
    let mut seen = Vec::new();
    let deadline = Instant::now() + DEADLINE;
    while !outstanding.clone().all(|id| seen.contains(&id)) {
        assert!(
            Instant::now() < deadline,
            "outstanding requests never completed: saw {seen:?}"
        );
        let mut buf = vec![WorkCompletion::EMPTY; 64];
        a.send_cq.wait(Duration::from_millis(50)).unwrap();
        let n = a.send_cq.poll(&mut buf);
        seen.extend(
            buf[..n]
                .iter()
                .map(|c| c.wr_id)
                .filter(|id| outstanding.contains(id)),
        );
    }
    assert_eq!(
        seen.len(),
        outstanding.count(),
        "each outstanding request completed once: {seen:?}"
    );
    let wr = SendWr {
        wr_id: 1,
        op: SendOp::Send { imm: None },
        sg_list: &[a.sge(0, 8)],
        signaled: true,
    };
    assert!(matches!(
        a.qp.post_send(&[wr]),
        Err(TransportError::QpState { .. })
    ));
}

pub fn completion_fd_wakes_a_waiter<D: Domain>(open: Open<D>) {
    let p = Pair::new(open, 4096);
    assert!(!p.a.send_cq.wait(Duration::from_millis(10)).unwrap());
    p.a.post(1, read(p.b.region.remote(0)), &[p.a.sge(0, 8)]);
    assert!(p.a.send_cq.wait(DEADLINE).unwrap());
    let fd = p.a.send_cq.event_fd();
    assert!(fd >= 0);
    assert_eq!(completions(&p.a.send_cq, 1)[0].wr_id, 1);
}

/// `len` bytes of caller-owned memory at an odd address (3 bytes into a heap buffer), and
/// a flag raised when the memory is given back.
fn caller_memory(len: usize) -> (HostMemory, Arc<AtomicBool>) {
    let buffer: *mut [u8] = Box::into_raw(vec![0u8; len + 3].into_boxed_slice());
    let released = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&released);
    let owned = buffer as *mut u8 as usize; // the release frees it by address
                                            // SAFETY: `buffer` is a live allocation of `len + 3` bytes, so 3 bytes in there are
                                            // `len`; the release frees it (rebuilding the box from the same pointer and length)
                                            // only once the memory is dropped, and the test touches it only through the
                                            // memory's copies.
    let memory = unsafe {
        HostMemory::from_raw_parts(buffer.cast::<u8>().add(3), len, move || {
            let slice = std::ptr::slice_from_raw_parts_mut(owned as *mut u8, len + 3);
            // SAFETY: the box leaked above, freed once here.
            drop(Box::from_raw(slice));
            flag.store(true, Ordering::SeqCst);
        })
    };
    (memory.expect("caller memory"), released)
}

/// Caller-owned memory serves as local scatter-gather elements on every provider (READ
/// into it, WRITE and SEND from it, RECV into it); peers may reach it only on verbs (the
/// soft providers refuse remote rights with `Unsupported`, changing nothing); and it goes
/// back to its owner only after the handles and registrations are gone.
pub fn caller_memory_in_scatter_gather_and_remote_only_on_verbs<D: Domain<Memory = HostMemory>>(
    open: Open<D>,
) {
    let p = Pair::new(open, 8192);
    let (mine, mine_released) = caller_memory(4096);
    assert!(mine.is_caller_owned() && !p.a.memory.is_caller_owned());
    let local = p.a.domain.register(&mine, 0, 2048, Access::LOCAL_WRITE);
    let local = local.expect("caller memory registers for local use");
    p.b.fill(100, &pattern(300, 7));
    p.a.post(1, read(p.b.region.remote(100)), &[local.sge(5, 300)]);
    assert_eq!(completions(&p.a.send_cq, 1)[0].status, WcStatus::Success);
    let mut got = vec![0u8; 300];
    mine.read(5, &mut got).unwrap();
    assert_eq!(got, pattern(300, 7), "READ landed in caller memory");

    mine.write(1000, &pattern(64, 8)).unwrap();
    p.a.post(2, write(p.b.region.remote(6000)), &[local.sge(1000, 64)]);
    assert_eq!(completions(&p.a.send_cq, 1)[0].status, WcStatus::Success);
    assert_eq!(
        p.b.bytes(6000, 64),
        pattern(64, 8),
        "WRITE from caller memory"
    );

    let (theirs, theirs_released) = caller_memory(256);
    let inbox = p.b.domain.register(&theirs, 0, 256, Access::LOCAL_WRITE);
    let inbox = inbox.expect("a receive buffer in caller memory");
    p.b.post_recv(9, &[inbox.sge(10, 200)]);
    p.a.post(3, SendOp::Send { imm: None }, &[local.sge(1000, 64)]);
    assert_eq!(completions(&p.a.send_cq, 1)[0].status, WcStatus::Success);
    let received = completions(&p.b.recv_cq, 1);
    assert_eq!((received[0].wr_id, received[0].byte_len), (9, 64));
    let mut got = vec![0u8; 64];
    theirs.read(10, &mut got).unwrap();
    assert_eq!(got, pattern(64, 8), "SEND from and RECV into caller memory");

    let shared = Access::LOCAL_WRITE | Access::REMOTE_READ;
    match p.a.domain.register(&mine, 2048, 2048, shared) {
        Err(TransportError::Unsupported(why)) => {
            assert!(p.a.domain.provider_name().starts_with("soft"), "{why}");
            assert!(
                why.contains("verbs"),
                "the refusal names the way out: {why}"
            );
            // Nothing changed: the range is free for a local registration.
            let again = p.a.domain.register(&mine, 2048, 2048, Access::LOCAL_WRITE);
            drop(again.expect("the refused range is still free"));
        }
        Ok(served) => {
            assert_eq!(p.a.domain.provider_name(), "verbs", "only verbs serves it");
            mine.write(3000, &pattern(40, 9)).unwrap();
            p.b.post(4, read(served.remote(3000 - 2048)), &[p.b.sge(0, 40)]);
            assert_eq!(completions(&p.b.send_cq, 1)[0].status, WcStatus::Success);
            assert_eq!(
                p.b.bytes(0, 40),
                pattern(40, 9),
                "a peer READ caller memory"
            );
        }
        Err(other) => panic!("remote rights on caller memory: {other}"),
    }

    drop(mine);
    assert!(
        !mine_released.load(Ordering::SeqCst),
        "a live registration holds caller memory"
    );
    drop(local);
    eventually("the caller's memory is given back", || {
        mine_released.load(Ordering::SeqCst)
    });
    drop((theirs, inbox));
    eventually("the receive buffer is given back", || {
        theirs_released.load(Ordering::SeqCst)
    });
}
