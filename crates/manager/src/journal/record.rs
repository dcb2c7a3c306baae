//! The records of the write-ahead log and of snapshots: registry changes (each object in its
//! versioned storage encoding, see [`crate::encoding`]) and batches of index changes.
//!
//! A logged entry keeps what outlives the process: locations whose bytes do not (memory
//! pools) are left out, and for parts whose address names a process-local object (file ids
//! of the file tier) the record carries the object's name, so that recovery can adopt the
//! part again ([`kvcm_storage::DataStorage::adopt`]).
//!
//! Layout: a tag byte, then the body. Registry objects are nested encodings (length-prefixed
//! bytes with their own kind tag and version). Decoding never panics; an unknown tag is an
//! error, so a newer log is refused rather than misread.

use kvcm_index::BlockKey;
use kvcm_storage::StorageConfig;

use crate::accounts::Account;
use crate::api_keys::ApiKey;
use crate::encoding::{DecodeError, Encode, Reader, Writer};
use crate::entry::{Entry, StorageHandle};
use crate::group_config::GroupConfig;
use crate::registration::InstanceInfo;

/// One record.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Record {
    /// A storage was added or updated; `handle` is its current incarnation.
    Storage {
        /// The incarnation entries name.
        handle: StorageHandle,
        /// Its config.
        config: StorageConfig,
    },
    /// An incarnation handle and the config it was opened with (snapshots list every one,
    /// so entries of older incarnations still find their storage, and whether it moved).
    Incarnation {
        /// The handle.
        handle: StorageHandle,
        /// Its config.
        config: StorageConfig,
    },
    /// A storage was removed.
    StorageRemoved(String),
    /// A storage was enabled or disabled by the admin (EnableStorage / DisableStorage).
    StorageAvailability {
        /// The storage.
        name: String,
        /// Enabled.
        available: bool,
    },
    /// A group was created or updated.
    Group(GroupConfig),
    /// A group was removed.
    GroupRemoved(String),
    /// An instance was registered.
    Instance(InstanceInfo),
    /// An instance was removed (with all its entries).
    InstanceRemoved(String),
    /// An account was added.
    Account(Account),
    /// An account was deleted.
    AccountRemoved(String),
    /// An API key was created.
    ApiKey(ApiKey),
    /// An API key was revoked (by id).
    ApiKeyRevoked(String),
    /// Index changes of one instance: per key its new entry, `None` when removed.
    Entries {
        /// The instance.
        instance_id: String,
        /// The changes, in commit order.
        changes: Vec<(BlockKey, Option<DurableEntry>)>,
    },
    /// The last record of a snapshot: how many came before it.
    End(u64),
}

/// An entry as logged: its locations that outlive the process, and the names of the
/// process-local objects they name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DurableEntry {
    /// The entry (never empty).
    pub entry: Entry,
    /// Names of the objects its parts' addresses refer to, where those are process-local.
    pub names: Vec<ObjectName>,
}

/// The name of one process-local object of one storage incarnation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ObjectName {
    /// The incarnation.
    pub storage: StorageHandle,
    /// The object id in the address.
    pub object: u32,
    /// The id's generation in the address.
    pub generation: u16,
    /// The object's name below the storage's base.
    pub name: String,
}

impl ObjectName {
    /// Whether this names the object of `address` in `storage`.
    pub fn names(&self, storage: StorageHandle, address: kvcm_storage::PartAddress) -> bool {
        self.storage == storage
            && self.object == address.object
            && self.generation == address.generation
    }
}

const STORAGE: u8 = 1;
const INCARNATION: u8 = 2;
const STORAGE_REMOVED: u8 = 3;
const GROUP: u8 = 4;
const GROUP_REMOVED: u8 = 5;
const INSTANCE: u8 = 6;
const INSTANCE_REMOVED: u8 = 7;
const ACCOUNT: u8 = 8;
const ACCOUNT_REMOVED: u8 = 9;
const ENTRIES: u8 = 10;
const END: u8 = 11;
const STORAGE_AVAILABILITY: u8 = 12;
const API_KEY: u8 = 13;
const API_KEY_REVOKED: u8 = 14;

impl Record {
    /// The record's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Writer::default();
        match self {
            Record::Storage { handle, config } => {
                out.u8(STORAGE);
                out.u16(handle.0);
                out.blob(&config.encode());
            }
            Record::Incarnation { handle, config } => {
                out.u8(INCARNATION);
                out.u16(handle.0);
                out.blob(&config.encode());
            }
            Record::StorageRemoved(name) => named(&mut out, STORAGE_REMOVED, name),
            Record::StorageAvailability { name, available } => {
                named(&mut out, STORAGE_AVAILABILITY, name);
                out.u8(u8::from(*available));
            }
            Record::Group(group) => nested(&mut out, GROUP, group),
            Record::GroupRemoved(name) => named(&mut out, GROUP_REMOVED, name),
            Record::Instance(info) => nested(&mut out, INSTANCE, info),
            Record::InstanceRemoved(id) => named(&mut out, INSTANCE_REMOVED, id),
            Record::Account(account) => nested(&mut out, ACCOUNT, account),
            Record::AccountRemoved(name) => named(&mut out, ACCOUNT_REMOVED, name),
            Record::ApiKey(key) => nested(&mut out, API_KEY, key),
            Record::ApiKeyRevoked(id) => named(&mut out, API_KEY_REVOKED, id),
            Record::Entries {
                instance_id,
                changes,
            } => {
                out.u8(ENTRIES);
                out.str(instance_id);
                out.list(changes, |out, (key, entry)| {
                    out.i64(*key);
                    out.option(entry.as_ref(), write_entry);
                });
            }
            Record::End(count) => {
                out.u8(END);
                out.u64(*count);
            }
        }
        out.finish()
    }

    /// Decodes one record's bytes.
    pub fn decode(bytes: &[u8]) -> Result<Record, DecodeError> {
        let mut input = Reader::new(bytes);
        let record = match input.u8()? {
            STORAGE => Record::Storage {
                handle: StorageHandle(input.u16()?),
                config: StorageConfig::decode(input.blob()?)?,
            },
            INCARNATION => Record::Incarnation {
                handle: StorageHandle(input.u16()?),
                config: StorageConfig::decode(input.blob()?)?,
            },
            STORAGE_REMOVED => Record::StorageRemoved(input.string()?),
            STORAGE_AVAILABILITY => Record::StorageAvailability {
                name: input.string()?,
                available: match input.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(DecodeError::Invalid("an availability that is not 0 or 1")),
                },
            },
            GROUP => Record::Group(GroupConfig::decode(input.blob()?)?),
            GROUP_REMOVED => Record::GroupRemoved(input.string()?),
            INSTANCE => Record::Instance(InstanceInfo::decode(input.blob()?)?),
            INSTANCE_REMOVED => Record::InstanceRemoved(input.string()?),
            ACCOUNT => Record::Account(Account::decode(input.blob()?)?),
            ACCOUNT_REMOVED => Record::AccountRemoved(input.string()?),
            API_KEY => Record::ApiKey(ApiKey::decode(input.blob()?)?),
            API_KEY_REVOKED => Record::ApiKeyRevoked(input.string()?),
            ENTRIES => Record::Entries {
                instance_id: input.string()?,
                changes: input.list(|input| Ok((input.i64()?, input.option(read_entry)?)))?,
            },
            END => Record::End(input.u64()?),
            _ => return Err(DecodeError::Invalid("an unknown journal record tag")),
        };
        input.finish()?;
        Ok(record)
    }
}

/// Fuzzing only: `bytes` as the payload of each kind of record that nests an object (a
/// storage config, group, instance, account, or one entry of an `Entries` record).
#[cfg(feature = "fuzzing")]
pub(crate) fn nesting(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut records = Vec::new();
    for tag in [STORAGE, INCARNATION, GROUP, INSTANCE, ACCOUNT] {
        let mut out = Writer::default();
        out.u8(tag);
        if matches!(tag, STORAGE | INCARNATION) {
            out.u16(1);
        }
        out.blob(bytes);
        records.push(out.finish());
    }
    let mut out = Writer::default();
    out.u8(ENTRIES);
    out.str("instance");
    out.len(1);
    out.i64(7);
    out.u8(1);
    out.blob(bytes);
    out.len(0);
    records.push(out.finish());
    records
}

fn named(out: &mut Writer, tag: u8, name: &str) {
    out.u8(tag);
    out.str(name);
}

fn nested<T: Encode>(out: &mut Writer, tag: u8, value: &T) {
    out.u8(tag);
    out.blob(&value.encode());
}

pub(crate) fn write_entry(out: &mut Writer, entry: &DurableEntry) {
    out.blob(&entry.entry.encode());
    out.list(&entry.names, |out, name| {
        out.u16(name.storage.0);
        out.u32(name.object);
        out.u16(name.generation);
        out.str(&name.name);
    });
}

pub(crate) fn read_entry(input: &mut Reader<'_>) -> Result<DurableEntry, DecodeError> {
    let entry = Entry::decode(input.blob()?)?;
    let names = input.list(|input| {
        Ok(ObjectName {
            storage: StorageHandle(input.u16()?),
            object: input.u32()?,
            generation: input.u16()?,
            name: input.string()?,
        })
    })?;
    Ok(DurableEntry { entry, names })
}
