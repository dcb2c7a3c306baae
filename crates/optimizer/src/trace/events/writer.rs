//! [`RotatingLog`]: appends JSON lines to `<stem>.jsonl` and rotates the file by size;
//! [`EventLogWriter`] is the event log's (`events.jsonl`).
//!
//! Files in the log directory: `<stem>.jsonl` (current), `<stem>.1.jsonl` (previous), ...,
//! `<stem>.<keep>.jsonl` (oldest kept). A rotation renames each file one step older and drops
//! the one that would exceed `keep`. A line is never split across files.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use super::Event;

/// File stem of the event log.
pub const EVENTS_STEM: &str = "events";

/// Size-rotated writer of one JSON-lines log.
pub struct RotatingLog {
    dir: PathBuf,
    stem: &'static str,
    max_bytes: u64,
    keep: usize,
    file: BufWriter<File>,
    written: u64,
}

impl RotatingLog {
    /// Opens (appending to) `dir/<stem>.jsonl`; rotates once the file would pass `max_bytes`,
    /// keeping `keep` older files.
    pub fn open(
        dir: &Path,
        stem: &'static str,
        max_bytes: u64,
        keep: usize,
    ) -> io::Result<RotatingLog> {
        fs::create_dir_all(dir)?;
        let file = open_append(&current_path(dir, stem))?;
        let written = file.metadata()?.len();
        Ok(RotatingLog {
            dir: dir.to_path_buf(),
            stem,
            max_bytes,
            keep,
            file: BufWriter::new(file),
            written,
        })
    }

    /// Appends `line` (which must hold no newline) and a newline, rotating first if it would
    /// overflow the file.
    pub fn write_line(&mut self, line: &[u8]) -> io::Result<()> {
        let bytes = line.len() as u64 + 1;
        if self.written > 0 && self.written + bytes > self.max_bytes {
            self.rotate()?;
        }
        self.file.write_all(line)?;
        self.file.write_all(b"\n")?;
        self.written += bytes;
        Ok(())
    }

    /// Flushes buffered lines to the file.
    pub fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }

    /// The rotated files of `stem` followed by the current one, oldest first.
    pub fn files_oldest_first(dir: &Path, stem: &str) -> Vec<PathBuf> {
        let mut rotated: Vec<(usize, PathBuf)> = fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| rotation_index(&entry.path(), stem).map(|i| (i, entry.path())))
            .collect();
        rotated.sort_by_key(|entry| std::cmp::Reverse(entry.0));
        rotated.into_iter().map(|(_, path)| path).collect()
    }

    fn rotate(&mut self) -> io::Result<()> {
        self.file.flush()?;
        let (dir, stem) = (&self.dir, self.stem);
        if self.keep == 0 {
            fs::remove_file(current_path(dir, stem))?;
        } else {
            let oldest = rotated_path(dir, stem, self.keep);
            if oldest.exists() {
                fs::remove_file(oldest)?;
            }
            for index in (1..self.keep).rev() {
                let from = rotated_path(dir, stem, index);
                if from.exists() {
                    fs::rename(&from, rotated_path(dir, stem, index + 1))?;
                }
            }
            fs::rename(current_path(dir, stem), rotated_path(dir, stem, 1))?;
        }
        self.file = BufWriter::new(open_append(&current_path(dir, stem))?);
        self.written = 0;
        Ok(())
    }
}

/// Size-rotated writer of the event log (`events.jsonl`).
pub struct EventLogWriter(RotatingLog);

impl EventLogWriter {
    /// Opens (appending to) `dir/events.jsonl`; rotates once the file would pass `max_bytes`,
    /// keeping `keep` older files.
    pub fn open(dir: &Path, max_bytes: u64, keep: usize) -> io::Result<EventLogWriter> {
        RotatingLog::open(dir, EVENTS_STEM, max_bytes, keep).map(EventLogWriter)
    }

    /// Appends one event as one line, rotating first if the line would overflow the file.
    pub fn write(&mut self, event: &Event) -> io::Result<()> {
        let line = serde_json::to_vec(event).map_err(io::Error::other)?;
        self.0.write_line(&line)
    }

    /// Flushes buffered lines to the file.
    pub fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }

    /// The rotated files followed by the current one, oldest first: the replay order.
    pub fn files_oldest_first(dir: &Path) -> Vec<PathBuf> {
        RotatingLog::files_oldest_first(dir, EVENTS_STEM)
    }
}

fn open_append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

fn current_path(dir: &Path, stem: &str) -> PathBuf {
    dir.join(format!("{stem}.jsonl"))
}

fn rotated_path(dir: &Path, stem: &str, index: usize) -> PathBuf {
    dir.join(format!("{stem}.{index}.jsonl"))
}

/// 0 for `<stem>.jsonl`, N for `<stem>.N.jsonl`, `None` for other files.
fn rotation_index(path: &Path, stem: &str) -> Option<usize> {
    let name = path.file_name()?.to_str()?;
    let rest = name.strip_prefix(stem)?.strip_prefix('.')?;
    if rest == "jsonl" {
        return Some(0);
    }
    rest.strip_suffix(".jsonl")?.parse().ok()
}
