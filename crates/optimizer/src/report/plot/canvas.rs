//! [`Canvas`]: an RGB pixel buffer with the few primitives the charts need.

use super::font::{glyph, GLYPH_HEIGHT, GLYPH_WIDTH};

/// An RGB colour.
pub type Rgb = (u8, u8, u8);

/// A white RGB image; drawing outside it is clipped.
pub struct Canvas {
    width: usize,
    height: usize,
    pixels: Vec<u8>,
}

impl Canvas {
    /// A white canvas.
    pub fn new(width: usize, height: usize) -> Canvas {
        Canvas {
            width,
            height,
            pixels: vec![255; width * height * 3],
        }
    }

    /// The pixels, row by row, three bytes each.
    pub fn into_pixels(self) -> Vec<u8> {
        self.pixels
    }

    /// Sets one pixel (clipped).
    pub fn set(&mut self, x: i64, y: i64, (r, g, b): Rgb) {
        if x < 0 || y < 0 || x as usize >= self.width || y as usize >= self.height {
            return;
        }
        let offset = (y as usize * self.width + x as usize) * 3;
        self.pixels[offset..offset + 3].copy_from_slice(&[r, g, b]);
    }

    /// Fills the rectangle with corners (x0, y0) and (x1, y1), inclusive.
    pub fn fill_rect(&mut self, (x0, y0): (f64, f64), (x1, y1): (f64, f64), colour: Rgb) {
        let (left, right) = (x0.min(x1).round() as i64, x0.max(x1).round() as i64);
        let (top, bottom) = (y0.min(y1).round() as i64, y0.max(y1).round() as i64);
        for y in top..=bottom {
            for x in left..=right {
                self.set(x, y, colour);
            }
        }
    }

    /// A line `thickness` pixels wide (1 or more), by stepping along its longer axis.
    pub fn line(&mut self, from: (f64, f64), to: (f64, f64), thickness: i64, colour: Rgb) {
        let steps = (to.0 - from.0)
            .abs()
            .max((to.1 - from.1).abs())
            .ceil()
            .max(1.0);
        let low = -(thickness - 1) / 2;
        let high = thickness / 2;
        for step in 0..=steps as i64 {
            let t = step as f64 / steps;
            let x = (from.0 + (to.0 - from.0) * t).round() as i64;
            let y = (from.1 + (to.1 - from.1) * t).round() as i64;
            for dy in low..=high {
                for dx in low..=high {
                    self.set(x + dx, y + dy, colour);
                }
            }
        }
    }

    /// A filled disc.
    pub fn disc(&mut self, (cx, cy): (f64, f64), radius: f64, colour: Rgb) {
        let r = radius.ceil() as i64;
        let (cx_i, cy_i) = (cx.round() as i64, cy.round() as i64);
        for dy in -r..=r {
            for dx in -r..=r {
                if ((dx * dx + dy * dy) as f64) <= radius * radius {
                    self.set(cx_i + dx, cy_i + dy, colour);
                }
            }
        }
    }

    /// Text with its top-left corner at (x, y), each font pixel `scale` pixels wide.
    pub fn text(&mut self, (x, y): (f64, f64), text: &str, scale: i64, colour: Rgb) {
        let (x, y) = (x.round() as i64, y.round() as i64);
        for (index, c) in text.chars().enumerate() {
            let left = x + index as i64 * (GLYPH_WIDTH as i64 + 1) * scale;
            self.glyph(c, scale, colour, |col, row| (left + col, y + row));
        }
    }

    /// Text rotated 90° counter-clockwise, read bottom to top, starting at (x, y).
    pub fn text_up(&mut self, (x, y): (f64, f64), text: &str, scale: i64, colour: Rgb) {
        let (x, y) = (x.round() as i64, y.round() as i64);
        for (index, c) in text.chars().enumerate() {
            let base = y - index as i64 * (GLYPH_WIDTH as i64 + 1) * scale;
            self.glyph(c, scale, colour, |col, row| (x + row, base - col));
        }
    }

    /// Pixel width of `text` at `scale`.
    pub fn text_width(text: &str, scale: i64) -> f64 {
        (text.chars().count() as i64 * (GLYPH_WIDTH as i64 + 1) * scale) as f64
    }

    /// Draws one glyph; `place(col, row)` maps scaled font pixels to the canvas.
    fn glyph(&mut self, c: char, scale: i64, colour: Rgb, place: impl Fn(i64, i64) -> (i64, i64)) {
        for (row, bits) in glyph(c).iter().enumerate().take(GLYPH_HEIGHT) {
            for col in 0..GLYPH_WIDTH {
                if bits & (0x10 >> col) == 0 {
                    continue;
                }
                for sy in 0..scale {
                    for sx in 0..scale {
                        let (px, py) = place(col as i64 * scale + sx, row as i64 * scale + sy);
                        self.set(px, py, colour);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pixel(canvas: &Canvas, x: usize, y: usize) -> Rgb {
        let offset = (y * canvas.width + x) * 3;
        let p = &canvas.pixels[offset..offset + 3];
        (p[0], p[1], p[2])
    }

    #[test]
    fn primitives_colour_the_expected_pixels_and_clip() {
        let mut canvas = Canvas::new(20, 10);
        let red = (255, 0, 0);
        canvas.line((0.0, 0.0), (19.0, 9.0), 1, red);
        canvas.fill_rect((-5.0, 8.0), (2.0, 20.0), (0, 0, 255));
        canvas.text((10.0, 0.0), "1", 1, (0, 0, 0));
        assert_eq!(pixel(&canvas, 0, 0), red);
        assert_eq!(pixel(&canvas, 19, 9), red);
        assert_eq!(pixel(&canvas, 1, 9), (0, 0, 255));
        assert_eq!(pixel(&canvas, 19, 0), (255, 255, 255));
        // '1' has its top pixel at column 2 of the glyph.
        assert_eq!(pixel(&canvas, 12, 0), (0, 0, 0));
        assert_eq!(pixel(&canvas, 10, 0), (255, 255, 255));
    }
}
