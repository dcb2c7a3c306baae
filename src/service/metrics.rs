//! Per-API request metrics: `service.query_counter` (requests served) and
//! `service.query_rt_us` (mean response time in µs), tagged `api_name`; the per-instance meta
//! APIs are also counted per instance (tags `instance_group`, `instance_id`). Recording an
//! API is two relaxed atomic adds on a map fixed at start; the per-instance series add one
//! shared-lock map lookup.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::proto::admin;
use kvcm_manager::sync::{read_lock, write_lock};

/// Name of the request counter.
pub const QUERY_COUNTER: &str = "service.query_counter";
/// Name of the mean response time gauge.
pub const QUERY_RT_US: &str = "service.query_rt_us";

#[derive(Debug, Default)]
struct ApiStats {
    count: AtomicU64,
    total_us: AtomicU64,
}

impl ApiStats {
    fn record(&self, elapsed: Duration) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.total_us.fetch_add(micros, Ordering::Relaxed);
    }

    /// (count, mean µs) when served at least once.
    fn read(&self) -> Option<(u64, f64)> {
        let count = self.count.load(Ordering::Relaxed);
        let total = self.total_us.load(Ordering::Relaxed);
        (count > 0).then(|| (count, total as f64 / count as f64))
    }
}

/// The counters of one instance, by API.
#[derive(Debug)]
struct InstanceStats {
    group: String,
    apis: BTreeMap<&'static str, ApiStats>,
}

/// One series: its tags, count and mean µs.
struct Series {
    tags: Vec<(&'static str, String)>,
    count: u64,
    mean_us: f64,
}

/// Counters of every API, by name, and of every instance's APIs.
#[derive(Debug)]
pub struct Metrics {
    apis: BTreeMap<&'static str, ApiStats>,
    instance_apis: Vec<&'static str>,
    instances: RwLock<HashMap<Arc<str>, InstanceStats>>,
}

impl Metrics {
    /// Metrics for exactly these API names; `instance_apis` are also counted per instance.
    pub fn new(api_names: &[&'static str], instance_apis: &[&'static str]) -> Self {
        let all_apis = api_names.iter().chain(instance_apis);
        Metrics {
            apis: all_apis.map(|&n| (n, ApiStats::default())).collect(),
            instance_apis: instance_apis.to_vec(),
            instances: RwLock::default(),
        }
    }

    /// Records one served request (unknown names are ignored).
    pub fn record(&self, api_name: &str, elapsed: Duration) {
        if let Some(stats) = self.apis.get(api_name) {
            stats.record(elapsed);
        }
    }

    /// Records one request of an instance (counted for the API as well).
    pub fn record_instance(
        &self,
        api_name: &str,
        instance_id: &Arc<str>,
        group: &str,
        elapsed: Duration,
    ) {
        self.record(api_name, elapsed);
        let known = read_lock(&self.instances);
        if let Some(stats) = known.get(instance_id).and_then(|i| i.apis.get(api_name)) {
            return stats.record(elapsed);
        }
        drop(known);
        let mut instances = write_lock(&self.instances);
        let entry = instances
            .entry(instance_id.clone())
            .or_insert_with(|| InstanceStats {
                group: group.to_string(),
                apis: self
                    .instance_apis
                    .iter()
                    .map(|&n| (n, ApiStats::default()))
                    .collect(),
            });
        if let Some(stats) = entry.apis.get(api_name) {
            stats.record(elapsed);
        }
    }

    /// Every series served at least once: per API, then per instance and API.
    fn snapshot(&self) -> Vec<Series> {
        let mut series: Vec<Series> = self
            .apis
            .iter()
            .filter_map(|(&api, stats)| {
                let (count, mean_us) = stats.read()?;
                let tags = vec![("api_name", api.to_string())];
                Some(Series {
                    tags,
                    count,
                    mean_us,
                })
            })
            .collect();
        let instances = read_lock(&self.instances);
        let mut ids: Vec<&Arc<str>> = instances.keys().collect();
        ids.sort();
        for id in ids {
            let instance = &instances[id];
            for (&api, stats) in &instance.apis {
                if let Some((count, mean_us)) = stats.read() {
                    let tags = vec![
                        ("api_name", api.to_string()),
                        ("instance_group", instance.group.clone()),
                        ("instance_id", id.to_string()),
                    ];
                    series.push(Series {
                        tags,
                        count,
                        mean_us,
                    });
                }
            }
        }
        series
    }

    /// The GetMetrics list: a counter and a gauge per series.
    pub fn to_wire(&self) -> Vec<admin::MetricsData> {
        use admin::metric_value::Value;
        let metric = |name: &str, value: Value, tags: &[(&str, String)]| admin::MetricsData {
            metric_name: name.into(),
            metric_value: Some(admin::MetricValue { value: Some(value) }),
            metric_tags: tags
                .iter()
                .map(|(key, value)| admin::MetricsTag {
                    tag_key: key.to_string(),
                    tag_value: value.clone(),
                })
                .collect(),
        };
        self.snapshot()
            .into_iter()
            .flat_map(|s| {
                [
                    metric(QUERY_COUNTER, Value::IntValue(s.count as i64), &s.tags),
                    metric(QUERY_RT_US, Value::FloatValue(s.mean_us), &s.tags),
                ]
            })
            .collect()
    }

    /// Prometheus text exposition (dots in names become underscores).
    pub fn to_prometheus(&self) -> String {
        let snapshot = self.snapshot();
        let mut text = String::new();
        for (name, is_counter) in [(QUERY_COUNTER, true), (QUERY_RT_US, false)] {
            let name = name.replace('.', "_");
            let kind = if is_counter { "counter" } else { "gauge" };
            let _ = writeln!(text, "# TYPE {name} {kind}");
            for series in &snapshot {
                let labels: Vec<String> = series
                    .tags
                    .iter()
                    .map(|(key, value)| format!("{key}=\"{}\"", escape_label(value)))
                    .collect();
                let value = if is_counter {
                    series.count as f64
                } else {
                    series.mean_us
                };
                let _ = writeln!(text, "{name}{{{}}} {value}", labels.join(","));
            }
        }
        text
    }
}

/// Escapes a Prometheus label value (backslash, quote, newline).
fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_count_and_mean() {
        let metrics = Metrics::new(&["B"], &["A"]);
        metrics.record("A", Duration::from_micros(10));
        metrics.record_instance("A", &Arc::from("i\"1"), "g", Duration::from_micros(30));
        metrics.record("Unknown", Duration::from_micros(30));
        let wire = metrics.to_wire();
        assert_eq!(
            wire.len(),
            4,
            "A, and A of instance i\"1; B was never served"
        );
        assert_eq!(wire[2].metric_tags.len(), 3);
        let text = metrics.to_prometheus();
        assert!(
            text.contains("service_query_counter{api_name=\"A\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("service_query_rt_us{api_name=\"A\"} 20"),
            "{text}"
        );
        let tagged =
            r#"service_query_counter{api_name="A",instance_group="g",instance_id="i\"1"} 1"#;
        assert!(text.contains(tagged), "{text}");
    }
}
