//! Names that end up inside location URIs and file paths: storage names, instance ids, spec
//! names, and the object name of one (instance, spec, key).
//!
//! Invariant: an accepted name cannot break a URI (no `/ ? # & =`, no control characters or
//! spaces), cannot leave its directory (never empty, `.` or `..`) and fits one path
//! component of the file tier (at most [`MAX_NAME_BYTES`]).

use crate::BlockKey;

/// The longest name, in bytes: one path component (`NAME_MAX` of Linux file systems).
pub const MAX_NAME_BYTES: usize = 255;

/// Checks one name component; the error message names `field`.
pub(crate) fn check_name(field: &str, value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err(format!("{field} is empty"));
    }
    if value.len() > MAX_NAME_BYTES {
        return Err(format!(
            "{field} is {} bytes, longer than the limit of {MAX_NAME_BYTES} bytes (one path component)",
            value.len()
        ));
    }
    if value == "." || value == ".." {
        return Err(format!("{field} {value:?} is not a usable name"));
    }
    let forbidden = |c: char| "/?#&=".contains(c) || c.is_control() || c.is_whitespace();
    if let Some(bad) = value.chars().find(|&c| forbidden(c)) {
        return Err(format!(
            "{field} {value:?} contains the forbidden character {bad:?}"
        ));
    }
    Ok(())
}

/// `<instance_id>/<spec_name>/<hex(key as u64)>`: lower-case hex without padding (§14).
pub(crate) fn object_name(instance_id: &str, spec_name: &str, key: BlockKey) -> String {
    format!("{instance_id}/{spec_name}/{:x}", key as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_names_follow_the_fact_sheet() {
        assert_eq!(object_name("instance1", "tp0", 123), "instance1/tp0/7b");
        assert_eq!(object_name("i", "s", -1), "i/s/ffffffffffffffff");
        assert_eq!(object_name("i", "s", 0), "i/s/0");
    }

    #[test]
    fn bad_names_are_refused_with_the_field_named() {
        for bad in [
            "", ".", "..", "a/b", "a?b", "a#b", "a&b", "a=b", "a b", "a\0b", "a\nb",
        ] {
            let err = check_name("instance_id", bad).expect_err(bad);
            assert!(err.starts_with("instance_id"), "{err}");
        }
        let long = "x".repeat(MAX_NAME_BYTES + 1);
        let err = check_name("instance_id", &long).expect_err("too long");
        assert!(err.contains("255 bytes"), "{err}");
        let longest = "x".repeat(MAX_NAME_BYTES);
        for good in ["instance1", "tp0", "nfs_01", "a.b", "...", "名前", &longest] {
            assert_eq!(check_name("x", good), Ok(()));
        }
    }
}
