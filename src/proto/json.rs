//! Protobuf canonical JSON for HTTP bodies (wire fact sheet §2.2).
//!
//! Decoding goes straight from bytes to the message; only if that fails is the body re-read as
//! a `serde_json::Value`, normalised as protobuf's JSON parser reads it (`null` members removed:
//! `null` = field not set; integral floats such as `7.0` or `1e3` become integers, which
//! integer fields accept) and decoded again, so the common path parses once. Integers written
//! as integers never pass through `f64`.
//!
//! Enum fields read through [`OpenEnum`] (the build script points pbjson's generated code at
//! it): a name is looked up (an unknown name is the zero value, §2.2), a number is kept as
//! sent, named or not, as protobuf's parser does for proto3's open enums. So a JSON body
//! decodes to the very message the same request delivers over gRPC, and whether a number is
//! acceptable is decided in one place for both transports: where the handlers and the manager
//! validate that field (e.g. `{AddAccount: {role}}` or a `query_type` without a name →
//! INVALID_ARGUMENT; QT_UNSPECIFIED → INTERNAL_ERROR, as the reference answers it). This edge never judges an
//! enum number; a number outside `i32` is not a JSON value of the field's type (400).

use std::marker::PhantomData;

use serde::de::{self, DeserializeOwned, Deserializer, Unexpected, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Why a body could not be turned into a request message.
#[derive(Debug, thiserror::Error)]
pub enum JsonError {
    /// The body is not JSON, not UTF-8, or not an object of the message's shape.
    #[error("body is not a JSON object of the expected shape: {0}")]
    Malformed(#[from] serde_json::Error),
}

/// Parses a request message from a JSON body.
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, JsonError> {
    match serde_json::from_slice::<T>(body) {
        Ok(message) => Ok(message),
        Err(first_error) => {
            let Ok(mut value) = serde_json::from_slice::<Value>(body) else {
                return Err(first_error.into());
            };
            if !normalise(&mut value) {
                return Err(first_error.into());
            }
            Ok(serde_json::from_value(value)?)
        }
    }
}

/// An enum field's wire number read from JSON: a name as the enum `E` reads it (unknown →
/// zero), a number as is when it fits `i32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenEnum<E>(pub i32, PhantomData<E>);

impl<'de, E: Deserialize<'de> + Into<i32>> Deserialize<'de> for OpenEnum<E> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let number = deserializer.deserialize_any(OpenEnumVisitor::<E>(PhantomData))?;
        Ok(OpenEnum(number, PhantomData))
    }
}

struct OpenEnumVisitor<E>(PhantomData<E>);

impl<'de, E: Deserialize<'de> + Into<i32>> Visitor<'de> for OpenEnumVisitor<E> {
    type Value = i32;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("an enum value name or a 32-bit enum number")
    }

    fn visit_i64<Er: de::Error>(self, number: i64) -> Result<i32, Er> {
        i32::try_from(number).map_err(|_| Er::invalid_value(Unexpected::Signed(number), &self))
    }

    fn visit_u64<Er: de::Error>(self, number: u64) -> Result<i32, Er> {
        i32::try_from(number).map_err(|_| Er::invalid_value(Unexpected::Unsigned(number), &self))
    }

    fn visit_str<Er: de::Error>(self, name: &str) -> Result<i32, Er> {
        E::deserialize(de::value::StrDeserializer::<Er>::new(name)).map(Into::into)
    }
}

/// A response body as the HTTP edge prints it: messages through their pbjson `Serialize`
/// impls; a hot answer may print itself, byte-identical to that (and tested against it).
pub trait JsonBody {
    /// The compact JSON text.
    fn to_json(&self) -> Result<Vec<u8>, JsonError>;
}

impl<T: Serialize> JsonBody for T {
    fn to_json(&self) -> Result<Vec<u8>, JsonError> {
        encode(self)
    }
}

/// Prints a response message as compact JSON.
pub fn encode<T: Serialize>(message: &T) -> Result<Vec<u8>, JsonError> {
    Ok(serde_json::to_vec(message)?)
}

/// Removes every `null` object member and turns every integral float into an integer,
/// recursively; returns whether anything changed.
fn normalise(value: &mut Value) -> bool {
    match value {
        Value::Object(members) => {
            let before = members.len();
            members.retain(|_, member| !member.is_null());
            let mut changed = members.len() != before;
            for member in members.values_mut() {
                changed |= normalise(member);
            }
            changed
        }
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |changed, item| normalise(item) | changed),
        Value::Number(number) => match integral(number) {
            Some(integer) => {
                *value = Value::from(integer);
                true
            }
            None => false,
        },
        _ => false,
    }
}

/// The integer a float with no fractional part stands for (`None` for integers and for
/// floats with a fraction or out of the i64 range).
fn integral(number: &serde_json::Number) -> Option<i64> {
    let float = number.as_f64().filter(|_| number.is_f64())?;
    let in_range = float.fract() == 0.0 && float.abs() < 9.2e18;
    in_range.then_some(float as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{admin, meta};

    #[test]
    fn enum_numbers_are_kept_and_unknown_names_are_zero() {
        let decode_query = |body: &str| decode::<meta::GetCacheLocationRequest>(body.as_bytes());
        let query_type = |body: &str| decode_query(body).unwrap().query_type;
        assert_eq!(query_type(r#"{"query_type": 99}"#), 99);
        assert_eq!(query_type(r#"{"query_type": 2}"#), 2);
        assert_eq!(query_type(r#"{"query_type": 99.0}"#), 99);
        assert_eq!(query_type(r#"{"query_type": -7}"#), -7);
        assert_eq!(query_type(r#"{"query_type": "QT_PREFIX_MATCH"}"#), 2);
        assert_eq!(query_type(r#"{"query_type": "QT_NO_SUCH"}"#), 0);
        assert!(decode_query(r#"{"query_type": 2147483648}"#).is_err());
        assert!(decode_query(r#"{"query_type": 1.5}"#).is_err());
    }

    #[test]
    fn nested_enum_numbers_are_kept() {
        let body = br#"{"instance_group": {"cache_config": {"data_storage_strategy": 99,
            "reclaim_strategy": {"reclaim_policy": 42}},
            "quota": {"quota_config": [{"storage_type": 77}]}}}"#;
        let request: admin::CreateInstanceGroupRequest = decode(body).unwrap();
        let group = request.instance_group.unwrap();
        let cache = group.cache_config.unwrap();
        assert_eq!(cache.data_storage_strategy, 99);
        assert_eq!(cache.reclaim_strategy.unwrap().reclaim_policy, 42);
        assert_eq!(group.quota.unwrap().quota_config[0].storage_type, 77);
    }

    #[test]
    fn repeated_enum_numbers_are_kept() {
        let body = br#"{"item_results": ["OK", 263, "NODE_NOT_REGISTERED", "NO_SUCH"],
            "retry_after_ms": "0", "committed_snapshot_version": ""}"#;
        let response: meta::ReportEventResponse = decode(body).unwrap();
        let node_not_registered = meta::ErrorCode::NodeNotRegistered as i32;
        assert_eq!(response.item_results, [1, 263, node_not_registered, 0]);
        assert_eq!(response.retry_after_ms, 0);
    }

    #[test]
    fn report_event_payloads_round_trip() {
        let body = br#"{"instance_id": "i", "host_ip_port": "10.0.0.1:80",
            "storage_type": "ST_EVENT_REPORT_L2",
            "events": [{"event_type": "EVENT_BLOCK_ADD", "block_add": {"block_key": "18446744073709551615",
                "medium": "gpu", "specs": [{"name": "tp0", "uri": "event_report://h:1/gpu?k=1"}]}},
                {"event_type": 5, "heartbeat": {"system_status": {"load": "1"}}}]}"#;
        let request: meta::ReportEventRequest = decode(body).unwrap();
        assert_eq!(
            request.storage_type,
            meta::StorageType::StEventReportL2 as i32
        );
        assert_eq!(request.events.len(), 2);
        let again: meta::ReportEventRequest = decode(&encode(&request).unwrap()).unwrap();
        assert_eq!(again, request);
    }
}
