//! The conformance suite on the `verbs` provider. It runs only where the crate is built
//! with feature `rdma` and the host has an RDMA device (a NIC, or kernel soft-RoCE: see
//! docs/transport.md); otherwise the test says loudly that it skipped and why.
//! `KVCM_VERBS_DEVICE` and `KVCM_VERBS_GID_INDEX` select the device and GID index.

mod conformance;

#[cfg(feature = "rdma")]
mod verbs {
    use super::conformance::{self, shout};
    use kvcm_transport::verbs::{VerbsConfig, VerbsDomain};
    use kvcm_transport::TransportError;

    fn config() -> VerbsConfig {
        VerbsConfig {
            device: std::env::var("KVCM_VERBS_DEVICE").ok(),
            port: 1,
            gid_index: std::env::var("KVCM_VERBS_GID_INDEX")
                .ok()
                .and_then(|i| i.parse().ok())
                .unwrap_or(0),
        }
    }

    fn open() -> VerbsDomain {
        VerbsDomain::open(&config()).expect("open verbs domain")
    }

    #[test]
    fn verbs_conformance_suite_or_loud_skip() {
        match VerbsDomain::open(&config()) {
            Err(TransportError::NoDevice(why)) => {
                shout(&format!(
                    "SKIPPED verbs conformance suite: no RDMA device ({why})"
                ));
                assert!(!why.is_empty(), "NoDevice must say why no device was found");
                return;
            }
            Err(other) => panic!("opening the verbs device failed: {other}"),
            Ok(domain) => shout(&format!(
                "running the verbs conformance suite on {}",
                domain.device_name()
            )),
        }
        crate::with_case_names!(conformance_run_all!(VerbsDomain, open));
        // Again through the provider-dispatching types the lookup path serves with.
        let open_any = || kvcm_transport::any::AnyDomain::from(open());
        crate::with_case_names!(conformance_run_all!(
            kvcm_transport::any::AnyDomain,
            open_any
        ));
    }

    /// Queue pairs whose depths add up past a completion queue's initial size all
    /// complete on it: the queue grows as they are created instead of overrunning.
    #[test]
    fn a_shared_cq_takes_every_completion_of_deep_queue_pairs_or_loud_skip() {
        use kvcm_transport::{
            Access, CompletionQueue, Domain, Memory, QpConfig, QueuePair, Region, SendOp, SendWr,
            WcStatus,
        };
        // More than any rounding of a 4096-entry queue holds (rxe gives it 8191 entries).
        const QPS: usize = 10;
        const DEPTH: usize = 1024;
        let (a, b) = match (VerbsDomain::open(&config()), VerbsDomain::open(&config())) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(TransportError::NoDevice(why)), _) => {
                shout(&format!(
                    "SKIPPED the shared-CQ depth test: no RDMA device ({why})"
                ));
                return;
            }
            (Err(other), _) | (_, Err(other)) => panic!("opening the verbs device failed: {other}"),
        };
        let config = QpConfig {
            max_send_wr: DEPTH,
            max_recv_wr: 1,
            max_sge: 1,
        };
        let (a_cq, b_cq) = (a.create_cq().expect("cq"), b.create_cq().expect("cq"));
        let local = a.alloc(4096).expect("memory");
        local.write(0, &[0xAB; 8]).expect("fill");
        let local_region = a
            .register(&local, 0, 4096, Access::LOCAL_WRITE)
            .expect("region");
        let remote = b.alloc(4096).expect("memory");
        let remote_region = b
            .register(&remote, 0, 4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .expect("region");
        let pairs: Vec<_> = (0..QPS)
            .map(|_| {
                let qp = a
                    .create_qp(&a_cq, &a_cq, config)
                    .expect("qp on the shared cq");
                let peer = b.create_qp(&b_cq, &b_cq, config).expect("peer qp");
                let (ea, eb) = (qp.endpoint(), peer.endpoint());
                qp.connect(&eb).expect("connect");
                peer.connect(&ea).expect("connect peer");
                (qp, peer)
            })
            .collect();
        // Every WRITE lands at offset 1024 but each queue pair's last one, which marks
        // offset 8 × its index: once every mark is visible, every WRITE was executed (one
        // queue pair executes in order) and its completion is due, all at once.
        let sge = [local_region.sge(0, 8)];
        for (q, (qp, _)) in pairs.iter().enumerate() {
            for batch in 0..DEPTH / 64 {
                let wrs: Vec<SendWr<'_>> = (0..64)
                    .map(|i| {
                        let last = batch * 64 + i == DEPTH - 1;
                        SendWr {
                            wr_id: (batch * 64 + i) as u64,
                            op: SendOp::Write {
                                remote: remote_region.remote(if last { 8 * q } else { 1024 }),
                                imm: None,
                            },
                            sg_list: &sge,
                            signaled: true,
                        }
                    })
                    .collect();
                qp.post_send(&wrs).expect("post within the queue's depth");
            }
        }
        let marked = || {
            let mut marks = [0u8; 8 * QPS];
            remote.read(0, &mut marks).expect("read marks");
            marks.iter().all(|&b| b == 0xAB)
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while !marked() {
            assert!(
                std::time::Instant::now() < deadline,
                "the WRITEs were not executed within 120 s"
            );
            std::thread::yield_now();
        }
        let wanted = QPS * DEPTH;
        let mut seen = 0;
        let mut completions = vec![kvcm_transport::WorkCompletion::EMPTY; 256];
        while seen < wanted {
            assert!(
                std::time::Instant::now() < deadline,
                "{seen} of {wanted} completions within 120 s"
            );
            let count = a_cq.poll(&mut completions);
            for completion in &completions[..count] {
                assert_eq!(completion.status, WcStatus::Success, "{completion:?}");
            }
            seen += count;
            if count == 0 {
                a_cq.wait(std::time::Duration::from_millis(100))
                    .expect("wait");
            }
        }
        assert_eq!(seen, wanted);
    }
}

#[cfg(not(feature = "rdma"))]
#[test]
fn verbs_conformance_suite_skipped_feature_rdma_off() {
    conformance::shout("SKIPPED verbs conformance suite: built without feature `rdma`");
}
