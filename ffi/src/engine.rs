//! `kvcm_engine`: the transfer engine (put / get of whole blocks between the caller's host
//! buffers and pool nodes or files) over the C ABI.
//!
//! Invariants: a `kvcm_engine*` is a `Box<Engine>` from [`kvcm_engine_connect_with`] (which
//! [`kvcm_engine_connect`] calls), freed once by [`kvcm_engine_free`]; calls on one engine
//! are serialised by its mutex, so C may share it across threads. Every buffer pointer and
//! length is checked before it is read; the buffers of a get must not overlap (checked:
//! overlapping ones are refused).

use std::ffi::{c_char, c_void};
use std::sync::Mutex;

use kvcm_client::{GetOutcome, PutOutcome, TransferConfig, TransferEngine, TransferPath, Wire};

use crate::args;
use crate::client::{client_config, KvcmTls};
use crate::error::{guard, shielded, FfiError};

/// Put outcome: written and committed.
pub const KVCM_PUT_WRITTEN: i32 = 1;
/// Put outcome: already cached, nothing written.
pub const KVCM_PUT_PRESENT: i32 = 2;
/// Put outcome: not stored.
pub const KVCM_PUT_FAILED: i32 = 3;
/// Get outcome: every part read into the buffers.
pub const KVCM_GET_HIT: i32 = 1;
/// Get outcome: not cached.
pub const KVCM_GET_MISS: i32 = 2;
/// Get outcome: cached but not readable whole (a node gone, a checksum mismatch): a miss.
pub const KVCM_GET_UNREADABLE: i32 = 3;
/// Path: none (nothing moved).
pub const KVCM_PATH_NONE: i32 = 0;
/// Path: a pool node over soft-TCP.
pub const KVCM_PATH_POOL_SOFT_TCP: i32 = 1;
/// Path: a pool node over soft shared memory.
pub const KVCM_PATH_POOL_SOFT_SHM: i32 = 2;
/// Path: the file tier.
pub const KVCM_PATH_FILE: i32 = 3;
/// Path: a pool node over RDMA verbs.
pub const KVCM_PATH_POOL_VERBS: i32 = 4;
/// Path: a pool node over soft-TCP, zero-copy from or into registered memory.
pub const KVCM_PATH_POOL_SOFT_TCP_ZERO_COPY: i32 = 5;
/// Path: a pool node over RDMA verbs, zero-copy from or into registered memory.
pub const KVCM_PATH_POOL_VERBS_ZERO_COPY: i32 = 6;

/// A transfer engine behind a mutex (`kvcm_engine`).
pub struct Engine(Mutex<TransferEngine>);

impl Engine {
    /// The engine, for one call (calls on one engine run one at a time).
    fn locked(&self) -> std::sync::MutexGuard<'_, TransferEngine> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// `count` blocks of `specs` parts, part `j` of block `b` being `part(b × specs + j)`.
fn per_block<T>(count: usize, specs: usize, part: impl Fn(usize) -> T) -> Vec<Vec<T>> {
    (0..count)
        .map(|block| (0..specs).map(|spec| part(block * specs + spec)).collect())
        .collect()
}

fn path_code(path: Option<TransferPath>) -> i32 {
    match path {
        None => KVCM_PATH_NONE,
        Some(TransferPath::PoolSoftTcp) => KVCM_PATH_POOL_SOFT_TCP,
        Some(TransferPath::PoolSoftShm) => KVCM_PATH_POOL_SOFT_SHM,
        Some(TransferPath::File(_)) => KVCM_PATH_FILE,
        Some(TransferPath::PoolVerbs) => KVCM_PATH_POOL_VERBS,
        Some(TransferPath::PoolSoftTcpZeroCopy) => KVCM_PATH_POOL_SOFT_TCP_ZERO_COPY,
        Some(TransferPath::PoolVerbsZeroCopy) => KVCM_PATH_POOL_VERBS_ZERO_COPY,
    }
}

fn put_code(outcome: &PutOutcome) -> (i32, Option<TransferPath>) {
    match outcome {
        PutOutcome::Written(path) => (KVCM_PUT_WRITTEN, Some(*path)),
        PutOutcome::Present => (KVCM_PUT_PRESENT, None),
        PutOutcome::Failed(_) => (KVCM_PUT_FAILED, None),
    }
}

fn get_code(outcome: &GetOutcome) -> (i32, Option<TransferPath>) {
    match outcome {
        GetOutcome::Hit(path) => (KVCM_GET_HIT, Some(*path)),
        GetOutcome::Miss(None) => (KVCM_GET_MISS, None),
        GetOutcome::Miss(Some(_)) => (KVCM_GET_UNREADABLE, None),
    }
}

/// Connects an engine (see kvcm.h); `*engine_out` is NULL on failure.
///
/// # Safety
/// The strings are NULL or NUL-terminated; `engine_out` and `error_message` are NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn kvcm_engine_connect(
    grpc: *const c_char,
    http: *const c_char,
    instance_id: *const c_char,
    wire_kind: i32,
    engine_out: *mut *mut Engine,
    error_message: *mut *mut c_char,
) -> i32 {
    let (api_key, tls) = (std::ptr::null(), std::ptr::null());
    // SAFETY: the caller's promises are passed on; a NULL key and NULL TLS are allowed.
    unsafe {
        kvcm_engine_connect_with(
            grpc,
            http,
            instance_id,
            wire_kind,
            api_key,
            tls,
            engine_out,
            error_message,
        )
    }
}

/// As [`kvcm_engine_connect`], with an API key (NULL: none) and over TLS when `tls` is not
/// NULL (see kvcm.h).
///
/// # Safety
/// The strings are NULL or NUL-terminated; `tls` is NULL or a readable `kvcm_tls` whose
/// strings are NULL or NUL-terminated; `engine_out` and `error_message` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn kvcm_engine_connect_with(
    grpc: *const c_char,
    http: *const c_char,
    instance_id: *const c_char,
    wire_kind: i32,
    api_key: *const c_char,
    tls: *const KvcmTls,
    engine_out: *mut *mut Engine,
    error_message: *mut *mut c_char,
) -> i32 {
    // SAFETY: the caller's promises about every pointer are passed on unchanged.
    unsafe {
        guard(error_message, || {
            args::store(engine_out, "engine_out", std::ptr::null_mut())?;
            let client = client_config(grpc, http, instance_id, wire_kind, api_key, tls)?;
            let config = TransferConfig {
                pool_wire: client.wire.unwrap_or(Wire::Tcp),
                ..TransferConfig::default()
            };
            let engine = TransferEngine::connect(client, config)?;
            let engine = Box::new(Engine(Mutex::new(engine)));
            args::store(engine_out, "engine_out", Box::into_raw(engine))
        })
    }
}

/// Frees an engine; NULL is a no-op.
///
/// # Safety
/// `engine` is NULL or an engine of this library, not yet freed, with no call in flight.
#[no_mangle]
pub unsafe extern "C" fn kvcm_engine_free(engine: *mut Engine) {
    if engine.is_null() {
        return;
    }
    // SAFETY: the caller hands back an engine from `Box::into_raw`, once, unused elsewhere.
    shielded((), || drop(unsafe { Box::from_raw(engine) }));
}

/// Registers `len` bytes at `addr` for zero-copy transfers (see kvcm.h).
///
/// # Safety
/// `engine` is NULL or a live engine; the bytes stay allocated until
/// [`kvcm_engine_deregister_memory`] of `addr` returns or the engine is freed;
/// `error_message` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn kvcm_engine_register_memory(
    engine: *const Engine,
    addr: *mut c_void,
    len: usize,
    error_message: *mut *mut c_char,
) -> i32 {
    // SAFETY: the caller's promises about every pointer are passed on unchanged.
    unsafe {
        guard(error_message, || {
            let engine = args::object(engine, "engine")?;
            args::require(addr, "addr")?;
            // SAFETY: the caller keeps the bytes allocated as the engine requires.
            Ok(engine.locked().register_memory(addr.cast(), len)?)
        })
    }
}

/// Forgets the memory registered at `addr` (see kvcm.h).
///
/// # Safety
/// `engine` is NULL or a live engine; `error_message` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn kvcm_engine_deregister_memory(
    engine: *const Engine,
    addr: *const c_void,
    error_message: *mut *mut c_char,
) -> i32 {
    // SAFETY: the caller's promises about every pointer are passed on unchanged.
    unsafe {
        guard(error_message, || {
            let engine = args::object(engine, "engine")?;
            Ok(engine.locked().deregister_memory(addr.cast())?)
        })
    }
}

/// Sets the directories the engine's file-tier blocks must lie under (see kvcm.h).
///
/// # Safety
/// `engine` is NULL or a live engine; `roots` is NULL (with `count` 0) or points to `count`
/// NUL-terminated strings; `error_message` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn kvcm_engine_set_file_roots(
    engine: *const Engine,
    roots: *const *const c_char,
    count: usize,
    error_message: *mut *mut c_char,
) -> i32 {
    // SAFETY: the caller's promises about every pointer are passed on unchanged.
    unsafe {
        guard(error_message, || {
            let engine = args::object(engine, "engine")?;
            let roots = args::slice(roots, count, "roots")?
                .iter()
                .map(|&root| args::text(root, "roots").map(std::path::PathBuf::from))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(engine.locked().set_file_roots(roots)?)
        })
    }
}

/// The `count × specs` buffer pointers and lengths of a call, checked.
///
/// # Safety
/// `buffers` and `lengths` are NULL or point to `count × specs` readable elements.
unsafe fn parts<'a>(
    count: usize,
    specs: usize,
    buffers: *const *const c_void,
    lengths: *const usize,
) -> Result<(&'a [*const c_void], &'a [usize]), FfiError> {
    let total = count
        .checked_mul(specs)
        .ok_or_else(|| FfiError::InvalidArgument("count × specs overflows".into()))?;
    // SAFETY: passed on from the caller.
    let buffers = unsafe { args::slice(buffers, total, "buffers")? };
    // SAFETY: passed on from the caller.
    let lengths = unsafe { args::slice(lengths, total, "lengths")? };
    for (i, (buffer, len)) in buffers.iter().zip(lengths).enumerate() {
        if buffer.is_null() && *len > 0 {
            return Err(FfiError::InvalidArgument(format!("buffers[{i}] is NULL")));
        }
        if *len > isize::MAX as usize || (*buffer as usize).checked_add(*len).is_none() {
            return Err(FfiError::InvalidArgument(format!(
                "lengths[{i}] = {len} is too large"
            )));
        }
    }
    Ok((buffers, lengths))
}

/// Refuses buffers that overlap (a get writes them all).
fn check_disjoint(buffers: &[*const c_void], lengths: &[usize]) -> Result<(), FfiError> {
    let mut ranges: Vec<(usize, usize, usize)> = buffers
        .iter()
        .zip(lengths)
        .enumerate()
        .filter(|(_, (_, len))| **len > 0)
        .map(|(i, (buffer, len))| (*buffer as usize, *len, i))
        .collect();
    ranges.sort_unstable();
    for pair in ranges.windows(2) {
        let ((start, len, a), (next, _, b)) = (pair[0], pair[1]);
        if start + len > next {
            return Err(FfiError::InvalidArgument(format!(
                "buffers[{a}] and buffers[{b}] overlap"
            )));
        }
    }
    Ok(())
}

/// Writes the outcome codes (and paths, when asked) of `count` blocks.
///
/// # Safety
/// `outcomes` is writable for `codes.len()` elements; `paths` is NULL or writable for as many.
unsafe fn store_codes(
    codes: &[(i32, Option<TransferPath>)],
    outcomes: *mut i32,
    paths: *mut i32,
) -> Result<(), FfiError> {
    // SAFETY: passed on from the caller.
    let outcomes = unsafe { args::slice_mut(outcomes, codes.len(), "outcomes")? };
    for (out, (code, _)) in outcomes.iter_mut().zip(codes) {
        *out = *code;
    }
    if !paths.is_null() {
        // SAFETY: non-NULL, and the caller promises as many writable elements.
        let paths = unsafe { args::slice_mut(paths, codes.len(), "paths")? };
        for (out, (_, path)) in paths.iter_mut().zip(codes) {
            *out = path_code(*path);
        }
    }
    Ok(())
}

/// Stores `count` blocks of `specs` parts (see kvcm.h).
///
/// # Safety
/// `engine` is NULL or a live engine; `keys`, `buffers` and `lengths` are NULL or readable
/// for `count` / `count × specs` elements; every non-NULL `buffers[i]` is readable for
/// `lengths[i]` bytes; `outcomes` (and `paths` when not NULL) writable for `count`
/// elements; `error_message` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn kvcm_engine_put(
    engine: *const Engine,
    keys: *const i64,
    count: usize,
    specs: usize,
    buffers: *const *const c_void,
    lengths: *const usize,
    outcomes: *mut i32,
    paths: *mut i32,
    error_message: *mut *mut c_char,
) -> i32 {
    // SAFETY: the caller's promises about every pointer are passed on unchanged.
    unsafe {
        guard(error_message, || {
            let engine = args::object(engine, "engine")?;
            let keys = args::keys(keys, count)?;
            args::require(outcomes, "outcomes")?;
            let (buffers, lengths) = parts(count, specs, buffers, lengths)?;
            let blocks = per_block(count, specs, |i| {
                // SAFETY: checked non-NULL when non-empty; the caller promises `lengths[i]`
                // readable bytes.
                args::bytes(buffers[i].cast(), lengths[i])
            });
            let done = engine.locked().put_blocks(keys, &blocks)?;
            let codes: Vec<_> = done.iter().map(put_code).collect();
            store_codes(&codes, outcomes, paths)
        })
    }
}

/// Reads `count` blocks of `specs` parts into the buffers (see kvcm.h).
///
/// # Safety
/// As for [`kvcm_engine_put`], with every non-NULL `buffers[i]` writable for `lengths[i]`
/// bytes and not used elsewhere during the call.
#[no_mangle]
pub unsafe extern "C" fn kvcm_engine_get(
    engine: *const Engine,
    keys: *const i64,
    count: usize,
    specs: usize,
    buffers: *const *mut c_void,
    lengths: *const usize,
    outcomes: *mut i32,
    paths: *mut i32,
    error_message: *mut *mut c_char,
) -> i32 {
    // SAFETY: the caller's promises about every pointer are passed on unchanged.
    unsafe {
        guard(error_message, || {
            let engine = args::object(engine, "engine")?;
            let keys = args::keys(keys, count)?;
            args::require(outcomes, "outcomes")?;
            let (buffers, lengths) = parts(count, specs, buffers.cast(), lengths)?;
            check_disjoint(buffers, lengths)?;
            let mut blocks = per_block(count, specs, |i| {
                // SAFETY: checked non-NULL when non-empty and disjoint from every other
                // buffer; the caller promises `lengths[i]` writable bytes.
                args::bytes_mut(buffers[i].cast_mut().cast(), lengths[i])
            });
            let done = engine.locked().get_blocks(keys, &mut blocks)?;
            let codes: Vec<_> = done.iter().map(get_code).collect();
            store_codes(&codes, outcomes, paths)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_get_buffers_are_refused() {
        let memory = [0u8; 64];
        let base = memory.as_ptr().cast::<c_void>();
        let at = |offset: usize| base.wrapping_byte_add(offset);
        assert!(check_disjoint(&[at(0), at(16)], &[16, 16]).is_ok());
        assert!(check_disjoint(&[at(16), at(0)], &[16, 17]).is_err());
        assert!(
            check_disjoint(&[at(0), at(0)], &[0, 8]).is_ok(),
            "empty ones do not count"
        );
    }
}
