//! The write path as RDMA messages: StartWriteCache, FinishWriteCache and RemoveCache sent
//! as SENDs on the lookup queue pair, answered by SENDs, carrying the same protobuf messages
//! as gRPC (so the server's answers are the gRPC handlers' answers); and the lookups a client
//! answered from the published table, reported in batches (`Reads`: the GetCacheLocation
//! requests, each length-delimited, answered by a CommonResponse) so that the server counts
//! them as it counts its own (access clock, event log, live capacity curves); and
//! `Authenticate` (body: an API key or admin token), which gives the queue pair the
//! credential its later messages are checked with (`kvcm.auth.meta = required`), answered
//! by a CommonResponse saying whether the credential is valid.
//!
//! Message: `request_id u32, op u8, status u8, 0u16`, then the protobuf body. A request's
//! status is 0. A reply echoes the id and op; status 0 = the body is the response
//! (StartWriteCacheResponse, or CommonResponse); any other status means nothing was
//! applied: 1 = the answer would exceed [`MAX_MESSAGE`] (a StartWriteCache whose answer is
//! that large has its new session failed at once; ask gRPC), 2 = the request was
//! malformed, 3 = the server is busy (ask gRPC), 4 = `kvcm.auth.meta = required` and the
//! queue pair's credential (none, or one no longer valid) may not make this call.

use prost::Message;

use crate::proto::meta;

/// Largest message either way (bytes, header included).
pub const MAX_MESSAGE: usize = 256 << 10;
/// Bytes of the message header.
pub const HEADER: usize = 8;

/// What a message asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    /// StartWriteCache.
    StartWrite = 1,
    /// FinishWriteCache.
    FinishWrite = 2,
    /// RemoveCache.
    Remove = 3,
    /// Lookups answered from the table.
    Reads = 4,
    /// The queue pair's credential.
    Authenticate = 5,
}

impl Op {
    fn from_byte(byte: u8) -> Option<Op> {
        [
            Op::StartWrite,
            Op::FinishWrite,
            Op::Remove,
            Op::Reads,
            Op::Authenticate,
        ]
        .into_iter()
        .find(|op| *op as u8 == byte)
    }
}

/// A decoded request.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// StartWriteCache.
    StartWrite(meta::StartWriteCacheRequest),
    /// FinishWriteCache.
    FinishWrite(meta::FinishWriteCacheRequest),
    /// RemoveCache.
    Remove(meta::RemoveCacheRequest),
    /// Lookups the client answered from the table (their keys and token ids).
    Reads(Vec<meta::GetCacheLocationRequest>),
    /// The credential later messages of this queue pair carry (an API key or admin token).
    Authenticate(Vec<u8>),
}

impl Request {
    /// The op of this request.
    pub fn op(&self) -> Op {
        match self {
            Request::StartWrite(_) => Op::StartWrite,
            Request::FinishWrite(_) => Op::FinishWrite,
            Request::Remove(_) => Op::Remove,
            Request::Reads(_) => Op::Reads,
            Request::Authenticate(_) => Op::Authenticate,
        }
    }
}

/// A reply's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    /// The body is the response.
    Ok = 0,
    /// The response was too large for a message (nothing applied).
    TooLarge = 1,
    /// The request was malformed (nothing applied).
    Malformed = 2,
    /// The server was busy (nothing applied).
    Busy = 3,
    /// Meta auth is required and the queue pair's credential may not make the call
    /// (nothing applied).
    Unauthenticated = 4,
}

/// A decoded reply.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// StartWriteCache's response.
    StartWrite(meta::StartWriteCacheResponse),
    /// FinishWriteCache's or RemoveCache's response.
    Common(meta::CommonResponse),
    /// Not answered by message (see [`Status`]).
    Refused(Status),
}

fn header(id: u32, op: u8, status: u8) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(HEADER + 256);
    bytes.extend_from_slice(&id.to_le_bytes());
    bytes.extend_from_slice(&[op, status, 0, 0]);
    bytes
}

/// Encodes a request; `None` when it exceeds [`MAX_MESSAGE`].
pub fn encode_request(id: u32, request: &Request) -> Option<Vec<u8>> {
    let mut bytes = match request {
        Request::StartWrite(r) => r.encode_to_vec(),
        Request::FinishWrite(r) => r.encode_to_vec(),
        Request::Remove(r) => r.encode_to_vec(),
        Request::Reads(lookups) => {
            let mut body = Vec::new();
            for lookup in lookups {
                lookup.encode_length_delimited(&mut body).ok()?;
            }
            body
        }
        Request::Authenticate(credential) => credential.clone(),
    };
    let mut message = header(id, request.op() as u8, 0);
    message.append(&mut bytes);
    (message.len() <= MAX_MESSAGE).then_some(message)
}

/// The id and op of a message (what a malformed one can still be answered with).
pub fn peek(message: &[u8]) -> Option<(u32, u8)> {
    let head = message.get(..HEADER)?;
    Some((
        u32::from_le_bytes([head[0], head[1], head[2], head[3]]),
        head[4],
    ))
}

/// The status of a reply.
pub fn peek_status(message: &[u8]) -> Option<Status> {
    let byte = *message.get(5)?;
    [
        Status::Ok,
        Status::TooLarge,
        Status::Malformed,
        Status::Busy,
        Status::Unauthenticated,
    ]
    .into_iter()
    .find(|s| *s as u8 == byte)
}

/// Decodes a request; `None` when malformed.
pub fn decode_request(message: &[u8]) -> Option<(u32, Request)> {
    let (id, op) = peek(message)?;
    let body = &message[HEADER..];
    let request = match Op::from_byte(op)? {
        Op::StartWrite => Request::StartWrite(meta::StartWriteCacheRequest::decode(body).ok()?),
        Op::FinishWrite => Request::FinishWrite(meta::FinishWriteCacheRequest::decode(body).ok()?),
        Op::Remove => Request::Remove(meta::RemoveCacheRequest::decode(body).ok()?),
        Op::Reads => Request::Reads(decode_reads(body)?),
        Op::Authenticate => Request::Authenticate(body.to_vec()),
    };
    Some((id, request))
}

/// The lookups of a `Reads` body; `None` when one is malformed.
fn decode_reads(mut body: &[u8]) -> Option<Vec<meta::GetCacheLocationRequest>> {
    let mut lookups = Vec::new();
    while !body.is_empty() {
        lookups.push(meta::GetCacheLocationRequest::decode_length_delimited(&mut body).ok()?);
    }
    Some(lookups)
}

/// Encodes a reply (a response too large becomes [`Status::TooLarge`]).
pub fn encode_reply(id: u32, op: u8, reply: &Reply) -> Vec<u8> {
    let body = match reply {
        Reply::StartWrite(r) => r.encode_to_vec(),
        Reply::Common(r) => r.encode_to_vec(),
        Reply::Refused(status) => return header(id, op, *status as u8),
    };
    if HEADER + body.len() > MAX_MESSAGE {
        return header(id, op, Status::TooLarge as u8);
    }
    let mut message = header(id, op, Status::Ok as u8);
    message.extend_from_slice(&body);
    message
}

/// Decodes the reply to request `id` of `op`; `None` when it is not one.
pub fn decode_reply(message: &[u8], id: u32, op: Op) -> Option<Reply> {
    let (got_id, got_op) = peek(message)?;
    if got_id != id || got_op != op as u8 {
        return None;
    }
    let body = &message[HEADER..];
    let status = peek_status(message)?;
    if status != Status::Ok {
        return Some(Reply::Refused(status));
    }
    Some(match op {
        Op::StartWrite => Reply::StartWrite(meta::StartWriteCacheResponse::decode(body).ok()?),
        Op::FinishWrite | Op::Remove | Op::Reads | Op::Authenticate => {
            Reply::Common(meta::CommonResponse::decode(body).ok()?)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_round_trip_and_garbage_is_refused() {
        let request = Request::Remove(meta::RemoveCacheRequest {
            instance_id: "i".into(),
            block_keys: vec![1, -2],
            ..Default::default()
        });
        let bytes = encode_request(7, &request).unwrap();
        assert_eq!(decode_request(&bytes), Some((7, request)));
        assert_eq!(decode_request(&bytes[..5]), None);
        let mut unknown = bytes.clone();
        unknown[4] = 99;
        assert_eq!(decode_request(&unknown), None);
        let mut garbage = bytes.clone();
        garbage.extend_from_slice(&[0xff; 3]);
        assert_eq!(decode_request(&garbage), None, "a truncated field");
        let reply = Reply::Common(meta::CommonResponse::default());
        let encoded = encode_reply(7, Op::Remove as u8, &reply);
        assert_eq!(decode_reply(&encoded, 7, Op::Remove), Some(reply));
        assert_eq!(
            decode_reply(&encoded, 8, Op::Remove),
            None,
            "another request's reply"
        );
        let busy = encode_reply(7, Op::Remove as u8, &Reply::Refused(Status::Busy));
        assert_eq!(
            decode_reply(&busy, 7, Op::Remove),
            Some(Reply::Refused(Status::Busy))
        );
        let huge = Request::Remove(meta::RemoveCacheRequest {
            block_keys: vec![-1; MAX_MESSAGE],
            ..Default::default()
        });
        assert_eq!(encode_request(1, &huge), None);
    }

    #[test]
    fn a_batch_of_reads_round_trips_and_a_torn_one_is_refused() {
        let lookup = |keys: Vec<i64>| meta::GetCacheLocationRequest {
            instance_id: "i".into(),
            block_keys: keys,
            ..Default::default()
        };
        let reads = Request::Reads(vec![lookup(vec![1, 2]), lookup(vec![-3]), lookup(vec![])]);
        let bytes = encode_request(9, &reads).unwrap();
        assert_eq!(decode_request(&bytes), Some((9, reads)));
        assert_eq!(
            decode_request(&bytes[..bytes.len() - 1]),
            None,
            "a torn last lookup"
        );
        let empty = Request::Reads(Vec::new());
        let bytes = encode_request(10, &empty).unwrap();
        assert_eq!(decode_request(&bytes), Some((10, empty)));
        let credential = Request::Authenticate(b"kvcm_key".to_vec());
        let bytes = encode_request(11, &credential).unwrap();
        assert_eq!(decode_request(&bytes), Some((11, credential)));
    }
}
