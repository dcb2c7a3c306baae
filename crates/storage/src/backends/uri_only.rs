//! The backends that place locations by name and hold no bytes of their own, so they only
//! render and check URIs; nothing is allocated, created or freed here:
//! - `mooncake` — `mooncake://<name>/?key=<object name>&size=<bytes>`; the Mooncake store is
//!   driven by the clients;
//! - `dummy` (upstream trunk's `ST_DUMMY`) —
//!   `dummy://<name><root path>/<object name>?size=<bytes>`, for control-plane tests and
//!   load runs without a data tier; nothing is created under the root path.
//!
//! A delete only checks that the URIs are this storage's.

use crate::names::object_name;
use crate::packing::check_request;
use crate::uri::BlockUri;
use crate::{
    AllocatedSpec, AllocationRequest, BlockKey, BlockSpec, DataStorage, PartAddress, PartRef,
    StorageConfig, StorageError, StorageKind, StorageSpec, UriTemplate,
};

/// A storage whose locations are URIs only.
#[derive(Debug)]
pub(crate) struct UriOnlyStorage {
    config: StorageConfig,
    /// `Dummy`: the root path without trailing slashes (`/` alone prints as nothing);
    /// `Mooncake`: unused.
    root: String,
}

impl UriOnlyStorage {
    /// The backend of a validated `Mooncake` or `Dummy` config.
    pub(crate) fn new(config: StorageConfig) -> Self {
        let root = match &config.spec {
            StorageSpec::Dummy { root_path, .. } => root_path.trim_end_matches('/').to_string(),
            _ => String::new(),
        };
        Self { config, root }
    }

    /// Appends the URI of a part to `out` (the text `BlockUri` prints: parameters sorted by
    /// name).
    fn push_uri(&self, out: &mut String, instance_id: &str, spec: &BlockSpec, key: BlockKey) {
        let kind = self.kind();
        out.push_str(kind.scheme());
        out.push_str("://");
        out.push_str(&self.config.global_unique_name);
        let object = object_name(instance_id, &spec.name, key);
        if kind == StorageKind::Mooncake {
            out.push_str("/?key=");
            out.push_str(&object);
            out.push_str("&size=");
        } else {
            out.push_str(&self.root);
            out.push('/');
            out.push_str(&object);
            out.push_str("?size=");
        }
        out.push_str(itoa::Buffer::new().format(spec.size));
    }

    fn check_uri(&self, text: &str) -> Result<(), StorageError> {
        let uri = BlockUri::parse(text)?;
        let kind = self.kind();
        let placed = if kind == StorageKind::Mooncake {
            uri.path == "/" && uri.param("key").is_some_and(|key| !key.is_empty())
        } else {
            uri.path.starts_with(&format!("{}/", self.root))
        };
        let ours = uri.scheme == kind.scheme()
            && uri.storage_name == self.config.global_unique_name
            && placed;
        if !ours {
            return Err(StorageError::InvalidUri {
                uri: text.to_string(),
                reason: format!("not a {} location of this storage", kind.type_name()),
            });
        }
        Ok(())
    }
}

impl DataStorage for UriOnlyStorage {
    fn config(&self) -> &StorageConfig {
        &self.config
    }

    fn kind(&self) -> StorageKind {
        self.config.spec.kind()
    }

    fn allocate(
        &self,
        request: &AllocationRequest<'_>,
    ) -> Result<Vec<Vec<AllocatedSpec>>, StorageError> {
        check_request(request)?;
        let placed = request.blocks.iter().map(|block| {
            let specs = block
                .spec_indexes
                .iter()
                .map(|&index| &request.specs[index]);
            specs
                .map(|spec| {
                    let mut uri = String::new();
                    self.push_uri(&mut uri, request.instance_id, spec, block.key);
                    AllocatedSpec {
                        name: spec.name.clone(),
                        uri,
                        address: PartAddress::default(),
                    }
                })
                .collect()
        });
        Ok(placed.collect())
    }

    fn write_uri(&self, part: &PartRef<'_>, out: &mut String) -> bool {
        self.push_uri(out, part.instance_id, part.spec, part.key);
        true
    }

    fn uri_template(&self, part: &PartRef<'_>) -> Option<UriTemplate> {
        let mut uri = String::new();
        self.push_uri(&mut uri, part.instance_id, part.spec, part.key);
        Some(UriTemplate::whole(uri))
    }

    /// Checks the URIs; there are no bytes to free here.
    fn delete(&self, uris: &[String]) -> Result<(), StorageError> {
        uris.iter().try_for_each(|uri| self.check_uri(uri))
    }

    /// Nothing to probe from here (Mooncake is reached by the clients only).
    fn check_health(&self) -> Result<(), StorageError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BlockToAllocate;

    fn storage(root_path: &str) -> UriOnlyStorage {
        UriOnlyStorage::new(StorageConfig {
            global_unique_name: "dm".into(),
            spec: StorageSpec::Dummy {
                root_path: root_path.into(),
                key_count_per_file: 4,
            },
            check_storage_available_when_open: true,
        })
    }

    #[test]
    fn parts_get_dummy_uris_that_render_again_and_delete_checks_them() {
        let dummy = storage("/data/dummy/");
        let specs = [BlockSpec {
            name: "tp0".into(),
            size: 64,
        }];
        let blocks = [BlockToAllocate {
            key: 123,
            spec_indexes: vec![0],
        }];
        let request = AllocationRequest {
            instance_id: "inst",
            specs: &specs,
            blocks: &blocks,
        };
        let placed = dummy.allocate(&request).expect("placed");
        let uri = &placed[0][0].uri;
        assert_eq!(uri, "dummy://dm/data/dummy/inst/tp0/7b?size=64");
        let part = PartRef {
            instance_id: "inst",
            key: 123,
            spec: &specs[0],
            address: PartAddress::default(),
        };
        let mut again = String::new();
        assert!(dummy.write_uri(&part, &mut again));
        assert_eq!(&again, uri);
        assert_eq!(dummy.uri_template(&part).map(|t| t.head), Some(again));
        dummy.delete(std::slice::from_ref(uri)).expect("ours");
        for foreign in [
            "dummy://other/data/dummy/inst/tp0/7b?size=64",
            "file://dm/data/dummy/inst/tp0/7b?size=64",
            "dummy://dm/elsewhere/inst/tp0/7b?size=64",
        ] {
            let refused = dummy.delete(&[foreign.to_string()]);
            assert!(
                matches!(refused, Err(StorageError::InvalidUri { .. })),
                "{foreign}"
            );
        }
        assert_eq!(
            storage("/").allocate(&request).unwrap()[0][0].uri,
            "dummy://dm/inst/tp0/7b?size=64"
        );
    }
}
