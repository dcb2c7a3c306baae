//! Parsing of file-tier location URIs (wire fact sheet §14).
//!
//! Form: `<scheme>://<storage name><absolute path>?<params>` with scheme `file` (NFS: path =
//! root_path + object name) or `hf3fs` (3FS: path = mountpoint/root_dir/name). Params are
//! `k=v` joined by `&`, never percent-encoded. `size` (bytes per block) is required and
//! non-zero; `blkid` (block index in the file) is optional and defaults to 0. Other keys are
//! ignored; a key given twice is refused.
//!
//! Invariants of a parsed [`FileBlockLocation`]:
//! * `path` is absolute, has no `..` component, no NUL byte and names a file (no trailing `/`);
//! * `offset = block_index × size` and `offset + size` fit in `i64` (the kernel's `off_t`),
//!   computed with checked arithmetic.

use std::path::{Component, Path, PathBuf};

use crate::DataError;

/// The file-tier URI schemes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileScheme {
    /// `file://`: an NFS directory (or any local directory).
    File,
    /// `hf3fs://`: a 3FS mount.
    Hf3fs,
}

/// Where one block lives in the file tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileBlockLocation {
    /// The URI's scheme.
    pub scheme: FileScheme,
    /// The storage's `global_unique_name` (the URI's host); routes to a storage config.
    pub storage_name: String,
    /// The block file's absolute path.
    pub path: PathBuf,
    /// The block's index in the file (`blkid`, 0 when absent).
    pub block_index: u64,
    /// The block's byte offset in the file: `block_index × size`.
    pub offset: u64,
    /// The block's length in bytes (`size`).
    pub size: u64,
}

/// Parses a `file://` or `hf3fs://` block URI. Any other scheme is
/// [`DataError::UnsupportedScheme`]; a malformed or unsafe URI is [`DataError::InvalidUri`].
pub fn parse_block_uri(uri: &str) -> Result<FileBlockLocation, DataError> {
    let invalid = |reason| DataError::InvalidUri {
        uri: uri.to_owned(),
        reason,
    };
    if uri.contains('\0') {
        return Err(invalid("contains a NUL byte"));
    }
    let (scheme_text, rest) = uri.split_once("://").ok_or_else(|| invalid("no `://`"))?;
    let scheme = match scheme_text {
        "file" => FileScheme::File,
        "hf3fs" => FileScheme::Hf3fs,
        _ => {
            return Err(DataError::UnsupportedScheme {
                uri: uri.to_owned(),
                scheme: scheme_text.to_owned(),
            })
        }
    };
    let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
    let slash = location
        .find('/')
        .ok_or_else(|| invalid("no absolute path after the storage name"))?;
    let (storage_name, path_text) = location.split_at(slash);
    if storage_name.is_empty() {
        return Err(invalid("empty storage name"));
    }
    let path = checked_block_path(path_text).map_err(invalid)?;
    let params = BlockParams::parse(query).map_err(invalid)?;
    let offset = params
        .block_index
        .checked_mul(params.size)
        .filter(|offset| block_end_fits(*offset, params.size))
        .ok_or_else(|| invalid("blkid × size overflows a file offset"))?;
    Ok(FileBlockLocation {
        scheme,
        storage_name: storage_name.to_owned(),
        path,
        block_index: params.block_index,
        offset,
        size: params.size,
    })
}

/// Refuses `path` unless it lies strictly under `root`, compared component by component
/// without touching the file system (so symlinks are not followed). Both must be absolute and
/// free of `..`; `parse_block_uri` already refuses `..`, this checks again for any caller.
pub fn check_under_root(path: &Path, root: &Path) -> Result<(), DataError> {
    let outside = || DataError::OutsideRoot {
        path: path.to_owned(),
        root: root.to_owned(),
    };
    let lexically_safe = |p: &Path| p.is_absolute() && !has_parent_component(p);
    if !lexically_safe(path) || !lexically_safe(root) {
        return Err(outside());
    }
    if path.starts_with(root) && path.components().count() > root.components().count() {
        Ok(())
    } else {
        Err(outside())
    }
}

/// The path part of a URI (absolute: it starts at the `/` after the storage name), checked:
/// no `..`, naming a file.
fn checked_block_path(path_text: &str) -> Result<PathBuf, &'static str> {
    let path = Path::new(path_text);
    if has_parent_component(path) {
        return Err("path has a `..` component");
    }
    if path_text.ends_with('/') {
        return Err("path names a directory, not a file");
    }
    Ok(path.to_owned())
}

fn has_parent_component(path: &Path) -> bool {
    path.components().any(|c| c == Component::ParentDir)
}

/// Whether a block at `offset` of `size` bytes ends within `off_t` (i64).
fn block_end_fits(offset: u64, size: u64) -> bool {
    offset
        .checked_add(size)
        .is_some_and(|end| end <= i64::MAX as u64)
}

/// The params the file tier reads.
struct BlockParams {
    block_index: u64,
    size: u64,
}

impl BlockParams {
    fn parse(query: &str) -> Result<BlockParams, &'static str> {
        let mut block_index = None;
        let mut size = None;
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (key, value) = pair.split_once('=').ok_or("a param has no `=`")?;
            let slot = match key {
                "blkid" => &mut block_index,
                "size" => &mut size,
                _ => continue,
            };
            if slot.replace(parse_decimal(value)?).is_some() {
                return Err("a param is given twice");
            }
        }
        let size = size.ok_or("no `size` param")?;
        if size == 0 {
            return Err("`size` is zero");
        }
        Ok(BlockParams {
            block_index: block_index.unwrap_or(0),
            size,
        })
    }
}

/// A plain decimal `u64`: ASCII digits only (no sign, no spaces), no overflow.
fn parse_decimal(text: &str) -> Result<u64, &'static str> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err("a numeric param is not a plain decimal number");
    }
    text.parse().map_err(|_| "a numeric param overflows u64")
}
