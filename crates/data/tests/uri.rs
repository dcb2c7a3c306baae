//! The block URI parser against the wire fact sheet's examples (§14) and each refusal.

use std::path::Path;

use kvcm_data::{check_under_root, parse_block_uri, DataError, FileScheme};

fn refusal_reason(uri: &str) -> &'static str {
    match parse_block_uri(uri) {
        Err(DataError::InvalidUri { reason, .. }) => reason,
        other => panic!("{uri} should be refused as invalid, got {other:?}"),
    }
}

#[test]
fn the_single_block_example_is_block_zero() {
    let location =
        parse_block_uri("file://nfs_01/tmp/nfs/instance1/tp0/7b?blkid=0&size=1024").expect("valid");
    assert_eq!(location.scheme, FileScheme::File);
    assert_eq!(location.storage_name, "nfs_01");
    assert_eq!(location.path, Path::new("/tmp/nfs/instance1/tp0/7b"));
    assert_eq!(
        (location.block_index, location.offset, location.size),
        (0, 0, 1024)
    );
}

#[test]
fn the_third_block_of_a_shared_file_is_at_twice_its_size() {
    let uri = "file://nfs_01/tmp/nfs/instance1/tp0/64_9a3f0c2b7d1e4a55?blkid=2&size=1024";
    let location = parse_block_uri(uri).expect("valid");
    assert_eq!(
        location.path,
        Path::new("/tmp/nfs/instance1/tp0/64_9a3f0c2b7d1e4a55")
    );
    assert_eq!(
        (location.block_index, location.offset, location.size),
        (2, 2048, 1024)
    );
}

#[test]
fn an_absent_blkid_means_block_zero() {
    let location = parse_block_uri("file://nfs_01/data/a/tp0/7b?size=4096").expect("valid");
    assert_eq!((location.block_index, location.offset), (0, 0));
}

#[test]
fn hf3fs_uris_are_parsed_like_file_uris() {
    let uri = "hf3fs://3fs_a/mnt/3fs/kvcm/inst/tp0/ff_01?blkid=3&size=65536";
    let location = parse_block_uri(uri).expect("valid");
    assert_eq!(location.scheme, FileScheme::Hf3fs);
    assert_eq!(location.storage_name, "3fs_a");
    assert_eq!(location.path, Path::new("/mnt/3fs/kvcm/inst/tp0/ff_01"));
    assert_eq!(location.offset, 3 * 65536);
}

#[test]
fn unknown_params_are_ignored() {
    let location =
        parse_block_uri("file://n/d/f?blkid=1&extra=x&size=8").expect("extra keys are ignored");
    assert_eq!(location.offset, 8);
}

#[test]
fn other_schemes_are_refused_by_name() {
    let uri = "mooncake://mc/?key=inst/tp0/7b&size=1024";
    match parse_block_uri(uri) {
        Err(DataError::UnsupportedScheme { scheme, .. }) => assert_eq!(scheme, "mooncake"),
        other => panic!("expected UnsupportedScheme, got {other:?}"),
    }
    let message = parse_block_uri(uri).unwrap_err().to_string();
    assert!(message.contains("mooncake"), "{message}");
}

#[test]
fn a_uri_without_a_scheme_separator_is_refused() {
    assert_eq!(refusal_reason("/tmp/nfs/a?size=1"), "no `://`");
}

#[test]
fn a_uri_without_a_path_is_refused() {
    assert_eq!(
        refusal_reason("file://nfs_01?size=1024"),
        "no absolute path after the storage name"
    );
}

#[test]
fn an_empty_storage_name_is_refused() {
    assert_eq!(
        refusal_reason("file:///tmp/nfs/a?size=1024"),
        "empty storage name"
    );
}

#[test]
fn a_parent_component_is_refused() {
    assert_eq!(
        refusal_reason("file://nfs_01/tmp/nfs/../etc/passwd?size=1024"),
        "path has a `..` component"
    );
}

#[test]
fn a_nul_byte_is_refused() {
    assert_eq!(
        refusal_reason("file://nfs_01/tmp/nfs/a\0b?size=1024"),
        "contains a NUL byte"
    );
}

#[test]
fn a_directory_path_is_refused() {
    assert_eq!(
        refusal_reason("file://nfs_01/tmp/nfs/?size=1024"),
        "path names a directory, not a file"
    );
}

#[test]
fn a_missing_size_is_refused() {
    assert_eq!(
        refusal_reason("file://nfs_01/tmp/a?blkid=0"),
        "no `size` param"
    );
}

#[test]
fn a_zero_size_is_refused() {
    assert_eq!(
        refusal_reason("file://nfs_01/tmp/a?blkid=0&size=0"),
        "`size` is zero"
    );
}

#[test]
fn non_numeric_params_are_refused() {
    for uri in [
        "file://n/tmp/a?size=1k",
        "file://n/tmp/a?size=+5",
        "file://n/tmp/a?size=-5",
        "file://n/tmp/a?size=",
        "file://n/tmp/a?blkid=x&size=5",
    ] {
        assert_eq!(
            refusal_reason(uri),
            "a numeric param is not a plain decimal number",
            "{uri}"
        );
    }
}

#[test]
fn a_size_beyond_u64_is_refused() {
    assert_eq!(
        refusal_reason("file://n/tmp/a?size=18446744073709551616"),
        "a numeric param overflows u64"
    );
}

#[test]
fn a_param_without_a_value_separator_is_refused() {
    assert_eq!(
        refusal_reason("file://n/tmp/a?blkid&size=5"),
        "a param has no `=`"
    );
}

#[test]
fn a_repeated_param_is_refused() {
    assert_eq!(
        refusal_reason("file://n/tmp/a?size=5&size=6"),
        "a param is given twice"
    );
}

#[test]
fn an_offset_overflowing_u64_is_refused() {
    assert_eq!(
        refusal_reason("file://n/tmp/a?blkid=4294967296&size=4294967296"),
        "blkid × size overflows a file offset"
    );
}

#[test]
fn a_block_ending_past_off_t_is_refused() {
    let uri = format!("file://n/tmp/a?blkid=1&size={}", i64::MAX as u64);
    assert_eq!(refusal_reason(&uri), "blkid × size overflows a file offset");
    let largest = format!("file://n/tmp/a?blkid=0&size={}", i64::MAX as u64);
    assert!(parse_block_uri(&largest).is_ok());
}

#[test]
fn paths_under_the_root_pass() {
    let root = Path::new("/tmp/nfs/");
    assert!(check_under_root(Path::new("/tmp/nfs/instance1/tp0/7b"), root).is_ok());
    assert!(check_under_root(Path::new("/tmp/nfs/7b"), Path::new("/tmp/nfs")).is_ok());
}

#[test]
fn paths_outside_the_root_are_refused() {
    let root = Path::new("/tmp/nfs");
    for path in [
        "/tmp/nfs2/a",
        "/tmp/a",
        "/tmp/nfs",
        "/tmp/nfs/../a",
        "tmp/nfs/a",
    ] {
        assert!(
            matches!(
                check_under_root(Path::new(path), root),
                Err(DataError::OutsideRoot { .. })
            ),
            "{path} should be outside {root:?}"
        );
    }
}

#[test]
fn a_relative_or_climbing_root_admits_nothing() {
    let path = Path::new("/tmp/nfs/a");
    assert!(check_under_root(path, Path::new("tmp/nfs")).is_err());
    assert!(check_under_root(path, Path::new("/tmp/x/../nfs")).is_err());
}
