//! [`TraceReader`]: a streaming iterator of requests over one trace file.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use super::line::{LineParser, Parsed};
use super::{Request, TraceError, TraceFormat};

/// Streams the requests of one trace file, one line in memory at a time.
///
/// Yields `Err` at most once, then stops. A file without any request yields
/// [`TraceError::Empty`].
pub struct TraceReader {
    path: PathBuf,
    input: BufReader<File>,
    format: TraceFormat,
    parser: LineParser,
    /// The first non-blank line, read for format detection and not parsed yet.
    pending: Option<String>,
    line_no: usize,
    requests: u64,
    done: bool,
}

impl TraceReader {
    /// Opens `path`; detects its format from the first line unless `format` is given.
    pub fn open(path: &Path, format: Option<TraceFormat>) -> Result<TraceReader, TraceError> {
        let file = File::open(path).map_err(|source| TraceError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut reader = TraceReader {
            path: path.to_path_buf(),
            input: BufReader::with_capacity(1 << 16, file),
            format: format.unwrap_or(TraceFormat::Mooncake),
            parser: LineParser::new(format.unwrap_or(TraceFormat::Mooncake)),
            pending: None,
            line_no: 0,
            requests: 0,
            done: false,
        };
        let first = reader.next_text_line()?.ok_or_else(|| TraceError::Empty {
            path: path.to_path_buf(),
        })?;
        if format.is_none() {
            reader.format = TraceFormat::detect(&first).ok_or(TraceError::UnknownFormat {
                path: path.to_path_buf(),
                line: reader.line_no,
            })?;
            reader.parser = LineParser::new(reader.format);
        }
        reader.pending = Some(first);
        Ok(reader)
    }

    /// The format being read.
    pub fn format(&self) -> TraceFormat {
        self.format
    }

    /// Tokens per block as declared by the file (native header, event log), if seen yet.
    pub fn declared_block_tokens(&self) -> Option<u32> {
        self.parser.block_tokens()
    }

    /// Reads the next non-blank line, trimmed; `None` at end of file.
    fn next_text_line(&mut self) -> Result<Option<String>, TraceError> {
        let mut text = String::new();
        loop {
            text.clear();
            self.line_no += 1;
            let read = self
                .input
                .read_line(&mut text)
                .map_err(|e| self.read_error(e))?;
            if read == 0 {
                return Ok(None);
            }
            if !text.trim().is_empty() {
                return Ok(Some(text.trim().to_string()));
            }
        }
    }

    fn read_error(&self, source: std::io::Error) -> TraceError {
        if source.kind() == std::io::ErrorKind::InvalidData {
            self.line_error("line is not valid UTF-8".to_string())
        } else {
            TraceError::Io {
                path: self.path.clone(),
                source,
            }
        }
    }

    fn line_error(&self, message: String) -> TraceError {
        TraceError::Line {
            path: self.path.clone(),
            line: self.line_no,
            message,
        }
    }

    fn next_request(&mut self) -> Result<Option<Request>, TraceError> {
        loop {
            let text = match self.pending.take() {
                Some(text) => text,
                None => match self.next_text_line()? {
                    Some(text) => text,
                    None if self.requests == 0 => {
                        return Err(TraceError::Empty {
                            path: self.path.clone(),
                        })
                    }
                    None => return Ok(None),
                },
            };
            match self.parser.parse(&text).map_err(|m| self.line_error(m))? {
                Parsed::Request(request) => {
                    self.requests += 1;
                    return Ok(Some(request));
                }
                Parsed::Skip => continue,
            }
        }
    }
}

impl Iterator for TraceReader {
    type Item = Result<Request, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let next = self.next_request();
        if !matches!(next, Ok(Some(_))) {
            self.done = true;
        }
        next.transpose()
    }
}
