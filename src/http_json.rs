//! A minimal blocking HTTP/1.1 JSON client for kvcm's own routes (lookup bootstrap, pool
//! membership): one POST per connection (`Connection: close`), over TLS when the server
//! serves it ([`TlsClient`]), the whole answer read up to a size limit; only a 200 with a
//! JSON body is an answer. No HTTP client dependency.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use kvcm_transport::DeadlineStream;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::tls_client::TlsClient;

/// Largest answer accepted.
const MAX_ANSWER: u64 = 1 << 20;

/// Why a POST got no answer.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    /// The connection failed.
    #[error("{what}: {source}")]
    Io {
        /// Which step failed.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The server answered another status.
    #[error("answered {status}: {body}")]
    Status {
        /// The HTTP status.
        status: u16,
        /// The answer's body.
        body: String,
    },
    /// The answer is not HTTP with a JSON body of the expected shape.
    #[error("malformed answer: {0}")]
    Malformed(String),
}

/// POSTs `body` as JSON to `route` at `addr` and decodes the 200 answer.
pub fn post_json<A: DeserializeOwned>(
    addr: SocketAddr,
    route: &str,
    body: &impl Serialize,
    deadline: Duration,
) -> Result<A, PostError> {
    post_json_with(addr, route, body, deadline, None, None)
}

/// As [`post_json`], with `Authorization: Bearer <bearer>` when given (a bearer that could
/// break the request head is refused as malformed), over TLS when `tls` is given.
pub fn post_json_with<A: DeserializeOwned>(
    addr: SocketAddr,
    route: &str,
    body: &impl Serialize,
    deadline: Duration,
    bearer: Option<&str>,
    tls: Option<&TlsClient>,
) -> Result<A, PostError> {
    let io = |what| move |source| PostError::Io { what, source };
    let body = serde_json::to_vec(body).map_err(|e| PostError::Malformed(e.to_string()))?;
    let authorization = match bearer {
        Some(token) if token.bytes().all(|b| b.is_ascii_graphic()) => {
            format!("Authorization: Bearer {token}\r\n")
        }
        Some(_) => {
            return Err(PostError::Malformed(
                "a bearer token that is not visible ASCII".into(),
            ))
        }
        None => String::new(),
    };
    let stream = TcpStream::connect_timeout(&addr, deadline).map_err(io("connect"))?;
    // One deadline for the TLS handshake, the request and the whole answer, however slowly
    // the server trickles its bytes.
    let stream = DeadlineStream::new(stream, deadline);
    let head = format!(
        "POST {route} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n{authorization}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let answer = match tls {
        Some(tls) => exchange(tls.wrap(stream).map_err(io("TLS"))?, &head, &body),
        None => exchange(stream, &head, &body),
    }?;
    parse_response(&answer)
}

/// Sends `head` and `body` on `stream`, then reads the answer to its end.
fn exchange(mut stream: impl Read + Write, head: &str, body: &[u8]) -> Result<Vec<u8>, PostError> {
    let io = |what| move |source| PostError::Io { what, source };
    stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(body))
        .and_then(|()| stream.flush())
        .map_err(io("send"))?;
    let mut answer = Vec::new();
    match stream.take(MAX_ANSWER).read_to_end(&mut answer) {
        Ok(_) => Ok(answer),
        // A TLS peer that closes without close_notify after its whole answer: the answer is
        // still checked (a cut one fails to parse).
        Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof && !answer.is_empty() => {
            Ok(answer)
        }
        Err(error) => Err(io("read")(error)),
    }
}

/// The JSON body of a raw HTTP response with status 200 (anything else refused).
pub fn parse_response<A: DeserializeOwned>(response: &[u8]) -> Result<A, PostError> {
    let malformed = |what: &str| PostError::Malformed(what.to_string());
    let text = std::str::from_utf8(response).map_err(|_| malformed("not UTF-8"))?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| malformed("no body"))?;
    let status = head.split(' ').nth(1).unwrap_or("");
    let status: u16 = status.parse().map_err(|_| malformed("no status"))?;
    if status != 200 {
        return Err(PostError::Status {
            status,
            body: body.to_string(),
        });
    }
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Err(malformed("chunked"));
    }
    serde_json::from_str(body).map_err(|e| PostError::Malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_200_with_a_json_body_of_the_right_shape_is_taken() {
        let ok = "HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\n{\"a\":1}";
        let value: serde_json::Value = parse_response(ok.as_bytes()).unwrap();
        assert_eq!(value["a"], 1);
        let missing = "HTTP/1.1 404 Not Found\r\n\r\n{\"error\":\"instance\"}";
        assert!(matches!(
            parse_response::<serde_json::Value>(missing.as_bytes()),
            Err(PostError::Status { status: 404, body }) if body.contains("instance")
        ));
        for bad in [
            &b"garbage"[..],
            b"HTTP/1.1 200 OK\r\n\r\n{not json",
            b"\xff\xfe",
        ] {
            assert!(matches!(
                parse_response::<serde_json::Value>(bad),
                Err(PostError::Malformed(_))
            ));
        }
        let chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{}";
        assert!(parse_response::<serde_json::Value>(chunked.as_bytes()).is_err());
    }

    #[test]
    fn a_server_trickling_its_answer_runs_out_of_the_deadline() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let trickler = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request);
            // One byte every 50 ms: every read is quick, the answer never ends.
            for _ in 0..200 {
                std::thread::sleep(Duration::from_millis(50));
                if stream.write_all(b"H").is_err() {
                    return;
                }
            }
        });
        let deadline = Duration::from_millis(400);
        let started = std::time::Instant::now();
        let answer = post_json::<serde_json::Value>(addr, "/r", &serde_json::json!({}), deadline);
        assert!(
            matches!(&answer, Err(PostError::Io { what: "read", source })
                if source.kind() == std::io::ErrorKind::TimedOut),
            "{answer:?}"
        );
        assert!(started.elapsed() < deadline * 2, "{:?}", started.elapsed());
        trickler.join().unwrap();
    }
}
