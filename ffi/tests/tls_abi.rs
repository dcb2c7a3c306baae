//! TLS through the C ABI (`kvcm_client_connect_tls` and `kvcm_tls`) against an in-process
//! server serving mutual TLS on every listener: a client with the server's CA and a client
//! certificate is answered over gRPC and on the fast path; plaintext clients, clients without
//! a certificate and clients trusting another CA reach nothing (KVCM_E_UNREACHABLE); bad
//! `kvcm_tls` fields are refused before anything is sent, the message naming the field.

mod common;

use std::ffi::{c_char, CStr, CString};
use std::path::Path;

use common::Harness;
use kvcm_client::Client;
use kvcm_ffi::client::*;
use kvcm_ffi::error::*;
use kvcm_ffi::locations::{kvcm_locations_count, kvcm_locations_free};

const INSTANCE: &str = "ffi-tls";
const KEYS: [i64; 4] = [41, 42, 43, 44];

fn cstring(text: &str) -> CString {
    CString::new(text).expect("no NUL")
}

fn path(path: &Path) -> CString {
    cstring(path.to_str().expect("UTF-8 path"))
}

/// Takes a message of this library (NULL: empty).
fn take(message: *mut c_char) -> String {
    if message.is_null() {
        return String::new();
    }
    // SAFETY: a message of this library, freed once.
    unsafe {
        let text = CStr::from_ptr(message).to_string_lossy().into_owned();
        kvcm_string_free(message);
        text
    }
}

/// The `kvcm_tls` fields as owned strings (None: NULL).
#[derive(Clone, Default)]
struct Tls {
    ca: Option<CString>,
    cert: Option<CString>,
    key: Option<CString>,
    server_name: Option<CString>,
}

impl Tls {
    /// The harness's CA, client certificate and key; the default server name.
    fn mutual(harness: &Harness) -> Tls {
        let files = harness.tls.as_ref().expect("a TLS harness");
        Tls {
            ca: Some(path(&files.ca)),
            cert: Some(path(&files.cert)),
            key: Some(path(&files.key)),
            server_name: None,
        }
    }

    /// The C struct, borrowing these strings.
    fn raw(&self) -> KvcmTls {
        let pointer = |s: &Option<CString>| s.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
        KvcmTls {
            ca_file: pointer(&self.ca),
            cert_file: pointer(&self.cert),
            key_file: pointer(&self.key),
            server_name: pointer(&self.server_name),
        }
    }
}

/// `kvcm_client_connect_tls` on `wire` (`tls` None: a NULL `kvcm_tls*`): the status, the
/// client (NULL on failure) and the message.
fn connect(grpc: &str, http: &str, wire: i32, tls: Option<&Tls>) -> (i32, *mut Client, String) {
    let (grpc, http, instance) = (cstring(grpc), cstring(http), cstring(INSTANCE));
    let raw = tls.map(Tls::raw);
    let tls = raw
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const KvcmTls);
    let mut client = std::ptr::dangling_mut();
    let mut message = std::ptr::null_mut();
    // SAFETY: NUL-terminated strings and a kvcm_tls that outlive the call; local outputs.
    let status = unsafe {
        kvcm_client_connect_tls(
            grpc.as_ptr(),
            http.as_ptr(),
            instance.as_ptr(),
            wire,
            std::ptr::null(),
            tls,
            &mut client,
            &mut message,
        )
    };
    (status, client, take(message))
}

/// A connected client (the connect must succeed).
fn connected(grpc: &str, http: &str, wire: i32, tls: Option<&Tls>) -> *mut Client {
    let (status, client, message) = connect(grpc, http, wire, tls);
    assert_eq!(status, KVCM_OK, "{message}");
    assert!(!client.is_null());
    client
}

/// kvcm_prefix_match of [`KEYS`]: status, hits, message.
fn prefix_match(client: *mut Client) -> (i32, usize, String) {
    let mut out = std::ptr::null_mut();
    let mut message = std::ptr::null_mut();
    // SAFETY: a live client, a key array of its length, local outputs.
    let status =
        unsafe { kvcm_prefix_match(client, KEYS.as_ptr(), KEYS.len(), &mut out, &mut message) };
    // SAFETY: `out` is NULL or a result of this call, freed once.
    let hits = unsafe {
        let hits = kvcm_locations_count(out);
        kvcm_locations_free(out);
        hits
    };
    (status, hits, take(message))
}

fn fast_path_up(client: *mut Client) -> bool {
    // SAFETY: a live client of this library.
    unsafe { kvcm_client_fast_path_up(client) == 1 }
}

fn fast_path_hits(client: *mut Client) -> u64 {
    let mut metrics = KvcmFastPathMetrics::default();
    // SAFETY: a live client and a local output.
    let status = unsafe { kvcm_client_metrics(client, &mut metrics) };
    assert_eq!(status, KVCM_OK);
    metrics.hits
}

fn free(client: *mut Client) {
    // SAFETY: a client of this library, freed once.
    unsafe { kvcm_client_free(client) };
}

/// A TLS server with [`KEYS`] written for [`INSTANCE`].
fn prepared() -> Harness {
    let harness = Harness::start_tls();
    harness.register(INSTANCE);
    harness.write(INSTANCE, &KEYS);
    harness
}

/// `127.0.0.1:<port>` of the harness's gRPC listener (no scheme).
fn bare_grpc(harness: &Harness) -> &str {
    harness
        .grpc
        .strip_prefix("https://")
        .expect("an https:// harness")
}

#[test]
fn a_client_certificate_and_the_servers_ca_reach_a_mutual_tls_server() {
    let harness = prepared();
    let tls = Tls::mutual(&harness);

    // A bare host:port becomes https:// with TLS; the lookup is answered on the fast path.
    let client = connected(
        bare_grpc(&harness),
        &harness.http,
        KVCM_WIRE_SOFT_TCP,
        Some(&tls),
    );
    assert!(fast_path_up(client), "the bootstrap over TLS admitted us");
    assert_eq!(prefix_match(client), (KVCM_OK, KEYS.len(), String::new()));
    assert_eq!(fast_path_hits(client), 1, "answered on the fast path");
    free(client);

    // Without a fast path every lookup is a gRPC call over TLS (an explicit https:// too).
    let client = connected(&harness.grpc, &harness.http, KVCM_WIRE_NONE, Some(&tls));
    assert!(!fast_path_up(client));
    assert_eq!(prefix_match(client), (KVCM_OK, KEYS.len(), String::new()));
    assert_eq!(fast_path_hits(client), 0, "answered over gRPC");
    free(client);

    // The server name the certificate carries, given explicitly, is the default's.
    let named = Tls {
        server_name: Some(cstring("localhost")),
        ..tls.clone()
    };
    let client = connected(
        bare_grpc(&harness),
        &harness.http,
        KVCM_WIRE_NONE,
        Some(&named),
    );
    assert_eq!(prefix_match(client).0, KVCM_OK);
    free(client);
}

#[test]
fn plaintext_anonymous_and_mistrusting_clients_reach_nothing() {
    let harness = prepared();
    let tls = Tls::mutual(&harness);
    let plain_grpc = format!("http://{}", bare_grpc(&harness));
    let files = harness.tls.as_ref().expect("TLS files");
    let anonymous = Tls {
        cert: None,
        key: None,
        ..tls.clone()
    };
    // The client CA's certificate did not sign the server's certificate.
    let clients_ca = files.ca.with_file_name("clients.pem");
    let mistrusting = Tls {
        ca: Some(path(&clients_ca)),
        ..tls.clone()
    };
    let other_name = Tls {
        server_name: Some(cstring("kvcm.example")),
        ..tls.clone()
    };
    let cases = [
        ("plaintext", plain_grpc.as_str(), None),
        (
            "no client certificate",
            bare_grpc(&harness),
            Some(&anonymous),
        ),
        ("another CA", bare_grpc(&harness), Some(&mistrusting)),
        (
            "another server name",
            bare_grpc(&harness),
            Some(&other_name),
        ),
    ];
    for (case, grpc, tls) in cases {
        let client = connected(grpc, &harness.http, KVCM_WIRE_SOFT_TCP, tls);
        assert!(!fast_path_up(client), "{case}: no bootstrap");
        let (status, hits, message) = prefix_match(client);
        assert_eq!((status, hits), (KVCM_E_UNREACHABLE, 0), "{case}: {message}");
        assert!(
            message.contains("no kvcm server reachable"),
            "{case}: {message}"
        );
        free(client);
    }
    // The same server still answers a client with the right settings.
    let client = connected(
        bare_grpc(&harness),
        &harness.http,
        KVCM_WIRE_NONE,
        Some(&tls),
    );
    assert_eq!(prefix_match(client).0, KVCM_OK);
    free(client);
}

#[test]
fn bad_tls_fields_are_refused_naming_the_field() {
    let harness = Harness::start_tls();
    let tls = Tls::mutual(&harness);
    let files = harness.tls.as_ref().expect("TLS files");
    let grpc = bare_grpc(&harness);
    let missing = path(&files.ca.with_file_name("missing.pem"));
    let with = |edit: fn(&mut Tls, CString), value: CString| {
        let mut tls = tls.clone();
        edit(&mut tls, value);
        tls
    };
    let invalid_utf8 = CString::new(b"\xc3(".to_vec()).expect("no NUL");
    let cases: Vec<(&str, &str, Tls, i32, &str)> = vec![
        (
            "NULL ca_file",
            grpc,
            Tls {
                ca: None,
                ..tls.clone()
            },
            KVCM_E_NULL_ARGUMENT,
            "`tls.ca_file` is NULL",
        ),
        (
            "cert without key",
            grpc,
            Tls {
                key: None,
                ..tls.clone()
            },
            KVCM_E_INVALID_ARGUMENT,
            "tls.key_file is NULL but tls.cert_file is set",
        ),
        (
            "key without cert",
            grpc,
            Tls {
                cert: None,
                ..tls.clone()
            },
            KVCM_E_INVALID_ARGUMENT,
            "tls.cert_file is NULL but tls.key_file is set",
        ),
        (
            "unreadable CA",
            grpc,
            with(|t, v| t.ca = Some(v), missing.clone()),
            KVCM_E_INVALID_ARGUMENT,
            "tls.ca_file: CA",
        ),
        (
            "unreadable certificate",
            grpc,
            with(|t, v| t.cert = Some(v), missing.clone()),
            KVCM_E_INVALID_ARGUMENT,
            "tls.cert_file: certificate",
        ),
        (
            "a key as the CA",
            grpc,
            with(|t, v| t.ca = Some(v), path(&files.key)),
            KVCM_E_INVALID_ARGUMENT,
            "tls.ca_file: CA: no PEM certificate",
        ),
        (
            "a certificate as the key",
            grpc,
            with(|t, v| t.key = Some(v), path(&files.cert)),
            KVCM_E_INVALID_ARGUMENT,
            "tls.key_file: key",
        ),
        (
            "a bad server name",
            grpc,
            with(|t, v| t.server_name = Some(v), cstring("not a name!")),
            KVCM_E_INVALID_ARGUMENT,
            "tls.server_name",
        ),
        (
            "a server name not UTF-8",
            grpc,
            with(|t, v| t.server_name = Some(v), invalid_utf8),
            KVCM_E_INVALID_UTF8,
            "`tls.server_name` is not valid UTF-8",
        ),
    ];
    for (case, grpc, tls, expected, text) in &cases {
        let (status, client, message) = connect(grpc, &harness.http, KVCM_WIRE_NONE, Some(tls));
        assert_eq!(status, *expected, "{case}: {message}");
        assert!(message.contains(text), "{case}: {message:?} lacks {text:?}");
        assert!(client.is_null(), "{case}: failure leaves *client_out NULL");
    }
    // An http:// endpoint contradicts TLS: the client library refuses it.
    let plain_grpc = format!("http://{grpc}");
    let (status, client, message) = connect(&plain_grpc, &harness.http, KVCM_WIRE_NONE, Some(&tls));
    assert_eq!(status, KVCM_E_INVALID_ARGUMENT, "{message}");
    assert!(message.contains("must start with https://"), "{message}");
    assert!(client.is_null());
    // https:// without TLS likewise.
    let (status, _, message) = connect(&harness.grpc, &harness.http, KVCM_WIRE_NONE, None);
    assert_eq!(status, KVCM_E_INVALID_ARGUMENT, "{message}");
    assert!(message.contains("must start with http://"), "{message}");
}

#[test]
fn a_null_tls_is_the_keyed_plaintext_connect() {
    // A plaintext server answers kvcm_client_connect_tls(..., NULL, ...) as it answers
    // kvcm_client_connect.
    let harness = Harness::start();
    harness.register(INSTANCE);
    harness.write(INSTANCE, &KEYS);
    let grpc = harness.grpc.strip_prefix("http://").expect("http://");
    let client = connected(grpc, &harness.http, KVCM_WIRE_SOFT_TCP, None);
    assert!(fast_path_up(client));
    assert_eq!(prefix_match(client), (KVCM_OK, KEYS.len(), String::new()));
    free(client);
}
