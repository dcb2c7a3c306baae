//! Per-API request metrics: `service.query_counter` (requests served) and
//! `service.query_rt_us` (mean response time in µs), tagged `api_name`. Recording is two
//! relaxed atomic adds on a map fixed at start, so the hot path takes no lock.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::proto::admin;

/// Name of the request counter.
pub const QUERY_COUNTER: &str = "service.query_counter";
/// Name of the mean response time gauge.
pub const QUERY_RT_US: &str = "service.query_rt_us";

#[derive(Debug, Default)]
struct ApiStats {
    count: AtomicU64,
    total_us: AtomicU64,
}

/// Counters of every API, by name.
#[derive(Debug)]
pub struct Metrics {
    apis: BTreeMap<&'static str, ApiStats>,
}

impl Metrics {
    /// Metrics for exactly these API names.
    pub fn new(api_names: &[&'static str]) -> Self {
        Metrics {
            apis: api_names
                .iter()
                .map(|&n| (n, ApiStats::default()))
                .collect(),
        }
    }

    /// Records one served request (unknown names are ignored).
    pub fn record(&self, api_name: &str, elapsed: Duration) {
        if let Some(stats) = self.apis.get(api_name) {
            stats.count.fetch_add(1, Ordering::Relaxed);
            let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
            stats.total_us.fetch_add(micros, Ordering::Relaxed);
        }
    }

    /// (api, count, mean µs) of every API served at least once.
    fn snapshot(&self) -> Vec<(&'static str, u64, f64)> {
        self.apis
            .iter()
            .filter_map(|(&name, stats)| {
                let count = stats.count.load(Ordering::Relaxed);
                let total = stats.total_us.load(Ordering::Relaxed);
                (count > 0).then(|| (name, count, total as f64 / count as f64))
            })
            .collect()
    }

    /// The GetMetrics list: a counter and a gauge per served API.
    pub fn to_wire(&self) -> Vec<admin::MetricsData> {
        use admin::metric_value::Value;
        let tag = |api: &str| {
            vec![admin::MetricsTag {
                tag_key: "api_name".into(),
                tag_value: api.into(),
            }]
        };
        let metric = |name: &str, value: Value, api: &str| admin::MetricsData {
            metric_name: name.into(),
            metric_value: Some(admin::MetricValue { value: Some(value) }),
            metric_tags: tag(api),
        };
        self.snapshot()
            .into_iter()
            .flat_map(|(api, count, mean_us)| {
                [
                    metric(QUERY_COUNTER, Value::IntValue(count as i64), api),
                    metric(QUERY_RT_US, Value::FloatValue(mean_us), api),
                ]
            })
            .collect()
    }

    /// Prometheus text exposition (dots in names become underscores).
    pub fn to_prometheus(&self) -> String {
        let snapshot = self.snapshot();
        let mut text = String::new();
        let counter = QUERY_COUNTER.replace('.', "_");
        let gauge = QUERY_RT_US.replace('.', "_");
        let _ = writeln!(text, "# TYPE {counter} counter");
        for (api, count, _) in &snapshot {
            let _ = writeln!(text, "{counter}{{api_name=\"{api}\"}} {count}");
        }
        let _ = writeln!(text, "# TYPE {gauge} gauge");
        for (api, _, mean_us) in &snapshot {
            let _ = writeln!(text, "{gauge}{{api_name=\"{api}\"}} {mean_us}");
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_count_and_mean() {
        let metrics = Metrics::new(&["A", "B"]);
        metrics.record("A", Duration::from_micros(10));
        metrics.record("A", Duration::from_micros(30));
        metrics.record("Unknown", Duration::from_micros(30));
        let wire = metrics.to_wire();
        assert_eq!(wire.len(), 2, "B was never served");
        let text = metrics.to_prometheus();
        assert!(
            text.contains("service_query_counter{api_name=\"A\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("service_query_rt_us{api_name=\"A\"} 20"),
            "{text}"
        );
    }
}
