//! Completions awaited in an async reactor through the completion queue's event fd
//! (tokio's `AsyncFd`), on both soft wires: arm, await readability, poll.

mod conformance;

use conformance::{pattern, Pair};
use kvcm_transport::soft::{SoftConfig, SoftDomain, Wire};
use kvcm_transport::{CompletionQueue, Region, SendOp, WcStatus, WorkCompletion};
use std::os::fd::RawFd;
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

async fn next_completion<C: CompletionQueue>(cq: &C, fd: &AsyncFd<RawFd>) -> WorkCompletion {
    let mut out = [WorkCompletion::EMPTY];
    loop {
        if cq.poll(&mut out) == 1 {
            return out[0];
        }
        if !cq.arm().expect("arm") {
            fd.readable().await.expect("readable").clear_ready();
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn completions_are_awaited_through_the_event_fd() {
    for wire in [Wire::Tcp, Wire::Shm] {
        let p = Pair::new(
            &|| SoftDomain::open(SoftConfig::with_wire(wire)).unwrap(),
            8192,
        );
        // SAFETY: the event fd belongs to `p`'s completion queue, which stays open and
        // unchanged until after `fd` (declared later) is dropped.
        let fd =
            unsafe { AsyncFd::register_with_interest(p.a.send_cq.event_fd(), Interest::READABLE) }
                .expect("register the event fd");
        p.b.fill(0, &pattern(512, 3));
        for wr_id in 0..20 {
            p.a.post(
                wr_id,
                SendOp::Read(p.b.region.remote(0)),
                &[p.a.sge(0, 512)],
            );
            let wait =
                tokio::time::timeout(Duration::from_secs(30), next_completion(&p.a.send_cq, &fd));
            let completion = wait.await.expect("a completion within the deadline");
            assert_eq!(
                (completion.wr_id, completion.status),
                (wr_id, WcStatus::Success),
                "{wire:?}"
            );
        }
        assert_eq!(p.a.bytes(0, 512), pattern(512, 3));
    }
}
