//! The conformance suite, generic over any provider's [`Domain`].
//!
//! Each case gets a factory opening fresh domains (two domains stand for two hosts) and
//! asserts observable behaviour: bytes in memory, completion statuses and order, errors.

#![allow(dead_code)] // each test binary uses the cases it instantiates

pub mod cases;
pub mod peer;

use kvcm_transport::{
    Access, CompletionQueue, Domain, Memory, QpConfig, QueuePair, RecvWr, Region, SendOp, SendWr,
    Sge, WorkCompletion,
};
use std::time::{Duration, Instant};

/// How long any single wait in the suite may take before the case fails.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// One side of a connection: domain, memory, one all-access region over it, CQs and QP.
pub struct Side<D: Domain> {
    pub domain: D,
    pub memory: D::Memory,
    pub region: D::Region,
    pub send_cq: D::Cq,
    pub recv_cq: D::Cq,
    pub qp: D::Qp,
}

impl<D: Domain> Side<D> {
    pub fn new(domain: D, len: usize, config: QpConfig) -> Self {
        let memory = domain.alloc(len).expect("alloc");
        let region = domain
            .register(&memory, 0, len, Access::ALL)
            .expect("register");
        let send_cq = domain.create_cq().expect("send cq");
        let recv_cq = domain.create_cq().expect("recv cq");
        let qp = domain.create_qp(&send_cq, &recv_cq, config).expect("qp");
        Side {
            domain,
            memory,
            region,
            send_cq,
            recv_cq,
            qp,
        }
    }

    /// A scatter-gather element over the side's region.
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        self.region.sge(offset, len)
    }

    /// Posts one signaled work request.
    pub fn post(&self, wr_id: u64, op: SendOp, sg_list: &[Sge]) {
        self.qp
            .post_send(&[SendWr {
                wr_id,
                op,
                sg_list,
                signaled: true,
            }])
            .expect("post_send");
    }

    /// Posts one receive buffer.
    pub fn post_recv(&self, wr_id: u64, sg_list: &[Sge]) {
        self.qp
            .post_recv(&[RecvWr { wr_id, sg_list }])
            .expect("post_recv");
    }

    pub fn fill(&self, offset: usize, data: &[u8]) {
        self.memory.write(offset, data).expect("write memory");
    }

    pub fn bytes(&self, offset: usize, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        self.memory.read(offset, &mut out).expect("read memory");
        out
    }
}

/// Two connected sides with `len` bytes each.
pub struct Pair<D: Domain> {
    pub a: Side<D>,
    pub b: Side<D>,
}

impl<D: Domain> Pair<D> {
    pub fn new(open: &dyn Fn() -> D, len: usize) -> Self {
        Self::with_config(open, len, QpConfig::default())
    }

    pub fn with_config(open: &dyn Fn() -> D, len: usize, config: QpConfig) -> Self {
        let a = Side::new(open(), len, config);
        let b = Side::new(open(), len, config);
        connect(&a.qp, &b.qp);
        Pair { a, b }
    }
}

/// Connects two queue pairs by swapping endpoints.
pub fn connect<Q: QueuePair>(a: &Q, b: &Q) {
    let (ea, eb) = (a.endpoint(), b.endpoint());
    a.connect(&eb).expect("connect a");
    b.connect(&ea).expect("connect b");
}

/// Waits for exactly `count` completions on `cq` (fails the test at the deadline).
pub fn completions<C: CompletionQueue>(cq: &C, count: usize) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + DEADLINE;
    let mut got = Vec::with_capacity(count);
    let mut buf = vec![WorkCompletion::EMPTY; 64];
    while got.len() < count {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "timed out with {} of {count} completions: {got:?}",
            got.len()
        );
        let n = cq.poll(&mut buf);
        got.extend_from_slice(&buf[..n]);
        if n == 0 {
            cq.wait(left.min(Duration::from_millis(100)))
                .expect("cq wait");
        }
    }
    got
}

/// Asserts that no completion arrives on `cq` within `quiet`.
pub fn no_completion<C: CompletionQueue>(cq: &C, quiet: Duration) {
    let mut buf = [WorkCompletion::EMPTY];
    assert!(!cq.wait(quiet).expect("cq wait"), "unexpected completion");
    assert_eq!(cq.poll(&mut buf), 0);
}

/// A deterministic byte pattern.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Polls `condition` until it holds or the deadline passes.
pub fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Calls `$callback!($($args)*; <every case name>)`: the one list of the suite's cases.
#[macro_export]
macro_rules! with_case_names {
    ($callback:ident!($($args:tt)*)) => {
        $crate::$callback! {$($args)*;
            read_and_write_move_bytes, scatter_gather_lists, send_recv_and_immediates,
            atomics_return_old_values, unsignaled_requests_complete_silently,
            batch_completes_in_order, bad_rkey_is_remote_access_error, out_of_bounds_is_remote_access_error,
            missing_access_rights_are_refused, deregistered_region_is_unreachable,
            bad_lkey_is_local_protection_error, protection_domains_isolate_keys, error_flushes_the_rest_and_breaks_the_qp,
            local_error_mid_batch_flushes_the_rest, caller_memory_in_scatter_gather_and_remote_only_on_verbs,
            misuse_is_refused_without_effect, overlapping_registration_is_refused,
            receive_too_small_is_local_length_error, queue_depth_is_enforced,
            many_qps_many_outstanding, atomics_under_contention_are_exact,
            transfers_of_64_mib, large_scatter_gather_and_large_errors, peer_gone_mid_flight_fails_outstanding, completion_fd_wakes_a_waiter}
    };
}

/// Instantiates every case of the suite as a `#[test]` for the domain opened by `$open`.
#[macro_export]
macro_rules! conformance_suite {
    ($domain:ty, $open:expr) => {
        $crate::with_case_names!(conformance_tests!($domain, $open));
    };
}

/// One `#[test]` per case (used through [`conformance_suite!`]).
#[macro_export]
macro_rules! conformance_tests {
    ($domain:ty, $open:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                conformance::cases::$case::<$domain>(&$open);
            }
        )*
    };
}

/// Runs every case in sequence inside one test (for providers that may be absent); a
/// failing case does not stop the others, and the test fails naming every failed case.
/// Cases named in `KVCM_CONFORMANCE_XFAIL` (comma-separated: known provider bugs, see
/// docs/rxe-vm.md) are expected to fail: each such failure is reported loudly, and one that
/// passes fails the test (so the list is kept true).
#[macro_export]
macro_rules! conformance_run_all {
    ($domain:ty, $open:expr; $($case:ident),* $(,)?) => {
        let expected = std::env::var("KVCM_CONFORMANCE_XFAIL").unwrap_or_default();
        let expected: Vec<&str> = expected.split(',').map(str::trim).filter(|c| !c.is_empty()).collect();
        let mut failed: Vec<&str> = Vec::new();
        let mut passed_unexpectedly: Vec<&str> = Vec::new();
        $(
            let case = stringify!($case);
            let outcome = std::panic::catch_unwind(|| conformance::cases::$case::<$domain>(&$open));
            match (outcome.is_ok(), expected.contains(&case)) {
                (false, true) => conformance::shout(&format!("EXPECTED FAILURE (a known provider bug, docs/rxe-vm.md): {case}")),
                (false, false) => failed.push(case),
                (true, true) => passed_unexpectedly.push(case),
                (true, false) => {}
            }
        )*
        assert!(failed.is_empty(), "failed conformance cases: {failed:?}");
        assert!(
            passed_unexpectedly.is_empty(),
            "cases in KVCM_CONFORMANCE_XFAIL now pass (remove them): {passed_unexpectedly:?}"
        );
    };
}

/// Writes straight to the terminal, past the test harness's output capture.
pub fn shout(message: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "\n*** {message} ***\n");
}
