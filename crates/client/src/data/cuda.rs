//! [`CudaDevice`] (feature `cuda`): GPU memory staged through pinned host slots. Copies are
//! queued on one CUDA stream of the device's primary context; each slot records an event
//! after its copies, and its bytes are lent only once that event completed.
//!
//! The CUDA driver is loaded at run time (cudarc's dynamic loading): on a machine without
//! `libcuda`, [`CudaDevice::new`] fails with a clear error instead of cudarc's panic.
//! Device addresses are raw CUDA device pointers of the caller's allocations (e.g. a torch
//! tensor's `data_ptr()`), valid in the primary context of the device ordinal.

use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream, PinnedHostSlice};

use super::device::{check_fits, Device, DeviceRange};
use crate::ClientError;

fn device_error(error: impl std::fmt::Display) -> ClientError {
    ClientError::Device(format!("CUDA: {error}"))
}

/// Whether a CUDA driver library can be loaded here.
pub fn cuda_present() -> bool {
    // SAFETY: only tries to open the driver library; no CUDA call is made.
    unsafe { sys::is_culib_present() }
}

/// One pinned staging slot.
struct Slot {
    /// Owns the pinned memory (freed on drop, after the stream is synchronised).
    _memory: PinnedHostSlice<u8>,
    ptr: *mut u8,
    /// Recorded after the slot's last queued copies.
    pending: Option<CudaEvent>,
}

/// GPU memory of one device, staged through pinned host slots.
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    slots: Vec<Slot>,
    slot_bytes: usize,
}

impl CudaDevice {
    /// Opens device `ordinal` with `slots` pinned staging slots of `slot_bytes`.
    pub fn new(ordinal: usize, slots: usize, slot_bytes: usize) -> Result<CudaDevice, ClientError> {
        if !cuda_present() {
            return Err(ClientError::Device(
                "no CUDA driver (libcuda) can be loaded on this machine".into(),
            ));
        }
        let ctx = CudaContext::new(ordinal).map_err(device_error)?;
        let stream = ctx.new_stream().map_err(device_error)?;
        let slots = (0..slots.max(1))
            .map(|_| {
                // SAFETY: flags 0 (cached, CPU-readable); the bytes are zeroed below before
                // any reference to them exists.
                let mut memory = unsafe { ctx.alloc_pinned_with_flags::<u8>(slot_bytes, 0) }
                    .map_err(device_error)?;
                let ptr = memory.as_mut_ptr().map_err(device_error)?;
                // SAFETY: `ptr` points at `slot_bytes` bytes just allocated for this slot.
                unsafe { std::ptr::write_bytes(ptr, 0, slot_bytes) };
                Ok(Slot {
                    _memory: memory,
                    ptr,
                    pending: None,
                })
            })
            .collect::<Result<Vec<_>, ClientError>>()?;
        Ok(CudaDevice {
            ctx,
            stream,
            slots,
            slot_bytes,
        })
    }

    /// The slot's bytes as a slice; the caller makes sure no copy is in flight on them or
    /// that the device is the only writer until the slot's event completes.
    fn bytes(&mut self, slot: usize) -> Result<&mut [u8], ClientError> {
        let slot = self
            .slots
            .get_mut(slot)
            .ok_or_else(|| ClientError::InvalidArgument(format!("slot {slot}")))?;
        // SAFETY: the slot's pinned allocation is `slot_bytes` long and lives as long as
        // `self`; `&mut self` keeps any other reference to it from existing meanwhile.
        Ok(unsafe { std::slice::from_raw_parts_mut(slot.ptr, self.slot_bytes) })
    }

    /// Queues one copy per range between the slot and the device, then records the slot's
    /// event.
    fn queue(&mut self, slot: usize, ranges: &[DeviceRange], out: bool) -> Result<(), ClientError> {
        check_fits(ranges, self.slot_bytes)?;
        self.ctx.bind_to_thread().map_err(device_error)?;
        let stream = self.stream.cu_stream();
        let staging = self.bytes(slot)?;
        let mut at = 0;
        for range in ranges {
            let staged = &mut staging[at..at + range.len];
            // SAFETY: `staged` lies inside the slot's pinned memory, which is not lent until
            // the slot's event (recorded below, after these copies) completed and is freed
            // only after the stream is synchronised (drop); the caller vouches that
            // `range.addr` is a device allocation of at least `range.len` bytes.
            let queued = unsafe {
                if out {
                    result::memcpy_dtoh_async(staged, range.addr, stream)
                } else {
                    result::memcpy_htod_async(range.addr, staged, stream)
                }
            };
            queued.map_err(device_error)?;
            at += range.len;
        }
        let event = self.stream.record_event(None).map_err(device_error)?;
        self.slots[slot].pending = Some(event);
        Ok(())
    }
}

impl Device for CudaDevice {
    fn slots(&self) -> usize {
        self.slots.len()
    }

    fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    fn stage_out(&mut self, slot: usize, ranges: &[DeviceRange]) -> Result<(), ClientError> {
        self.queue(slot, ranges, true)
    }

    fn stage_in(&mut self, slot: usize, ranges: &[DeviceRange]) -> Result<(), ClientError> {
        self.queue(slot, ranges, false)
    }

    fn slot(&mut self, slot: usize) -> Result<&mut [u8], ClientError> {
        let pending = self
            .slots
            .get_mut(slot)
            .ok_or_else(|| ClientError::InvalidArgument(format!("slot {slot}")))?
            .pending
            .take();
        if let Some(event) = pending {
            event.synchronize().map_err(device_error)?;
        }
        self.bytes(slot)
    }

    fn sync(&mut self) -> Result<(), ClientError> {
        self.stream.synchronize().map_err(device_error)?;
        for slot in &mut self.slots {
            slot.pending = None;
        }
        Ok(())
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // No copy may still use a slot when its pinned memory is freed.
        let _ = self.stream.synchronize();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a driver the device fails clearly; with one, bytes go GPU → slot → GPU.
    #[test]
    fn a_cuda_round_trip_or_a_clear_error_without_a_driver() {
        if !cuda_present() {
            let error = CudaDevice::new(0, 2, 1024).err().expect("no driver");
            assert!(error.to_string().contains("no CUDA driver"), "{error}");
            eprintln!("SKIPPED (loudly): no libcuda here; the GPU round trip did not run");
            return;
        }
        let mut device = CudaDevice::new(0, 2, 4096).expect("device");
        let stream = device.stream.clone();
        let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        let source = stream.clone_htod(&pattern).expect("upload");
        let target = stream.alloc_zeros::<u8>(4096).expect("alloc");
        let (source_ptr, _source_sync) = cudarc::driver::DevicePtr::device_ptr(&source, &stream);
        let (target_ptr, _target_sync) = cudarc::driver::DevicePtr::device_ptr(&target, &stream);
        let half = |addr| DeviceRange { addr, len: 2048 };
        device
            .stage_out(0, &[half(source_ptr + 2048), half(source_ptr)])
            .expect("out");
        let staged = device.slot(0).expect("slot").to_vec();
        assert_eq!(&staged[..2048], &pattern[2048..]);
        assert_eq!(&staged[2048..], &pattern[..2048]);
        device
            .stage_in(0, &[half(target_ptr), half(target_ptr + 2048)])
            .expect("in");
        device.sync().expect("sync");
        let back = stream.clone_dtoh(&target).expect("download");
        assert_eq!(&back[..2048], &pattern[2048..]);
    }
}
