//! kvcm-ffi: the C ABI of the kvcm client (`include/kvcm.h`), which engines link and the
//! Python package (`python/`) loads with ctypes.
//!
//! Every entry point checks its pointers (NULL, alignment, UTF-8) before reading them and
//! runs inside `catch_unwind` ([`error::guard`], or [`error::shielded`] for those without a
//! status), so bad input is a status code, never undefined behaviour, and no panic crosses
//! the ABI. Ownership is explicit: what the library hands out (`kvcm_client*`,
//! `kvcm_engine*`, `kvcm_locations*`, `char*` messages) the caller frees with the matching
//! `*_free`; strings borrowed from a result live as long as the result.
//! The header is kept in sync by hand; `tests/header.rs` checks the names.

pub mod args;
pub mod client;
pub mod engine;
pub mod error;
pub mod locations;

/// Version of the kvcm C ABI, so that a linked engine can check what it loaded.
#[no_mangle]
pub extern "C" fn kvcm_abi_version() -> u32 {
    1
}
