//! Block memory the CPU cannot address directly (GPU memory): the engine moves it through a
//! ring of staging buffers that the device copies to and from, so the device's copies of one
//! chunk overlap the transfers of the previous one (see `staged`).
//!
//! [`Device`] is what the engine needs of such memory: staging slots it owns, copies queued
//! between device ranges and a slot, and a wait before a slot's bytes are lent out.
//! Implementations: [`HostStaging`], whose "device" is a host buffer and whose copies run on
//! a worker thread, asynchronously like a GPU's (so the ring's ordering and overlap are
//! tested without a GPU), and, with feature `cuda`, `CudaDevice` (pinned slots, one CUDA
//! stream, an event per slot).
//!
//! Invariant: a slot's bytes are lent only after every copy queued on it completed, and no
//! copy is queued on a slot while its bytes are lent (both take `&mut self`).

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::ClientError;

/// A range of device memory: its device address and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceRange {
    /// The device address (a CUDA device pointer; an offset into a [`HostStaging`] memory).
    pub addr: u64,
    /// Bytes.
    pub len: usize,
}

/// Device memory staged through host slots.
pub trait Device {
    /// Number of staging slots (≥ 1; two or more let copies overlap transfers).
    fn slots(&self) -> usize;
    /// Bytes per staging slot.
    fn slot_bytes(&self) -> usize;
    /// Queues copies of `ranges`, back to back from offset 0, into slot `slot`.
    fn stage_out(&mut self, slot: usize, ranges: &[DeviceRange]) -> Result<(), ClientError>;
    /// Queues copies from slot `slot`, back to back from offset 0, into `ranges`.
    fn stage_in(&mut self, slot: usize, ranges: &[DeviceRange]) -> Result<(), ClientError>;
    /// Waits for the copies queued on slot `slot`, then lends its bytes.
    fn slot(&mut self, slot: usize) -> Result<&mut [u8], ClientError>;
    /// Waits for every queued copy.
    fn sync(&mut self) -> Result<(), ClientError>;
}

/// Checks that `ranges` fit one slot of `slot_bytes` back to back.
pub(crate) fn check_fits(ranges: &[DeviceRange], slot_bytes: usize) -> Result<(), ClientError> {
    let total = ranges
        .iter()
        .try_fold(0usize, |sum, range| sum.checked_add(range.len));
    match total {
        Some(total) if total <= slot_bytes => Ok(()),
        _ => Err(ClientError::InvalidArgument(format!(
            "ranges of {total:?} bytes do not fit a staging slot of {slot_bytes}"
        ))),
    }
}

/// A copy between the device memory and a slot, run by the worker.
enum Copy {
    Out(usize, Vec<u8>, Vec<DeviceRange>),
    In(usize, Vec<u8>, Vec<DeviceRange>),
}

/// A slot's buffer back from the worker, with the copy's error if it failed.
struct Returned {
    slot: usize,
    buffer: Vec<u8>,
    error: Option<String>,
}

/// A device that is host memory, copied by a worker thread: each queued copy takes the
/// slot's buffer to the worker, which hands it back when done.
pub struct HostStaging {
    memory: Arc<Mutex<Vec<u8>>>,
    slot_bytes: usize,
    /// Per slot, its buffer while no copy holds it.
    slots: Vec<Option<Vec<u8>>>,
    copies: Option<Sender<Copy>>,
    done: Receiver<Returned>,
    failure: Option<String>,
    worker: Option<JoinHandle<()>>,
}

impl HostStaging {
    /// A device of `memory_bytes` zeroed bytes with `slots` staging slots of `slot_bytes`.
    pub fn new(memory_bytes: usize, slots: usize, slot_bytes: usize) -> HostStaging {
        let memory = Arc::new(Mutex::new(vec![0u8; memory_bytes]));
        let (copies, queued) = channel::<Copy>();
        let (finished, done) = channel();
        let shared = memory.clone();
        let worker = std::thread::spawn(move || {
            for copy in queued {
                if finished.send(run_copy(&shared, copy)).is_err() {
                    return;
                }
            }
        });
        HostStaging {
            memory,
            slot_bytes,
            slots: (0..slots.max(1))
                .map(|_| Some(vec![0u8; slot_bytes]))
                .collect(),
            copies: Some(copies),
            done,
            failure: None,
            worker: Some(worker),
        }
    }

    /// The device memory (for filling and checking it).
    pub fn memory(&self) -> MutexGuard<'_, Vec<u8>> {
        self.memory
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Hands a slot's buffer to the worker for `copy`.
    fn queue(
        &mut self,
        slot: usize,
        ranges: &[DeviceRange],
        copy: fn(usize, Vec<u8>, Vec<DeviceRange>) -> Copy,
    ) -> Result<(), ClientError> {
        check_fits(ranges, self.slot_bytes)?;
        self.wait_for(slot)?;
        let buffer = self.slots[slot].take().expect("waited for");
        let copies = self.copies.as_ref().expect("open until drop");
        copies
            .send(copy(slot, buffer, ranges.to_vec()))
            .map_err(|_| ClientError::Device("the copy worker stopped".into()))
    }

    /// Waits until slot `slot`'s buffer is back.
    fn wait_for(&mut self, slot: usize) -> Result<(), ClientError> {
        if slot >= self.slots.len() {
            return Err(ClientError::InvalidArgument(format!(
                "slot {slot} of {}",
                self.slots.len()
            )));
        }
        while self.slots[slot].is_none() {
            let returned = self
                .done
                .recv()
                .map_err(|_| ClientError::Device("the copy worker stopped".into()))?;
            if let Some(reason) = returned.error {
                self.failure.get_or_insert(reason);
            }
            self.slots[returned.slot] = Some(returned.buffer);
        }
        match self.failure.take() {
            Some(reason) => Err(ClientError::Device(reason)),
            None => Ok(()),
        }
    }
}

/// Runs one copy; returns the slot's buffer (with the error, if any).
fn run_copy(memory: &Mutex<Vec<u8>>, copy: Copy) -> Returned {
    let mut memory = memory
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let (slot, mut buffer, ranges, out) = match copy {
        Copy::Out(slot, buffer, ranges) => (slot, buffer, ranges, true),
        Copy::In(slot, buffer, ranges) => (slot, buffer, ranges, false),
    };
    let mut at = 0;
    for range in &ranges {
        let start = range.addr as usize;
        let Some(device) = memory.get_mut(start..start.saturating_add(range.len)) else {
            let error = Some(format!(
                "device range {range:?} is outside the device memory"
            ));
            return Returned {
                slot,
                buffer,
                error,
            };
        };
        let staged = &mut buffer[at..at + range.len];
        if out {
            staged.copy_from_slice(device);
        } else {
            device.copy_from_slice(staged);
        }
        at += range.len;
    }
    Returned {
        slot,
        buffer,
        error: None,
    }
}

impl Device for HostStaging {
    fn slots(&self) -> usize {
        self.slots.len()
    }

    fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    fn stage_out(&mut self, slot: usize, ranges: &[DeviceRange]) -> Result<(), ClientError> {
        self.queue(slot, ranges, Copy::Out)
    }

    fn stage_in(&mut self, slot: usize, ranges: &[DeviceRange]) -> Result<(), ClientError> {
        self.queue(slot, ranges, Copy::In)
    }

    fn slot(&mut self, slot: usize) -> Result<&mut [u8], ClientError> {
        self.wait_for(slot)?;
        Ok(self.slots[slot].as_mut().expect("waited for"))
    }

    fn sync(&mut self) -> Result<(), ClientError> {
        // Every slot is waited for even after an error, so that no copy of this call
        // reports its failure at the next call's first wait.
        let mut first = Ok(());
        for slot in 0..self.slots.len() {
            if let Err(error) = self.wait_for(slot) {
                first = first.and(Err(error));
            }
        }
        first
    }
}

impl Drop for HostStaging {
    fn drop(&mut self) {
        self.copies = None;
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_complete_before_a_slot_is_lent_and_errors_surface_once() {
        let mut device = HostStaging::new(64, 2, 16);
        device.memory()[..8].copy_from_slice(b"abcdefgh");
        let ranges = [
            DeviceRange { addr: 4, len: 4 },
            DeviceRange { addr: 0, len: 4 },
        ];
        device.stage_out(0, &ranges).unwrap();
        assert_eq!(&device.slot(0).unwrap()[..8], b"efghabcd");
        device.slot(1).unwrap()[..3].copy_from_slice(b"xyz");
        device
            .stage_in(1, &[DeviceRange { addr: 32, len: 3 }])
            .unwrap();
        device.sync().unwrap();
        assert_eq!(&device.memory()[32..35], b"xyz");
        let outside = [DeviceRange { addr: 60, len: 8 }];
        device.stage_out(0, &outside).unwrap();
        assert!(matches!(device.slot(0), Err(ClientError::Device(_))));
        assert!(device.slot(0).is_ok(), "reported once, the slot is usable");
        let too_big = [DeviceRange { addr: 0, len: 17 }];
        assert!(matches!(
            device.stage_out(1, &too_big),
            Err(ClientError::InvalidArgument(_))
        ));
    }

    /// A sync waits for every slot even after an error, so no failed copy of one call is
    /// reported at the next call's first wait (it once returned at the first slot's error).
    #[test]
    fn a_sync_that_fails_leaves_no_error_for_the_next_wait() {
        let mut device = HostStaging::new(64, 2, 16);
        let outside = [DeviceRange { addr: 60, len: 8 }];
        device.stage_in(0, &outside).unwrap();
        device.stage_in(1, &outside).unwrap();
        assert!(matches!(device.sync(), Err(ClientError::Device(_))));
        assert!(
            device.slot(1).is_ok(),
            "nothing left over from the failed sync"
        );
        assert!(device.slot(0).is_ok());
    }
}
