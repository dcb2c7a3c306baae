//! The lookup entry points (`kvcm_prefix_match`, `kvcm_batch_get`, `kvcm_sliding_window`)
//! called through the ABI against an in-process server: every result is the caller's own,
//! although the library reuses one client answer per thread to build them.

mod common;

use std::ffi::CString;

use common::Harness;
use kvcm_client::{Client, Wire};
use kvcm_ffi::client::*;
use kvcm_ffi::error::KVCM_OK;
use kvcm_ffi::locations::*;

const WRITTEN: [i64; 5] = [201, 202, 203, 204, 205];

fn connect(harness: &Harness, instance: &str) -> *mut Client {
    let grpc = CString::new(harness.grpc.clone()).unwrap();
    let http = CString::new(harness.http.clone()).unwrap();
    let instance = CString::new(instance).unwrap();
    let mut client = std::ptr::null_mut();
    // SAFETY: NUL-terminated strings and a local output; no error message asked for.
    let status = unsafe {
        kvcm_client_connect(
            grpc.as_ptr(),
            http.as_ptr(),
            instance.as_ptr(),
            KVCM_WIRE_SOFT_SHM,
            &mut client,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(status, KVCM_OK);
    client
}

/// The URIs of a result, one per spec.
fn uris(locations: *const Locations) -> Vec<String> {
    let mut uris = Vec::new();
    // SAFETY: a live result; the strings are read before it is freed.
    unsafe {
        for i in 0..kvcm_locations_count(locations) {
            let mut specs = 0;
            let status = kvcm_location_get(
                locations,
                i,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut specs,
            );
            assert_eq!(status, KVCM_OK);
            for j in 0..specs {
                let empty = KvcmStr {
                    ptr: std::ptr::null(),
                    len: 0,
                };
                let (mut name, mut uri) = (empty, empty);
                let status = kvcm_location_spec(locations, i, j, &mut name, &mut uri);
                assert_eq!(status, KVCM_OK);
                let bytes = std::slice::from_raw_parts(uri.ptr.cast::<u8>(), uri.len);
                uris.push(String::from_utf8(bytes.to_vec()).unwrap());
            }
        }
    }
    uris
}

type Lookup = unsafe extern "C" fn(
    *const Client,
    *const i64,
    usize,
    *mut *mut Locations,
    *mut *mut std::ffi::c_char,
) -> i32;

fn look_up(client: *const Client, lookup: Lookup, keys: &[i64]) -> *mut Locations {
    let mut out = std::ptr::null_mut();
    // SAFETY: a live client, `keys.len()` readable keys, a local output.
    let status = unsafe {
        lookup(
            client,
            keys.as_ptr(),
            keys.len(),
            &mut out,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(status, KVCM_OK);
    out
}

/// `kvcm_sliding_window` with window 2, in the shape of the other lookups.
unsafe extern "C" fn window_of_two(
    client: *const Client,
    keys: *const i64,
    count: usize,
    out: *mut *mut Locations,
    message: *mut *mut std::ffi::c_char,
) -> i32 {
    // SAFETY: the caller's promises are passed on unchanged.
    unsafe { kvcm_sliding_window(client, keys, count, 2, out, message) }
}

#[test]
fn a_result_stays_as_it_was_through_later_lookups_on_the_same_thread() {
    let harness = Harness::start();
    harness.register("ffi-own");
    harness.write("ffi-own", &WRITTEN);
    let rust = harness.client("ffi-own", Some(Wire::Shm));
    let whole = common::uris(&rust.prefix_match(&WRITTEN).unwrap());
    let some = common::uris(&rust.batch_get(&[999, WRITTEN[3]]).unwrap());
    let one = common::uris(&rust.prefix_match(&WRITTEN[1..2]).unwrap());
    let window = common::uris(&rust.sliding_window(&WRITTEN, 2).unwrap());
    assert_eq!(whole.len(), WRITTEN.len());
    let client = connect(&harness, "ffi-own");
    let first = look_up(client, kvcm_prefix_match, &WRITTEN);
    let second = look_up(client, kvcm_batch_get, &[999, WRITTEN[3]]);
    let third = look_up(client, kvcm_prefix_match, &WRITTEN[1..2]);
    let fourth = look_up(client, window_of_two, &WRITTEN);
    assert_eq!(uris(first), whole);
    assert_eq!(uris(second), some);
    assert_eq!(uris(third), one);
    assert_eq!(uris(fourth), window);
    // SAFETY: results and client from this test, each freed once.
    unsafe {
        for result in [first, second, third, fourth] {
            kvcm_locations_free(result);
        }
        kvcm_client_free(client);
    }
}
