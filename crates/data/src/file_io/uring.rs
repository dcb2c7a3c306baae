//! The io_uring backend: a batch of transfers is pushed to the ring up to its depth, submitted
//! together, reaped, and short or interrupted transfers are pushed again for their remainder
//! until every transfer is complete, failed, or (reads) at EOF.
//!
//! Invariant that makes the one `unsafe` here sound: [`Ring::run`] returns only when no entry
//! it pushed is still in flight (`in_flight == 0`), so the kernel never touches a buffer or fd
//! after `run` returns; the buffers and fds are borrowed by the caller for the whole call. An
//! io_uring_enter error that leaves that unknown (none is expected in correct use: only EINTR,
//! EAGAIN and EBUSY are, and they are retried) aborts the process rather than return while the
//! kernel may still write into memory the caller will free.
//!
//! Registered buffers: a transfer whose whole buffer lies in a range registered with
//! [`Ring::register`] moves through that slot of the kernel's buffer table
//! (`READ_FIXED` / `WRITE_FIXED`: the pages were pinned once, at registration, not per I/O).
//! Registration changes happen under the same `&mut Ring` as `run`, so never while an entry
//! that uses a slot is in flight.

use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;

use io_uring::{opcode, squeue, types, IoUring};

use super::fixed::{FixedTable, FIXED_SLOTS};

/// The most bytes one submission entry moves (its length field is 32-bit); a longer op is
/// moved in several entries, one after the other.
const MAX_ENTRY_BYTES: usize = 1 << 30;

/// The ring's depth is clamped to this range.
const MAX_QUEUE_DEPTH: u32 = 4096;

/// An io_uring instance and how many entries it keeps in flight at most.
pub(super) struct Ring {
    ring: IoUring,
    depth: usize,
    fixed: FixedTable,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Read,
    Write,
}

/// One op in the ring: where, how much is done, and its outcome once finished (bytes moved,
/// fewer than `len` only for a read at EOF).
pub(super) struct Transfer {
    fd: RawFd,
    direction: Direction,
    addr: *mut u8,
    len: usize,
    offset: u64,
    done: usize,
    outcome: Option<io::Result<usize>>,
    /// The registered buffer slot holding the whole buffer, if one does.
    fixed: Option<u16>,
}

impl Transfer {
    /// A write of `data` at `offset` of `fd`.
    pub fn write(fd: RawFd, data: &[u8], offset: u64) -> Transfer {
        Transfer::new(
            fd,
            Direction::Write,
            data.as_ptr().cast_mut(),
            data.len(),
            offset,
        )
    }

    /// A read into `buf` from `offset` of `fd`.
    pub fn read(fd: RawFd, buf: &mut [u8], offset: u64) -> Transfer {
        Transfer::new(fd, Direction::Read, buf.as_mut_ptr(), buf.len(), offset)
    }

    fn new(fd: RawFd, direction: Direction, addr: *mut u8, len: usize, offset: u64) -> Transfer {
        Transfer {
            fd,
            direction,
            addr,
            len,
            offset,
            done: 0,
            outcome: (len == 0).then_some(Ok(0)),
            fixed: None,
        }
    }

    /// The outcome, and whether it moved through a registered buffer; `run` gives every
    /// transfer one.
    pub fn outcome(self) -> (io::Result<usize>, bool) {
        let outcome = self.outcome.expect("Ring::run finishes every transfer");
        (outcome, self.fixed.is_some())
    }

    /// The submission entry for the next chunk of the remainder.
    fn next_entry(&self, user_data: u64) -> squeue::Entry {
        let chunk = (self.len - self.done).min(MAX_ENTRY_BYTES) as u32;
        let addr = self.addr.wrapping_add(self.done);
        let offset = self.offset + self.done as u64;
        let fd = types::Fd(self.fd);
        let entry = match (self.direction, self.fixed) {
            (Direction::Read, None) => opcode::Read::new(fd, addr, chunk).offset(offset).build(),
            (Direction::Write, None) => opcode::Write::new(fd, addr, chunk).offset(offset).build(),
            (Direction::Read, Some(slot)) => opcode::ReadFixed::new(fd, addr, chunk, slot)
                .offset(offset)
                .build(),
            (Direction::Write, Some(slot)) => opcode::WriteFixed::new(fd, addr, chunk, slot)
                .offset(offset)
                .build(),
        };
        entry.user_data(user_data)
    }

    /// Takes a completion's result; returns whether a remainder must be pushed again.
    fn complete_chunk(&mut self, result: i32) -> bool {
        if result < 0 {
            let errno = -result;
            if errno == libc::EINTR || errno == libc::EAGAIN {
                return true;
            }
            self.outcome = Some(Err(io::Error::from_raw_os_error(errno)));
            return false;
        }
        if result == 0 {
            self.outcome = Some(match self.direction {
                Direction::Read => Ok(self.done),
                Direction::Write => Err(io::ErrorKind::WriteZero.into()),
            });
            return false;
        }
        self.done += result as usize;
        if self.done < self.len {
            return true;
        }
        self.outcome = Some(Ok(self.done));
        false
    }
}

impl Ring {
    /// A ring keeping up to `queue_depth` (clamped to 1..=4096) entries in flight.
    pub fn new(queue_depth: u32) -> io::Result<Ring> {
        let depth = queue_depth.clamp(1, MAX_QUEUE_DEPTH);
        Ok(Ring {
            ring: IoUring::new(depth)?,
            depth: depth as usize,
            fixed: FixedTable::default(),
        })
    }

    /// Registers `len` bytes at `addr` as fixed buffers, one slot per GiB (the kernel pins
    /// their pages); refused, changing nothing, for an empty or overlapping range, too few
    /// free slots, or a kernel that refuses (no sparse tables before Linux 5.19,
    /// RLIMIT_MEMLOCK).
    ///
    /// # Safety
    /// Until [`Ring::deregister`] of `addr` or the ring's drop, the bytes stay allocated
    /// and mapped to the same pages (no `munmap`, `mremap`, `MADV_DONTNEED` or `MAP_FIXED`
    /// over them): the kernel moves a transfer's bytes through the pages pinned here, so
    /// what the address maps afterwards would not see them.
    pub unsafe fn register(&mut self, addr: *mut u8, len: usize) -> Result<(), String> {
        let plan = self.fixed.plan(addr as usize, len)?;
        if !self.fixed.is_set_up() {
            let slots = FIXED_SLOTS as u32;
            let sparse = self.ring.submitter().register_buffers_sparse(slots);
            sparse.map_err(|e| format!("no sparse buffer table: {e}"))?;
            self.fixed.set_up();
        }
        for (done, &(slot, piece)) in plan.iter().enumerate() {
            let pages = libc::iovec {
                iov_base: piece.addr as *mut libc::c_void,
                iov_len: piece.len,
            };
            // SAFETY: the kernel pins the pages of `pages`, part of the range the caller
            // keeps allocated and mapped while registered (this function's contract); `slot`
            // is free in our table (`plan` chose it), so what the kernel's slot held, if
            // anything (a piece whose unregistering failed), is no longer used.
            let updated = unsafe { self.set_slot(slot, pages) };
            if let Err(error) = updated {
                for &(filled, _) in &plan[..done] {
                    // Not used again either way; a kernel error leaves its pages pinned
                    // until the slot is reused or the ring drops.
                    let _ = self.empty_slot(filled);
                }
                return Err(error);
            }
            self.fixed.fill(slot, piece);
        }
        Ok(())
    }

    /// Unregisters the range registered at `addr` (the kernel unpins it); false when none
    /// starts there. The range is never used again even when the kernel reports an error
    /// (its pages then stay pinned until the slot is reused or the ring drops).
    pub fn deregister(&mut self, addr: *const u8) -> Result<bool, String> {
        let slots = self.fixed.slots_of(addr as usize);
        let mut failed = None;
        for &slot in &slots {
            failed = self.empty_slot(slot).err().or(failed);
        }
        match failed {
            Some(error) => Err(error),
            None => Ok(!slots.is_empty()),
        }
    }

    /// Frees `slot` in our table, then empties the kernel's.
    fn empty_slot(&mut self, slot: usize) -> Result<(), String> {
        self.fixed.clear(slot);
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        // SAFETY: an empty entry pins nothing; no entry is in flight (`run` holds `&mut
        // self` until all complete), so none uses the piece it replaces.
        unsafe { self.set_slot(slot, empty) }
    }

    /// Points the kernel's `slot` at `pages`.
    ///
    /// # Safety
    /// `pages` is empty or stays allocated and mapped while the slot holds it, and no
    /// entry in flight uses the slot.
    unsafe fn set_slot(&mut self, slot: usize, pages: libc::iovec) -> Result<(), String> {
        let submitter = self.ring.submitter();
        // SAFETY: forwarded from this function's contract.
        unsafe { submitter.register_buffers_update(slot as u32, &[pages], None) }
            .map_err(|e| e.to_string())
    }

    /// How many ranges are registered.
    pub fn registered(&self) -> usize {
        self.fixed.ranges()
    }

    /// Runs every transfer to its outcome, keeping up to `depth` entries in flight; those
    /// whose buffer lies in a registered range move through its slot.
    pub fn run(&mut self, transfers: &mut [Transfer]) {
        for transfer in transfers.iter_mut().filter(|t| t.len > 0) {
            transfer.fixed = self.fixed.containing(transfer.addr as usize, transfer.len);
        }
        let mut waiting: VecDeque<usize> = (0..transfers.len())
            .filter(|&index| transfers[index].outcome.is_none())
            .collect();
        let mut in_flight = 0;
        while !waiting.is_empty() || in_flight > 0 {
            in_flight += self.push_waiting(transfers, &mut waiting, self.depth - in_flight);
            self.submit_and_wait_one();
            in_flight -= self.reap(transfers, &mut waiting);
        }
    }

    /// Pushes up to `room` waiting transfers; returns how many were pushed.
    fn push_waiting(
        &mut self,
        transfers: &[Transfer],
        waiting: &mut VecDeque<usize>,
        room: usize,
    ) -> usize {
        let mut queue = self.ring.submission();
        let mut pushed = 0;
        while pushed < room {
            let Some(&index) = waiting.front() else {
                break;
            };
            let entry = transfers[index].next_entry(index as u64);
            // SAFETY: the entry's buffer (`addr..addr + chunk`) lies inside a slice that the
            // caller of FileIo::{read,write}_blocks borrows (exclusively for reads) for the whole
            // call, and its fd belongs to a FileTable that outlives `run`; `run` returns only
            // once this entry has completed (module invariant), so neither is used by the kernel
            // after it is released. A fixed entry's slot holds a piece containing the whole
            // buffer (`run` chose it), so the kernel's bounds check passes, and its pinned
            // pages are the ones the buffer's addresses map (`Ring::register`'s contract).
            if unsafe { queue.push(&entry) }.is_err() {
                break;
            }
            waiting.pop_front();
            pushed += 1;
        }
        pushed
    }

    /// Submits what is queued and waits for at least one completion; retries EINTR, returns on
    /// EAGAIN/EBUSY so that completions are reaped first; aborts on any other error.
    fn submit_and_wait_one(&mut self) {
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => return,
                Err(error) => match error.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EAGAIN) | Some(libc::EBUSY) => {
                        std::thread::yield_now();
                        return;
                    }
                    _ => {
                        eprintln!("kvcm-data: io_uring_enter failed with I/O in flight: {error}");
                        std::process::abort();
                    }
                },
            }
        }
    }

    /// Takes every available completion; returns how many were taken.
    fn reap(&mut self, transfers: &mut [Transfer], waiting: &mut VecDeque<usize>) -> usize {
        let mut reaped = 0;
        for completion in self.ring.completion() {
            reaped += 1;
            let index = completion.user_data() as usize;
            if transfers[index].complete_chunk(completion.result()) {
                waiting.push_back(index);
            }
        }
        reaped
    }
}
