//! Device context and protection domain, parent objects held by `Arc` so that a parent is
//! never freed before its children (a PD outlives its MRs and QPs; a context its PD / CQs).

use crate::{Result, TransportError};
use rdma_sys::*;
use std::ffi::CStr;
use std::ptr::NonNull;

/// What `ibv_get_device_list` offers on a host without RDMA.
const NO_DEVICE_HINT: &str = "ibv_get_device_list found none (load a NIC driver, or create a \
     soft-RoCE device: `rdma link add rxe0 type rxe netdev <if>`)";

/// An opened RDMA device.
#[derive(Debug)]
pub(crate) struct DeviceContext {
    pub(crate) raw: NonNull<ibv_context>,
    pub(crate) name: String,
}

// SAFETY: libibverbs objects may be used from any thread (all verbs are thread safe, per
// the rdma-core documentation); the pointer is owned and freed once, in `Drop`.
unsafe impl Send for DeviceContext {}
// SAFETY: see `Send`.
unsafe impl Sync for DeviceContext {}

impl DeviceContext {
    /// Opens the device called `name`, or the first one.
    pub(crate) fn open(name: Option<&str>) -> Result<Self> {
        let mut count = 0;
        // SAFETY: `count` is a live out-parameter; the list is freed below.
        let list = unsafe { ibv_get_device_list(&mut count) };
        if list.is_null() {
            return Err(TransportError::NoDevice(format!(
                "{NO_DEVICE_HINT}: {}",
                std::io::Error::last_os_error()
            )));
        }
        // SAFETY: the kernel returned `count` valid device pointers at `list`.
        let devices = unsafe { std::slice::from_raw_parts(list, count.max(0) as usize) };
        let chosen = devices
            .iter()
            .copied()
            .find(|&device| name.is_none_or(|wanted| device_name(device) == wanted));
        let opened = chosen.map(|device| {
            // SAFETY: `device` comes from the live list.
            (unsafe { ibv_open_device(device) }, device_name(device))
        });
        // SAFETY: `list` came from ibv_get_device_list; opened contexts stay valid after it.
        unsafe { ibv_free_device_list(list) };
        match opened {
            None if count == 0 => Err(TransportError::NoDevice(NO_DEVICE_HINT.into())),
            None => Err(TransportError::NoDevice(format!(
                "no device named {name:?}"
            ))),
            Some((raw, name)) => {
                let raw =
                    NonNull::new(raw).ok_or_else(|| TransportError::last_os("ibv_open_device"))?;
                Ok(DeviceContext { raw, name })
            }
        }
    }
}

fn device_name(device: *mut ibv_device) -> String {
    // SAFETY: `device` is a live device; the name is a NUL-terminated string it owns.
    let name = unsafe { ibv_get_device_name(device) };
    if name.is_null() {
        return String::new();
    }
    // SAFETY: non-null, NUL-terminated, valid while the device list lives.
    unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned()
}

impl Drop for DeviceContext {
    fn drop(&mut self) {
        // SAFETY: opened in `open`, closed once; every child holds an `Arc` to this value.
        unsafe { ibv_close_device(self.raw.as_ptr()) };
    }
}

/// A protection domain of a device.
#[derive(Debug)]
pub(crate) struct ProtectionDomain {
    pub(crate) raw: NonNull<ibv_pd>,
    pub(crate) context: std::sync::Arc<DeviceContext>,
}

// SAFETY: as for `DeviceContext`.
unsafe impl Send for ProtectionDomain {}
// SAFETY: as for `DeviceContext`.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    pub(crate) fn allocate(context: std::sync::Arc<DeviceContext>) -> Result<Self> {
        // SAFETY: the context is live (held by the Arc).
        let raw = unsafe { ibv_alloc_pd(context.raw.as_ptr()) };
        let raw = NonNull::new(raw).ok_or_else(|| TransportError::last_os("ibv_alloc_pd"))?;
        Ok(ProtectionDomain { raw, context })
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: allocated in `allocate`, freed once; MRs and QPs hold an `Arc` to this.
        unsafe { ibv_dealloc_pd(self.raw.as_ptr()) };
    }
}
