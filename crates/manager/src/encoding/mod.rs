//! The stable, versioned storage encoding of the manager's objects: block entries and the
//! registry (storages, instance groups, instances, accounts, API keys). The write-ahead log, snapshots
//! and the Redis index store these bytes; the lookup table has its own fixed-size projection.
//!
//! Layout of every encoding: a 2-byte kind tag (`KE` entry, `KS` storage, `KG` group, `KI`
//! instance, `KA` account, `KK` API key), a version byte, then the body. Integers are fixed-width little
//! endian, strings and lists a `u32` length then their items, options a `0`/`1` byte, enums
//! one byte whose numbering belongs to this format (not to the wire).
//!
//! A decoded entry is checked for what the read and write paths rely on (at least one location,
//! every location with parts in strictly increasing spec order). Registry objects decode as
//! data: whoever restores them registers them through the same validation as a client's
//! request (AddStorage, CreateInstanceGroup, RegisterInstance), so a damaged record is refused
//! there, with the reason. The allocation budget fits the densest lists the journal writes: a
//! `String` (24 B) costs at least 4 bytes of length, a deletion in an `Entries` record (a
//! 56-byte element) 9 bytes.
//!
//! Versions: v1 is the first format; v2 adds the writer's checksums to entry locations and
//! upstream trunk's `extra_info` / `revisit_interval_buckets` to instance groups; v3 adds
//! upstream trunk's event-report storages, groups' `event_report_storage_candidates` and
//! instances' default query type; v4 adds instances' `use_eagle_pop`; v5 adds
//! ST_DUMMY storages; v6 adds API keys and the ROLE_OPERATOR account role. A
//! value is written in the oldest version that holds it ([`Encode::version`]: an entry
//! without checksums is still written as v1, byte-identical to what v1 binaries wrote), so
//! an older binary reads everything that does not use a newer feature.
//!
//! Invariants: a decoder reads every version up to [`VERSION`] and refuses newer ones with
//! [`DecodeError::NewerVersion`]. Decoding never panics, refuses trailing bytes, and never
//! allocates more than [`ALLOCATION_FACTOR`] times the input length: every allocation is
//! charged to a budget before it is made. The encodings of representative objects are
//! committed under `fixtures/encoding/v1/` … `v4/`; every later decoder must read them.

mod entry;
mod reader;
mod registry;
#[cfg(test)]
mod tests;
mod writer;

pub use reader::{DecodeError, Reader};
pub use writer::Writer;

/// The newest version this build writes and reads.
pub const VERSION: u8 = 6;

/// A decode allocates at most this many bytes per input byte. Not less than 7: a deletion in
/// a journal `Entries` record is 9 bytes that decode into a 56-byte list element (with 4, a
/// record of more than a few deletions was refused as `TooLarge` and skipped at recovery).
pub const ALLOCATION_FACTOR: usize = 8;

/// What an encoding holds (its 2-byte tag).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A block entry.
    Entry,
    /// A storage config.
    Storage,
    /// An instance group.
    Group,
    /// An instance registration.
    Instance,
    /// An account.
    Account,
    /// An API key.
    ApiKey,
}

impl Kind {
    fn tag(self) -> [u8; 2] {
        match self {
            Kind::Entry => *b"KE",
            Kind::Storage => *b"KS",
            Kind::Group => *b"KG",
            Kind::Instance => *b"KI",
            Kind::Account => *b"KA",
            Kind::ApiKey => *b"KK",
        }
    }
}

/// An object with a storage encoding.
pub trait Encode: Sized {
    /// Its kind tag.
    const KIND: Kind;
    /// The oldest version that holds this value (the one it is written in).
    fn version(&self) -> u8 {
        1
    }
    /// Appends the body (no header) in [`Encode::version`].
    fn write_body(&self, out: &mut Writer);
    /// Reads the body (no header) of an encoding of `version`.
    fn read_body(input: &mut Reader<'_>, version: u8) -> Result<Self, DecodeError>;

    /// The full encoding: header and body.
    fn encode(&self) -> Vec<u8> {
        let mut out = Writer::default();
        out.bytes(&Self::KIND.tag());
        out.u8(self.version());
        self.write_body(&mut out);
        out.finish()
    }

    /// Decodes a full encoding.
    fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut input = Reader::new(bytes);
        let tag = input.array::<2>()?;
        if tag != Self::KIND.tag() {
            return Err(DecodeError::WrongKind {
                expected: Self::KIND,
                found: tag,
            });
        }
        let version = input.u8()?;
        if version == 0 {
            return Err(DecodeError::Invalid("version 0"));
        }
        if version > VERSION {
            return Err(DecodeError::NewerVersion {
                found: version,
                newest: VERSION,
            });
        }
        let value = Self::read_body(&mut input, version)?;
        input.finish()?;
        Ok(value)
    }
}
