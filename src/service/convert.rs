//! Wire ↔ domain conversions of the meta service's request fields, with the validation
//! that belongs to them (every failure names the API and field).

use prost::Message;

use kvcm_manager::mask::BlockMask;
use kvcm_manager::query::QueryKind;
use kvcm_manager::{
    BlockLocation, CacheMeta, Instance, LocationView, ManagerError, ManagerResult, TrimStrategy,
};

use super::wire_admin::storage_type_number;
use crate::proto::meta;

fn invalid(field: &'static str, detail: impl std::fmt::Display) -> ManagerError {
    ManagerError::invalid_because(field, detail.to_string())
}

/// The wire form of a location handed out by `instance`.
pub fn location_to_wire(instance: &Instance, location: BlockLocation) -> meta::CacheLocation {
    let specs = instance.specs();
    let parts = location.parts.into_iter().map(|part| meta::LocationSpec {
        name: specs
            .get(usize::from(part.spec))
            .map_or_else(String::new, |s| s.name.clone()),
        uri: part.uri,
        checksum: None,
    });
    cache_location(location.storage_type, location.spec_count, parts)
}

/// The wire form of a location answered by a lookup (URIs rendered here).
pub fn view_to_wire(view: &LocationView<'_>) -> meta::CacheLocation {
    let parts = view.parts().map(|part| {
        let mut uri = String::new();
        part.write_uri(&mut uri);
        meta::LocationSpec {
            name: part.spec.name.clone(),
            uri,
            checksum: part.checksum,
        }
    });
    cache_location(view.storage_type(), view.spec_count(), parts)
}

/// A wire location of these parts.
fn cache_location(
    storage_type: kvcm_manager::StorageType,
    spec_count: usize,
    parts: impl Iterator<Item = meta::LocationSpec>,
) -> meta::CacheLocation {
    meta::CacheLocation {
        r#type: storage_type_number(storage_type),
        spec_size: i32::try_from(spec_count).unwrap_or(i32::MAX),
        location_specs: parts.collect(),
    }
}

/// GetCacheMeta's location and status JSON for one key (`{"status":"CLS_NOT_FOUND"}` and an
/// empty location when absent).
pub fn cache_meta_to_wire(
    instance: &Instance,
    meta_entry: Option<CacheMeta>,
) -> (meta::CacheLocation, String) {
    let Some(found) = meta_entry else {
        let absent = r#"{"status":"CLS_NOT_FOUND"}"#.to_string();
        return (meta::CacheLocation::default(), absent);
    };
    let status = match found.state {
        kvcm_manager::LocationState::Writing => "CLS_WRITING",
        kvcm_manager::LocationState::Serving => "CLS_SERVING",
        kvcm_manager::LocationState::Deleting => "CLS_DELETING",
    };
    let json = serde_json::json!({"id": found.id.to_string(), "status": status}).to_string();
    (location_to_wire(instance, found.location), json)
}

/// The writer's checksums in FinishWriteCache's `locations` (kvcm extension; the reference
/// ignores the field): empty when no part carries one (the reference's clients), else one
/// list per location, each empty or one checksum per part. A location with checksums on
/// some parts only is invalid.
pub fn checksums_from_wire(locations: &[meta::CacheLocation]) -> ManagerResult<Vec<Vec<u64>>> {
    let carries = |l: &meta::CacheLocation| l.location_specs.iter().any(|s| s.checksum.is_some());
    if !locations.iter().any(carries) {
        return Ok(Vec::new());
    }
    locations
        .iter()
        .enumerate()
        .map(|(i, location)| {
            let sums: Vec<u64> = location
                .location_specs
                .iter()
                .filter_map(|s| s.checksum)
                .collect();
            if !sums.is_empty() && sums.len() != location.location_specs.len() {
                return Err(invalid(
                    "locations",
                    format!("location {i} has checksums on some parts only"),
                ));
            }
            Ok(sums)
        })
        .collect()
}

/// A wire mask (absent = masks nothing); a negative offset is invalid.
pub fn mask_from_wire(
    mask: Option<&meta::BlockMask>,
    field: &'static str,
) -> ManagerResult<BlockMask> {
    use meta::block_mask::Info;
    match mask.and_then(|m| m.info.as_ref()) {
        None => Ok(BlockMask::default()),
        Some(Info::BoolMasks(values)) => Ok(BlockMask::Bools(values.values.clone())),
        Some(Info::Offset(offset)) => usize::try_from(*offset)
            .map(BlockMask::Offset)
            .map_err(|_| invalid(field, format!("offset {offset} is negative"))),
    }
}

/// The wire form of a mask.
pub fn mask_to_wire(mask: BlockMask) -> meta::BlockMask {
    use meta::block_mask::Info;
    let info = match mask {
        BlockMask::Offset(n) => Info::Offset(i32::try_from(n).unwrap_or(i32::MAX)),
        BlockMask::Bools(values) => Info::BoolMasks(meta::BoolMasksType { values }),
    };
    meta::BlockMask { info: Some(info) }
}

/// The query kind of a GetCacheLocation request.
pub fn query_kind(query_type: i32, sw_size: i32) -> ManagerResult<QueryKind> {
    match meta::QueryType::try_from(query_type) {
        Ok(meta::QueryType::QtBatchGet) => Ok(QueryKind::BatchGet),
        Ok(meta::QueryType::QtPrefixMatch) => Ok(QueryKind::PrefixMatch),
        Ok(meta::QueryType::QtReverseRollSwMatch) => usize::try_from(sw_size)
            .map(|sw_size| QueryKind::SlidingWindow { sw_size })
            .map_err(|_| invalid("sw_size", format!("{sw_size} is negative"))),
        Ok(meta::QueryType::QtPrefixMatchWithMamba) => Err(invalid(
            "query_type",
            "QT_PREFIX_MATCH_WITH_MAMBA (hybrid-attention state matching) is not supported by kvcm",
        )),
        // QT_UNSPECIFIED is a query type the reference refuses as a manager failure.
        Ok(meta::QueryType::QtUnspecified) => Err(ManagerError::Refused(
            "query_type QT_UNSPECIFIED is not a query".into(),
        )),
        Err(_) => Err(invalid(
            "query_type",
            format!("{query_type} is not a QueryType"),
        )),
    }
}

/// The trim strategy of a TrimCache request.
pub fn trim_strategy(strategy: i32) -> ManagerResult<TrimStrategy> {
    match meta::TrimStrategy::try_from(strategy) {
        Ok(meta::TrimStrategy::TsRemoveAllCache) => Ok(TrimStrategy::RemoveAllCache),
        Ok(meta::TrimStrategy::TsRemoveAllMeta) => Ok(TrimStrategy::RemoveAllMeta),
        Ok(meta::TrimStrategy::TsTimestamp) => Ok(TrimStrategy::Timestamp),
        _ => Err(invalid(
            "strategy",
            format!("{strategy} is not a trim strategy"),
        )),
    }
}

/// Re-reads a message as another package's message with the same field numbers (the admin
/// and meta packages share several message shapes).
pub fn transcode<From: Message, To: Message + Default>(message: &From) -> To {
    To::decode(message.encode_to_vec().as_slice()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::admin;

    #[test]
    fn masks_round_trip_and_reject_negative_offsets() {
        let wire = mask_to_wire(BlockMask::Offset(3));
        assert_eq!(
            mask_from_wire(Some(&wire), "m").unwrap(),
            BlockMask::Offset(3)
        );
        let wire = mask_to_wire(BlockMask::Bools(vec![true, false]));
        assert_eq!(
            mask_from_wire(Some(&wire), "m").unwrap(),
            BlockMask::Bools(vec![true, false])
        );
        assert_eq!(mask_from_wire(None, "m").unwrap(), BlockMask::default());
        let negative = meta::BlockMask {
            info: Some(meta::block_mask::Info::Offset(-1)),
        };
        assert!(mask_from_wire(Some(&negative), "m").is_err());
    }

    #[test]
    fn query_kinds() {
        assert_eq!(query_kind(2, 0).unwrap(), QueryKind::PrefixMatch);
        assert_eq!(
            query_kind(3, 4).unwrap(),
            QueryKind::SlidingWindow { sw_size: 4 }
        );
        assert!(query_kind(3, -1).is_err());
        assert!(matches!(query_kind(0, 0), Err(ManagerError::Refused(_))));
        assert!(matches!(
            query_kind(9, 0),
            Err(ManagerError::InvalidField {
                field: "query_type",
                ..
            })
        ));
    }

    #[test]
    fn transcode_keeps_shared_fields() {
        let info = meta::InstanceInfo {
            instance_id: "i".into(),
            block_size: 16,
            ..Default::default()
        };
        let admin_info: admin::InstanceInfo = transcode(&info);
        assert_eq!(
            (admin_info.instance_id.as_str(), admin_info.block_size),
            ("i", 16)
        );
    }
}
