//! [`Chart`]: series in data coordinates, axes, ticks and the layout both renderers share.

use crate::sim::Log2Histogram;

use super::super::Report;

/// Image width in pixels.
pub const WIDTH: u32 = 880;
/// Image height in pixels.
pub const HEIGHT: u32 = 520;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 190.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;

/// Series colours (RGB), used in order.
pub const PALETTE: [(u8, u8, u8); 10] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
];

/// How a series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeriesStyle {
    /// A polyline.
    Line,
    /// A polyline with a marker at every point.
    LineWithMarkers,
    /// Vertical bars from y = 0.
    Bars,
}

/// One named series.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Points in data coordinates.
    pub points: Vec<(f64, f64)>,
    /// Drawing style.
    pub style: SeriesStyle,
}

/// A 2-D chart.
#[derive(Debug, Clone)]
pub struct Chart {
    /// Title above the plot.
    pub title: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// X data range shown.
    pub x_range: (f64, f64),
    /// Y data range shown.
    pub y_range: (f64, f64),
    /// Custom x tick labels at data positions; automatic ticks when empty.
    pub x_ticks: Vec<(f64, String)>,
    /// The series, drawn in order.
    pub series: Vec<Series>,
}

impl Chart {
    /// The plot area: (left, top, right, bottom) in pixels.
    pub fn plot_area(&self) -> (f64, f64, f64, f64) {
        (
            LEFT,
            TOP,
            f64::from(WIDTH) - RIGHT,
            f64::from(HEIGHT) - BOTTOM,
        )
    }

    /// Pixel position of a data point.
    pub fn to_pixel(&self, (x, y): (f64, f64)) -> (f64, f64) {
        let (left, top, right, bottom) = self.plot_area();
        let fx = (x - self.x_range.0) / span(self.x_range);
        let fy = (y - self.y_range.0) / span(self.y_range);
        (left + fx * (right - left), bottom - fy * (bottom - top))
    }

    /// X ticks: the custom ones, or about five round numbers.
    pub fn x_tick_labels(&self) -> Vec<(f64, String)> {
        if self.x_ticks.is_empty() {
            nice_ticks(self.x_range)
        } else {
            self.x_ticks.clone()
        }
    }

    /// Y ticks: about five round numbers.
    pub fn y_tick_labels(&self) -> Vec<(f64, String)> {
        nice_ticks(self.y_range)
    }

    /// Pixel position of legend entry `index` (top-left of its colour swatch).
    pub fn legend_position(&self, index: usize) -> (f64, f64) {
        let (_, top, right, _) = self.plot_area();
        (right + 16.0, top + 8.0 + 22.0 * index as f64)
    }
}

fn span((low, high): (f64, f64)) -> f64 {
    if high > low {
        high - low
    } else {
        1.0
    }
}

/// About five ticks at round values (1, 2 or 5 times a power of ten) inside `range`.
fn nice_ticks(range: (f64, f64)) -> Vec<(f64, String)> {
    let raw_step = span(range) / 5.0;
    let magnitude = 10f64.powf(raw_step.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|&s| s >= raw_step)
        .unwrap_or(magnitude * 10.0);
    let decimals = if step >= 1.0 {
        0
    } else {
        (-step.log10().floor()) as usize
    };
    let first = (range.0 / step).ceil() as i64;
    let last = (range.1 / step).floor() as i64;
    (first..=last)
        .map(|i| {
            let value = i as f64 * step;
            (value, format!("{value:.decimals$}"))
        })
        .collect()
}

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
fn by_policy(report: &Report) -> Vec<(String, Vec<&super::super::ResultRow>)> {
    let mut groups: Vec<(String, Vec<&super::super::ResultRow>)> = Vec::new();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_inside_the_range() {
        let ticks: Vec<String> = nice_ticks((0.0, 43_924.0))
            .into_iter()
            .map(|t| t.1)
            .collect();
        assert_eq!(ticks, ["0", "10000", "20000", "30000", "40000"]);
        let ticks: Vec<String> = nice_ticks((0.0, 1.0)).into_iter().map(|t| t.1).collect();
        assert_eq!(ticks, ["0.0", "0.2", "0.4", "0.6", "0.8", "1.0"]);
    }
}
