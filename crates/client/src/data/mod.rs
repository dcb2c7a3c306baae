//! The transfer engine: moves whole blocks between the caller's buffers and where the
//! manager places them — pool nodes' regions (one-sided operations on the soft transport)
//! and the file tier (`kvcm-data`: io_uring, O_DIRECT when aligned, psync fallback).
//!
//! - [`TransferEngine::put_blocks`]: StartWriteCache → every part of every new block
//!   written (file parts in one batched call; pool parts per node in batches, several
//!   nodes at once, a thread each)
//!   → FinishWriteCache with the blocks whose every part was written.
//! - [`TransferEngine::get_blocks`]: one lookup (the fast path when up) → every part of
//!   every hit read into the caller's buffers; a part that cannot be read makes its block a
//!   miss, never a hit with wrong bytes.
//!
//! Blocks in device memory (GPU) go through a [`Device`]'s staging ring
//! ([`TransferEngine::put_device_blocks`] / [`TransferEngine::get_device_blocks`], see
//! `staged`), with the same sessions, outcomes and checksums.
//!
//! Zero-copy: memory the caller registers ([`TransferEngine::register_memory`]) is moved
//! by the NIC straight from and into the caller's buffers on soft-TCP and verbs; other
//! buffers go through the link's staging buffer. Cancel safety: a call never returns while
//! a transfer it posted may still touch the caller's buffers — a link that fails or times
//! out is torn down (its transfers stopped) before the call returns.
//!
//! Every block's outcome names the path its bytes took ([`TransferPath`]), so no fallback
//! is silent. A pool part is read only from the node incarnation (`range_id`) it was
//! placed on: a node that restarted or was declared dead answers nothing for it.
//!
//! Integrity: a put sends the xxh3-64 of every part it wrote with FinishWriteCache (kvcm's
//! `LocationSpec.checksum` extension, outside the block's bytes, which stay exactly what
//! reference connectors read); a get verifies every part that has one. A part whose bytes
//! do not match makes its block a miss, and the block is removed (RemoveCache) so no later
//! lookup returns it. Soft-shm copies hash the bytes as they copy them (`shm_copy`); other
//! paths hash beside or after the transfer.

mod caller_memory;
#[cfg(feature = "cuda")]
mod cuda;
mod device;
mod directory;
mod pool_link;
mod route;
mod run_keys;
mod shm_copy;
mod staged;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use kvcm::proto::meta;
use kvcm_data::{FileIo, FileIoConfig, IoPath, ReadOp, WriteOp};

use self::caller_memory::CallerMemory;
#[cfg(feature = "cuda")]
pub use self::cuda::{cuda_present, CudaDevice};
pub use self::device::{Device, DeviceRange, HostStaging};
use self::directory::Directory;
use self::pool_link::{Moved, PoolLink};
use self::route::{target_of, FilePolicy, Target};
use crate::{Client, ClientConfig, ClientError, Wire};

/// How the engine moves bytes.
#[derive(Debug, Clone)]
pub struct TransferConfig {
    /// The wire to pool nodes: `Shm` on their host, `Tcp` anywhere, `Verbs` to nodes given
    /// an RDMA device.
    pub pool_wire: Wire,
    /// Registered staging bytes per pool node link (TCP and verbs transfers of buffers
    /// outside registered memory go through it): 4 KiB to 2 GiB.
    pub staging_bytes: usize,
    /// How long a pool node may take to answer before its transfers fail.
    pub timeout: Duration,
    /// The file tier's I/O.
    pub file_io: FileIoConfig,
    /// `write_timeout_seconds` of the engine's write sessions.
    pub write_timeout_seconds: i32,
    /// Whether puts send checksums of the parts they write (gets verify any they find).
    pub checksums: bool,
    /// Directories the file tier's blocks must lie under (the storages' mounts); empty
    /// allows any path outside the system directories. The server names every file an
    /// engine reads and writes: list the mounts so that no server can aim it elsewhere.
    pub file_roots: Vec<PathBuf>,
}

impl Default for TransferConfig {
    fn default() -> Self {
        TransferConfig {
            pool_wire: Wire::Tcp,
            staging_bytes: 16 << 20,
            timeout: Duration::from_secs(2),
            file_io: FileIoConfig::default(),
            write_timeout_seconds: 30,
            checksums: true,
            file_roots: Vec::new(),
        }
    }
}

/// The path one block's bytes took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferPath {
    /// A pool node over the soft provider's TCP wire (through the staging buffer).
    PoolSoftTcp,
    /// A pool node over the soft provider's TCP wire, zero-copy from or into memory the
    /// caller registered.
    PoolSoftTcpZeroCopy,
    /// A pool node over shared memory (direct copies).
    PoolSoftShm,
    /// A pool node over RDMA verbs (through the staging buffer).
    PoolVerbs,
    /// A pool node over RDMA verbs, zero-copy from or into memory the caller registered.
    PoolVerbsZeroCopy,
    /// The file tier, by this I/O path.
    File(IoPath),
}

impl std::fmt::Display for TransferPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TransferPath::PoolSoftTcp => f.write_str("pool over soft-tcp (staged)"),
            TransferPath::PoolSoftTcpZeroCopy => f.write_str("pool over soft-tcp (zero-copy)"),
            TransferPath::PoolSoftShm => f.write_str("pool over soft-shm (direct)"),
            TransferPath::PoolVerbs => f.write_str("pool over verbs (staged)"),
            TransferPath::PoolVerbsZeroCopy => f.write_str("pool over verbs (zero-copy)"),
            TransferPath::File(path) => write!(f, "file tier, {path}"),
        }
    }
}

/// What became of one block of a put.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutOutcome {
    /// Written and committed, by this path.
    Written(TransferPath),
    /// Already cached: nothing was written.
    Present,
    /// Not stored (the reason).
    Failed(String),
}

/// What became of one block of a get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GetOutcome {
    /// Every part was read into the buffers, by this path.
    Hit(TransferPath),
    /// Not cached (no reason) or not readable (the reason); the buffers hold nothing valid.
    Miss(Option<String>),
}

/// One part to move, as planned from its location: its block and spec, where it goes, its
/// length, the checksum the manager holds for its bytes (if any).
#[derive(Debug, Clone)]
struct Planned {
    block: usize,
    spec: usize,
    target: Target,
    len: usize,
    checksum: Option<u64>,
}

impl Planned {
    /// The part with its buffer.
    fn with<B>(&self, buffer: B) -> Part<B> {
        Part {
            block: self.block,
            spec: self.spec,
            target: self.target.clone(),
            buffer,
            checksum: self.checksum,
        }
    }
}

/// One part to move with its buffer.
struct Part<B> {
    block: usize,
    spec: usize,
    target: Target,
    buffer: B,
    checksum: Option<u64>,
}

/// A put between StartWriteCache and FinishWriteCache: per block (by request position) what
/// became of it and the checksums of its written parts.
struct PutSession {
    session_id: String,
    present: Vec<bool>,
    /// The blocks not present, in the order of the session's locations.
    absent: Vec<usize>,
    /// How many of them got a location.
    located: usize,
    failed: Vec<Option<String>>,
    written: Vec<Option<TransferPath>>,
    checksums: Vec<Vec<u64>>,
    /// Whether checksums are computed and sent.
    with_checksums: bool,
    planned: Vec<Planned>,
}

impl PutSession {
    /// Takes in the results of written parts, with the checksums of the `parts` computed
    /// already (as they were copied, or beside the writes); those of the other written parts
    /// are computed here.
    fn record(
        &mut self,
        parts: &[Part<&[u8]>],
        results: Vec<Result<TransferPath, String>>,
        mut sums: Vec<Option<u64>>,
    ) {
        if self.with_checksums {
            let written = (0..parts.len()).filter(|&i| results[i].is_ok());
            let unknown: Vec<usize> = written.clone().filter(|&i| sums[i].is_none()).collect();
            let buffers: Vec<&[u8]> = unknown.iter().map(|&i| parts[i].buffer).collect();
            for (&i, sum) in unknown.iter().zip(checksums_of(&buffers)) {
                sums[i] = Some(sum);
            }
            for i in written {
                let part = &parts[i];
                let block_sums = &mut self.checksums[part.block];
                block_sums.resize(block_sums.len().max(part.spec + 1), 0);
                block_sums[part.spec] = sums[i].unwrap_or_default();
            }
        }
        let failed = &mut self.failed;
        collect(parts, results, &mut self.written, |block, reason| {
            failed[block] = Some(reason)
        });
    }
}

/// A get between its lookup and its outcomes.
struct GetSession {
    outcomes: Vec<GetOutcome>,
    read: Vec<Option<TransferPath>>,
    failed: Vec<Option<String>>,
    corrupt: Vec<usize>,
    planned: Vec<Planned>,
}

impl GetSession {
    /// Takes in the results of read parts (verifying their checksums; `sums`: those the
    /// copies computed).
    fn record(
        &mut self,
        parts: &[Part<&mut [u8]>],
        mut results: Vec<Result<TransferPath, String>>,
        sums: &[Option<u64>],
    ) {
        let corrupt = verify(parts, &mut results, sums);
        self.take(parts, results, corrupt);
    }

    /// Takes in the results of read parts already verified, and the blocks found corrupt.
    fn take(
        &mut self,
        parts: &[Part<&mut [u8]>],
        results: Vec<Result<TransferPath, String>>,
        corrupt: Vec<usize>,
    ) {
        self.corrupt.extend(corrupt);
        let failed = &mut self.failed;
        collect(parts, results, &mut self.read, |block, reason| {
            failed[block] = Some(reason)
        });
    }
}

/// File roots must be absolute: a relative one would depend on the engine's working
/// directory.
fn check_file_roots(roots: &[PathBuf]) -> Result<(), ClientError> {
    match roots.iter().find(|root| !root.is_absolute()) {
        Some(root) => Err(ClientError::InvalidArgument(format!(
            "file root {root:?} is not an absolute path"
        ))),
        None => Ok(()),
    }
}

/// Fewest and most staging bytes per link: a chunk must hold bytes (an empty one never
/// advances), and one work request moves at most a chunk, whose length is 32 bits.
const STAGING_BYTES: std::ops::RangeInclusive<usize> = 4 << 10..=2 << 30;

fn check_staging_bytes(bytes: usize) -> Result<(), ClientError> {
    if STAGING_BYTES.contains(&bytes) {
        return Ok(());
    }
    Err(ClientError::InvalidArgument(format!(
        "staging_bytes {bytes} is outside {} to {}",
        STAGING_BYTES.start(),
        STAGING_BYTES.end()
    )))
}

/// The checksum of a part's bytes (xxh3-64, seed 0).
fn checksum_of(bytes: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(bytes)
}

/// The cores this process may run on (asked once: each answer reads the cgroup's files).
fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Bytes from which checksums are computed on several threads.
const PARALLEL_HASH_BYTES: usize = 4 << 20;
/// Least bytes of one wave of a get whose parts are verified while the next wave is read.
const VERIFY_WAVE_BYTES: usize = 8 << 20;
/// Most waves of one get.
const MAX_WAVES: usize = 4;

/// Whether a part's bytes (`bytes`) are hashed as the CPU copies them, so that no pass of
/// its own checks them: pool parts on soft-shm (`shm_copy`), and on TCP or verbs those
/// outside the caller's registered memory, which go through the link's staging buffer.
fn hashed_in_copy(wire: Wire, caller: &CallerMemory, target: &Target, bytes: &[u8]) -> bool {
    let staged = || {
        caller
            .containing(bytes.as_ptr() as u64, bytes.len())
            .is_none()
    };
    matches!(target, Target::Pool { .. }) && (wire == Wire::Shm || staged())
}

/// The lengths (in parts) of the waves a get reads `parts` in (`in_copy`: whether a part is
/// hashed as it is copied): whole blocks (parts are ordered by block), at least
/// [`VERIFY_WAVE_BYTES`] each, at most [`MAX_WAVES`]; one wave when no part has a checksum
/// to verify apart from its copy.
fn waves<B: AsRef<[u8]>>(parts: &[Part<B>], in_copy: impl Fn(&Part<B>) -> bool) -> Vec<usize> {
    let total: usize = parts.iter().map(|p| p.buffer.as_ref().len()).sum();
    let verified_apart = |p: &Part<B>| p.checksum.is_some() && !in_copy(p);
    if !parts.iter().any(verified_apart) || total < 2 * VERIFY_WAVE_BYTES {
        return vec![parts.len()];
    }
    let target = (total / MAX_WAVES).max(VERIFY_WAVE_BYTES);
    let mut waves = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, part) in parts.iter().enumerate() {
        bytes += part.buffer.as_ref().len();
        let block_ends = parts.get(i + 1).is_none_or(|next| next.block != part.block);
        if block_ends && (bytes >= target || i + 1 == parts.len()) {
            waves.push(i + 1 - start);
            (start, bytes) = (i + 1, 0);
        }
    }
    // A short tail after the last full wave joins it (at most `MAX_WAVES`).
    if waves.len() > MAX_WAVES {
        let tail = waves.pop().unwrap_or(0);
        if let Some(last) = waves.last_mut() {
            *last += tail;
        }
    }
    waves
}
/// Most threads hashing at once.
const HASH_THREADS: usize = 4;

/// The checksums of `buffers`, in order; large batches are spread over a few threads (a
/// checksum pass costs about as much as the copy it checks).
fn checksums_of(buffers: &[&[u8]]) -> Vec<u64> {
    let total: usize = buffers.iter().map(|b| b.len()).sum();
    let threads = cores().min(HASH_THREADS).min(buffers.len());
    if total < PARALLEL_HASH_BYTES || threads < 2 {
        return buffers.iter().map(|b| checksum_of(b)).collect();
    }
    let per_thread = buffers.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let hashing: Vec<_> = buffers
            .chunks(per_thread)
            .map(|chunk| scope.spawn(move || chunk.iter().map(|b| checksum_of(b)).collect()))
            .collect();
        hashing
            .into_iter()
            .flat_map(|thread: std::thread::ScopedJoinHandle<'_, Vec<u64>>| {
                thread
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    })
}

/// Moves blocks for one instance (one engine per thread: calls take `&mut self`).
pub struct TransferEngine {
    client: Client,
    config: TransferConfig,
    directory: Directory,
    links: HashMap<SocketAddr, PoolLink>,
    files: FileIo,
    caller: CallerMemory,
    /// Pool nodes whose link failed during the current put or get (not retried in it).
    failed_this_call: Vec<SocketAddr>,
    /// The caller's ranges offered to the file I/O (by start address): whether it took them.
    file_ranges: HashMap<u64, bool>,
    /// Why the file I/O last refused to register (or unregister) a caller's range.
    file_buffer_refused: Option<String>,
}

impl std::fmt::Debug for TransferEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransferEngine")
            .field("client", &self.client)
            .field("links", &self.links.len())
            .finish_non_exhaustive()
    }
}

impl TransferEngine {
    /// Connects the control-plane client and prepares the file I/O (pool links are made
    /// on first use).
    pub fn connect(client: ClientConfig, config: TransferConfig) -> Result<Self, ClientError> {
        let servers = client.servers.iter().map(|s| s.http).collect();
        let credentials = (client.tls.clone(), client.api_key.clone());
        let directory = Directory::new(servers, credentials, client.instance_id.clone());
        check_file_roots(&config.file_roots)?;
        check_staging_bytes(config.staging_bytes)?;
        Ok(TransferEngine {
            client: Client::connect(client)?,
            files: FileIo::new(config.file_io.clone()),
            directory,
            links: HashMap::new(),
            caller: CallerMemory::default(),
            failed_this_call: Vec::new(),
            file_ranges: HashMap::new(),
            file_buffer_refused: None,
            config,
        })
    }

    /// Registers `len` bytes at `addr` (an engine's KV buffers, pinned host memory) for
    /// zero-copy transfers: buffers of later puts and gets that lie inside it move between
    /// the NIC and these bytes directly on soft-TCP and verbs (reported as
    /// [`TransferPath::PoolSoftTcpZeroCopy`] / [`TransferPath::PoolVerbsZeroCopy`]); each
    /// pool link registers the range with its domain on first use. So does the file I/O's
    /// io_uring, the first time a file-tier block inside it moves: such blocks then move
    /// through registered buffers (where io_uring refuses, they move as before, and
    /// [`TransferEngine::file_buffers`] says why). Refused (nothing changes) for a null
    /// address, zero length, or a range overlapping one registered.
    ///
    /// # Safety
    /// Until [`TransferEngine::deregister_memory`] of `addr` returns or the engine is
    /// dropped, the bytes stay allocated and mapped to the same pages (no `munmap`,
    /// `mremap`, `MADV_DONTNEED` or `MAP_FIXED` over them: verbs and io_uring move data
    /// through the pages they pinned, not through what the addresses map later). The NIC reads or writes them only during a put or
    /// get whose buffers lie there (the borrow the call takes), never after it returns.
    /// Within a call, a zero-copy READ writes a get buffer through the registered address
    /// while the call holds its `&mut [u8]`; the call reads the buffer only after the READ
    /// completed (a completion orders the NIC's write before it), as DMA into a borrowed
    /// buffer always does (Miri's aliasing models would flag it).
    pub unsafe fn register_memory(&mut self, addr: *mut u8, len: usize) -> Result<(), ClientError> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.caller.add(addr, len) }.map_err(ClientError::InvalidArgument)
    }

    /// Forgets the range registered at `addr` (every link drops its registration); its
    /// bytes may be freed once this returns. Refused when no range starts at `addr`.
    pub fn deregister_memory(&mut self, addr: *const u8) -> Result<(), ClientError> {
        let base = addr as u64;
        if !self.caller.remove(base) {
            return Err(ClientError::InvalidArgument(format!(
                "no memory is registered at {addr:p}"
            )));
        }
        for link in self.links.values_mut() {
            link.forget(base);
        }
        if self.file_ranges.remove(&base) == Some(true) {
            if let Err(error) = self.files.deregister_buffer(addr) {
                self.file_buffer_refused = Some(error.to_string());
            }
        }
        Ok(())
    }

    /// How many registered ranges the file I/O moves blocks through (io_uring registered
    /// buffers: [`kvcm_data::IoPath::UringDirectRegistered`]), and why the last one it
    /// refused was refused (psync backend, RLIMIT_MEMLOCK, an old kernel).
    pub fn file_buffers(&self) -> (usize, Option<&str>) {
        (
            self.files.registered_buffers(),
            self.file_buffer_refused.as_deref(),
        )
    }

    /// Offers to the file I/O each registered range holding one of `buffers` (address,
    /// length) that it was not offered yet: on first use, as pool links register a range
    /// with their domain, so that an engine not using the file tier pins nothing for it.
    fn offer_to_files(&mut self, buffers: impl Iterator<Item = (u64, usize)>) {
        for (addr, len) in buffers {
            let Some(range) = self.caller.containing(addr, len) else {
                continue;
            };
            let (base, size) = (
                kvcm_transport::Memory::addr(range),
                kvcm_transport::Memory::len(range),
            );
            if self.file_ranges.contains_key(&base) {
                continue;
            }
            // SAFETY: `register_memory`'s contract keeps the range allocated and mapped
            // until `deregister_memory` (which unregisters it from the file I/O first) or
            // the engine's drop (the file I/O drops with it).
            let offered = unsafe { self.files.register_buffer(base as *mut u8, size) };
            if let Err(refused) = &offered {
                self.file_buffer_refused = Some(refused.to_string());
            }
            self.file_ranges.insert(base, offered.is_ok());
        }
    }

    /// Replaces [`TransferConfig::file_roots`] for later puts and gets: each root must be an
    /// absolute path (refused, nothing changed, otherwise); none allows any path outside the
    /// system directories.
    pub fn set_file_roots(&mut self, roots: Vec<PathBuf>) -> Result<(), ClientError> {
        check_file_roots(&roots)?;
        self.config.file_roots = roots;
        Ok(())
    }

    /// The control-plane client (lookups, removals).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Which file I/O backend runs, and why it fell back if it did.
    pub fn file_backend(&self) -> (kvcm_data::IoBackend, Option<&str>) {
        self.files.backend()
    }

    /// Stores `blocks[i]` (one buffer per spec, in the instance's spec order) under
    /// `keys[i]`: blocks already cached are left alone; the others are written where the
    /// manager places them and committed when every part was written.
    pub fn put_blocks(
        &mut self,
        keys: &[i64],
        blocks: &[Vec<&[u8]>],
    ) -> Result<Vec<PutOutcome>, ClientError> {
        if keys.len() != blocks.len() {
            return Err(ClientError::InvalidArgument(format!(
                "{} keys for {} blocks",
                keys.len(),
                blocks.len()
            )));
        }
        let sizes: Vec<Vec<usize>> = blocks
            .iter()
            .map(|parts| parts.iter().map(|p| p.len()).collect())
            .collect();
        let mut put = self.begin_put(keys, &sizes)?;
        let parts: Vec<Part<&[u8]>> = put
            .planned
            .iter()
            .map(|planned| planned.with(blocks[planned.block][planned.spec]))
            .collect();
        self.write_recorded(&mut put, &parts);
        self.finish_put(put)
    }

    /// Writes `parts` and records the results in `put`. With checksums on, parts the CPU
    /// copies to pool nodes are hashed as they are copied ([`hashed_in_copy`]); the others,
    /// when they hold at least [`PARALLEL_HASH_BYTES`], on other threads while the batch is
    /// written (both only read the caller's bytes), so the hash pass costs no time of its
    /// own where a core is free.
    fn write_recorded(&mut self, put: &mut PutSession, parts: &[Part<&[u8]>]) {
        let hash = put.with_checksums;
        let (wire, caller) = (self.config.pool_wire, &self.caller);
        let in_copy = |part: &Part<&[u8]>| hashed_in_copy(wire, caller, &part.target, part.buffer);
        let apart: Vec<usize> = (0..parts.len())
            .filter(|&i| hash && !in_copy(&parts[i]))
            .collect();
        let buffers: Vec<&[u8]> = apart.iter().map(|&i| parts[i].buffer).collect();
        let total: usize = buffers.iter().map(|b| b.len()).sum();
        if total < PARALLEL_HASH_BYTES {
            let (results, sums) = self.write_parts(parts, hash);
            return put.record(parts, results, sums);
        }
        let ((results, mut sums), apart_sums) = std::thread::scope(|scope| {
            let hashing = scope.spawn(|| checksums_of(&buffers));
            let written = self.write_parts(parts, hash);
            let apart_sums = hashing
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (written, apart_sums)
        });
        for (&i, sum) in apart.iter().zip(apart_sums) {
            sums[i] = Some(sum);
        }
        put.record(parts, results, sums);
    }

    /// StartWriteCache for `keys` (`sizes[i]`: the bytes of each part of block `i`) and the
    /// plan of every part to write.
    fn begin_put(&mut self, keys: &[i64], sizes: &[Vec<usize>]) -> Result<PutSession, ClientError> {
        self.failed_this_call.clear();
        let start = self.client.start_write(meta::StartWriteCacheRequest {
            block_keys: keys.to_vec(),
            write_timeout_seconds: self.config.write_timeout_seconds,
            ..Default::default()
        })?;
        let present = presence(start.block_mask.as_ref(), keys.len());
        let absent: Vec<usize> = (0..keys.len()).filter(|&i| !present[i]).collect();
        let mut put = PutSession {
            session_id: start.write_session_id,
            failed: vec![None; keys.len()],
            written: vec![None; keys.len()],
            checksums: vec![Vec::new(); keys.len()],
            with_checksums: self.config.checksums,
            located: absent.len().min(start.locations.len()),
            planned: Vec::new(),
            present,
            absent,
        };
        let mut files = FilePolicy::new(&self.config.file_roots);
        for (position, &block) in put.absent.iter().enumerate() {
            let Some(location) = start.locations.get(position) else {
                put.failed[block] = Some("the server gave no location".into());
                continue;
            };
            match plan(location, &sizes[block], block, &mut files) {
                Ok(planned) => put.planned.extend(planned),
                Err(reason) => put.failed[block] = Some(reason),
            }
        }
        Ok(put)
    }

    /// FinishWriteCache with the blocks whose every part was written (and their checksums);
    /// the outcome of every block.
    fn finish_put(&mut self, mut put: PutSession) -> Result<Vec<PutOutcome>, ClientError> {
        let committed = |block: usize| put.failed[block].is_none() && put.written[block].is_some();
        let blocks = &put.absent[..put.located];
        let success: Vec<bool> = blocks.iter().map(|&block| committed(block)).collect();
        let locations = if put.with_checksums {
            checksum_locations(blocks, &success, &put.checksums)
        } else {
            Vec::new()
        };
        self.client.finish_write(meta::FinishWriteCacheRequest {
            write_session_id: std::mem::take(&mut put.session_id),
            success_blocks: Some(meta::BlockMask {
                info: Some(meta::block_mask::Info::BoolMasks(meta::BoolMasksType {
                    values: success,
                })),
            }),
            locations,
            ..Default::default()
        })?;
        Ok((0..put.present.len())
            .map(|block| {
                match (
                    put.present[block],
                    put.failed[block].take(),
                    put.written[block],
                ) {
                    (true, ..) => PutOutcome::Present,
                    (false, Some(reason), _) => PutOutcome::Failed(reason),
                    (false, None, Some(path)) => PutOutcome::Written(path),
                    (false, None, None) => PutOutcome::Failed("nothing to write".into()),
                }
            })
            .collect())
    }

    /// Reads the cached blocks of `keys` into `blocks[i]` (one buffer per spec, sized as
    /// the specs); a block that is not cached or cannot be read whole is a miss.
    pub fn get_blocks(
        &mut self,
        keys: &[i64],
        blocks: &mut [Vec<&mut [u8]>],
    ) -> Result<Vec<GetOutcome>, ClientError> {
        if keys.len() != blocks.len() {
            return Err(ClientError::InvalidArgument(format!(
                "{} keys for {} blocks",
                keys.len(),
                blocks.len()
            )));
        }
        let sizes: Vec<Vec<usize>> = blocks
            .iter()
            .map(|parts| parts.iter().map(|p| p.len()).collect())
            .collect();
        let mut get = self.begin_get(keys, &sizes)?;
        let mut buffers: Vec<Vec<Option<&mut [u8]>>> = blocks
            .iter_mut()
            .map(|parts| parts.iter_mut().map(|b| Some(&mut **b)).collect())
            .collect();
        let mut parts: Vec<Part<&mut [u8]>> = Vec::with_capacity(get.planned.len());
        for planned in &get.planned {
            if let Some(buffer) = buffers[planned.block][planned.spec].take() {
                parts.push(planned.with(buffer));
            }
        }
        self.read_recorded(&mut get, &mut parts);
        Ok(self.finish_get(keys, get))
    }

    /// Reads `parts` and records the verified results in `get`. A batch of at least two
    /// [`VERIFY_WAVE_BYTES`] is read in waves of whole blocks, each verified on other
    /// threads while the next one is read, so the hash pass overlaps the transfers.
    fn read_recorded(&mut self, get: &mut GetSession, parts: &mut [Part<&mut [u8]>]) {
        let (wire, caller) = (self.config.pool_wire, &self.caller);
        let waves = waves(parts, |p| hashed_in_copy(wire, caller, &p.target, p.buffer));
        if waves.len() < 2 {
            let (results, sums) = self.read_parts(parts);
            return get.record(parts, results, &sums);
        }
        let verified = std::thread::scope(|scope| {
            let mut verifying = Vec::with_capacity(waves.len());
            let mut rest = &mut *parts;
            for wave_len in waves {
                let (wave, after) = rest.split_at_mut(wave_len);
                rest = after;
                let (mut results, sums) = self.read_parts(wave);
                let wave = &*wave;
                verifying.push(scope.spawn(move || {
                    let corrupt = verify(wave, &mut results, &sums);
                    (wave, results, corrupt)
                }));
            }
            verifying
                .into_iter()
                .map(|thread| {
                    thread
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect::<Vec<_>>()
        });
        for (wave, results, corrupt) in verified {
            get.take(wave, results, corrupt);
        }
    }

    /// The lookup of `keys` (`sizes[i]`: the bytes of each part of block `i`) and the plan
    /// of every part to read.
    fn begin_get(&mut self, keys: &[i64], sizes: &[Vec<usize>]) -> Result<GetSession, ClientError> {
        self.failed_this_call.clear();
        let locations = self.client.batch_get(keys)?;
        let mut get = GetSession {
            outcomes: vec![GetOutcome::Miss(None); keys.len()],
            read: vec![None; keys.len()],
            failed: vec![None; keys.len()],
            corrupt: Vec::new(),
            planned: Vec::new(),
        };
        let mut files = FilePolicy::new(&self.config.file_roots);
        for (block, location) in locations.iter().enumerate().take(keys.len()) {
            if is_miss(location) {
                continue;
            }
            match plan(location, &sizes[block], block, &mut files) {
                Ok(planned) => get.planned.extend(planned),
                Err(reason) => get.outcomes[block] = GetOutcome::Miss(Some(reason)),
            }
        }
        Ok(get)
    }

    /// Removes the corrupt blocks and returns every block's outcome.
    fn finish_get(&self, keys: &[i64], mut get: GetSession) -> Vec<GetOutcome> {
        self.remove_corrupt(keys, &get.corrupt, &mut get.failed);
        for block in 0..keys.len() {
            if let Some(reason) = get.failed[block].take() {
                get.outcomes[block] = GetOutcome::Miss(Some(reason));
            } else if let Some(path) = get.read[block] {
                get.outcomes[block] = GetOutcome::Hit(path);
            }
        }
        get.outcomes
    }

    /// Removes the blocks whose bytes failed their checksum, so no later lookup returns
    /// them; a failed removal is added to the block's reason.
    fn remove_corrupt(&self, keys: &[i64], corrupt: &[usize], failed: &mut [Option<String>]) {
        if corrupt.is_empty() {
            return;
        }
        let removed = self.client.remove(meta::RemoveCacheRequest {
            block_keys: corrupt.iter().map(|&block| keys[block]).collect(),
            ..Default::default()
        });
        if let Err(error) = removed {
            for &block in corrupt {
                if let Some(reason) = failed[block].as_mut() {
                    reason.push_str(&format!("; removing it failed: {error}"));
                }
            }
        }
    }

    /// Writes every part; one result per part, and with `hash` the checksums of the parts
    /// whose copies computed them.
    fn write_parts(&mut self, parts: &[Part<&[u8]>], hash: bool) -> Moves {
        let mut results = not_attempted(parts.len());
        let places: Vec<(&Target, usize)> =
            parts.iter().map(|p| (&p.target, p.buffer.len())).collect();
        let groups = self.pool_groups(&places, &mut results);
        let mut file_ops = Vec::new();
        let mut file_parts = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            if let Target::File { path, offset } = &part.target {
                file_ops.push(WriteOp {
                    path,
                    offset: *offset,
                    data: part.buffer,
                });
                file_parts.push(i);
            }
        }
        self.offer_to_files(
            file_ops
                .iter()
                .map(|op| (op.data.as_ptr() as u64, op.data.len())),
        );
        for (i, outcome) in file_parts.iter().zip(self.files.write_blocks(&file_ops)) {
            results[*i] = outcome.map(TransferPath::File).map_err(|e| e.to_string());
        }
        let jobs: Vec<(SocketAddr, NodeOps<&[u8]>)> = groups
            .iter()
            .map(|(endpoint, members)| {
                let ops = members
                    .iter()
                    .map(|&i| (offset_of(&parts[i].target), parts[i].buffer))
                    .collect();
                (*endpoint, ops)
            })
            .collect();
        let caller = &self.caller;
        let answers = across_links(&mut self.links, jobs, |link, ops| {
            link.write(&ops, caller, hash)
        });
        let sums = self.record_links(&groups, answers, &mut results);
        (results, sums)
    }

    /// Records the answers of the pool nodes' transfers (one per group) as their parts'
    /// results (and the checksums their copies computed, which it returns), then tears down
    /// every link that failed. A transfer that found no link or panicked (`None`) tears
    /// down all links: its work requests may still be posted.
    fn record_links(
        &mut self,
        groups: &[(SocketAddr, Vec<usize>)],
        answers: Vec<Option<Result<Vec<Moved>, String>>>,
        results: &mut [Result<TransferPath, String>],
    ) -> Vec<Option<u64>> {
        let mut unsettled = false;
        let mut sums = vec![None; results.len()];
        for ((_, members), done) in groups.iter().zip(answers) {
            let done = done.unwrap_or_else(|| {
                unsettled = true;
                Err("the transfer to this pool node was abandoned".into())
            });
            record_pool(members, done, self.config.pool_wire, results, &mut sums);
        }
        if unsettled {
            let endpoints = self.links.keys().copied();
            self.failed_this_call.extend(endpoints);
            self.links.clear();
        }
        self.drop_broken_links();
        sums
    }

    /// Tears down the links whose transfers failed or timed out, so that none of their
    /// work requests outlives the call that posted them (cancel safety for the caller's
    /// buffers).
    fn drop_broken_links(&mut self) {
        let failed = &mut self.failed_this_call;
        self.links.retain(|endpoint, link| {
            if link.is_broken() {
                failed.push(*endpoint);
            }
            !link.is_broken()
        });
    }

    /// Reads every part; one result per part, and the checksums of the parts whose copies
    /// computed them (asked for when some part has a checksum to verify).
    fn read_parts(&mut self, parts: &mut [Part<&mut [u8]>]) -> Moves {
        let hash = parts.iter().any(|part| part.checksum.is_some());
        let mut results = not_attempted(parts.len());
        let places: Vec<(&Target, usize)> =
            parts.iter().map(|p| (&p.target, p.buffer.len())).collect();
        let groups = self.pool_groups(&places, &mut results);
        let mut file_ops = Vec::new();
        let mut file_parts = Vec::new();
        let mut pool_buffers: HashMap<usize, (u64, &mut [u8])> = HashMap::new();
        for (i, part) in parts.iter_mut().enumerate() {
            match &part.target {
                Target::File { path, offset } => {
                    file_ops.push(ReadOp {
                        path,
                        offset: *offset,
                        buf: &mut *part.buffer,
                    });
                    file_parts.push(i);
                }
                Target::Pool { offset, .. } => {
                    pool_buffers.insert(i, (*offset, &mut *part.buffer));
                }
            }
        }
        self.offer_to_files(
            file_ops
                .iter()
                .map(|op| (op.buf.as_ptr() as u64, op.buf.len())),
        );
        for (i, outcome) in file_parts.iter().zip(self.files.read_blocks(&mut file_ops)) {
            results[*i] = outcome.map(TransferPath::File).map_err(|e| e.to_string());
        }
        let jobs: Vec<(SocketAddr, NodeOps<&mut [u8]>)> = groups
            .iter()
            .map(|(endpoint, members)| {
                let ops = members
                    .iter()
                    .filter_map(|i| pool_buffers.remove(i))
                    .collect();
                (*endpoint, ops)
            })
            .collect();
        let caller = &self.caller;
        let answers = across_links(&mut self.links, jobs, |link, mut ops| {
            link.read(&mut ops, caller, hash)
        });
        let sums = self.record_links(&groups, answers, &mut results);
        (results, sums)
    }

    /// Groups the pool parts among `places` (target, length) by node endpoint, connecting
    /// links on the incarnation each part was placed on (and, on nodes that isolate
    /// instances, learning the runs the parts lie in); a part whose node or incarnation
    /// is gone, or that lies outside the region (or any run of the instance), gets its
    /// error in `results` and no group.
    fn pool_groups(
        &mut self,
        places: &[(&Target, usize)],
        results: &mut [Result<TransferPath, String>],
    ) -> Vec<(SocketAddr, Vec<usize>)> {
        let placed = self.pool_endpoints(places, results);
        let refusals = self.learn_runs(&placed);
        let mut groups: Vec<(SocketAddr, Vec<usize>)> = Vec::new();
        for (i, endpoint, (offset, len)) in placed {
            if !self.links[&endpoint].in_bounds(offset, len) {
                results[i] = Err(match refusals.get(&endpoint) {
                    Some(why) => why.clone(),
                    None => format!(
                        "offset {offset} is outside the node's region or its runs of this instance"
                    ),
                });
                continue;
            }
            match groups.iter_mut().find(|(e, _)| *e == endpoint) {
                Some((_, members)) => members.push(i),
                None => groups.push((endpoint, vec![i])),
            }
        }
        groups
    }

    /// Learns, from each isolating node at once (a thread per node when several must be
    /// asked), the runs holding the `placed` parts (`pool_endpoints`) its link does not
    /// know; returns why a node could not be asked, by endpoint.
    fn learn_runs(
        &mut self,
        placed: &[(usize, SocketAddr, (u64, usize))],
    ) -> HashMap<SocketAddr, String> {
        let jobs: Vec<(SocketAddr, Vec<u64>)> = self
            .links
            .iter()
            .map(|(endpoint, link)| {
                let offsets = placed.iter().filter(|(_, e, _)| e == endpoint);
                let unknown = link.unknown_runs(offsets.map(|(_, _, (offset, _))| *offset));
                (*endpoint, unknown)
            })
            .filter(|(_, unknown)| !unknown.is_empty())
            .collect();
        let endpoints: Vec<SocketAddr> = jobs.iter().map(|(endpoint, _)| *endpoint).collect();
        let answers = across_links(&mut self.links, jobs, |link, unknown| {
            link.learn_runs(unknown)
        });
        let failed = endpoints
            .into_iter()
            .zip(answers)
            .filter_map(|(endpoint, answer)| {
                let why = match answer {
                    Some(Ok(())) => return None,
                    Some(Err(why)) => why,
                    None => format!("learning the run keys of pool node {endpoint} failed"),
                };
                Some((endpoint, why))
            });
        failed.collect()
    }

    /// The node endpoint of each pool part among `places` (target, length), its link
    /// connected: `(part, endpoint, (offset, length))`; a part whose node or incarnation is
    /// gone gets its error in `results`.
    fn pool_endpoints(
        &mut self,
        places: &[(&Target, usize)],
        results: &mut [Result<TransferPath, String>],
    ) -> Vec<(usize, SocketAddr, (u64, usize))> {
        let mut placed = Vec::new();
        // One resolution per node incarnation and call: a dead node fails its parts at once,
        // a live one is looked up once for all its parts.
        let mut resolved: HashMap<(&str, &str, u64), Result<SocketAddr, String>> = HashMap::new();
        for (i, (target, len)) in places.iter().enumerate() {
            let Target::Pool {
                storage,
                node_id,
                range_id,
                offset,
            } = target
            else {
                continue;
            };
            let node = (storage.as_str(), node_id.as_str(), *range_id);
            let endpoint = match resolved.get(&node) {
                Some(known) => known.clone(),
                None => {
                    let found = self.link_for(storage, node_id, *range_id);
                    resolved.insert(node, found.clone());
                    found
                }
            };
            match endpoint {
                Ok(endpoint) => placed.push((i, endpoint, (*offset, *len))),
                Err(reason) => results[i] = Err(reason),
            }
        }
        // Two incarnations at one endpoint in one call (a node restarted under another id
        // before the server declared the old one dead): the link serves the one connected
        // last, so the parts placed on the other fail here rather than move bytes at their
        // offsets in the wrong region.
        placed.retain(|&(i, endpoint, _)| {
            let Target::Pool {
                range_id, node_id, ..
            } = places[i].0
            else {
                return false;
            };
            let served = self
                .links
                .get(&endpoint)
                .is_some_and(|link| link.info.range_id == *range_id);
            if !served {
                results[i] = Err(format!(
                    "pool node {node_id} at {endpoint} serves another incarnation now"
                ));
            }
            served
        });
        placed
    }

    /// The endpoint of a live link to incarnation `range_id` of the node (connected now if
    /// needed).
    fn link_for(
        &mut self,
        storage: &str,
        node_id: &str,
        range_id: u64,
    ) -> Result<SocketAddr, String> {
        let place = self.directory.place(storage, node_id, range_id)?;
        // A node that failed once in this call (its waves or chunks come one after
        // another) is not tried again until the next call: a hung node costs one timeout.
        if self.failed_this_call.contains(&place.endpoint) {
            return Err(format!("pool node {node_id} failed earlier in this call"));
        }
        let usable = self
            .links
            .get_mut(&place.endpoint)
            .filter(|l| !l.is_broken() && l.info.range_id == range_id);
        if let Some(link) = usable {
            link.renew_ticket(place.ticket);
        } else {
            self.links.remove(&place.endpoint);
            let link = PoolLink::connect(
                place.endpoint,
                (self.config.pool_wire, place.ticket.as_ref()),
                self.config.staging_bytes,
                self.config.timeout,
            )
            .inspect_err(|_| self.failed_this_call.push(place.endpoint))?;
            // The link is kept whichever incarnation it reached: parts placed on that one
            // (by an earlier resolution of this call) still use it.
            let serves = link.info.range_id;
            self.links.insert(place.endpoint, link);
            if serves != range_id {
                return Err(format!("pool node {node_id} is on another incarnation now"));
            }
        }
        Ok(place.endpoint)
    }
}

fn not_attempted(count: usize) -> Vec<Result<TransferPath, String>> {
    (0..count)
        .map(|_| Err("not attempted".to_string()))
        .collect()
}

/// The operations of one pool node: a buffer per region offset.
type NodeOps<B> = Vec<(u64, B)>;

/// What moving a batch of parts came to: per part, the path its bytes took (or why they
/// did not move) and the checksum of its bytes where the copy computed it.
type Moves = (Vec<Result<TransferPath, String>>, Vec<Option<u64>>);

/// Runs `transfer` with each job's link (`jobs`: one per node endpoint) and returns the
/// answers in job order. Several nodes are served at once, one thread each: a batch spread
/// over N nodes waits for the slowest node, not for the sum of them. `None` for a job
/// whose link is gone (two incarnations met at one endpoint in this call, and the later
/// replaced the link) or whose transfer panicked: the caller then tears the links down.
fn across_links<J: Send, R: Send>(
    links: &mut HashMap<SocketAddr, PoolLink>,
    jobs: Vec<(SocketAddr, J)>,
    transfer: impl Fn(&mut PoolLink, J) -> R + Sync,
) -> Vec<Option<R>> {
    let count = jobs.len();
    let mut jobs: Vec<Option<(SocketAddr, J)>> = jobs.into_iter().map(Some).collect();
    let paired: Vec<(usize, &mut PoolLink, J)> = links
        .iter_mut()
        .filter_map(|(endpoint, link)| {
            let index = jobs
                .iter()
                .position(|job| job.as_ref().is_some_and(|(at, _)| at == endpoint))?;
            let (_, job) = jobs[index].take()?;
            Some((index, link, job))
        })
        .collect();
    let guarded = |link: &mut PoolLink, job: J| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| transfer(link, job))).ok()
    };
    let mut answers: Vec<Option<R>> = (0..count).map(|_| None).collect();
    if paired.len() < 2 {
        for (index, link, job) in paired {
            answers[index] = guarded(link, job);
        }
        return answers;
    }
    let guarded = &guarded;
    std::thread::scope(|scope| {
        let running: Vec<_> = paired
            .into_iter()
            .map(|(index, link, job)| (index, scope.spawn(move || guarded(link, job))))
            .collect();
        for (index, thread) in running {
            answers[index] = thread.join().ok().flatten();
        }
    });
    answers
}

/// The path of a pool transfer on `wire`, zero-copy or not.
fn pool_path(wire: Wire, zero_copy: bool) -> TransferPath {
    match (wire, zero_copy) {
        (Wire::Tcp, false) => TransferPath::PoolSoftTcp,
        (Wire::Tcp, true) => TransferPath::PoolSoftTcpZeroCopy,
        (Wire::Shm, _) => TransferPath::PoolSoftShm,
        (Wire::Verbs, false) => TransferPath::PoolVerbs,
        (Wire::Verbs, true) => TransferPath::PoolVerbsZeroCopy,
    }
}

/// Records a pool link's answer for the parts `members` (its operations, in order): each
/// part's path and the checksum its copy computed, or the link's error for all.
fn record_pool(
    members: &[usize],
    done: Result<Vec<Moved>, String>,
    wire: Wire,
    results: &mut [Result<TransferPath, String>],
    sums: &mut [Option<u64>],
) {
    for (k, &i) in members.iter().enumerate() {
        results[i] = match &done {
            Ok(moved) => {
                sums[i] = moved[k].checksum;
                Ok(pool_path(wire, moved[k].zero_copy))
            }
            Err(reason) => Err(reason.clone()),
        };
    }
}

fn offset_of(target: &Target) -> u64 {
    match target {
        Target::Pool { offset, .. } | Target::File { offset, .. } => *offset,
    }
}

/// For each of `count` requested keys: whether StartWriteCache said it is present.
fn presence(mask: Option<&meta::BlockMask>, count: usize) -> Vec<bool> {
    match mask.and_then(|m| m.info.as_ref()) {
        Some(meta::block_mask::Info::Offset(offset)) => (0..count)
            .map(|i| (i as i64) < i64::from(*offset))
            .collect(),
        Some(meta::block_mask::Info::BoolMasks(masks)) => (0..count)
            .map(|i| masks.values.get(i).copied().unwrap_or(false))
            .collect(),
        None => vec![false; count],
    }
}

/// Whether a looked-up location is the reference's miss placeholder.
fn is_miss(location: &meta::CacheLocation) -> bool {
    location.location_specs.is_empty() || location.location_specs.iter().all(|s| s.uri.is_empty())
}

/// The parts of one block: one per location spec, with buffers of `sizes` (as many as
/// specs, each the size its URI says).
fn plan(
    location: &meta::CacheLocation,
    sizes: &[usize],
    block: usize,
    files: &mut FilePolicy,
) -> Result<Vec<Planned>, String> {
    if sizes.len() != location.location_specs.len() {
        return Err(format!(
            "{} buffers for a location of {} specs",
            sizes.len(),
            location.location_specs.len()
        ));
    }
    location
        .location_specs
        .iter()
        .zip(sizes)
        .enumerate()
        .map(|(spec, (located, &len))| {
            Ok(Planned {
                block,
                spec,
                target: target_of(&located.uri, len, files)?,
                len,
                checksum: located.checksum,
            })
        })
        .collect()
}

/// Folds per-part results into per-block ones: `done[block]` gets the path of its parts
/// when all succeeded; `failed(block, reason)` is called for a block with a failed part.
fn collect<B>(
    parts: &[Part<B>],
    results: Vec<Result<TransferPath, String>>,
    done: &mut [Option<TransferPath>],
    mut failed: impl FnMut(usize, String),
) {
    let mut broken = vec![false; done.len()];
    for (part, result) in parts.iter().zip(results) {
        match result {
            Ok(path) if !broken[part.block] => done[part.block] = Some(path),
            Ok(_) => {}
            Err(reason) => {
                broken[part.block] = true;
                done[part.block] = None;
                failed(part.block, reason);
            }
        }
    }
}

/// FinishWriteCache's `locations` carrying checksums: one per location of the session
/// (`blocks[i]` is the block of location `i`), the checksum of every part of a committed
/// block and nothing for the others. Names and URIs are left out: the server matches by
/// position.
fn checksum_locations(
    blocks: &[usize],
    success: &[bool],
    checksums: &[Vec<u64>],
) -> Vec<meta::CacheLocation> {
    blocks
        .iter()
        .zip(success)
        .map(|(&block, &committed)| meta::CacheLocation {
            location_specs: if committed {
                let spec = |sum: &u64| meta::LocationSpec {
                    checksum: Some(*sum),
                    ..Default::default()
                };
                checksums[block].iter().map(spec).collect()
            } else {
                Vec::new()
            },
            ..Default::default()
        })
        .collect()
}

/// Checks every read part that has a checksum (`sums`: those its copy computed, the others
/// are computed here); a mismatch becomes that part's error. Returns the blocks found
/// corrupt.
fn verify(
    parts: &[Part<&mut [u8]>],
    results: &mut [Result<TransferPath, String>],
    sums: &[Option<u64>],
) -> Vec<usize> {
    // The parts read whole that have a checksum, with it.
    let checked: Vec<(usize, u64)> = (0..parts.len())
        .filter(|&i| results[i].is_ok())
        .filter_map(|i| parts[i].checksum.map(|expected| (i, expected)))
        .collect();
    let unknown: Vec<usize> = checked
        .iter()
        .map(|&(i, _)| i)
        .filter(|&i| sums[i].is_none())
        .collect();
    let buffers: Vec<&[u8]> = unknown.iter().map(|&i| &*parts[i].buffer).collect();
    let mut found = sums.to_vec();
    for (&i, sum) in unknown.iter().zip(checksums_of(&buffers)) {
        found[i] = Some(sum);
    }
    let mut corrupt = Vec::new();
    for &(i, expected) in &checked {
        let found = found[i].unwrap_or_default();
        let (part, result) = (&parts[i], &mut results[i]);
        if found != expected {
            *result = Err(format!(
                "the bytes do not match their checksum ({found:#018x}, written {expected:#018x}); the block was removed"
            ));
            if corrupt.last() != Some(&part.block) {
                corrupt.push(part.block);
            }
        }
    }
    corrupt
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parts of `blocks` (bytes per part, parts per block), with checksums or not.
    fn parts_of(blocks: &[(usize, usize)], checksum: Option<u64>) -> Vec<Part<Vec<u8>>> {
        let mut parts = Vec::new();
        for (block, &(bytes, count)) in blocks.iter().enumerate() {
            for spec in 0..count {
                parts.push(Part {
                    block,
                    spec,
                    target: Target::File {
                        path: "f".into(),
                        offset: 0,
                    },
                    buffer: vec![0u8; bytes],
                    checksum,
                });
            }
        }
        parts
    }

    #[test]
    fn waves_hold_whole_blocks_of_at_least_the_wave_size_and_at_most_four() {
        const MIB: usize = 1 << 20;
        let apart = |_: &Part<Vec<u8>>| false;
        // 64 blocks of 4 parts of 1 MiB (256 MiB): 4 waves of 16 blocks (64 parts).
        assert_eq!(waves(&parts_of(&[(MIB, 4); 64], Some(1)), apart), [64; 4]);
        // 9 blocks of one 3 MiB part: waves of at least 8 MiB end at block ends.
        assert_eq!(
            waves(&parts_of(&[(3 * MIB, 1); 9], Some(1)), apart),
            [3, 3, 3]
        );
        // Four blocks of exactly a quarter each and a 3-byte tail: the tail joins the last
        // wave (at most four).
        let mut with_tail = vec![(8 * MIB, 1); 4];
        with_tail.push((3, 1));
        assert_eq!(waves(&parts_of(&with_tail, Some(1)), apart), [1, 1, 1, 2]);
        // Blocks of 2 parts of 5 MiB: a wave never splits a block.
        assert_eq!(
            waves(&parts_of(&[(5 * MIB, 2); 3], Some(1)), apart),
            [2, 2, 2]
        );
        // Under two waves' bytes, or nothing to verify: one wave.
        assert_eq!(waves(&parts_of(&[(MIB, 4); 3], Some(1)), apart), [12]);
        assert_eq!(waves(&parts_of(&[(MIB, 4); 64], None), apart), [256]);
        assert_eq!(waves::<Vec<u8>>(&[], apart), [0]);
        // Pool parts the CPU copies (on soft-shm; on TCP, outside registered memory) are
        // verified as they are copied: one wave. File parts are not.
        let caller = CallerMemory::default();
        let in_copy = |wire: Wire| {
            let caller = &caller;
            move |p: &Part<Vec<u8>>| hashed_in_copy(wire, caller, &p.target, &p.buffer)
        };
        let mut pool = parts_of(&[(MIB, 4); 64], Some(1));
        for part in &mut pool {
            part.target = Target::Pool {
                storage: "pool".into(),
                node_id: "n".into(),
                range_id: 1,
                offset: 0,
            };
        }
        assert_eq!(waves(&pool, in_copy(Wire::Shm)), [256]);
        assert_eq!(waves(&pool, in_copy(Wire::Tcp)), [256], "staged on TCP");
        let files = parts_of(&[(MIB, 4); 64], Some(1));
        assert_eq!(waves(&files, in_copy(Wire::Shm)), [64; 4]);
    }

    #[test]
    fn staging_bytes_outside_4_kib_to_2_gib_are_refused_with_the_field_named() {
        for bad in [0, 1, (4 << 10) - 1, (2 << 30) + 1, 8 << 30] {
            let refused = check_staging_bytes(bad);
            assert!(
                matches!(&refused, Err(ClientError::InvalidArgument(m)) if m.contains("staging_bytes")),
                "{bad}: {refused:?}"
            );
        }
        for good in [4 << 10, 16 << 20, 2 << 30] {
            assert!(check_staging_bytes(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn checksums_on_several_threads_equal_the_serial_ones_in_order() {
        let data: Vec<Vec<u8>> = (0..9u8).map(|i| vec![i; 1 << 20]).collect();
        let buffers: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let serial: Vec<u64> = buffers.iter().map(|b| checksum_of(b)).collect();
        assert_eq!(checksums_of(&buffers), serial, "9 MiB: the parallel path");
        assert_eq!(checksums_of(&buffers[..2]), serial[..2], "2 MiB: serial");
        assert!(checksums_of(&[]).is_empty());
    }
}
