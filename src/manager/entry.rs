//! What the index stores per block key: the key's locations, each with its state
//! (wire fact sheet §13). Entries are immutable and shared (`Arc`); a state change stores a
//! new entry inside one `read_modify_write` (a compare-and-set per key).

use std::sync::Arc;

use crate::proto::meta;

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

impl LocationState {
    /// The status string of GetCacheMeta (`CLS_*`).
    pub fn status_name(self) -> &'static str {
        match self {
            LocationState::Writing => "CLS_WRITING",
            LocationState::Serving => "CLS_SERVING",
            LocationState::Deleting => "CLS_DELETING",
        }
    }
}

/// One stored copy of a block.
#[derive(Debug, Clone, PartialEq)]
pub struct Location {
    /// 8-character random id, unique within the key.
    pub id: Arc<str>,
    /// Lifecycle state.
    pub state: LocationState,
    /// Name of the storage holding it (the URI host).
    pub storage_name: Arc<str>,
    /// The wire form handed to engines.
    pub cache_location: meta::CacheLocation,
}

/// All locations of one block key (never empty while stored).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct KeyEntry {
    /// The locations, in insertion order.
    pub locations: Vec<Location>,
}

/// The index value type: a shared, immutable entry.
pub type Entry = Arc<KeyEntry>;

impl KeyEntry {
    /// A copy with location `id` removed if it is `Deleting`; `None` when it is not there in
    /// that state. The result may have no locations left (the caller then deletes the key).
    pub fn without_deleting(&self, id: &str) -> Option<KeyEntry> {
        let position = self
            .locations
            .iter()
            .position(|l| &*l.id == id && l.state == LocationState::Deleting)?;
        let mut locations = self.locations.clone();
        locations.remove(position);
        Some(KeyEntry { locations })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn location(id: &str, state: LocationState) -> Location {
        Location {
            id: id.into(),
            state,
            storage_name: "s".into(),
            cache_location: meta::CacheLocation::default(),
        }
    }

    #[test]
    fn only_deleting_locations_are_removed() {
        let entry = KeyEntry {
            locations: vec![
                location("a", LocationState::Serving),
                location("b", LocationState::Deleting),
            ],
        };
        assert!(entry.without_deleting("a").is_none());
        let rest = entry.without_deleting("b").expect("b is deleting");
        assert_eq!(rest.locations.len(), 1);
        assert_eq!(&*rest.locations[0].id, "a");
    }
}
