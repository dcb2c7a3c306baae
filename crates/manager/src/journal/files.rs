//! The on-disk form of the journal: log segments and snapshots, both a header followed by
//! framed records, and the names of the files in the journal directory.
//!
//! Header (20 bytes): an 8-byte magic (`KVCMWAL\0` for a log segment, `KVCMSNP\0` for a
//! snapshot), the format version (`u32` LE) and the file's sequence number (`u64` LE).
//! Record frame: payload length (`u32` LE), CRC-32 (IEEE) of the payload (`u32` LE), payload.
//! A frame header of eight zero bytes ends the records like the end of the file: from
//! version 2 on a log segment is written ahead with zeros (see [`super::segment`]), and no
//! record is empty (each starts with its tag byte).
//!
//! Invariants: [`FORMAT_VERSION`] is the only version written; a file of a newer version is
//! refused (a downgrade is refused, never misread: a version-1 reader would take the zeros
//! for records), older versions are read. Reading stops at the first frame that is
//! incomplete or fails its checksum and reports where the valid prefix ends, so a torn tail
//! is cut there and nothing after it is trusted.

use std::fs::File;
use std::io::{BufReader, ErrorKind, Read, Write};
use std::path::{Path, PathBuf};

use super::JournalError;

/// The format version this build writes (and the newest it reads).
pub(crate) const FORMAT_VERSION: u32 = 2;
/// Magic of a log segment.
pub(crate) const LOG_MAGIC: [u8; 8] = *b"KVCMWAL\0";
/// Magic of a snapshot.
pub(crate) const SNAPSHOT_MAGIC: [u8; 8] = *b"KVCMSNP\0";
/// Bytes of a file header.
pub(crate) const HEADER_BYTES: u64 = 20;
/// Bytes of a frame header.
pub(crate) const FRAME_BYTES: usize = 8;
/// The frame header that ends a file's records (zeros written ahead of them).
const END_OF_RECORDS: [u8; FRAME_BYTES] = [0; FRAME_BYTES];
/// The largest record accepted when reading (a batch of ~100k entries), and so when writing.
pub(crate) const MAX_RECORD_BYTES: usize = 256 << 20;

/// The header of a new file.
pub(crate) fn header(magic: [u8; 8], sequence: u64) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(HEADER_BYTES as usize);
    bytes.extend_from_slice(&magic);
    bytes.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    bytes.extend_from_slice(&sequence.to_le_bytes());
    bytes
}

/// Appends one framed record to `out`; refuses (appending nothing) a record larger than
/// recovery reads, and an empty one (its frame would read as the end of the records).
pub(crate) fn frame(payload: &[u8], out: &mut Vec<u8>) -> Result<(), JournalError> {
    if payload.is_empty() {
        return Err(JournalError::EmptyRecord);
    }
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|&len| len as usize <= MAX_RECORD_BYTES)
        .ok_or(JournalError::RecordTooLarge {
            bytes: payload.len(),
            max: MAX_RECORD_BYTES,
        })?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
    Ok(())
}

/// How reading a file ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReadEnd {
    /// The sequence number in the header.
    pub sequence: u64,
    /// Bytes of the valid prefix (header and whole, intact records).
    pub valid_bytes: u64,
    /// Why reading stopped before the end of the file, if it did.
    pub damage: Option<String>,
    /// The records ended at zeros written ahead of them (only zeros follow to the end of
    /// the file), not at the end of the file.
    pub zeros_after: bool,
}

/// Reads the records of `path` (a file with `magic`), calling `record` on each payload in
/// order, up to the end of the file or, from version 2 on, a zero frame header followed by
/// nothing but zeros ([`ReadEnd::zeros_after`]). A damaged header is an error; a damaged or
/// torn record, or data after such zeros, ends the read (reported in [`ReadEnd::damage`]).
pub(crate) fn read_records(
    path: &Path,
    magic: [u8; 8],
    mut record: impl FnMut(&[u8]),
) -> Result<ReadEnd, JournalError> {
    let file = File::open(path).map_err(|e| JournalError::io(path, e))?;
    let mut input = BufReader::with_capacity(1 << 20, file);
    let (sequence, version) = read_header(&mut input, path, magic)?;
    let mut end = ReadEnd {
        sequence,
        valid_bytes: HEADER_BYTES,
        damage: None,
        zeros_after: false,
    };
    let mut payload = Vec::new();
    loop {
        let mut frame_header = [0u8; FRAME_BYTES];
        match read_full(&mut input, &mut frame_header).map_err(|e| JournalError::io(path, e))? {
            0 => return Ok(end),
            FRAME_BYTES if version >= 2 && frame_header == END_OF_RECORDS => {
                if only_zeros_left(&mut input).map_err(|e| JournalError::io(path, e))? {
                    end.zeros_after = true;
                } else {
                    end.damage = Some("data after zeros that end the records".to_string());
                }
                return Ok(end);
            }
            FRAME_BYTES => {}
            partial => {
                end.damage = Some(format!("a torn frame header ({partial} bytes)"));
                return Ok(end);
            }
        }
        let len = u32::from_le_bytes(frame_header[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(frame_header[4..].try_into().expect("4 bytes"));
        if len > MAX_RECORD_BYTES {
            end.damage = Some(format!("a record length of {len} bytes"));
            return Ok(end);
        }
        payload.resize(len, 0);
        let read = read_full(&mut input, &mut payload).map_err(|e| JournalError::io(path, e))?;
        if read < len {
            end.damage = Some(format!("a torn record ({read} of {len} bytes)"));
            return Ok(end);
        }
        if crc32fast::hash(&payload) != crc {
            end.damage = Some("a record that fails its checksum".to_string());
            return Ok(end);
        }
        record(&payload);
        end.valid_bytes += (FRAME_BYTES + len) as u64;
    }
}

/// Whether everything left in `input` is zero bytes.
fn only_zeros_left(input: &mut impl Read) -> std::io::Result<bool> {
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        let read = read_full(input, &mut chunk)?;
        if chunk[..read].iter().any(|&b| b != 0) {
            return Ok(false);
        }
        if read < chunk.len() {
            return Ok(true);
        }
    }
}

/// The header's sequence number and format version.
fn read_header(
    input: &mut impl Read,
    path: &Path,
    magic: [u8; 8],
) -> Result<(u64, u32), JournalError> {
    let mut bytes = [0u8; HEADER_BYTES as usize];
    let read = read_full(input, &mut bytes).map_err(|e| JournalError::io(path, e))?;
    let damaged = |why: &str| JournalError::Damaged {
        path: path.to_path_buf(),
        reason: why.to_string(),
    };
    if read < bytes.len() {
        return Err(damaged("the header is truncated"));
    }
    if bytes[..8] != magic {
        return Err(damaged("the magic is not a kvcm journal file's"));
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if version == 0 || version > FORMAT_VERSION {
        return Err(JournalError::NewerFormat {
            path: path.to_path_buf(),
            found: version,
            newest: FORMAT_VERSION,
        });
    }
    Ok((
        u64::from_le_bytes(bytes[12..].try_into().expect("8 bytes")),
        version,
    ))
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn read_full(input: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// The files of a journal directory.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Listing {
    /// Log segments by sequence, ascending.
    pub segments: Vec<(u64, PathBuf)>,
    /// Complete snapshots by sequence, ascending.
    pub snapshots: Vec<(u64, PathBuf)>,
    /// Snapshots a crash interrupted (`.snap.tmp`), by sequence.
    pub unfinished: Vec<(u64, PathBuf)>,
}

/// `wal-<sequence as 16 hex digits>.log`.
pub(crate) fn segment_path(dir: &Path, sequence: u64) -> PathBuf {
    dir.join(format!("wal-{sequence:016x}.log"))
}

/// `snapshot-<sequence as 16 hex digits>.snap`.
pub(crate) fn snapshot_path(dir: &Path, sequence: u64) -> PathBuf {
    dir.join(format!("snapshot-{sequence:016x}.snap"))
}

/// Lists the segments and snapshots of `dir` (other files are left alone).
pub(crate) fn list(dir: &Path) -> Result<Listing, JournalError> {
    let mut listing = Listing::default();
    let entries = std::fs::read_dir(dir).map_err(|e| JournalError::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| JournalError::io(dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let sequence = |prefix: &str, suffix: &str| {
            let hex = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
            (hex.len() == 16).then(|| u64::from_str_radix(hex, 16).ok())?
        };
        if let Some(sequence) = sequence("wal-", ".log") {
            listing.segments.push((sequence, entry.path()));
        } else if let Some(sequence) = sequence("snapshot-", ".snap") {
            listing.snapshots.push((sequence, entry.path()));
        } else if let Some(sequence) = sequence("snapshot-", ".snap.tmp") {
            listing.unfinished.push((sequence, entry.path()));
        }
    }
    listing.segments.sort();
    listing.snapshots.sort();
    Ok(listing)
}

/// Creates `path` with `bytes`, durable (file and directory synced) before it returns.
pub(crate) fn create_durable(path: &Path, bytes: &[u8]) -> Result<File, JournalError> {
    let mut file = File::options()
        .create_new(true)
        .write(true)
        .open(path)
        .map_err(|e| JournalError::io(path, e))?;
    file.write_all(bytes)
        .map_err(|e| JournalError::io(path, e))?;
    file.sync_data().map_err(|e| JournalError::io(path, e))?;
    sync_dir(path)?;
    Ok(file)
}

/// Syncs the directory holding `path` (so a created, renamed or removed name is durable).
pub(crate) fn sync_dir(path: &Path) -> Result<(), JournalError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| JournalError::io(dir, e))
}
