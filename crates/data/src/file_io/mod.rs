//! [`FileIo`]: batched block writes and reads against the file tier.
//!
//! One call moves a batch of blocks. Each distinct path is opened once per call and its ops
//! share the fd. With the io_uring backend all ops of the call are submitted together up to
//! the queue depth and kept in flight until done; the psync backend runs them one after the
//! other with `pwrite`/`pread`.
//!
//! Invariants:
//! * each op gets its own result, in op order; an op's [`IoPath`] says which backend ran it
//!   and whether through O_DIRECT, so no fallback is silent;
//! * O_DIRECT is used for a file when [`DirectMode::Auto`] is set and every op of the call on
//!   that file is aligned to [`DIRECT_IO_ALIGN`] (buffer address, offset, length); a file
//!   system refusing O_DIRECT at open (EINVAL, e.g. procfs) makes that file buffered;
//! * a short transfer is retried for its remainder; a read that meets end of file first is
//!   [`DataError::ShortRead`] (a miss, see [`DataError::is_miss`]);
//! * writes are not synced: a block is in the page cache (buffered) or on the device's cache
//!   (O_DIRECT) when the call returns.
//!
//! * an op whose whole buffer lies in a range registered with [`FileIo::register_buffer`]
//!   moves through io_uring's registered (fixed) buffer table (`READ_FIXED` / `WRITE_FIXED`:
//!   its pages were pinned once, not per I/O); its [`IoPath`] says so.

mod fixed;
mod open;
mod psync;
mod uring;

use std::fmt;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Mutex;

use crate::DataError;
use open::{Access, BlockShape, FileTable};
use uring::{Ring, Transfer};

/// The alignment O_DIRECT needs of buffer address, file offset and length here. 4096 covers
/// the logical block size of common disks and file systems; the file system's own (smaller)
/// DIO alignment is not queried.
pub const DIRECT_IO_ALIGN: usize = 4096;

/// Whether O_DIRECT may be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirectMode {
    /// O_DIRECT for every file whose ops of the call are all aligned.
    Auto,
    /// Always the page cache.
    Never,
}

/// How a [`FileIo`] is set up.
#[derive(Debug, Clone)]
pub struct FileIoConfig {
    /// The most ops in flight at once in the io_uring backend (clamped to 1..=4096).
    pub queue_depth: u32,
    /// Whether O_DIRECT may be used.
    pub direct: DirectMode,
    /// Use `pread`/`pwrite` even where io_uring is available.
    pub force_psync: bool,
}

impl Default for FileIoConfig {
    fn default() -> FileIoConfig {
        FileIoConfig {
            queue_depth: 64,
            direct: DirectMode::Auto,
            force_psync: false,
        }
    }
}

/// The backend a [`FileIo`] runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoBackend {
    /// io_uring.
    Uring,
    /// `pread`/`pwrite`.
    Psync,
}

/// How one op ran: backend and whether through O_DIRECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoPath {
    /// io_uring, O_DIRECT.
    UringDirect,
    /// io_uring, page cache.
    UringBuffered,
    /// `pread`/`pwrite`, O_DIRECT.
    PsyncDirect,
    /// `pread`/`pwrite`, page cache.
    PsyncBuffered,
    /// io_uring, O_DIRECT, from or into a registered buffer.
    UringDirectRegistered,
    /// io_uring, page cache, from or into a registered buffer.
    UringBufferedRegistered,
}

impl IoPath {
    fn of(backend: IoBackend, direct: bool) -> IoPath {
        match (backend, direct) {
            (IoBackend::Uring, true) => IoPath::UringDirect,
            (IoBackend::Uring, false) => IoPath::UringBuffered,
            (IoBackend::Psync, true) => IoPath::PsyncDirect,
            (IoBackend::Psync, false) => IoPath::PsyncBuffered,
        }
    }

    /// The same path through a registered buffer.
    fn registered(self) -> IoPath {
        match self {
            IoPath::UringDirect => IoPath::UringDirectRegistered,
            IoPath::UringBuffered => IoPath::UringBufferedRegistered,
            other => other,
        }
    }
}

impl fmt::Display for IoPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IoPath::UringDirect => "io_uring O_DIRECT",
            IoPath::UringBuffered => "io_uring buffered",
            IoPath::PsyncDirect => "psync O_DIRECT",
            IoPath::PsyncBuffered => "psync buffered",
            IoPath::UringDirectRegistered => "io_uring O_DIRECT, registered buffer",
            IoPath::UringBufferedRegistered => "io_uring buffered, registered buffer",
        })
    }
}

/// Write `data` at byte `offset` of the file at `path` (created with its directories).
#[derive(Debug)]
pub struct WriteOp<'a> {
    /// The block file.
    pub path: &'a Path,
    /// The block's byte offset (blkid × size).
    pub offset: u64,
    /// The block's bytes.
    pub data: &'a [u8],
}

/// Fill `buf` from byte `offset` of the file at `path`.
#[derive(Debug)]
pub struct ReadOp<'a> {
    /// The block file.
    pub path: &'a Path,
    /// The block's byte offset (blkid × size).
    pub offset: u64,
    /// Where the block goes; its length is the block's size.
    pub buf: &'a mut [u8],
}

/// Block I/O against the file tier; shareable between threads (the ring is behind a mutex,
/// so concurrent calls take turns on it).
pub struct FileIo {
    ring: Option<Mutex<Ring>>,
    fallback_reason: Option<String>,
    direct: DirectMode,
}

impl FileIo {
    /// A `FileIo` on io_uring, or on psync when `force_psync` is set or io_uring setup is
    /// refused (seccomp, `kernel.io_uring_disabled`, old kernel); never fails.
    pub fn new(config: FileIoConfig) -> FileIo {
        let (ring, fallback_reason) = if config.force_psync {
            (None, Some("force_psync is set".to_owned()))
        } else {
            match Ring::new(config.queue_depth) {
                Ok(ring) => (Some(Mutex::new(ring)), None),
                Err(error) => (None, Some(format!("io_uring setup refused: {error}"))),
            }
        };
        FileIo {
            ring,
            fallback_reason,
            direct: config.direct,
        }
    }

    /// The backend in use and, for psync, why io_uring is not.
    pub fn backend(&self) -> (IoBackend, Option<&str>) {
        let backend = match self.ring {
            Some(_) => IoBackend::Uring,
            None => IoBackend::Psync,
        };
        (backend, self.fallback_reason.as_deref())
    }

    /// Registers `len` bytes at `addr` (an engine's KV buffers) with io_uring, one buffer
    /// slot per GiB: later ops whose whole buffer lies inside one slot's GiB move through it
    /// ([`IoPath::UringDirectRegistered`], [`IoPath::UringBufferedRegistered`]). The pinned
    /// pages count against RLIMIT_MEMLOCK (as a verbs registration of the same bytes does,
    /// again). Refused, changing nothing, on the psync backend, for a null, empty or
    /// overlapping range, when too few of the 1024 slots are free, or when the kernel
    /// refuses (RLIMIT_MEMLOCK, no sparse buffer tables before Linux 5.19); ops then run as
    /// before.
    ///
    /// # Safety
    /// Until [`FileIo::deregister_buffer`] of `addr` returns or this `FileIo` drops, the
    /// bytes stay allocated and mapped to the same pages (no `munmap`, `mremap`,
    /// `MADV_DONTNEED` or `MAP_FIXED` over them): the kernel pinned those pages and moves
    /// data through them, not through whatever the addresses map later.
    pub unsafe fn register_buffer(&self, addr: *mut u8, len: usize) -> Result<(), DataError> {
        let refused = |reason: String| DataError::RegisterBuffer {
            addr: addr as usize,
            len,
            reason,
        };
        let Some(ring) = &self.ring else {
            let why = self.fallback_reason.as_deref().unwrap_or("no io_uring");
            return Err(refused(format!("the psync backend runs ({why})")));
        };
        // SAFETY: forwarded from this function's contract.
        unsafe { lock(ring).register(addr, len) }.map_err(refused)
    }

    /// Unregisters the range registered at `addr`; its bytes may be freed once this returns,
    /// an error included (no op uses the range again; the kernel's error leaves its pages
    /// pinned until their slots are reused or this `FileIo` drops). Returns false when no
    /// range starts at `addr`.
    pub fn deregister_buffer(&self, addr: *const u8) -> Result<bool, DataError> {
        let Some(ring) = &self.ring else {
            return Ok(false);
        };
        lock(ring)
            .deregister(addr)
            .map_err(|reason| DataError::UnregisterBuffer {
                addr: addr as usize,
                reason,
            })
    }

    /// How many ranges are registered.
    pub fn registered_buffers(&self) -> usize {
        self.ring.as_ref().map_or(0, |ring| lock(ring).registered())
    }

    /// Writes every op's bytes; one result per op, in order.
    pub fn write_blocks(&self, ops: &[WriteOp<'_>]) -> Vec<Result<IoPath, DataError>> {
        let shapes = ops.iter().map(|op| BlockShape {
            path: op.path,
            offset: op.offset,
            addr: op.data.as_ptr() as usize,
            len: op.data.len(),
        });
        let files = FileTable::open(shapes, Access::Write, self.direct);
        let outcomes = match &self.ring {
            Some(ring) => {
                let transfers = ops.iter().enumerate().filter_map(|(index, op)| {
                    let file = files.get(index).ok()?;
                    Some((
                        index,
                        Transfer::write(file.file.as_raw_fd(), op.data, op.offset),
                    ))
                });
                run_on_ring(ring, transfers)
            }
            None => (0..ops.len())
                .filter_map(|index| {
                    let file = files.get(index).ok()?;
                    let op = &ops[index];
                    Some((
                        index,
                        (psync::write_at(&file.file, op.data, op.offset), false),
                    ))
                })
                .collect(),
        };
        let mut results = self.results_after_open(&files, ops.len());
        for (index, (outcome, registered)) in outcomes {
            let op = &ops[index];
            match outcome {
                Err(source) => {
                    results[index] = Err(DataError::Write {
                        path: op.path.to_owned(),
                        offset: op.offset,
                        source,
                    })
                }
                Ok(_) if registered => mark_registered(&mut results[index]),
                Ok(_) => {}
            }
        }
        results
    }

    /// Reads every op's block into its buffer; one result per op, in order. A block that the
    /// file does not hold in full is [`DataError::ShortRead`].
    pub fn read_blocks(&self, ops: &mut [ReadOp<'_>]) -> Vec<Result<IoPath, DataError>> {
        let shapes = ops.iter().map(|op| BlockShape {
            path: op.path,
            offset: op.offset,
            addr: op.buf.as_ptr() as usize,
            len: op.buf.len(),
        });
        let files = FileTable::open(shapes, Access::Read, self.direct);
        let outcomes = match &self.ring {
            Some(ring) => {
                let transfers = ops.iter_mut().enumerate().filter_map(|(index, op)| {
                    let file = files.get(index).ok()?;
                    Some((
                        index,
                        Transfer::read(file.file.as_raw_fd(), op.buf, op.offset),
                    ))
                });
                run_on_ring(ring, transfers)
            }
            None => ops
                .iter_mut()
                .enumerate()
                .filter_map(|(index, op)| {
                    let file = files.get(index).ok()?;
                    Some((
                        index,
                        (psync::read_at(&file.file, op.buf, op.offset), false),
                    ))
                })
                .collect(),
        };
        let mut results = self.results_after_open(&files, ops.len());
        for (index, (outcome, registered)) in outcomes {
            match read_outcome(&ops[index], outcome) {
                Err(error) => results[index] = Err(error),
                Ok(()) if registered => mark_registered(&mut results[index]),
                Ok(()) => {}
            }
        }
        results
    }

    /// Each op's result as far as opening its file tells: its path, or the open error.
    fn results_after_open(
        &self,
        files: &FileTable<'_>,
        op_count: usize,
    ) -> Vec<Result<IoPath, DataError>> {
        let (backend, _) = self.backend();
        (0..op_count)
            .map(|index| {
                files
                    .get(index)
                    .map(|file| IoPath::of(backend, file.direct))
            })
            .collect()
    }
}

impl fmt::Debug for FileIo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (backend, fallback_reason) = self.backend();
        f.debug_struct("FileIo")
            .field("backend", &backend)
            .field("fallback_reason", &fallback_reason)
            .field("direct", &self.direct)
            .finish()
    }
}

/// An op's outcome: bytes moved or the error, and whether through a registered buffer.
type Outcome = (io::Result<usize>, bool);

/// The ring, locked.
fn lock(ring: &Mutex<Ring>) -> std::sync::MutexGuard<'_, Ring> {
    ring.lock()
        .expect("an earlier panic left the io_uring ring in an unknown state")
}

/// Records that an op that succeeded moved through a registered buffer.
fn mark_registered(result: &mut Result<IoPath, DataError>) {
    if let Ok(path) = result {
        *path = path.registered();
    }
}

/// Runs the transfers on the ring; returns each one's op index and outcome.
fn run_on_ring(
    ring: &Mutex<Ring>,
    indexed: impl Iterator<Item = (usize, Transfer)>,
) -> Vec<(usize, Outcome)> {
    let (op_indexes, mut transfers): (Vec<usize>, Vec<Transfer>) = indexed.unzip();
    lock(ring).run(&mut transfers);
    op_indexes
        .into_iter()
        .zip(transfers.into_iter().map(Transfer::outcome))
        .collect()
}

/// A read's outcome (bytes before EOF, or the error) as the op's error, if any.
fn read_outcome(op: &ReadOp<'_>, outcome: io::Result<usize>) -> Result<(), DataError> {
    match outcome {
        Ok(got) if got == op.buf.len() => Ok(()),
        Ok(got) => Err(DataError::ShortRead {
            path: op.path.to_owned(),
            offset: op.offset,
            expected: op.buf.len(),
            got,
        }),
        Err(source) => Err(DataError::Read {
            path: op.path.to_owned(),
            offset: op.offset,
            source,
        }),
    }
}
