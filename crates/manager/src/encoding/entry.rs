//! The encoding of a block entry: its locations, each a storage handle, a state and its
//! parts' compact addresses; from v2 also the location's checksums (a list after the parts:
//! empty, or one per part).

use kvcm_storage::PartAddress;

use super::{DecodeError, Encode, Kind, Reader, Writer};
use crate::entry::{Entry, Location, LocationRef, LocationState, Part, StorageHandle};

fn state_code(state: LocationState) -> u8 {
    match state {
        LocationState::Writing => 0,
        LocationState::Serving => 1,
        LocationState::Deleting => 2,
    }
}

fn state_of(code: u8) -> Result<LocationState, DecodeError> {
    match code {
        0 => Ok(LocationState::Writing),
        1 => Ok(LocationState::Serving),
        2 => Ok(LocationState::Deleting),
        _ => Err(DecodeError::Invalid("an unknown location state")),
    }
}

/// The first version with checksums.
const CHECKSUMS: u8 = 2;

fn write_location(out: &mut Writer, location: &LocationRef<'_>, version: u8) {
    out.u16(location.storage.0);
    out.u8(state_code(location.state));
    out.u32(location.nonce);
    out.list(location.parts, |out, part| {
        out.u16(part.spec);
        out.u32(part.address.object);
        out.u32(part.address.block);
        out.u16(part.address.generation);
    });
    if version >= CHECKSUMS {
        out.list(location.checksums, |out, checksum| out.u64(*checksum));
    }
}

fn read_location(input: &mut Reader<'_>, version: u8) -> Result<Location, DecodeError> {
    let storage = StorageHandle(input.u16()?);
    let state = state_of(input.u8()?)?;
    let nonce = input.u32()?;
    let parts = input.list(|input| {
        Ok(Part {
            spec: input.u16()?,
            address: PartAddress {
                object: input.u32()?,
                block: input.u32()?,
                generation: input.u16()?,
            },
        })
    })?;
    if parts.is_empty() {
        return Err(DecodeError::Invalid("a location without parts"));
    }
    if !parts.windows(2).all(|pair| pair[0].spec < pair[1].spec) {
        return Err(DecodeError::Invalid("parts that are not in spec order"));
    }
    let checksums = if version >= CHECKSUMS {
        input.list(|input| input.u64())?
    } else {
        Vec::new()
    };
    if !checksums.is_empty() && checksums.len() != parts.len() {
        return Err(DecodeError::Invalid(
            "checksums that do not match the parts",
        ));
    }
    Ok(Location {
        storage,
        state,
        nonce,
        parts,
        checksums,
    })
}

impl Encode for Entry {
    const KIND: Kind = Kind::Entry;

    fn version(&self) -> u8 {
        if self.locations().any(|l| !l.checksums.is_empty()) {
            CHECKSUMS
        } else {
            1
        }
    }

    fn write_body(&self, out: &mut Writer) {
        let version = self.version();
        out.len(self.len());
        for location in self.locations() {
            write_location(out, &location, version);
        }
    }

    fn read_body(input: &mut Reader<'_>, version: u8) -> Result<Self, DecodeError> {
        let locations = input.list(|input| read_location(input, version))?;
        if locations.is_empty() {
            return Err(DecodeError::Invalid("an entry without locations"));
        }
        // The shared allocation of an entry that is not inline.
        input.charge(std::mem::size_of::<Vec<Location>>() + 16)?;
        Ok(Entry::new(locations))
    }
}
