//! Where one key space lives in Redis, and how block keys and cursors map to Redis bytes.
//!
//! A namespace `<ns>` (an instance id) owns two Redis keys under one hash tag:
//! - `kvcm:{<ns>}:v`, a HASH: field = the block key as an 8-byte *field*, value = the
//!   encoded entry;
//! - `kvcm:{<ns>}:k`, a ZSET: the same fields, every score 0, so members sort by bytes.
//!
//! A field is the key's two's-complement bits with the sign bit flipped, big-endian: byte
//! order equals numeric order (`i64::MIN` → `00..00`, `-1` → `7f ff..`, `0` → `80 00..`).
//! Both Redis keys share the hash tag `{<ns>}`, so on a cluster they sit in one slot and a
//! Lua script may touch both. Invariant (kept by the write script): the hash's fields and the
//! zset's members are the same set.
//!
//! A scan cursor is the field (as a `u64`) to start from, inclusive: `ScanCursor(0)` is the
//! smallest field, so `ScanCursor::START` scans from `i64::MIN`.

use crate::{BlockKey, IndexError, ScanCursor};

/// Longest namespace accepted.
const MAX_NAMESPACE_LEN: usize = 200;

/// The Redis keys of one namespace.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The hash tag's content (the namespace).
    pub tag: String,
    /// The HASH key → value.
    pub values: String,
    /// The ZSET of keys, for ordered scans.
    pub order: String,
    /// The fencing token of the newest leader that wrote.
    pub fence: String,
}

impl Layout {
    /// The layout of `namespace`: 1 to 200 bytes of printable ASCII without `{`, `}` (which
    /// would change the hash tag) or spaces.
    pub fn new(namespace: &str) -> Result<Layout, IndexError> {
        let printable = namespace
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}');
        if namespace.is_empty() || namespace.len() > MAX_NAMESPACE_LEN || !printable {
            return Err(IndexError::InvalidArgument(format!(
                "redis namespace {namespace:?}: must be 1..={MAX_NAMESPACE_LEN} printable \
                 ASCII bytes without '{{', '}}' or spaces"
            )));
        }
        Ok(Layout {
            tag: namespace.to_owned(),
            values: format!("kvcm:{{{namespace}}}:v"),
            order: format!("kvcm:{{{namespace}}}:k"),
            fence: format!("kvcm:{{{namespace}}}:fence"),
        })
    }
}

/// The 8-byte field of `key`.
pub fn field(key: BlockKey) -> [u8; 8] {
    position(key).to_be_bytes()
}

/// The key of a field read from Redis; an error when it is not 8 bytes.
pub fn key_of(field: &[u8]) -> Result<BlockKey, IndexError> {
    let bytes: [u8; 8] = field.try_into().map_err(|_| {
        IndexError::Backend(format!(
            "corrupt redis index: a key field of {} bytes (expected 8)",
            field.len()
        ))
    })?;
    Ok((u64::from_be_bytes(bytes) ^ SIGN) as i64)
}

const SIGN: u64 = 1 << 63;

/// The key's place in the order of fields, as a number.
pub fn position(key: BlockKey) -> u64 {
    key as u64 ^ SIGN
}

/// `ZRANGEBYLEX` lower bound of a page starting at `cursor` (inclusive).
pub fn lex_start(cursor: ScanCursor) -> Vec<u8> {
    let mut bound = Vec::with_capacity(9);
    bound.push(b'[');
    bound.extend_from_slice(&cursor.0.to_be_bytes());
    bound
}

/// The cursor after a page whose last key is `last`; `None` when `last` is the largest key.
pub fn cursor_after(last: BlockKey) -> Option<ScanCursor> {
    position(last).checked_add(1).map(ScanCursor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_order_is_key_order() {
        let keys = [i64::MIN, -5, -1, 0, 1, 7, i64::MAX];
        for pair in keys.windows(2) {
            assert!(field(pair[0]) < field(pair[1]), "{pair:?}");
        }
        for key in keys {
            assert_eq!(key_of(&field(key)).expect("8 bytes"), key);
        }
        assert_eq!(field(i64::MIN), [0; 8]);
        assert_eq!(cursor_after(i64::MAX), None);
        assert_eq!(cursor_after(i64::MIN), Some(ScanCursor(1)));
    }

    #[test]
    fn short_fields_and_bad_namespaces_are_refused() {
        assert!(matches!(key_of(b"abc"), Err(IndexError::Backend(_))));
        for bad in ["", "a{b", "a}b", "a b", "é"] {
            assert!(Layout::new(bad).is_err(), "{bad:?}");
        }
        let layout = Layout::new("inst-1").expect("valid");
        assert_eq!(layout.values, "kvcm:{inst-1}:v");
        assert_eq!(layout.order, "kvcm:{inst-1}:k");
    }
}
