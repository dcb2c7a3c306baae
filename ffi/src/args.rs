//! C arguments turned into Rust values: every pointer is checked (NULL, alignment, length)
//! before it is read, so that bad input is an error and never undefined behaviour.

use std::ffi::{c_char, CStr};

use crate::error::FfiError;

/// The UTF-8 text of the NUL-terminated string `text` (the argument `name`).
///
/// # Safety
/// `text` is NULL or a NUL-terminated string that stays valid for `'a`.
pub unsafe fn text<'a>(text: *const c_char, name: &'static str) -> Result<&'a str, FfiError> {
    if text.is_null() {
        return Err(FfiError::NullArgument(name));
    }
    // SAFETY: non-NULL, and the caller promises a NUL-terminated string living for 'a.
    let bytes = unsafe { CStr::from_ptr(text) };
    bytes.to_str().map_err(|_| FfiError::InvalidUtf8(name))
}

/// The UTF-8 text of the optional string argument `name`: `None` when `text` is NULL.
///
/// # Safety
/// `text` is NULL or a NUL-terminated string that stays valid for `'a`.
pub unsafe fn optional_text<'a>(
    text: *const c_char,
    name: &'static str,
) -> Result<Option<&'a str>, FfiError> {
    if text.is_null() {
        return Ok(None);
    }
    // SAFETY: non-NULL, and the caller promises a NUL-terminated string living for 'a.
    unsafe { self::text(text, name) }.map(Some)
}

/// The `count` keys at `keys` (NULL is allowed when `count` is 0).
///
/// # Safety
/// `keys` is NULL or points to `count` readable `int64_t` that stay valid for `'a`.
pub unsafe fn keys<'a>(keys: *const i64, count: usize) -> Result<&'a [i64], FfiError> {
    // SAFETY: passed on from the caller.
    unsafe { slice(keys, count, "keys") }
}

/// The `count` elements at `pointer` (the argument `name`; NULL is allowed when `count` is
/// 0).
///
/// # Safety
/// `pointer` is NULL or points to `count` readable `T` that stay valid for `'a`.
pub unsafe fn slice<'a, T>(
    pointer: *const T,
    count: usize,
    name: &'static str,
) -> Result<&'a [T], FfiError> {
    checked(pointer, count, name)?;
    if count == 0 {
        return Ok(&[]);
    }
    // SAFETY: non-NULL, aligned, a size that fits isize (checked), and the caller promises
    // `count` readable elements living for 'a.
    Ok(unsafe { std::slice::from_raw_parts(pointer, count) })
}

/// The `count` writable elements at `pointer` (the argument `name`; NULL is allowed when
/// `count` is 0).
///
/// # Safety
/// `pointer` is NULL or points to `count` writable `T`, used by nothing else for `'a`.
pub unsafe fn slice_mut<'a, T>(
    pointer: *mut T,
    count: usize,
    name: &'static str,
) -> Result<&'a mut [T], FfiError> {
    checked(pointer, count, name)?;
    if count == 0 {
        return Ok(&mut []);
    }
    // SAFETY: non-NULL, aligned, a size that fits isize (checked), and the caller promises
    // `count` writable elements no one else uses for 'a.
    Ok(unsafe { std::slice::from_raw_parts_mut(pointer, count) })
}

/// Checks a pointer to `count` elements: non-NULL unless empty, aligned, not too large.
fn checked<T>(pointer: *const T, count: usize, name: &'static str) -> Result<(), FfiError> {
    if count == 0 {
        return Ok(());
    }
    if pointer.is_null() {
        return Err(FfiError::NullArgument(name));
    }
    if !pointer.is_aligned() {
        return Err(FfiError::InvalidArgument(format!("{name} is misaligned")));
    }
    if count > isize::MAX as usize / size_of::<T>().max(1) {
        return Err(FfiError::InvalidArgument(format!(
            "{name}: count {count} is too large"
        )));
    }
    Ok(())
}

/// The `len` bytes at `data` (any pointer when `len` is 0).
///
/// # Safety
/// When `len` > 0, `data` is non-NULL and readable for `len` bytes that stay valid for `'a`.
pub unsafe fn bytes<'a>(data: *const u8, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: the caller promises `len` readable bytes at a non-NULL `data`.
    unsafe { std::slice::from_raw_parts(data, len) }
}

/// The `len` writable bytes at `data` (any pointer when `len` is 0).
///
/// # Safety
/// When `len` > 0, `data` is non-NULL and writable for `len` bytes no one else uses for
/// `'a`.
pub unsafe fn bytes_mut<'a>(data: *mut u8, len: usize) -> &'a mut [u8] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: the caller promises `len` writable bytes at a non-NULL `data`, unaliased.
    unsafe { std::slice::from_raw_parts_mut(data, len) }
}

/// The object behind `pointer` (the argument `name`).
///
/// # Safety
/// `pointer` is NULL or points to a live `T` that stays valid for `'a`.
pub unsafe fn object<'a, T>(pointer: *const T, name: &'static str) -> Result<&'a T, FfiError> {
    // SAFETY: the caller promises a non-NULL pointer is a live T.
    unsafe { pointer.as_ref() }.ok_or(FfiError::NullArgument(name))
}

/// Stores `value` at the output pointer `out` (the argument `name`).
///
/// # Safety
/// `out` is NULL or valid for one write of a `T`.
pub unsafe fn store<T>(out: *mut T, name: &'static str, value: T) -> Result<(), FfiError> {
    if out.is_null() {
        return Err(FfiError::NullArgument(name));
    }
    // SAFETY: non-NULL, and the caller promises it is writable.
    unsafe { out.write(value) };
    Ok(())
}

/// Fails with `NullArgument(name)` when `out` is NULL (checked before work is done).
pub fn require<T>(out: *mut T, name: &'static str) -> Result<(), FfiError> {
    if out.is_null() {
        return Err(FfiError::NullArgument(name));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_checks() {
        // SAFETY: NULL and NUL-terminated literals.
        unsafe {
            assert!(matches!(
                text(std::ptr::null(), "a"),
                Err(FfiError::NullArgument("a"))
            ));
            assert!(matches!(
                text(c"\xff".as_ptr(), "b"),
                Err(FfiError::InvalidUtf8("b"))
            ));
            assert_eq!(text(c"ok".as_ptr(), "c").unwrap(), "ok");
            assert_eq!(optional_text(std::ptr::null(), "d").unwrap(), None);
            assert!(matches!(
                optional_text(c"\xff".as_ptr(), "e"),
                Err(FfiError::InvalidUtf8("e"))
            ));
            assert_eq!(optional_text(c"ok".as_ptr(), "f").unwrap(), Some("ok"));
        }
    }

    #[test]
    fn key_checks() {
        let data = [1i64, 2, 3];
        // SAFETY: NULL, a local array, and a deliberately misaligned pointer never read.
        unsafe {
            assert_eq!(keys(std::ptr::null(), 0).unwrap(), &[] as &[i64]);
            assert!(matches!(
                keys(std::ptr::null(), 2),
                Err(FfiError::NullArgument("keys"))
            ));
            assert_eq!(keys(data.as_ptr(), 3).unwrap(), &data);
            let misaligned = data.as_ptr().cast::<u8>().wrapping_add(1).cast::<i64>();
            assert!(matches!(
                keys(misaligned, 1),
                Err(FfiError::InvalidArgument(_))
            ));
            assert!(matches!(
                keys(data.as_ptr(), usize::MAX),
                Err(FfiError::InvalidArgument(_))
            ));
        }
    }

    #[test]
    fn output_checks() {
        let mut slot = 0u32;
        // SAFETY: NULL and a local.
        unsafe {
            assert!(matches!(
                store(std::ptr::null_mut(), "out", 1u32),
                Err(FfiError::NullArgument("out"))
            ));
            store(&mut slot, "out", 7).unwrap();
        }
        assert_eq!(slot, 7);
        assert!(require(std::ptr::null_mut::<u8>(), "x").is_err());
    }
}
