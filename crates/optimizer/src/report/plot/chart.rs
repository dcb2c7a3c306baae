//! [`Chart`]: series in data coordinates, axes, ticks and the layout both renderers share.

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

    /// Half the pixel width of a bar: bars fill 80% of one x unit.
    pub fn bar_half_width(&self) -> f64 {
        0.4 * (self.to_pixel((1.0, 0.0)).0 - self.to_pixel((0.0, 0.0)).0)
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
