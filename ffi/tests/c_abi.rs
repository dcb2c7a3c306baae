//! The C ABI used from C: tests/c/client_test.c is compiled with the system `cc` against the
//! libkvcm_ffi.so of this test run and run against an in-process server over real sockets.
//! It must print exactly what the Rust client answers, on every wire, and give the codes
//! kvcm.h documents for bad input.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;

use common::Harness;
use kvcm_client::Wire;

/// Keys written before the lookups.
const WRITTEN: [i64; 5] = [101, 102, 103, 104, 105];

/// Compiles the C program into a fresh directory (kept alive by the returned guard).
fn compile() -> (tempfile::TempDir, PathBuf) {
    compile_program("client_test")
}

/// Compiles `tests/c/<name>.c` (optimised) against the library of this run.
fn compile_program(name: &str) -> (tempfile::TempDir, PathBuf) {
    let library = common::library();
    let lib_dir = library.parent().expect("library directory");
    let ffi = common::ffi_dir();
    let out = tempfile::tempdir().expect("temp dir");
    let program = out.path().join(name);
    let output = Command::new("cc")
        .args(["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&program)
        .arg("-I")
        .arg(ffi.join("include"))
        .arg(ffi.join(format!("tests/c/{name}.c")))
        .arg(format!("-L{}", lib_dir.display()))
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .arg("-lkvcm_ffi")
        .output()
        .expect("run cc");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "cc failed:\n{stderr}");
    (out, program)
}

/// Runs the program; asserts it succeeded and returns its stdout lines.
fn run(program: &PathBuf, args: &[String]) -> Vec<String> {
    let output = Command::new(program)
        .args(args)
        .output()
        .expect("run client_test");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "client_test {args:?} failed:\n{stderr}"
    );
    let stdout = String::from_utf8(output.stdout).expect("UTF-8 output");
    stdout.lines().map(str::to_string).collect()
}

fn wire_code(wire: Option<Wire>) -> &'static str {
    match wire {
        None => "0",
        Some(Wire::Tcp) => "1",
        Some(Wire::Shm) => "2",
        Some(Wire::Verbs) => "3",
    }
}

#[test]
fn c_program_prints_what_the_rust_client_answers() {
    if !common::require_tool("cc", "c_abi") {
        return;
    }
    let (_dir, program) = compile();
    let harness = Harness::start();
    harness.register("ffi-c");
    harness.write("ffi-c", &WRITTEN);
    let prefix_keys = [101, 102, 103, 104, 105, 999, 106];
    let batch_keys = [999, 103, 101];
    for wire in [None, Some(Wire::Tcp), Some(Wire::Shm)] {
        let rust = harness.client("ffi-c", wire);
        let queries = [
            ("prefix", &prefix_keys[..], rust.prefix_match(&prefix_keys)),
            ("batch", &batch_keys[..], rust.batch_get(&batch_keys)),
            ("sliding:2", &WRITTEN[..], rust.sliding_window(&WRITTEN, 2)),
        ];
        for (query, keys, expected) in queries {
            let expected = expected.expect("Rust client answers");
            let mut args = vec!["lookup".into(), query.into(), harness.grpc.clone()];
            args.extend([harness.http.clone(), "ffi-c".into(), wire_code(wire).into()]);
            args.extend(keys.iter().map(i64::to_string));
            let mut lines = run(&program, &args);
            let metrics = lines.pop().expect("a metrics line");
            assert_eq!(lines, common::lines(&expected), "{query} on {wire:?}");
            if query == "prefix" {
                assert_eq!(expected.len(), 5, "the prefix stops at the unwritten key");
                let hits = if wire.is_some() { 1 } else { 0 };
                assert_eq!(
                    metrics,
                    format!("metrics hits={hits} fallbacks=0"),
                    "{wire:?}"
                );
            }
        }
    }
}

#[test]
fn bad_input_gives_the_documented_codes() {
    if !common::require_tool("cc", "c_abi") {
        return;
    }
    let (_dir, program) = compile();
    let harness = Harness::start();
    let args = ["errors".into(), harness.grpc.clone(), harness.http.clone()];
    let codes: HashMap<String, i64> = run(&program, &args)
        .iter()
        .map(|line| {
            let (name, code) = line.split_once(' ').expect("name code");
            (name.to_string(), code.parse().expect("a number"))
        })
        .collect();
    let expected = [
        ("null_client", -1),
        ("null_keys", -1),
        ("unknown_instance", 8), // the server's INSTANCE_NOT_EXIST
        ("unknown_instance_no_message", 8),
        ("invalid_utf8", -2),
        ("unknown_wire", -3),
        ("null_grpc", -1),
        ("tls_null_ca_file", -1),
        ("tls_cert_without_key", -3),
        ("tls_server_name_not_utf8", -2),
        ("null_metrics", -1),
        ("null_count", 0),
    ];
    for (name, code) in expected {
        assert_eq!(codes.get(name), Some(&code), "{name}: {codes:?}");
    }
    assert_eq!(codes.len(), expected.len(), "{codes:?}");
}

/// C vs Rust at prefix-128 on both soft wires: the same loop (warm-up, then per-call times,
/// median) through the C ABI and through the Rust client, in one run. A benchmark, not a
/// check: run it with `cargo test --release -p kvcm-ffi --test c_abi -- --ignored
/// --nocapture`.
/// The median time in ns of `iterations` calls of `lookup`, each of which must find 128
/// locations.
fn p50_ns(iterations: usize, mut lookup: impl FnMut() -> usize) -> f64 {
    let mut times: Vec<u128> = (0..iterations)
        .map(|_| {
            let begun = std::time::Instant::now();
            assert_eq!(lookup(), 128);
            begun.elapsed().as_nanos()
        })
        .collect();
    times.sort_unstable();
    times[iterations / 2] as f64
}

#[test]
#[ignore = "a benchmark: run with --release --ignored --nocapture"]
fn c_vs_rust_prefix_128_report() {
    if !common::require_tool("cc", "c_abi") {
        return;
    }
    const ITERATIONS: usize = 20_000;
    let (_dir, program) = compile_program("bench");
    let harness = Harness::start();
    harness.register("ffi-bench");
    let keys: Vec<i64> = (1..=128).collect();
    harness.write("ffi-bench", &keys);
    for wire in [Wire::Tcp, Wire::Shm] {
        let rust = harness.client("ffi-bench", Some(wire));
        for _ in 0..1000 {
            assert_eq!(rust.prefix_match(&keys).expect("warm-up").len(), 128);
        }
        let rust_p50 = p50_ns(ITERATIONS, || {
            rust.prefix_match(&keys).expect("lookup").len()
        });
        let mut answer = Vec::new();
        let rust_into_p50 = p50_ns(ITERATIONS, || {
            rust.prefix_match_into(&keys, &mut answer).expect("lookup");
            answer.len()
        });
        let mut args = vec![
            harness.grpc.clone(),
            harness.http.clone(),
            "ffi-bench".into(),
        ];
        args.extend([
            wire_code(Some(wire)).into(),
            "128".into(),
            ITERATIONS.to_string(),
        ]);
        let line = run(&program, &args).pop().expect("a p50 line");
        let c_p50: f64 = line
            .strip_prefix("p50_ns ")
            .and_then(|n| n.parse().ok())
            .expect("p50_ns N");
        eprintln!(
            "prefix-128 on {wire:?}: Rust p50 {:.2} µs (reusing its answer: {:.2} µs), C p50 \
             {:.2} µs, C / Rust = {:.3} (C / Rust reusing its answer = {:.3})",
            rust_p50 / 1e3,
            rust_into_p50 / 1e3,
            c_p50 / 1e3,
            c_p50 / rust_p50,
            c_p50 / rust_into_p50
        );
    }
}
