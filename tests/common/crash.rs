//! Crash tests' clients: they stream StartWriteCache → bytes into the block file →
//! FinishWriteCache, and RemoveCache, over real gRPC, keep a book of what was acknowledged,
//! and check a server against it afterwards (tests/durability.rs, tests/shared_store.rs).

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kvcm::proto::meta;
use kvcm::proto::meta::meta_service_client::MetaServiceClient;
use tonic::transport::Channel;

use super::{grpc_code, TestServer};

pub const INSTANCE: &str = "crash";
/// Registered size of the one spec (`common::registration`).
pub const BLOCK_BYTES: usize = 1024;
/// Keys per StartWriteCache.
pub const KEYS_PER_WRITE: i64 = 4;
/// Concurrent clients.
pub const WRITERS: i64 = 2;

/// What the clients were told.
#[derive(Debug, Default)]
pub struct Book {
    /// Acknowledged finishes: key → URI.
    pub written: BTreeMap<i64, String>,
    /// Acknowledged removes.
    pub removed: BTreeSet<i64>,
    /// Keys whose last call failed (the crash): either outcome is right.
    pub uncertain: BTreeSet<i64>,
    /// Every key a write was started for.
    pub started: BTreeSet<i64>,
}

impl Book {
    pub fn merge(&mut self, other: Book) {
        self.written.extend(other.written);
        self.removed.extend(other.removed);
        self.uncertain.extend(other.uncertain);
        self.started.extend(other.started);
    }

    /// "N acknowledged writes, N removes, N uncertain", for the test's output.
    pub fn summary(&self) -> String {
        format!(
            "{} acknowledged writes, {} removes, {} uncertain",
            self.written.len(),
            self.removed.len(),
            self.uncertain.len()
        )
    }
}

/// The bytes a key's block holds.
pub fn pattern(key: i64) -> Vec<u8> {
    (0..BLOCK_BYTES)
        .map(|i| (key as usize).wrapping_mul(31).wrapping_add(i) as u8)
        .collect()
}

pub fn ok(header: &Option<meta::CommonResponseHeader>) -> bool {
    grpc_code(header) == meta::ErrorCode::Ok
}

/// Writes the key's bytes where its URI says (the engine's part of a write).
pub fn store_bytes(uri: &str, key: i64) {
    let place = kvcm_data::parse_block_uri(uri).expect("a file URI");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&place.path)
        .expect("open the block file");
    file.write_all_at(&pattern(key), place.offset)
        .expect("write the block");
}

pub fn read_bytes(uri: &str) -> Vec<u8> {
    let place = kvcm_data::parse_block_uri(uri).expect("a file URI");
    let file = std::fs::File::open(&place.path).expect("the block file exists");
    let mut bytes = vec![0; BLOCK_BYTES];
    file.read_exact_at(&mut bytes, place.offset)
        .expect("read the block");
    bytes
}

/// One client: writes batches of new keys and removes every third batch's first key, until
/// `stop` or a failed call.
pub async fn stream(
    mut grpc: MetaServiceClient<Channel>,
    first_key: i64,
    stop: Arc<AtomicBool>,
) -> Book {
    let mut book = Book::default();
    let mut next = first_key;
    for round in 0.. {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let keys: Vec<i64> = (next..next + KEYS_PER_WRITE).collect();
        next += KEYS_PER_WRITE;
        book.started.extend(&keys);
        let request = meta::StartWriteCacheRequest {
            instance_id: INSTANCE.into(),
            block_keys: keys.clone(),
            write_timeout_seconds: 30,
            ..Default::default()
        };
        let Ok(started) = grpc
            .start_write_cache(request)
            .await
            .map(|r| r.into_inner())
        else {
            break;
        };
        if !ok(&started.header) {
            break;
        }
        let uris: Vec<String> = started
            .locations
            .iter()
            .map(|l| l.location_specs[0].uri.clone())
            .collect();
        assert_eq!(uris.len(), keys.len(), "new keys get a location each");
        for (key, uri) in keys.iter().zip(&uris) {
            store_bytes(uri, *key);
        }
        let finish = meta::FinishWriteCacheRequest {
            instance_id: INSTANCE.into(),
            write_session_id: started.write_session_id,
            success_blocks: Some(meta::BlockMask {
                info: Some(meta::block_mask::Info::Offset(KEYS_PER_WRITE as i32)),
            }),
            ..Default::default()
        };
        match grpc
            .finish_write_cache(finish)
            .await
            .map(|r| r.into_inner())
        {
            Ok(answer) if ok(&answer.header) => book.written.extend(keys.iter().copied().zip(uris)),
            _ => {
                book.uncertain.extend(&keys);
                break;
            }
        }
        if round % 3 == 2 {
            let key = keys[0];
            let remove = meta::RemoveCacheRequest {
                instance_id: INSTANCE.into(),
                block_keys: vec![key],
                ..Default::default()
            };
            match grpc.remove_cache(remove).await.map(|r| r.into_inner()) {
                Ok(answer) if ok(&answer.header) => {
                    book.written.remove(&key);
                    book.removed.insert(key);
                }
                _ => {
                    book.uncertain.insert(key);
                    break;
                }
            }
        }
    }
    book
}

/// Per key, the URI a batch get answers (empty: not readable).
pub async fn batch_get(server: &TestServer, keys: &[i64]) -> Vec<String> {
    let mut grpc = server.meta().await;
    let mut uris = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(256) {
        let request = meta::GetCacheLocationRequest {
            instance_id: INSTANCE.into(),
            query_type: meta::QueryType::QtBatchGet as i32,
            block_keys: chunk.to_vec(),
            ..Default::default()
        };
        let answer = grpc
            .get_cache_location(request)
            .await
            .expect("get")
            .into_inner();
        assert!(ok(&answer.header), "{:?}", answer.header);
        let found = answer.locations.iter().map(|l| {
            l.location_specs
                .first()
                .map_or(String::new(), |s| s.uri.clone())
        });
        uris.extend(found);
    }
    uris
}

/// Checks the restarted server against what the clients were told.
pub async fn verify(server: &TestServer, book: &Book) {
    let certain = |key: &i64| !book.uncertain.contains(key);
    let written: Vec<(i64, &String)> = book
        .written
        .iter()
        .filter(|(k, _)| certain(k))
        .map(|(k, u)| (*k, u))
        .collect();
    let keys: Vec<i64> = written.iter().map(|(k, _)| *k).collect();
    let found = batch_get(server, &keys).await;
    for ((key, uri), now) in written.iter().zip(&found) {
        assert_eq!(
            now, *uri,
            "key {key}: an acknowledged write reads at its URI"
        );
        assert_eq!(read_bytes(uri), pattern(*key), "key {key}: its bytes");
    }
    let removed: Vec<i64> = book.removed.iter().copied().filter(certain).collect();
    let found = batch_get(server, &removed).await;
    for (key, now) in removed.iter().zip(&found) {
        assert!(
            now.is_empty(),
            "key {key}: an acknowledged remove stays removed ({now})"
        );
    }
    let started: Vec<i64> = book.started.iter().copied().collect();
    for chunk in started.chunks(256) {
        let statuses = server.statuses(INSTANCE, chunk).await;
        for (key, status) in chunk.iter().zip(statuses) {
            assert_ne!(
                status, "CLS_WRITING",
                "key {key}: no WRITING entry after a restart"
            );
        }
    }
}
