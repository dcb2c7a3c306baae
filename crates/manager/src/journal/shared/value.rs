//! The value of one block key in the shared store: a [`DurableEntry`] whose storage handles
//! no longer depend on the process that wrote it.
//!
//! Handles are per process, and so are the numbers two leaders would give one storage. Each
//! value therefore carries the list of storages it names — the storage's name and the id of
//! the storage's registration the location was written under (random per registration with
//! a new spec, kept by updates that leave the spec as it is; 0: an earlier registration) —
//! and its handles are indices into that list. A reader maps each back to a handle of its
//! own by name; a location whose id is not the storage's current one (its root moved, say) is
//! stale, as in the local journal's recovery.
//!
//! Layout (version 1): `u8` version, the storage list (`str` name, `u64` id each),
//! then the entry as the journal writes it ([`write_entry`]) with list indices as handles.
//! Decoding never panics; an index past the list is an error.

use std::collections::HashMap;

use crate::encoding::{DecodeError, Reader, Writer};
use crate::entry::{Entry, StorageHandle};
use crate::journal::record::{read_entry, write_entry, DurableEntry, ObjectName};

/// The version this build writes and the only one it reads.
const VERSION: u8 = 1;

/// A storage as a shared value names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StorageRef {
    /// The storage's `global_unique_name`.
    pub name: String,
    /// The id of its registration the location was written under (0: none current).
    pub id: u64,
}

/// The bytes of `entry`; `describe` names the storage behind each of its handles (`None`:
/// gone, and the entry should not have named it — the location is left out).
pub(crate) fn encode(
    entry: &DurableEntry,
    describe: impl Fn(StorageHandle) -> Option<StorageRef>,
) -> Vec<u8> {
    let mut storages: Vec<StorageRef> = Vec::new();
    let portable = remap(entry, |handle| {
        let index = StorageHandle(u16::try_from(storages.len()).ok()?);
        storages.push(describe(handle)?);
        Some(index)
    });
    let portable = portable.unwrap_or_else(|| DurableEntry {
        entry: Entry::new(Vec::new()),
        names: Vec::new(),
    });
    let mut out = Writer::default();
    out.u8(VERSION);
    out.list(&storages, |out, storage| {
        out.str(&storage.name);
        out.u64(storage.id);
    });
    write_entry(&mut out, &portable);
    out.finish()
}

/// The storages a value names and its entry, whose handles index that list.
pub(crate) fn decode(bytes: &[u8]) -> Result<(Vec<StorageRef>, DurableEntry), DecodeError> {
    let mut input = Reader::new(bytes);
    let version = input.u8()?;
    if version != VERSION {
        return Err(DecodeError::Invalid("a shared entry of an unknown version"));
    }
    let storages = input.list(|input| {
        Ok(StorageRef {
            name: input.string()?,
            id: input.u64()?,
        })
    })?;
    let entry = read_entry(&mut input)?;
    input.finish()?;
    let known = |handle: StorageHandle| usize::from(handle.0) < storages.len();
    let handles_known = entry.entry.locations().all(|l| known(l.storage))
        && entry.names.iter().all(|n| known(n.storage));
    if !handles_known {
        return Err(DecodeError::Invalid(
            "a storage index past the value's list",
        ));
    }
    Ok((storages, entry))
}

/// `entry` with each storage handle replaced by the one `map` gives it (asked once per
/// distinct handle); locations `map` refuses are left out (and the names of their objects).
/// `None` when no location is left.
pub(crate) fn remap(
    entry: &DurableEntry,
    mut map: impl FnMut(StorageHandle) -> Option<StorageHandle>,
) -> Option<DurableEntry> {
    let mut mapped: HashMap<StorageHandle, Option<StorageHandle>> = HashMap::new();
    let mut lookup = |index: StorageHandle| *mapped.entry(index).or_insert_with(|| map(index));
    let mut locations = Vec::with_capacity(entry.entry.len());
    for location in entry.entry.locations() {
        if let Some(handle) = lookup(location.storage) {
            let mut owned = location.to_owned();
            owned.storage = handle;
            locations.push(owned);
        }
    }
    if locations.is_empty() {
        return None;
    }
    let names = entry
        .names
        .iter()
        .filter_map(|name| {
            let storage = lookup(name.storage)?;
            Some(ObjectName {
                storage,
                ..name.clone()
            })
        })
        .collect();
    Some(DurableEntry {
        entry: Entry::new(locations),
        names,
    })
}
