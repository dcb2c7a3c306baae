//! Opening the files of one batch: each distinct path once, shared by all its ops.
//!
//! Invariants:
//! * a file is opened with O_DIRECT only when the mode is `Auto` and every op of the batch on
//!   it is aligned (buffer address, offset and length multiples of [`DIRECT_IO_ALIGN`]), so
//!   no O_DIRECT transfer is ever unaligned;
//! * when the file system refuses O_DIRECT at open (EINVAL), the file is opened buffered and
//!   [`OpenedFile::direct`] says so; the caller reports it per op;
//! * for writing, missing parent directories are created (mode 0755) and a missing file is
//!   created (mode 0644), both subject to the umask; an existing file is never truncated;
//! * no symlink is followed on the way to a file (`openat2` with `RESOLVE_NO_SYMLINKS`), nor
//!   while its missing directories are made (`mkdirat` and `O_NOFOLLOW` one component at a
//!   time): callers pass real paths (the client library resolves and checks them first), so
//!   a link on the storage fails the write instead of leading elsewhere;
//! * only a regular file of a storage file system is used: a path the server named that
//!   leads to a FIFO, a device, a socket, or a file of procfs, sysfs or another kernel file
//!   system (`/proc/self/mem`, through any symlink) is refused before any byte moves, and
//!   the open never blocks on a FIFO (it is made non-blocking, which is cleared again once
//!   the file proves regular).

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

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
    let (file, direct) = open_preferring_direct(path, access, want_direct).map_err(open_failure)?;
    let file = storage_file(file).map_err(open_failure)?;
    Ok(OpenedFile { file, direct })
}

/// Opens `path` with O_DIRECT when `want_direct`, buffered when the file system refuses it
/// (EINVAL); says which.
fn open_preferring_direct(
    path: &Path,
    access: Access,
    want_direct: bool,
) -> io::Result<(File, bool)> {
    match open_with_flags(path, access, want_direct) {
        Ok(file) => Ok((file, want_direct)),
        Err(error) if want_direct && error.raw_os_error() == Some(libc::EINVAL) => {
            Ok((open_with_flags(path, access, false)?, false))
        }
        Err(error) => Err(error),
    }
}

/// Kernel file systems whose files are no block storage (`statfs(2)` magic numbers): proc,
/// sysfs, debugfs, securityfs, tracefs, configfs, cgroup, cgroup2, bpf, devpts, pstore,
/// efivarfs, binfmt_misc, selinuxfs.
const KERNEL_FILE_SYSTEMS: [i64; 14] = [
    0x9fa0,
    0x6265_6572,
    0x6462_6720,
    0x7363_6673,
    0x7472_6163,
    0x6265_6570,
    0x0027_e0eb,
    0x6367_7270,
    0xcafe_4a11,
    0x1cd1,
    0x6165_676c,
    0xde5e_81e4,
    0x4249_4e4d,
    0xf97c_ff8c,
];

/// `file` when it is a regular file of a storage file system, made blocking again; an
/// `InvalidInput` error naming what it is otherwise.
fn storage_file(file: File) -> io::Result<File> {
    let refused = |what: &str| io::Error::new(io::ErrorKind::InvalidInput, what.to_string());
    if !file.metadata()?.file_type().is_file() {
        return Err(refused("not a regular file (a FIFO, device or socket)"));
    }
    let mut stats = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `file` keeps the descriptor open for the call; `stats` is a writable statfs
    // the kernel fills completely on success (read only then).
    let stats = unsafe {
        if libc::fstatfs(file.as_raw_fd(), stats.as_mut_ptr()) != 0 {
            return Err(io::Error::last_os_error());
        }
        stats.assume_init()
    };
    #[allow(clippy::unnecessary_cast)] // f_type is i64 on x86_64, other widths elsewhere
    if KERNEL_FILE_SYSTEMS.contains(&(stats.f_type as i64)) {
        return Err(refused(
            "a file of a kernel file system (procfs, sysfs, ...)",
        ));
    }
    // SAFETY: fcntl on a descriptor `file` keeps open; F_GETFL / F_SETFL take no pointers.
    let cleared = unsafe {
        let flags = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
        flags >= 0 && libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) == 0
    };
    if !cleared {
        return Err(io::Error::last_os_error());
    }
    Ok(file)
}

fn open_failure(source: io::Error) -> OpenFailure {
    OpenFailure {
        directory: None,
        source,
    }
}

/// Creates the missing directories above `path` (mode 0755, subject to the umask), one at a
/// time from the root (or the working directory) and following no symlink: a link on the
/// way fails the write, as the open itself would, instead of making directories wherever it
/// leads.
fn create_parent_directories(path: &Path) -> Result<(), OpenFailure> {
    let Some(parent) = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    else {
        return Ok(());
    };
    if fs::symlink_metadata(parent).is_ok_and(|metadata| metadata.is_dir()) {
        return Ok(());
    }
    let failed = |source| OpenFailure {
        directory: Some(parent.to_owned()),
        source,
    };
    let start = if parent.is_absolute() { "/" } else { "." };
    let mut dir = open_directory(None, Path::new(start)).map_err(failed)?;
    for component in parent.components() {
        let name = match component {
            Component::RootDir | Component::CurDir => continue,
            Component::Normal(name) => Path::new(name),
            Component::ParentDir | Component::Prefix(_) => {
                let why = "a `..` on the way to a block file";
                return Err(failed(io::Error::new(io::ErrorKind::InvalidInput, why)));
            }
        };
        let name_c = c_path(name).map_err(failed)?;
        // SAFETY: `dir` is an open directory descriptor and `name_c` a NUL-terminated name,
        // both alive for the call.
        if unsafe { libc::mkdirat(dir.as_raw_fd(), name_c.as_ptr(), 0o755) } != 0 {
            let error = io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::EEXIST) {
                return Err(failed(error));
            }
        }
        dir = open_directory(Some(&dir), name).map_err(failed)?;
    }
    Ok(())
}

/// Opens directory `name` (in `dir`, else from the working directory) as a path
/// descriptor, refusing a symlink (ELOOP) or anything else that is no directory (ENOTDIR).
fn open_directory(dir: Option<&File>, name: &Path) -> io::Result<File> {
    use std::os::fd::FromRawFd;
    let name = c_path(name)?;
    let at = dir.map_or(libc::AT_FDCWD, |dir| dir.as_raw_fd());
    let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: `at` is AT_FDCWD or a descriptor `dir` keeps open, `name` NUL-terminated;
    // both outlive the call.
    let fd = unsafe { libc::openat(at, name.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor, owned by nothing else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// `path` as a C string (refused with a NUL in it).
fn c_path(path: &Path) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the path"))
}

/// Opens `path` following no symlink on the way (the caller resolved the path it checked:
/// a link planted or swapped in since fails the open instead of leading elsewhere), and
/// non-blocking until `storage_file` has seen a regular file (opening a FIFO would wait).
/// A kernel without `openat2` (before 5.6) refuses only a link as the last component.
fn open_with_flags(path: &Path, access: Access, direct: bool) -> io::Result<File> {
    let mut flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
    flags |= match access {
        Access::Read => libc::O_RDONLY,
        Access::Write => libc::O_WRONLY | libc::O_CREAT,
    };
    if direct {
        flags |= libc::O_DIRECT;
    }
    let open = |flags: i32| match open_beneath_no_links(path, flags) {
        Err(error) if error.raw_os_error() == Some(libc::ENOSYS) => {
            let mut options = OpenOptions::new();
            options.read(access == Access::Read);
            options
                .write(access == Access::Write)
                .create(access == Access::Write);
            options.mode(0o644).custom_flags(flags | libc::O_NOFOLLOW);
            options.open(path)
        }
        opened => opened,
    };
    match open(flags) {
        // A lease (an NFS delegation, an oplock) makes a non-blocking open refuse to wait:
        // a regular file may wait for it.
        Err(error)
            if error.kind() == io::ErrorKind::WouldBlock
                && fs::symlink_metadata(path).is_ok_and(|meta| meta.is_file()) =>
        {
            open(flags & !libc::O_NONBLOCK)
        }
        opened => opened,
    }
}

/// `openat2(AT_FDCWD, path, flags, 0644)` resolving no symlink (nor /proc magic link).
fn open_beneath_no_links(path: &Path, flags: i32) -> io::Result<File> {
    use std::os::fd::FromRawFd;
    let name = c_path(path)?;
    // SAFETY: open_how is plain old data; all-zero is a valid value, filled in below.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = flags as u64;
    how.mode = if flags & libc::O_CREAT != 0 { 0o644 } else { 0 };
    how.resolve = libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: `name` is NUL-terminated and `how` a valid open_how of the size passed; both
    // outlive the call, which only reads them.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            name.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor, owned by nothing else.
    Ok(unsafe { File::from_raw_fd(fd as i32) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// procfs has no O_DIRECT: the open is refused with EINVAL and must fall back (procfs
    /// itself is then refused as no storage, by `storage_file`).
    #[test]
    fn a_file_system_refusing_o_direct_gets_a_buffered_file() {
        let path = Path::new("/proc/sys/kernel/ostype");
        let (_, direct) = open_preferring_direct(path, Access::Read, true)
            .unwrap_or_else(|error| panic!("open of {path:?} failed: {error}"));
        assert!(!direct);
    }

    fn refusal(path: &Path, access: Access) -> String {
        match open_block_file(path, access, false) {
            Ok(_) => panic!("{path:?} was opened as a block file"),
            Err(failure) => {
                assert_eq!(
                    failure.source.kind(),
                    io::ErrorKind::InvalidInput,
                    "{path:?}"
                );
                failure.source.to_string()
            }
        }
    }

    #[test]
    fn only_regular_files_of_storage_file_systems_are_opened() {
        // The process's own memory, by its real path (through the /proc/self link the open
        // itself is refused).
        let mem = PathBuf::from(format!("/proc/{}/mem", std::process::id()));
        let memory = refusal(&mem, Access::Write);
        assert!(memory.contains("kernel file system"), "{memory}");
        assert!(open_block_file(Path::new("/proc/self/mem"), Access::Write, false).is_err());
        let sysfs = refusal(Path::new("/sys/kernel/uevent_seqnum"), Access::Read);
        assert!(sysfs.contains("kernel file system"), "{sysfs}");
        let device = refusal(Path::new("/dev/null"), Access::Write);
        assert!(device.contains("not a regular file"), "{device}");
        // A FIFO with no writer: refused at once, not waited on.
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("fifo");
        let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: `name` is a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0, "mkfifo");
        assert!(refusal(&fifo, Access::Read).contains("not a regular file"));
        // A directory on the way that is a link: refused, not followed.
        std::fs::create_dir(dir.path().join("real")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("real"), dir.path().join("link")).unwrap();
        let through = open_block_file(&dir.path().join("link/block"), Access::Write, false);
        assert!(through.is_err(), "a path through a link was opened");
        assert!(!dir.path().join("real/block").exists());
        // Nor are missing directories made where such a link leads (they once were, with
        // only the file's own open refused).
        let below = open_block_file(&dir.path().join("link/sub/block"), Access::Write, false);
        assert!(below.is_err(), "a path through a link was opened");
        assert!(
            !dir.path().join("real/sub").exists(),
            "a directory made through a link"
        );
        // Missing directories of a real path are made.
        let deep = dir.path().join("a/b/c/block");
        assert!(open_block_file(&deep, Access::Write, false).is_ok());
        assert!(deep.is_file());
        // A regular file is opened, and blocking.
        let opened = open_block_file(&dir.path().join("block"), Access::Write, false)
            .unwrap_or_else(|failure| panic!("{}", failure.source));
        // SAFETY: F_GETFL on a descriptor `opened` keeps open; no pointers.
        let flags = unsafe { libc::fcntl(opened.file.as_raw_fd(), libc::F_GETFL) };
        assert_eq!(flags & libc::O_NONBLOCK, 0);
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
