//! The report's figures: hit rate vs capacity, hit rate over time, reuse distances.

use crate::report::{Report, ResultRow};
use crate::sim::Log2Histogram;

use super::chart::{Chart, Series, SeriesStyle};

/// The charts of a report, with their file stems.
pub fn charts(report: &Report) -> Vec<(&'static str, Chart)> {
    vec![
        ("hit_rate_vs_capacity", capacity_chart(report)),
        ("hit_rate_over_time", time_chart(report)),
        ("reuse_distance", reuse_chart(&report.reuse_distances)),
    ]
}

fn capacity_chart(report: &Report) -> Chart {
    let mut series = vec![Series {
        name: "lru (one pass)".to_string(),
        points: report
            .lru_curve
            .iter()
            .map(|p| (p.capacity_blocks as f64, p.block_hit_rate))
            .collect(),
        style: SeriesStyle::Line,
    }];
    for (name, rows) in by_policy(report) {
        let points = rows
            .iter()
            .map(|r| (r.capacity_blocks as f64, r.block_hit_rate))
            .collect();
        series.push(Series {
            name,
            points,
            style: SeriesStyle::LineWithMarkers,
        });
    }
    let max_x = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .fold(1.0, f64::max);
    Chart {
        title: "Block hit rate vs capacity".to_string(),
        x_label: "capacity (blocks)".to_string(),
        y_label: "block hit rate".to_string(),
        x_range: (0.0, max_x),
        y_range: (0.0, 1.0),
        x_ticks: Vec::new(),
        series,
    }
}

/// Results grouped by policy (and memory tier), in report order.
fn by_policy(report: &Report) -> Vec<(String, Vec<&ResultRow>)> {
    let mut groups: Vec<(String, Vec<&ResultRow>)> = Vec::new();
    for row in &report.results {
        let name = match row.memory_tier_blocks {
            Some(memory) => format!("{} +mem {memory}", row.policy),
            None => row.policy.to_string(),
        };
        match groups.iter_mut().find(|(n, _)| *n == name) {
            Some((_, rows)) => rows.push(row),
            None => groups.push((name, vec![row])),
        }
    }
    groups
}

fn time_chart(report: &Report) -> Chart {
    let series: Vec<Series> = by_policy(report)
        .into_iter()
        .filter_map(|(name, rows)| {
            let mut by_capacity = rows.clone();
            by_capacity.sort_by_key(|r| r.capacity_blocks);
            let middle = by_capacity.get(by_capacity.len() / 2)?;
            let points = middle
                .stats
                .windows
                .iter()
                .enumerate()
                .filter(|(_, w)| w.requested_blocks > 0)
                .map(|(i, w)| (i as f64, w.hit_blocks as f64 / w.requested_blocks as f64))
                .collect();
            Some(Series {
                name: format!("{name} @{}", middle.capacity_blocks),
                points,
                style: SeriesStyle::Line,
            })
        })
        .collect();
    let windows = report.results.first().map_or(1, |r| r.stats.windows.len());
    Chart {
        title: "Block hit rate over time (middle capacity)".to_string(),
        x_label: "time window".to_string(),
        y_label: "block hit rate".to_string(),
        x_range: (0.0, windows.saturating_sub(1).max(1) as f64),
        y_range: (0.0, 1.0),
        x_ticks: Vec::new(),
        series,
    }
}

fn reuse_chart(histogram: &Log2Histogram) -> Chart {
    let counts = histogram.counts();
    let total: u64 = counts.iter().sum::<u64>().max(1);
    let points: Vec<(f64, f64)> = counts
        .iter()
        .enumerate()
        .map(|(bucket, &count)| (bucket as f64, count as f64 / total as f64))
        .collect();
    let max_y = points.iter().map(|p| p.1).fold(0.05, f64::max);
    let x_ticks = (0..counts.len())
        .step_by(counts.len().div_ceil(10).max(1))
        .map(|bucket| {
            let (low, _) = Log2Histogram::bucket_range(bucket);
            (bucket as f64, low.to_string())
        })
        .collect();
    Chart {
        title: "Reuse distance (LRU stack depth)".to_string(),
        x_label: "distance >= (blocks, log2 buckets)".to_string(),
        y_label: "share of reuses".to_string(),
        x_range: (-0.5, counts.len().max(1) as f64 - 0.5),
        y_range: (0.0, max_y * 1.1),
        x_ticks,
        series: vec![Series {
            name: "reuses".to_string(),
            points,
            style: SeriesStyle::Bars,
        }],
    }
}
