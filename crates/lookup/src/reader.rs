//! Reader-side decoding: what a client makes of the bytes its one-sided READs copied.

use crate::avail::Availability;
use crate::error::Result;
use crate::header::Geometry;
use crate::seqlock::{self, Opened};
use crate::slot::SlotRef;

/// A copied bucket (or availability block), decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Copy<T> {
    /// Consistent contents.
    Good(T),
    /// Written while copied: copy it again.
    Torn,
    /// The generation was replaced: read the header again.
    Retired,
}

/// The slots of `key` in a copied bucket, read in place.
#[inline]
pub fn key_slots<'a>(block: &'a [u8], geometry: &Geometry, key: i64) -> Copy<KeySlots<'a>> {
    match seqlock::open(block) {
        Opened::Body(body) => Copy::Good(KeySlots {
            body,
            slot_bytes: geometry.slot_bytes,
            left: geometry.slots_per_bucket,
            key,
        }),
        Opened::Torn => Copy::Torn,
        Opened::Retired => Copy::Retired,
    }
}

/// The slots of one key in a bucket body (see [`key_slots`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySlots<'a> {
    /// The body's slots not yet looked at.
    body: &'a [u8],
    slot_bytes: usize,
    /// Slots of the bucket not yet looked at.
    left: usize,
    key: i64,
}

impl<'a> Iterator for KeySlots<'a> {
    type Item = SlotRef<'a>;

    #[inline]
    fn next(&mut self) -> Option<SlotRef<'a>> {
        while self.left > 0 && self.body.len() >= self.slot_bytes {
            let (slot, rest) = self.body.split_at(self.slot_bytes);
            self.body = rest;
            self.left -= 1;
            // Only the key's slots are read (the key is the slot's first 8 bytes).
            if slot[..8] == self.key.to_le_bytes() {
                if let Some(found) = SlotRef::parse(slot) {
                    return Some(found);
                }
            }
        }
        None
    }
}

/// A copied availability block, decoded into `into` (left as it was unless good).
pub fn availability(block: &[u8], into: &mut Availability) -> Result<Copy<()>> {
    Ok(match seqlock::open(block) {
        Opened::Body(body) => {
            into.decode_into(body)?;
            Copy::Good(())
        }
        Opened::Torn => Copy::Torn,
        Opened::Retired => Copy::Retired,
    })
}
