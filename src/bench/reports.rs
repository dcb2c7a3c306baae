//! `kvcm bench --reports`: the cache-subscriber RPCs over gRPC against an in-process server —
//! ReportEvent ADD of 5,000 blocks in one request, and GetHostCacheState over 20,000 ordered
//! keys with 8 reporters holding all of them or the first half, at `global_kvs_host_count` 0
//! and 4 (with P2P) — beside GetCacheLocation (prefix match) of the same 20,000 keys written
//! to kvcm's file storage, and the floor: a bare tonic service's round trip in the same run.
//! Each case runs `ROUNDS` timed calls after `WARMUP` untimed ones, on one connection; the
//! reporters heartbeat before each host-state case.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Instant;

use hdrhistogram::Histogram;
use kvcm::config::ServerConfig;
use kvcm::proto::admin::{self, admin_service_client::AdminServiceClient};
use kvcm::proto::meta::{self, meta_service_client::MetaServiceClient};
use tonic::transport::Channel;

use super::echo;

/// Timed calls per case.
const ROUNDS: usize = 300;
/// Untimed calls before each case.
const WARMUP: usize = 30;
/// Keys of the host-state and lookup cases.
const KEYS: i64 = 20_000;
/// Blocks of one ADD request.
const ADD_BLOCKS: i64 = 5_000;
/// Reporters per instance.
const HOSTS: usize = 8;

/// Runs every case and prints the table.
pub fn run() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let data_dir = std::env::temp_dir().join(format!("kvcm-bench-reports-{}", std::process::id()));
    let outcome = runtime.block_on(measure(&data_dir));
    let _ = std::fs::remove_dir_all(&data_dir);
    outcome
}

async fn measure(data_dir: &std::path::Path) -> anyhow::Result<()> {
    let mut config = ServerConfig {
        rpc_port: 0,
        http_port: 0,
        admin_http_port: 0,
        admin_rpc_port: 0,
        data_dir: data_dir.to_path_buf(),
        ..ServerConfig::default()
    };
    config.set("kvcm.event_log.enabled", "false")?;
    config.validate()?;
    let manager = kvcm::server::embedded_manager(&config)?;
    let handlers = kvcm::service::Handlers::new(manager, None);
    let server = kvcm::server::start(&config, handlers).await?;
    let local = |a: SocketAddr| format!("http://127.0.0.1:{}", a.port());
    let mut meta = MetaServiceClient::connect(local(server.addresses["grpc"])).await?;
    let mut admin = AdminServiceClient::connect(local(server.addresses["grpc"])).await?;
    let echo_address = echo::spawn_grpc_echo(echo::EchoMeta {
        answers: Vec::new(),
    })
    .await?;
    let floor = MetaServiceClient::connect(local(echo_address)).await?;

    set_up(&mut admin, &mut meta).await?;
    println!("case                                          p50 µs     p99 µs   p50 / floor");
    let empty = meta::GetCacheLocationRequest::default();
    let floor_figures = time(|| {
        let (mut floor, request) = (floor.clone(), empty.clone());
        async move { floor.get_cache_location(request).await.map(drop) }
    })
    .await?;
    print_case("grpc round trip (floor)", floor_figures, floor_figures);

    let add = report_add(0, ADD_BLOCKS);
    let figures = time(|| {
        let (mut meta, request) = (meta.clone(), add.clone());
        async move { checked_report(&mut meta, request).await }
    })
    .await?;
    print_case("ReportEvent ADD 5000 blocks", figures, floor_figures);

    for (instance, holding) in [("all", "all"), ("half", "half")] {
        for remote in [0, 4] {
            heartbeats(&mut meta, instance).await?;
            let request = host_state(instance, remote);
            let expected = if holding == "all" { KEYS } else { KEYS / 2 };
            let figures = time(|| {
                let (mut meta, request) = (meta.clone(), request.clone());
                async move {
                    let answer = meta.get_host_cache_state(request).await?.into_inner();
                    let full = answer.hosts.len() == HOSTS
                        && answer.hosts.iter().all(|h| h.local == expected);
                    anyhow::ensure!(full, "unexpected hosts: {:?}", answer.hosts);
                    Ok(())
                }
            })
            .await?;
            let name = format!("GetHostCacheState 20000, {holding}, N={remote}");
            print_case(&name, figures, floor_figures);
        }
    }

    let lookup = meta::GetCacheLocationRequest {
        instance_id: "all".into(),
        query_type: meta::QueryType::QtPrefixMatch as i32,
        block_keys: (0..KEYS).collect(),
        ..Default::default()
    };
    let figures = time(|| {
        let (mut meta, request) = (meta.clone(), lookup.clone());
        async move {
            let answer = meta.get_cache_location(request).await?.into_inner();
            anyhow::ensure!(
                answer.locations.len() == KEYS as usize,
                "{} locations",
                answer.locations.len()
            );
            Ok(())
        }
    })
    .await?;
    print_case("GetCacheLocation prefix 20000", figures, floor_figures);
    Ok(())
}

/// p50 and p99 in µs.
#[derive(Debug, Clone, Copy)]
struct Figures {
    p50_us: f64,
    p99_us: f64,
}

fn print_case(name: &str, figures: Figures, floor: Figures) {
    println!(
        "{name:<44} {:>8.1} {:>10.1}   {:>8.1}x",
        figures.p50_us,
        figures.p99_us,
        figures.p50_us / floor.p50_us
    );
}

/// Times `ROUNDS` calls of `call` after `WARMUP` untimed ones.
async fn time<F, Fut, E>(mut call: F) -> anyhow::Result<Figures>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: Into<anyhow::Error>,
{
    let mut histogram = Histogram::<u64>::new(3)?;
    for round in 0..WARMUP + ROUNDS {
        let started = Instant::now();
        call().await.map_err(Into::into)?;
        if round >= WARMUP {
            histogram.record(started.elapsed().as_nanos() as u64)?;
        }
    }
    Ok(Figures {
        p50_us: histogram.value_at_quantile(0.5) as f64 / 1000.0,
        p99_us: histogram.value_at_quantile(0.99) as f64 / 1000.0,
    })
}

/// Event-report storages, group `rg`, instances `all`, `half` and `adds` (the ADD case's);
/// 8 reporters per instance holding every key (`all`) or the first half (`half`); the keys
/// also written to kvcm's file storage for instance `all`.
async fn set_up(
    admin: &mut AdminServiceClient<Channel>,
    meta: &mut MetaServiceClient<Channel>,
) -> anyhow::Result<()> {
    for (name, storage_type) in [("er_l1p5", 7), ("er_l2", 8)] {
        let storage = admin::StorageConfig {
            global_unique_name: name.into(),
            storage_type,
            storage_spec: Some(admin::storage_config::StorageSpec::EventReport(
                admin::EventReportStorageSpec::default(),
            )),
            ..Default::default()
        };
        let added = admin
            .add_storage(admin::AddStorageRequest {
                storage: Some(storage),
                ..Default::default()
            })
            .await?
            .into_inner();
        anyhow::ensure!(admin_ok(&added.header), "addStorage: {:?}", added.header);
    }
    let mut group = admin
        .get_instance_group(admin::GetInstanceGroupRequest {
            name: kvcm::server::DEFAULT_GROUP.into(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .instance_group
        .ok_or_else(|| anyhow::anyhow!("no default group"))?;
    group.name = "rg".into();
    group.event_report_storage_candidates = vec!["er_l1p5".into(), "er_l2".into()];
    let created = admin
        .create_instance_group(admin::CreateInstanceGroupRequest {
            instance_group: Some(group),
            ..Default::default()
        })
        .await?
        .into_inner();
    anyhow::ensure!(
        admin_ok(&created.header),
        "createInstanceGroup: {:?}",
        created.header
    );
    for instance in ["all", "half", "adds"] {
        let registered = meta
            .register_instance(super::registration("rg", instance))
            .await?
            .into_inner();
        anyhow::ensure!(
            super::ok(&registered.header),
            "register: {:?}",
            registered.header
        );
        let held = match instance {
            "all" => KEYS,
            "half" => KEYS / 2,
            _ => continue,
        };
        for host in 0..HOSTS {
            let tier = tier_of(host);
            for start in (0..held).step_by(ADD_BLOCKS as usize) {
                let mut request = report_add(start, ADD_BLOCKS.min(held - start));
                request.instance_id = instance.into();
                request.host_ip_port = format!("10.0.0.{host}:9600");
                request.storage_type = tier;
                checked_report(meta, request).await?;
            }
        }
    }
    let started = meta
        .start_write_cache(meta::StartWriteCacheRequest {
            instance_id: "all".into(),
            block_keys: (0..KEYS).collect(),
            write_timeout_seconds: 60,
            ..Default::default()
        })
        .await?
        .into_inner();
    anyhow::ensure!(super::ok(&started.header), "start: {:?}", started.header);
    let finished = meta
        .finish_write_cache(meta::FinishWriteCacheRequest {
            instance_id: "all".into(),
            write_session_id: started.write_session_id,
            success_blocks: Some(meta::BlockMask {
                info: Some(meta::block_mask::Info::Offset(KEYS as i32)),
            }),
            ..Default::default()
        })
        .await?
        .into_inner();
    anyhow::ensure!(super::ok(&finished.header), "finish: {:?}", finished.header);
    Ok(())
}

/// An ADD of blocks `start..start + count` (one spec each) by reporter 10.0.0.100 of `adds`.
fn report_add(start: i64, count: i64) -> meta::ReportEventRequest {
    let add = |key: i64| meta::EventItem {
        event_type: meta::ReportEventType::EventBlockAdd as i32,
        event_params: Some(meta::event_item::EventParams::BlockAdd(
            meta::BlockAddEventParams {
                block_key: key.to_string(),
                medium: "gpu".into(),
                specs: vec![meta::LocationSpec {
                    name: "tp0".into(),
                    uri: format!("event_report://10.0.0.100:9600/gpu/{key}?size=65536"),
                    checksum: None,
                }],
                ..Default::default()
            },
        )),
    };
    meta::ReportEventRequest {
        trace_id: "bench".into(),
        instance_id: "adds".into(),
        host_ip_port: "10.0.0.100:9600".into(),
        events: (start..start + count).map(add).collect(),
        storage_type: 7,
    }
}

/// A HEARTBEAT of every reporter of `instance` (reporters are hidden after the heartbeat
/// timeout, 30 s by default; mutations do not count as heartbeats).
async fn heartbeats(meta: &mut MetaServiceClient<Channel>, instance: &str) -> anyhow::Result<()> {
    for host in 0..HOSTS {
        let request = meta::ReportEventRequest {
            trace_id: "bench".into(),
            instance_id: instance.into(),
            host_ip_port: format!("10.0.0.{host}:9600"),
            events: vec![meta::EventItem {
                event_type: meta::ReportEventType::EventHeartbeat as i32,
                event_params: Some(meta::event_item::EventParams::Heartbeat(
                    meta::HeartbeatEventParams::default(),
                )),
            }],
            storage_type: tier_of(host),
        };
        checked_report(meta, request).await?;
    }
    Ok(())
}

/// Even hosts report as L1.5 (7), odd ones as L2 (8).
fn tier_of(host: usize) -> i32 {
    if host % 2 == 0 {
        7
    } else {
        8
    }
}

async fn checked_report(
    meta: &mut MetaServiceClient<Channel>,
    request: meta::ReportEventRequest,
) -> anyhow::Result<()> {
    let answer = meta.report_event(request).await?.into_inner();
    anyhow::ensure!(
        super::ok(&answer.header),
        "reportEvent: {:?}",
        answer.header
    );
    Ok(())
}

fn host_state(instance: &str, remote: i32) -> meta::GetHostCacheStateRequest {
    meta::GetHostCacheStateRequest {
        instance_id: instance.into(),
        query_type: meta::QueryType::QtPrefixMatch as i32,
        block_cache_keys: (0..KEYS).collect(),
        global_kvs_host_count: remote,
        enable_p2p: remote > 0,
        ..Default::default()
    }
}

fn admin_ok(header: &Option<admin::CommonResponseHeader>) -> bool {
    header
        .as_ref()
        .and_then(|h| h.status.as_ref())
        .is_some_and(|s| s.code == admin::ErrorCode::Ok as i32)
}
