//! Location URIs: `<scheme>://<storage name><path>?<k=v&...>` (§14).
//!
//! [`BlockUri`] both formats the URIs backends emit (params sorted by key, no
//! percent-encoding) and parses them back for delete and for the lookup path.
//!
//! Invariant: `BlockUri::parse(&uri.to_string()) == Ok(uri)` for every URI a backend builds.

use std::collections::BTreeMap;
use std::fmt;

use crate::StorageError;

/// A parsed location URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockUri {
    /// `file`, `hf3fs`, `mooncake` or `pace`.
    pub scheme: String,
    /// The storage's `global_unique_name` (the URI host).
    pub storage_name: String,
    /// Everything from the first `/` after the host up to `?` (starts with `/`).
    pub path: String,
    /// Query parameters, sorted by key.
    pub params: BTreeMap<String, String>,
}

fn invalid(uri: &str, reason: impl Into<String>) -> StorageError {
    StorageError::InvalidUri {
        uri: uri.to_string(),
        reason: reason.into(),
    }
}

impl BlockUri {
    /// Parses a location URI; anything malformed is `StorageError::InvalidUri`.
    pub fn parse(uri: &str) -> Result<Self, StorageError> {
        if let Some(bad) = uri
            .chars()
            .find(|c| c.is_control() || c.is_whitespace() || *c == '#')
        {
            return Err(invalid(uri, format!("contains the character {bad:?}")));
        }
        let (scheme, rest) = uri
            .split_once("://")
            .ok_or_else(|| invalid(uri, "no \"://\""))?;
        let scheme_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
        if scheme.is_empty() || !scheme.chars().all(scheme_char) {
            return Err(invalid(
                uri,
                format!("scheme {scheme:?} is not lower-case alphanumeric"),
            ));
        }
        let (location, query) = match rest.split_once('?') {
            Some((location, query)) => (location, Some(query)),
            None => (rest, None),
        };
        let path_start = location.find('/').ok_or_else(|| invalid(uri, "no path"))?;
        let (storage_name, path) = location.split_at(path_start);
        if storage_name.is_empty() {
            return Err(invalid(uri, "empty storage name"));
        }
        Ok(Self {
            scheme: scheme.to_string(),
            storage_name: storage_name.to_string(),
            path: path.to_string(),
            params: parse_params(uri, query)?,
        })
    }

    /// The value of parameter `name`, if present.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params.get(name).map(String::as_str)
    }

    /// Parameter `name` as a number: `Ok(None)` when absent, `InvalidUri` when not a number.
    pub fn param_u64(&self, name: &str) -> Result<Option<u64>, StorageError> {
        self.param(name)
            .map(|value| {
                value.parse().map_err(|_| {
                    invalid(
                        &self.to_string(),
                        format!("{name}={value:?} is not a number"),
                    )
                })
            })
            .transpose()
    }
}

fn parse_params(uri: &str, query: Option<&str>) -> Result<BTreeMap<String, String>, StorageError> {
    let mut params = BTreeMap::new();
    let Some(query) = query else {
        return Ok(params);
    };
    for pair in query.split('&') {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| invalid(uri, format!("parameter {pair:?} has no '='")))?;
        if key.is_empty() || key.contains('?') || value.contains('?') {
            return Err(invalid(uri, format!("malformed parameter {pair:?}")));
        }
        if params.insert(key.to_string(), value.to_string()).is_some() {
            return Err(invalid(uri, format!("parameter {key:?} repeated")));
        }
    }
    Ok(params)
}

impl fmt::Display for BlockUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}{}", self.scheme, self.storage_name, self.path)?;
        for (index, (key, value)) in self.params.iter().enumerate() {
            let separator = if index == 0 { '?' } else { '&' };
            write!(f, "{separator}{key}={value}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats_a_file_uri() {
        let text = "file://nfs_01/tmp/nfs/instance1/tp0/7b?blkid=0&size=1024";
        let uri = BlockUri::parse(text).expect("valid");
        assert_eq!(uri.scheme, "file");
        assert_eq!(uri.storage_name, "nfs_01");
        assert_eq!(uri.path, "/tmp/nfs/instance1/tp0/7b");
        assert_eq!(uri.param_u64("blkid").expect("number"), Some(0));
        assert_eq!(uri.param_u64("size").expect("number"), Some(1024));
        assert_eq!(uri.param_u64("offset").expect("absent"), None);
        assert_eq!(uri.to_string(), text);
    }

    #[test]
    fn params_are_emitted_sorted_and_mooncake_keys_keep_their_slashes() {
        let text = "mooncake://mc/?size=4096&key=i/tp0/7b";
        let uri = BlockUri::parse(text).expect("valid");
        assert_eq!(uri.path, "/");
        assert_eq!(uri.param("key"), Some("i/tp0/7b"));
        assert_eq!(uri.to_string(), "mooncake://mc/?key=i/tp0/7b&size=4096");
        let bare = BlockUri::parse("file://n/a").expect("no query");
        assert!(bare.params.is_empty());
        assert_eq!(bare.to_string(), "file://n/a");
    }

    #[test]
    fn malformed_uris_are_invalid_uri_errors() {
        let bad = [
            "",
            "nfs_01/tmp/x",
            "://n/x",
            "FILE://n/x",
            "file://",
            "file://n",
            "file:///tmp/x",
            "file://n/x?",
            "file://n/x?size",
            "file://n/x?=3",
            "file://n/x?size=1&size=2",
            "file://n/x?a=1?b=2",
            "file://n/x y",
            "file://n/x#frag",
        ];
        for text in bad {
            let err = BlockUri::parse(text).expect_err(text);
            assert!(
                matches!(err, StorageError::InvalidUri { ref uri, .. } if uri == text),
                "{err}"
            );
        }
        let uri = BlockUri::parse("file://n/x?size=big").expect("parses");
        assert!(matches!(
            uri.param_u64("size"),
            Err(StorageError::InvalidUri { .. })
        ));
    }
}
