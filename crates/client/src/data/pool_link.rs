//! One queue pair to one pool node: the `KVPL` handshake gives the node's region (address,
//! rkey, incarnation) on the chosen wire; transfers are batches of one-sided operations.
//! On a node that isolates instances the queue pair reaches only this engine's instance's
//! runs, each with an rkey of its own ([`RunKeys`]): the engine asks for the runs of the
//! offsets of a call before it moves anything ([`PoolLink::learn_runs`]).
//!
//! On soft-shm, reads and writes are direct copies between the caller's buffers and the
//! node's mapped region (checked like READ / WRITE, no staging). On soft-TCP and verbs, a
//! buffer inside memory the caller registered with the engine ([`CallerMemory`]) is moved
//! zero-copy: the work request's scatter-gather element is the caller's bytes (registered
//! with this link's domain on first use). Other buffers go through a registered staging
//! buffer in chunks; while the WRITEs of one half of it are in flight the next chunk is
//! copied into the other half.
//! Asked to hash, every copy the CPU makes (soft-shm, and into or out of staging) hashes
//! each piece right after copying it (`shm_copy::hashing`).
//!
//! Invariants: an operation outside the region is refused before anything is posted (one
//! bad URI never fails the queue pair for the others); a batch that fails marks the link
//! broken, and a broken link is never used again; the engine drops a broken link before
//! its call returns, and dropping a link stops its transfers (the soft domain's NIC thread
//! is joined, the verbs queue pair destroyed), so no transfer touches a caller's buffer
//! after the call that posted it returned.

use std::cell::Cell;
use std::hash::Hasher;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use kvcm::pool::ticket::Ticket;
use kvcm::pool::{RegionInfo, KEEPS_CONNECTION, POOL_HELLO};
use kvcm_transport::any::{AnyCq, AnyDomain, AnyQp, AnyRegion};
use kvcm_transport::{
    exchange_endpoints, Access, CompletionQueue, Domain, HostMemory, Memory, QpConfig, QueuePair,
    Region, RemoteAddr, SendOp, SendWr, Sge, TransportError, WcStatus, WorkCompletion,
};
use twox_hash::XxHash3_64;

use super::caller_memory::CallerMemory;
use super::run_keys::RunKeys;
use super::shm_copy;
use crate::Wire;

/// A shared-memory link whose queue pair is not the soft provider's (never: `Wire::Shm`
/// opens a soft domain).
const SHM_NOT_SOFT: &str = "a shared-memory pool link needs a soft queue pair";
/// Most operations posted at once.
const POST_BATCH: usize = 256;
/// Most work requests of one chunk: two chunks in flight stay within the queue depth.
const CHUNK_REQUESTS: usize = 384;
/// Most zero-copy work requests outstanding at once (within the queue depth).
const MAX_OUTSTANDING: usize = 2 * CHUNK_REQUESTS;
/// How a link moved one operation of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Moved {
    /// By the NIC straight from or into the caller's registered memory (no staging, no
    /// CPU copy).
    pub(crate) zero_copy: bool,
    /// The xxh3-64 of the bytes moved, when the CPU copied them and was asked to hash (on
    /// soft-shm, and through staging on TCP and verbs).
    pub(crate) checksum: Option<u64>,
}

/// A connected queue pair to a pool node.
pub(crate) struct PoolLink {
    qp: AnyQp,
    cq: AnyCq,
    staging: HostMemory,
    staging_region: AnyRegion,
    /// The caller's registered memories, registered with this link's domain on first use,
    /// by their address.
    caller_regions: Vec<(u64, AnyRegion)>,
    /// The node's region on this wire.
    pub(crate) info: RegionInfo,
    /// On a node that isolates instances, the keys of the instance's runs known (`None`:
    /// the region's rkey reaches every offset).
    runs: Option<RunKeys>,
    /// Where the node listens and the latest ticket for it (runs requests show it).
    endpoint: SocketAddr,
    ticket: Option<Ticket>,
    wire: Wire,
    deadline: Duration,
    broken: bool,
    /// The status of the completion that broke the link, when one did.
    failed_with: Cell<Option<WcStatus>>,
    domain: AnyDomain,
    /// On verbs, the handshake connection, kept open: its closing (this link dropped, or
    /// the process gone) tells the node to tear its queue pair down.
    _hangup: Option<TcpStream>,
}

impl PoolLink {
    /// Connects to the pool node listening at `endpoint`, speaking `wire` (with the
    /// directory's `ticket` when it gave one); `staging` bytes of registered buffer (TCP
    /// transfers), `timeout` for the peer's answers.
    pub(crate) fn connect(
        endpoint: SocketAddr,
        (wire, ticket): (Wire, Option<&Ticket>),
        staging: usize,
        timeout: Duration,
    ) -> Result<PoolLink, String> {
        // The link's own deadline (`timeout`) decides when a transfer gives up (and the
        // link is torn down); the transport's retry timeout is only a backstop behind it.
        let domain = wire
            .open_domain(timeout.saturating_mul(2))
            .map_err(|e| e.to_string())?;
        let cq = domain.create_cq().map_err(|e| e.to_string())?;
        let qp = domain
            .create_qp(&cq, &cq, QpConfig::default())
            .map_err(|e| e.to_string())?;
        let io = |e: std::io::Error| format!("pool node {endpoint}: {e}");
        let mut stream = TcpStream::connect_timeout(&endpoint, timeout).map_err(io)?;
        stream.set_read_timeout(Some(timeout)).map_err(io)?;
        let mut hello = match ticket {
            Some(_) => kvcm::pool::listener::HELLO_TICKET.to_vec(),
            None => POOL_HELLO.to_vec(),
        };
        // On verbs the connection stays open with the link: its closing tells the node that
        // this client is gone.
        let keeps = if wire == Wire::Verbs {
            KEEPS_CONNECTION
        } else {
            0
        };
        hello.push(wire.index() as u8 | keeps);
        hello.extend_from_slice(ticket.map_or(&[][..], |t| &t[..]));
        stream.write_all(&hello).map_err(io)?;
        let remote = exchange_endpoints(&mut stream, &qp.endpoint()).map_err(|e| e.to_string())?;
        qp.connect(&remote).map_err(|e| e.to_string())?;
        // The region's description and the isolation byte: all in by one deadline.
        let mut answer = kvcm_transport::DeadlineStream::new(&mut stream, timeout);
        let mut info = [0u8; RegionInfo::SIZE];
        answer.read_exact(&mut info).map_err(io)?;
        let info = RegionInfo::decode(&info);
        // Every address formed (region + an in-bounds offset) must fit 64 bits.
        if info.addr.checked_add(info.len).is_none() {
            return Err(format!(
                "pool node {endpoint}: a region that wraps the address space"
            ));
        }
        // After a ticket hello, whether the queue pair reaches only the instance's runs.
        let mut isolated = [0u8; 1];
        if ticket.is_some() {
            answer.read_exact(&mut isolated).map_err(io)?;
        }
        let staging_memory = domain
            .alloc(staging.max(1 << 20))
            .map_err(|e| e.to_string())?;
        let staging_region = domain
            .register(
                &staging_memory,
                0,
                staging_memory.len(),
                Access::LOCAL_WRITE,
            )
            .map_err(|e| e.to_string())?;
        Ok(PoolLink {
            qp,
            cq,
            staging: staging_memory,
            staging_region,
            caller_regions: Vec::new(),
            info,
            runs: (isolated[0] == 1).then(RunKeys::default),
            endpoint,
            ticket: ticket.copied(),
            wire,
            deadline: timeout,
            broken: false,
            failed_with: Cell::new(None),
            domain,
            _hangup: (wire == Wire::Verbs).then_some(stream),
        })
    }

    /// Whether a transfer failed on this link (it must be replaced).
    pub(crate) fn is_broken(&self) -> bool {
        self.broken
    }

    /// Whether `[offset, offset + len)` lies inside the node's region, and on an isolating
    /// node inside one known run of the instance.
    pub(crate) fn in_bounds(&self, offset: u64, len: usize) -> bool {
        let in_region = offset
            .checked_add(len as u64)
            .is_some_and(|end| end <= self.info.len);
        in_region
            && self
                .runs
                .as_ref()
                .is_none_or(|runs| runs.rkey(offset, len as u64).is_some())
    }

    /// Takes the directory's latest ticket for this node (runs requests show it).
    pub(crate) fn renew_ticket(&mut self, ticket: Option<Ticket>) {
        self.ticket = ticket.or(self.ticket);
    }

    /// On an isolating node, those of `offsets` no known run holds (sorted, once each);
    /// none elsewhere.
    pub(crate) fn unknown_runs(&self, offsets: impl IntoIterator<Item = u64>) -> Vec<u64> {
        match (&self.runs, &self.ticket) {
            (Some(runs), Some(_)) => runs.unknown(offsets),
            _ => Vec::new(),
        }
    }

    /// On an isolating node, learns the runs holding `offsets` that no known run holds
    /// (one request for all of them); nothing elsewhere.
    pub(crate) fn learn_runs(
        &mut self,
        offsets: impl IntoIterator<Item = u64>,
    ) -> Result<(), String> {
        let (Some(runs), Some(ticket)) = (self.runs.as_mut(), self.ticket.as_ref()) else {
            return Ok(());
        };
        let asked = (self.endpoint, self.wire.index() as u8, ticket);
        runs.learn(asked, (offsets, self.info.len), self.deadline)
    }

    fn remote(&self, offset: u64) -> RemoteAddr {
        // An offset of no known run gets rkey 0, which the node refuses: `in_bounds`
        // keeps such operations from being posted.
        let rkey = match &self.runs {
            Some(runs) => runs.rkey(offset, 1).unwrap_or(0),
            None => self.info.rkey,
        };
        RemoteAddr {
            addr: self.info.addr + offset,
            rkey,
        }
    }

    /// Writes each `(offset, bytes)` into the region (all in bounds); returns per operation
    /// how it moved (with `hash`, the copies the CPU makes — soft-shm, staging — also give
    /// the checksum of the bytes they copied). On failure the link is broken and none of them counts as written. A batch
    /// that failed on a stale run key is written once more over a fresh link
    /// ([`PoolLink::renew`]).
    pub(crate) fn write(
        &mut self,
        ops: &[(u64, &[u8])],
        caller: &CallerMemory,
        hash: bool,
    ) -> Result<Vec<Moved>, String> {
        let done = self.write_once(ops, caller, hash);
        if !self.failed_on_stale_key() {
            return done;
        }
        self.renew(ops.iter().map(|(at, data)| (*at, data.len())))?;
        self.write_once(ops, caller, hash)
    }

    /// Reads each `(offset, buffer)` from the region (all in bounds); returns per operation
    /// how it moved (with `hash`, the copies the CPU makes — soft-shm, staging — also give
    /// the checksum of the bytes they read). On failure the link is broken and no buffer is to be trusted. A batch that
    /// failed on a stale run key is read once more over a fresh link ([`PoolLink::renew`]).
    pub(crate) fn read(
        &mut self,
        ops: &mut [(u64, &mut [u8])],
        caller: &CallerMemory,
        hash: bool,
    ) -> Result<Vec<Moved>, String> {
        let done = self.read_once(ops, caller, hash);
        if !self.failed_on_stale_key() {
            return done;
        }
        self.renew(ops.iter().map(|(at, buf)| (*at, buf.len())))?;
        self.read_once(ops, caller, hash)
    }

    /// Whether a transfer on an isolating node's link failed for a bad remote key: one of
    /// the instance's runs known here was given up, and the node dropped its registration
    /// (it may be the instance's again, under another key).
    fn failed_on_stale_key(&self) -> bool {
        self.broken
            && self.runs.is_some()
            && self.failed_with.get() == Some(WcStatus::RemoteAccessError)
    }

    /// Replaces this link by a fresh one to the same node incarnation (new queue pair and
    /// domain; dropping the old one stops its transfers) that knows the runs holding
    /// `places` (offset, length). `Err` when the node refuses, moved on, or no run of the
    /// instance holds one of them now; this link stays broken then.
    fn renew(&mut self, places: impl Iterator<Item = (u64, usize)> + Clone) -> Result<(), String> {
        let ticket = (self.wire, self.ticket.as_ref());
        let mut fresh =
            PoolLink::connect(self.endpoint, ticket, self.staging.len(), self.deadline)?;
        if fresh.info.range_id != self.info.range_id {
            return Err("the pool node is on another incarnation now".into());
        }
        fresh.learn_runs(places.clone().map(|(at, _)| at))?;
        if !places.into_iter().all(|(at, len)| fresh.in_bounds(at, len)) {
            return Err("a run of this instance on the pool node was given up".into());
        }
        *self = fresh;
        Ok(())
    }

    fn write_once(
        &mut self,
        ops: &[(u64, &[u8])],
        caller: &CallerMemory,
        hash: bool,
    ) -> Result<Vec<Moved>, String> {
        let done = match (self.wire, self.qp.as_soft()) {
            (Wire::Shm, Some(qp)) => {
                let mut writes: Vec<(RemoteAddr, &[u8])> = ops
                    .iter()
                    .map(|&(at, data)| (self.remote(at), data))
                    .collect();
                shm_copy::write(qp, &mut writes, hash).map(copied)
            }
            (Wire::Shm, None) => Err(SHM_NOT_SOFT.to_string()),
            (Wire::Tcp | Wire::Verbs, _) => {
                let places = ops
                    .iter()
                    .map(|(at, data)| (*at, data.as_ptr(), data.len()));
                let (direct, staged) = self.split(places, caller);
                let write = |remote| SendOp::Write { remote, imm: None };
                self.post_all(&direct, write)
                    .and_then(|()| {
                        let rest: Vec<(u64, &[u8])> = staged.iter().map(|&i| ops[i]).collect();
                        self.write_staged(&rest, hash)
                    })
                    .map(|sums| moved_by_nic(ops.len(), &staged, sums))
            }
        };
        self.broken |= done.is_err();
        done
    }

    fn read_once(
        &mut self,
        ops: &mut [(u64, &mut [u8])],
        caller: &CallerMemory,
        hash: bool,
    ) -> Result<Vec<Moved>, String> {
        let done = match (self.wire, self.qp.as_soft()) {
            (Wire::Shm, Some(qp)) => {
                let mut reads: Vec<(RemoteAddr, &mut [u8])> = ops
                    .iter_mut()
                    .map(|(at, buf)| (self.remote(*at), &mut **buf))
                    .collect();
                shm_copy::read(qp, &mut reads, hash).map(copied)
            }
            (Wire::Shm, None) => Err(SHM_NOT_SOFT.to_string()),
            (Wire::Tcp | Wire::Verbs, _) => {
                let places = ops.iter().map(|(at, buf)| (*at, buf.as_ptr(), buf.len()));
                let (direct, staged) = self.split(places, caller);
                let count = ops.len();
                self.post_all(&direct, SendOp::Read)
                    .and_then(|()| {
                        let mut rest: Vec<(u64, &mut [u8])> = ops
                            .iter_mut()
                            .enumerate()
                            .filter(|(i, _)| staged.binary_search(i).is_ok())
                            .map(|(_, (at, buf))| (*at, &mut **buf))
                            .collect();
                        self.read_staged(&mut rest, hash)
                    })
                    .map(|sums| moved_by_nic(count, &staged, sums))
            }
        };
        self.broken |= done.is_err();
        done
    }

    /// Splits operations `(region offset, buffer address, length)` into work requests on
    /// the caller's registered memory (region offset and element) and the indexes of the
    /// rest, which are staged.
    fn split(
        &mut self,
        places: impl IntoIterator<Item = (u64, *const u8, usize)>,
        caller: &CallerMemory,
    ) -> (Vec<(u64, Sge)>, Vec<usize>) {
        let mut direct = Vec::new();
        let mut staged = Vec::new();
        for (i, (at, addr, len)) in places.into_iter().enumerate() {
            match self.caller_sge(caller, addr as u64, len) {
                Some(sge) => direct.push((at, sge)),
                None => staged.push(i),
            }
        }
        (direct, staged)
    }

    /// An element over `len` bytes at `addr` when they lie inside memory the caller
    /// registered (registering that memory with this link's domain on first use); `None`
    /// when they do not, or when this domain refuses the registration (the bytes are staged
    /// then).
    fn caller_sge(&mut self, caller: &CallerMemory, addr: u64, len: usize) -> Option<Sge> {
        let len32 = u32::try_from(len).ok()?;
        let memory = caller.containing(addr, len)?;
        let base = memory.addr();
        let index = match self.caller_regions.iter().position(|(at, _)| *at == base) {
            Some(index) => index,
            None => {
                let region = self
                    .domain
                    .register(memory, 0, memory.len(), Access::LOCAL_WRITE)
                    .ok()?;
                self.caller_regions.push((base, region));
                self.caller_regions.len() - 1
            }
        };
        Some(
            self.caller_regions[index]
                .1
                .sge((addr - base) as usize, len32),
        )
    }

    /// Drops this link's registration of the caller's memory at `base` (no transfer is in
    /// flight between engine calls).
    pub(crate) fn forget(&mut self, base: u64) {
        self.caller_regions.retain(|(at, _)| *at != base);
    }

    /// TCP and verbs writes: chunks of the staging buffer's halves, the next copied while the
    /// previous one's WRITEs are in flight; with `hash`, the checksum of each operation's
    /// bytes, hashed as they are staged.
    fn write_staged(
        &mut self,
        ops: &[(u64, &[u8])],
        hash: bool,
    ) -> Result<Vec<Option<u64>>, String> {
        let mut hashers = hashers(ops.len(), hash);
        let half = self.staging.len() / 2;
        let mut in_flight = 0usize;
        let mut side = 0usize;
        for chunk in pieces(ops.iter().map(|(at, data)| (*at, data.len())), half) {
            let base = side * half;
            let mut wrs = Vec::with_capacity(chunk.len());
            for (staged, piece) in chunk.iter().enumerate() {
                let data = &ops[piece.op].1[piece.from..piece.from + piece.len];
                let at = base + piece.staged_at;
                let hasher = hashers[piece.op].as_mut();
                shm_copy::hashing(data.len(), hasher, |from, to, hasher| {
                    let bytes = &data[from..to];
                    self.staging.write(at + from, bytes)?;
                    if let Some(hasher) = hasher {
                        hasher.write(bytes);
                    }
                    Ok(())
                })
                .map_err(|e: TransportError| e.to_string())?;
                wrs.push((staged, *piece));
            }
            // Wait for the WRITEs that used this half two chunks ago (the other half's may
            // still run).
            self.await_completions(in_flight)?;
            in_flight = self.post(&wrs, base, |remote| SendOp::Write { remote, imm: None })?;
            side ^= 1;
        }
        self.await_completions(in_flight)?;
        Ok(digests(hashers))
    }

    /// TCP and verbs reads: chunks of READs into staging, then copied out; with `hash`, the
    /// checksum of each operation's bytes, hashed as they are copied out.
    fn read_staged(
        &mut self,
        ops: &mut [(u64, &mut [u8])],
        hash: bool,
    ) -> Result<Vec<Option<u64>>, String> {
        let mut hashers = hashers(ops.len(), hash);
        let sizes: Vec<(u64, usize)> = ops.iter().map(|(at, buf)| (*at, buf.len())).collect();
        for chunk in pieces(sizes.into_iter(), self.staging.len()) {
            let wrs: Vec<(usize, Piece)> = chunk.iter().copied().enumerate().collect();
            let posted = self.post(&wrs, 0, SendOp::Read)?;
            self.await_completions(posted)?;
            for piece in &chunk {
                let out = &mut ops[piece.op].1[piece.from..piece.from + piece.len];
                let hasher = hashers[piece.op].as_mut();
                shm_copy::hashing(out.len(), hasher, |from, to, hasher| {
                    let bytes = &mut out[from..to];
                    self.staging.read(piece.staged_at + from, bytes)?;
                    if let Some(hasher) = hasher {
                        hasher.write(bytes);
                    }
                    Ok(())
                })
                .map_err(|e: TransportError| e.to_string())?;
            }
        }
        Ok(digests(hashers))
    }

    /// Posts one work request per piece (staged at `base + staged_at`), in batches; returns
    /// how many completions to await (every request is signaled).
    fn post(
        &self,
        pieces: &[(usize, Piece)],
        base: usize,
        op: impl Fn(RemoteAddr) -> SendOp,
    ) -> Result<usize, String> {
        let wrs: Vec<(u64, Sge)> = pieces
            .iter()
            .map(|(_, p)| {
                let sge = self.staging_region.sge(base + p.staged_at, p.len as u32);
                (p.remote_at, sge)
            })
            .collect();
        for batch in wrs.chunks(POST_BATCH) {
            self.post_batch(batch, &op)?;
        }
        Ok(pieces.len())
    }

    /// Posts one signaled work request per `(region offset, local element)`.
    fn post_batch(
        &self,
        batch: &[(u64, Sge)],
        op: impl Fn(RemoteAddr) -> SendOp,
    ) -> Result<(), String> {
        let wrs: Vec<SendWr<'_>> = batch
            .iter()
            .enumerate()
            .map(|(index, (at, sge))| SendWr {
                wr_id: index as u64,
                op: op(self.remote(*at)),
                sg_list: std::slice::from_ref(sge),
                signaled: true,
            })
            .collect();
        self.qp.post_send(&wrs).map_err(|e| e.to_string())
    }

    /// Posts every `(region offset, local element)` with at most [`MAX_OUTSTANDING`] in
    /// flight, and waits for all of them.
    fn post_all(
        &self,
        wrs: &[(u64, Sge)],
        op: impl Fn(RemoteAddr) -> SendOp,
    ) -> Result<(), String> {
        let mut outstanding = 0;
        for batch in wrs.chunks(POST_BATCH) {
            let excess = (outstanding + batch.len()).saturating_sub(MAX_OUTSTANDING);
            self.await_completions(excess)?;
            outstanding -= excess;
            self.post_batch(batch, &op)?;
            outstanding += batch.len();
        }
        self.await_completions(outstanding)
    }

    /// Waits for `count` successful completions (busy polling, then blocking on the CQ).
    fn await_completions(&self, mut count: usize) -> Result<(), String> {
        let deadline = Instant::now() + self.deadline;
        let mut completions = [WorkCompletion::EMPTY; 64];
        while count > 0 {
            // Never more than `count`: the completions past it belong to the caller's next
            // wait (`post_all` waits for a few while later requests are still in flight).
            let room = count.min(completions.len());
            let got = self.cq.poll(&mut completions[..room]);
            if let Some(bad) = completions[..got]
                .iter()
                .find(|c| c.status != WcStatus::Success)
            {
                self.failed_with.set(Some(bad.status));
                return Err(format!("pool transfer failed: {:?}", bad.status));
            }
            count -= got;
            if got == 0 {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err("pool node did not answer in time".into());
                }
                self.cq
                    .wait(left.min(Duration::from_millis(50)))
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }
}

/// How each of `count` operations moved on TCP or verbs: zero-copy by the NIC, except those
/// in `staged`, which were copied through staging (`sums[k]`: the checksum of operation
/// `staged[k]`, when hashed as it was staged).
fn moved_by_nic(count: usize, staged: &[usize], sums: Vec<Option<u64>>) -> Vec<Moved> {
    let mut moved = vec![
        Moved {
            zero_copy: true,
            checksum: None
        };
        count
    ];
    for (&i, checksum) in staged.iter().zip(sums) {
        moved[i] = Moved {
            zero_copy: false,
            checksum,
        };
    }
    moved
}

/// A hasher per operation of `count` when asked to hash.
fn hashers(count: usize, hash: bool) -> Vec<Option<XxHash3_64>> {
    (0..count).map(|_| hash.then(XxHash3_64::new)).collect()
}

fn digests(hashers: Vec<Option<XxHash3_64>>) -> Vec<Option<u64>> {
    hashers.into_iter().map(|h| h.map(|h| h.finish())).collect()
}

/// How a soft-shm copy moved each operation (never zero-copy: the CPU copied it).
fn copied(sums: Vec<Option<u64>>) -> Vec<Moved> {
    let moved = |checksum| Moved {
        zero_copy: false,
        checksum,
    };
    sums.into_iter().map(moved).collect()
}

/// One piece of an operation staged in one chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    /// Index of the operation.
    op: usize,
    /// Where in the operation's bytes the piece starts.
    from: usize,
    /// Bytes of the piece.
    len: usize,
    /// Where in the region it goes.
    remote_at: u64,
    /// Where in the chunk's staging space it goes.
    staged_at: usize,
}

/// Cuts operations `(region offset, len)` into chunks of at most `chunk` staged bytes and
/// [`CHUNK_REQUESTS`] pieces; an operation larger than a chunk is split across chunks.
fn pieces(ops: impl Iterator<Item = (u64, usize)>, chunk: usize) -> Vec<Vec<Piece>> {
    let mut chunks = vec![Vec::new()];
    let mut used = 0;
    for (op, (at, len)) in ops.enumerate() {
        let mut from = 0;
        while from < len {
            let requests = chunks.last().map_or(0, Vec::len);
            if used == chunk || requests == CHUNK_REQUESTS {
                chunks.push(Vec::new());
                used = 0;
            }
            let take = (len - from).min(chunk - used);
            let current = chunks.last_mut().expect("one chunk at least");
            current.push(Piece {
                op,
                from,
                len: take,
                remote_at: at + from as u64,
                staged_at: used,
            });
            used += take;
            from += take;
        }
    }
    chunks.retain(|c| !c.is_empty());
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_fill_chunks_and_split_large_operations() {
        let chunks = pieces([(0, 3), (100, 10), (200, 1)].into_iter(), 8);
        let flat: Vec<(usize, usize, usize, u64, usize)> = chunks
            .iter()
            .flatten()
            .map(|p| (p.op, p.from, p.len, p.remote_at, p.staged_at))
            .collect();
        assert_eq!(
            flat,
            [
                (0, 0, 3, 0, 0),
                (1, 0, 5, 100, 3),
                (1, 5, 5, 105, 0),
                (2, 0, 1, 200, 5)
            ]
        );
        assert_eq!(chunks.len(), 2);
        assert!(chunks
            .iter()
            .all(|c| c.iter().map(|p| p.len).sum::<usize>() <= 8));
        assert!(pieces(std::iter::empty(), 8).is_empty());
    }
}
