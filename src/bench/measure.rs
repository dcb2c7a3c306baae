//! Request targets and the two measurements: paired latency (the cases of one comparison run
//! in alternating blocks, so load drift on a shared machine hits them alike) and throughput
//! (several requests in flight).

use std::net::SocketAddr;
use std::time::Instant;

use futures_util::future::join_all;
use hdrhistogram::Histogram;
use kvcm::proto::meta::{self, meta_service_client::MetaServiceClient};
use tokio::sync::Mutex;
use tonic::transport::Channel;

use super::http_client::HttpConnection;
use super::BenchArgs;

/// Requests per block of the paired latency rounds.
const BLOCK: usize = 250;

/// Latency percentiles and throughput of one case.
#[derive(Debug, Clone, Copy, Default)]
pub struct Figures {
    /// Median latency.
    pub p50_us: f64,
    /// 99th percentile latency.
    pub p99_us: f64,
    /// Requests per second with several in flight.
    pub per_second: f64,
}

/// Where and how one case sends its GetCacheLocation.
pub enum Target {
    /// A gRPC MetaService.
    Grpc {
        /// Its address.
        address: SocketAddr,
        /// The client (one HTTP/2 connection).
        client: MetaServiceClient<Channel>,
    },
    /// An HTTP route taking the request as JSON.
    Http {
        /// Its address.
        address: SocketAddr,
        /// The route.
        path: String,
        /// One keep-alive connection.
        connection: Mutex<HttpConnection>,
    },
}

impl Target {
    /// A gRPC target.
    pub async fn grpc(address: SocketAddr) -> anyhow::Result<Target> {
        let client = MetaServiceClient::connect(format!("http://{address}")).await?;
        Ok(Target::Grpc { address, client })
    }

    /// A gRPC target over TLS, trusting the CA of `ca_pem` for the name `localhost`.
    pub async fn grpc_tls(address: SocketAddr, ca_pem: &str) -> anyhow::Result<Target> {
        let tls = kvcm::tls_client::TlsClient::from_pem(ca_pem, None, "localhost")?.grpc();
        let channel = Channel::from_shared(format!("https://{address}"))?
            .tls_config(tls)?
            .connect()
            .await?;
        let client = MetaServiceClient::new(channel);
        Ok(Target::Grpc { address, client })
    }

    /// An HTTP target.
    pub async fn http(address: SocketAddr, path: &str) -> anyhow::Result<Target> {
        let connection = Mutex::new(HttpConnection::connect(address).await?);
        Ok(Target::Http {
            address,
            path: path.to_string(),
            connection,
        })
    }

    /// Another target to the same place (a new connection for HTTP).
    async fn another(&self) -> anyhow::Result<Target> {
        match self {
            Target::Grpc { address, client } => Ok(Target::Grpc {
                address: *address,
                client: client.clone(),
            }),
            Target::Http { address, path, .. } => Target::http(*address, path).await,
        }
    }

    /// Sends one request and checks the answer's size.
    pub(super) async fn call(
        &self,
        request: &meta::GetCacheLocationRequest,
        body: &[u8],
    ) -> anyhow::Result<()> {
        let size = request.block_keys.len();
        match self {
            Target::Grpc { client, .. } => {
                let answer = client
                    .clone()
                    .get_cache_location(request.clone())
                    .await?
                    .into_inner();
                anyhow::ensure!(
                    answer.locations.len() == size,
                    "{} locations",
                    answer.locations.len()
                );
            }
            Target::Http {
                path, connection, ..
            } => {
                let answer = connection.lock().await.post(path, body).await?;
                anyhow::ensure!(answer.len() > size * 8, "short answer");
            }
        }
        Ok(())
    }
}

/// Latency of every target, measured in alternating blocks after a warm-up of each.
pub async fn paired_latency(
    args: &BenchArgs,
    targets: &[&Target],
    request: &meta::GetCacheLocationRequest,
) -> anyhow::Result<Vec<Figures>> {
    let body = serde_json::to_vec(request)?;
    let mut histograms = Vec::new();
    for target in targets {
        for _ in 0..args.warmup {
            target.call(request, &body).await?;
        }
        histograms.push(Histogram::<u64>::new(3)?);
    }
    for _ in 0..args.iterations.div_ceil(BLOCK) {
        for (target, histogram) in targets.iter().zip(&mut histograms) {
            for _ in 0..BLOCK {
                let started = Instant::now();
                target.call(request, &body).await?;
                histogram.record(started.elapsed().as_nanos() as u64)?;
            }
        }
    }
    Ok(histograms
        .iter()
        .map(|h| Figures {
            p50_us: h.value_at_quantile(0.5) as f64 / 1000.0,
            p99_us: h.value_at_quantile(0.99) as f64 / 1000.0,
            per_second: 0.0,
        })
        .collect())
}

/// Requests per second with `concurrency` workers, each on its own target like `target`.
pub async fn throughput(
    args: &BenchArgs,
    target: &Target,
    request: &meta::GetCacheLocationRequest,
) -> anyhow::Result<f64> {
    let body = serde_json::to_vec(request)?;
    let workers = args.concurrency.max(1);
    let per_worker = (args.iterations / workers).max(1);
    let mut targets = Vec::new();
    for _ in 0..workers {
        targets.push(target.another().await?);
    }
    let started = Instant::now();
    let runs = targets.iter().map(|target| async {
        for _ in 0..per_worker {
            target.call(request, &body).await?;
        }
        anyhow::Ok(())
    });
    for outcome in join_all(runs).await {
        outcome?;
    }
    let elapsed = started.elapsed().as_secs_f64().max(1e-9);
    Ok((per_worker * workers) as f64 / elapsed)
}
