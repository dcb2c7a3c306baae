//! Opening the files of one batch: each distinct path once, shared by all its ops.
//!
//! Invariants:
//! * a file is opened with O_DIRECT only when the mode is `Auto` and every op of the batch on
//!   it is aligned (buffer address, offset and length multiples of [`DIRECT_IO_ALIGN`]), so
//!   no O_DIRECT transfer is ever unaligned;
//! * when the file system refuses O_DIRECT at open (EINVAL), the file is opened buffered and
//!   [`OpenedFile::direct`] says so; the caller reports it per op;
//! * for writing, missing parent directories are created (mode 0755) and a missing file is
//!   created (mode 0644), both subject to the umask; an existing file is never truncated.

use std::collections::HashMap;
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::{DirectMode, DIRECT_IO_ALIGN};
use crate::error::copy_io_error;
use crate::DataError;

/// Whether a batch reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    Read,
    Write,
}

/// What the planner needs to know of one op.
pub(super) struct BlockShape<'a> {
    pub path: &'a Path,
    pub offset: u64,
    pub addr: usize,
    pub len: usize,
}

impl BlockShape<'_> {
    fn is_aligned(&self) -> bool {
        let align = DIRECT_IO_ALIGN as u64;
        self.addr % DIRECT_IO_ALIGN == 0
            && self.offset % align == 0
            && self.len % DIRECT_IO_ALIGN == 0
    }
}

/// An open block file.
pub(super) struct OpenedFile {
    pub file: File,
    /// Whether it was opened with O_DIRECT.
    pub direct: bool,
}

/// Why a file could not be opened: the directory that could not be created, or none when the
/// open itself failed.
struct OpenFailure {
    directory: Option<PathBuf>,
    source: io::Error,
}

/// The files of one batch and which op uses which.
pub(super) struct FileTable<'a> {
    paths: Vec<&'a Path>,
    files: Vec<Result<OpenedFile, OpenFailure>>,
    file_of_op: Vec<usize>,
}

impl<'a> FileTable<'a> {
    /// Opens every distinct path of `shapes` once.
    pub fn open(
        shapes: impl Iterator<Item = BlockShape<'a>>,
        access: Access,
        mode: DirectMode,
    ) -> FileTable<'a> {
        let mut index_of_path: HashMap<&Path, usize> = HashMap::new();
        let mut paths = Vec::new();
        let mut all_aligned = Vec::new();
        let mut file_of_op = Vec::new();
        for shape in shapes {
            let index = *index_of_path.entry(shape.path).or_insert_with(|| {
                paths.push(shape.path);
                all_aligned.push(true);
                paths.len() - 1
            });
            all_aligned[index] &= shape.is_aligned();
            file_of_op.push(index);
        }
        let files = paths
            .iter()
            .zip(all_aligned)
            .map(|(path, aligned)| {
                open_block_file(path, access, mode == DirectMode::Auto && aligned)
            })
            .collect();
        FileTable {
            paths,
            files,
            file_of_op,
        }
    }

    /// The file of op `op_index`, or the error that kept it from opening.
    pub fn get(&self, op_index: usize) -> Result<&OpenedFile, DataError> {
        let index = self.file_of_op[op_index];
        self.files[index].as_ref().map_err(|failure| {
            let source = copy_io_error(&failure.source);
            match &failure.directory {
                Some(directory) => DataError::CreateDir {
                    path: directory.clone(),
                    source,
                },
                None => DataError::Open {
                    path: self.paths[index].to_owned(),
                    source,
                },
            }
        })
    }
}

fn open_block_file(
    path: &Path,
    access: Access,
    want_direct: bool,
) -> Result<OpenedFile, OpenFailure> {
    if access == Access::Write {
        create_parent_directories(path)?;
    }
    let opened = open_with_flags(path, access, want_direct);
    match opened {
        Ok(file) => Ok(OpenedFile {
            file,
            direct: want_direct,
        }),
        Err(error) if want_direct && error.raw_os_error() == Some(libc::EINVAL) => {
            open_with_flags(path, access, false)
                .map(|file| OpenedFile {
                    file,
                    direct: false,
                })
                .map_err(open_failure)
        }
        Err(error) => Err(open_failure(error)),
    }
}

fn open_failure(source: io::Error) -> OpenFailure {
    OpenFailure {
        directory: None,
        source,
    }
}

fn create_parent_directories(path: &Path) -> Result<(), OpenFailure> {
    let Some(parent) = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    else {
        return Ok(());
    };
    if fs::metadata(parent).is_ok_and(|metadata| metadata.is_dir()) {
        return Ok(());
    }
    DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(parent)
        .map_err(|source| OpenFailure {
            directory: Some(parent.to_owned()),
            source,
        })
}

fn open_with_flags(path: &Path, access: Access, direct: bool) -> io::Result<File> {
    let mut options = OpenOptions::new();
    match access {
        Access::Read => options.read(true),
        Access::Write => options.write(true).create(true).mode(0o644),
    };
    if direct {
        options.custom_flags(libc::O_DIRECT);
    }
    options.open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// procfs has no O_DIRECT: the open is refused with EINVAL and must fall back.
    #[test]
    fn a_file_system_refusing_o_direct_gets_a_buffered_file() {
        let path = Path::new("/proc/sys/kernel/ostype");
        let opened = open_block_file(path, Access::Read, true).unwrap_or_else(|failure| {
            panic!("open of {path:?} failed: {}", failure.source);
        });
        assert!(!opened.direct);
    }

    #[test]
    fn unaligned_ops_keep_their_file_buffered() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("mixed");
        let aligned = BlockShape {
            path: &path,
            offset: 0,
            addr: 8192,
            len: 4096,
        };
        let unaligned = BlockShape {
            path: &path,
            offset: 4096,
            addr: 8193,
            len: 4096,
        };
        let table = FileTable::open(
            [aligned, unaligned].into_iter(),
            Access::Write,
            DirectMode::Auto,
        );
        assert!(!table.get(0).expect("opened").direct);
        assert!(!table.get(1).expect("opened").direct);
    }
}
