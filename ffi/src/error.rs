//! Status codes and error messages of the C ABI, and the guard every entry point runs in.
//!
//! Invariants: an entry point returns `KVCM_OK` (0) on success, a negative `KVCM_E_*` for an
//! error found on this side, or the server's wire `ErrorCode` (> 1) when the server answered
//! an error; no panic crosses the ABI ([`guard`] turns one into `KVCM_E_PANIC`); an error
//! message is handed out only through a non-NULL `char** error_message`, as a string the
//! caller frees with [`kvcm_string_free`], and `*error_message` is set to NULL on success.

use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use kvcm_client::ClientError;

/// Success.
pub const KVCM_OK: i32 = 0;
/// A required pointer argument was NULL.
pub const KVCM_E_NULL_ARGUMENT: i32 = -1;
/// A string argument was not valid UTF-8.
pub const KVCM_E_INVALID_UTF8: i32 = -2;
/// An argument is unusable (bad address, unknown wire, empty instance id, misaligned keys).
pub const KVCM_E_INVALID_ARGUMENT: i32 = -3;
/// No server could be reached.
pub const KVCM_E_UNREACHABLE: i32 = -4;
/// An internal error (a caught panic); the library stays usable.
pub const KVCM_E_PANIC: i32 = -5;
/// An index past the end of a result.
pub const KVCM_E_OUT_OF_RANGE: i32 = -6;
/// The server answered an error without a usable code (0 or 1).
pub const KVCM_E_BAD_ANSWER: i32 = -7;
/// The device (GPU) holding the blocks failed or is missing.
pub const KVCM_E_DEVICE: i32 = -8;
/// The server refused the API key (none, unknown, revoked, expired) or what it may call.
pub const KVCM_E_UNAUTHORIZED: i32 = -9;

/// What an entry point can fail with.
#[derive(Debug, thiserror::Error)]
pub enum FfiError {
    /// A required pointer was NULL (the argument's name).
    #[error("argument `{0}` is NULL")]
    NullArgument(&'static str),
    /// A string argument is not UTF-8 (the argument's name).
    #[error("argument `{0}` is not valid UTF-8")]
    InvalidUtf8(&'static str),
    /// An argument is unusable (why).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An index past the end of a result.
    #[error("index {index} out of range (length {len})")]
    OutOfRange {
        /// The index asked for.
        index: usize,
        /// The length it had to be below.
        len: usize,
    },
    /// The client failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A panic was caught (its message).
    #[error("internal error: {0}")]
    Panic(String),
}

impl FfiError {
    /// The status code of this error.
    pub fn code(&self) -> i32 {
        match self {
            FfiError::NullArgument(_) => KVCM_E_NULL_ARGUMENT,
            FfiError::InvalidUtf8(_) => KVCM_E_INVALID_UTF8,
            FfiError::InvalidArgument(_) | FfiError::Client(ClientError::InvalidArgument(_)) => {
                KVCM_E_INVALID_ARGUMENT
            }
            FfiError::OutOfRange { .. } => KVCM_E_OUT_OF_RANGE,
            FfiError::Client(ClientError::Unreachable(_)) => KVCM_E_UNREACHABLE,
            FfiError::Client(ClientError::Server { code, .. }) if *code > 1 => *code,
            FfiError::Client(ClientError::Server { .. }) => KVCM_E_BAD_ANSWER,
            FfiError::Client(ClientError::Device(_)) => KVCM_E_DEVICE,
            FfiError::Client(ClientError::Unauthorized(_)) => KVCM_E_UNAUTHORIZED,
            FfiError::Panic(_) => KVCM_E_PANIC,
        }
    }
}

/// Runs `body` with panics caught; returns its status and, when `error_message` is not NULL,
/// stores the error's text there (NULL on success).
///
/// # Safety
/// `error_message` is NULL or valid for one pointer write.
pub unsafe fn guard(
    error_message: *mut *mut c_char,
    body: impl FnOnce() -> Result<(), FfiError>,
) -> i32 {
    let outcome = catch_unwind(AssertUnwindSafe(body))
        .unwrap_or_else(|payload| Err(FfiError::Panic(panic_text(payload.as_ref()))));
    let (code, message) = match outcome {
        Ok(()) => (KVCM_OK, std::ptr::null_mut()),
        Err(error) => (error.code(), c_string(&error.to_string())),
    };
    if !error_message.is_null() {
        // SAFETY: the caller promises a non-NULL `error_message` is writable.
        unsafe { error_message.write(message) };
    } else if !message.is_null() {
        // SAFETY: `message` came from `CString::into_raw` just above and was not handed out.
        drop(unsafe { CString::from_raw(message) });
    }
    code
}

/// Runs `body` of an entry point without a status code, `fallback` if it panics.
pub fn shielded<T>(fallback: T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(fallback)
}

/// The text of a panic payload.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "panic".to_string()
    }
}

/// `text` as an owned C string (interior NULs, which C cannot show, become spaces).
fn c_string(text: &str) -> *mut c_char {
    let bytes: Vec<u8> = text
        .bytes()
        .map(|b| if b == 0 { b' ' } else { b })
        .collect();
    CString::new(bytes).map_or(std::ptr::null_mut(), CString::into_raw)
}

/// Frees a string the library handed out (an `error_message`); NULL is a no-op.
///
/// # Safety
/// `text` is NULL or a string from this library, not yet freed.
#[no_mangle]
pub unsafe extern "C" fn kvcm_string_free(text: *mut c_char) {
    if text.is_null() {
        return;
    }
    // SAFETY: the caller hands back a string from `c_string` (CString::into_raw), once.
    shielded((), || drop(unsafe { CString::from_raw(text) }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn run(body: impl FnOnce() -> Result<(), FfiError>) -> (i32, Option<String>) {
        let mut message = std::ptr::null_mut();
        // SAFETY: `message` is a local, writable pointer.
        let code = unsafe { guard(&mut message, body) };
        if message.is_null() {
            return (code, None);
        }
        // SAFETY: a non-NULL message is a NUL-terminated string from `c_string`.
        let text = unsafe { CStr::from_ptr(message) }
            .to_str()
            .unwrap()
            .to_string();
        // SAFETY: freed once, as the header asks.
        unsafe { kvcm_string_free(message) };
        (code, Some(text))
    }

    #[test]
    fn success_clears_the_message() {
        let mut message = c_string("stale");
        let stale = message;
        // SAFETY: `message` is a local, writable pointer.
        let code = unsafe { guard(&mut message, || Ok(())) };
        assert_eq!(code, KVCM_OK);
        assert!(message.is_null());
        // SAFETY: `stale` is still owned by this test.
        unsafe { kvcm_string_free(stale) };
    }

    #[test]
    fn a_panic_becomes_a_status() {
        let (code, message) = run(|| panic!("boom"));
        assert_eq!(code, KVCM_E_PANIC);
        assert_eq!(message.as_deref(), Some("internal error: boom"));
    }

    #[test]
    fn codes_per_error_kind() {
        let server = |code| {
            FfiError::Client(ClientError::Server {
                code,
                message: "m".into(),
            })
        };
        assert_eq!(server(8).code(), 8);
        assert_eq!(server(0).code(), KVCM_E_BAD_ANSWER);
        assert_eq!(server(1).code(), KVCM_E_BAD_ANSWER);
        let unreachable = FfiError::Client(ClientError::Unreachable("x".into()));
        assert_eq!(unreachable.code(), KVCM_E_UNREACHABLE);
        let invalid = FfiError::Client(ClientError::InvalidArgument("x".into()));
        assert_eq!(invalid.code(), KVCM_E_INVALID_ARGUMENT);
        let device = FfiError::Client(ClientError::Device("x".into()));
        assert_eq!(device.code(), KVCM_E_DEVICE);
        let refused = FfiError::Client(ClientError::Unauthorized("x".into()));
        assert_eq!(refused.code(), KVCM_E_UNAUTHORIZED);
        let (code, message) = run(|| Err(FfiError::NullArgument("keys")));
        assert_eq!(code, KVCM_E_NULL_ARGUMENT);
        assert_eq!(message.as_deref(), Some("argument `keys` is NULL"));
    }

    #[test]
    fn no_message_pointer_is_fine() {
        // SAFETY: NULL is allowed for `error_message`.
        let code = unsafe { guard(std::ptr::null_mut(), || Err(FfiError::InvalidUtf8("x"))) };
        assert_eq!(code, KVCM_E_INVALID_UTF8);
        // SAFETY: NULL is a no-op.
        unsafe { kvcm_string_free(std::ptr::null_mut()) };
    }

    #[test]
    fn shielded_keeps_panics_inside() {
        assert_eq!(shielded(-5, || panic!("in a drop")), -5);
        assert_eq!(shielded(-5, || 3), 3);
    }

    #[test]
    fn interior_nul_is_replaced() {
        let (_, message) = run(|| Err(FfiError::InvalidArgument("a\0b".into())));
        assert_eq!(message.as_deref(), Some("invalid argument: a b"));
    }
}
