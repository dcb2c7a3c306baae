//! `kvcm_locations`: the answer of one lookup, laid out flat so that C reads it in place and
//! a binding (Python) decodes it in one pass from a single [`kvcm_locations_view`].
//!
//! Layout: per location its type and spec size; `spec_starts` (count + 1 entries) says
//! which specs are location i's (`spec_starts[i]..spec_starts[i + 1]`); every spec has two
//! strings, its name then its URI, stored back to back in `strings`, each followed by a NUL
//! byte (so C may also use it as a C string, and a binding may split the whole heap at the
//! NULs in one call), and delimited by `string_offsets` (2 × specs + 1 entries): string k
//! starts at `string_offsets[k]` and its NUL is at `string_offsets[k + 1] - 1`. Invariants:
//! the offsets increase and the last is the heap's length; the result is never changed after
//! it is built, so borrowed pointers stay valid until [`kvcm_locations_free`].

use std::ffi::c_char;

use kvcm::proto::meta::CacheLocation;

use crate::args;
use crate::error::{guard, shielded, FfiError};

/// The locations one lookup answered (opaque to C as `kvcm_locations`).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Locations {
    types: Vec<i32>,
    spec_sizes: Vec<i32>,
    spec_starts: Vec<usize>,
    string_offsets: Vec<usize>,
    strings: Vec<u8>,
    /// Per spec (over all locations), the writer's checksum of its bytes, when it gave one.
    checksums: Vec<Option<u64>>,
}

/// A borrowed string of a result: `len` bytes of UTF-8 at `ptr`, then a NUL byte.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KvcmStr {
    /// The first byte.
    pub ptr: *const c_char,
    /// The length in bytes.
    pub len: usize,
}

/// The whole result at once (`kvcm_flat_view` in C; the layout is in the module doc),
/// borrowed from it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct LocationsView {
    /// Number of locations.
    pub count: usize,
    /// Location types (`count` entries).
    pub types: *const i32,
    /// Spec sizes (`count` entries).
    pub spec_sizes: *const i32,
    /// Specs of location i: `spec_starts[i]..spec_starts[i + 1]` (`count + 1` entries).
    pub spec_starts: *const usize,
    /// Number of specs over all locations.
    pub spec_total: usize,
    /// String k: `strings[string_offsets[k]..string_offsets[k + 1] - 1]`, then a NUL; spec s
    /// has its name at k = 2s and its URI at k = 2s + 1 (`2 * spec_total + 1` entries).
    pub string_offsets: *const usize,
    /// Every name and URI, back to back (UTF-8, each followed by a NUL).
    pub strings: *const c_char,
    /// Length of `strings` in bytes, the NULs included.
    pub strings_len: usize,
}

impl Locations {
    /// The flat form of a client answer (one pass, one copy of each string).
    pub fn new(locations: &[CacheLocation]) -> Locations {
        let specs: usize = locations.iter().map(|l| l.location_specs.len()).sum();
        let mut out = Locations {
            types: Vec::with_capacity(locations.len()),
            spec_sizes: Vec::with_capacity(locations.len()),
            spec_starts: Vec::with_capacity(locations.len() + 1),
            string_offsets: Vec::with_capacity(2 * specs + 1),
            strings: Vec::new(),
            checksums: Vec::with_capacity(specs),
        };
        out.spec_starts.push(0);
        out.string_offsets.push(0);
        for location in locations {
            out.types.push(location.r#type);
            out.spec_sizes.push(location.spec_size);
            for spec in &location.location_specs {
                out.push_string(&spec.name);
                out.push_string(&spec.uri);
                out.checksums.push(spec.checksum);
            }
            out.spec_starts.push(out.specs());
        }
        out
    }

    fn push_string(&mut self, text: &str) {
        self.strings.extend_from_slice(text.as_bytes());
        self.strings.push(0);
        self.string_offsets.push(self.strings.len());
    }

    /// Number of locations.
    pub fn len(&self) -> usize {
        self.types.len()
    }

    /// Whether there is no location.
    pub fn is_empty(&self) -> bool {
        self.types.is_empty()
    }

    /// Number of specs over all locations.
    fn specs(&self) -> usize {
        (self.string_offsets.len() - 1) / 2
    }

    fn check(&self, index: usize) -> Result<(), FfiError> {
        if index < self.len() {
            return Ok(());
        }
        Err(FfiError::OutOfRange {
            index,
            len: self.len(),
        })
    }

    /// The specs of location `index` as a range of spec numbers.
    fn spec_range(&self, index: usize) -> Result<std::ops::Range<usize>, FfiError> {
        self.check(index)?;
        Ok(self.spec_starts[index]..self.spec_starts[index + 1])
    }

    /// String `k` (see the module doc).
    fn string(&self, k: usize) -> KvcmStr {
        let range = self.string_offsets[k]..self.string_offsets[k + 1] - 1;
        KvcmStr {
            ptr: self.strings[range.clone()].as_ptr().cast(),
            len: range.len(),
        }
    }

    /// The number (over all locations) of spec `spec` of location `index`.
    fn spec_number(&self, index: usize, spec: usize) -> Result<usize, FfiError> {
        let range = self.spec_range(index)?;
        if spec >= range.len() {
            return Err(FfiError::OutOfRange {
                index: spec,
                len: range.len(),
            });
        }
        Ok(range.start + spec)
    }

    /// Name and URI of spec `spec` of location `index`.
    fn spec(&self, index: usize, spec: usize) -> Result<(KvcmStr, KvcmStr), FfiError> {
        let s = self.spec_number(index, spec)?;
        Ok((self.string(2 * s), self.string(2 * s + 1)))
    }

    /// The checksum of spec `spec` of location `index`, if the writer gave one.
    fn checksum(&self, index: usize, spec: usize) -> Result<Option<u64>, FfiError> {
        Ok(self.checksums[self.spec_number(index, spec)?])
    }

    fn view(&self) -> LocationsView {
        LocationsView {
            count: self.len(),
            types: self.types.as_ptr(),
            spec_sizes: self.spec_sizes.as_ptr(),
            spec_starts: self.spec_starts.as_ptr(),
            spec_total: self.specs(),
            string_offsets: self.string_offsets.as_ptr(),
            strings: self.strings.as_ptr().cast(),
            strings_len: self.strings.len(),
        }
    }
}

/// Runs an accessor: the status of `body` over the result behind `locations`.
///
/// # Safety
/// `locations` is NULL or a live result of this library.
unsafe fn access(
    locations: *const Locations,
    body: impl FnOnce(&Locations) -> Result<(), FfiError>,
) -> i32 {
    // SAFETY: accessors return no message; the caller promises a live result or NULL.
    unsafe {
        guard(std::ptr::null_mut(), || {
            body(args::object(locations, "locations")?)
        })
    }
}

/// Number of locations in a result (0 for NULL).
///
/// # Safety
/// `locations` is NULL or a live result of this library.
#[no_mangle]
pub unsafe extern "C" fn kvcm_locations_count(locations: *const Locations) -> usize {
    // SAFETY: the caller promises a live result or NULL.
    let locations = unsafe { locations.as_ref() };
    shielded(0, || locations.map_or(0, Locations::len))
}

/// The type and spec size of location `index`, and its number of specs; any output may be
/// NULL when not wanted.
///
/// # Safety
/// `locations` is NULL or a live result; each output is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn kvcm_location_get(
    locations: *const Locations,
    index: usize,
    type_out: *mut i32,
    spec_size_out: *mut i32,
    spec_count_out: *mut usize,
) -> i32 {
    // SAFETY: the caller's promises are passed on unchanged.
    unsafe {
        access(locations, |l| {
            let specs = l.spec_range(index)?.len();
            optional_store(type_out, l.types[index]);
            optional_store(spec_size_out, l.spec_sizes[index]);
            optional_store(spec_count_out, specs);
            Ok(())
        })
    }
}

/// Stores `value` when `out` is not NULL.
///
/// # Safety
/// `out` is NULL or writable.
unsafe fn optional_store<T>(out: *mut T, value: T) {
    if !out.is_null() {
        // SAFETY: non-NULL, and the caller promises it is writable.
        unsafe { out.write(value) };
    }
}

/// Name and URI of spec `spec` of location `index`, borrowed from the result.
///
/// # Safety
/// `locations` is NULL or a live result; `name_out` and `uri_out` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn kvcm_location_spec(
    locations: *const Locations,
    index: usize,
    spec: usize,
    name_out: *mut KvcmStr,
    uri_out: *mut KvcmStr,
) -> i32 {
    // SAFETY: the caller's promises are passed on unchanged.
    unsafe {
        access(locations, |l| {
            args::require(name_out, "name_out")?;
            args::require(uri_out, "uri_out")?;
            let (name, uri) = l.spec(index, spec)?;
            args::store(name_out, "name_out", name)?;
            args::store(uri_out, "uri_out", uri)
        })
    }
}

/// The writer's checksum (xxh3-64 of the part's bytes) of spec `spec` of location `index`:
/// `*present_out` = 1 and `*checksum_out` set when there is one, else 0 (and 0).
///
/// # Safety
/// `locations` is NULL or a live result; both outputs are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn kvcm_location_spec_checksum(
    locations: *const Locations,
    index: usize,
    spec: usize,
    checksum_out: *mut u64,
    present_out: *mut i32,
) -> i32 {
    // SAFETY: the caller's promises are passed on unchanged.
    unsafe {
        access(locations, |l| {
            args::require(checksum_out, "checksum_out")?;
            args::require(present_out, "present_out")?;
            let checksum = l.checksum(index, spec)?;
            args::store(checksum_out, "checksum_out", checksum.unwrap_or(0))?;
            args::store(present_out, "present_out", i32::from(checksum.is_some()))
        })
    }
}

/// The whole result as flat arrays, borrowed from it.
///
/// # Safety
/// `locations` is NULL or a live result; `view_out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn kvcm_locations_view(
    locations: *const Locations,
    view_out: *mut LocationsView,
) -> i32 {
    // SAFETY: the caller's promises are passed on unchanged.
    unsafe { access(locations, |l| args::store(view_out, "view_out", l.view())) }
}

/// Frees a result; NULL is a no-op. Every pointer borrowed from it becomes invalid.
///
/// # Safety
/// `locations` is NULL or a result of this library, not yet freed.
#[no_mangle]
pub unsafe extern "C" fn kvcm_locations_free(locations: *mut Locations) {
    if locations.is_null() {
        return;
    }
    // SAFETY: the caller hands back a result from `Box::into_raw`, once.
    shielded((), || drop(unsafe { Box::from_raw(locations) }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{KVCM_E_NULL_ARGUMENT, KVCM_E_OUT_OF_RANGE, KVCM_OK};
    use kvcm::proto::meta::LocationSpec;

    fn spec(name: &str, uri: &str) -> LocationSpec {
        LocationSpec {
            name: name.into(),
            uri: uri.into(),
            checksum: None,
        }
    }

    fn sample() -> Locations {
        Locations::new(&[
            CacheLocation {
                r#type: 2,
                spec_size: 1,
                location_specs: vec![spec("tp0", "file://a")],
            },
            CacheLocation {
                r#type: 3,
                spec_size: 2,
                location_specs: vec![
                    spec("tp0", "file://b"),
                    LocationSpec {
                        checksum: Some(u64::MAX),
                        ..spec("tp1", "é")
                    },
                ],
            },
        ])
    }

    #[test]
    fn checksums_read_back_where_the_writer_gave_them() {
        let l = sample();
        let (mut checksum, mut present) = (7u64, 7i32);
        // SAFETY: a live result and local outputs; NULL outputs are refused.
        unsafe {
            let status = kvcm_location_spec_checksum(&l, 1, 1, &mut checksum, &mut present);
            assert_eq!((status, checksum, present), (KVCM_OK, u64::MAX, 1));
            let status = kvcm_location_spec_checksum(&l, 0, 0, &mut checksum, &mut present);
            assert_eq!((status, checksum, present), (KVCM_OK, 0, 0));
            let status = kvcm_location_spec_checksum(&l, 1, 2, &mut checksum, &mut present);
            assert_eq!(status, KVCM_E_OUT_OF_RANGE);
            let null = std::ptr::null_mut();
            let status = kvcm_location_spec_checksum(&l, 0, 0, null, &mut present);
            assert_eq!(status, KVCM_E_NULL_ARGUMENT);
        }
    }

    fn text(s: KvcmStr) -> String {
        // SAFETY: a string borrowed from a live result: `len` bytes at `ptr`.
        let bytes = unsafe { std::slice::from_raw_parts(s.ptr.cast::<u8>(), s.len) };
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[test]
    fn accessors_read_back_the_answer() {
        let l = sample();
        let (mut t, mut size, mut specs) = (0, 0, 0);
        // SAFETY: a live result and local outputs.
        unsafe {
            assert_eq!(kvcm_locations_count(&l), 2);
            assert_eq!(
                kvcm_location_get(&l, 1, &mut t, &mut size, &mut specs),
                KVCM_OK
            );
        }
        assert_eq!((t, size, specs), (3, 2, 2));
        let (name, uri) = l.spec(1, 1).unwrap();
        assert_eq!((text(name), text(uri)), ("tp1".into(), "é".into()));
        // SAFETY: the byte after a borrowed string is its NUL, inside the heap.
        assert_eq!(unsafe { *uri.ptr.add(uri.len) }, 0);
        let (name, uri) = l.spec(0, 0).unwrap();
        assert_eq!((text(name), text(uri)), ("tp0".into(), "file://a".into()));
    }

    #[test]
    fn view_matches_the_layout() {
        let l = sample();
        let view = l.view();
        assert_eq!((view.count, view.spec_total), (2, 3));
        assert_eq!(l.spec_starts, [0, 1, 3]);
        assert_eq!(l.string_offsets.len(), 7);
        assert_eq!(*l.string_offsets.last().unwrap(), view.strings_len);
        assert_eq!(l.strings, b"tp0\0file://a\0tp0\0file://b\0tp1\0\xc3\xa9\0");
    }

    #[test]
    fn bad_indexes_and_nulls_are_errors() {
        let l = sample();
        let mut s = KvcmStr {
            ptr: std::ptr::null(),
            len: 0,
        };
        let mut u = s;
        // SAFETY: a live result, NULL results and local outputs.
        unsafe {
            assert_eq!(
                kvcm_location_get(
                    &l,
                    2,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut()
                ),
                KVCM_E_OUT_OF_RANGE
            );
            assert_eq!(
                kvcm_location_spec(&l, 0, 1, &mut s, &mut u),
                KVCM_E_OUT_OF_RANGE
            );
            assert_eq!(
                kvcm_location_spec(&l, 0, 0, std::ptr::null_mut(), &mut u),
                KVCM_E_NULL_ARGUMENT
            );
            assert_eq!(
                kvcm_location_spec(std::ptr::null(), 0, 0, &mut s, &mut u),
                KVCM_E_NULL_ARGUMENT
            );
            assert_eq!(
                kvcm_locations_view(&l, std::ptr::null_mut()),
                KVCM_E_NULL_ARGUMENT
            );
            assert_eq!(kvcm_locations_count(std::ptr::null()), 0);
            kvcm_locations_free(std::ptr::null_mut());
        }
        assert!(s.ptr.is_null(), "a failed accessor writes nothing");
    }

    #[test]
    fn empty_answer() {
        let l = Locations::new(&[]);
        assert!(l.is_empty());
        let view = l.view();
        assert_eq!((view.count, view.spec_total, view.strings_len), (0, 0, 0));
    }
}
