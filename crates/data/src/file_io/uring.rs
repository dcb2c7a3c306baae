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

use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;

use io_uring::{opcode, squeue, types, IoUring};

/// The most bytes one submission entry moves (its length field is 32-bit); a longer op is
/// moved in several entries, one after the other.
const MAX_ENTRY_BYTES: usize = 1 << 30;

/// The ring's depth is clamped to this range.
const MAX_QUEUE_DEPTH: u32 = 4096;

/// An io_uring instance and how many entries it keeps in flight at most.
pub(super) struct Ring {
    ring: IoUring,
    depth: usize,
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
        }
    }

    /// The outcome; `run` gives every transfer one.
    pub fn outcome(self) -> io::Result<usize> {
        self.outcome.expect("Ring::run finishes every transfer")
    }

    /// The submission entry for the next chunk of the remainder.
    fn next_entry(&self, user_data: u64) -> squeue::Entry {
        let chunk = (self.len - self.done).min(MAX_ENTRY_BYTES) as u32;
        let addr = self.addr.wrapping_add(self.done);
        let offset = self.offset + self.done as u64;
        let fd = types::Fd(self.fd);
        let entry = match self.direction {
            Direction::Read => opcode::Read::new(fd, addr, chunk).offset(offset).build(),
            Direction::Write => opcode::Write::new(fd, addr, chunk).offset(offset).build(),
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
        })
    }

    /// Runs every transfer to its outcome, keeping up to `depth` entries in flight.
    pub fn run(&mut self, transfers: &mut [Transfer]) {
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
            // after it is released.
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
