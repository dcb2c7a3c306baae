//! Protobuf canonical JSON for HTTP bodies (wire fact sheet §2.2).
//!
//! Decoding goes straight from bytes to the message; only if that fails is the body re-read as
//! a `serde_json::Value`, normalised as protobuf's JSON parser reads it (`null` members removed:
//! `null` = field not set; integral floats such as `7.0` or `1e3` become integers, which
//! integer fields accept) and decoded again, so the common path parses once. Integers written
//! as integers never pass through `f64`.

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
            if !normalise(&mut value) {
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
