//! Series computed when asked (capacity, the lookup path): each a name, counter or gauge,
//! tags and an integer value, written out once for GetMetrics (counters `int_value`, gauges
//! `float_value`, fact sheet §16.4) and once for the Prometheus text of `GET /metrics`.
//!
//! Invariant: a list handed to [`to_prometheus`] holds each name's samples together (the
//! exposition writes one `# TYPE` line per run of a name).

use std::fmt::Write;

use crate::proto::admin;

use super::metrics::{escape_label, prometheus_name};

/// One value of one series.
pub struct Sample {
    /// Dotted name (`capacity.group_used_bytes`).
    pub name: &'static str,
    /// Counter (else gauge).
    pub counter: bool,
    /// Label names and values.
    pub tags: Vec<(&'static str, String)>,
    /// The value.
    pub value: i64,
}

/// A counter sample (saturating at `i64::MAX`).
pub fn counter(name: &'static str, tags: Vec<(&'static str, String)>, value: u64) -> Sample {
    let value = i64::try_from(value).unwrap_or(i64::MAX);
    Sample {
        name,
        counter: true,
        tags,
        value,
    }
}

/// A gauge sample.
pub fn gauge(name: &'static str, tags: Vec<(&'static str, String)>, value: i64) -> Sample {
    Sample {
        name,
        counter: false,
        tags,
        value,
    }
}

/// A gauge sample of a count (saturating at `i64::MAX`).
pub fn gauge_u64(name: &'static str, tags: Vec<(&'static str, String)>, value: u64) -> Sample {
    gauge(name, tags, i64::try_from(value).unwrap_or(i64::MAX))
}

/// The samples as GetMetrics series.
pub fn to_wire(samples: Vec<Sample>) -> Vec<admin::MetricsData> {
    use admin::metric_value::Value;
    samples
        .into_iter()
        .map(|s| admin::MetricsData {
            metric_name: s.name.into(),
            metric_value: Some(admin::MetricValue {
                value: Some(if s.counter {
                    Value::IntValue(s.value)
                } else {
                    Value::FloatValue(s.value as f64)
                }),
            }),
            metric_tags: s
                .tags
                .into_iter()
                .map(|(key, value)| admin::MetricsTag {
                    tag_key: key.into(),
                    tag_value: value,
                })
                .collect(),
        })
        .collect()
}

/// The samples as lines of the exposition (named with `prefix`, see [`prometheus_name`]).
pub fn to_prometheus(samples: Vec<Sample>, prefix: &str) -> String {
    let mut text = String::new();
    let mut last = "";
    for sample in samples {
        let name = prometheus_name(prefix, sample.name);
        if sample.name != last {
            let kind = if sample.counter { "counter" } else { "gauge" };
            let _ = writeln!(text, "# TYPE {name} {kind}");
            last = sample.name;
        }
        let labels: Vec<String> = sample
            .tags
            .iter()
            .map(|(key, value)| format!("{key}=\"{}\"", escape_label(value)))
            .collect();
        let labels = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{}}}", labels.join(","))
        };
        let _ = writeln!(text, "{name}{labels} {}", sample.value);
    }
    text
}
