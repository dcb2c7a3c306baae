//! The URI parsers that see clients' and operators' text: block-location URIs as the
//! storage tier parses them on delete (`kvcm_storage::BlockUri`), as the data plane parses
//! them before touching a file (`kvcm_data::parse_block_uri`), and Redis URIs of the index
//! configuration (`kvcm_index::redis::parse_uri`). A parsed block URI prints to text that
//! parses to the same URI; a data-plane location is an absolute path without `..` whose
//! offset is its block index × size.
#![no_main]

use kvcm_storage::BlockUri;
use libfuzzer_sys::fuzz_target;
use std::path::Component;

fuzz_target!(|input: &[u8]| {
    let Ok(text) = std::str::from_utf8(input) else {
        return;
    };
    if let Ok(uri) = BlockUri::parse(text) {
        let printed = uri.to_string();
        let again = BlockUri::parse(&printed).expect("a printed URI parses");
        assert_eq!(again, uri, "{text:?} printed as {printed:?}");
    }
    if let Ok(location) = kvcm_data::parse_block_uri(text) {
        assert!(location.path.is_absolute(), "{text:?}: {location:?}");
        let parent = location
            .path
            .components()
            .any(|c| c == Component::ParentDir);
        assert!(!parent, "{text:?}: {location:?}");
        assert_eq!(
            location.block_index.checked_mul(location.size),
            Some(location.offset),
            "{text:?}"
        );
    }
    let _ = kvcm_index::redis::parse_uri(text);
});
