//! Capacity on a real `kvcm serve` (docs/capacity.md): an instance at its `max_key_count`
//! refuses the next block and says why; a watermark lowered through UpdateInstanceGroup
//! frees room within 2 s; the evictions reach the event log as `reclaim` lines; the live
//! capacity curve of served lookups is the optimizer's LRU curve of the event log.

mod common;

use std::time::{Duration, Instant};

use common::{code, wait_until, TestServer};
use kvcm_optimizer::trace::events::{Event, EventLogWriter, EventType};
use serde_json::{json, Value};

/// Replaces group `default`'s key cap and watermark through UpdateInstanceGroup.
async fn set_capacity(server: &TestServer, max_key_count: i64, used_percentage: f64) {
    common::update_group(server, "default", |group| {
        let cache = &mut group["cache_config"];
        cache["meta_indexer_config"]["max_key_count"] = json!(max_key_count);
        cache["reclaim_strategy"]["trigger_strategy"] = json!({"used_percentage": used_percentage});
    })
    .await;
}

async fn start_write(server: &TestServer, keys: &[i64]) -> Value {
    server
        .meta_http(
            "startWriteCache",
            json!({"instance_id": "inst", "block_keys": keys, "write_timeout_seconds": 30}),
        )
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowered_watermark_lets_the_17th_block_in_within_2_s_and_logs_the_evictions() {
    let mut server = TestServer::start_with(&["kvcm.cache_reclaimer.period_ms=50"]).await;
    set_capacity(&server, 16, 1.0).await;
    server.register("inst", 4).await;
    let keys: Vec<i64> = (1..=15).collect();
    server.write_keys("inst", &keys).await;

    // The 16th key fits, the 17th gets no location: marked as needing no write, and the
    // status message says why.
    let partial = server.write_keys("inst", &[16, 17]).await;
    assert_eq!(
        partial["locations"].as_array().map(Vec::len),
        Some(1),
        "{partial}"
    );
    assert_eq!(
        partial["block_mask"],
        json!({"bool_masks": {"values": [false, true]}})
    );
    let message = partial["header"]["status"]["message"]
        .as_str()
        .expect("message");
    assert!(message.contains("max_key_count"), "{message}");
    let refused = start_write(&server, &[17]).await;
    assert_eq!(code(&refused), "INTERNAL_ERROR", "{refused}");
    let message = refused["header"]["status"]["message"]
        .as_str()
        .expect("message");
    assert!(message.contains("max_key_count"), "{message}");

    set_capacity(&server, 16, 0.1).await;
    let lowered = Instant::now();
    let admitted = wait_until(Duration::from_secs(2), async || {
        let answer = start_write(&server, &[17]).await;
        (code(&answer) == "OK").then_some(answer)
    })
    .await
    .expect("the 17th write is admitted within 2 s");
    assert!(lowered.elapsed() < Duration::from_secs(2));
    assert_eq!(admitted["locations"].as_array().map(Vec::len), Some(1));

    capacity_metrics_are_reported(&server).await;
    let status = server.signal_and_wait("TERM");
    assert!(status.success(), "{status:?}");
    let dir = server.dir.path().join("events");
    let reclaimed: Vec<u64> = EventLogWriter::files_oldest_first(&dir)
        .iter()
        .flat_map(|file| {
            let text = std::fs::read_to_string(file).expect("read log");
            text.lines()
                .map(|line| serde_json::from_str::<Event>(line).expect("schema v1"))
                .collect::<Vec<_>>()
        })
        .filter(|event| event.event == EventType::Reclaim && event.instance == "inst")
        .flat_map(|event| event.keys)
        .collect();
    assert!(reclaimed.len() >= 15, "{reclaimed:?}");
    assert!(
        reclaimed.iter().all(|key| (1..=16).contains(key)),
        "{reclaimed:?}"
    );
}

/// GetMetrics and `GET /metrics` report the instance's keys and the reclaimer's evictions
/// (one group and one instance: each series name occurs once).
async fn capacity_metrics_are_reported(server: &TestServer) {
    // The deleter removes evicted keys after the eviction: await the gauge.
    let metrics = wait_until(Duration::from_secs(2), async || {
        let metrics = server.admin_http("getMetrics", json!({})).await;
        assert_eq!(code(&metrics), "OK", "{metrics}");
        let keys = metric(&metrics, "capacity.instance_keys")["float_value"].as_f64();
        (keys <= Some(2.0)).then_some(metrics)
    })
    .await
    .expect("1 key kept + the 17th");
    let evicted: i64 = metric(&metrics, "capacity.reclaim_evicted_blocks")["int_value"]
        .as_str()
        .expect("int64 as a string")
        .parse()
        .expect("int");
    assert!(evicted >= 15, "{evicted}");
    let quota = metric(&metrics, "capacity.group_quota_bytes")["float_value"].as_f64();
    assert_eq!(quota, Some(i64::MAX as f64));
    let (status, text) =
        common::http_request(server.address("admin_http"), "GET", "/metrics", b"").await;
    assert_eq!(status, 200);
    let text = String::from_utf8(text).expect("utf-8");
    assert!(
        text.contains("# TYPE kvcm_capacity_reclaim_evicted_blocks counter"),
        "{text}"
    );
    assert!(
        text.contains(
            r#"kvcm_capacity_instance_keys{instance_group="default",instance_id="inst"}"#
        ),
        "{text}"
    );
    assert!(
        text.contains(
            r#"kvcm_capacity_type_used_bytes{instance_group="default",storage_type="ST_NFS"}"#
        ),
        "{text}"
    );
}

/// The value of the first series named `name` in a GetMetrics answer.
fn metric(metrics: &Value, name: &str) -> Value {
    metrics["metrics"]
        .as_array()
        .expect("metrics")
        .iter()
        .find(|m| m["metric_name"] == name)
        .unwrap_or_else(|| panic!("{name} in {metrics}"))["metric_value"]
        .clone()
}

/// `GET <path>` on the admin HTTP port: status and JSON body.
async fn admin_get(server: &TestServer, path: &str) -> (u16, Value) {
    let (status, body) = common::http_request(server.address("admin_http"), "GET", path, b"").await;
    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
    (status, body)
}

#[tokio::test]
async fn the_live_capacity_curve_is_the_optimizers_lru_curve_of_the_event_log() {
    let mut server = TestServer::start().await;
    let registered = server.register("inst", 4).await;
    assert_eq!(code(&registered), "OK", "{registered}");
    let mut rng = fastrand::Rng::with_seed(11);
    for i in 0..300 {
        let start = rng.i64(0..80);
        let keys: Vec<i64> = (start..start + rng.i64(1..10)).collect();
        let mut body = json!({"trace_id": format!("c{i}"), "instance_id": "inst",
                              "query_type": "QT_PREFIX_MATCH", "block_keys": keys});
        if i % 3 == 0 {
            body["token_ids"] = json!(vec![1; keys.len() * 4 - 2]);
        }
        let answer = server.meta_http("getCacheLocation", body).await;
        assert_eq!(code(&answer), "OK", "{answer}");
    }
    let (status, curve) =
        admin_get(&server, "/kvcm/capacity_curve?instance_id=inst&points=65").await;
    assert_eq!(status, 200, "{curve}");
    assert_eq!(curve["window_requests"], 300);
    assert_eq!(curve["block_bytes"], 1024);
    let points = curve["points"].as_array().expect("points");
    assert!(points.len() > 30, "{curve}");

    let (_, text) =
        common::http_request(server.address("admin_http"), "GET", "/metrics", b"").await;
    let text = String::from_utf8_lossy(&text).to_string();
    let gauge = format!(
        "kvcm_capacity_curve_blocks_for_hit_rate{{instance_id=\"inst\",fraction=\"0.9\"}} {}",
        curve["capacity_for"][1]["capacity_blocks"]
    );
    assert!(text.contains(&gauge), "{gauge} in {text}");

    for (path, status) in [
        ("/kvcm/capacity_curve", 400),
        ("/kvcm/capacity_curve?instance_id=inst&points=1", 400),
        ("/kvcm/capacity_curve?instance_id=inst&colour=red", 400),
        ("/kvcm/capacity_curve?instance_id=nobody", 404),
    ] {
        let (answered, body) = admin_get(&server, path).await;
        assert_eq!(answered, status, "{path}: {body}");
        assert!(
            body["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{body}"
        );
    }

    assert!(server.signal_and_wait("TERM").success());
    let dir = server.dir.path().join("events");
    let workload = kvcm_optimizer::model::Workload::load(
        &[dir],
        Some(kvcm_optimizer::trace::TraceFormat::Events),
        None,
    )
    .expect("the event log replays");
    let expected = kvcm_optimizer::sim::LruCurve::compute(&workload);
    assert_eq!(curve["unique_blocks"], expected.max_capacity());
    for point in points {
        let capacity = point["capacity_blocks"].as_u64().unwrap() as usize;
        let (blocks, tokens) = (
            point["block_hit_rate"].as_f64().unwrap(),
            point["token_hit_rate"].as_f64().unwrap(),
        );
        assert!(
            (blocks - expected.block_hit_rate(capacity)).abs() <= 0.01,
            "{point}"
        );
        assert!(
            (tokens - expected.token_hit_rate(capacity)).abs() <= 0.01,
            "{point}"
        );
    }
}
