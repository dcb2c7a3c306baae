//! The HTTP hot path of GetCacheLocation: the answer's JSON written straight from the
//! lookup, URIs rendered into the output buffer, without building the proto message first.
//! The bytes equal pbjson's encoding of the `GetCacheLocationResponse` the gRPC path builds
//! from the same lookup (test: `json_equals_the_pbjson_encoding`).

use kvcm_manager::{CacheLookup, StorageType};

use super::reply::Reply;
use super::wire_admin::storage_type_number;
use crate::proto::json::{JsonBody, JsonError};
use crate::proto::meta;

/// A GetCacheLocation answer with its locations already in JSON.
#[derive(Debug, Default)]
pub struct LocationsJson {
    header: Option<meta::CommonResponseHeader>,
    /// The JSON array of the locations (empty = `[]`).
    locations: Vec<u8>,
}

impl LocationsJson {
    /// The answer of a lookup.
    pub fn of(lookup: &CacheLookup<'_>) -> LocationsJson {
        LocationsJson {
            header: None,
            locations: locations_json(lookup),
        }
    }
}

impl Reply for LocationsJson {
    fn set_header(&mut self, code: meta::ErrorCode, message: String, request_id: String) {
        let mut response = meta::GetCacheLocationResponse::default();
        response.set_header(code, message, request_id);
        self.header = response.header;
    }

    fn set_tracer_result(&mut self, tracer_result: String) {
        if let Some(header) = self.header.as_mut() {
            header.tracer_result = tracer_result;
        }
    }

    fn status(&self) -> Option<(i32, &str)> {
        let header = self.header.as_ref()?;
        Some((header.status.as_ref()?.code, &header.request_id))
    }
}

impl JsonBody for LocationsJson {
    fn to_json(&self) -> Result<Vec<u8>, JsonError> {
        let mut out = Vec::with_capacity(self.locations.len() + 256);
        out.push(b'{');
        if let Some(header) = &self.header {
            out.extend_from_slice(b"\"header\":");
            serde_json::to_writer(&mut out, header)?;
            out.push(b',');
        }
        out.extend_from_slice(b"\"locations\":");
        if self.locations.is_empty() {
            out.extend_from_slice(b"[]");
        } else {
            out.extend_from_slice(&self.locations);
        }
        out.push(b'}');
        Ok(out)
    }
}

/// The JSON array of a lookup's locations, as pbjson prints `Vec<meta::CacheLocation>`.
fn locations_json(lookup: &CacheLookup<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(lookup.len() * 160 + 2);
    let mut uri = String::new();
    out.push(b'[');
    for (i, location) in lookup.locations().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"type\":\"");
        out.extend_from_slice(type_name(location.storage_type()).as_bytes());
        out.extend_from_slice(b"\",\"spec_size\":");
        let spec_size = i32::try_from(location.spec_count()).unwrap_or(i32::MAX);
        out.extend_from_slice(itoa::Buffer::new().format(spec_size).as_bytes());
        out.extend_from_slice(b",\"location_specs\":[");
        for (j, part) in location.parts().enumerate() {
            if j > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"name\":");
            write_str(&mut out, &part.spec.name);
            out.extend_from_slice(b",\"uri\":");
            uri.clear();
            part.write_uri(&mut uri);
            write_str(&mut out, &uri);
            if let Some(checksum) = part.checksum {
                // pbjson prints a uint64 as a decimal string.
                out.extend_from_slice(b",\"checksum\":\"");
                out.extend_from_slice(itoa::Buffer::new().format(checksum).as_bytes());
                out.push(b'"');
            }
            out.push(b'}');
        }
        out.extend_from_slice(b"]}");
    }
    out.push(b']');
    out
}

/// The enum name pbjson prints for a storage type.
fn type_name(storage_type: StorageType) -> &'static str {
    meta::StorageType::try_from(storage_type_number(storage_type))
        .map_or("ST_UNSPECIFIED", |t| t.as_str_name())
}

/// A JSON string, escaped as serde_json (and so pbjson) escapes it.
fn write_str(out: &mut Vec<u8>, text: &str) {
    let plain = text.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\');
    if plain {
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
    } else if serde_json::to_writer(&mut *out, text).is_err() {
        // Writing into a Vec cannot fail; keep the output valid JSON regardless.
        out.extend_from_slice(b"\"\"");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use kvcm_manager::mask::BlockMask;
    use kvcm_manager::query::QueryKind;
    use kvcm_manager::registration::{ModelDeployment, SpecGroup};
    use kvcm_manager::{InstanceInfo, Manager};
    use kvcm_storage::BlockSpec;

    use super::*;
    use crate::config::ServerConfig;
    use crate::service::convert::view_to_wire;

    /// A manager whose instance has names that need JSON escaping, with SERVING, DELETING,
    /// spec-group and absent keys.
    fn manager(dir: &std::path::Path) -> Arc<Manager> {
        let config = ServerConfig {
            data_dir: dir.join("da\"ta\\é"),
            ..ServerConfig::default()
        };
        let manager = crate::server::embedded_manager(&config).expect("manager");
        let spec = |name: &str| BlockSpec {
            name: name.into(),
            size: 4096,
        };
        manager
            .register_instance(InstanceInfo {
                quota_group_name: String::new(),
                instance_group_name: "default".into(),
                instance_id: "i\"d\\é".into(),
                block_size: 4,
                specs: vec![spec("tp\"0"), spec("tp1"), spec("tp2")],
                model: ModelDeployment {
                    model_name: "m".into(),
                    dtype: "fp8".into(),
                    ..Default::default()
                },
                spec_groups: vec![SpecGroup {
                    name: "g".into(),
                    spec_names: vec!["tp1".into()],
                }],
                default_query: Default::default(),
            })
            .expect("register");
        let instance = manager.instance("i\"d\\é").expect("registered");
        let all = manager
            .start_write(&instance, (1..=6).collect(), &[], 60)
            .expect("start");
        manager
            .finish_write(&instance, &all.session_id, &BlockMask::Offset(4))
            .expect("finish 4 of 6");
        let grouped = manager
            .start_write(&instance, vec![10, 11], &["g".into(), "g".into()], 60)
            .expect("start grouped");
        // With checksums, one of the largest and one of 0 (both printed as pbjson does).
        let checksums = [vec![u64::MAX], vec![0]];
        manager
            .finish_write_with_checksums(
                &instance,
                &grouped.session_id,
                &BlockMask::Offset(2),
                &checksums,
            )
            .expect("finish grouped");
        manager
    }

    #[test]
    fn json_equals_the_pbjson_encoding() {
        let dir = tempfile::tempdir().expect("tempdir");
        let manager = manager(dir.path());
        let instance = manager.instance("i\"d\\é").expect("registered");
        let keys: Vec<i64> = vec![1, 2, 3, 4, 5, 6, 10, 11, 99];
        let kinds = [
            QueryKind::BatchGet,
            QueryKind::PrefixMatch,
            QueryKind::SlidingWindow { sw_size: 2 },
        ];
        let filters: [Vec<String>; 3] = [vec![], vec!["tp1".into()], vec!["none".into()]];
        let mut compared = 0;
        for kind in kinds {
            for filter in &filters {
                for mask in [BlockMask::default(), BlockMask::Offset(2)] {
                    let lookup = manager
                        .lookup_cache_locations(&instance, kind, &keys, &mask, filter)
                        .expect("lookup");
                    let mut fast = LocationsJson::of(&lookup);
                    let mut slow = meta::GetCacheLocationResponse {
                        header: None,
                        locations: lookup.locations().map(|v| view_to_wire(&v)).collect(),
                    };
                    fast.set_header(meta::ErrorCode::Ok, "m\"sg\n".into(), "t_1".into());
                    slow.set_header(meta::ErrorCode::Ok, "m\"sg\n".into(), "t_1".into());
                    let expected = serde_json::to_vec(&slow).expect("pbjson");
                    assert_eq!(
                        String::from_utf8(fast.to_json().expect("fast")),
                        String::from_utf8(expected),
                        "{kind:?} {filter:?} {mask:?}"
                    );
                    compared += 1;
                }
            }
        }
        assert_eq!(compared, 18);
    }

    #[test]
    fn a_failed_call_prints_as_an_empty_answer() {
        let mut fast = LocationsJson::default();
        let mut slow = meta::GetCacheLocationResponse::default();
        assert_eq!(fast.to_json().unwrap(), serde_json::to_vec(&slow).unwrap());
        fast.set_header(meta::ErrorCode::InternalError, "x".into(), String::new());
        slow.set_header(meta::ErrorCode::InternalError, "x".into(), String::new());
        fast.set_tracer_result("{}".into());
        slow.set_tracer_result("{}".into());
        assert_eq!(fast.to_json().unwrap(), serde_json::to_vec(&slow).unwrap());
    }
}
