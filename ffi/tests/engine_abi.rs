//! The transfer engine's C entry points (`kvcm_engine_*`), called through the ABI against
//! an in-process server (the embedded file storage): put and get with byte checks, outcome
//! and path codes, and the codes kvcm.h documents for bad buffers.

mod common;

use std::ffi::{c_char, c_void, CString};

use common::Harness;
use kvcm_ffi::client::KVCM_WIRE_SOFT_TCP;
use kvcm_ffi::engine::*;
use kvcm_ffi::error::{KVCM_E_INVALID_ARGUMENT, KVCM_E_NULL_ARGUMENT, KVCM_OK};

const SPEC_BYTES: usize = 1024;

fn pattern(key: i64) -> Vec<u8> {
    (0..SPEC_BYTES)
        .map(|i| (key as usize * 31 + i) as u8)
        .collect()
}

fn connect(harness: &Harness, instance: &str) -> *mut Engine {
    let grpc = CString::new(harness.grpc.clone()).unwrap();
    let http = CString::new(harness.http.clone()).unwrap();
    let instance = CString::new(instance).unwrap();
    let mut engine = std::ptr::null_mut();
    // SAFETY: NUL-terminated strings and a local output; no error message asked for.
    let status = unsafe {
        kvcm_engine_connect(
            grpc.as_ptr(),
            http.as_ptr(),
            instance.as_ptr(),
            KVCM_WIRE_SOFT_TCP,
            &mut engine,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(status, KVCM_OK);
    assert!(!engine.is_null());
    engine
}

/// kvcm_engine_put of one-part blocks; the status and the outcomes.
fn put(engine: *mut Engine, keys: &[i64], data: &[Vec<u8>]) -> (i32, Vec<i32>, Vec<i32>) {
    let buffers: Vec<*const c_void> = data.iter().map(|d| d.as_ptr().cast()).collect();
    let lengths: Vec<usize> = data.iter().map(Vec::len).collect();
    let mut outcomes = vec![0; keys.len()];
    let mut paths = vec![-1; keys.len()];
    // SAFETY: arrays of `keys.len()` elements, buffers valid for their lengths.
    let status = unsafe {
        kvcm_engine_put(
            engine,
            keys.as_ptr(),
            keys.len(),
            1,
            buffers.as_ptr(),
            lengths.as_ptr(),
            outcomes.as_mut_ptr(),
            paths.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    (status, outcomes, paths)
}

/// kvcm_engine_get of one-part blocks into `data`.
fn get(engine: *mut Engine, keys: &[i64], data: &mut [Vec<u8>]) -> (i32, Vec<i32>, String) {
    let buffers: Vec<*mut c_void> = data.iter_mut().map(|d| d.as_mut_ptr().cast()).collect();
    let lengths: Vec<usize> = data.iter().map(Vec::len).collect();
    let mut outcomes = vec![0; keys.len()];
    let mut message: *mut c_char = std::ptr::null_mut();
    // SAFETY: arrays of `keys.len()` elements, disjoint buffers valid for their lengths.
    let status = unsafe {
        kvcm_engine_get(
            engine,
            keys.as_ptr(),
            keys.len(),
            1,
            buffers.as_ptr(),
            lengths.as_ptr(),
            outcomes.as_mut_ptr(),
            std::ptr::null_mut(),
            &mut message,
        )
    };
    (status, outcomes, take_message(message))
}

fn take_message(message: *mut c_char) -> String {
    if message.is_null() {
        return String::new();
    }
    // SAFETY: a message the library handed out, freed once here.
    unsafe {
        let text = std::ffi::CStr::from_ptr(message)
            .to_string_lossy()
            .into_owned();
        kvcm_ffi::error::kvcm_string_free(message);
        text
    }
}

#[test]
fn blocks_put_and_got_through_the_c_abi_read_back_whole() {
    let harness = Harness::start();
    harness.register("engine");
    let engine = connect(&harness, "engine");
    let keys = [11i64, 12, 13];
    let data: Vec<Vec<u8>> = keys.iter().map(|&k| pattern(k)).collect();
    let (status, outcomes, paths) = put(engine, &keys, &data);
    assert_eq!(status, KVCM_OK);
    assert_eq!(outcomes, [KVCM_PUT_WRITTEN; 3]);
    assert_eq!(paths, [KVCM_PATH_FILE; 3]);
    let (_, again, paths) = put(engine, &keys, &data);
    assert_eq!(again, [KVCM_PUT_PRESENT; 3]);
    assert_eq!(paths, [KVCM_PATH_NONE; 3]);
    // A wrong part size is that block's failure only.
    let (status, short, _) = put(engine, &[14, 15], &[vec![0; 1023], pattern(15)]);
    assert_eq!(status, KVCM_OK);
    assert_eq!(short, [KVCM_PUT_FAILED, KVCM_PUT_WRITTEN]);

    let read_keys = [11i64, 12, 13, 14, 15];
    let mut read = vec![vec![0u8; SPEC_BYTES]; read_keys.len()];
    let (status, outcomes, _) = get(engine, &read_keys, &mut read);
    assert_eq!(status, KVCM_OK);
    assert_eq!(
        outcomes,
        [
            KVCM_GET_HIT,
            KVCM_GET_HIT,
            KVCM_GET_HIT,
            KVCM_GET_MISS,
            KVCM_GET_HIT
        ]
    );
    for (i, key) in read_keys.iter().enumerate().filter(|(i, _)| *i != 3) {
        assert!(read[i] == pattern(*key), "block {key} read back whole");
    }
    // SAFETY: the engine from connect, freed once.
    unsafe { kvcm_engine_free(engine) };
}

#[test]
fn bad_buffers_are_refused_with_the_documented_codes() {
    let harness = Harness::start();
    harness.register("engine");
    let engine = connect(&harness, "engine");
    let mut shared = vec![0u8; 2 * SPEC_BYTES];
    let base = shared.as_mut_ptr();
    let overlapping: Vec<*mut c_void> = vec![base.cast(), base.wrapping_add(512).cast()];
    let lengths = [SPEC_BYTES, SPEC_BYTES];
    let mut outcomes = [0i32; 2];
    let mut message: *mut c_char = std::ptr::null_mut();
    // SAFETY: valid arrays; the two buffers overlap on purpose (refused before any write).
    let status = unsafe {
        kvcm_engine_get(
            engine,
            [1i64, 2].as_ptr(),
            2,
            1,
            overlapping.as_ptr(),
            lengths.as_ptr(),
            outcomes.as_mut_ptr(),
            std::ptr::null_mut(),
            &mut message,
        )
    };
    assert_eq!(status, KVCM_E_INVALID_ARGUMENT);
    assert!(take_message(message).contains("overlap"));
    let null_buffer: [*const c_void; 1] = [std::ptr::null()];
    // SAFETY: valid arrays; the NULL buffer with a length is refused before any read.
    let status = unsafe {
        kvcm_engine_put(
            engine,
            [1i64].as_ptr(),
            1,
            1,
            null_buffer.as_ptr(),
            [SPEC_BYTES].as_ptr(),
            outcomes.as_mut_ptr(),
            std::ptr::null_mut(),
            &mut message,
        )
    };
    assert_eq!(status, KVCM_E_INVALID_ARGUMENT);
    assert!(take_message(message).contains("buffers[0] is NULL"));
    // SAFETY: NULL outcomes are refused before anything is done.
    let status = unsafe {
        kvcm_engine_put(
            engine,
            [1i64].as_ptr(),
            1,
            1,
            [shared.as_ptr().cast::<c_void>()].as_ptr(),
            [SPEC_BYTES].as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    assert_eq!(status, KVCM_E_NULL_ARGUMENT);
    let mut read = vec![vec![0u8; SPEC_BYTES]];
    let (_, outcomes, _) = get(engine, &[1], &mut read);
    assert_eq!(
        outcomes,
        [KVCM_GET_MISS],
        "nothing was stored by the refused calls"
    );
    // SAFETY: the engine from connect, freed once; NULL is a no-op.
    unsafe {
        kvcm_engine_free(engine);
        kvcm_engine_free(std::ptr::null_mut());
    }
}
