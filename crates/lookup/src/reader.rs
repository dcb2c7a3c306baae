//! Reader-side decoding: what a client makes of the bytes its one-sided READs copied.

use crate::avail::Availability;
use crate::error::Result;
use crate::header::Geometry;
use crate::seqlock::{self, Opened};
use crate::slot::Slot;

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

/// The slots of `key` in a copied bucket.
pub fn key_slots(block: &[u8], geometry: &Geometry, key: i64) -> Copy<Vec<Slot>> {
    match seqlock::open(block) {
        Opened::Body(body) => Copy::Good(
            body.chunks_exact(geometry.slot_bytes)
                .take(geometry.slots_per_bucket)
                // Only the key's slots are decoded (the key is the slot's first 8 bytes).
                .filter(|slot| slot[..8] == key.to_le_bytes())
                .filter_map(Slot::decode)
                .collect(),
        ),
        Opened::Torn => Copy::Torn,
        Opened::Retired => Copy::Retired,
    }
}

/// A copied availability block.
pub fn availability(block: &[u8]) -> Result<Copy<Availability>> {
    Ok(match seqlock::open(block) {
        Opened::Body(body) => Copy::Good(Availability::decode(body)?),
        Opened::Torn => Copy::Torn,
        Opened::Retired => Copy::Retired,
    })
}
