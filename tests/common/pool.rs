//! `kvcm pool` processes beside a test server, and the pool's membership as it lists it.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use super::{wait_until, TestServer};

/// A running `kvcm pool`, killed (SIGKILL) when dropped.
pub struct PoolProcess {
    child: Child,
}

impl PoolProcess {
    pub async fn start(
        server: &TestServer,
        storage: &str,
        node_id: &str,
        size: &str,
    ) -> PoolProcess {
        Self::start_with(server, storage, node_id, size, &[]).await
    }

    /// [`PoolProcess::start`] with `extra` arguments.
    pub async fn start_with(
        server: &TestServer,
        storage: &str,
        node_id: &str,
        size: &str,
        extra: &[&str],
    ) -> PoolProcess {
        let ready = server
            .dir
            .path()
            .join(format!("pool-{node_id}-{}.json", fastrand::u32(..)));
        let child = Command::new(env!("CARGO_BIN_EXE_kvcm"))
            .args([
                "pool",
                "--size",
                size,
                "--listen",
                "127.0.0.1:0",
                "--storage",
                storage,
            ])
            .args(["--node-id", node_id, "--server"])
            .arg(server.address("http").to_string())
            .args(extra)
            .arg("--ready-file")
            .arg(&ready)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn kvcm pool");
        wait_until(Duration::from_secs(20), async || {
            std::fs::read_to_string(&ready).ok()
        })
        .await
        .expect("pool node wrote its ready file");
        PoolProcess { child }
    }

    pub fn kill(&mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reaped");
    }
}

impl Drop for PoolProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The pool's members as the server lists them.
pub async fn members(server: &TestServer, storage: &str) -> Vec<Value> {
    let body = json!({ "storage": storage }).to_string();
    let (status, answer) = server
        .post_raw("http", kvcm::pool::NODES_ROUTE, body.as_bytes())
        .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
    let answer: Value = serde_json::from_slice(&answer).expect("json");
    answer["nodes"].as_array().expect("nodes").clone()
}

/// Waits until node `node_id` (any node when `None`) of `storage` has joined `joins` times
/// and is live; returns the live incarnation's range id.
pub async fn live_range(
    server: &TestServer,
    storage: &str,
    node_id: Option<&str>,
    joins: usize,
) -> u64 {
    wait_until(Duration::from_secs(20), async || {
        let nodes = members(server, storage).await;
        let mine: Vec<&Value> = nodes
            .iter()
            .filter(|n| node_id.is_none_or(|id| n["node_id"] == id))
            .collect();
        let live = mine.iter().find(|n| n["live"] == true)?;
        (mine.len() >= joins).then(|| live["range_id"].as_u64().expect("range id"))
    })
    .await
    .expect("the node joined")
}

pub fn pool_storage(name: &str) -> Value {
    json!({"global_unique_name": name, "tair_mem_pool": {"domain": "test", "timeout": 100}})
}

pub fn group(name: &str, candidates: &[&str]) -> Value {
    super::group_preferring(name, candidates, "CPS_PREFER_TAIR_MEMPOOL", "1000000000000")
}

impl PoolProcess {
    /// Sends `signal` (e.g. "STOP", "CONT") to the node.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal}");
    }
}
