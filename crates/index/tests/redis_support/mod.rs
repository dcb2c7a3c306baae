//! Test support: private `redis-server` processes on free ports (never the shared 6379), a
//! single node and a 3-master cluster, killed on drop. Readiness is polled with a deadline, and
//! a server is ready only when the process answering on the port is the one started (its
//! `process_id`).
//!
//! When `redis-server` is not installed, [`redis_available`] prints
//! `SKIPPED: redis-server not found` to stderr and the caller returns early.

#![allow(dead_code)] // Each test binary including this module uses a different part of it.

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kvcm_index::redis::resp::{self, Connection, Handshake, Reply};

/// How long a server may take to answer, or a cluster to reach `cluster_state:ok`.
const READY_DEADLINE: Duration = Duration::from_secs(20);

/// True when `redis-server` can be run; otherwise says so loudly on stderr.
pub fn redis_available(test: &str) -> bool {
    let found = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !found {
        // Straight to the process's stderr: the test harness captures `eprintln!` of a
        // passing test, and a skip must not go unseen.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: redis-server not found ({test} did not run)"
        );
    }
    found
}

/// A port that was free a moment ago (and whose cluster bus port, +10000, too).
pub fn free_port() -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
        let port = listener.local_addr().expect("local addr").port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// One `redis-server` process with an append-only file fsynced on every write.
pub struct RedisServer {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a server on a free port with its data in `dir`, and waits until it answers.
    pub fn start(dir: &Path) -> RedisServer {
        RedisServer::start_with(dir, free_port(), Vec::new())
    }

    /// Starts a server like [`RedisServer::start`] with more arguments, which override the
    /// defaults (e.g. `--appendonly no`).
    pub fn start_with_args(dir: &Path, extra: &[&str]) -> RedisServer {
        let extra = extra.iter().map(|arg| arg.to_string()).collect();
        RedisServer::start_with(dir, free_port(), extra)
    }

    fn start_with(dir: &Path, port: u16, extra: Vec<String>) -> RedisServer {
        let mut server = RedisServer {
            port,
            dir: dir.to_owned(),
            child: None,
            extra,
        };
        server.restart();
        server
    }

    /// The `redis://` URI of the server.
    pub fn uri(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `127.0.0.1:port`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// SIGKILLs the server (no shutdown save) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and data directory; waits until it answers.
    pub fn restart(&mut self) {
        self.kill();
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        let pid = format!("process_id:{}\r\n", child.id());
        self.child = Some(child);
        let (port, address) = (self.port, self.address());
        wait_until(&format!("our redis-server answers on port {port}"), || {
            self.assert_running();
            match command(&address, &["INFO", "server"]) {
                Ok(Reply::Bulk(Some(info))) => String::from_utf8_lossy(&info).contains(&pid),
                // With --requirepass the process id cannot be read; the exit check above
                // still catches a server that could not take the port.
                Ok(Reply::Error(error)) => error.starts_with("NOAUTH"),
                _ => false,
            }
        });
    }

    /// Fails the test if the server exited (e.g. its port was taken meanwhile): a test must
    /// never talk to some other process on that port.
    fn assert_running(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let exited = child.try_wait().expect("poll redis-server");
            assert!(
                exited.is_none(),
                "redis-server on port {} exited: {exited:?}",
                self.port
            );
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Three masters (no replicas) forming one Redis Cluster.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three cluster-enabled servers under `dir`, joins them with
    /// `redis-cli --cluster create`, and waits until every node says `cluster_state:ok`.
    pub fn start(dir: &Path) -> RedisCluster {
        RedisCluster::start_with(dir, 0, &[])
    }

    /// Three masters with `replicas` replicas each (`extra` arguments on every node); waits
    /// until the cluster is ok on every node and every replica's link to its master is up.
    pub fn start_with(dir: &Path, replicas: usize, extra: &[&str]) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
            .map(|n| start_cluster_node(&dir.join(format!("node{n}")), extra))
            .collect();
        let addresses: Vec<String> = nodes.iter().map(RedisServer::address).collect();
        let status = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run redis-cli --cluster create");
        assert!(status.success(), "redis-cli --cluster create failed");
        for address in &addresses {
            wait_until(&format!("{address} reports cluster_state:ok"), || {
                info_has(address, &["CLUSTER", "INFO"], "cluster_state:ok")
            });
            wait_until(&format!("{address} is a synced master or replica"), || {
                let replication = ["INFO", "replication"];
                info_has(address, &replication, "role:master")
                    || info_has(address, &replication, "master_link_status:up")
            });
        }
        RedisCluster { nodes }
    }

    /// The node at `address`.
    pub fn node_mut(&mut self, address: &str) -> &mut RedisServer {
        let node = self.nodes.iter_mut().find(|node| node.address() == address);
        node.expect("a node of the cluster")
    }

    /// The URI of the first node (any node works as a seed).
    pub fn uri(&self) -> String {
        self.nodes[0].uri()
    }
}

fn start_cluster_node(dir: &Path, extra: &[&str]) -> RedisServer {
    std::fs::create_dir_all(dir).expect("node dir");
    let port = free_port();
    let mut args = vec![
        "--cluster-enabled".to_owned(),
        "yes".to_owned(),
        "--cluster-config-file".to_owned(),
        format!("nodes-{port}.conf"),
    ];
    args.extend(extra.iter().map(|arg| arg.to_string()));
    RedisServer::start_with(dir, port, args)
}

/// True when `args` run on `address` answer a text that contains `needle`.
fn info_has(address: &str, args: &[&str], needle: &str) -> bool {
    matches!(command(address, args),
        Ok(Reply::Bulk(Some(info))) if String::from_utf8_lossy(&info).contains(needle))
}

/// Polls `ready` until it holds, failing the test after `READY_DEADLINE`.
pub fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + READY_DEADLINE;
    let mut pause = Duration::from_millis(5);
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// Runs one command on a fresh connection to `address`.
pub fn command(address: &str, args: &[&str]) -> Result<Reply, resp::RespError> {
    raw_command(
        address,
        &args.iter().map(|a| a.as_bytes()).collect::<Vec<_>>(),
    )
}

/// Runs one command with binary arguments on a fresh connection to `address`.
pub fn raw_command(address: &str, args: &[&[u8]]) -> Result<Reply, resp::RespError> {
    let mut connection = Connection::open(address, Duration::from_secs(2), &Handshake::default())?;
    let (name, rest) = args.split_first().expect("a command name");
    let mut command = resp::Command::new(std::str::from_utf8(name).expect("ascii name"));
    for arg in rest {
        command.arg(arg);
    }
    connection.call(&command)
}
