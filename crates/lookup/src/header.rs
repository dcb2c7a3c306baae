//! The header: the one block a reader fetches first (its address and rkey come from the
//! bootstrap), naming the current generation (bucket array, string heap, availability).

use bytemuck::{Pod, Zeroable};

use crate::error::{FormatError, Result};
use crate::seqlock::{self, Opened};

/// "KVCMLKUP", little-endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"KVCMLKUP");
/// The format version this build writes (2: slots may carry checksums; 3: templates may
/// shift their block number, so a pool node's parts share one template).
pub const FORMAT_VERSION: u32 = 3;
/// The oldest format version this build reads: a version-2 table is a version-3 one whose
/// templates all have shift 0 (that byte was written 0).
pub const OLDEST_READABLE_VERSION: u32 = 2;

/// Whether this build reads tables of format `version`.
pub fn readable(version: u32) -> bool {
    (OLDEST_READABLE_VERSION..=FORMAT_VERSION).contains(&version)
}
/// Wires whose rkeys a header carries, by index.
pub const WIRES: usize = 4;

/// Header fields (all little-endian; 8-byte aligned, no padding).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Pod, Zeroable)]
pub struct Header {
    /// [`MAGIC`].
    pub magic: u64,
    /// [`FORMAT_VERSION`].
    pub format_version: u32,
    /// The instance's spec layout (see [`layout_version`]).
    pub layout_version: u32,
    /// Random id of the server process that writes this table.
    pub server_incarnation: u64,
    /// Bumped at every new generation.
    pub epoch: u64,
    /// Remote address of the generation's memory.
    pub generation_addr: u64,
    /// Its length in bytes.
    pub generation_len: u64,
    /// Its rkey per wire (index: soft-tcp 0, soft-shm 1, verbs 2).
    pub generation_rkeys: [u32; WIRES],
    /// Offset of the bucket array in the generation.
    pub bucket_offset: u64,
    /// Number of buckets (a power of two ≥ 2).
    pub bucket_count: u64,
    /// Bytes per bucket (a multiple of 64).
    pub bucket_bytes: u32,
    /// Bytes per slot.
    pub slot_bytes: u32,
    /// Slots per bucket.
    pub slots_per_bucket: u32,
    /// Most 8-byte records a slot holds after its head: the instance's spec count, doubled
    /// once a location with checksums is published (capped at [`MAX_PARTS`]).
    pub max_parts: u32,
    /// Seed of the bucket hash.
    pub hash_seed: u64,
    /// Offset of the string heap in the generation.
    pub strings_offset: u64,
    /// Bytes of the string heap.
    pub strings_len: u64,
    /// Bytes of the availability block (at offset 0 of the generation).
    pub avail_bytes: u32,
    /// String id of the instance's spec list.
    pub spec_list: u32,
    /// The instance's block size in tokens (for token-id queries).
    pub block_size: i64,
}

// The layout docs/lookup-table.md documents: 136 bytes, no padding.
const _: () = assert!(std::mem::size_of::<Header>() == 136);

/// Bytes of the sealed header block.
pub const HEADER_BLOCK: usize = std::mem::size_of::<Header>() + seqlock::OVERHEAD;

/// The spec layout version: a 32-bit digest of the spec names and sizes, in order.
pub fn layout_version(specs: &[(String, i64)]) -> u32 {
    let mut bytes = Vec::new();
    for (name, size) in specs {
        bytes.extend_from_slice(&(name.len() as u32).to_le_bytes());
        bytes.extend_from_slice(name.as_bytes());
        bytes.extend_from_slice(&size.to_le_bytes());
    }
    seqlock::checksum(&bytes) as u32
}

impl Header {
    /// The header's body bytes.
    pub fn to_body(&self) -> &[u8] {
        bytemuck::bytes_of(self)
    }

    /// Decodes a copied header block; `Ok(None)` when it was torn (copy it again).
    pub fn open(block: &[u8]) -> Result<Option<Header>> {
        let body = match seqlock::open(block) {
            Opened::Body(body) => body,
            Opened::Torn => return Ok(None),
            Opened::Retired => return Err(FormatError::Corrupt("the header is retired")),
        };
        let header: Header = bytemuck::pod_read_unaligned(
            body.get(..std::mem::size_of::<Header>())
                .ok_or(FormatError::Corrupt("short header"))?,
        );
        if header.magic != MAGIC {
            return Err(FormatError::Corrupt("bad magic"));
        }
        if !readable(header.format_version) {
            return Err(FormatError::UnknownVersion {
                found: header.format_version,
                known: FORMAT_VERSION,
            });
        }
        header.check()?;
        Ok(Some(header))
    }

    /// The geometry the header describes.
    pub fn geometry(&self) -> Geometry {
        Geometry {
            max_parts: self.max_parts as usize,
            slot_bytes: self.slot_bytes as usize,
            slots_per_bucket: self.slots_per_bucket as usize,
            bucket_bytes: self.bucket_bytes as usize,
        }
    }

    /// Offset of bucket `index` in the generation.
    #[inline]
    pub fn bucket_at(&self, index: u64) -> u64 {
        self.bucket_offset + index * u64::from(self.bucket_bytes)
    }

    /// Bounds a reader relies on: everything inside the generation, sizes consistent.
    fn check(&self) -> Result<()> {
        let geometry = Geometry::for_parts(self.max_parts as usize)
            .ok_or(FormatError::Corrupt("part count out of range"))?;
        let buckets_end = self
            .bucket_count
            .checked_mul(u64::from(self.bucket_bytes))
            .and_then(|bytes| bytes.checked_add(self.bucket_offset));
        let strings_end = self.strings_offset.checked_add(self.strings_len);
        let fits = |end: Option<u64>| end.is_some_and(|end| end <= self.generation_len);
        let sound = geometry == self.geometry()
            && self.bucket_count.is_power_of_two()
            && self.bucket_count >= 2
            && u64::from(self.avail_bytes) <= self.bucket_offset
            && self.avail_bytes as usize >= seqlock::OVERHEAD + 8
            // Storage handles are u16: no availability block is larger than theirs.
            && self.avail_bytes as usize <= crate::avail::block_bytes(1 << 16)
            // Every address a reader forms (generation + an offset inside it) fits 64 bits.
            && self.generation_addr.checked_add(self.generation_len).is_some()
            && fits(buckets_end)
            && fits(strings_end)
            && self.strings_len <= u64::from(u32::MAX) * 8;
        if !sound {
            return Err(FormatError::Corrupt("inconsistent header geometry"));
        }
        Ok(())
    }
}

/// Slot and bucket sizes for an instance with `max_parts` specs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Most parts per slot.
    pub max_parts: usize,
    /// Bytes per slot: 16-byte head + 8 per part.
    pub slot_bytes: usize,
    /// Slots per bucket (≥ 2).
    pub slots_per_bucket: usize,
    /// Bytes per bucket: the fewest 64-byte lines holding two slots and the seqlock words.
    pub bucket_bytes: usize,
}

/// Most parts a slot may hold (and so specs an instance on the fast path may have).
pub const MAX_PARTS: usize = 64;

impl Geometry {
    /// The geometry for `max_parts` (1..=[`MAX_PARTS`]).
    pub fn for_parts(max_parts: usize) -> Option<Geometry> {
        if !(1..=MAX_PARTS).contains(&max_parts) {
            return None;
        }
        let slot_bytes = crate::slot::HEAD_BYTES + crate::slot::PART_BYTES * max_parts;
        let lines = (2 * slot_bytes + seqlock::OVERHEAD).div_ceil(64);
        let bucket_bytes = lines * 64;
        Some(Geometry {
            max_parts,
            slot_bytes,
            slots_per_bucket: (bucket_bytes - seqlock::OVERHEAD) / slot_bytes,
            bucket_bytes,
        })
    }
}

/// The two candidate buckets of `key` (distinct; `bucket_count` a power of two ≥ 2).
#[inline]
pub fn candidates(key: i64, seed: u64, bucket_count: u64) -> [u64; 2] {
    let mask = bucket_count - 1;
    let first = mix(key as u64 ^ seed) & mask;
    let second = mix(key as u64 ^ seed ^ 0x9e37_79b9_7f4a_7c15) & mask;
    if first == second {
        [first, first ^ 1]
    } else {
        [first, second]
    }
}

/// splitmix64's finaliser.
#[inline]
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_spec_fits_two_slots_in_one_cache_line() {
        let one = Geometry::for_parts(1).unwrap();
        assert_eq!((one.bucket_bytes, one.slots_per_bucket), (64, 2));
        let eight = Geometry::for_parts(8).unwrap();
        assert_eq!((eight.bucket_bytes, eight.slots_per_bucket), (192, 2));
        assert!(Geometry::for_parts(0).is_none() && Geometry::for_parts(65).is_none());
    }

    #[test]
    fn candidates_are_distinct_and_in_range() {
        for key in -1000..1000 {
            let [a, b] = candidates(key, 7, 4);
            assert!(a != b && a < 4 && b < 4);
        }
        // Pinned values: readers in other languages check their hash against these.
        assert_eq!(candidates(123, 0, 1 << 20), [901_316, 167_302]);
    }
}
