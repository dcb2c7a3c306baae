//! One record of the write-ahead log or of a snapshot, as recovery reads it after its frame
//! passed the checksum (a damaged or hostile journal directory): decoding never panics and
//! a record that decodes re-encodes canonically (`kvcm_manager::fuzzing::journal_record`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    kvcm_manager::fuzzing::journal_record(input);
});
