//! memfd-backed shared memory mapped into this process, or memory a caller owns.
//!
//! Invariant: `ptr` points to `len` live bytes for the life of the value: a `MAP_SHARED`
//! mapping (the memfd is sealed against shrinking and growing, ours and peers' alike), or
//! caller-owned memory whose owner is released only when the value drops (see
//! [`SharedMemory::from_caller`]); every access is bounds-checked against `len` first. Other processes may map the
//! same memfd and write concurrently, and threads of this process (application, NIC) may copy
//! or run atomics on the same bytes at once; that is the RDMA contract (the application
//! orders conflicting accesses with completions). So no access to the mapping from Rust is
//! a plain one: copies are relaxed atomic word / byte copies (`word_copy`) and 8-byte
//! atomics are `AtomicU64` operations; racing accesses may observe torn data across words,
//! never undefined behaviour, and never leave the mapping. The kernel (read(2), writev(2))
//! also touches it, outside the Rust memory model.
//!
//! A mapping is read-only (`PROT_READ`) when it was made from a descriptor opened
//! read-only (or asked so): every write, copy into it and read-modify-write atomic is then
//! refused with an error before the page is touched, so a peer's claim of a write right
//! can never turn into a SIGSEGV; loads go through [`SharedMemory::load_u64`], a relaxed
//! 8-byte load (a plain `mov` / `ldr`, which never writes) followed by the fence the
//! ordering asks for.
//!
//! Memfds we create are `chmod 0600`: reopening a descriptor through
//! `/proc/<pid>/fd/<n>` (a process's own included) checks the memfd's mode, so a peer of
//! another (non-root) user that was handed a read-only descriptor cannot reopen it
//! read-write. Peers of the same user (the memfd's owner: they may `fchmod` it) and root
//! are not held by this.

use super::word_copy;
use crate::{Result, TransportError};
use std::ffi::CStr;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU64, Ordering};

/// Seals every memfd we create carries (and every peer's must): its size is fixed, so a
/// mapping can never lose its pages to a `ftruncate` (SIGBUS on access).
const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
/// Seals a received descriptor must carry: size fixed (whether the sender also sealed the
/// seals is its own business).
const REQUIRED_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
/// Mode of the memfds we create (see the module docs).
const MODE: libc::mode_t = 0o600;

/// How to map a descriptor received from a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protection {
    /// Read-only, whatever the descriptor allows.
    ReadOnly,
    /// Read-write; a descriptor opened read-only is refused.
    ReadWrite,
    /// Read-write if the descriptor was opened read-write, read-only if read-only.
    AsOpened,
}

/// A shared mapping of a whole memfd, or caller-owned memory.
#[derive(Debug)]
pub(crate) struct SharedMemory {
    /// The memfd of memory we created (the broker hands it to peers); `None` for a peer's
    /// memory, whose descriptor is closed once mapped (the mapping keeps the pages), and
    /// for caller-owned memory.
    fd: Option<OwnedFd>,
    ptr: NonNull<u8>,
    len: usize,
    /// Mapped `PROT_READ | PROT_WRITE` (else `PROT_READ` only).
    writable: bool,
    /// What dropping the value does with the bytes.
    backing: Backing,
    /// On hugetlb pages (memory created here only).
    huge: bool,
}

/// Bytes of the huge pages [`SharedMemory::create_huge`] asks for.
const HUGE_PAGE: usize = 2 << 20;
/// Bytes [`SharedMemory::populate`] allocates per call (a multiple of [`HUGE_PAGE`]).
const POPULATE_CHUNK: usize = 64 << 20;

/// Whether a system call that returned `result` succeeded (true), was interrupted by a
/// signal and is to be made again (false), or failed (the error, with `context`).
fn done_unless_interrupted(result: libc::c_int, context: &'static str) -> Result<bool> {
    if result == 0 {
        return Ok(true);
    }
    let error = std::io::Error::last_os_error();
    match error.kind() {
        std::io::ErrorKind::Interrupted => Ok(false),
        _ => Err(TransportError::io(context, error)),
    }
}

/// Gives caller-owned memory back to its owner (runs once, when the memory is dropped).
pub(crate) type Release = Box<dyn FnOnce() + Send>;

/// Who owns the bytes behind `ptr`.
enum Backing {
    /// A mapping made here: unmapped on drop.
    Mapping,
    /// Memory of the caller's: handed back through the release (taken when it runs).
    Caller(Option<Release>),
}

impl std::fmt::Debug for Backing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backing::Mapping => "Mapping",
            Backing::Caller(_) => "Caller",
        })
    }
}

// SAFETY: the bytes are plain memory owned by this value (a mapping, or caller memory lent
// until the value drops); all accesses go through bounds-checked copies or atomics, so
// sharing the handle between threads is sound. The caller's release is `Send` and runs
// only in `Drop`, with exclusive access.
unsafe impl Send for SharedMemory {}
// SAFETY: see `Send`; no method hands out references that alias mutable state, and no
// method touches the release (it is not `Sync`) through `&self`.
unsafe impl Sync for SharedMemory {}

impl SharedMemory {
    /// Creates a zeroed memfd of `len` bytes and maps it.
    pub(crate) fn create(name: &CStr, len: usize) -> Result<Self> {
        Self::create_with(name, len, 0)
    }

    /// [`SharedMemory::create`] on 2 MiB huge pages of the kernel's hugetlb pool
    /// (`vm.nr_hugepages`); `len` must be a multiple of 2 MiB. Refused when the kernel has
    /// no such pages to reserve (the mapping reserves them all; they are faulted in lazily).
    pub(crate) fn create_huge(name: &CStr, len: usize) -> Result<Self> {
        if len % HUGE_PAGE != 0 {
            return Err(TransportError::InvalidArgument(
                "huge-page memory must be a multiple of 2 MiB",
            ));
        }
        Self::create_with(name, len, libc::MFD_HUGETLB | libc::MFD_HUGE_2MB)
    }

    /// Whether the memory lies on hugetlb pages ([`SharedMemory::create_huge`]).
    pub(crate) fn is_huge(&self) -> bool {
        self.huge
    }

    /// Backs every page now instead of at first touch: allocates the memfd's pages (zeroed;
    /// huge pages too) and maps them into this process, so later accesses here take no page
    /// fault and a peer mapping the memfd takes minor faults only. Only memory created here
    /// (with its memfd) can be populated.
    pub(crate) fn populate(&self) -> Result<()> {
        let Some(fd) = &self.fd else {
            return Err(TransportError::InvalidArgument(
                "only memory created here can be populated",
            ));
        };
        libc::off_t::try_from(self.len)
            .map_err(|_| TransportError::InvalidArgument("memory too large to populate"))?;
        // In chunks: a signal may interrupt an allocation, and on regular memfds the kernel
        // then undoes that call's whole range; only the interrupted chunk is tried again.
        let mut offset = 0;
        while offset < self.len {
            let chunk = POPULATE_CHUNK.min(self.len - offset);
            // SAFETY: fallocate(2) on a descriptor we own, within the memfd's size (its seals
            // forbid growing it; allocating pages inside it changes no byte); both values fit
            // `off_t` (checked above).
            let allocated = unsafe {
                libc::fallocate(
                    fd.as_raw_fd(),
                    0,
                    offset as libc::off_t,
                    chunk as libc::off_t,
                )
            };
            if done_unless_interrupted(allocated, "allocate memfd pages")? {
                offset += chunk;
            }
        }
        loop {
            // SAFETY: madvise(2) on our own live mapping of `len` bytes; MADV_POPULATE_WRITE
            // only faults its pages in (the mapping is writable: created here).
            let advised = unsafe {
                libc::madvise(
                    self.ptr.as_ptr().cast(),
                    self.len,
                    libc::MADV_POPULATE_WRITE,
                )
            };
            let context = "map memfd pages (EINVAL: MADV_POPULATE_WRITE needs Linux 5.14)";
            if done_unless_interrupted(advised, context)? {
                break;
            }
        }
        Ok(())
    }

    fn create_with(name: &CStr, len: usize, page_flags: libc::c_uint) -> Result<Self> {
        if len == 0 {
            return Err(TransportError::InvalidArgument("zero-length memory"));
        }
        let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING | page_flags;
        // SAFETY: `name` is a valid NUL-terminated string; flags are plain constants.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), flags) };
        if raw < 0 {
            return Err(TransportError::last_os("memfd_create"));
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain fchmod on a descriptor we own.
        if unsafe { libc::fchmod(fd.as_raw_fd(), MODE) } < 0 {
            return Err(TransportError::last_os("chmod memfd"));
        }
        File::from(
            fd.try_clone()
                .map_err(|e| TransportError::io("dup memfd", e))?,
        )
        .set_len(len as u64)
        .map_err(|e| TransportError::io("size memfd", e))?;
        // SAFETY: plain fcntl on a descriptor we own.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } < 0 {
            return Err(TransportError::last_os("seal memfd"));
        }
        let ptr = Self::map(&fd, len, true)?;
        Ok(SharedMemory {
            fd: Some(fd),
            ptr,
            len,
            writable: true,
            backing: Backing::Mapping,
            huge: page_flags & libc::MFD_HUGETLB != 0,
        })
    }

    /// Wraps `len` bytes at `ptr` that the caller owns; `release` runs when the value drops
    /// (after every handle, registration and transfer holding it let go).
    ///
    /// # Safety
    /// `ptr` is valid for reads and writes of `len` bytes until `release` runs, and until
    /// then the caller touches those bytes only as the RDMA contract allows (never while a
    /// transfer it posted may write them, and without creating Rust references that other
    /// threads' accesses would alias).
    pub(crate) unsafe fn from_caller(ptr: *mut u8, len: usize, release: Release) -> Result<Self> {
        if len == 0 {
            return Err(TransportError::InvalidArgument("zero-length memory"));
        }
        let ptr = NonNull::new(ptr).ok_or(TransportError::InvalidArgument(
            "caller memory at a null address",
        ))?;
        if (ptr.as_ptr() as usize).checked_add(len).is_none() {
            return Err(TransportError::InvalidArgument(
                "caller memory wraps past the end of the address space",
            ));
        }
        Ok(SharedMemory {
            fd: None,
            ptr,
            len,
            writable: true,
            backing: Backing::Caller(Some(release)),
            huge: false,
        })
    }

    /// Whether the bytes are the caller's ([`SharedMemory::from_caller`]): no descriptor
    /// exists to share them with another process.
    pub(crate) fn is_caller_owned(&self) -> bool {
        matches!(self.backing, Backing::Caller(_))
    }

    /// Maps `fd`, a memfd received from a peer, which must be `len` bytes long and sealed
    /// against resizing; the descriptor is closed once mapped.
    pub(crate) fn from_descriptor(fd: OwnedFd, len: usize, protection: Protection) -> Result<Self> {
        let file = File::from(fd);
        let actual = file
            .metadata()
            .map_err(|e| TransportError::io("stat peer memfd", e))?
            .len();
        if actual != len as u64 {
            return Err(TransportError::BadEndpoint(format!(
                "peer memfd is {actual} bytes, expected {len}"
            )));
        }
        // SAFETY: plain fcntl on a descriptor `file` owns.
        let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & REQUIRED_SEALS != REQUIRED_SEALS {
            return Err(TransportError::BadEndpoint(
                "peer memfd is not sealed against resizing".into(),
            ));
        }
        // SAFETY: plain fcntl on a descriptor `file` owns; it only reads the status flags.
        let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        if flags < 0 {
            return Err(TransportError::last_os("fcntl F_GETFL"));
        }
        let opened_writable = match flags & libc::O_ACCMODE {
            libc::O_RDWR => true,
            libc::O_RDONLY => false,
            _ => {
                return Err(TransportError::BadEndpoint(
                    "peer memfd is opened write-only".into(),
                ))
            }
        };
        let writable = match protection {
            Protection::ReadOnly => false,
            Protection::AsOpened => opened_writable,
            Protection::ReadWrite if opened_writable => true,
            Protection::ReadWrite => {
                return Err(TransportError::BadEndpoint(
                    "peer memfd is read-only where read-write is needed".into(),
                ))
            }
        };
        let ptr = Self::map(&OwnedFd::from(file), len, writable)?;
        Ok(SharedMemory {
            fd: None,
            ptr,
            len,
            writable,
            backing: Backing::Mapping,
            huge: false,
        })
    }

    /// A fresh descriptor of this memory (created here), opened read-write or read-only,
    /// with its own open file description: what the broker hands to a peer. Opened
    /// through `/proc/self/fd`, which a process may always do for itself (dumpable or not).
    pub(crate) fn reopen(&self, writable: bool) -> Result<OwnedFd> {
        let Some(fd) = &self.fd else {
            return Err(TransportError::InvalidArgument(
                "a peer's memory or the caller's has no descriptor",
            ));
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(writable)
            .open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .map_err(|e| TransportError::io("reopen memfd", e))?;
        Ok(OwnedFd::from(file))
    }

    fn map(fd: &OwnedFd, len: usize, writable: bool) -> Result<NonNull<u8>> {
        if len == 0 {
            return Err(TransportError::InvalidArgument("zero-length memory"));
        }
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh mapping chosen by the kernel (addr NULL) of a descriptor we own;
        // it aliases no Rust object.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(TransportError::last_os("mmap"));
        }
        NonNull::new(ptr.cast::<u8>()).ok_or(TransportError::Exhausted("mappings"))
    }

    /// Virtual address of byte 0 in this process.
    pub(crate) fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The memfd number (what the key table shows peers, who ask the broker for it by
    /// that number); -1 for a peer's memory and the caller's, which have none.
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.fd.as_ref().map_or(-1, AsRawFd::as_raw_fd)
    }

    /// Whether the mapping may be written.
    pub(crate) fn is_writable(&self) -> bool {
        self.writable
    }

    /// Refuses writes to a read-only mapping.
    fn check_writable(&self) -> Result<()> {
        if self.writable {
            Ok(())
        } else {
            Err(TransportError::InvalidArgument(
                "write to a read-only mapping",
            ))
        }
    }

    /// The mapping's first byte (for iovecs; dereferenced only by the kernel).
    pub(super) fn base_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Checks that `[offset, offset + len)` lies inside the mapping.
    pub(crate) fn check(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(TransportError::InvalidArgument("range outside the memory")),
        }
    }

    /// Copies `data` to `offset`.
    pub(crate) fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check_writable()?;
        self.check(offset, data.len())?;
        // SAFETY: the range was bounds-checked; `data` is a Rust slice, never a slice into a
        // mapping (none is handed out), so it is private; the mapping is written atomically.
        unsafe { word_copy::copy_in(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len()) };
        Ok(())
    }

    /// Copies from `offset` into `out`.
    pub(crate) fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check(offset, out.len())?;
        // SAFETY: bounds-checked source inside the mapping, read atomically; `out` is a
        // private Rust slice.
        unsafe { word_copy::copy_out(self.ptr.as_ptr().add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Appends `len` bytes from `offset` to `out` (no zero-fill first).
    pub(crate) fn append_to(&self, offset: usize, len: usize, out: &mut Vec<u8>) -> Result<()> {
        self.check(offset, len)?;
        out.reserve(len);
        let start = out.len();
        // SAFETY: the source range was bounds-checked and is read atomically; `reserve` made
        // `len` bytes of private spare capacity after `start`, which the copy initialises
        // completely before `set_len`.
        unsafe {
            word_copy::copy_out(
                self.ptr.as_ptr().add(offset),
                out.as_mut_ptr().add(start),
                len,
            );
            out.set_len(start + len);
        }
        Ok(())
    }

    /// Reads up to `len` bytes from descriptor `fd` straight into `offset` (one read(2)).
    pub(crate) fn read_from(
        &self,
        fd: std::os::fd::RawFd,
        offset: usize,
        len: usize,
    ) -> std::io::Result<usize> {
        self.check_writable()
            .and_then(|()| self.check(offset, len))
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        // SAFETY: the kernel writes at most `len` bytes into the bounds-checked range of
        // the live mapping; no Rust reference into the mapping exists.
        let got = unsafe { libc::read(fd, self.ptr.as_ptr().add(offset).cast(), len) };
        if got < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(got as usize)
    }

    /// Copies `len` bytes from `src` at `src_offset` to `dst` at `dst_offset`.
    pub(crate) fn copy(
        src: &SharedMemory,
        src_offset: usize,
        dst: &SharedMemory,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        dst.check_writable()?;
        src.check(src_offset, len)?;
        dst.check(dst_offset, len)?;
        // SAFETY: both ranges are bounds-checked; every access is atomic, so two mappings
        // aliasing the same pages (or overlapping ranges) give unspecified bytes, not UB.
        unsafe {
            word_copy::copy_shared(
                src.ptr.as_ptr().add(src_offset),
                dst.ptr.as_ptr().add(dst_offset),
                len,
            )
        };
        Ok(())
    }

    /// The aligned 8-byte word at `offset` as an atomic, for any atomic operation; refused
    /// on a read-only mapping (use [`SharedMemory::load_u64`] there).
    pub(crate) fn atomic_u64(&self, offset: usize) -> Result<&AtomicU64> {
        self.check_writable()?;
        self.word(offset)
    }

    /// Loads the aligned 8-byte word at `offset` with `order` (`Relaxed`, `Acquire` or
    /// `SeqCst`); works on read-only mappings.
    pub(crate) fn load_u64(&self, offset: usize, order: Ordering) -> Result<u64> {
        let word = self.word(offset)?;
        if order == Ordering::SeqCst {
            fence(Ordering::SeqCst);
        }
        // A relaxed load of a register-sized atomic is a plain load instruction, which
        // never writes: sound on a read-only page (see "Atomic accesses to read-only
        // memory" in `core::sync::atomic`). Stronger orderings come from fences.
        let value = word.load(Ordering::Relaxed);
        if order != Ordering::Relaxed {
            fence(Ordering::Acquire);
        }
        Ok(value)
    }

    fn word(&self, offset: usize) -> Result<&AtomicU64> {
        self.check(offset, 8)?;
        // The address, not the offset: caller memory need not be page aligned.
        if (self.ptr.as_ptr() as usize + offset) % 8 != 0 {
            return Err(TransportError::InvalidArgument(
                "atomic address is not 8-byte aligned",
            ));
        }
        // SAFETY: in bounds, 8-byte aligned (checked on the address), valid for the
        // lifetime of `&self`; every access this crate makes to the mapping is atomic
        // (`word_copy` for copies), so no non-atomic access races with this one in this
        // process; other processes and the kernel are outside the Rust memory model. On a
        // read-only mapping only `load_u64` uses the word, with a relaxed load.
        Ok(unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(offset).cast::<u64>()) })
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        match &mut self.backing {
            Backing::Mapping => {
                // SAFETY: `ptr`/`len` describe the mapping made in `map`, unmapped exactly
                // once here; no reference into it outlives `self`.
                unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
            }
            Backing::Caller(release) => {
                if let Some(release) = release.take() {
                    release();
                }
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory(len: usize) -> SharedMemory {
        SharedMemory::create(c"test", len).unwrap()
    }

    /// A second mapping of `mem`, as a peer would make from a received descriptor.
    fn second(mem: &SharedMemory, writable: bool, protection: Protection) -> SharedMemory {
        let fd = mem.reopen(writable).unwrap();
        SharedMemory::from_descriptor(fd, mem.len(), protection).unwrap()
    }

    #[test]
    fn writes_are_seen_through_a_second_mapping() {
        let first = memory(4096);
        let second = second(&first, true, Protection::AsOpened);
        assert_eq!(
            second.raw_fd(),
            -1,
            "a peer mapping keeps no descriptor open"
        );
        assert!(second.is_writable());
        first.write(100, b"hello").unwrap();
        let mut out = [0u8; 5];
        second.read(100, &mut out).unwrap();
        assert_eq!(&out, b"hello");
        let mut appended = b"<".to_vec();
        second.append_to(100, 5, &mut appended).unwrap();
        assert_eq!(appended, b"<hello");
        assert!(second.append_to(4094, 5, &mut appended).is_err());
        assert_eq!(appended.len(), 6, "a refused append changes nothing");
        second.atomic_u64(8).unwrap().fetch_add(3, Ordering::SeqCst);
        assert_eq!(first.atomic_u64(8).unwrap().load(Ordering::SeqCst), 3);
    }

    #[test]
    fn populated_memory_has_every_page_allocated_and_still_reads_zero() {
        use std::os::unix::fs::MetadataExt;
        let len = POPULATE_CHUNK + (8 << 20); // two chunks
        let mem = memory(len);
        let allocated = |mem: &SharedMemory| {
            let file = File::from(mem.reopen(false).unwrap());
            file.metadata().unwrap().blocks() * 512
        };
        assert_eq!(allocated(&mem), 0, "a new memfd is backed lazily");
        mem.write(4096, b"kept").unwrap();
        mem.populate().unwrap();
        assert!(allocated(&mem) >= len as u64, "{}", allocated(&mem));
        let (mut kept, mut zero) = ([0u8; 4], vec![1u8; 4096]);
        mem.read(4096, &mut kept).unwrap();
        mem.read(len - 4096, &mut zero).unwrap();
        assert_eq!(&kept, b"kept", "populating changes no byte");
        assert!(zero.iter().all(|&b| b == 0), "new pages read zero");
        let peer = second(&mem, true, Protection::AsOpened);
        assert!(
            matches!(peer.populate(), Err(TransportError::InvalidArgument(_))),
            "a peer's mapping is not ours to populate"
        );
    }

    #[test]
    fn a_read_only_mapping_refuses_every_write_and_still_reads() {
        let owner = memory(4096);
        owner.write(0, b"owner's bytes").unwrap();
        owner.atomic_u64(64).unwrap().store(77, Ordering::SeqCst);
        let scratch = memory(4096);
        for (writable, protection) in [
            (false, Protection::AsOpened),
            (false, Protection::ReadOnly),
            (true, Protection::ReadOnly),
        ] {
            let peer = second(&owner, writable, protection);
            assert!(!peer.is_writable());
            assert!(peer.write(0, b"x").is_err(), "write");
            assert!(peer.atomic_u64(64).is_err(), "read-modify-write atomic");
            assert!(
                SharedMemory::copy(&scratch, 0, &peer, 0, 8).is_err(),
                "copy in"
            );
            let (reader, _writer) = std::os::unix::net::UnixStream::pair().unwrap();
            assert!(
                peer.read_from(reader.as_raw_fd(), 0, 8).is_err(),
                "read(2) in"
            );
            let mut out = [0u8; 13];
            peer.read(0, &mut out).unwrap();
            assert_eq!(&out, b"owner's bytes", "nothing was written");
            assert_eq!(peer.load_u64(64, Ordering::Acquire).unwrap(), 77);
            assert_eq!(peer.load_u64(64, Ordering::SeqCst).unwrap(), 77);
            assert!(peer.load_u64(60, Ordering::Relaxed).is_err(), "unaligned");
            SharedMemory::copy(&peer, 0, &scratch, 0, 13).unwrap();
        }
        let read_only = owner.reopen(false).unwrap();
        assert!(
            SharedMemory::from_descriptor(read_only, 4096, Protection::ReadWrite).is_err(),
            "a read-only descriptor cannot be mapped read-write"
        );
    }

    #[test]
    fn out_of_bounds_and_unaligned_accesses_are_refused() {
        let mem = memory(64);
        assert!(mem.write(60, b"12345").is_err());
        assert!(mem.read(usize::MAX, &mut [0u8; 2]).is_err());
        assert!(mem.atomic_u64(4).is_err());
        assert!(mem.atomic_u64(64).is_err());
        assert!(SharedMemory::copy(&mem, 0, &mem, 40, 32).is_err());
    }

    #[test]
    fn memory_cannot_be_resized_and_unsealed_peers_are_refused() {
        let mem = memory(4096);
        let path = format!("/proc/self/fd/{}", mem.raw_fd());
        let other = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        assert!(other.set_len(0).is_err(), "shrinking is sealed");
        assert!(other.set_len(8192).is_err(), "growing is sealed");
        let mut out = [1u8; 8];
        mem.read(4088, &mut out).unwrap();
        assert_eq!(out, [0; 8]);
        // SAFETY: a fresh memfd without seals, owned by `unsealed`.
        let unsealed = unsafe { OwnedFd::from_raw_fd(libc::memfd_create(c"bare".as_ptr(), 0)) };
        File::from(unsealed.try_clone().unwrap())
            .set_len(4096)
            .unwrap();
        let refused = SharedMemory::from_descriptor(unsealed, 4096, Protection::AsOpened);
        assert!(refused.is_err());
    }

    #[test]
    fn zero_length_and_wrong_size_peer_are_refused() {
        assert!(SharedMemory::create(c"zero", 0).is_err());
        let mem = memory(4096);
        let fd = mem.reopen(true).unwrap();
        assert!(SharedMemory::from_descriptor(fd, 8192, Protection::AsOpened).is_err());
    }

    #[test]
    fn created_memory_is_private_to_its_user() {
        let mem = memory(4096);
        let mode = File::from(mem.reopen(false).unwrap())
            .metadata()
            .unwrap()
            .permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
    }
}
