//! The URIs reporters hand in with their blocks, and the generation kvcm appends to them.
//!
//! A reported URI is the reporter's own (`event_report://10.0.0.8:9600/gpu/123?size=4096`,
//! `vineyard://…`): kvcm keeps it as given and appends exactly one `s_version=<32 hex>`
//! parameter, the reporter's generation when the spec was stored. Valid = a scheme of
//! lower-case letters, digits, `+ . - _`, then `://`, a non-empty authority, an optional
//! path and an optional query of `name=value` pairs; no white space, control character or
//! `#` anywhere; and no `s_version` from the caller.

use std::fmt::Write;

/// The parameter kvcm appends.
pub const VERSION_PARAM: &str = "s_version";

/// Why a reported URI is refused (the message of the item's INVALID_ARGUMENT).
pub fn check(uri: &str) -> Result<(), String> {
    let refuse = |why: &str| Err(format!("uri {uri:?} {why}"));
    if let Some(bad) = uri
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || *c == '#')
    {
        return refuse(&format!("contains {bad:?}"));
    }
    let Some((scheme, rest)) = uri.split_once("://") else {
        return refuse("has no \"://\"");
    };
    let scheme_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "+.-_".contains(c);
    if scheme.is_empty() || !scheme.chars().all(scheme_char) {
        return refuse("has no valid scheme");
    }
    let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
    let authority = location.split('/').next().unwrap_or("");
    if authority.is_empty() {
        return refuse("has no host");
    }
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let name = pair.split_once('=').map_or(pair, |(name, _)| name);
        if name.is_empty() {
            return refuse("has a parameter without a name");
        }
        if name == VERSION_PARAM {
            return refuse("carries s_version, which kvcm appends itself");
        }
    }
    Ok(())
}

/// `uri` (valid) with `s_version=<generation>` appended.
pub fn with_version(uri: &str, generation: u128) -> String {
    let mut out = String::with_capacity(uri.len() + 45);
    out.push_str(uri);
    out.push_str(match uri.split_once('?') {
        None => "?",
        Some((_, query)) if query.is_empty() || query.ends_with('&') => "",
        Some(_) => "&",
    });
    out.push_str(VERSION_PARAM);
    out.push('=');
    // Writing into a String cannot fail.
    let _ = write!(out, "{generation:032x}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reported_uris_are_checked_and_get_one_version() {
        for good in [
            "event_report://10.0.0.8:9600/gpu/123?size=4096",
            "vineyard://h:1/memory/456",
            "event_report://h:1",
        ] {
            assert_eq!(check(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "no-scheme/x",
            "Upper://h/x",
            "event_report:///x",
            "event_report://h/x?s_version=00",
            "event_report://h/x?a=1&s_version",
            "event_report://h/x y",
            "event_report://h/x#frag",
            "event_report://h/x?=1",
        ] {
            assert!(check(bad).is_err(), "{bad}");
        }
        let generation = 0xabc;
        let hex = "00000000000000000000000000000abc";
        assert_eq!(
            with_version("e://h/p?size=1", generation),
            format!("e://h/p?size=1&s_version={hex}")
        );
        assert_eq!(
            with_version("e://h/p", generation),
            format!("e://h/p?s_version={hex}")
        );
        assert_eq!(
            with_version("e://h/p?", generation),
            format!("e://h/p?s_version={hex}")
        );
        assert_eq!(
            with_version("e://h/p?a=1&", generation),
            format!("e://h/p?a=1&s_version={hex}")
        );
    }
}
