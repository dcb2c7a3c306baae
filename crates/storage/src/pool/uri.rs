//! Pool location URIs (§14, Tair MemPool form):
//! `pace://<storage>/<offset>?media_type=2&node_id=<node>&range_id=<incarnation>&size=<bytes>`.
//!
//! `offset` is the byte offset of the part in the node's region, `range_id` names the
//! node's incarnation (a block placed on an earlier incarnation never reads from a later
//! one), `media_type` 2 is DRAM (the trunk's numbering).

use crate::uri::BlockUri;
use crate::{StorageError, StorageKind};

/// `media_type` of DRAM pool memory.
pub const MEDIA_DRAM: u32 = 2;

/// One part on a pool node, as its URI says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolPartUri {
    /// The pool storage's name.
    pub storage_name: String,
    /// The node holding the part.
    pub node_id: String,
    /// The node's incarnation the part was placed on.
    pub range_id: u64,
    /// Byte offset in the node's region.
    pub offset: u64,
    /// Bytes of the part.
    pub size: u64,
}

impl PoolPartUri {
    /// Parses a `pace://` URI; anything else or malformed is `InvalidUri`.
    pub fn parse(text: &str) -> Result<Self, StorageError> {
        let uri = BlockUri::parse(text)?;
        let invalid = |reason: &str| StorageError::InvalidUri {
            uri: text.to_string(),
            reason: reason.to_string(),
        };
        if uri.scheme != StorageKind::TairMemPool.scheme() {
            return Err(invalid("not a pace:// location"));
        }
        let offset: u64 = uri.path[1..]
            .parse()
            .map_err(|_| invalid("the path is not a byte offset"))?;
        let number = |name: &str| uri.param_u64(name)?.ok_or_else(|| invalid(name));
        let size = number("size")?;
        let range_id = number("range_id")?;
        let node_id = uri.param("node_id").filter(|id| !id.is_empty());
        let node_id = node_id.ok_or_else(|| invalid("no node_id"))?.to_string();
        if size == 0 || offset.checked_add(size).is_none() {
            return Err(invalid("size is zero or the part ends past 2^64"));
        }
        Ok(PoolPartUri {
            storage_name: uri.storage_name,
            node_id,
            range_id,
            offset,
            size,
        })
    }

    /// Appends the URI to `out` (parameters in key order, as [`BlockUri`] prints them).
    pub fn write(&self, out: &mut String) {
        self.write_head(out);
        out.push_str(itoa::Buffer::new().format(self.offset));
        self.write_tail(out);
    }

    /// Appends what comes before the offset: `pace://<storage>/`.
    pub fn write_head(&self, out: &mut String) {
        out.push_str(StorageKind::TairMemPool.scheme());
        out.push_str("://");
        out.push_str(&self.storage_name);
        out.push('/');
    }

    /// Appends what comes after the offset: the parameters, the same for every part of
    /// one size on one node incarnation.
    pub fn write_tail(&self, out: &mut String) {
        let mut number = itoa::Buffer::new();
        out.push_str("?media_type=");
        out.push_str(number.format(MEDIA_DRAM));
        out.push_str("&node_id=");
        out.push_str(&self.node_id);
        out.push_str("&range_id=");
        out.push_str(number.format(self.range_id));
        out.push_str("&size=");
        out.push_str(number.format(self.size));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_other_schemes_and_bad_numbers() {
        let part = PoolPartUri {
            storage_name: "pool_01".into(),
            node_id: "10.0.0.1:7000".into(),
            range_id: 77,
            offset: 4096,
            size: 16384,
        };
        let mut text = String::new();
        part.write(&mut text);
        assert_eq!(
            text,
            "pace://pool_01/4096?media_type=2&node_id=10.0.0.1:7000&range_id=77&size=16384"
        );
        assert_eq!(
            BlockUri::parse(&text).unwrap().to_string(),
            text,
            "sorted params"
        );
        assert_eq!(PoolPartUri::parse(&text).unwrap(), part);
        for bad in [
            "file://pool_01/4096?node_id=a&range_id=1&size=1",
            "pace://pool_01/x?node_id=a&range_id=1&size=1",
            "pace://pool_01/1?node_id=a&range_id=1&size=0",
            "pace://pool_01/1?node_id=a&size=1",
            "pace://pool_01/1?range_id=1&size=1",
            "pace://pool_01/18446744073709551615?node_id=a&range_id=1&size=2",
        ] {
            assert!(
                matches!(
                    PoolPartUri::parse(bad),
                    Err(StorageError::InvalidUri { .. })
                ),
                "{bad}"
            );
        }
    }
}
