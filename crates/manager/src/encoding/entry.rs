//! The encoding of a block entry: its locations, each a storage handle, a state and its
//! parts' compact addresses.

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

fn write_location(out: &mut Writer, location: &LocationRef<'_>) {
    out.u16(location.storage.0);
    out.u8(state_code(location.state));
    out.u32(location.nonce);
    out.list(location.parts, |out, part| {
        out.u16(part.spec);
        out.u32(part.address.object);
        out.u32(part.address.block);
        out.u16(part.address.generation);
    });
}

fn read_location(input: &mut Reader<'_>) -> Result<Location, DecodeError> {
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
    Ok(Location {
        storage,
        state,
        nonce,
        parts,
    })
}

impl Encode for Entry {
    const KIND: Kind = Kind::Entry;

    fn write_body(&self, out: &mut Writer) {
        out.len(self.len());
        for location in self.locations() {
            write_location(out, &location);
        }
    }

    fn read_body(input: &mut Reader<'_>, _version: u8) -> Result<Self, DecodeError> {
        let locations = input.list(read_location)?;
        if locations.is_empty() {
            return Err(DecodeError::Invalid("an entry without locations"));
        }
        // The shared allocation of an entry that is not inline.
        input.charge(std::mem::size_of::<Vec<Location>>() + 16)?;
        Ok(Entry::new(locations))
    }
}
