//! Capacity metrics (docs/capacity.md) in GetMetrics and `GET /metrics`: per group its quota
//! and usage in all and per storage type (types with a quota or bytes), per instance its bytes and keys, the reclaimer's passes and evictions, and per
//! storage whether it is enabled, healthy (its latest probe passed) and so available; per
//! instance with a live capacity curve, its window's requests and the capacity (blocks) for
//! 80 / 90 / 95 % of the hit rate the window allows.
//! Counters are `int_value`, gauges `float_value` on the wire (fact sheet §16.4).

use crate::curves::{LiveCurves, FRACTIONS};
use crate::proto::admin;
use kvcm_manager::Manager;

use super::samples::{self, counter, gauge, gauge_u64, Sample};

/// Every series, grouped by name in the order below.
fn capacity_samples(manager: &Manager, curves: &LiveCurves) -> Vec<Sample> {
    let stats = manager.reclaim_stats();
    let mut out = vec![
        counter("capacity.reclaim_passes", Vec::new(), stats.passes()),
        counter(
            "capacity.reclaim_passes_held_back",
            Vec::new(),
            stats.held_back(),
        ),
        counter(
            "capacity.reclaim_evicted_blocks",
            Vec::new(),
            stats.evicted(),
        ),
        counter("capacity.reclaim_busy_us", Vec::new(), stats.busy_us()),
    ];
    let report = manager.capacity_report();
    for group in &report {
        let tags = vec![("instance_group", group.name.clone())];
        let used = group.used_bytes.unwrap_or(i64::MAX);
        out.push(gauge(
            "capacity.group_quota_bytes",
            tags.clone(),
            group.quota_bytes,
        ));
        out.push(gauge("capacity.group_used_bytes", tags, used));
        for per_type in &group.per_type {
            let tags = vec![
                ("instance_group", group.name.clone()),
                ("storage_type", type_name(per_type.storage_type)),
            ];
            let used = per_type.used_bytes.unwrap_or(i64::MAX);
            out.push(gauge("capacity.type_used_bytes", tags.clone(), used));
            if let Some(quota) = per_type.quota_bytes {
                out.push(gauge("capacity.type_quota_bytes", tags, quota));
            }
        }
    }
    for group in &report {
        for instance in &group.instances {
            let tags = vec![
                ("instance_group", group.name.clone()),
                ("instance_id", instance.instance_id.to_string()),
            ];
            out.push(gauge(
                "capacity.instance_used_bytes",
                tags.clone(),
                instance.used_bytes,
            ));
            out.push(gauge_u64("capacity.instance_keys", tags, instance.keys));
        }
    }
    for storage in manager.storage_health() {
        let tags = || vec![("storage", storage.name.clone())];
        let available = storage.enabled && storage.healthy;
        out.push(gauge("storage.enabled", tags(), i64::from(storage.enabled)));
        out.push(gauge("storage.healthy", tags(), i64::from(storage.healthy)));
        out.push(gauge("storage.available", tags(), i64::from(available)));
    }
    out.extend(curve_samples(manager, curves));
    out.sort_by_key(|s| s.name);
    out
}

/// The live-curve gauges of every registered instance with a window.
fn curve_samples(manager: &Manager, curves: &LiveCurves) -> Vec<Sample> {
    curves.retain(|id| manager.instance(id).is_some());
    let mut out = Vec::new();
    for id in curves.instances() {
        let Some(curve) = curves.curve(&id) else {
            continue;
        };
        let tags = || vec![("instance_id", id.to_string())];
        out.push(gauge_u64(
            "capacity.curve_window_requests",
            tags(),
            curve.requests as u64,
        ));
        for fraction in FRACTIONS {
            let mut tags = tags();
            tags.push(("fraction", fraction.to_string()));
            let blocks = curve.capacity_for(fraction) as u64;
            out.push(gauge_u64(
                "capacity.curve_blocks_for_hit_rate",
                tags,
                blocks,
            ));
        }
    }
    out
}

/// The wire name of a storage type (`ST_NFS`, …), as a label.
fn type_name(storage_type: kvcm_manager::StorageType) -> String {
    let number = super::wire_admin::storage_type_number(storage_type);
    admin::StorageType::try_from(number)
        .map_or_else(|_| number.to_string(), |t| t.as_str_name().to_string())
}

/// The capacity series for GetMetrics.
pub fn to_wire(manager: &Manager, curves: &LiveCurves) -> Vec<admin::MetricsData> {
    samples::to_wire(capacity_samples(manager, curves))
}

/// The capacity lines of the exposition (named with `prefix`).
pub fn to_prometheus(manager: &Manager, curves: &LiveCurves, prefix: &str) -> String {
    samples::to_prometheus(capacity_samples(manager, curves), prefix)
}
