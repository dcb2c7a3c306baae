//! Secrets out of logged bodies: what an access-log line must never show.
//!
//! In a body's JSON, the value of a member whose name names a secret (a password, token,
//! secret, access key, API key, credential or authorization — compared without case and
//! underscores, so `auth_token`, `old_token`, `tokens` and `password` all match) becomes
//! `"<redacted>"`; `token_ids`, the prompt itself, becomes `"<redacted: N token ids>"`; a
//! URI's password (`scheme://user:password@host`) becomes `***` wherever a string holds one.

use serde_json::Value;

/// What a secret value is replaced with.
pub const REDACTED: &str = "<redacted>";

/// Name endings (lower case, no underscores) that mark a member as a secret.
const SECRET_ENDINGS: [&str; 10] = [
    "password",
    "passwd",
    "token",
    "tokens",
    "secret",
    "accesskey",
    "secretkey",
    "apikey",
    "credentials",
    "authorization",
];

/// Redacts `value` in place.
pub fn redact(value: &mut Value) {
    match value {
        Value::Object(members) => {
            for (name, member) in members.iter_mut() {
                redact_member(name, member);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact),
        Value::String(text) => {
            if let Some(masked) = mask_uri_password(text) {
                *text = masked;
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

fn redact_member(name: &str, member: &mut Value) {
    let normalised: String = name
        .chars()
        .filter(|&c| c != '_')
        .map(|c| c.to_ascii_lowercase())
        .collect();
    if normalised == "tokenids" {
        let count = member.as_array().map_or(0, Vec::len);
        *member = Value::String(format!("<redacted: {count} token ids>"));
    } else if SECRET_ENDINGS.iter().any(|end| normalised.ends_with(end)) {
        *member = Value::String(REDACTED.into());
    } else {
        redact(member);
    }
}

/// `text` with the password of the URI it holds replaced by `***`, when it holds one.
fn mask_uri_password(text: &str) -> Option<String> {
    let authority_start = text.find("://")? + 3;
    let rest = &text[authority_start..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let at = rest[..authority_end].rfind('@')?;
    let colon = rest[..at].find(':')?;
    let password = authority_start + colon + 1..authority_start + at;
    Some(format!(
        "{}***{}",
        &text[..password.start],
        &text[password.end..]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secrets_token_ids_and_uri_passwords_are_redacted_the_rest_is_kept() {
        let mut body = json!({
            "trace_id": "t1",
            "password": "hunter2",
            "tokens": ["a", "b"],
            "old_token": "x",
            "newToken": "y",
            "config": {"system": {"auth_token": "z", "server_addr": "10.0.0.1"}},
            "token_ids": [1, 2, 3],
            "block_keys": [7, 8],
            "uri": "redis://user:pa:ss@host:6379/0?x=1",
            "plain": "redis://host:6379",
            "user_only": "redis://user@host",
            "list": [{"api_key": "k"}, "s3://a:b@bucket/x"],
            "token_count": 2,
        });
        redact(&mut body);
        assert_eq!(
            body,
            json!({
                "trace_id": "t1",
                "password": REDACTED,
                "tokens": REDACTED,
                "old_token": REDACTED,
                "newToken": REDACTED,
                "config": {"system": {"auth_token": REDACTED, "server_addr": "10.0.0.1"}},
                "token_ids": "<redacted: 3 token ids>",
                "block_keys": [7, 8],
                "uri": "redis://user:***@host:6379/0?x=1",
                "plain": "redis://host:6379",
                "user_only": "redis://user@host",
                "list": [{"api_key": REDACTED}, "s3://a:***@bucket/x"],
                "token_count": 2,
            })
        );
    }

    #[test]
    fn an_at_sign_after_the_authority_is_not_a_password() {
        let mut body = json!({"path": "file:///data/a:b@c"});
        redact(&mut body);
        assert_eq!(body, json!({"path": "file:///data/a:b@c"}));
    }
}
