//! How an index value becomes Redis bytes and back.
//!
//! Invariant: `decode` never panics; bytes it cannot read are an error message, which the
//! index reports as `IndexError::Backend` naming the key (someone wrote into the hash, or a
//! newer binary stored a format this one does not know).

/// Encodes values of type `V` for the Redis index.
pub trait ValueCodec<V>: Send + Sync {
    /// The bytes stored for `value`.
    fn encode(&self, value: &V) -> Vec<u8>;
    /// The value stored as `bytes`; an error message when they are not a valid encoding.
    fn decode(&self, bytes: &[u8]) -> Result<V, String>;
}

/// A shared or boxed codec (`Arc<dyn ValueCodec<V>>`, `Box<dyn ValueCodec<V>>`) is a codec.
impl<V, C: ValueCodec<V> + ?Sized> ValueCodec<V> for std::sync::Arc<C> {
    fn encode(&self, value: &V) -> Vec<u8> {
        (**self).encode(value)
    }

    fn decode(&self, bytes: &[u8]) -> Result<V, String> {
        (**self).decode(bytes)
    }
}

impl<V, C: ValueCodec<V> + ?Sized> ValueCodec<V> for Box<C> {
    fn encode(&self, value: &V) -> Vec<u8> {
        (**self).encode(value)
    }

    fn decode(&self, bytes: &[u8]) -> Result<V, String> {
        (**self).decode(bytes)
    }
}

/// `u64` as 8 little-endian bytes (the conformance suite's values).
#[derive(Debug, Clone, Copy, Default)]
pub struct U64Codec;

impl ValueCodec<u64> for U64Codec {
    fn encode(&self, value: &u64) -> Vec<u8> {
        value.to_le_bytes().to_vec()
    }

    fn decode(&self, bytes: &[u8]) -> Result<u64, String> {
        let bytes: [u8; 8] = bytes
            .try_into()
            .map_err(|_| format!("a u64 value is 8 bytes, found {}", bytes.len()))?;
        Ok(u64::from_le_bytes(bytes))
    }
}

/// Bytes as they are (for callers that encode values themselves, with context the codec
/// cannot hold).
#[derive(Debug, Clone, Copy, Default)]
pub struct BytesCodec;

impl ValueCodec<Vec<u8>> for BytesCodec {
    fn encode(&self, value: &Vec<u8>) -> Vec<u8> {
        value.clone()
    }

    fn decode(&self, bytes: &[u8]) -> Result<Vec<u8>, String> {
        Ok(bytes.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn u64_round_trips_and_refuses_other_lengths() {
        for value in [0, 1, u64::MAX] {
            assert_eq!(U64Codec.decode(&U64Codec.encode(&value)), Ok(value));
        }
        assert!(U64Codec.decode(b"garbage").is_err());
        let boxed: Box<dyn ValueCodec<u64>> = Box::new(U64Codec);
        let shared: std::sync::Arc<dyn ValueCodec<u64>> = std::sync::Arc::new(U64Codec);
        assert_eq!(boxed.decode(&shared.encode(&7)), Ok(7));
    }
}
