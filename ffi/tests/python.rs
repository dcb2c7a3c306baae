//! The Python package (ffi/python) against an in-process server: its unittest suite runs
//! with KVCM_FFI_LIB set to this test run's libkvcm_ffi.so and the server's addresses, the
//! written keys and the Rust client's answers in `KVCM_TEST_*` variables; `tests_auth`
//! against a server requiring API keys, `tests_tls` against one serving mutual TLS (its
//! PEM files in `KVCM_TEST_TLS_*`).
//! `python_overhead_report` (ignored: a measurement, not a check) runs bench_overhead.py.

mod common;

use std::process::Command;

use common::Harness;
use kvcm::proto::meta::CacheLocation;
use kvcm_client::ClientError;

const INSTANCE: &str = "ffi-py";
/// Keys written before the tests run.
const WRITTEN: [i64; 16] = [
    201, 202, 203, 204, 205, 206, 207, 208, 209, 210, 211, 212, 213, 214, 215, 216,
];
/// A prefix query: the written keys, then one never written (the match stops there).
const PREFIX: [i64; 18] = [
    201, 202, 203, 204, 205, 206, 207, 208, 209, 210, 211, 212, 213, 214, 215, 216, 999, 217,
];
const BATCH: [i64; 4] = [999, 203, 201, 998];
const SW_SIZE: i32 = 3;

fn joined(keys: &[i64]) -> String {
    keys.iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// A `python3` command in ffi/python with the library and the harness's addresses.
fn python(harness: &Harness) -> Command {
    let mut command = Command::new("python3");
    command
        .current_dir(common::ffi_dir().join("python"))
        .env("PYTHONPATH", common::ffi_dir().join("python"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("KVCM_FFI_LIB", common::library())
        .env("KVCM_TEST_GRPC", &harness.grpc)
        .env("KVCM_TEST_HTTP", &harness.http)
        .env("KVCM_TEST_INSTANCE", INSTANCE);
    command
}

/// A server with the written keys, and a `python3` command with the environment the
/// scripts read.
fn prepared(harness: &Harness) -> Command {
    harness.register(INSTANCE);
    harness.write(INSTANCE, &WRITTEN);
    let rust = harness.client(INSTANCE, None);
    let answer = |result: Result<Vec<CacheLocation>, ClientError>| {
        common::lines(&result.expect("Rust client answers")).join("\n")
    };
    let mut command = python(harness);
    command
        .env("KVCM_TEST_PREFIX_KEYS", joined(&PREFIX))
        .env("KVCM_TEST_PREFIX", answer(rust.prefix_match(&PREFIX)))
        .env("KVCM_TEST_BATCH_KEYS", joined(&BATCH))
        .env("KVCM_TEST_BATCH", answer(rust.batch_get(&BATCH)))
        .env("KVCM_TEST_SW_KEYS", joined(&WRITTEN))
        .env("KVCM_TEST_SW_SIZE", SW_SIZE.to_string())
        .env(
            "KVCM_TEST_SW",
            answer(rust.sliding_window(&WRITTEN, SW_SIZE)),
        );
    command
}

/// Runs `command`; asserts it succeeded and returns stdout and stderr together.
fn run(mut command: Command) -> String {
    let output = command.output().expect("run python3");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "python3 failed:\n{text}");
    text
}

#[test]
fn python_package_tests() {
    if !common::require_tool("python3", "python_package_tests") {
        return;
    }
    let harness = Harness::start();
    let mut command = prepared(&harness);
    command.args(["-m", "unittest", "discover", "-v", "-s", "tests"]);
    let output = run(command);
    println!("{output}");
    assert!(output.contains("\nOK"), "{output}");
}

#[test]
fn python_auth_tests() {
    if !common::require_tool("python3", "python_auth_tests") {
        return;
    }
    const KEYS: [i64; 3] = [301, 302, 303];
    let harness = Harness::start_with_key(INSTANCE);
    harness.register(INSTANCE);
    harness.write(INSTANCE, &KEYS);
    let mut command = python(&harness);
    command.env("KVCM_TEST_KEYS", joined(&KEYS)).env(
        "KVCM_TEST_API_KEY",
        harness.api_key.as_deref().expect("a key"),
    );
    command.args(["-m", "unittest", "discover", "-v", "-s", "tests_auth"]);
    let output = run(command);
    println!("{output}");
    assert!(
        output.contains("Ran 4 tests") && output.contains("\nOK"),
        "{output}"
    );
}

#[test]
fn python_tls_tests() {
    if !common::require_tool("python3", "python_tls_tests") {
        return;
    }
    const KEYS: [i64; 3] = [401, 402, 403];
    let harness = Harness::start_tls();
    harness.register(INSTANCE);
    harness.write(INSTANCE, &KEYS);
    let files = harness.tls.as_ref().expect("TLS files");
    let mut command = python(&harness);
    command
        .env("KVCM_TEST_KEYS", joined(&KEYS))
        .env("KVCM_TEST_TLS_CA", &files.ca)
        .env("KVCM_TEST_TLS_CERT", &files.cert)
        .env("KVCM_TEST_TLS_KEY", &files.key);
    command.args(["-m", "unittest", "discover", "-v", "-s", "tests_tls"]);
    let output = run(command);
    println!("{output}");
    assert!(
        output.contains("Ran 4 tests") && output.contains("\nOK"),
        "{output}"
    );
}

#[test]
#[ignore = "a measurement: cargo test -p kvcm-ffi --test python -- --ignored --nocapture"]
fn python_overhead_report() {
    if !common::require_tool("python3", "python_overhead_report") {
        return;
    }
    let harness = Harness::start();
    let mut command = prepared(&harness);
    command.arg("bench_overhead.py");
    println!("{}", run(command));
}
