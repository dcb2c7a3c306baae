//! Out-of-band exchange of queue-pair endpoints over a TCP stream.

use super::DeadlineStream;
use crate::{Result, TransportError};
use std::io::{Read, Write};
use std::net::TcpStream;

/// Largest endpoint accepted from a peer.
const MAX_ENDPOINT_LEN: usize = 4096;

/// What a peer needs to connect to a queue pair: provider-defined bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QpEndpoint(pub Vec<u8>);

/// Sends `local` and receives the peer's endpoint on `stream` (both sides may call it; a
/// side that answers — a server — may instead [`read_endpoint`], get its queue pair ready
/// to receive, then [`write_endpoint`], so that the peer's first message never arrives
/// before it can be received).
pub fn exchange_endpoints(stream: &mut TcpStream, local: &QpEndpoint) -> Result<QpEndpoint> {
    write_endpoint(stream, local)?;
    read_endpoint(stream)
}

/// Sends `local` on `stream`.
pub fn write_endpoint(stream: &mut TcpStream, local: &QpEndpoint) -> Result<()> {
    let io = |e| TransportError::io("endpoint exchange", e);
    let len = u32::try_from(local.0.len())
        .ok()
        .filter(|&len| len as usize <= MAX_ENDPOINT_LEN)
        .ok_or(TransportError::InvalidArgument("endpoint too large"))?;
    stream.write_all(&len.to_le_bytes()).map_err(io)?;
    stream.write_all(&local.0).map_err(io)
}

/// Receives the peer's endpoint on `stream`.
///
/// The stream's read timeout, when set, bounds the whole endpoint, not each read: a peer
/// trickling its bytes cannot stretch the exchange past it.
pub fn read_endpoint(stream: &mut TcpStream) -> Result<QpEndpoint> {
    let io = |e| TransportError::io("endpoint exchange", e);
    let Some(limit) = stream.read_timeout().map_err(io)? else {
        return read_endpoint_from(stream);
    };
    let read = read_endpoint_from(&mut DeadlineStream::new(&mut *stream, limit));
    // The caller's per-read timeout again, for what it reads next.
    stream.set_read_timeout(Some(limit)).map_err(io)?;
    read
}

/// [`read_endpoint`] from any reader.
fn read_endpoint_from(stream: &mut impl Read) -> Result<QpEndpoint> {
    let io = |e| TransportError::io("endpoint exchange", e);
    let mut len_bytes = [0u8; 4];
    stream.read_exact(&mut len_bytes).map_err(io)?;
    let remote_len = u32::from_le_bytes(len_bytes) as usize;
    if remote_len > MAX_ENDPOINT_LEN {
        return Err(TransportError::BadEndpoint(format!(
            "peer sent {remote_len} bytes"
        )));
    }
    let mut remote = vec![0u8; remote_len];
    stream.read_exact(&mut remote).map_err(io)?;
    Ok(QpEndpoint(remote))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn both_sides_receive_the_other_endpoint() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            exchange_endpoints(&mut stream, &QpEndpoint(b"server".to_vec())).unwrap()
        });
        let mut client = TcpStream::connect(addr).unwrap();
        let got = exchange_endpoints(&mut client, &QpEndpoint(b"client".to_vec())).unwrap();
        assert_eq!(got.0, b"server");
        assert_eq!(server.join().unwrap().0, b"client");
    }

    #[test]
    fn a_peer_trickling_its_endpoint_runs_out_of_one_timeout() {
        // A length of 64, then one byte every 100 ms.
        let every = std::time::Duration::from_millis(100);
        let head = 64u32.to_le_bytes().to_vec();
        let (addr, trickler) = crate::api::deadline::trickler(head, every, 64);
        let mut client = TcpStream::connect(addr).unwrap();
        let limit = std::time::Duration::from_millis(500);
        client.set_read_timeout(Some(limit)).unwrap();
        let started = std::time::Instant::now();
        let refused = read_endpoint(&mut client).unwrap_err().to_string();
        assert!(started.elapsed() < limit * 3, "{:?}", started.elapsed());
        assert!(refused.contains("endpoint exchange"), "{refused}");
        assert_eq!(
            client.read_timeout().unwrap(),
            Some(limit),
            "the caller's timeout is back"
        );
        drop(client);
        trickler.join().unwrap();
    }

    #[test]
    fn oversized_peer_endpoint_is_refused() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            stream.write_all(&(1u32 << 20).to_le_bytes()).unwrap();
            let mut sink = Vec::new();
            let _ = stream.read_to_end(&mut sink);
        });
        let mut client = TcpStream::connect(addr).unwrap();
        let err = exchange_endpoints(&mut client, &QpEndpoint(vec![1])).unwrap_err();
        assert!(matches!(err, TransportError::BadEndpoint(_)), "{err}");
        drop(client);
        server.join().unwrap();
    }
}
