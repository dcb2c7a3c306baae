//! A single-producer single-consumer frame ring in a memfd shared by two processes.
//!
//! Layout: `head` (consumer position) at byte 0, `tail` (producer position) at byte 64,
//! `closed` (the consumer's queue pair is gone) at byte 128, frames from byte 4096. Positions only grow; a frame is a u64 length word and the bytes,
//! padded to 8. A length word of `WRAP` sends the consumer back to the ring start. The
//! producer publishes `tail` with release after writing the frame; the consumer publishes
//! `head` with release after copying it out, so neither reads bytes the other is writing.

use crate::sys::{Protection, SharedMemory};
use crate::Result;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};

const DATA: usize = 4096;
const WRAP: u64 = u64::MAX;
const MIN_CAPACITY: usize = 4096;
const MAX_CAPACITY: usize = 1 << 30;

/// The producer broke the ring's invariants (a bug or a hostile peer).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Corrupt;

/// One end of a ring (a process is either its producer or its consumer).
#[derive(Debug)]
pub(crate) struct Ring {
    memory: SharedMemory,
    capacity: usize,
}

fn padded(len: usize) -> usize {
    8 + len.div_ceil(8) * 8
}

impl Ring {
    /// Creates a ring with `capacity` bytes of frames (a power of two).
    pub(crate) fn create(capacity: usize) -> Result<Self> {
        if !(MIN_CAPACITY..=MAX_CAPACITY).contains(&capacity) {
            return Err(crate::TransportError::InvalidArgument(
                "ring capacity must be 4 KiB to 1 GiB",
            ));
        }
        let capacity = capacity.next_power_of_two();
        Ok(Ring {
            memory: SharedMemory::create(c"kvcm-ring", DATA + capacity)?,
            capacity,
        })
    }

    /// Maps a peer's ring of `capacity` bytes of frames, read-write, from the descriptor
    /// its broker handed over.
    pub(crate) fn from_descriptor(fd: OwnedFd, capacity: usize) -> Result<Self> {
        if !capacity.is_power_of_two() || !(MIN_CAPACITY..=MAX_CAPACITY).contains(&capacity) {
            return Err(crate::TransportError::BadEndpoint("ring capacity".into()));
        }
        Ok(Ring {
            memory: SharedMemory::from_descriptor(fd, DATA + capacity, Protection::ReadWrite)?,
            capacity,
        })
    }

    /// The ring's memory (the broker hands out read-write descriptors of it).
    pub(crate) fn memory(&self) -> &SharedMemory {
        &self.memory
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Largest frame `push` accepts.
    pub(crate) fn max_frame(&self) -> usize {
        self.capacity / 2 - 8
    }

    fn head(&self) -> &AtomicU64 {
        self.memory.atomic_u64(0).expect("head word is in bounds")
    }

    fn tail(&self) -> &AtomicU64 {
        self.memory.atomic_u64(64).expect("tail word is in bounds")
    }

    fn closed_word(&self) -> &AtomicU64 {
        self.memory
            .atomic_u64(128)
            .expect("closed word is in bounds")
    }

    /// Marks the consumer gone (its queue pair was destroyed).
    pub(crate) fn mark_closed(&self) {
        self.closed_word().store(1, Ordering::Release);
    }

    /// Whether the consumer is gone.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed_word().load(Ordering::Acquire) != 0
    }

    /// Appends one frame made of `parts`; false if there is no room yet (or it can never fit).
    pub(crate) fn push(&self, parts: &[&[u8]]) -> bool {
        let len: usize = parts.iter().map(|part| part.len()).sum();
        if len > self.max_frame() {
            return false;
        }
        let need = padded(len) as u64;
        let mut tail = self.tail().load(Ordering::Relaxed);
        // A consumer that corrupts `head` only makes the ring look full, never overflows it.
        let used = tail.wrapping_sub(self.head().load(Ordering::Acquire));
        let Some(free) = (self.capacity as u64).checked_sub(used) else {
            return false;
        };
        let index = (tail % self.capacity as u64) as usize;
        let contiguous = (self.capacity - index) as u64;
        let wraps = contiguous < need;
        if free < need + if wraps { contiguous } else { 0 } {
            return false;
        }
        if wraps {
            let _ = self.memory.write(DATA + index, &WRAP.to_le_bytes());
            tail += contiguous;
        }
        let mut at = DATA + (tail % self.capacity as u64) as usize;
        let _ = self.memory.write(at, &(len as u64).to_le_bytes());
        at += 8;
        for part in parts {
            let _ = self.memory.write(at, part);
            at += part.len();
        }
        self.tail().store(tail + need, Ordering::Release);
        true
    }

    /// Whether a frame is waiting.
    pub(crate) fn is_empty(&self) -> bool {
        self.head().load(Ordering::Relaxed) == self.tail().load(Ordering::Acquire)
    }

    /// Copies the next frame into `out` without consuming it; Ok(false) if the ring is
    /// empty. The producer is not trusted: positions more than the capacity apart, a
    /// length over [`Ring::max_frame`] or a frame past the ring's end or past `tail` are
    /// [`Corrupt`], and nothing is consumed.
    pub(crate) fn peek(&self, out: &mut Vec<u8>) -> std::result::Result<bool, Corrupt> {
        loop {
            let head = self.head().load(Ordering::Relaxed);
            let used = self.tail().load(Ordering::Acquire).wrapping_sub(head);
            if used == 0 {
                return Ok(false);
            }
            if used > self.capacity as u64 {
                return Err(Corrupt);
            }
            let index = (head % self.capacity as u64) as usize;
            let mut word = [0u8; 8];
            let _ = self.memory.read(DATA + index, &mut word);
            let len = u64::from_le_bytes(word);
            if len == WRAP {
                self.head()
                    .store(head + (self.capacity - index) as u64, Ordering::Release);
                continue;
            }
            let len = usize::try_from(len).map_err(|_| Corrupt)?;
            let fits = len <= self.max_frame()
                && index + padded(len) <= self.capacity
                && padded(len) as u64 <= used;
            if !fits {
                return Err(Corrupt);
            }
            out.clear();
            out.resize(len, 0);
            let _ = self.memory.read(DATA + index + 8, out);
            return Ok(true);
        }
    }

    /// Consumes the frame last peeked (of `len` bytes).
    pub(crate) fn pop(&self, len: usize) {
        let head = self.head().load(Ordering::Relaxed);
        self.head()
            .store(head + padded(len) as u64, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_cross_processes_in_order_and_wrap() {
        let consumer = Ring::create(4096).unwrap();
        let producer = Ring::from_descriptor(consumer.memory.reopen(true).unwrap(), 4096).unwrap();
        let mut out = Vec::new();
        for round in 0..200u8 {
            assert!(producer.push(&[&[round; 30], &[round + 1; 7]]));
            assert_eq!(consumer.peek(&mut out), Ok(true));
            assert_eq!(out.len(), 37);
            assert_eq!((out[0], out[36]), (round, round + 1));
            consumer.pop(out.len());
        }
        assert_eq!(consumer.peek(&mut out), Ok(false));
    }

    #[test]
    fn a_corrupted_head_makes_the_ring_look_full_not_overflow() {
        let ring = Ring::create(4096).unwrap();
        let peer = Ring::from_descriptor(ring.memory.reopen(true).unwrap(), 4096).unwrap();
        peer.head().store(1 << 40, Ordering::Release);
        assert!(!ring.push(&[b"frame"]));
        peer.head().store(0, Ordering::Release);
        assert!(ring.push(&[b"frame"]));
    }

    #[test]
    fn a_corrupted_tail_or_length_is_reported_not_trusted() {
        let consumer = Ring::create(4096).unwrap();
        let producer = Ring::from_descriptor(consumer.memory.reopen(true).unwrap(), 4096).unwrap();
        let mut out = Vec::new();
        producer.tail().store(1 << 60, Ordering::Release);
        assert_eq!(consumer.peek(&mut out), Err(Corrupt), "tail far past head");
        producer.tail().store(0, Ordering::Release);
        assert!(producer.push(&[b"frame"]));
        let _ = producer.memory.write(DATA, &(1u64 << 40).to_le_bytes());
        assert_eq!(
            consumer.peek(&mut out),
            Err(Corrupt),
            "length over max_frame"
        );
        let _ = producer.memory.write(DATA, &64u64.to_le_bytes());
        assert_eq!(consumer.peek(&mut out), Err(Corrupt), "frame past tail");
        let _ = producer.memory.write(DATA, &5u64.to_le_bytes());
        assert_eq!(consumer.peek(&mut out), Ok(true));
        assert_eq!(out, b"frame");
    }

    #[test]
    fn capacities_out_of_range_are_refused() {
        assert!(Ring::create(0).is_err());
        assert!(Ring::create(100).is_err());
        assert!(Ring::create(2 << 30).is_err());
        let ring = Ring::create(5000).unwrap();
        assert_eq!(ring.capacity(), 8192);
        assert!(Ring::from_descriptor(ring.memory.reopen(true).unwrap(), 5000).is_err());
    }

    #[test]
    fn full_ring_refuses_until_consumed_and_oversize_never_fits() {
        let ring = Ring::create(4096).unwrap();
        assert!(!ring.push(&[&[0; 3000]]));
        let mut pushed = 0;
        while ring.push(&[&[1; 40]]) {
            pushed += 1;
        }
        assert_eq!(pushed, 4096 / 48);
        let mut out = Vec::new();
        assert_eq!(ring.peek(&mut out), Ok(true));
        ring.pop(out.len());
        assert!(ring.push(&[&[1; 40]]));
    }

    /// A small deterministic generator (xorshift) so the test needs no dependency.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn random_pushes_and_pops_match_a_queue_model() {
        let ring = Ring::create(4096).unwrap();
        let mut model = std::collections::VecDeque::new();
        let (mut seed, mut out) = (0x9e37_79b9_7f4a_7c15u64, Vec::new());
        for step in 0..20_000u32 {
            if next(&mut seed) % 2 == 0 {
                let frame = vec![step as u8; (next(&mut seed) % 600) as usize];
                if ring.push(&[&frame]) {
                    model.push_back(frame);
                } else {
                    assert!(
                        !model.is_empty(),
                        "an empty ring takes any frame up to max_frame"
                    );
                }
            } else if ring.peek(&mut out).unwrap() {
                assert_eq!(Some(&out), model.front(), "step {step}");
                ring.pop(out.len());
                model.pop_front();
            } else {
                assert!(model.is_empty(), "step {step}: the ring lost a frame");
            }
        }
    }

    #[test]
    fn a_producer_thread_and_a_consumer_thread_agree_on_every_frame() {
        const FRAMES: u32 = 20_000;
        let consumer = Ring::create(8192).unwrap();
        let producer = Ring::from_descriptor(consumer.memory.reopen(true).unwrap(), 8192).unwrap();
        let writer = std::thread::spawn(move || {
            for index in 0..FRAMES {
                let frame = [
                    index.to_le_bytes().as_slice(),
                    &[index as u8; 100][..(index % 100) as usize],
                ]
                .concat();
                while !producer.push(&[&frame]) {
                    std::thread::yield_now();
                }
            }
        });
        let mut out = Vec::new();
        for index in 0..FRAMES {
            while !consumer.peek(&mut out).unwrap() {
                std::thread::yield_now();
            }
            assert_eq!(out[..4], index.to_le_bytes(), "frames arrive in order");
            assert_eq!(out.len(), 4 + (index % 100) as usize);
            assert!(
                out[4..].iter().all(|&byte| byte == index as u8),
                "frame {index} is intact"
            );
            consumer.pop(out.len());
        }
        writer.join().unwrap();
        assert!(consumer.is_empty());
    }
}
