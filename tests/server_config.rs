//! Configuration layers of `kvcm serve`, through the real binary: TOML file < `--env` <
//! environment variables; invalid settings stop the start with an error naming the key.

mod common;

use std::process::Command;

use common::TestServer;

fn write_toml(dir: &tempfile::TempDir, text: &str) -> String {
    let path = dir.path().join("kvcm.toml");
    std::fs::write(&path, text).expect("write toml");
    path.display().to_string()
}

#[tokio::test]
async fn env_overrides_the_toml_file_and_variables_override_env() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_toml(&dir, "[kvcm.service]\nenable_debug_service = false\n");
    // The harness passes --env kvcm.service.enable_debug_service=true: it beats the file.
    let server = TestServer::start_custom(&["--config", &file], &[]).await;
    assert!(server.has_listener("debug_http"));
    drop(server);
    let server = TestServer::start_custom(
        &["--config", &file],
        &[("KVCM_SERVICE_ENABLE_DEBUG_SERVICE", "false")],
    )
    .await;
    assert!(
        !server.has_listener("debug_http"),
        "the variable beats --env"
    );
    assert!(server.has_listener("admin_http"));
}

#[test]
fn invalid_settings_stop_the_start_with_the_key_named() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &str); 10] = [
        (
            &["--env", "kvcm.service.rpc_port=99999"],
            "kvcm.service.rpc_port",
        ),
        (&["--env", "service.no_such_key=1"], "service.no_such_key"),
        (
            &["--env", "kvcm.registry_storage.uri=redis://127.0.0.1:1"],
            "kvcm.registry_storage.uri",
        ),
        (
            &["--env", "kvcm.journal.fsync=sometimes"],
            "kvcm.journal.fsync",
        ),
        (
            &["--env", "kvcm.service.storage_root_allow_list=relative/dir"],
            "kvcm.service.storage_root_allow_list",
        ),
        // A list that leaves out the embedded default storage (under the data dir).
        (
            &[
                "--env",
                "kvcm.service.storage_root_allow_list=/nonexistent-kvcm-roots",
            ],
            "kvcm.service.storage_root_allow_list",
        ),
        (
            &[
                "--env",
                "kvcm.service.http_port=64000",
                "--env",
                "kvcm.service.enable_debug_service=true",
            ],
            "kvcm.service.http_port",
        ),
        // A prefault of an embedded pool node that is not there.
        (&["--env", "kvcm.pool.prefault=true"], "kvcm.pool.prefault"),
        // TLS files that are missing, or hold no certificate.
        (
            &[
                "--env",
                "kvcm.tls.cert_file=/nonexistent/cert.pem",
                "--env",
                "kvcm.tls.key_file=/nonexistent/key.pem",
            ],
            "kvcm.tls.cert_file",
        ),
        (
            &[
                "--env",
                "kvcm.tls.cert_file=/dev/null",
                "--env",
                "kvcm.tls.key_file=/dev/null",
            ],
            "kvcm.tls.cert_file",
        ),
    ];
    for (args, key) in cases {
        let output = Command::new(env!("CARGO_BIN_EXE_kvcm"))
            .arg("serve")
            .arg("--data-dir")
            .arg(dir.path())
            .args(args)
            .output()
            .expect("run kvcm");
        assert!(!output.status.success(), "{args:?} must fail");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(key), "{args:?}: {stderr}");
    }
}

#[tokio::test]
async fn unknown_kvcm_keys_are_logged_and_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_toml(&dir, "[kvcm.metrics]\nreport_interval_ms = 1000\n");
    let args = ["--config", &file, "--env", "kvcm.service.io_thread_num=8"];
    let server = TestServer::start_custom(&args, &[]).await;
    assert!(server.has_listener("grpc"), "the server started");
    let log = server.log();
    for key in [
        "kvcm.metrics.report_interval_ms",
        "kvcm.service.io_thread_num",
    ] {
        assert!(log.contains(key), "{key} is named in the log: {log}");
    }
}
