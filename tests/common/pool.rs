//! `kvcm pool` processes beside a test server, and the pool's membership as it lists it.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use super::{wait_until, TestServer};

/// A running `kvcm pool`, killed (SIGKILL) when dropped.
pub struct PoolProcess {
    child: Child,
    /// The node's ready file (`listen`, `huge_pages`).
    pub ready: Value,
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

    /// The node's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
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
            // Off unless asked: nodes of parallel tests must not take the huge pages one
            // test reserves for its own.
            .args(if extra.contains(&"--huge-pages") {
                &[][..]
            } else {
                &["--huge-pages", "off"][..]
            })
            .args(extra)
            .arg("--ready-file")
            .arg(&ready)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn kvcm pool");
        let ready = wait_until(Duration::from_secs(20), async || {
            let text = std::fs::read_to_string(&ready).ok()?;
            serde_json::from_str(&text).ok()
        })
        .await
        .expect("pool node wrote its ready file");
        PoolProcess { child, ready }
    }

    /// Bytes of shared memory the node's process has mapped in (`RssShmem`).
    pub fn resident_shared_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("the node's status");
        let kib = status
            .lines()
            .find_map(|line| line.strip_prefix("RssShmem:"))
            .and_then(|value| {
                value
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .expect("RssShmem");
        kib * 1024
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
        if signal == "STOP" {
            // kill(2) returns before every thread has stopped (a busy-polling NIC thread
            // stops at its next interrupt): wait until all of them have.
            let stopped = super::wait_until_blocking(Duration::from_secs(10), || {
                self.all_threads_stopped().then_some(())
            });
            assert!(stopped.is_some(), "the node's threads stopped");
        }
    }

    /// Whether every thread of the node is stopped (state `T` in /proc).
    fn all_threads_stopped(&self) -> bool {
        let tasks = format!("/proc/{}/task", self.child.id());
        let Ok(entries) = std::fs::read_dir(tasks) else {
            return false;
        };
        entries.flatten().all(|task| {
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            // The state follows the command name's closing parenthesis.
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
        })
    }
}

/// Huge pages added to the kernel's hugetlb pool (`vm.nr_hugepages`) for a test, and given
/// back on drop (pages still mapped become surplus and are freed when unmapped).
pub struct HugePages {
    before: u64,
}

const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

impl HugePages {
    /// Adds `count` free 2 MiB pages; `Err` says why not (not root, a read-only /proc, no
    /// contiguous memory left).
    pub fn reserve(count: u64) -> Result<HugePages, String> {
        let read = |path: &str| -> Result<String, String> {
            std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))
        };
        let before: u64 = read(NR_HUGEPAGES)?
            .trim()
            .parse()
            .map_err(|e| format!("{e}"))?;
        std::fs::write(NR_HUGEPAGES, (before + count).to_string())
            .map_err(|e| format!("raising {NR_HUGEPAGES}: {e}"))?;
        let pages = HugePages { before };
        let free = Self::free();
        if free < count {
            return Err(format!(
                "the kernel made only {free} of {count} huge pages free"
            ));
        }
        Ok(pages)
    }
}

impl HugePages {
    /// 2 MiB huge pages a new mapping can still reserve: free ones not reserved by a
    /// mapping already (`HugePages_Free - HugePages_Rsvd` of /proc/meminfo; a mapping
    /// reserves its pages at mmap and they stay free until faulted in).
    pub fn free() -> u64 {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let field = |name: &str| -> u64 {
            meminfo
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(0)
        };
        field("HugePages_Free:").saturating_sub(field("HugePages_Rsvd:"))
    }
}

impl Drop for HugePages {
    fn drop(&mut self) {
        let _ = std::fs::write(NR_HUGEPAGES, self.before.to_string());
    }
}
