//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`, never on in a build
//! that ships): the decoders that are private to this crate, each checked for what its
//! module promises of hostile bytes.

use crate::journal::Record;

/// Decodes `bytes` as one journal record (a WAL or snapshot frame's payload), and as the
/// object nested in each kind of record that carries one (so that the committed encodings
/// in `fixtures/encoding/` seed every record kind). Never panics; a record that decodes
/// re-encodes to bytes that decode and re-encode identically.
pub fn journal_record(bytes: &[u8]) {
    check_record(bytes);
    for record in crate::journal::record_nesting(bytes) {
        check_record(&record);
    }
}

fn check_record(bytes: &[u8]) {
    let Ok(record) = Record::decode(bytes) else {
        return;
    };
    let encoded = record.encode();
    let again = Record::decode(&encoded).expect("a re-encoded record decodes");
    assert_eq!(again.encode(), encoded, "re-encoding is stable");
}
