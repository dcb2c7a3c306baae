//! Asks a server where an instance's table is: one HTTP/1.1 POST of
//! `/kvcm/v1/lookupBootstrap` over a plain TCP connection (no HTTP client dependency).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use kvcm::lookup::{BootstrapAnswer, BootstrapRequest, ROUTE};

use crate::error::FastError;

/// Largest answer accepted.
const MAX_ANSWER: u64 = 1 << 20;
/// Connect and read deadline.
const DEADLINE: Duration = Duration::from_secs(5);

/// The bootstrap answer of the server at `http` for `instance_id`.
pub(crate) fn fetch(http: SocketAddr, instance_id: &str) -> Result<BootstrapAnswer, FastError> {
    let broken =
        |what: &str, e: std::io::Error| FastError::Broken(format!("bootstrap {what}: {e}"));
    let body = serde_json::to_vec(&BootstrapRequest {
        instance_id: instance_id.to_string(),
    })
    .map_err(|e| FastError::Broken(e.to_string()))?;
    let mut stream =
        TcpStream::connect_timeout(&http, DEADLINE).map_err(|e| broken("connect", e))?;
    stream
        .set_read_timeout(Some(DEADLINE))
        .map_err(|e| broken("socket", e))?;
    let head = format!(
        "POST {ROUTE} HTTP/1.1\r\nHost: {http}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(&body))
        .map_err(|e| broken("send", e))?;
    let mut answer = Vec::new();
    stream
        .take(MAX_ANSWER)
        .read_to_end(&mut answer)
        .map_err(|e| broken("read", e))?;
    parse(&answer)
}

/// The answer of a raw HTTP response (status 200 and a JSON body; anything else refused).
fn parse(response: &[u8]) -> Result<BootstrapAnswer, FastError> {
    let text = std::str::from_utf8(response)
        .map_err(|_| FastError::Broken("bootstrap answer is not UTF-8".into()))?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| FastError::Broken("bootstrap answer has no body".into()))?;
    let status = head.split(' ').nth(1).unwrap_or("");
    if status != "200" {
        return Err(FastError::Broken(format!(
            "bootstrap answered {status}: {body}"
        )));
    }
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Err(FastError::Broken("bootstrap answer is chunked".into()));
    }
    serde_json::from_str(body).map_err(|e| FastError::Broken(format!("bootstrap answer: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_200_with_a_json_answer_is_taken() {
        let answer = BootstrapAnswer {
            format_version: 1,
            server_incarnation: 7,
            instance_id: "i".into(),
            connect: "127.0.0.1:1".into(),
            header_addr: 4096,
            layout_version: 3,
            wires: vec![],
        };
        let body = serde_json::to_string(&answer).unwrap();
        let ok = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        assert_eq!(parse(ok.as_bytes()).unwrap(), answer);
        let missing = "HTTP/1.1 404 Not Found\r\n\r\n{\"error\":\"instance\"}";
        assert!(
            matches!(parse(missing.as_bytes()), Err(FastError::Broken(m)) if m.contains("404"))
        );
        assert!(parse(b"garbage").is_err());
        assert!(parse(b"HTTP/1.1 200 OK\r\n\r\n{not json").is_err());
    }
}
