//! The `mooncake` backend: URIs only (`mooncake://<name>/?key=<object name>&size=<bytes>`);
//! the Mooncake store itself is driven by the clients, nothing is allocated or freed here.

use super::place_by_name;
use crate::names::object_name;
use crate::packing::check_request;
use crate::uri::BlockUri;
use crate::{
    AllocatedSpec, AllocationRequest, BlockKey, BlockSpec, DataStorage, PartRef, StorageConfig,
    StorageError, StorageKind, UriTemplate,
};

/// A Mooncake store as seen by the manager: a namespace of object keys.
#[derive(Debug)]
pub(crate) struct MooncakeStorage {
    config: StorageConfig,
}

impl MooncakeStorage {
    /// The backend of a validated `Mooncake` config.
    pub(crate) fn new(config: StorageConfig) -> Self {
        Self { config }
    }

    /// `mooncake://<name>/?key=<object name>&size=<bytes>` (the text `BlockUri` prints:
    /// parameters sorted by name).
    fn uri(&self, instance_id: &str, spec: &BlockSpec, key: BlockKey) -> String {
        let mut uri = String::new();
        self.push_uri(&mut uri, instance_id, spec, key);
        uri
    }

    /// Appends the URI of [`MooncakeStorage::uri`] to `out`.
    fn push_uri(&self, out: &mut String, instance_id: &str, spec: &BlockSpec, key: BlockKey) {
        out.push_str(StorageKind::Mooncake.scheme());
        out.push_str("://");
        out.push_str(&self.config.global_unique_name);
        out.push_str("/?key=");
        out.push_str(&object_name(instance_id, &spec.name, key));
        out.push_str("&size=");
        out.push_str(itoa::Buffer::new().format(spec.size));
    }

    fn check_uri(&self, text: &str) -> Result<(), StorageError> {
        let uri = BlockUri::parse(text)?;
        let ours = uri.scheme == StorageKind::Mooncake.scheme()
            && uri.storage_name == self.config.global_unique_name
            && uri.path == "/"
            && uri.param("key").is_some_and(|key| !key.is_empty());
        if !ours {
            return Err(StorageError::InvalidUri {
                uri: text.to_string(),
                reason: "not a mooncake location of this storage".to_string(),
            });
        }
        Ok(())
    }
}

impl DataStorage for MooncakeStorage {
    fn config(&self) -> &StorageConfig {
        &self.config
    }

    fn kind(&self) -> StorageKind {
        StorageKind::Mooncake
    }

    fn allocate(
        &self,
        request: &AllocationRequest<'_>,
    ) -> Result<Vec<Vec<AllocatedSpec>>, StorageError> {
        check_request(request)?;
        Ok(place_by_name(request, |spec, key| {
            self.uri(request.instance_id, spec, key)
        }))
    }

    fn write_uri(&self, part: &PartRef<'_>, out: &mut String) -> bool {
        self.push_uri(out, part.instance_id, part.spec, part.key);
        true
    }

    fn uri_template(&self, part: &PartRef<'_>) -> Option<UriTemplate> {
        let mut head = String::new();
        self.push_uri(&mut head, part.instance_id, part.spec, part.key);
        Some(UriTemplate {
            head,
            block: None,
            tail: String::new(),
        })
    }

    /// Checks the URIs; the objects live in Mooncake and are removed by its clients.
    fn delete(&self, uris: &[String]) -> Result<(), StorageError> {
        uris.iter().try_for_each(|uri| self.check_uri(uri))
    }

    /// Nothing to probe from here: Mooncake is reached by the clients only.
    fn check_health(&self) -> Result<(), StorageError> {
        Ok(())
    }
}
