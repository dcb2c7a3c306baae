//! What the index stores per block key: the key's locations, each a storage handle, a state
//! and per part the backend's compact address (wire fact sheet §13). URIs are not stored:
//! they are rendered from these facts on the way out, byte-identical to the ones
//! StartWriteCache handed out.
//!
//! Entries are immutable values; a state change stores a new entry inside one
//! `read_modify_write` (a compare-and-set per key). The common entry — one location with one
//! part and no checksum — is held inline in 24 bytes; any other shape in one shared
//! allocation.
//!
//! A location may carry the writer's checksums (xxh3-64 of each part's bytes, given at
//! FinishWriteCache): none, or exactly one per part, in part order.

use std::sync::Arc;

use kvcm_storage::PartAddress;

/// Lifecycle state of one location. Only `Serving` is readable; every state counts as
/// "present" for StartWriteCache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LocationState {
    /// Allocated, being written by the engine under a write session.
    Writing,
    /// Committed and readable.
    Serving,
    /// Unreadable, waiting for the deleter.
    Deleting,
}

/// A registered storage incarnation (see `storages`): handles are never reused, so a
/// location always names the backend that allocated it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StorageHandle(pub u16);

/// One part of a stored block: which of the instance's specs, and where the backend put it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Part {
    /// Index of the spec in the instance's registration.
    pub spec: u16,
    /// The backend's compact address of the part.
    pub address: PartAddress,
}

/// One stored copy of a block (with at least one part: registration refuses empty spec
/// groups).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The storage incarnation holding it.
    pub storage: StorageHandle,
    /// Lifecycle state.
    pub state: LocationState,
    /// Unique among the locations the manager created (see [`LocationId`]).
    pub nonce: u32,
    /// Its parts, in spec order.
    pub parts: Vec<Part>,
    /// The writer's checksums of the parts' bytes: empty, or one per part in part order.
    pub checksums: Vec<u64>,
}

/// A location of an entry, borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocationRef<'a> {
    /// The storage incarnation holding it.
    pub storage: StorageHandle,
    /// Lifecycle state.
    pub state: LocationState,
    /// Unique among the locations the manager created.
    pub nonce: u32,
    /// Its parts, in spec order.
    pub parts: &'a [Part],
    /// The writer's checksums of the parts' bytes: empty, or one per part in part order.
    pub checksums: &'a [u64],
}

/// The 8-character id of a location (GetCacheMeta's `id`, and how a write session names the
/// locations it created), derived from its nonce: the manager hands out nonces from one
/// counter, so an id names one location over time — a new location that reuses the storage
/// facts of a deleted one (a file id is reused once its file is freed) still gets another id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LocationId(pub u64);

/// Number of distinct ids (36^8: eight lower-case letters or digits).
const ID_SPACE: u64 = 2_821_109_907_456;

impl std::fmt::Display for LocationId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const ALPHABET: &[u8; 36] = b"abcdefghijklmnopqrstuvwxyz0123456789";
        let mut rest = self.0 % ID_SPACE;
        let mut text = [0u8; 8];
        for byte in text.iter_mut().rev() {
            *byte = ALPHABET[(rest % 36) as usize];
            rest /= 36;
        }
        f.write_str(std::str::from_utf8(&text).map_err(|_| std::fmt::Error)?)
    }
}

impl LocationRef<'_> {
    /// The location's id.
    pub fn id(&self) -> LocationId {
        LocationId(mix(u64::from(self.nonce)) % ID_SPACE)
    }

    /// An owned copy.
    pub fn to_owned(&self) -> Location {
        Location {
            storage: self.storage,
            state: self.state,
            nonce: self.nonce,
            parts: self.parts.to_vec(),
            checksums: self.checksums.to_vec(),
        }
    }
}

impl Location {
    /// The location, borrowed.
    pub fn as_ref(&self) -> LocationRef<'_> {
        LocationRef {
            storage: self.storage,
            state: self.state,
            nonce: self.nonce,
            parts: &self.parts,
            checksums: &self.checksums,
        }
    }
}

/// A 64-bit finaliser (splitmix64): spreads the facts over the id space.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// All locations of one block key (never empty while stored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry(Repr);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Repr {
    /// One location with one part and no checksum.
    One {
        part: Part,
        storage: StorageHandle,
        state: LocationState,
        nonce: u32,
    },
    /// Any other shape.
    Many(Arc<Vec<Location>>),
}

// The inline entry must stay a 24-byte value: it is most of the index's memory.
const _: () = assert!(std::mem::size_of::<Entry>() == 24);

impl Entry {
    /// An entry of these locations, in order.
    pub fn new(mut locations: Vec<Location>) -> Entry {
        if let [only] = locations.as_slice() {
            if let ([part], []) = (only.parts.as_slice(), only.checksums.as_slice()) {
                return Entry(Repr::One {
                    part: *part,
                    storage: only.storage,
                    state: only.state,
                    nonce: only.nonce,
                });
            }
        }
        locations.shrink_to_fit();
        for location in &mut locations {
            location.parts.shrink_to_fit();
            location.checksums.shrink_to_fit();
        }
        Entry(Repr::Many(Arc::new(locations)))
    }

    /// The locations, in insertion order.
    pub fn locations(&self) -> impl Iterator<Item = LocationRef<'_>> {
        let (one, many) = match &self.0 {
            Repr::One {
                part,
                storage,
                state,
                nonce,
            } => (
                Some(LocationRef {
                    storage: *storage,
                    state: *state,
                    nonce: *nonce,
                    parts: std::slice::from_ref(part),
                    checksums: &[],
                }),
                &[][..],
            ),
            Repr::Many(locations) => (None, locations.as_slice()),
        };
        one.into_iter().chain(many.iter().map(Location::as_ref))
    }

    /// Number of locations.
    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::One { .. } => 1,
            Repr::Many(locations) => locations.len(),
        }
    }

    /// Whether there is no location.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Owned copies of the locations.
    pub fn to_locations(&self) -> Vec<Location> {
        self.locations().map(|l| l.to_owned()).collect()
    }
}

/// `locations` without location `id` if it is there and `Deleting`; `None` when it is not
/// there in that state. The result may have no locations left (the caller then deletes the
/// key).
pub fn without_deleting(locations: &[Location], id: LocationId) -> Option<Vec<Location>> {
    let position = locations
        .iter()
        .position(|l| l.as_ref().id() == id && l.state == LocationState::Deleting)?;
    let mut rest = locations.to_vec();
    rest.remove(position);
    Some(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn location(object: u32, state: LocationState, parts: usize) -> Location {
        Location {
            storage: StorageHandle(1),
            state,
            nonce: object,
            parts: (0..parts)
                .map(|spec| Part {
                    spec: spec as u16,
                    address: PartAddress {
                        object,
                        block: spec as u32,
                        generation: 0,
                    },
                })
                .collect(),
            checksums: Vec::new(),
        }
    }

    #[test]
    fn only_deleting_locations_are_removed() {
        let serving = location(1, LocationState::Serving, 1);
        let deleting = location(2, LocationState::Deleting, 1);
        let locations = vec![serving.clone(), deleting.clone()];
        assert!(without_deleting(&locations, serving.as_ref().id()).is_none());
        let rest = without_deleting(&locations, deleting.as_ref().id()).expect("deleting");
        assert_eq!(rest, vec![serving]);
    }

    #[test]
    fn every_shape_reads_back_as_built() {
        for shape in [
            vec![location(1, LocationState::Writing, 1)],
            vec![location(1, LocationState::Serving, 8)],
            vec![
                location(1, LocationState::Serving, 1),
                location(2, LocationState::Deleting, 3),
            ],
            vec![Location {
                checksums: vec![7],
                ..location(1, LocationState::Serving, 1)
            }],
        ] {
            let entry = Entry::new(shape.clone());
            assert_eq!(entry.to_locations(), shape);
            assert_eq!(entry.len(), shape.len());
        }
    }

    #[test]
    fn ids_are_eight_characters_and_differ_by_nonce() {
        let a = location(1, LocationState::Serving, 1);
        let b = location(2, LocationState::Serving, 1);
        let id = a.as_ref().id().to_string();
        assert_eq!(id.len(), 8);
        assert!(id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()));
        assert_ne!(a.as_ref().id(), b.as_ref().id());
        let mut moved = a.clone();
        moved.state = LocationState::Deleting;
        assert_eq!(
            a.as_ref().id(),
            moved.as_ref().id(),
            "the state is no part of it"
        );
        let mut reused = a.clone();
        reused.nonce = 99;
        assert_ne!(
            a.as_ref().id(),
            reused.as_ref().id(),
            "the same storage facts with another nonce are another location"
        );
    }
}
