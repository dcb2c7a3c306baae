//! The client's decoding of what its one-sided READs copied from a lookup table
//! (`kvcm_lookup`): a header, a bucket, an availability block and a string-heap entry. A
//! copy may be torn, stale or (from a broken or hostile server) wrong, so every decoder is
//! fed the raw bytes, and — because blocks are checksummed, which random bytes never pass —
//! also the input sealed as a consistent block: the decoders' bounds are then reached with
//! contents the checksum vouches for. Nothing panics; a decoded slot has no checksum or
//! one per part, and it and a string entry re-encode to what decodes equal.
//!
//! Input: four parts, each a `u16` length (LE) then that many bytes (a short input gives
//! empty parts): header body, bucket body, availability body, string payload; then the
//! string entry's kind.
#![no_main]

use kvcm_lookup::avail::Availability;
use kvcm_lookup::header::{candidates, Geometry, Header};
use kvcm_lookup::reader::{availability, key_slots, Copy};
use kvcm_lookup::slot::Slot;
use kvcm_lookup::{seqlock, strings};
use libfuzzer_sys::fuzz_target;

/// The next length-prefixed part of `input`.
fn part<'a>(input: &mut &'a [u8]) -> &'a [u8] {
    let Some(len) = input.get(..2) else {
        return &[];
    };
    let len = usize::from(u16::from_le_bytes([len[0], len[1]])).min(input.len() - 2);
    let (part, rest) = input[2..].split_at(len);
    *input = rest;
    part
}

/// `body` sealed as a consistent block, padded to whole 8-byte words.
fn sealed(body: &[u8]) -> Vec<u8> {
    let mut body = body.to_vec();
    body.resize(body.len().next_multiple_of(8), 0);
    seqlock::seal(&body, 2)
}

/// Every slot of the bucket for the key its first slot names; each re-encodes.
fn bucket(block: &[u8], geometry: &Geometry) {
    let Some(key) = block.get(8..16) else {
        return;
    };
    let key = i64::from_le_bytes(key.try_into().expect("8 bytes"));
    let Copy::Good(slots) = key_slots(block, geometry, key) else {
        return;
    };
    for slot in slots {
        assert_eq!(slot.head.key, key, "a slot of another key");
        let owned = slot.to_slot();
        assert!(owned.checksums.is_empty() || owned.checksums.len() == owned.parts.len());
        for (i, checksum) in owned.checksums.iter().enumerate() {
            assert_eq!(slot.checksum(i), Some(*checksum), "checksum {i}");
        }
        let mut image = vec![0u8; geometry.slot_bytes];
        owned.encode(&mut image);
        assert_eq!(Slot::decode(&image), Some(owned), "a slot re-encodes");
    }
}

fn header(block: &[u8]) -> Option<Geometry> {
    let header = Header::open(block).ok()??;
    for key in [0, -1, i64::MAX] {
        let [a, b] = candidates(key, header.hash_seed, header.bucket_count);
        assert!(
            a < header.bucket_count && b < header.bucket_count,
            "candidates in range"
        );
        let _ = (header.bucket_at(a), header.bucket_at(b));
    }
    Some(header.geometry())
}

fn string_entry(bytes: &[u8]) {
    let Ok(entry) = strings::decode(bytes) else {
        return;
    };
    let encoded = strings::encode(&entry);
    assert_eq!(strings::entry_len(&encoded).ok(), Some(encoded.len()));
    assert_eq!(
        strings::decode(&encoded).ok(),
        Some(entry),
        "a string entry re-encodes"
    );
}

/// A string entry of `kind` around `payload` with a correct checksum.
fn string_image(kind: u32, payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(strings::ENTRY_HEAD + payload.len());
    bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&kind.to_le_bytes());
    bytes.extend_from_slice(&seqlock::checksum(payload).to_le_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

fuzz_target!(|input: &[u8]| {
    let mut rest = input;
    let (head, bucket_body, avail, payload) = (
        part(&mut rest),
        part(&mut rest),
        part(&mut rest),
        part(&mut rest),
    );
    let kind = rest.first().copied().map_or(0, u32::from);

    let geometries: Vec<Geometry> = [header(head), header(&sealed(head))]
        .into_iter()
        .flatten()
        .chain(Geometry::for_parts(kind as usize % 64))
        .collect();
    for geometry in &geometries {
        bucket(bucket_body, geometry);
        bucket(&sealed(bucket_body), geometry);
    }
    let mut into = Availability::default();
    for block in [avail.to_vec(), sealed(avail)] {
        let before = into.clone();
        if !matches!(availability(&block, &mut into), Ok(Copy::Good(()))) {
            assert_eq!(into, before, "a refused availability block changes nothing");
        }
    }
    string_entry(payload);
    string_entry(&string_image(kind, payload));
});
