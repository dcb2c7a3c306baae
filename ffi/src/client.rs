//! `kvcm_client`: connect (plaintext or TLS), the three lookups, fast-path metrics, free.
//!
//! Invariants: a `kvcm_client*` is a `Box<Client>` from [`kvcm_client_connect_tls`] (which
//! the other connects call), freed once by [`kvcm_client_free`]; it is `Send + Sync`, so C
//! may share it across threads (calls serialise inside the client). Each lookup hands out a
//! new, independent result; the client's answer it is flattened from is kept per calling
//! thread and reused by that thread's next lookup (its locations and strings are
//! overwritten, not allocated again).

use std::cell::RefCell;
use std::ffi::c_char;
use std::path::Path;

use kvcm::proto::meta::CacheLocation;
use kvcm::tls_client::TlsClientError;
use kvcm_client::{Client, ClientConfig, ServerAddress, TlsClient, Wire};

use crate::args;
use crate::error::{guard, shielded, FfiError, KVCM_E_NULL_ARGUMENT, KVCM_E_PANIC};
use crate::locations::Locations;

/// `wire` value: no fast path, every lookup over gRPC.
pub const KVCM_WIRE_NONE: i32 = 0;
/// `wire` value: the fast path over soft-TCP (works across hosts).
pub const KVCM_WIRE_SOFT_TCP: i32 = 1;
/// `wire` value: the fast path over soft shared memory (the server's host only).
pub const KVCM_WIRE_SOFT_SHM: i32 = 2;
/// `wire` value: the fast path over RDMA verbs (a library built with feature `rdma`).
pub const KVCM_WIRE_VERBS: i32 = 3;

/// A snapshot of the fast-path counters (`kvcm_fast_path_metrics`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvcmFastPathMetrics {
    /// Lookups the fast path answered.
    pub hits: u64,
    /// Lookups answered by gRPC instead.
    pub fallbacks: u64,
    /// Copies read again (torn buckets, retired generations).
    pub retries: u64,
    /// Round trips beyond the first.
    pub extra_round_trips: u64,
    /// Fast-path connections made after the first.
    pub reconnects: u64,
}

/// The wire of a `wire` argument.
pub(crate) fn wire(code: i32) -> Result<Option<Wire>, FfiError> {
    match code {
        KVCM_WIRE_NONE => Ok(None),
        KVCM_WIRE_SOFT_TCP => Ok(Some(Wire::Tcp)),
        KVCM_WIRE_SOFT_SHM => Ok(Some(Wire::Shm)),
        KVCM_WIRE_VERBS => Ok(Some(Wire::Verbs)),
        other => Err(FfiError::InvalidArgument(format!(
            "wire {other} is unknown (0 none, 1 soft-tcp, 2 soft-shm, 3 verbs)"
        ))),
    }
}

/// The servers of comma-separated gRPC endpoints and HTTP addresses, paired in order;
/// a `host:port` endpoint gets the scheme of the connection (`https://` when `tls`).
pub(crate) fn servers(grpc: &str, http: &str, tls: bool) -> Result<Vec<ServerAddress>, FfiError> {
    let grpc: Vec<&str> = grpc.split(',').map(str::trim).collect();
    let http: Vec<&str> = http.split(',').map(str::trim).collect();
    if grpc.len() != http.len() {
        return Err(FfiError::InvalidArgument(format!(
            "{} gRPC endpoints but {} HTTP addresses",
            grpc.len(),
            http.len()
        )));
    }
    grpc.iter()
        .zip(&http)
        .map(|(g, h)| server(g, h, tls))
        .collect()
}

/// One server; an explicit scheme is kept as written (the client library refuses one that
/// contradicts the TLS setting).
fn server(grpc: &str, http: &str, tls: bool) -> Result<ServerAddress, FfiError> {
    let http = http.parse().map_err(|_| {
        FfiError::InvalidArgument(format!("HTTP address {http:?} is not host-ip:port"))
    })?;
    let grpc = match grpc {
        "" => return Err(FfiError::InvalidArgument("gRPC endpoint is empty".into())),
        g if g.starts_with("http://") || g.starts_with("https://") => g.to_string(),
        g if g.contains("://") => {
            return Err(FfiError::InvalidArgument(format!(
                "gRPC endpoint {g:?}: only http:// and https:// are supported"
            )))
        }
        g if tls => format!("https://{g}"),
        g => format!("http://{g}"),
    };
    Ok(ServerAddress { grpc, http })
}

/// TLS towards the servers (`kvcm_tls`): PEM file paths and the name the servers'
/// certificates must carry.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KvcmTls {
    /// The CA the servers' certificates chain to (required).
    pub ca_file: *const c_char,
    /// The client certificate for mutual TLS (NULL: none; set with `key_file` or not at all).
    pub cert_file: *const c_char,
    /// Its private key (NULL exactly when `cert_file` is).
    pub key_file: *const c_char,
    /// The name the servers' certificates carry (NULL: `localhost`).
    pub server_name: *const c_char,
}

/// The server name of a `kvcm_tls` whose `server_name` is NULL.
const DEFAULT_SERVER_NAME: &str = "localhost";

/// The field of `kvcm_tls` a TLS setup error is about.
fn tls_field(error: &TlsClientError) -> &'static str {
    let what = match error {
        TlsClientError::File { what, .. } | TlsClientError::Pem { what, .. } => *what,
        TlsClientError::ServerName(_) => return "tls.server_name",
        TlsClientError::Config(_) => return "tls",
    };
    match what {
        "CA" => "tls.ca_file",
        "certificate" => "tls.cert_file",
        "key" => "tls.key_file",
        _ => "tls",
    }
}

/// The TLS client of a `kvcm_tls` (NULL: plaintext), its files read and checked.
///
/// # Safety
/// `tls` is NULL or points to a readable `kvcm_tls` whose strings are NULL or
/// NUL-terminated.
unsafe fn tls_client(tls: *const KvcmTls) -> Result<Option<TlsClient>, FfiError> {
    // SAFETY: the caller promises NULL or a readable kvcm_tls.
    let Some(tls) = (unsafe { tls.as_ref() }) else {
        return Ok(None);
    };
    // SAFETY: the caller promises each field is NULL or NUL-terminated.
    let (ca, cert, key, server_name) = unsafe {
        (
            args::text(tls.ca_file, "tls.ca_file")?,
            args::optional_text(tls.cert_file, "tls.cert_file")?,
            args::optional_text(tls.key_file, "tls.key_file")?,
            args::optional_text(tls.server_name, "tls.server_name")?,
        )
    };
    let identity = match (cert, key) {
        (Some(cert), Some(key)) => Some((Path::new(cert), Path::new(key))),
        (None, None) => None,
        (Some(_), None) => {
            return Err(FfiError::InvalidArgument(
                "tls.key_file is NULL but tls.cert_file is set (mutual TLS needs both)".into(),
            ))
        }
        (None, Some(_)) => {
            return Err(FfiError::InvalidArgument(
                "tls.cert_file is NULL but tls.key_file is set (mutual TLS needs both)".into(),
            ))
        }
    };
    let server_name = server_name.unwrap_or(DEFAULT_SERVER_NAME);
    TlsClient::from_files(Path::new(ca), identity, server_name)
        .map(Some)
        .map_err(|e| FfiError::InvalidArgument(format!("{}: {e}", tls_field(&e))))
}

/// The client configuration of a connect's arguments (NULL `api_key`: none; NULL `tls`:
/// plaintext), shared by the client and engine connects.
///
/// # Safety
/// The strings are NULL or NUL-terminated; `tls` is NULL or a readable `kvcm_tls`.
pub(crate) unsafe fn client_config(
    grpc: *const c_char,
    http: *const c_char,
    instance_id: *const c_char,
    wire_kind: i32,
    api_key: *const c_char,
    tls: *const KvcmTls,
) -> Result<ClientConfig, FfiError> {
    // SAFETY: the caller's promises about every pointer are passed on unchanged.
    unsafe {
        let (grpc, http) = (args::text(grpc, "grpc")?, args::text(http, "http")?);
        let instance_id = args::text(instance_id, "instance_id")?.to_string();
        let wire = wire(wire_kind)?;
        let api_key = args::optional_text(api_key, "api_key")?.map(str::to_string);
        let tls = tls_client(tls)?;
        Ok(ClientConfig {
            servers: servers(grpc, http, tls.is_some())?,
            instance_id,
            wire,
            api_key,
            tls,
        })
    }
}

/// Connects a client (see kvcm.h); `*client_out` is NULL on failure.
///
/// # Safety
/// The strings are NULL or NUL-terminated; `client_out` and `error_message` are NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn kvcm_client_connect(
    grpc: *const c_char,
    http: *const c_char,
    instance_id: *const c_char,
    wire_kind: i32,
    client_out: *mut *mut Client,
    error_message: *mut *mut c_char,
) -> i32 {
    let (api_key, tls) = (std::ptr::null(), std::ptr::null());
    // SAFETY: the caller's promises are passed on; a NULL key and NULL TLS are allowed.
    unsafe {
        kvcm_client_connect_tls(
            grpc,
            http,
            instance_id,
            wire_kind,
            api_key,
            tls,
            client_out,
            error_message,
        )
    }
}

/// As [`kvcm_client_connect`], with an API key (NULL: none) its calls carry.
///
/// # Safety
/// The strings are NULL or NUL-terminated; `client_out` and `error_message` are NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn kvcm_client_connect_with_key(
    grpc: *const c_char,
    http: *const c_char,
    instance_id: *const c_char,
    wire_kind: i32,
    api_key: *const c_char,
    client_out: *mut *mut Client,
    error_message: *mut *mut c_char,
) -> i32 {
    // SAFETY: the caller's promises are passed on; NULL TLS is allowed.
    unsafe {
        kvcm_client_connect_tls(
            grpc,
            http,
            instance_id,
            wire_kind,
            api_key,
            std::ptr::null(),
            client_out,
            error_message,
        )
    }
}

/// As [`kvcm_client_connect_with_key`], over TLS when `tls` is not NULL (see kvcm.h).
///
/// # Safety
/// The strings are NULL or NUL-terminated; `tls` is NULL or a readable `kvcm_tls` whose
/// strings are NULL or NUL-terminated; `client_out` and `error_message` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn kvcm_client_connect_tls(
    grpc: *const c_char,
    http: *const c_char,
    instance_id: *const c_char,
    wire_kind: i32,
    api_key: *const c_char,
    tls: *const KvcmTls,
    client_out: *mut *mut Client,
    error_message: *mut *mut c_char,
) -> i32 {
    // SAFETY: the caller's promises about every pointer are passed on unchanged.
    unsafe {
        guard(error_message, || {
            args::store(client_out, "client_out", std::ptr::null_mut())?;
            let config = client_config(grpc, http, instance_id, wire_kind, api_key, tls)?;
            let client = Box::new(Client::connect(config)?);
            args::store(client_out, "client_out", Box::into_raw(client))
        })
    }
}

/// Frees a client; NULL is a no-op.
///
/// # Safety
/// `client` is NULL or a client of this library, not yet freed, with no call in flight.
#[no_mangle]
pub unsafe extern "C" fn kvcm_client_free(client: *mut Client) {
    if client.is_null() {
        return;
    }
    // SAFETY: the caller hands back a client from `Box::into_raw`, once, unused elsewhere.
    shielded((), || drop(unsafe { Box::from_raw(client) }));
}

/// Which lookup to run.
#[derive(Debug, Clone, Copy)]
enum Query {
    PrefixMatch,
    BatchGet,
    SlidingWindow(i32),
}

thread_local! {
    /// This thread's last client answer, reused by its next lookup (see the module doc).
    static ANSWER: RefCell<Vec<CacheLocation>> = const { RefCell::new(Vec::new()) };
}

/// Runs one lookup and hands its result out through `out`.
///
/// # Safety
/// As for the lookup entry points.
unsafe fn lookup(
    client: *const Client,
    keys: *const i64,
    count: usize,
    query: Query,
    out: *mut *mut Locations,
    error_message: *mut *mut c_char,
) -> i32 {
    // SAFETY: the caller's promises about every pointer are passed on unchanged.
    unsafe {
        guard(error_message, || {
            args::store(out, "out", std::ptr::null_mut())?;
            let client = args::object(client, "client")?;
            let keys = args::keys(keys, count)?;
            let flat = |answer: &mut Vec<CacheLocation>| {
                match query {
                    Query::PrefixMatch => client.prefix_match_into(keys, answer),
                    Query::BatchGet => client.batch_get_into(keys, answer),
                    Query::SlidingWindow(size) => client.sliding_window_into(keys, size, answer),
                }?;
                Ok::<_, FfiError>(Box::new(Locations::new(answer)))
            };
            // A thread that is exiting (a TLS destructor looking up) has no working copy left.
            let result = ANSWER
                .try_with(|answer| flat(&mut answer.borrow_mut()))
                .unwrap_or_else(|_| flat(&mut Vec::new()))?;
            args::store(out, "out", Box::into_raw(result))
        })
    }
}

/// Prefix match over `count` block keys; `*out` is a new result (NULL on failure).
///
/// # Safety
/// `client` is NULL or live; `keys` is NULL or `count` readable keys; `out` and
/// `error_message` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn kvcm_prefix_match(
    client: *const Client,
    keys: *const i64,
    count: usize,
    out: *mut *mut Locations,
    error_message: *mut *mut c_char,
) -> i32 {
    // SAFETY: the caller's promises are those `lookup` needs.
    unsafe { lookup(client, keys, count, Query::PrefixMatch, out, error_message) }
}

/// Batch get over `count` block keys; `*out` is a new result (NULL on failure).
///
/// # Safety
/// As for [`kvcm_prefix_match`].
#[no_mangle]
pub unsafe extern "C" fn kvcm_batch_get(
    client: *const Client,
    keys: *const i64,
    count: usize,
    out: *mut *mut Locations,
    error_message: *mut *mut c_char,
) -> i32 {
    // SAFETY: the caller's promises are those `lookup` needs.
    unsafe { lookup(client, keys, count, Query::BatchGet, out, error_message) }
}

/// Reverse rolling sliding-window match of window `sw_size` over `count` block keys.
///
/// # Safety
/// As for [`kvcm_prefix_match`].
#[no_mangle]
pub unsafe extern "C" fn kvcm_sliding_window(
    client: *const Client,
    keys: *const i64,
    count: usize,
    sw_size: i32,
    out: *mut *mut Locations,
    error_message: *mut *mut c_char,
) -> i32 {
    let query = Query::SlidingWindow(sw_size);
    // SAFETY: the caller's promises are those `lookup` needs.
    unsafe { lookup(client, keys, count, query, out, error_message) }
}

/// Copies the fast-path counters into `*out`.
///
/// # Safety
/// `client` is NULL or live; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn kvcm_client_metrics(
    client: *const Client,
    out: *mut KvcmFastPathMetrics,
) -> i32 {
    // SAFETY: the caller's promises are passed on unchanged; accessors return no message.
    unsafe {
        guard(std::ptr::null_mut(), || {
            let m = args::object(client, "client")?.metrics();
            let metrics = KvcmFastPathMetrics {
                hits: m.hits,
                fallbacks: m.fallbacks,
                retries: m.retries,
                extra_round_trips: m.extra_round_trips,
                reconnects: m.reconnects,
            };
            args::store(out, "out", metrics)
        })
    }
}

/// Turns read reports on (`on` ≠ 0) or off (see kvcm.h).
///
/// # Safety
/// `client` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn kvcm_client_set_read_reports(client: *const Client, on: i32) -> i32 {
    // SAFETY: the caller's promises are passed on unchanged; setters return no message.
    unsafe {
        guard(std::ptr::null_mut(), || {
            args::object(client, "client")?.set_read_reports(on != 0);
            Ok(())
        })
    }
}

/// Reports the fast-path lookups not reported yet and copies the counts of reported and
/// lost ones into `*reported` / `*unreported` (see kvcm.h).
///
/// # Safety
/// `client` is NULL or live; `reported` and `unreported` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn kvcm_client_flush_read_reports(
    client: *const Client,
    reported: *mut u64,
    unreported: *mut u64,
) -> i32 {
    // SAFETY: the caller's promises are passed on unchanged; accessors return no message.
    unsafe {
        guard(std::ptr::null_mut(), || {
            let client = args::object(client, "client")?;
            // Bad output pointers are refused before anything is sent.
            args::store(reported, "reported", 0)?;
            args::store(unreported, "unreported", 0)?;
            client.flush_read_reports();
            let metrics = client.metrics();
            args::store(reported, "reported", metrics.reads_reported)?;
            args::store(unreported, "unreported", metrics.reads_unreported)
        })
    }
}

/// 1 when lookups currently use the fast path, 0 when not, `KVCM_E_NULL_ARGUMENT` for NULL.
///
/// # Safety
/// `client` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn kvcm_client_fast_path_up(client: *const Client) -> i32 {
    // SAFETY: the caller promises a live client or NULL.
    shielded(KVCM_E_PANIC, || match unsafe { client.as_ref() } {
        Some(client) => i32::from(client.fast_path_up()),
        None => KVCM_E_NULL_ARGUMENT,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::*;
    use std::ffi::CStr;

    /// A closed port on loopback: connections to it are refused at once.
    fn closed_port() -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().to_string()
    }

    /// Connects with these arguments; returns the status, the client and the message.
    fn connect(
        grpc: &CStr,
        http: &CStr,
        instance: *const c_char,
        wire: i32,
    ) -> (i32, *mut Client, String) {
        let mut client = std::ptr::dangling_mut();
        let mut message = std::ptr::null_mut();
        // SAFETY: C strings, local outputs.
        let code = unsafe {
            kvcm_client_connect(
                grpc.as_ptr(),
                http.as_ptr(),
                instance,
                wire,
                &mut client,
                &mut message,
            )
        };
        (code, client, take(message))
    }

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

    fn cstring(text: &str) -> std::ffi::CString {
        std::ffi::CString::new(text).unwrap()
    }

    #[test]
    fn connect_rejects_bad_arguments() {
        let (grpc, http) = (c"127.0.0.1:1", c"127.0.0.1:1");
        let cases: [(&CStr, &CStr, *const c_char, i32, i32, &str); 8] = [
            (
                grpc,
                http,
                std::ptr::null(),
                1,
                KVCM_E_NULL_ARGUMENT,
                "`instance_id` is NULL",
            ),
            (
                grpc,
                http,
                c"\xc3(".as_ptr(),
                1,
                KVCM_E_INVALID_UTF8,
                "`instance_id` is not valid UTF-8",
            ),
            (
                grpc,
                http,
                c"i".as_ptr(),
                4,
                KVCM_E_INVALID_ARGUMENT,
                "wire 4 is unknown",
            ),
            (
                grpc,
                c"nope",
                c"i".as_ptr(),
                1,
                KVCM_E_INVALID_ARGUMENT,
                "\"nope\" is not host-ip:port",
            ),
            (
                c"ftp://h:1",
                http,
                c"i".as_ptr(),
                1,
                KVCM_E_INVALID_ARGUMENT,
                "only http:// and https://",
            ),
            (
                c"https://h:1",
                http,
                c"i".as_ptr(),
                1,
                KVCM_E_INVALID_ARGUMENT,
                "must start with http:// (tls is not set)",
            ),
            (
                c"a:1,b:2",
                http,
                c"i".as_ptr(),
                1,
                KVCM_E_INVALID_ARGUMENT,
                "2 gRPC endpoints but 1",
            ),
            (
                grpc,
                http,
                c"".as_ptr(),
                0,
                KVCM_E_INVALID_ARGUMENT,
                "instance_id is empty",
            ),
        ];
        for (grpc, http, instance, wire, expected, text) in cases {
            let (code, client, message) = connect(grpc, http, instance, wire);
            assert_eq!(code, expected, "{message}");
            assert!(message.contains(text), "{message:?} lacks {text:?}");
            assert!(client.is_null(), "failure leaves *client_out NULL");
        }
        let mut message = std::ptr::null_mut();
        // SAFETY: a NULL output is refused before anything is written.
        let code = unsafe {
            kvcm_client_connect(
                grpc.as_ptr(),
                http.as_ptr(),
                c"i".as_ptr(),
                0,
                std::ptr::null_mut(),
                &mut message,
            )
        };
        assert_eq!(code, KVCM_E_NULL_ARGUMENT);
        assert!(take(message).contains("client_out"));
    }

    #[test]
    fn lookups_reject_bad_input_and_report_unreachable() {
        let address = cstring(&closed_port());
        let (code, client, message) = connect(&address, &address, c"i".as_ptr(), 1);
        assert_eq!(code, KVCM_OK, "{message}");
        let keys = [1i64, 2, 3];
        let mut out = std::ptr::dangling_mut();
        let mut message = std::ptr::null_mut();
        // SAFETY: a live client, local keys and outputs.
        unsafe {
            let code =
                kvcm_prefix_match(std::ptr::null(), keys.as_ptr(), 3, &mut out, &mut message);
            assert_eq!(code, KVCM_E_NULL_ARGUMENT);
            assert!(out.is_null());
            assert!(take(message).contains("`client` is NULL"));
            let code = kvcm_batch_get(client, std::ptr::null(), 2, &mut out, &mut message);
            assert_eq!(code, KVCM_E_NULL_ARGUMENT);
            assert!(take(message).contains("`keys` is NULL"));
            let code = kvcm_sliding_window(
                client,
                keys.as_ptr(),
                3,
                2,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            );
            assert_eq!(code, KVCM_E_NULL_ARGUMENT);
            let code = kvcm_prefix_match(client, keys.as_ptr(), 3, &mut out, &mut message);
            assert_eq!(code, KVCM_E_UNREACHABLE);
            assert!(out.is_null());
            assert!(take(message).contains("no kvcm server reachable"));
            let mut metrics = KvcmFastPathMetrics::default();
            assert_eq!(kvcm_client_metrics(client, &mut metrics), KVCM_OK);
            assert_eq!(metrics.hits, 0);
            assert_eq!(
                kvcm_client_metrics(client, std::ptr::null_mut()),
                KVCM_E_NULL_ARGUMENT
            );
            assert_eq!(
                kvcm_client_metrics(std::ptr::null(), &mut metrics),
                KVCM_E_NULL_ARGUMENT
            );
            assert_eq!(kvcm_client_fast_path_up(client), 0);
            assert_eq!(
                kvcm_client_fast_path_up(std::ptr::null()),
                KVCM_E_NULL_ARGUMENT
            );
            let null = std::ptr::null();
            assert_eq!(kvcm_client_set_read_reports(null, 1), KVCM_E_NULL_ARGUMENT);
            assert_eq!(kvcm_client_set_read_reports(client, 1), KVCM_OK);
            let (mut reported, mut unreported) = (7, 7);
            let flushed = kvcm_client_flush_read_reports(client, &mut reported, &mut unreported);
            assert_eq!((flushed, reported, unreported), (KVCM_OK, 0, 0));
            let refused =
                kvcm_client_flush_read_reports(client, std::ptr::null_mut(), &mut unreported);
            assert_eq!(refused, KVCM_E_NULL_ARGUMENT);
            let refused = kvcm_client_flush_read_reports(null, &mut reported, &mut unreported);
            assert_eq!(refused, KVCM_E_NULL_ARGUMENT);
            kvcm_client_free(client);
            kvcm_client_free(std::ptr::null_mut());
        }
    }

    #[test]
    fn several_servers_pair_in_order() {
        let pairs = servers("a:1, http://b:2", "127.0.0.1:1,127.0.0.1:2", false).unwrap();
        assert_eq!(pairs[0].grpc, "http://a:1");
        assert_eq!(pairs[1].grpc, "http://b:2");
        assert_eq!(pairs[1].http.port(), 2);
        assert!(servers("", "127.0.0.1:1", false).is_err());
        // With TLS a bare endpoint is https://; an explicit scheme is kept for the client
        // library to judge.
        let tls = servers(
            "a:1,https://b:2,http://c:3",
            "1.1.1.1:1,1.1.1.1:2,1.1.1.1:3",
            true,
        );
        let grpc: Vec<String> = tls.unwrap().into_iter().map(|s| s.grpc).collect();
        assert_eq!(grpc, ["https://a:1", "https://b:2", "http://c:3"]);
    }
}
