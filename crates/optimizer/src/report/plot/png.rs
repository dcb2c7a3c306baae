//! PNG rendering of a [`Chart`]: rasterised on a [`Canvas`], encoded with the `png` crate.

use super::canvas::{Canvas, Rgb};
use super::chart::{Chart, SeriesStyle, HEIGHT, PALETTE, WIDTH};

const BLACK: Rgb = (0, 0, 0);
const GRID: Rgb = (221, 221, 221);

/// The chart as PNG bytes.
pub fn render(chart: &Chart) -> Result<Vec<u8>, png::EncodingError> {
    let mut canvas = Canvas::new(WIDTH as usize, HEIGHT as usize);
    axes(chart, &mut canvas);
    for (index, series) in chart.series.iter().enumerate() {
        let colour = PALETTE[index % PALETTE.len()];
        draw_series(chart, &series.points, series.style, colour, &mut canvas);
        let (x, y) = chart.legend_position(index);
        canvas.fill_rect((x, y), (x + 14.0, y + 10.0), colour);
        canvas.text((x + 20.0, y + 2.0), &series.name, 1, BLACK);
    }
    encode(canvas)
}

fn encode(canvas: Canvas) -> Result<Vec<u8>, png::EncodingError> {
    let mut bytes = Vec::new();
    let mut encoder = png::Encoder::new(&mut bytes, WIDTH, HEIGHT);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header()?;
    writer.write_image_data(&canvas.into_pixels())?;
    writer.finish()?;
    Ok(bytes)
}

fn axes(chart: &Chart, canvas: &mut Canvas) {
    let (left, top, right, bottom) = chart.plot_area();
    for (value, label) in chart.y_tick_labels() {
        let (_, y) = chart.to_pixel((chart.x_range.0, value));
        canvas.line((left, y), (right, y), 1, GRID);
        let width = Canvas::text_width(&label, 1);
        canvas.text((left - 8.0 - width, y - 3.0), &label, 1, BLACK);
    }
    for (value, label) in chart.x_tick_labels() {
        let (x, _) = chart.to_pixel((value, chart.y_range.0));
        canvas.line((x, bottom), (x, bottom + 5.0), 1, BLACK);
        let width = Canvas::text_width(&label, 1);
        canvas.text((x - width / 2.0, bottom + 10.0), &label, 1, BLACK);
    }
    for (from, to) in [
        ((left, top), (right, top)),
        ((right, top), (right, bottom)),
        ((right, bottom), (left, bottom)),
        ((left, bottom), (left, top)),
    ] {
        canvas.line(from, to, 1, BLACK);
    }
    let title_width = Canvas::text_width(&chart.title, 2);
    canvas.text(
        ((left + right - title_width) / 2.0, 16.0),
        &chart.title,
        2,
        BLACK,
    );
    let label_width = Canvas::text_width(&chart.x_label, 1);
    canvas.text(
        ((left + right - label_width) / 2.0, bottom + 32.0),
        &chart.x_label,
        1,
        BLACK,
    );
    let label_height = Canvas::text_width(&chart.y_label, 1);
    canvas.text_up(
        (14.0, (top + bottom + label_height) / 2.0),
        &chart.y_label,
        1,
        BLACK,
    );
}

fn draw_series(
    chart: &Chart,
    points: &[(f64, f64)],
    style: SeriesStyle,
    colour: Rgb,
    canvas: &mut Canvas,
) {
    let pixels: Vec<(f64, f64)> = points.iter().map(|&p| chart.to_pixel(p)).collect();
    if style == SeriesStyle::Bars {
        let (_, _, _, bottom) = chart.plot_area();
        let half = chart.bar_half_width();
        for (x, y) in pixels {
            canvas.fill_rect((x - half, y), (x + half, bottom), colour);
        }
        return;
    }
    for pair in pixels.windows(2) {
        canvas.line(pair[0], pair[1], 2, colour);
    }
    if style == SeriesStyle::LineWithMarkers {
        for &point in &pixels {
            canvas.disc(point, 3.5, colour);
        }
    }
}
