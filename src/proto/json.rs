//! Protobuf canonical JSON for HTTP bodies (wire fact sheet §2.2).
//!
//! Decoding goes straight from bytes to the message; only if that fails is the body re-read as
//! a `serde_json::Value` with `null` members removed (`null` = field not set) and decoded again,
//! so the common path parses once. Integers never pass through `f64`.

use serde::{de::DeserializeOwned, Serialize};
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
            if !strip_nulls(&mut value) {
                return Err(first_error.into());
            }
            Ok(serde_json::from_value(value)?)
        }
    }
}

/// Prints a response message as compact JSON.
pub fn encode<T: Serialize>(message: &T) -> Result<Vec<u8>, JsonError> {
    Ok(serde_json::to_vec(message)?)
}

/// Removes every `null` object member, recursively; returns whether anything was removed.
fn strip_nulls(value: &mut Value) -> bool {
    match value {
        Value::Object(members) => {
            let before = members.len();
            members.retain(|_, member| !member.is_null());
            let mut changed = members.len() != before;
            for member in members.values_mut() {
                changed |= strip_nulls(member);
            }
            changed
        }
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |changed, item| strip_nulls(item) | changed),
        _ => false,
    }
}
