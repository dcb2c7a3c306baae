//! The string heap: immutable, checksummed entries that slots and the header refer to by
//! id (entry offset in the heap / 8). Within one generation an id never changes meaning,
//! so readers cache entries until the epoch changes.
//!
//! Entry: `payload_len: u32`, `kind: u32`, `checksum: u64` (xxh3 of the payload), payload,
//! zero padding to a multiple of 8. Payloads:
//! - [`Template`] (kind 1): `spec: u16`, `has_block: u8`, `block_shift: u8`, `head_len: u32`,
//!   head bytes, tail bytes (the rest). A part's URI is head, then — when `has_block` — its
//!   block number shifted left by `block_shift` (at most 32) as a `u64` in decimal, then
//!   tail.
//! - spec list (kind 2): `count: u32`, then per spec `size: i64`, `name_len: u32`, name.
//!
//! Id 0 is never an entry: a part whose template is 0 has an empty URI.

use crate::error::{FormatError, Result};
use crate::seqlock::checksum;

/// Bytes of an entry's head.
pub const ENTRY_HEAD: usize = 16;
/// Kind of a template entry.
const KIND_TEMPLATE: u32 = 1;
/// Kind of a spec-list entry.
const KIND_SPECS: u32 = 2;
/// The first entry's offset (id 0 is reserved).
pub const FIRST_ENTRY: usize = 8;

/// How a part's URI is built.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Template {
    /// Index of the part's spec in the instance's registration.
    pub spec: u16,
    /// Text before the block number.
    pub head: String,
    /// Whether the block number is rendered.
    pub has_block: bool,
    /// The URI holds `block << block_shift` (at most [`MAX_BLOCK_SHIFT`]).
    pub block_shift: u8,
    /// Text after it.
    pub tail: String,
}

/// The largest block shift a template may carry (a shifted `u32` still fits in a `u64`).
pub const MAX_BLOCK_SHIFT: u8 = 32;

impl Template {
    /// Appends the URI of block `block` to `out`.
    #[inline]
    pub fn render(&self, block: u32, out: &mut String) {
        out.reserve(self.head.len() + 20 + self.tail.len());
        out.push_str(&self.head);
        if self.has_block {
            let number = u64::from(block) << self.block_shift;
            out.push_str(itoa::Buffer::new().format(number));
        }
        out.push_str(&self.tail);
    }
}

/// A decoded entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A URI template.
    Template(Template),
    /// The instance's specs (name, size), in registration order.
    Specs(Vec<(String, i64)>),
}

/// Encodes `entry` (padded to 8 bytes).
pub fn encode(entry: &Entry) -> Vec<u8> {
    let (kind, mut payload) = match entry {
        Entry::Template(t) => {
            let mut p = Vec::with_capacity(8 + t.head.len() + t.tail.len());
            p.extend_from_slice(&t.spec.to_le_bytes());
            p.push(u8::from(t.has_block));
            p.push(t.block_shift);
            p.extend_from_slice(&(t.head.len() as u32).to_le_bytes());
            p.extend_from_slice(t.head.as_bytes());
            p.extend_from_slice(t.tail.as_bytes());
            (KIND_TEMPLATE, p)
        }
        Entry::Specs(specs) => {
            let mut p = (specs.len() as u32).to_le_bytes().to_vec();
            for (name, size) in specs {
                p.extend_from_slice(&size.to_le_bytes());
                p.extend_from_slice(&(name.len() as u32).to_le_bytes());
                p.extend_from_slice(name.as_bytes());
            }
            (KIND_SPECS, p)
        }
    };
    let len = (ENTRY_HEAD + payload.len()).next_multiple_of(8);
    let mut bytes = Vec::with_capacity(len);
    bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&kind.to_le_bytes());
    bytes.extend_from_slice(&checksum(&payload).to_le_bytes());
    bytes.append(&mut payload);
    bytes.resize(len, 0);
    bytes
}

/// The whole length (padded) of the entry whose first bytes are `start`.
pub fn entry_len(start: &[u8]) -> Result<usize> {
    let payload = u32_at(start, 0)? as usize;
    Ok((ENTRY_HEAD + payload).next_multiple_of(8))
}

/// Decodes an entry from `bytes` (which may run past it).
pub fn decode(bytes: &[u8]) -> Result<Entry> {
    let corrupt = FormatError::Corrupt;
    let payload_len = u32_at(bytes, 0)? as usize;
    let kind = u32_at(bytes, 4)?;
    let sum = bytes
        .get(8..16)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .ok_or(corrupt("short string entry"))?;
    let payload = bytes
        .get(ENTRY_HEAD..ENTRY_HEAD + payload_len)
        .ok_or(corrupt("short string entry"))?;
    if checksum(payload) != sum {
        return Err(corrupt("string entry checksum mismatch"));
    }
    match kind {
        KIND_TEMPLATE => decode_template(payload),
        KIND_SPECS => decode_specs(payload),
        _ => Err(corrupt("unknown string entry kind")),
    }
}

fn u32_at(bytes: &[u8], at: usize) -> Result<u32> {
    let b = bytes
        .get(at..at + 4)
        .ok_or(FormatError::Corrupt("short string entry"))?;
    Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn text(bytes: &[u8]) -> Result<String> {
    String::from_utf8(bytes.to_vec()).map_err(|_| FormatError::Corrupt("string is not UTF-8"))
}

fn decode_template(p: &[u8]) -> Result<Entry> {
    let head_len = u32_at(p, 4)? as usize;
    let head_end = 8usize
        .checked_add(head_len)
        .filter(|&end| end <= p.len())
        .ok_or(FormatError::Corrupt("template head out of bounds"))?;
    let block_shift = p[3];
    if block_shift > MAX_BLOCK_SHIFT {
        return Err(FormatError::Corrupt("template block shift over 32"));
    }
    Ok(Entry::Template(Template {
        spec: u16::from_le_bytes([p[0], p[1]]),
        has_block: p[2] != 0,
        block_shift,
        head: text(&p[8..head_end])?,
        tail: text(&p[head_end..])?,
    }))
}

fn decode_specs(p: &[u8]) -> Result<Entry> {
    let count = u32_at(p, 0)? as usize;
    let mut at = 4;
    let mut specs = Vec::with_capacity(count.min(crate::header::MAX_PARTS));
    for _ in 0..count {
        let size_bytes = p
            .get(at..at + 8)
            .ok_or(FormatError::Corrupt("short spec list"))?;
        let size = i64::from_le_bytes(size_bytes.try_into().expect("8 bytes"));
        let name_len = u32_at(p, at + 8)? as usize;
        let name = p
            .get(at + 12..at + 12 + name_len)
            .ok_or(FormatError::Corrupt("short spec list"))?;
        specs.push((text(name)?, size));
        at += 12 + name_len;
    }
    Ok(Entry::Specs(specs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_corruption_is_refused() {
        let entries = [
            Entry::Template(Template {
                spec: 3,
                head: "file://nfs_01/tmp/nfs/i/tp0/64_ab?blkid=".into(),
                has_block: true,
                block_shift: 0,
                tail: "&size=1024".into(),
            }),
            Entry::Template(Template {
                spec: 0,
                head: "x".into(),
                has_block: false,
                block_shift: 0,
                tail: String::new(),
            }),
            Entry::Template(Template {
                spec: 1,
                head: "pace://pool_01/".into(),
                has_block: true,
                block_shift: 9,
                tail: "?media_type=2&node_id=n1&range_id=7&size=16384".into(),
            }),
            Entry::Specs(vec![("tp0".into(), 1024), ("tp1".into(), -1)]),
        ];
        for entry in &entries {
            let bytes = encode(entry);
            assert_eq!(bytes.len() % 8, 0);
            assert_eq!(decode(&bytes).unwrap(), *entry);
            let mut longer = bytes.clone();
            longer.extend_from_slice(&[0xAA; 32]);
            assert_eq!(
                decode(&longer).unwrap(),
                *entry,
                "bytes after the entry are ignored"
            );
            let mut broken = bytes.clone();
            broken[ENTRY_HEAD] ^= 1;
            assert!(decode(&broken).is_err());
        }
        assert!(decode(&[0u8; 4]).is_err());
        assert!(decode(&[0xFF; 64]).is_err());
        let too_far = Entry::Template(Template {
            spec: 0,
            head: "x".into(),
            has_block: true,
            block_shift: MAX_BLOCK_SHIFT + 1,
            tail: String::new(),
        });
        let refused = decode(&encode(&too_far)).unwrap_err();
        assert!(refused.to_string().contains("shift"), "{refused}");
    }

    #[test]
    fn templates_render_with_and_without_a_block() {
        let mut out = String::new();
        let t = Template {
            spec: 0,
            head: "file://n/a?blkid=".into(),
            has_block: true,
            block_shift: 0,
            tail: "&size=8".into(),
        };
        t.render(12, &mut out);
        assert_eq!(out, "file://n/a?blkid=12&size=8");
        out.clear();
        let shifted = Template {
            spec: 0,
            head: "pace://p/".into(),
            has_block: true,
            block_shift: MAX_BLOCK_SHIFT,
            tail: "?size=512".into(),
        };
        shifted.render(u32::MAX, &mut out);
        assert_eq!(
            out,
            format!("pace://p/{}?size=512", u64::from(u32::MAX) << 32)
        );
    }
}
