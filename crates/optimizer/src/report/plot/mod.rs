//! Plots: a small chart model ([`Chart`]) rendered to SVG ([`svg`]) and to PNG through a
//! hand-written rasteriser ([`png`]) with a built-in bitmap font — no plotting framework.

mod canvas;
mod chart;
mod figures;
mod font;
pub(crate) mod png;
pub(crate) mod svg;

pub use chart::{Chart, Series, SeriesStyle};
pub use figures::charts;
