//! C ABI of the kvcm client library.
//!
//! Placeholder crate: the client issue adds the lookup and data-plane entry points here.

/// Version of the kvcm C ABI, so that a linked engine can check what it loaded.
#[no_mangle]
pub extern "C" fn kvcm_abi_version() -> u32 {
    1
}
