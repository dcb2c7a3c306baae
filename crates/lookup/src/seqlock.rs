//! Seqlocked blocks: how every mutable part of the table (header, availability block,
//! buckets) is written by its single writer and accepted by readers that copy it with
//! one-sided READs, which do not order the bytes within a read.
//!
//! A block is `[front word][body][back word]`, each word 8 bytes little-endian: its low 32
//! bits are the block's version, its high 32 bits one half of the body's 64-bit checksum
//! (xxh3; front = low half, back = high half). A reader accepts a copy only when both
//! versions are equal and even and the checksum matches the body it copied. The writer
//! makes both versions odd, writes the body, then writes the back word and the front word
//! with the next even version and the new checksum, with a full fence between the steps.
//! A retired block (its table was replaced) has both words all ones: odd forever.

use kvcm_transport::Memory;

use crate::error::{FormatError, Result};

/// Bytes of the front and back words together.
pub const OVERHEAD: usize = 16;

/// Both words of a retired block.
const RETIRED: u64 = u64::MAX;

/// What a copied block turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opened<'a> {
    /// A consistent body.
    Body(&'a [u8]),
    /// Being written while copied (versions odd or different, or checksum mismatch):
    /// copy it again.
    Torn,
    /// Its table was replaced: read the header again.
    Retired,
}

/// The 64-bit checksum of a body.
#[inline]
pub fn checksum(body: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(body)
}

#[inline]
fn word(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

/// Checks a copied block (any length ≥ [`OVERHEAD`], a multiple of 8).
#[inline]
pub fn open(block: &[u8]) -> Opened<'_> {
    if block.len() < OVERHEAD {
        return Opened::Torn;
    }
    let (front, back) = (word(block, 0), word(block, block.len() - 8));
    if front == RETIRED && back == RETIRED {
        return Opened::Retired;
    }
    let (version, other) = (front as u32, back as u32);
    if version != other || version % 2 == 1 {
        return Opened::Torn;
    }
    let body = &block[8..block.len() - 8];
    let stored = (front >> 32) | ((back >> 32) << 32);
    if checksum(body) != stored {
        return Opened::Torn;
    }
    Opened::Body(body)
}

/// A sealed image of `body` at `version` (even), as a fresh block is first written.
pub fn seal(body: &[u8], version: u32) -> Vec<u8> {
    debug_assert!(version % 2 == 0);
    let sum = checksum(body);
    let mut block = Vec::with_capacity(body.len() + OVERHEAD);
    block.extend_from_slice(&(u64::from(version) | (sum << 32)).to_le_bytes());
    block.extend_from_slice(body);
    block.extend_from_slice(&(u64::from(version) | (sum & !0xffff_ffff)).to_le_bytes());
    block
}

/// Rewrites the block at `offset` of `memory` (its body is `body.len()` bytes) with `body`,
/// readers seeing either the old or the new body or a torn copy, never a mix they accept.
/// The caller is the block's only writer.
pub fn rewrite(memory: &impl Memory, offset: usize, body: &[u8]) -> Result<()> {
    let back_at = offset + 8 + body.len();
    let front = memory.load_u64(offset)?;
    let version = front as u32;
    if version % 2 == 1 {
        return Err(FormatError::Corrupt("a block's version is odd at rest"));
    }
    memory.fetch_add_u64(offset, 1)?;
    memory.fetch_add_u64(back_at, 1)?;
    memory.write(offset + 8, body)?;
    let next = u64::from(version.wrapping_add(2));
    let sum = checksum(body);
    memory.fetch_add_u64(offset, 0)?; // full fence: the body before the back word
    memory.write(back_at, &(next | (sum & !0xffff_ffff)).to_le_bytes())?;
    memory.fetch_add_u64(offset, 0)?; // full fence: the back word before the front word
    memory.write(offset, &(next | (sum << 32)).to_le_bytes())?;
    memory.fetch_add_u64(offset, 0)?;
    Ok(())
}

/// Marks the block at `offset` (`len` bytes in all) retired: readers never accept it again.
pub fn retire(memory: &impl Memory, offset: usize, len: usize) -> Result<()> {
    memory.write(offset + len - 8, &RETIRED.to_le_bytes())?;
    memory.fetch_add_u64(offset, 0)?;
    memory.write(offset, &RETIRED.to_le_bytes())?;
    memory.fetch_add_u64(offset, 0)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvcm_transport::soft::{SoftConfig, SoftDomain};
    use kvcm_transport::Domain;

    #[test]
    fn a_sealed_block_opens_and_any_flipped_byte_is_torn() {
        let body: Vec<u8> = (0..48).collect();
        let block = seal(&body, 4);
        assert_eq!(open(&block), Opened::Body(&body[..]));
        for at in 0..block.len() {
            let mut broken = block.clone();
            broken[at] ^= 0x10;
            assert_eq!(open(&broken), Opened::Torn, "byte {at}");
        }
    }

    #[test]
    fn rewriting_in_memory_bumps_the_version_and_retiring_is_final() {
        let domain = SoftDomain::open(SoftConfig::default()).unwrap();
        let memory = domain.alloc(4096).unwrap();
        memory.write(64, &seal(&[7u8; 48], 0)).unwrap();
        rewrite(&memory, 64, &[9u8; 48]).unwrap();
        let mut copy = vec![0u8; 64];
        memory.read(64, &mut copy).unwrap();
        assert_eq!(open(&copy), Opened::Body(&[9u8; 48][..]));
        assert_eq!(memory.load_u64(64).unwrap() as u32, 2);
        // A reader that copied while the versions were odd sees a torn block.
        memory.fetch_add_u64(64, 1).unwrap();
        memory.read(64, &mut copy).unwrap();
        assert_eq!(open(&copy), Opened::Torn);
        memory.fetch_add_u64(64, u64::MAX).unwrap(); // back to even
        retire(&memory, 64, 64).unwrap();
        memory.read(64, &mut copy).unwrap();
        assert_eq!(open(&copy), Opened::Retired);
    }

    #[test]
    fn a_body_mixed_from_two_versions_is_refused() {
        let old = seal(&[1u8; 48], 2);
        let new = seal(&[2u8; 48], 4);
        // Words from the new version, one body word from the old one.
        let mut mixed = new.clone();
        mixed[8..16].copy_from_slice(&old[8..16]);
        assert_eq!(open(&mixed), Opened::Torn);
    }
}
