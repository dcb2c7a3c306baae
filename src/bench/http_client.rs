//! A minimal keep-alive HTTP/1.1 client for the benchmark (one request in flight per
//! connection; responses must carry Content-Length, as axum's do).

use std::net::SocketAddr;

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One persistent connection.
pub struct HttpConnection {
    stream: TcpStream,
    buffer: Vec<u8>,
}

impl HttpConnection {
    /// Connects with Nagle off.
    pub async fn connect(address: SocketAddr) -> anyhow::Result<Self> {
        let stream = TcpStream::connect(address).await?;
        stream.set_nodelay(true)?;
        Ok(HttpConnection {
            stream,
            buffer: Vec::with_capacity(64 << 10),
        })
    }

    /// POSTs `body` to `path`; returns the response body.
    pub async fn post(&mut self, path: &str, body: &[u8]) -> anyhow::Result<Vec<u8>> {
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let mut request = head.into_bytes();
        request.extend_from_slice(body);
        self.stream.write_all(&request).await?;
        self.buffer.clear();
        let head_end = loop {
            if let Some(end) = self.buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            self.read_more().await?;
        };
        let head = std::str::from_utf8(&self.buffer[..head_end])?.to_ascii_lowercase();
        if !head.starts_with("http/1.1 200") {
            bail!("unexpected response: {head}");
        }
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .context("no content-length")?
            .trim()
            .parse()?;
        while self.buffer.len() < head_end + length {
            self.read_more().await?;
        }
        Ok(self.buffer[head_end..head_end + length].to_vec())
    }

    async fn read_more(&mut self) -> anyhow::Result<()> {
        let mut chunk = [0u8; 16 << 10];
        let read = self.stream.read(&mut chunk).await?;
        if read == 0 {
            bail!("connection closed");
        }
        self.buffer.extend_from_slice(&chunk[..read]);
        Ok(())
    }
}
