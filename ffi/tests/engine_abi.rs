//! The transfer engine's C entry points (`kvcm_engine_*`), called through the ABI against
//! an in-process server (the embedded file storage): put and get with byte checks, outcome
//! and path codes, and the codes kvcm.h documents for bad buffers; `kvcm_engine_connect_with`
//! against a server serving mutual TLS and one requiring API keys.

mod common;

use std::ffi::{c_char, c_void, CStr, CString};
use std::path::Path;

use common::{Harness, TlsFiles};
use kvcm_ffi::client::{KvcmTls, KVCM_WIRE_SOFT_TCP};
use kvcm_ffi::engine::*;
use kvcm_ffi::error::{
    KVCM_E_INVALID_ARGUMENT, KVCM_E_INVALID_UTF8, KVCM_E_NULL_ARGUMENT, KVCM_E_UNAUTHORIZED,
    KVCM_E_UNREACHABLE, KVCM_OK,
};

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

fn c_path(path: &Path) -> CString {
    CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str())).unwrap()
}

/// The `kvcm_tls` fields of a TLS harness's files (`cert` false: no client certificate).
fn tls_fields(files: &TlsFiles, cert: bool) -> [Option<CString>; 3] {
    let identity = |path: &Path| cert.then(|| c_path(path));
    [
        Some(c_path(&files.ca)),
        identity(&files.cert),
        identity(&files.key),
    ]
}

/// `kvcm_engine_connect_with` (`tls` None: a NULL `kvcm_tls*`; its fields None: NULL): the
/// status, the engine (NULL on failure) and the message.
fn connect_with(
    grpc: &str,
    http: &str,
    instance: &str,
    api_key: Option<&str>,
    tls: Option<&[Option<CString>; 3]>,
) -> (i32, *mut Engine, String) {
    let text = |s: &str| CString::new(s).unwrap();
    let (grpc, http, instance) = (text(grpc), text(http), text(instance));
    let key = api_key.map(text);
    let field = |s: &Option<CString>| s.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
    let raw = tls.map(|[ca, cert, key]| KvcmTls {
        ca_file: field(ca),
        cert_file: field(cert),
        key_file: field(key),
        server_name: std::ptr::null(),
    });
    let tls = raw
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const KvcmTls);
    let mut engine = std::ptr::dangling_mut();
    let mut message = std::ptr::null_mut();
    // SAFETY: NUL-terminated strings (or NULL) and a kvcm_tls that outlive the call; local
    // outputs.
    let status = unsafe {
        kvcm_engine_connect_with(
            grpc.as_ptr(),
            http.as_ptr(),
            instance.as_ptr(),
            KVCM_WIRE_SOFT_TCP,
            key.as_ref().map_or(std::ptr::null(), |k| k.as_ptr()),
            tls,
            &mut engine,
            &mut message,
        )
    };
    (status, engine, take_message(message))
}

/// A connected engine (the connect must succeed).
fn connected_with(
    grpc: &str,
    http: &str,
    instance: &str,
    api_key: Option<&str>,
    tls: Option<&[Option<CString>; 3]>,
) -> *mut Engine {
    let (status, engine, message) = connect_with(grpc, http, instance, api_key, tls);
    assert_eq!(status, KVCM_OK, "{message}");
    assert!(!engine.is_null());
    engine
}

/// kvcm_engine_put of one-part blocks: the status, the outcomes and paths (0 and -1 where
/// none was written) and the message.
fn put(engine: *mut Engine, keys: &[i64], data: &[Vec<u8>]) -> (i32, Vec<i32>, Vec<i32>, String) {
    let buffers: Vec<*const c_void> = data.iter().map(|d| d.as_ptr().cast()).collect();
    let lengths: Vec<usize> = data.iter().map(Vec::len).collect();
    put_buffers(engine, keys, &buffers, &lengths)
}

/// [`put`] of the blocks at `buffers` (each readable for its length).
fn put_buffers(
    engine: *mut Engine,
    keys: &[i64],
    buffers: &[*const c_void],
    lengths: &[usize],
) -> (i32, Vec<i32>, Vec<i32>, String) {
    let mut outcomes = vec![0; keys.len()];
    let mut paths = vec![-1; keys.len()];
    let mut message: *mut c_char = std::ptr::null_mut();
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
            &mut message,
        )
    };
    (status, outcomes, paths, take_message(message))
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
        let text = CStr::from_ptr(message).to_string_lossy().into_owned();
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
    let (status, outcomes, paths, _) = put(engine, &keys, &data);
    assert_eq!(status, KVCM_OK);
    assert_eq!(outcomes, [KVCM_PUT_WRITTEN; 3]);
    assert_eq!(paths, [KVCM_PATH_FILE; 3]);
    let (_, again, paths, _) = put(engine, &keys, &data);
    assert_eq!(again, [KVCM_PUT_PRESENT; 3]);
    assert_eq!(paths, [KVCM_PATH_NONE; 3]);
    // A wrong part size is that block's failure only.
    let (status, short, ..) = put(engine, &[14, 15], &[vec![0; 1023], pattern(15)]);
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

fn free(engine: *mut Engine) {
    // SAFETY: an engine of this library, freed once.
    unsafe { kvcm_engine_free(engine) };
}

/// A put then a get of block `key` through `engine`: both written / hit on the file tier,
/// the bytes read back whole.
fn round_trip(engine: *mut Engine, key: i64) {
    let (status, outcomes, paths, message) = put(engine, &[key], &[pattern(key)]);
    assert_eq!(status, KVCM_OK, "{message}");
    assert_eq!(
        (outcomes, paths),
        (vec![KVCM_PUT_WRITTEN], vec![KVCM_PATH_FILE])
    );
    let mut read = vec![vec![0u8; SPEC_BYTES]];
    let (status, outcomes, message) = get(engine, &[key], &mut read);
    assert_eq!(status, KVCM_OK, "{message}");
    assert_eq!(outcomes, [KVCM_GET_HIT]);
    assert!(read[0] == pattern(key), "block {key} read back whole");
}

#[test]
fn an_engine_over_mutual_tls_round_trips_and_plaintext_or_anonymous_ones_are_unreachable() {
    let harness = Harness::start_tls();
    harness.register("engine-tls");
    let files = harness.tls.as_ref().expect("TLS files");
    let bare = harness.grpc.strip_prefix("https://").expect("https://");

    // A bare host:port means https:// with TLS.
    let mutual = tls_fields(files, true);
    let engine = connected_with(bare, &harness.http, "engine-tls", None, Some(&mutual));
    round_trip(engine, 21);
    free(engine);

    let plain = format!("http://{bare}");
    let anonymous = tls_fields(files, false);
    let cases = [
        ("plaintext", plain.as_str(), None),
        ("no client certificate", bare, Some(&anonymous)),
    ];
    for (case, grpc, tls) in cases {
        let engine = connected_with(grpc, &harness.http, "engine-tls", None, tls);
        let (status, outcomes, _, message) = put(engine, &[22], &[pattern(22)]);
        assert_eq!(status, KVCM_E_UNREACHABLE, "{case}: {message}");
        assert!(
            message.contains("no kvcm server reachable"),
            "{case}: {message}"
        );
        assert_eq!(
            outcomes,
            [0],
            "{case}: no outcome written when the call fails"
        );
        let mut read = vec![vec![0u8; SPEC_BYTES]];
        let (status, _, message) = get(engine, &[21], &mut read);
        assert_eq!(status, KVCM_E_UNREACHABLE, "{case}: {message}");
        free(engine);
    }

    // Bad settings are refused before anything is sent, as for the client.
    let [ca, cert, _] = tls_fields(files, true);
    let no_key = [ca, cert, None];
    let (status, engine, message) = connect_with(bare, &harness.http, "e", None, Some(&no_key));
    assert_eq!(status, KVCM_E_INVALID_ARGUMENT, "{message}");
    assert!(message.contains("tls.key_file is NULL"), "{message}");
    assert!(engine.is_null(), "failure leaves *engine_out NULL");
    let (status, engine, message) = connect_with(&harness.grpc, &harness.http, "e", None, None);
    assert_eq!(
        status, KVCM_E_INVALID_ARGUMENT,
        "https:// without TLS: {message}"
    );
    assert!(engine.is_null());
    // The block written over TLS is still there for a TLS engine.
    let engine = connected_with(
        &harness.grpc,
        &harness.http,
        "engine-tls",
        None,
        Some(&mutual),
    );
    let (status, outcomes, ..) = put(engine, &[21], &[pattern(21)]);
    assert_eq!((status, outcomes), (KVCM_OK, vec![KVCM_PUT_PRESENT]));
    free(engine);
}

#[test]
fn an_engine_with_the_key_writes_and_one_without_is_unauthorized() {
    const INSTANCE: &str = "engine-auth";
    let harness = Harness::start_with_key(INSTANCE);
    harness.register(INSTANCE);
    let key = harness.api_key.clone().expect("a key");

    let engine = connected_with(&harness.grpc, &harness.http, INSTANCE, Some(&key), None);
    round_trip(engine, 31);
    free(engine);

    let forged = format!("kvcm_{}_{}", "0".repeat(16), "0".repeat(64));
    for api_key in [None, Some(forged.as_str())] {
        let engine = connected_with(&harness.grpc, &harness.http, INSTANCE, api_key, None);
        let (status, outcomes, _, message) = put(engine, &[32], &[pattern(32)]);
        assert_eq!(status, KVCM_E_UNAUTHORIZED, "{api_key:?}: {message}");
        assert!(message.contains("access check"), "{api_key:?}: {message}");
        assert_eq!(outcomes, [0], "{api_key:?}: no outcome written");
        let mut read = vec![vec![0u8; SPEC_BYTES]];
        let (status, _, message) = get(engine, &[31], &mut read);
        assert_eq!(status, KVCM_E_UNAUTHORIZED, "{api_key:?}: {message}");
        assert!(read[0].iter().all(|&b| b == 0), "{api_key:?}: nothing read");
        free(engine);
    }
    // The plain connect is the keyless one: refused likewise.
    let engine = connect(&harness, INSTANCE);
    let (status, ..) = put(engine, &[33], &[pattern(33)]);
    assert_eq!(status, KVCM_E_UNAUTHORIZED);
    free(engine);
    // Nothing the refused engines tried was stored.
    let engine = connected_with(&harness.grpc, &harness.http, INSTANCE, Some(&key), None);
    let mut read = vec![vec![0u8; SPEC_BYTES]; 2];
    let (status, outcomes, message) = get(engine, &[32, 33], &mut read);
    assert_eq!(status, KVCM_OK, "{message}");
    assert_eq!(outcomes, [KVCM_GET_MISS, KVCM_GET_MISS]);
    free(engine);
}

/// kvcm_engine_register_memory: the status and the message.
fn register_memory(engine: *mut Engine, addr: *mut u8, len: usize) -> (i32, String) {
    let mut message: *mut c_char = std::ptr::null_mut();
    // SAFETY: the tests keep the bytes alive until they deregister or free the engine.
    let status = unsafe { kvcm_engine_register_memory(engine, addr.cast(), len, &mut message) };
    (status, take_message(message))
}

/// kvcm_engine_deregister_memory: the status and the message.
fn deregister_memory(engine: *mut Engine, addr: *const u8) -> (i32, String) {
    let mut message: *mut c_char = std::ptr::null_mut();
    // SAFETY: a live engine (or NULL) and a local output.
    let status = unsafe { kvcm_engine_deregister_memory(engine, addr.cast(), &mut message) };
    (status, take_message(message))
}

/// Registered memory through the C ABI: bad ranges are refused with the documented codes
/// and change nothing; blocks in registered memory put and get whole (on the file tier here:
/// its path stays KVCM_PATH_FILE); deregistration forgets the range once.
#[test]
fn memory_registers_and_deregisters_through_the_c_abi_with_documented_refusals() {
    let harness = Harness::start();
    harness.register("engine");
    let engine = connect(&harness, "engine");
    let mut memory = vec![0u8; 4 * SPEC_BYTES];
    let base = memory.as_mut_ptr();
    let (status, _) = register_memory(std::ptr::null_mut(), base, 64);
    assert_eq!(status, KVCM_E_NULL_ARGUMENT, "NULL engine");
    let (status, message) = register_memory(engine, std::ptr::null_mut(), 64);
    assert_eq!(status, KVCM_E_NULL_ARGUMENT, "{message}");
    let (status, message) = register_memory(engine, base, 0);
    assert_eq!(status, KVCM_E_INVALID_ARGUMENT, "zero length: {message}");
    assert_eq!(register_memory(engine, base, 4 * SPEC_BYTES).0, KVCM_OK);
    let (status, message) = register_memory(engine, base.wrapping_add(100), 10);
    assert_eq!(status, KVCM_E_INVALID_ARGUMENT);
    assert!(message.contains("overlap"), "{message}");

    let keys = [21i64, 22];
    memory[..SPEC_BYTES].copy_from_slice(&pattern(21));
    memory[SPEC_BYTES..2 * SPEC_BYTES].copy_from_slice(&pattern(22));
    let (status, outcomes, paths, message) = put_from(engine, &keys, base);
    assert_eq!(status, KVCM_OK, "{message}");
    assert_eq!(
        (outcomes, paths),
        (vec![KVCM_PUT_WRITTEN; 2], vec![KVCM_PATH_FILE; 2])
    );
    let mut read = vec![vec![0u8; SPEC_BYTES]; 2];
    let (status, outcomes, _) = get(engine, &keys, &mut read);
    assert_eq!((status, outcomes), (KVCM_OK, vec![KVCM_GET_HIT; 2]));
    assert!(read[0] == pattern(21) && read[1] == pattern(22));

    assert_eq!(
        deregister_memory(engine, base.wrapping_add(8)).0,
        KVCM_E_INVALID_ARGUMENT
    );
    assert_eq!(deregister_memory(engine, base).0, KVCM_OK);
    let (status, message) = deregister_memory(engine, base);
    assert_eq!(status, KVCM_E_INVALID_ARGUMENT, "already gone");
    assert!(message.contains("no memory is registered"), "{message}");
    assert_eq!(
        register_memory(engine, base.wrapping_add(100), 10).0,
        KVCM_OK,
        "the range is free again"
    );
    free(engine);
}

/// kvcm_engine_set_file_roots: the status and the message.
fn set_file_roots(engine: *mut Engine, roots: &[&Path]) -> (i32, String) {
    let roots: Vec<CString> = roots.iter().map(|root| c_path(root)).collect();
    let pointers: Vec<*const c_char> = roots.iter().map(|root| root.as_ptr()).collect();
    let mut message: *mut c_char = std::ptr::null_mut();
    // SAFETY: a live engine, `pointers.len()` NUL-terminated strings, a local output.
    let status = unsafe {
        kvcm_engine_set_file_roots(engine, pointers.as_ptr(), pointers.len(), &mut message)
    };
    (status, take_message(message))
}

/// File roots through the C ABI: a put outside them fails that block; a bad list is refused
/// with the documented codes and leaves the roots as they were; the server's storage
/// directory admits the blocks; an empty list lifts the confinement.
#[test]
fn file_roots_confine_an_engine_through_the_c_abi_and_bad_ones_change_nothing() {
    let harness = Harness::start();
    harness.register("engine");
    let engine = connect(&harness, "engine");
    let elsewhere = tempfile::tempdir().unwrap();
    assert_eq!(set_file_roots(engine, &[elsewhere.path()]).0, KVCM_OK);
    let (status, outcomes, _, message) = put(engine, &[31], &[pattern(31)]);
    assert_eq!(
        (status, outcomes),
        (KVCM_OK, vec![KVCM_PUT_FAILED]),
        "{message}"
    );

    let (status, message) = set_file_roots(engine, &[Path::new("relative/dir")]);
    assert_eq!(status, KVCM_E_INVALID_ARGUMENT);
    assert!(message.contains("not an absolute path"), "{message}");
    let not_utf8: &std::ffi::OsStr = std::os::unix::ffi::OsStrExt::from_bytes(b"/tmp/\xff");
    let (status, message) = set_file_roots(engine, &[Path::new(not_utf8)]);
    assert_eq!(status, KVCM_E_INVALID_UTF8, "as the header says: {message}");
    // SAFETY: NULL roots with a count, which the function refuses before reading.
    let status =
        unsafe { kvcm_engine_set_file_roots(engine, std::ptr::null(), 1, std::ptr::null_mut()) };
    assert_eq!(status, KVCM_E_NULL_ARGUMENT);
    let (status, _) = set_file_roots(std::ptr::null_mut(), &[]);
    assert_eq!(status, KVCM_E_NULL_ARGUMENT, "NULL engine");
    let (_, outcomes, ..) = put(engine, &[32], &[pattern(32)]);
    assert_eq!(outcomes, [KVCM_PUT_FAILED], "the roots stayed as they were");

    assert_eq!(set_file_roots(engine, &[harness.dir.path()]).0, KVCM_OK);
    let (_, outcomes, paths, message) = put(engine, &[33], &[pattern(33)]);
    assert_eq!(
        (outcomes, paths),
        (vec![KVCM_PUT_WRITTEN], vec![KVCM_PATH_FILE]),
        "{message}"
    );
    let mut read = vec![vec![0u8; SPEC_BYTES]];
    let (_, outcomes, _) = get(engine, &[33], &mut read);
    assert_eq!(outcomes, [KVCM_GET_HIT]);
    assert!(read[0] == pattern(33));

    assert_eq!(set_file_roots(engine, &[]).0, KVCM_OK);
    let (_, outcomes, ..) = put(engine, &[34], &[pattern(34)]);
    assert_eq!(
        outcomes,
        [KVCM_PUT_WRITTEN],
        "no roots: any path outside the system directories"
    );
    free(engine);
}

/// kvcm_engine_put of one-part blocks of `SPEC_BYTES` lying back to back at `base`.
fn put_from(engine: *mut Engine, keys: &[i64], base: *mut u8) -> (i32, Vec<i32>, Vec<i32>, String) {
    let buffers: Vec<*const c_void> = (0..keys.len())
        .map(|i| base.wrapping_add(i * SPEC_BYTES).cast_const().cast())
        .collect();
    put_buffers(engine, keys, &buffers, &vec![SPEC_BYTES; keys.len()])
}
