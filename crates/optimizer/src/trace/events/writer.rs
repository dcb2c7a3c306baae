//! [`EventLogWriter`]: appends events as JSON lines and rotates the file by size.
//!
//! Files in the log directory: `events.jsonl` (current), `events.1.jsonl` (previous), ...,
//! `events.<keep>.jsonl` (oldest kept). A rotation renames each file one step older and drops
//! the one that would exceed `keep`. An event line is never split across files.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use super::Event;

/// Size-rotated writer of the event log.
pub struct EventLogWriter {
    dir: PathBuf,
    max_bytes: u64,
    keep: usize,
    file: BufWriter<File>,
    written: u64,
}

impl EventLogWriter {
    /// Opens (appending to) `dir/events.jsonl`; rotates once the file would pass `max_bytes`,
    /// keeping `keep` older files.
    pub fn open(dir: &Path, max_bytes: u64, keep: usize) -> io::Result<EventLogWriter> {
        fs::create_dir_all(dir)?;
        let file = open_append(&current_path(dir))?;
        let written = file.metadata()?.len();
        Ok(EventLogWriter {
            dir: dir.to_path_buf(),
            max_bytes,
            keep,
            file: BufWriter::new(file),
            written,
        })
    }

    /// Appends one event as one line, rotating first if the line would overflow the file.
    pub fn write(&mut self, event: &Event) -> io::Result<()> {
        let mut line = serde_json::to_vec(event).map_err(io::Error::other)?;
        line.push(b'\n');
        if self.written > 0 && self.written + line.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        self.file.write_all(&line)?;
        self.written += line.len() as u64;
        Ok(())
    }

    /// Flushes buffered lines to the file.
    pub fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }

    /// The rotated files followed by the current one, oldest first: the replay order.
    pub fn files_oldest_first(dir: &Path) -> Vec<PathBuf> {
        let mut rotated: Vec<(usize, PathBuf)> = fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| rotation_index(&entry.path()).map(|i| (i, entry.path())))
            .collect();
        rotated.sort_by_key(|entry| std::cmp::Reverse(entry.0));
        rotated.into_iter().map(|(_, path)| path).collect()
    }

    fn rotate(&mut self) -> io::Result<()> {
        self.file.flush()?;
        if self.keep == 0 {
            fs::remove_file(current_path(&self.dir))?;
        } else {
            let oldest = rotated_path(&self.dir, self.keep);
            if oldest.exists() {
                fs::remove_file(oldest)?;
            }
            for index in (1..self.keep).rev() {
                let from = rotated_path(&self.dir, index);
                if from.exists() {
                    fs::rename(&from, rotated_path(&self.dir, index + 1))?;
                }
            }
            fs::rename(current_path(&self.dir), rotated_path(&self.dir, 1))?;
        }
        self.file = BufWriter::new(open_append(&current_path(&self.dir))?);
        self.written = 0;
        Ok(())
    }
}

fn open_append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

fn current_path(dir: &Path) -> PathBuf {
    dir.join("events.jsonl")
}

fn rotated_path(dir: &Path, index: usize) -> PathBuf {
    dir.join(format!("events.{index}.jsonl"))
}

/// 0 for `events.jsonl`, N for `events.N.jsonl`, `None` for other files.
fn rotation_index(path: &Path) -> Option<usize> {
    let name = path.file_name()?.to_str()?;
    if name == "events.jsonl" {
        return Some(0);
    }
    name.strip_prefix("events.")?
        .strip_suffix(".jsonl")?
        .parse()
        .ok()
}
