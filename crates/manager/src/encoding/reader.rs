//! Reads the primitive items of the storage encoding, with bounds checks and an allocation
//! budget (see the module above).

use super::{Kind, ALLOCATION_FACTOR};

/// Why bytes are not a valid encoding. Nothing was allocated beyond the budget.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The input ends inside an item.
    #[error("truncated encoding: {needed} more bytes needed at offset {offset}")]
    Truncated {
        /// Where the item starts.
        offset: usize,
        /// Bytes missing.
        needed: usize,
    },
    /// The encoding is of another kind of object.
    #[error("encoding of the wrong kind: expected {expected:?}, found tag {found:?}")]
    WrongKind {
        /// The kind asked for.
        expected: Kind,
        /// The tag found.
        found: [u8; 2],
    },
    /// The encoding was written by a newer version of kvcm.
    #[error("encoding version {found} is newer than this build reads (up to {newest}); a downgrade is refused")]
    NewerVersion {
        /// The version found.
        found: u8,
        /// The newest version this build reads.
        newest: u8,
    },
    /// An item holds a value no encoder writes (the text says which).
    #[error("invalid encoding: {0}")]
    Invalid(&'static str),
    /// Bytes follow the encoded object.
    #[error("{0} trailing bytes after the encoded object")]
    Trailing(usize),
    /// The lengths in the input ask for more memory than its size allows.
    #[error("the encoding's lengths ask for more memory than {ALLOCATION_FACTOR}x its size")]
    TooLarge,
}

/// Input being decoded.
#[derive(Debug)]
pub struct Reader<'a> {
    bytes: &'a [u8],
    offset: usize,
    /// Bytes the decoder may still allocate.
    budget: usize,
}

impl<'a> Reader<'a> {
    /// A reader of `bytes` with a budget of [`ALLOCATION_FACTOR`] × their length.
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader {
            bytes,
            offset: 0,
            budget: bytes.len().saturating_mul(ALLOCATION_FACTOR),
        }
    }

    /// Fails unless every byte was read.
    pub fn finish(&self) -> Result<(), DecodeError> {
        match self.bytes.len() - self.offset {
            0 => Ok(()),
            rest => Err(DecodeError::Trailing(rest)),
        }
    }

    /// Charges an allocation of `bytes` to the budget.
    pub fn charge(&mut self, bytes: usize) -> Result<(), DecodeError> {
        self.budget = self
            .budget
            .checked_sub(bytes)
            .ok_or(DecodeError::TooLarge)?;
        Ok(())
    }

    fn take(&mut self, len: usize) -> Result<&'a [u8], DecodeError> {
        let rest = &self.bytes[self.offset..];
        if rest.len() < len {
            return Err(DecodeError::Truncated {
                offset: self.offset,
                needed: len - rest.len(),
            });
        }
        self.offset += len;
        Ok(&rest[..len])
    }

    /// `N` raw bytes.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut array = [0u8; N];
        array.copy_from_slice(self.take(N)?);
        Ok(array)
    }

    /// Length-prefixed raw bytes (a nested encoding), borrowed from the input.
    pub fn blob(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = self.u32()? as usize;
        self.take(len)
    }

    /// Little endian.
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// One byte.
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    /// A boolean byte (0 or 1).
    pub fn bool(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError::Invalid("a boolean that is neither 0 nor 1")),
        }
    }

    /// Little endian.
    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    /// Little endian.
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// Little endian.
    pub fn i32(&mut self) -> Result<i32, DecodeError> {
        Ok(i32::from_le_bytes(self.array()?))
    }

    /// Little endian.
    pub fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    /// IEEE 754 bits, little endian.
    pub fn f64(&mut self) -> Result<f64, DecodeError> {
        Ok(f64::from_bits(u64::from_le_bytes(self.array()?)))
    }

    /// A length-prefixed UTF-8 string.
    pub fn string(&mut self) -> Result<String, DecodeError> {
        let len = self.u32()? as usize;
        let bytes = self.take(len)?;
        self.charge(len)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| DecodeError::Invalid("a string that is not UTF-8"))
    }

    /// A length-prefixed list; each item's memory is charged before the list is allocated.
    pub fn list<T>(
        &mut self,
        mut item: impl FnMut(&mut Self) -> Result<T, DecodeError>,
    ) -> Result<Vec<T>, DecodeError> {
        let len = self.u32()? as usize;
        self.charge(len.saturating_mul(std::mem::size_of::<T>()))?;
        let mut items = Vec::with_capacity(len);
        for _ in 0..len {
            items.push(item(self)?);
        }
        Ok(items)
    }

    /// An optional value.
    pub fn option<T>(
        &mut self,
        item: impl FnOnce(&mut Self) -> Result<T, DecodeError>,
    ) -> Result<Option<T>, DecodeError> {
        match self.u8()? {
            0 => Ok(None),
            1 => item(self).map(Some),
            _ => Err(DecodeError::Invalid(
                "an option tag that is neither 0 nor 1",
            )),
        }
    }
}
