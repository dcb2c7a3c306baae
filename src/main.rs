//! The `kvcm` binary: one executable, one subcommand per role.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use kvcm::config::ServerConfig;
use kvcm::service::{Handlers, LogLevelSetter, LogSinks};
use kvcm::tls_client::TlsClient;

mod bench;

#[derive(Parser)]
#[command(
    name = "kvcm",
    version,
    about = "Global KVCache manager for LLM inference"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay a trace, compare eviction policies and plan capacity.
    Optimize(kvcm_optimizer::cli::OptimizeArgs),
    /// Run the manager: gRPC + HTTP control plane (embedded single-node default).
    Serve(ServeArgs),
    /// Measure GetCacheLocation over gRPC and HTTP beside their floors, and the local index.
    Bench(bench::BenchArgs),
    /// Run a memory-pool node: one registered region that clients read and write directly.
    Pool(PoolArgs),
}

#[derive(Args)]
struct PoolArgs {
    /// Bytes of the region (suffixes K, M, G, T: powers of 1024).
    #[arg(long, value_parser = kvcm::pool::parse_size)]
    size: u64,
    /// Put the region on 2 MiB hugetlb pages: `auto` when the size is a multiple of 2 MiB
    /// and the kernel has that many free (`vm.nr_hugepages`), `on` (refuse to start
    /// without them), `off`.
    #[arg(long, default_value = "auto", value_name = "auto|on|off")]
    huge_pages: kvcm::pool::HugePages,
    /// Back the whole region at start instead of page by page at first write (the node
    /// then holds all of `--size` from the start; no transfer pays the page faults).
    #[arg(long)]
    prefault: bool,
    /// Address of the queue-pair listener (and of the soft NIC), reachable by clients.
    #[arg(long)]
    listen: std::net::SocketAddr,
    /// Meta HTTP address of a kvcm server; repeatable (tried in order).
    #[arg(long = "server", required = true)]
    servers: Vec<std::net::SocketAddr>,
    /// The pool storage to join (registered on the server as ST_TAIRMEMPOOL).
    #[arg(long, default_value = kvcm::server::DEFAULT_POOL)]
    storage: String,
    /// Stable node id (default: the listener's address).
    #[arg(long)]
    node_id: Option<String>,
    /// Write `{"listen":"ip:port","huge_pages":bool}` here once listening.
    #[arg(long)]
    ready_file: Option<PathBuf>,
    /// Speak TLS to the servers, trusting the CA of this PEM file (servers with
    /// `kvcm.tls.cert_file`).
    #[arg(long, value_name = "PEM")]
    tls_ca: Option<PathBuf>,
    /// The name the servers' certificates carry (default: `localhost`).
    #[arg(long, requires = "tls_ca", default_value = "localhost")]
    tls_server_name: String,
    /// Present this client certificate (servers with `kvcm.tls.client_ca_file`).
    #[arg(long, value_name = "PEM", requires_all = ["tls_ca", "tls_key"])]
    tls_cert: Option<PathBuf>,
    /// The client certificate's private key.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Join and heartbeat with this credential (an operator's or admin's API key, or an
    /// admin token): servers with `kvcm.auth.meta=required` demand one.
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
    /// Stay dumpable (by default the node marks itself not dumpable, as `kvcm serve` does:
    /// its memory is handed to shared-memory clients by descriptor passing only).
    #[arg(long)]
    dumpable: bool,
    /// Also serve the region on this RDMA device (`mlx5_0`, `rxe0`; a build with feature
    /// `rdma`), for clients of the verbs wire.
    #[arg(long)]
    verbs_device: Option<String>,
    /// The device's GID table index for RoCE addressing (1 is RoCE v2 on rxe).
    #[arg(long, default_value_t = 0, requires = "verbs_device")]
    verbs_gid_index: u8,
}

#[derive(Args)]
struct ServeArgs {
    /// TOML file with dotted keys (e.g. `[kvcm.service] rpc_port = 6381`).
    #[arg(long)]
    config: Option<PathBuf>,
    /// One setting as `key=value` (the reference's dotted keys); repeatable.
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Data directory (default ./kvcm-data); overrides every other layer.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Write `{"listener":"ip:port",...}` here once every listener is bound.
    #[arg(long)]
    ready_file: Option<PathBuf>,
    /// Run a memory-pool node of this many bytes inside the server (`kvcm.pool.size`;
    /// suffixes K, M, G, T) and prefer it for writes in the default group.
    #[arg(long, value_parser = kvcm::pool::parse_size)]
    pool_size: Option<u64>,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Optimize(args) => kvcm_optimizer::cli::run(args)?,
        Command::Serve(args) => serve(args)?,
        Command::Bench(args) => bench::run(args)?,
        Command::Pool(args) => pool(args)?,
    }
    Ok(())
}

fn load_config(args: &ServeArgs) -> anyhow::Result<ServerConfig> {
    let mut config = ServerConfig::default();
    if let Some(path) = &args.config {
        config.apply_toml_file(path)?;
    }
    config.apply_pairs(&args.env)?;
    config.apply_env(|name| std::env::var(name).ok())?;
    if let Some(data_dir) = &args.data_dir {
        config.data_dir = data_dir.clone();
    }
    if let Some(size) = args.pool_size {
        config.pool.embedded_size = size;
    }
    config.validate()?;
    Ok(config)
}

/// Installs the stderr log subscriber at INFO; returns the setter of its level.
fn init_logging() -> LogLevelSetter {
    use tracing_subscriber::filter::LevelFilter;
    use tracing_subscriber::prelude::*;
    let (level, handle) = tracing_subscriber::reload::Layer::new(LevelFilter::INFO);
    tracing_subscriber::registry()
        .with(level)
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .init();
    Arc::new(move |new_level| {
        handle
            .reload(LevelFilter::from_level(new_level))
            .map_err(|e| e.to_string())
    })
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let log_level = init_logging();
    let config = load_config(&args)?;
    kvcm::server::protect_process(&config.security)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        // Listening before the manager starts: a restart asked for during start-up (a lead
        // won and lost at once) is not lost.
        let signals = Signals::install()?;
        let manager = kvcm::server::embedded_manager(&config)?;
        let events = kvcm::events::EventLog::from_config(&config)?;
        let access = kvcm::access_log::AccessLog::from_config(&config)?;
        let curves = kvcm::curves::LiveCurves::new(config.capacity_curve_window_accesses);
        let logs = LogSinks {
            events: events.sink(),
            access: access.sink(),
            curves: std::sync::Arc::new(curves),
        };
        let handlers = Handlers::with_logs(manager, Some(log_level), logs, config.security.limits);
        let server = kvcm::server::start(&config, handlers).await?;
        if let Some(path) = &args.ready_file {
            server.write_ready_file(path)?;
        }
        signals.wait().await;
        tracing::info!("shutting down");
        server.stop().await?;
        events.close()?;
        access.close()?;
        anyhow::Ok(())
    })?;
    drop(runtime);
    if let Some(hold_off_ms) = kvcm::server::restart_requested() {
        return restart(hold_off_ms);
    }
    Ok(())
}

/// Runs this executable again in this process, with the same arguments (a node that lost
/// its lead on the shared store starts over as a follower, keeping `hold_off_ms` of campaign
/// pause).
fn restart(hold_off_ms: u64) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    let executable = std::env::current_exe().context("finding the executable to restart")?;
    tracing::info!("restarting {}", executable.display());
    let error = std::process::Command::new(&executable)
        .args(std::env::args_os().skip(1))
        .env(kvcm::server::RESTART_HOLD_OFF_ENV, hold_off_ms.to_string())
        .exec();
    Err(error).with_context(|| format!("restarting {}", executable.display()))
}

fn pool(args: PoolArgs) -> anyhow::Result<()> {
    init_logging();
    let tls = match &args.tls_ca {
        Some(ca) => {
            let identity = args.tls_cert.as_deref().zip(args.tls_key.as_deref());
            let tls = TlsClient::from_files(ca, identity, &args.tls_server_name)
                .context("--tls-ca / --tls-cert / --tls-key / --tls-server-name")?;
            Some(tls)
        }
        None => None,
    };
    if !args.dumpable {
        kvcm_transport::set_dumpable(false).context("marking the node not dumpable")?;
    }
    let joining = kvcm::pool::Joining {
        storage: args.storage,
        channel: kvcm::pool::Channel::Http(kvcm::pool::MetaHttp {
            servers: args.servers,
            tls,
            api_key: args.api_key,
        }),
    };
    let verbs = args
        .verbs_device
        .map(|name| kvcm_transport::any::VerbsDevice {
            name,
            gid_index: args.verbs_gid_index,
        });
    let spec = kvcm::pool::RegionSpec {
        size: args.size,
        huge_pages: args.huge_pages,
        prefault: args.prefault,
    };
    let node =
        kvcm::pool::PoolNode::start(spec, args.listen, args.node_id, joining, verbs.as_ref())?;
    let pages = if node.huge_pages() {
        "2 MiB huge pages"
    } else {
        "regular pages"
    };
    tracing::info!(
        "pool node: {} bytes on {pages}, queue pairs on {}",
        args.size,
        node.listen_addr()
    );
    if let Some(path) = &args.ready_file {
        let ready = serde_json::json!({
            "listen": node.listen_addr().to_string(),
            "huge_pages": node.huge_pages(),
        });
        std::fs::write(path, ready.to_string())
            .with_context(|| format!("writing ready file {}", path.display()))?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the signal runtime")?;
    runtime.block_on(async {
        Signals::install()?.wait().await;
        anyhow::Ok(())
    })?;
    tracing::info!("pool node shutting down");
    drop(node);
    Ok(())
}

/// SIGTERM and SIGINT, caught from the moment this is built (inside the runtime).
struct Signals {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            terminate: signal(SignalKind::terminate()).context("installing SIGTERM handler")?,
            interrupt: signal(SignalKind::interrupt()).context("installing SIGINT handler")?,
        })
    }

    /// Returns at the first of them.
    async fn wait(mut self) {
        tokio::select! {
            _ = self.terminate.recv() => {}
            _ = self.interrupt.recv() => {}
        }
    }
}
