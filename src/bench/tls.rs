//! `kvcm bench --tls`: GetCacheLocation prefix-16 and prefix-128 over gRPC with TLS (a
//! throw-away certificate, TLS 1.3 with ring) beside the same call in plaintext, two
//! in-process servers seeded alike; the plaintext server is the floor.

use std::net::SocketAddr;

use rcgen::{CertificateParams, KeyPair};

use super::measure::Target;
use super::{bench_config, compare, runtimes, start_seeded, BenchArgs, PREFIX_SIZES};

/// Runs both cases and prints the table.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let (server_runtime, client_runtime) = runtimes()?;
    let base = std::env::temp_dir().join(format!("kvcm-bench-tls-{}", std::process::id()));
    let key = KeyPair::generate()?;
    let cert = CertificateParams::new(vec!["localhost".to_string()])?.self_signed(&key)?;
    std::fs::create_dir_all(&base)?;
    let (cert_file, key_file) = (base.join("cert.pem"), base.join("key.pem"));
    std::fs::write(&cert_file, cert.pem())?;
    std::fs::write(&key_file, key.serialize_pem())?;
    let plain = bench_config(&base.join("plain"))?;
    let mut secured = bench_config(&base.join("tls"))?;
    secured.security.tls.cert_file = Some(cert_file);
    secured.security.tls.key_file = Some(key_file);
    let (plain_grpc, tls_grpc) = server_runtime.block_on(async {
        let (plain_grpc, _, _) = start_seeded(&plain, Default::default()).await?;
        let (tls_grpc, _, _) = start_seeded(&secured, Default::default()).await?;
        anyhow::Ok((plain_grpc, tls_grpc))
    })?;
    let local = |a: SocketAddr| SocketAddr::from(([127, 0, 0, 1], a.port()));
    println!("case                         p50 µs   p99 µs      req/s   p50 / floor");
    client_runtime.block_on(async {
        for size in PREFIX_SIZES {
            let targets = [
                (
                    "grpc plaintext (floor)",
                    Target::grpc(local(plain_grpc)).await?,
                ),
                (
                    "grpc tls",
                    Target::grpc_tls(local(tls_grpc), &cert.pem()).await?,
                ),
            ];
            compare(args, size, &targets).await?;
        }
        anyhow::Ok(())
    })?;
    let _ = std::fs::remove_dir_all(&base);
    Ok(())
}
