//! The availability block (offset 0 of a generation): per storage handle, the read weight a
//! location on it has for this instance (wire fact sheet §11: 0 = a miss) and its storage
//! type's wire number; whether none of the group's storages is available (every query
//! then fails as on gRPC); and whether reporters report for the instance (their locations
//! are not in the table: every query is then answered by the server).
//!
//! Body: `flags: u32` (bit 0: no storage available; bit 1: reported for), `count: u32`,
//! then per handle `weight: u8`, `storage_type: u8`; the rest zero.

use crate::error::{FormatError, Full, Result};
use crate::seqlock::OVERHEAD;

/// Flag: none of the instance group's storages is available.
const NO_STORAGE: u32 = 1;
/// Flag: reporters report for the instance; only the server answers with their locations.
const REPORTED: u32 = 2;

/// One storage handle's entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StorageWeight {
    /// Read weight (0: locations there are misses).
    pub weight: u8,
    /// Storage type, as its wire enum number.
    pub storage_type: u8,
}

/// The availability of every storage handle, for one instance.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Availability {
    /// No storage of the group is available: queries fail.
    pub no_storage: bool,
    /// Reporters report for the instance: queries are answered by the server.
    pub reported: bool,
    /// Per handle.
    pub storages: Vec<StorageWeight>,
}

/// Bytes of an availability block with room for `handles` handles (whole cache lines).
pub fn block_bytes(handles: usize) -> usize {
    (OVERHEAD + 8 + 2 * handles).next_multiple_of(64)
}

impl Availability {
    /// The weight entry of `handle` (unknown handles weigh 0).
    #[inline]
    pub fn get(&self, handle: u16) -> StorageWeight {
        self.storages
            .get(usize::from(handle))
            .copied()
            .unwrap_or_default()
    }

    /// The body for a block of `block_len` bytes; `Full` when the handles do not fit.
    pub fn encode(&self, block_len: usize) -> Result<Vec<u8>> {
        let body_len = block_len - OVERHEAD;
        if 8 + 2 * self.storages.len() > body_len {
            return Err(FormatError::Full(Full::Handles));
        }
        let mut body = Vec::with_capacity(body_len);
        let flags =
            if self.no_storage { NO_STORAGE } else { 0 } | if self.reported { REPORTED } else { 0 };
        body.extend_from_slice(&flags.to_le_bytes());
        body.extend_from_slice(&(self.storages.len() as u32).to_le_bytes());
        for storage in &self.storages {
            body.push(storage.weight);
            body.push(storage.storage_type);
        }
        body.resize(body_len, 0);
        Ok(body)
    }

    /// Decodes a block body.
    pub fn decode(body: &[u8]) -> Result<Availability> {
        let mut availability = Availability::default();
        availability.decode_into(body)?;
        Ok(availability)
    }

    /// Decodes a block body into `self`, reusing its allocation (unchanged on error).
    pub fn decode_into(&mut self, body: &[u8]) -> Result<()> {
        let word = |at: usize| -> Result<u32> {
            let b = body
                .get(at..at + 4)
                .ok_or(FormatError::Corrupt("short availability block"))?;
            Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        let flags = word(0)?;
        let count = word(4)? as usize;
        let pairs = body
            .get(8..8 + 2 * count)
            .ok_or(FormatError::Corrupt("availability count out of bounds"))?;
        self.no_storage = flags & NO_STORAGE != 0;
        self.reported = flags & REPORTED != 0;
        self.storages.clear();
        self.storages
            .extend(pairs.chunks_exact(2).map(|p| StorageWeight {
                weight: p[0],
                storage_type: p[1],
            }));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn availability_round_trips_and_refuses_what_does_not_fit() {
        let availability = Availability {
            no_storage: false,
            reported: true,
            storages: vec![
                StorageWeight::default(),
                StorageWeight {
                    weight: 5,
                    storage_type: 1,
                },
            ],
        };
        let len = block_bytes(2);
        assert_eq!(len, 64);
        let body = availability.encode(len).unwrap();
        assert_eq!(Availability::decode(&body).unwrap(), availability);
        assert_eq!(availability.get(1).weight, 5);
        assert_eq!(availability.get(9).weight, 0);
        let many = Availability {
            no_storage: true,
            reported: false,
            storages: vec![StorageWeight::default(); 100],
        };
        assert!(matches!(
            many.encode(64),
            Err(FormatError::Full(Full::Handles))
        ));
        let mut lying = body.clone();
        lying[4] = 200;
        assert!(Availability::decode(&lying).is_err());
    }
}
