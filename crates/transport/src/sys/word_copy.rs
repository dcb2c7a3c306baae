//! Byte copies into, out of and between shared mappings, done as relaxed atomic accesses.
//!
//! Memory shared with the NIC thread, application threads and peer processes may be copied
//! by one thread while another runs an `AtomicU64` operation (or another copy) on the same
//! bytes. Plain `memcpy` there would be a data race (undefined behaviour in Rust's memory
//! model even though the RDMA contract leaves the *values* unspecified). So every access
//! to shared bytes here is a relaxed atomic one: `AtomicU64` for the 8-byte aligned middle
//! of a range, `AtomicU8` at its unaligned edges. On x86-64 and aarch64 these compile to
//! plain loads and stores; concurrent writers may still leave torn data across words, which
//! is what RDMA promises. Private memory (the Rust slice side) is accessed normally.
//!
//! Invariant every caller upholds: a shared pointer with `len` bytes is valid for reads
//! (and writes, for a destination) for the whole call, and the private side does not
//! overlap any shared mapping.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};

/// Bytes before the first 8-byte boundary at or after `ptr` (at most `len`).
fn head_len(ptr: *const u8, len: usize) -> usize {
    ptr.align_offset(8).min(len)
}

/// Copies `len` bytes from shared memory at `src` to private memory at `dst`.
///
/// # Safety
/// `src` is valid for `len` bytes of reads of shared memory (accessed only atomically by
/// everyone), `dst` is valid for `len` bytes of writes and overlaps no shared memory.
pub(super) unsafe fn copy_out(src: *const u8, dst: *mut u8, len: usize) {
    let head = head_len(src, len);
    let words = (len - head) / 8;
    for i in 0..head {
        // SAFETY: `i < head <= len`, so `src + i` lies in the caller's shared range, which
        // everyone accesses only atomically (an `AtomicU8` needs no alignment), and `dst + i`
        // in its private range, which nothing else touches during the call.
        unsafe {
            dst.add(i)
                .write(AtomicU8::from_ptr(src.add(i).cast_mut()).load(Relaxed))
        };
    }
    for w in 0..words {
        let at = head + w * 8;
        // SAFETY: `at + 8 <= head + words * 8 <= len`, so both 8-byte ranges are in bounds.
        // `src + head` is 8-byte aligned (`head_len`, and `words > 0` means `head` was not
        // clamped to `len`) and `at - head` is a multiple of 8, so the atomic load is aligned;
        // the private `dst` side is written unaligned.
        unsafe {
            let word = AtomicU64::from_ptr(src.add(at).cast_mut().cast::<u64>()).load(Relaxed);
            dst.add(at).cast::<u64>().write_unaligned(word);
        }
    }
    for i in head + words * 8..len {
        // SAFETY: `i < len`: in bounds on both sides, byte accesses as for the head above.
        unsafe {
            dst.add(i)
                .write(AtomicU8::from_ptr(src.add(i).cast_mut()).load(Relaxed))
        };
    }
}

/// Copies `len` bytes from private memory at `src` to shared memory at `dst`.
///
/// # Safety
/// `dst` is valid for `len` bytes of writes of shared memory (accessed only atomically by
/// everyone), `src` is valid for `len` bytes of reads and overlaps no shared memory.
pub(super) unsafe fn copy_in(src: *const u8, dst: *mut u8, len: usize) {
    let head = head_len(dst, len);
    let words = (len - head) / 8;
    for i in 0..head {
        // SAFETY: `i < head <= len`, so `dst + i` lies in the caller's shared range, which
        // everyone accesses only atomically (an `AtomicU8` needs no alignment), and `src + i`
        // in its private range, readable for the whole call.
        unsafe { AtomicU8::from_ptr(dst.add(i)).store(src.add(i).read(), Relaxed) };
    }
    for w in 0..words {
        let at = head + w * 8;
        // SAFETY: `at + 8 <= head + words * 8 <= len`, so both 8-byte ranges are in bounds.
        // `dst + head` is 8-byte aligned (`head_len`, and `words > 0` means `head` was not
        // clamped to `len`) and `at - head` is a multiple of 8, so the atomic store is
        // aligned; the private `src` side is read unaligned.
        unsafe {
            let word = src.add(at).cast::<u64>().read_unaligned();
            AtomicU64::from_ptr(dst.add(at).cast::<u64>()).store(word, Relaxed);
        }
    }
    for i in head + words * 8..len {
        // SAFETY: `i < len`: in bounds on both sides, byte accesses as for the head above.
        unsafe { AtomicU8::from_ptr(dst.add(i)).store(src.add(i).read(), Relaxed) };
    }
}

/// Copies `len` bytes between two shared ranges (possibly aliasing the same pages).
///
/// Overlapping ranges get unspecified bytes (as on a NIC), never undefined behaviour.
/// Ranges with the same alignment move by words, others by bytes.
///
/// # Safety
/// `src` is valid for `len` bytes of reads and `dst` for `len` bytes of writes, both shared
/// memory accessed only atomically by everyone.
pub(super) unsafe fn copy_shared(src: *const u8, dst: *mut u8, len: usize) {
    let co_aligned = src.align_offset(8) == dst.align_offset(8);
    let head = if co_aligned { head_len(src, len) } else { len };
    let words = (len - head) / 8;
    for i in 0..head {
        // SAFETY: `i < head <= len`, so both bytes lie in the caller's shared ranges, which
        // everyone accesses only atomically; an `AtomicU8` needs no alignment. If the ranges
        // alias, the load and the store are still atomic, only the copied value is unspecified.
        unsafe {
            let byte = AtomicU8::from_ptr(src.add(i).cast_mut()).load(Relaxed);
            AtomicU8::from_ptr(dst.add(i)).store(byte, Relaxed);
        }
    }
    for w in 0..words {
        let at = head + w * 8;
        // SAFETY: `at + 8 <= head + words * 8 <= len`, so both words are in bounds. Words are
        // used only when `co_aligned`, and then `head = head_len(src, len)` makes `src + head`
        // and `dst + head` both 8-byte aligned; `at - head` is a multiple of 8, so both atomic
        // accesses are aligned.
        unsafe {
            let word = AtomicU64::from_ptr(src.add(at).cast_mut().cast::<u64>()).load(Relaxed);
            AtomicU64::from_ptr(dst.add(at).cast::<u64>()).store(word, Relaxed);
        }
    }
    for i in head + words * 8..len {
        // SAFETY: `i < len`: in bounds on both sides, byte accesses as for the head above.
        unsafe {
            let byte = AtomicU8::from_ptr(src.add(i).cast_mut()).load(Relaxed);
            AtomicU8::from_ptr(dst.add(i)).store(byte, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every (source offset, destination offset, length) up to 3 words, in all directions.
    #[test]
    fn copies_match_memcpy_at_every_alignment() {
        let pattern: Vec<u8> = (0..64u8).map(|b| b.wrapping_mul(7) ^ 0x5a).collect();
        for src_off in 0..8 {
            for dst_off in 0..8 {
                for len in 0..25 {
                    let want = &pattern[src_off..src_off + len];
                    let mut shared = vec![0u64; 8];
                    let shared_ptr = shared.as_mut_ptr().cast::<u8>();
                    // SAFETY: `want` is `len` private bytes; `shared` is 64 bytes, of which
                    // `dst_off + len <= 31` are used, and this thread alone touches it.
                    unsafe { copy_in(want.as_ptr(), shared_ptr.add(dst_off), len) };
                    let mut out = vec![0u8; 32];
                    // SAFETY: the same `shared` range; `out` is 32 >= `len` private bytes.
                    unsafe { copy_out(shared_ptr.add(dst_off), out.as_mut_ptr(), len) };
                    assert_eq!(&out[..len], want, "in/out {src_off} {dst_off} {len}");
                    let mut other = vec![0u64; 8];
                    let other_ptr = other.as_mut_ptr().cast::<u8>();
                    // SAFETY: both ranges end by byte 31 of their own 64-byte local buffers.
                    unsafe { copy_shared(shared_ptr.add(dst_off), other_ptr.add(src_off), len) };
                    // SAFETY: as above, `other` is read back into the private `out`.
                    unsafe { copy_out(other_ptr.add(src_off), out.as_mut_ptr(), len) };
                    assert_eq!(&out[..len], want, "shared {src_off} {dst_off} {len}");
                }
            }
        }
    }
}
