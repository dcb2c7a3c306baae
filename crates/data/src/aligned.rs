//! [`AlignedBuf`]: a zeroed heap buffer whose address is a multiple of [`BUFFER_ALIGN`], so
//! O_DIRECT can use it. This module holds the crate's allocation `unsafe`.
//!
//! Invariants: `ptr` comes from `alloc_zeroed(layout)` with `layout.align() == BUFFER_ALIGN`
//! and `layout.size() == max(round_up(len, BUFFER_ALIGN), BUFFER_ALIGN)` (never zero, as
//! `alloc` requires), so `ptr..ptr + len` is always allocated and initialised; it is freed
//! once, in `drop`, with the same layout. The length is whatever the caller asked for: a
//! multiple of [`BUFFER_ALIGN`] makes the whole buffer usable for O_DIRECT, another length
//! makes `FileIo` take the buffered path for it.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

/// The alignment of every [`AlignedBuf`]: the page size and the largest logical block size
/// of common disks, so an O_DIRECT transfer from or to it is accepted by ext4, XFS and NFS.
pub const BUFFER_ALIGN: usize = 4096;

/// A zeroed heap buffer aligned to [`BUFFER_ALIGN`].
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: AlignedBuf owns its allocation exclusively (like a Box<[u8]>); nothing else holds
// the pointer, so moving it to another thread is sound.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads through `as_slice` (&self); writes need &mut self, so
// sharing references across threads is as sound as for &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes (any length, zero included) at an address aligned to
    /// [`BUFFER_ALIGN`]. Panics if the rounded-up size overflows `isize`; aborts via
    /// `handle_alloc_error` when memory is exhausted.
    pub fn new(len: usize) -> AlignedBuf {
        let size = len
            .checked_next_multiple_of(BUFFER_ALIGN)
            .map(|size| size.max(BUFFER_ALIGN))
            .expect("AlignedBuf length overflows usize");
        let layout =
            Layout::from_size_align(size, BUFFER_ALIGN).expect("AlignedBuf length overflows isize");
        // SAFETY: `layout` has a non-zero size (at least BUFFER_ALIGN), as alloc_zeroed requires.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len, layout }
    }

    /// The buffer's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes, read-only.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len is allocated and zero-initialised (module invariant), and the
        // shared borrow of self keeps it alive and unaliased by any &mut for the slice's life.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice; the exclusive borrow of self makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: ptr was allocated with exactly self.layout and is freed only here, once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_zeroed_and_of_the_asked_length() {
        for len in [0, 1, 4095, 4096, 4097, 1 << 20] {
            let buf = AlignedBuf::new(len);
            assert_eq!(buf.len(), len);
            assert_eq!(buf.as_slice().as_ptr() as usize % BUFFER_ALIGN, 0);
            assert!(buf.as_slice().iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn writes_are_kept() {
        let mut buf = AlignedBuf::new(5000);
        buf.as_mut_slice()[4999] = 7;
        assert_eq!(buf.as_slice()[4999], 7);
    }
}
