//! Crash durability of `kvcm serve` on its embedded default (journal on, fsync `always`):
//! clients stream StartWriteCache → bytes into the block file → FinishWriteCache, and
//! RemoveCache, over real gRPC; the server is SIGKILLed at a random moment and restarted on
//! the same data directory. Every acknowledged finish must read back at the same URI with
//! its bytes, every acknowledged remove must stay removed, and no WRITING entry may remain.
//!
//! `KVCM_KILL_POINTS` sets the number of kill points (default 3 in the test command; the
//! long run in docs/durability.md uses 25).
//! (The same on the shared store on Redis: tests/shared_store.rs.)

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::crash::{stream, verify, Book, INSTANCE, WRITERS};
use common::TestServer;

/// SIGKILL keeps the page cache, so surviving it does not show that acknowledgements waited
/// for fdatasync: the journal's own bookkeeping does. Under `fsync = always` no write may have
/// been acknowledged before its record was synced.
async fn check_bookkeeping(server: &TestServer) {
    let (status, body) =
        common::http_request(server.address("admin_http"), "GET", "/metrics", b"").await;
    assert_eq!(status, 200);
    let text = String::from_utf8(body).expect("text");
    let counter = |name: &str| -> u64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("kvcm_journal_{name} ")))
            .unwrap_or_else(|| panic!("kvcm_journal_{name} in {text}"));
        line.rsplit(' ').next().unwrap().parse().expect("a number")
    };
    assert_eq!(counter("early_acknowledgements"), 0, "{text}");
    assert!(counter("records_acknowledged") > 0, "{text}");
    assert!(
        counter("records_synced") >= counter("records_acknowledged"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_and_removes_survive_sigkill_at_random_moments() {
    let kill_points: i64 = std::env::var("KVCM_KILL_POINTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let began = Instant::now();
    let mut server = TestServer::start().await;
    let registered = server.register(INSTANCE, 64).await;
    assert_eq!(common::code(&registered), "OK", "{registered}");
    let mut book = Book::default();
    for point in 0..kill_points {
        let stop = Arc::new(AtomicBool::new(false));
        let mut writers = Vec::new();
        for writer in 0..WRITERS {
            let first_key = 1 + (point * WRITERS + writer) * 1_000_000;
            let grpc = server.meta().await;
            writers.push(tokio::spawn(stream(grpc, first_key, stop.clone())));
        }
        // The kill moment is chosen at random: this sleep is the experiment, not a wait.
        tokio::time::sleep(Duration::from_millis(fastrand::u64(200..1500))).await;
        check_bookkeeping(&server).await;
        stop.store(true, Ordering::SeqCst);
        server = server.kill_and_restart().await;
        for writer in writers {
            book.merge(writer.await.expect("writer"));
        }
        verify(&server, &book).await;
        eprintln!("kill point {point}: {} so far", book.summary());
    }
    assert!(
        book.written.len() as i64 >= kill_points,
        "the clients got writes in: {book:?}"
    );
    eprintln!(
        "{kill_points} kill points in {:.1} s",
        began.elapsed().as_secs_f64()
    );
}
