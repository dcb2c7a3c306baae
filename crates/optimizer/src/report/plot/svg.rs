//! SVG rendering of a [`Chart`].

use std::fmt::Write;

use super::chart::{Chart, SeriesStyle, HEIGHT, PALETTE, WIDTH};

/// The chart as a standalone SVG document.
pub fn render(chart: &Chart) -> String {
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    axes(chart, &mut svg);
    for (index, series) in chart.series.iter().enumerate() {
        let (r, g, b) = PALETTE[index % PALETTE.len()];
        let colour = format!("rgb({r},{g},{b})");
        draw_series(chart, &series.points, series.style, &colour, &mut svg);
        let (x, y) = chart.legend_position(index);
        let _ = writeln!(
            svg,
            "<rect x=\"{x}\" y=\"{y}\" width=\"14\" height=\"10\" fill=\"{colour}\"/>\
             <text x=\"{}\" y=\"{}\">{}</text>",
            x + 20.0,
            y + 10.0,
            escape(&series.name)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn axes(chart: &Chart, svg: &mut String) {
    let (left, top, right, bottom) = chart.plot_area();
    // Writing to a String cannot fail.
    let _ = writeln!(
        svg,
        "<rect x=\"{left}\" y=\"{top}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"black\"/>",
        right - left,
        bottom - top
    );
    for (value, label) in chart.x_tick_labels() {
        let (x, _) = chart.to_pixel((value, chart.y_range.0));
        let _ = writeln!(
            svg,
            "<line x1=\"{x:.1}\" y1=\"{bottom}\" x2=\"{x:.1}\" y2=\"{}\" stroke=\"black\"/>\
             <text x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">{label}</text>",
            bottom + 5.0,
            bottom + 20.0
        );
    }
    for (value, label) in chart.y_tick_labels() {
        let (_, y) = chart.to_pixel((chart.x_range.0, value));
        let _ = writeln!(
            svg,
            "<line x1=\"{left}\" y1=\"{y:.1}\" x2=\"{right}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{label}</text>",
            left - 6.0,
            y + 4.0
        );
    }
    let _ = writeln!(
        svg,
        "<text x=\"{}\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">{}</text>\n\
         <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n\
         <text transform=\"translate(20,{}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
        (left + right) / 2.0,
        escape(&chart.title),
        (left + right) / 2.0,
        bottom + 45.0,
        escape(&chart.x_label),
        (top + bottom) / 2.0,
        escape(&chart.y_label)
    );
}

fn draw_series(
    chart: &Chart,
    points: &[(f64, f64)],
    style: SeriesStyle,
    colour: &str,
    svg: &mut String,
) {
    let pixels: Vec<(f64, f64)> = points.iter().map(|&p| chart.to_pixel(p)).collect();
    if style == SeriesStyle::Bars {
        let (_, _, _, bottom) = chart.plot_area();
        let half = chart.bar_half_width();
        for (x, y) in pixels {
            let _ = writeln!(
                svg,
                "<rect x=\"{:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{colour}\"/>",
                x - half,
                2.0 * half,
                bottom - y
            );
        }
        return;
    }
    let path: Vec<String> = pixels
        .iter()
        .map(|(x, y)| format!("{x:.1},{y:.1}"))
        .collect();
    let _ = writeln!(
        svg,
        "<polyline points=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\"/>",
        path.join(" ")
    );
    if style == SeriesStyle::LineWithMarkers {
        for (x, y) in pixels {
            let _ = writeln!(
                svg,
                "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"3.5\" fill=\"{colour}\"/>"
            );
        }
    }
}

/// Escapes text for SVG content.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
