//! include/kvcm.h is written by hand: this test keeps it in step with src/ (a text scan).
//! Every `#[no_mangle]` function is declared in the header and every function the header
//! declares exists; every `pub const KVCM_*: i32` has a `#define` of the same value.

use std::path::Path;

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The text of every .rs file under src/.
fn sources() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut texts = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("src/") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "rs") {
            texts.push(read(&path));
        }
    }
    texts
}

fn header() -> String {
    read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("include/kvcm.h"))
}

/// The identifier at the start of `text`.
fn identifier(text: &str) -> &str {
    let end = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    &text[..end]
}

/// Names of the functions after each `#[no_mangle]`.
fn exported(source: &str) -> Vec<String> {
    source
        .split("#[no_mangle]")
        .skip(1)
        .map(|rest| {
            let at = rest.find("fn ").expect("a function after #[no_mangle]");
            identifier(&rest[at + 3..]).to_string()
        })
        .collect()
}

/// Names of the functions the header declares (`kvcm_...(` not inside a comment).
fn declared(header: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in code_lines(header) {
        for (at, _) in line.match_indices("kvcm_") {
            let name = identifier(&line[at..]);
            if line[at + name.len()..].starts_with('(') {
                names.push(name.to_string());
            }
        }
    }
    names
}

/// The header's lines with comments removed.
fn code_lines(header: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_comment = false;
    for line in header.lines() {
        let mut code = String::new();
        let mut rest = line;
        loop {
            if in_comment {
                match rest.find("*/") {
                    Some(end) => {
                        rest = &rest[end + 2..];
                        in_comment = false;
                    }
                    None => break,
                }
            } else {
                match rest.find("/*") {
                    Some(start) => {
                        code.push_str(&rest[..start]);
                        rest = &rest[start + 2..];
                        in_comment = true;
                    }
                    None => {
                        code.push_str(rest);
                        break;
                    }
                }
            }
        }
        out.push(code);
    }
    out
}

/// `(name, value)` of every `pub const KVCM_*: i32 = value;`.
fn constants(source: &str) -> Vec<(String, i64)> {
    source
        .lines()
        .filter_map(|line| line.trim().strip_prefix("pub const KVCM_"))
        .map(|rest| {
            let name = format!("KVCM_{}", identifier(rest));
            let value = rest.split('=').nth(1).expect("a value");
            let value = value
                .trim()
                .trim_end_matches(';')
                .parse()
                .expect("a number");
            (name, value)
        })
        .collect()
}

/// The value of `#define name value` in the header.
fn define(header: &str, name: &str) -> Option<i64> {
    code_lines(header).iter().find_map(|line| {
        let rest = line.trim().strip_prefix("#define ")?.strip_prefix(name)?;
        if !rest.starts_with(char::is_whitespace) {
            return None;
        }
        let value = rest.trim().trim_start_matches('(').trim_end_matches(')');
        value.parse().ok()
    })
}

#[test]
fn every_exported_function_is_declared_and_back() {
    let exported: Vec<String> = sources().iter().flat_map(|s| exported(s)).collect();
    let declared = declared(&header());
    assert!(exported.len() >= 14, "scan found too few: {exported:?}");
    for name in &exported {
        assert!(
            declared.contains(name),
            "{name} is exported but not in kvcm.h"
        );
    }
    for name in &declared {
        assert!(
            exported.contains(name),
            "kvcm.h declares {name}, which src/ does not export"
        );
    }
}

#[test]
fn every_constant_has_the_same_value_in_the_header() {
    let header = header();
    let constants: Vec<(String, i64)> = sources().iter().flat_map(|s| constants(s)).collect();
    assert!(constants.len() >= 11, "scan found too few: {constants:?}");
    for (name, value) in constants {
        assert_eq!(
            define(&header, &name),
            Some(value),
            "#define {name} in kvcm.h"
        );
    }
}
