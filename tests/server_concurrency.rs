//! Concurrency: 8 client tasks write and read overlapping prefixes for ~10 s against one
//! server. Every URI a read returns was committed for that key, every committed block stays
//! readable, and no WRITING entry outlives its session.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{grpc_code, new_keys, registration_grpc, wait_until, TestServer};
use kvcm::proto::meta::{self, meta_service_client::MetaServiceClient};
use tonic::transport::Channel;

const TASKS: usize = 8;
const RUN_FOR: Duration = Duration::from_secs(10);
const KEY_SPACE: i64 = 24;
/// Sessions that are abandoned expire after this long.
const ABANDON_TIMEOUT_S: i32 = 1;

type Committed = Arc<Mutex<HashMap<i64, HashSet<String>>>>;

fn first_uri(location: &meta::CacheLocation) -> String {
    location.location_specs[0].uri.clone()
}

fn mask(info: meta::block_mask::Info) -> Option<meta::BlockMask> {
    Some(meta::BlockMask { info: Some(info) })
}

/// One write: start, then finish all / finish some / abandon; returns keys committed.
async fn write_round(client: &mut MetaServiceClient<Channel>, keys: &[i64], committed: &Committed) {
    let abandon = fastrand::u8(..10) == 0;
    let start = client
        .start_write_cache(meta::StartWriteCacheRequest {
            instance_id: "inst".into(),
            block_keys: keys.to_vec(),
            write_timeout_seconds: if abandon { ABANDON_TIMEOUT_S } else { 30 },
            ..Default::default()
        })
        .await
        .expect("grpc")
        .into_inner();
    assert_eq!(grpc_code(&start.header), meta::ErrorCode::Ok);
    if abandon {
        return;
    }
    let new_keys: Vec<i64> = new_keys(keys, start.block_mask);
    assert_eq!(new_keys.len(), start.locations.len());
    let success: Vec<bool> = new_keys.iter().map(|_| fastrand::u8(..4) != 0).collect();
    {
        // Recorded before the commit, so a reader never sees an unrecorded URI.
        let mut committed = committed.lock().unwrap();
        for ((key, location), ok) in new_keys.iter().zip(&start.locations).zip(&success) {
            if *ok {
                committed
                    .entry(*key)
                    .or_default()
                    .insert(first_uri(location));
            }
        }
    }
    let finish = client
        .finish_write_cache(meta::FinishWriteCacheRequest {
            instance_id: "inst".into(),
            write_session_id: start.write_session_id,
            success_blocks: mask(meta::block_mask::Info::BoolMasks(meta::BoolMasksType {
                values: success,
            })),
            ..Default::default()
        })
        .await
        .expect("grpc")
        .into_inner();
    assert_eq!(grpc_code(&finish.header), meta::ErrorCode::Ok);
}

/// One read: every returned URI must have been committed for its key.
async fn read_round(client: &mut MetaServiceClient<Channel>, keys: &[i64], committed: &Committed) {
    let found = client
        .get_cache_location(meta::GetCacheLocationRequest {
            instance_id: "inst".into(),
            query_type: meta::QueryType::QtPrefixMatch as i32,
            block_keys: keys.to_vec(),
            ..Default::default()
        })
        .await
        .expect("grpc")
        .into_inner();
    assert_eq!(grpc_code(&found.header), meta::ErrorCode::Ok);
    let committed = committed.lock().unwrap();
    for (key, location) in keys.iter().zip(&found.locations) {
        let uri = first_uri(location);
        let known = committed.get(key).is_some_and(|uris| uris.contains(&uri));
        assert!(
            known,
            "key {key} answered {uri}, which was never committed for it"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_clients_write_and_read_overlapping_prefixes() {
    let server = TestServer::start().await;
    let mut client = server.meta().await;
    client
        .register_instance(registration_grpc("inst", 16))
        .await
        .unwrap();
    let committed: Committed = Arc::default();
    let deadline = Instant::now() + RUN_FOR;
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let mut client = client.clone();
        let committed = committed.clone();
        tasks.push(tokio::spawn(async move {
            let mut rounds = 0u64;
            while Instant::now() < deadline {
                let start = fastrand::i64(0..KEY_SPACE / 2);
                let len = fastrand::i64(1..=KEY_SPACE - start);
                let keys: Vec<i64> = (start..start + len).map(|k| 1000 + k).collect();
                if fastrand::bool() {
                    write_round(&mut client, &keys, &committed).await;
                } else {
                    read_round(&mut client, &keys, &committed).await;
                }
                rounds += 1;
            }
            rounds
        }));
    }
    let mut rounds = 0;
    for task in tasks {
        rounds += task.await.expect("client task");
    }
    assert!(rounds > 100, "only {rounds} rounds ran");

    let all_keys: Vec<i64> = (0..KEY_SPACE).map(|k| 1000 + k).collect();
    let settled = wait_until(Duration::from_secs(10), async || {
        let statuses = server.statuses("inst", &all_keys).await;
        statuses
            .iter()
            .all(|s| s != "CLS_WRITING")
            .then_some(statuses)
    })
    .await
    .expect("no WRITING entry outlives its session");
    let committed = committed.lock().unwrap().clone();
    for (key, status) in all_keys.iter().zip(&settled) {
        if committed.contains_key(key) {
            assert_eq!(status, "CLS_SERVING", "committed key {key}");
        }
    }
    let found = client
        .get_cache_location(meta::GetCacheLocationRequest {
            instance_id: "inst".into(),
            query_type: meta::QueryType::QtBatchGet as i32,
            block_keys: all_keys.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    for (key, location) in all_keys.iter().zip(&found.locations) {
        if let Some(uris) = committed.get(key) {
            assert!(
                uris.contains(&first_uri(location)),
                "key {key} readable with its URI"
            );
        }
    }
}

#[tokio::test]
async fn concurrent_starts_on_one_key_allocate_it_once() {
    let server = TestServer::start().await;
    let mut client = server.meta().await;
    let registered = client
        .register_instance(registration_grpc("inst", 16))
        .await;
    assert_eq!(
        grpc_code(&registered.expect("grpc OK").into_inner().header),
        meta::ErrorCode::Ok
    );
    for key in 0..20_i64 {
        let starts = (0..8).map(|_| {
            let mut client = client.clone();
            tokio::spawn(async move {
                let request = meta::StartWriteCacheRequest {
                    instance_id: "inst".into(),
                    block_keys: vec![key],
                    write_timeout_seconds: 30,
                    ..Default::default()
                };
                client
                    .start_write_cache(request)
                    .await
                    .expect("grpc OK")
                    .into_inner()
            })
        });
        let mut allocated = 0;
        for start in futures_join(starts).await {
            assert_eq!(grpc_code(&start.header), meta::ErrorCode::Ok);
            let present = start.block_mask == mask(meta::block_mask::Info::Offset(1));
            assert_eq!(
                present,
                start.locations.is_empty(),
                "mask agrees with locations"
            );
            allocated += start.locations.len();
        }
        assert_eq!(allocated, 1, "key {key} was allocated by exactly one start");
    }
}

/// Awaits every task, in order.
async fn futures_join<T>(tasks: impl Iterator<Item = tokio::task::JoinHandle<T>>) -> Vec<T> {
    let tasks: Vec<_> = tasks.collect();
    let mut results = Vec::with_capacity(tasks.len());
    for task in tasks {
        results.push(task.await.expect("task"));
    }
    results
}
