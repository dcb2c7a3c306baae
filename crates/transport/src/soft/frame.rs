//! The soft wire format: fixed little-endian headers, payload after the header.
//!
//! A connection starts with a [`hello`]; then the requester sends request frames and the
//! responder answers each, in order, with a response frame (reliable-connected ordering
//! means no sequence numbers are needed). Many frames go out in one write.
//!
//! A READ list ([`Op::ReadList`]) carries several small READs in one frame — what a lookup
//! posts as dozens of 64-byte READs costs one header each way instead of one per READ. Its
//! payload is [`READ_ENTRY_LEN`]-byte entries; its answer is one response whose `value`
//! counts the entries answered, in order, with their bytes concatenated after it: all of
//! them on success, the ones before the first refused entry otherwise (as a queue pair that
//! executes READs in order stops at the first fault). A requester sends lists only to a
//! NIC whose endpoint says it takes them (`lists=1`), so peers of earlier releases keep
//! receiving one frame per READ.

use crate::{RemoteAddr, WcStatus};

/// Bytes of a request header.
pub(crate) const REQUEST_LEN: usize = 40;
/// Bytes of a response header.
pub(crate) const RESPONSE_LEN: usize = 16;
/// Bytes of the hello that opens a connection: magic, queue pair number, token.
pub(crate) const HELLO_LEN: usize = 16;
/// Largest payload one frame may carry.
pub(crate) const MAX_PAYLOAD: u32 = 1 << 30;
/// Bytes of one entry of a READ list: remote address, key, length.
pub(crate) const READ_ENTRY_LEN: usize = 16;
/// Most READs one list carries.
pub(crate) const MAX_READ_LIST: usize = 256;
/// Most bytes one READ list may ask for, and one of its READs (far below the zero-copy
/// size: a list's answer is always buffered whole).
pub(crate) const MAX_READ_LIST_BYTES: u32 = 32 * 1024;
const MAGIC: u32 = 0x5054_564b; // "KVTP"

/// Request operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Read = 1,
    Write = 2,
    Send = 3,
    CompareSwap = 4,
    FetchAdd = 5,
    /// Shared-memory wire only: the data of a WRITE with immediate is already in place.
    ImmNotify = 6,
    /// TCP wire: several READs, answered in order by one response.
    ReadList = 7,
}

/// A request header. `len` is the payload length for WRITE / SEND, the requested length
/// for READ (for a READ list: of all its entries) and the written length for IMM_NOTIFY;
/// `operand` is a READ list's entry count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RequestHeader {
    pub op: Op,
    pub imm: Option<u32>,
    pub len: u32,
    pub remote: RemoteAddr,
    pub operand: u64,
    pub swap: u64,
}

impl RequestHeader {
    /// A header with no remote address and no operands.
    pub(crate) fn new(op: Op, len: u32, imm: Option<u32>) -> Self {
        let remote = RemoteAddr { addr: 0, rkey: 0 };
        RequestHeader {
            op,
            imm,
            len,
            remote,
            operand: 0,
            swap: 0,
        }
    }

    /// Bytes of payload that follow this header on the wire.
    pub(crate) fn payload_len(&self) -> usize {
        match self.op {
            Op::Write | Op::Send => self.len as usize,
            Op::ReadList => self.operand as usize * READ_ENTRY_LEN,
            _ => 0,
        }
    }

    /// The header of a READ list of `entries` entries asking for `len` bytes in all.
    pub(crate) fn read_list(entries: usize, len: u32) -> Self {
        RequestHeader {
            operand: entries as u64,
            ..RequestHeader::new(Op::ReadList, len, None)
        }
    }

    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_bytes());
    }

    pub(crate) fn to_bytes(self) -> [u8; REQUEST_LEN] {
        let mut out = [0u8; REQUEST_LEN];
        out[0] = self.op as u8;
        out[1] = u8::from(self.imm.is_some());
        out[4..8].copy_from_slice(&self.len.to_le_bytes());
        out[8..16].copy_from_slice(&self.remote.addr.to_le_bytes());
        out[16..20].copy_from_slice(&self.remote.rkey.to_le_bytes());
        out[20..24].copy_from_slice(&self.imm.unwrap_or(0).to_le_bytes());
        out[24..32].copy_from_slice(&self.operand.to_le_bytes());
        out[32..].copy_from_slice(&self.swap.to_le_bytes());
        out
    }

    /// Decodes a header from the first [`REQUEST_LEN`] bytes; `None` if malformed.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        let bytes = bytes.get(..REQUEST_LEN)?;
        let op = match bytes[0] {
            1 => Op::Read,
            2 => Op::Write,
            3 => Op::Send,
            4 => Op::CompareSwap,
            5 => Op::FetchAdd,
            6 => Op::ImmNotify,
            7 => Op::ReadList,
            _ => return None,
        };
        let len = u32_at(bytes, 4);
        if len > MAX_PAYLOAD {
            return None;
        }
        let operand = u64_at(bytes, 24);
        let list_fits = (1..=MAX_READ_LIST as u64).contains(&operand) && len <= MAX_READ_LIST_BYTES;
        if op == Op::ReadList && !list_fits {
            return None;
        }
        let imm = (bytes[1] != 0).then(|| u32_at(bytes, 20));
        let remote = RemoteAddr {
            addr: u64_at(bytes, 8),
            rkey: u32_at(bytes, 16),
        };
        Some(RequestHeader {
            op,
            imm,
            len,
            remote,
            operand,
            swap: u64_at(bytes, 32),
        })
    }
}

/// One READ of a list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReadEntry {
    pub remote: RemoteAddr,
    pub len: u32,
}

impl ReadEntry {
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.remote.addr.to_le_bytes());
        out.extend_from_slice(&self.remote.rkey.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
    }

    /// The entries of a READ list's `payload` (whole entries; a trailing piece is ignored,
    /// and a decoded header's payload has none).
    pub(crate) fn decode_all(payload: &[u8]) -> impl Iterator<Item = ReadEntry> + '_ {
        payload.chunks_exact(READ_ENTRY_LEN).map(|entry| ReadEntry {
            remote: RemoteAddr {
                addr: u64_at(entry, 0),
                rkey: u32_at(entry, 8),
            },
            len: u32_at(entry, 12),
        })
    }
}

/// A response header: the status, payload length (READ data) and atomic old value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ResponseHeader {
    pub status: WcStatus,
    pub len: u32,
    pub value: u64,
}

impl ResponseHeader {
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_bytes());
    }

    pub(crate) fn to_bytes(self) -> [u8; RESPONSE_LEN] {
        let mut out = [0u8; RESPONSE_LEN];
        out[0] = status_code(self.status);
        out[4..8].copy_from_slice(&self.len.to_le_bytes());
        out[8..].copy_from_slice(&self.value.to_le_bytes());
        out
    }

    /// Decodes a header from the first [`RESPONSE_LEN`] bytes; `None` if malformed.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        let bytes = bytes.get(..RESPONSE_LEN)?;
        let status = status_from_code(bytes[0])?;
        let len = u32_at(bytes, 4);
        (len <= MAX_PAYLOAD).then(|| ResponseHeader {
            status,
            len,
            value: u64_at(bytes, 8),
        })
    }
}

/// The hello naming the destination queue pair and proving knowledge of its endpoint
/// (the random `token` it carries).
pub(crate) fn hello(dst_qpn: u32, token: u64) -> [u8; HELLO_LEN] {
    let mut out = [0u8; HELLO_LEN];
    out[..4].copy_from_slice(&MAGIC.to_le_bytes());
    out[4..8].copy_from_slice(&dst_qpn.to_le_bytes());
    out[8..].copy_from_slice(&token.to_le_bytes());
    out
}

/// The destination queue pair and token of a hello, or `None` if it is not one.
pub(crate) fn parse_hello(bytes: &[u8]) -> Option<(u32, u64)> {
    let bytes = bytes.get(..HELLO_LEN)?;
    (u32_at(bytes, 0) == MAGIC).then(|| (u32_at(bytes, 4), u64_at(bytes, 8)))
}

const STATUSES: [WcStatus; 7] = [
    WcStatus::Success,
    WcStatus::LocalLengthError,
    WcStatus::LocalProtectionError,
    WcStatus::RemoteAccessError,
    WcStatus::RemoteInvalidRequest,
    WcStatus::RetryExceeded,
    WcStatus::WrFlushError,
];

fn status_code(status: WcStatus) -> u8 {
    STATUSES
        .iter()
        .position(|&known| known == status)
        .unwrap_or(4) as u8
}

fn status_from_code(code: u8) -> Option<WcStatus> {
    STATUSES.get(code as usize).copied()
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trips() {
        let header = RequestHeader {
            op: Op::CompareSwap,
            imm: Some(7),
            len: 8,
            remote: RemoteAddr {
                addr: 0xdead_beef,
                rkey: 42,
            },
            operand: 1,
            swap: u64::MAX,
        };
        let mut out = Vec::new();
        header.encode(&mut out);
        assert_eq!(out.len(), REQUEST_LEN);
        assert_eq!(RequestHeader::decode(&out), Some(header));
    }

    #[test]
    fn a_read_list_round_trips_with_its_entries() {
        let entries =
            [(0x1000, 7, 64), (0x2040, 9, 128), (u64::MAX - 64, 1, 0)].map(|(addr, rkey, len)| {
                ReadEntry {
                    remote: RemoteAddr { addr, rkey },
                    len,
                }
            });
        let header = RequestHeader::read_list(entries.len(), 192);
        let mut out = Vec::new();
        header.encode(&mut out);
        entries.iter().for_each(|entry| entry.encode(&mut out));
        let decoded = RequestHeader::decode(&out).unwrap();
        assert_eq!(decoded, header);
        assert_eq!(decoded.payload_len(), 3 * READ_ENTRY_LEN);
        let payload = &out[REQUEST_LEN..];
        assert_eq!(payload.len(), decoded.payload_len());
        assert!(ReadEntry::decode_all(payload).eq(entries));
    }

    #[test]
    fn read_lists_too_short_too_long_or_too_large_are_rejected() {
        let max = MAX_READ_LIST_BYTES;
        for (entries, len) in [(0, 64), (MAX_READ_LIST + 1, 64), (2, max + 1)] {
            let mut out = Vec::new();
            RequestHeader::read_list(entries, len).encode(&mut out);
            assert_eq!(
                RequestHeader::decode(&out),
                None,
                "{entries} entries, {len} B"
            );
        }
        let mut out = Vec::new();
        RequestHeader::read_list(MAX_READ_LIST, max).encode(&mut out);
        assert!(RequestHeader::decode(&out).is_some());
    }

    #[test]
    fn response_round_trips_and_every_status_survives() {
        for status in STATUSES {
            let header = ResponseHeader {
                status,
                len: 64,
                value: 3,
            };
            let mut out = Vec::new();
            header.encode(&mut out);
            assert_eq!(ResponseHeader::decode(&out), Some(header));
        }
    }

    #[test]
    fn malformed_frames_are_rejected() {
        let mut bad_op = vec![0u8; REQUEST_LEN];
        bad_op[0] = 99;
        assert_eq!(RequestHeader::decode(&bad_op), None);
        let mut huge = Vec::new();
        RequestHeader::new(Op::Send, 0, None).encode(&mut huge);
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(RequestHeader::decode(&huge), None);
        assert_eq!(RequestHeader::decode(&[1, 2, 3]), None);
        assert_eq!(ResponseHeader::decode(&[200; RESPONSE_LEN]), None);
        assert_eq!(parse_hello(&[0; HELLO_LEN]), None);
        assert_eq!(parse_hello(&hello(5, 77)), Some((5, 77)));
    }
}
