//! Slots: the fixed-size plain-old-data records inside buckets, one per published (SERVING)
//! location — a projection of the domain model's compact location.
//!
//! A slot is a 16-byte head (`key`, `nonce`, `storage`, `part_count`) and room for
//! `max_parts` 8-byte records: the parts (`template`, `block`) in spec order, then — when
//! `part_count` has the [`CHECKSUMMED`] bit — one 8-byte checksum per part (the writer's
//! xxh3-64 of the part's bytes), so a checksummed location of `n` parts takes `2n` records.
//! A slot whose nonce is 0 is empty. A slot whose `part_count` is [`OVERFLOW`] is a marker:
//! the key has more locations than its two buckets hold (or a location more records than a
//! slot), and a reader must ask the server (gRPC) for it.

use bytemuck::{Pod, Zeroable};

/// Bytes of a slot head.
pub const HEAD_BYTES: usize = std::mem::size_of::<SlotHead>();
/// Bytes of one part.
pub const PART_BYTES: usize = std::mem::size_of::<PartRecord>();
/// `part_count` of an overflow marker.
pub const OVERFLOW: u16 = u16::MAX;
/// The bit of `part_count` saying a checksum per part follows the parts.
pub const CHECKSUMMED: u16 = 0x8000;

/// The head of a slot.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Pod, Zeroable)]
pub struct SlotHead {
    /// The block key.
    pub key: i64,
    /// The location's nonce (its id derives from it); 0 = empty slot.
    pub nonce: u32,
    /// The storage handle (index into the availability block).
    pub storage: u16,
    /// Parts used, with [`CHECKSUMMED`] when checksums follow them; or [`OVERFLOW`].
    pub part_count: u16,
}

/// One part: the string id of its URI template and the block number inside its object.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Pod, Zeroable)]
pub struct PartRecord {
    /// String id of the part's template (0: the part has an empty URI).
    pub template: u32,
    /// Block number rendered between the template's head and tail (if it has one).
    pub block: u32,
}

/// A decoded slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// Its head.
    pub head: SlotHead,
    /// Its parts (none for a marker).
    pub parts: Vec<PartRecord>,
    /// The parts' checksums: empty, or one per part.
    pub checksums: Vec<u64>,
}

impl Slot {
    /// Whether the slot is an overflow marker.
    #[inline]
    pub fn is_overflow(&self) -> bool {
        self.head.part_count == OVERFLOW
    }

    /// An overflow marker for `key`.
    pub fn overflow(key: i64) -> Slot {
        Slot {
            head: SlotHead {
                key,
                nonce: u32::MAX,
                storage: 0,
                part_count: OVERFLOW,
            },
            parts: Vec::new(),
            checksums: Vec::new(),
        }
    }

    /// The `part_count` word of a location of `parts` parts, with or without checksums.
    pub fn part_count(parts: usize, checksummed: bool) -> u16 {
        let flag = if checksummed { CHECKSUMMED } else { 0 };
        parts as u16 | flag
    }

    /// Records (of 8 bytes) a location of `parts` parts takes, with or without checksums.
    pub fn records(parts: usize, checksummed: bool) -> usize {
        parts * (1 + usize::from(checksummed))
    }

    /// Writes the slot into `out` (`slot_bytes` long; unused records zeroed).
    pub fn encode(&self, out: &mut [u8]) {
        out.fill(0);
        out[..HEAD_BYTES].copy_from_slice(bytemuck::bytes_of(&self.head));
        let records = self.parts.iter().map(bytemuck::bytes_of);
        let checksums = self.checksums.iter().map(bytemuck::bytes_of);
        for (i, record) in records.chain(checksums).enumerate() {
            let at = HEAD_BYTES + i * PART_BYTES;
            out[at..at + PART_BYTES].copy_from_slice(record);
        }
    }

    /// Decodes one slot of `slot_bytes`; `None` for an empty slot or records beyond what
    /// the slot holds.
    pub fn decode(bytes: &[u8]) -> Option<Slot> {
        SlotRef::parse(bytes).map(|slot| slot.to_slot())
    }
}

/// A slot read in place: its head, and its records borrowed from the copied bucket (what
/// a reader draws among without allocating; [`SlotRef::to_slot`] makes it owned).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotRef<'a> {
    /// Its head.
    pub head: SlotHead,
    /// The parts' records (none for a marker).
    parts: &'a [u8],
    /// The checksums' records: none, or one per part.
    checksums: &'a [u8],
}

impl<'a> SlotRef<'a> {
    /// Reads one slot of `slot_bytes`; `None` for an empty slot or records beyond what the
    /// slot holds.
    #[inline]
    pub fn parse(bytes: &'a [u8]) -> Option<SlotRef<'a>> {
        let head: SlotHead = bytemuck::pod_read_unaligned(bytes.get(..HEAD_BYTES)?);
        if head.nonce == 0 {
            return None;
        }
        if head.part_count == OVERFLOW {
            return Some(SlotRef {
                head,
                parts: &[],
                checksums: &[],
            });
        }
        let checksummed = head.part_count & CHECKSUMMED != 0;
        let count = usize::from(head.part_count & !CHECKSUMMED);
        let end = HEAD_BYTES + Slot::records(count, checksummed) * PART_BYTES;
        let (parts, checksums) = bytes.get(HEAD_BYTES..end)?.split_at(count * PART_BYTES);
        Some(SlotRef {
            head,
            parts,
            checksums,
        })
    }

    /// Whether the slot is an overflow marker.
    #[inline]
    pub fn is_overflow(&self) -> bool {
        self.head.part_count == OVERFLOW
    }

    /// Its parts, in spec order.
    #[inline]
    pub fn parts(&self) -> impl ExactSizeIterator<Item = PartRecord> + 'a {
        self.parts
            .chunks_exact(PART_BYTES)
            .map(bytemuck::pod_read_unaligned)
    }

    /// The checksum of part `i`, when the location carries checksums.
    #[inline]
    pub fn checksum(&self, i: usize) -> Option<u64> {
        let record = self.checksums.get(i * PART_BYTES..(i + 1) * PART_BYTES)?;
        Some(bytemuck::pod_read_unaligned(record))
    }

    /// The owned slot.
    pub fn to_slot(&self) -> Slot {
        Slot {
            head: self.head,
            parts: self.parts().collect(),
            checksums: self
                .checksums
                .chunks_exact(PART_BYTES)
                .map(bytemuck::pod_read_unaligned)
                .collect(),
        }
    }
}

/// The slots of a bucket body (after the seqlock's front word), empty ones included as
/// `None`.
pub fn bucket_slots(
    body: &[u8],
    slot_bytes: usize,
    slots: usize,
) -> impl Iterator<Item = Option<Slot>> + '_ {
    body.chunks_exact(slot_bytes).take(slots).map(Slot::decode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_round_trip_and_empty_or_oversized_slots_decode_to_none() {
        let slot = Slot {
            head: SlotHead {
                key: -5,
                nonce: 9,
                storage: 3,
                part_count: 2,
            },
            parts: vec![
                PartRecord {
                    template: 1,
                    block: 7,
                },
                PartRecord {
                    template: 4,
                    block: 0,
                },
            ],
            checksums: Vec::new(),
        };
        let mut bytes = vec![0u8; HEAD_BYTES + 4 * PART_BYTES];
        slot.encode(&mut bytes);
        assert_eq!(Slot::decode(&bytes), Some(slot.clone()));
        assert_eq!(Slot::decode(&[0u8; 40]), None);
        let checksummed = Slot {
            head: SlotHead {
                part_count: Slot::part_count(2, true),
                ..slot.head
            },
            checksums: vec![u64::MAX, 0],
            ..slot.clone()
        };
        checksummed.encode(&mut bytes);
        assert_eq!(Slot::decode(&bytes), Some(checksummed.clone()));
        assert_eq!(
            Slot::decode(&bytes[..HEAD_BYTES + 3 * PART_BYTES]),
            None,
            "checksums beyond the slot"
        );
        let mut lying = slot;
        lying.head.part_count = 9;
        lying.parts.clear();
        lying.encode(&mut bytes);
        assert_eq!(Slot::decode(&bytes), None, "more parts than the slot holds");
    }
}
