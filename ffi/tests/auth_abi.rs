//! API keys through the C ABI (`kvcm_client_connect_with_key`) against an in-process server
//! with `kvcm.auth.meta = required`: the key's lookups are answered (fast path up), calls
//! without a key or with another key fail with KVCM_E_UNAUTHORIZED and a message.

mod common;

use std::ffi::{c_char, CString};

use common::Harness;
use kvcm_client::Client;
use kvcm_ffi::client::*;
use kvcm_ffi::error::{kvcm_string_free, KVCM_E_UNAUTHORIZED, KVCM_OK};
use kvcm_ffi::locations::{kvcm_locations_count, kvcm_locations_free};

const INSTANCE: &str = "ffi-auth";
const KEYS: [i64; 4] = [31, 32, 33, 34];

/// A client connected with `api_key` (None: the plain kvcm_client_connect).
fn connect(harness: &Harness, api_key: Option<&str>) -> *mut Client {
    let grpc = CString::new(harness.grpc.clone()).unwrap();
    let http = CString::new(harness.http.clone()).unwrap();
    let instance = CString::new(INSTANCE).unwrap();
    let key = api_key.map(|k| CString::new(k).unwrap());
    let mut client = std::ptr::null_mut();
    // SAFETY: NUL-terminated strings (or NULL for the key) and a local output.
    let status = unsafe {
        match &key {
            Some(key) => kvcm_client_connect_with_key(
                grpc.as_ptr(),
                http.as_ptr(),
                instance.as_ptr(),
                KVCM_WIRE_SOFT_TCP,
                key.as_ptr(),
                &mut client,
                std::ptr::null_mut(),
            ),
            None => kvcm_client_connect(
                grpc.as_ptr(),
                http.as_ptr(),
                instance.as_ptr(),
                KVCM_WIRE_SOFT_TCP,
                &mut client,
                std::ptr::null_mut(),
            ),
        }
    };
    assert_eq!(status, KVCM_OK);
    client
}

/// Whether the client's fast path is up.
fn fast_path_up(client: *mut Client) -> bool {
    // SAFETY: a live client of this library.
    let up = unsafe { kvcm_client_fast_path_up(client) };
    up == 1
}

/// kvcm_prefix_match of [`KEYS`]: status, hits, message.
fn prefix_match(client: *mut Client) -> (i32, usize, String) {
    let mut out = std::ptr::null_mut();
    let mut message: *mut c_char = std::ptr::null_mut();
    // SAFETY: a live client, a key array of its length, local outputs.
    let status =
        unsafe { kvcm_prefix_match(client, KEYS.as_ptr(), KEYS.len(), &mut out, &mut message) };
    // SAFETY: `out` is NULL or a result of this call, freed once; likewise the message.
    unsafe {
        let hits = kvcm_locations_count(out);
        kvcm_locations_free(out);
        let text = match message.is_null() {
            true => String::new(),
            false => std::ffi::CStr::from_ptr(message)
                .to_string_lossy()
                .into_owned(),
        };
        kvcm_string_free(message);
        (status, hits, text)
    }
}

#[test]
fn a_key_opens_its_instance_and_nothing_else_does() {
    let harness = Harness::start_with_key(INSTANCE);
    harness.register(INSTANCE);
    harness.write(INSTANCE, &KEYS);
    let key = harness.api_key.clone().expect("a key");

    let client = connect(&harness, Some(&key));
    assert!(fast_path_up(client), "bootstrap admitted");
    assert_eq!(prefix_match(client), (KVCM_OK, KEYS.len(), String::new()));
    // SAFETY: a client of this library, freed once.
    unsafe { kvcm_client_free(client) };

    let forged = format!("kvcm_{}_{}", "0".repeat(16), "0".repeat(64));
    for api_key in [None, Some(forged.as_str())] {
        let client = connect(&harness, api_key);
        assert!(!fast_path_up(client), "{api_key:?}");
        let (status, hits, message) = prefix_match(client);
        assert_eq!((status, hits), (KVCM_E_UNAUTHORIZED, 0), "{api_key:?}");
        assert!(message.contains("access check"), "{message}");
        // SAFETY: a client of this library, freed once.
        unsafe { kvcm_client_free(client) };
    }
}
