//! Per-API request metrics: `service.query_counter` (requests served) and
//! `service.query_rt_us` (mean response time in µs), tagged `api_name`; the per-instance meta
//! APIs are also counted per instance (tags `instance_group`, `instance_id`). Recording an
//! API is two relaxed atomic adds on a map fixed at start; the per-instance series add one
//! shared-lock map lookup.
//!
//! The series of an instance live as long as its registration: [`Metrics::forget_instance`]
//! (called once the manager has removed the instance) drops them, and a new series is only
//! created for an instance object that is registered at that moment (the `registered` check
//! given to [`Metrics::new`]), so a call that raced with the removal cannot bring them back.
//! That holds because the check runs and the series is inserted under the write lock, which
//! `forget_instance` takes only after the removal: either the check sees the removal, or the
//! insert comes first and is forgotten. Samples go only to the series of the very instance
//! object (same id allocation) they were served by. Lock order: metrics, then the registry
//! (the check); the registry never calls into metrics.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};
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
    /// The id allocation of the instance object these series belong to.
    owner: Weak<str>,
    group: String,
    apis: BTreeMap<&'static str, ApiStats>,
}

impl InstanceStats {
    fn belongs_to(&self, instance_id: &Arc<str>) -> bool {
        std::ptr::addr_eq(self.owner.as_ptr(), Arc::as_ptr(instance_id))
    }

    fn record(&self, api_name: &str, elapsed: Duration) {
        if let Some(stats) = self.apis.get(api_name) {
            stats.record(elapsed);
        }
    }
}

/// Whether the instance object owning this id allocation is registered now.
pub type Registered = Box<dyn Fn(&Arc<str>) -> bool + Send + Sync>;

/// One series: its tags, count and mean µs.
struct Series {
    tags: Vec<(&'static str, String)>,
    count: u64,
    mean_us: f64,
}

/// Counters of every API, by name, and of every registered instance's APIs.
pub struct Metrics {
    apis: BTreeMap<&'static str, ApiStats>,
    instance_apis: Vec<&'static str>,
    /// By instance id; the key is a copy, never the owner's allocation (which must be able
    /// to die).
    instances: RwLock<HashMap<Box<str>, InstanceStats>>,
    registered: Registered,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("apis", &self.apis)
            .field("instances", &self.instances)
            .finish_non_exhaustive()
    }
}

impl Metrics {
    /// Metrics for exactly these API names; `instance_apis` are also counted per instance,
    /// for instances that `registered` says are registered.
    pub fn new(
        api_names: &[&'static str],
        instance_apis: &[&'static str],
        registered: Registered,
    ) -> Self {
        let all_apis = api_names.iter().chain(instance_apis);
        Metrics {
            apis: all_apis.map(|&n| (n, ApiStats::default())).collect(),
            instance_apis: instance_apis.to_vec(),
            instances: RwLock::default(),
            registered,
        }
    }

    /// Records one served request (unknown names are ignored).
    pub fn record(&self, api_name: &str, elapsed: Duration) {
        if let Some(stats) = self.apis.get(api_name) {
            stats.record(elapsed);
        }
    }

    /// Records one request of an instance (counted for the API as well). The per-instance
    /// sample goes to that instance object's series; when it has none, they are created only
    /// if the object is registered now, else the sample is dropped.
    pub fn record_instance(
        &self,
        api_name: &str,
        instance_id: &Arc<str>,
        group: &str,
        elapsed: Duration,
    ) {
        self.record(api_name, elapsed);
        let id: &str = instance_id;
        let known = read_lock(&self.instances);
        if let Some(stats) = known.get(id).filter(|i| i.belongs_to(instance_id)) {
            return stats.record(api_name, elapsed);
        }
        drop(known);
        let mut instances = write_lock(&self.instances);
        if let Some(stats) = instances.get(id).filter(|i| i.belongs_to(instance_id)) {
            return stats.record(api_name, elapsed);
        }
        if (self.registered)(instance_id) {
            let stats = self.fresh_stats(instance_id, group);
            stats.record(api_name, elapsed);
            instances.insert(id.into(), stats);
        }
    }

    /// Zeroed series of an instance object.
    fn fresh_stats(&self, instance_id: &Arc<str>, group: &str) -> InstanceStats {
        InstanceStats {
            owner: Arc::downgrade(instance_id),
            group: group.to_string(),
            apis: self
                .instance_apis
                .iter()
                .map(|&n| (n, ApiStats::default()))
                .collect(),
        }
    }

    /// Drops the series of `instance_id` (call after the manager removed it), and those of
    /// instance objects that no longer exist at all (dropped without a removal, e.g. on
    /// demotion).
    pub fn forget_instance(&self, instance_id: &str) {
        let mut instances = write_lock(&self.instances);
        instances.remove(instance_id);
        instances.retain(|_, stats| stats.owner.strong_count() > 0);
    }

    /// Every series served at least once: per API, then per instance and API (of instance
    /// objects that still exist).
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
        let mut entries: Vec<_> = instances.iter().collect();
        entries.sort_by(|a, b| a.0.cmp(b.0));
        for (id, instance) in entries {
            if instance.owner.strong_count() == 0 {
                continue;
            }
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

    /// Prometheus text exposition, names as [`prometheus_name`] writes them.
    pub fn to_prometheus(&self, prefix: &str) -> String {
        let snapshot = self.snapshot();
        let mut text = String::new();
        for (name, is_counter) in [(QUERY_COUNTER, true), (QUERY_RT_US, false)] {
            let name = prometheus_name(prefix, name);
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

/// The Prometheus name of a dotted metric name (upstream trunk, wire delta §8):
/// `<prefix>_<name with dots as underscores>`, or the bare name when `prefix` is empty.
pub fn prometheus_name(prefix: &str, dotted: &str) -> String {
    let name = dotted.replace('.', "_");
    if prefix.is_empty() {
        name
    } else {
        format!("{prefix}_{name}")
    }
}

/// Escapes a Prometheus label value (backslash, quote, newline).
pub(super) fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[test]
    fn records_count_and_mean() {
        let metrics = Metrics::new(&["B"], &["A"], Box::new(|_| true));
        metrics.record("A", Duration::from_micros(10));
        let instance: Arc<str> = Arc::from("i\"1");
        metrics.record_instance("A", &instance, "g", Duration::from_micros(30));
        metrics.record("Unknown", Duration::from_micros(30));
        let wire = metrics.to_wire();
        assert_eq!(
            wire.len(),
            4,
            "A, and A of instance i\"1; B was never served"
        );
        assert_eq!(wire[2].metric_tags.len(), 3);
        let text = metrics.to_prometheus("kvcm");
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

    /// A registry of id allocations and the `registered` check over it.
    fn registry() -> (Arc<Mutex<Vec<Arc<str>>>>, Registered) {
        let live: Arc<Mutex<Vec<Arc<str>>>> = Arc::default();
        let check = live.clone();
        let registered = move |id: &Arc<str>| {
            let live = check.lock().unwrap();
            live.iter().any(|l| Arc::ptr_eq(l, id))
        };
        (live, Box::new(registered))
    }

    fn instance_ids(metrics: &Metrics) -> Vec<String> {
        let wire = metrics.to_wire();
        let tags = wire.iter().flat_map(|m| &m.metric_tags);
        let ids = tags.filter(|t| t.tag_key == "instance_id");
        ids.map(|t| t.tag_value.clone()).collect()
    }

    #[test]
    fn forgotten_instances_lose_their_series_and_late_samples_do_not_revive_them() {
        let (live, registered) = registry();
        let metrics = Metrics::new(&[], &["A"], registered);
        let old: Arc<str> = Arc::from("i");
        live.lock().unwrap().push(old.clone());
        metrics.record_instance("A", &old, "g", Duration::from_micros(5));
        assert_eq!(instance_ids(&metrics), ["i", "i"], "counter and gauge");

        live.lock().unwrap().clear();
        metrics.forget_instance("i");
        assert!(instance_ids(&metrics).is_empty());
        metrics.record_instance("A", &old, "g", Duration::from_micros(5));
        assert!(
            instance_ids(&metrics).is_empty(),
            "a late sample is dropped"
        );

        let new: Arc<str> = Arc::from("i");
        live.lock().unwrap().push(new.clone());
        metrics.record_instance("A", &new, "g", Duration::from_micros(7));
        metrics.record_instance("A", &old, "g", Duration::from_micros(5));
        let text = metrics.to_prometheus("kvcm");
        let series = r#"service_query_counter{api_name="A",instance_group="g",instance_id="i"} 1"#;
        assert!(
            text.contains(series),
            "only the new object's sample: {text}"
        );
    }

    #[test]
    fn forgetting_also_drops_series_of_instances_that_no_longer_exist() {
        let metrics = Metrics::new(&[], &["A"], Box::new(|_| true));
        let dropped: Arc<str> = Arc::from("gone");
        let kept: Arc<str> = Arc::from("kept");
        metrics.record_instance("A", &dropped, "g", Duration::from_micros(5));
        metrics.record_instance("A", &kept, "g", Duration::from_micros(5));
        drop(dropped);
        assert_eq!(instance_ids(&metrics), ["kept", "kept"], "not listed");
        metrics.forget_instance("other");
        assert_eq!(read_lock(&metrics.instances).len(), 1, "and dropped");
    }
}
