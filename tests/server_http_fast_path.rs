//! The HTTP GetCacheLocation answer is printed straight from the lookup (a fast path beside
//! the proto + pbjson path that gRPC takes). Under concurrent writers every URI it returns was
//! committed for its key, and once writes stop it answers exactly what gRPC answers.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{grpc_code, new_keys, registration_grpc, TestServer};
use kvcm::proto::meta::{self, meta_service_client::MetaServiceClient};
use serde_json::{json, Value};
use tonic::transport::Channel;

const WRITERS: usize = 4;
const READERS: usize = 4;
const RUN_FOR: Duration = Duration::from_secs(5);
const KEY_SPACE: i64 = 64;

type Committed = Arc<Mutex<HashMap<i64, HashSet<String>>>>;

/// Writes a random run of keys and commits a random subset, recording the URIs first.
async fn write_round(client: &mut MetaServiceClient<Channel>, committed: &Committed) {
    let start = fastrand::i64(0..KEY_SPACE - 1);
    let keys: Vec<i64> = (start..fastrand::i64(start + 1..=KEY_SPACE)).collect();
    let started = client
        .start_write_cache(meta::StartWriteCacheRequest {
            instance_id: "inst".into(),
            block_keys: keys.clone(),
            write_timeout_seconds: 30,
            ..Default::default()
        })
        .await
        .expect("grpc")
        .into_inner();
    assert_eq!(grpc_code(&started.header), meta::ErrorCode::Ok);
    let new_keys: Vec<i64> = new_keys(&keys, started.block_mask);
    let success: Vec<bool> = new_keys.iter().map(|_| fastrand::bool()).collect();
    {
        let mut committed = committed.lock().unwrap();
        for ((key, location), ok) in new_keys.iter().zip(&started.locations).zip(&success) {
            if *ok {
                let uri = location.location_specs[0].uri.clone();
                committed.entry(*key).or_default().insert(uri);
            }
        }
    }
    let finished = client
        .finish_write_cache(meta::FinishWriteCacheRequest {
            instance_id: "inst".into(),
            write_session_id: started.write_session_id,
            success_blocks: Some(meta::BlockMask {
                info: Some(meta::block_mask::Info::BoolMasks(meta::BoolMasksType {
                    values: success,
                })),
            }),
            ..Default::default()
        })
        .await
        .expect("grpc")
        .into_inner();
    // A concurrent RemoveCache may have taken some of the session's WRITING blocks: the
    // finish then reports them as a manager failure (their URIs stay in `committed`, a
    // superset of what is readable).
    let code = grpc_code(&finished.header);
    assert!(
        matches!(code, meta::ErrorCode::Ok | meta::ErrorCode::InternalError),
        "{:?}",
        finished.header
    );
    if fastrand::u8(..4) == 0 {
        let doomed = keys[fastrand::usize(..keys.len())];
        client
            .remove_cache(meta::RemoveCacheRequest {
                instance_id: "inst".into(),
                block_keys: vec![doomed],
                ..Default::default()
            })
            .await
            .expect("grpc");
    }
}

fn http_query(keys: &[i64]) -> Value {
    json!({"instance_id": "inst", "query_type": "QT_BATCH_GET", "block_keys": keys})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_answers_only_committed_uris_under_writers_and_then_equals_grpc() {
    let server = Arc::new(TestServer::start().await);
    let mut client = server.meta().await;
    let registered = client
        .register_instance(registration_grpc("inst", 16))
        .await;
    assert_eq!(
        grpc_code(&registered.expect("grpc").into_inner().header),
        meta::ErrorCode::Ok
    );
    let committed: Committed = Arc::default();
    let deadline = Instant::now() + RUN_FOR;
    let mut writers = Vec::new();
    for _ in 0..WRITERS {
        let (mut client, committed) = (client.clone(), committed.clone());
        writers.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                write_round(&mut client, &committed).await;
            }
        }));
    }
    let all_keys: Vec<i64> = (0..KEY_SPACE).collect();
    let mut readers = Vec::new();
    for _ in 0..READERS {
        let (server, committed, keys) = (server.clone(), committed.clone(), all_keys.clone());
        readers.push(tokio::spawn(async move {
            let mut hits = 0usize;
            while Instant::now() < deadline {
                let answer = server
                    .meta_http("getCacheLocation", http_query(&keys))
                    .await;
                assert_eq!(answer["header"]["status"]["code"], "OK", "{answer}");
                let locations = answer["locations"].as_array().expect("locations");
                assert_eq!(locations.len(), keys.len(), "one answer per key");
                let committed = committed.lock().unwrap();
                for (key, location) in keys.iter().zip(locations) {
                    let uri = location["location_specs"][0]["uri"].as_str().expect("uri");
                    if uri.is_empty() {
                        continue;
                    }
                    hits += 1;
                    let known = committed.get(key).is_some_and(|uris| uris.contains(uri));
                    assert!(known, "key {key} answered {uri}, never committed for it");
                }
            }
            hits
        }));
    }
    for writer in writers {
        writer.await.expect("writer");
    }
    let mut hits = 0;
    for reader in readers {
        hits += reader.await.expect("reader");
    }
    assert!(hits > 0, "the readers saw committed blocks");

    for query_type in [meta::QueryType::QtBatchGet, meta::QueryType::QtPrefixMatch] {
        let over_grpc = client
            .get_cache_location(meta::GetCacheLocationRequest {
                instance_id: "inst".into(),
                query_type: query_type as i32,
                block_keys: all_keys.clone(),
                ..Default::default()
            })
            .await
            .expect("grpc")
            .into_inner();
        let grpc_locations = serde_json::to_value(&over_grpc.locations).expect("pbjson");
        let body = json!({"instance_id": "inst", "query_type": query_type.as_str_name(), "block_keys": all_keys});
        let over_http = server.meta_http("getCacheLocation", body).await;
        assert_eq!(over_http["locations"], grpc_locations, "{query_type:?}");
    }
}
