//! [`write_report`]: writes every output file of a run into a directory.

use std::fs;
use std::path::{Path, PathBuf};

use super::plot::{png, svg};
use super::{charts, curve_csv, results_csv, Report};

/// Why the report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A file or the directory could not be written.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A PNG could not be encoded.
    #[error("cannot encode {path}: {source}")]
    Png {
        /// The PNG file.
        path: PathBuf,
        /// The encoder's error.
        source: ::png::EncodingError,
    },
}

/// Writes `results.csv`, `lru_curve.csv`, `results.json` and every chart as SVG and PNG into
/// `dir` (created if missing). Returns the paths written.
pub fn write_report(report: &Report, dir: &Path) -> Result<Vec<PathBuf>, ReportError> {
    fs::create_dir_all(dir).map_err(|source| ReportError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let json = serde_json::to_string_pretty(report).map_err(|e| ReportError::Io {
        path: dir.join("results.json"),
        source: e.into(),
    })?;
    let mut files = vec![
        ("results.csv".to_string(), results_csv(report).into_bytes()),
        ("lru_curve.csv".to_string(), curve_csv(report).into_bytes()),
        ("results.json".to_string(), json.into_bytes()),
    ];
    for (stem, chart) in charts(report) {
        files.push((format!("{stem}.svg"), svg::render(&chart).into_bytes()));
        let png_bytes = png::render(&chart).map_err(|source| ReportError::Png {
            path: dir.join(format!("{stem}.png")),
            source,
        })?;
        files.push((format!("{stem}.png"), png_bytes));
    }
    files
        .into_iter()
        .map(|(name, bytes)| {
            let path = dir.join(name);
            fs::write(&path, bytes).map_err(|source| ReportError::Io {
                path: path.clone(),
                source,
            })?;
            Ok(path)
        })
        .collect()
}
