//! A minimal synchronous RESP2 client over a `std` TCP stream.
//!
//! Purpose: talk to Redis / Valkey without a heavy dependency. A [`Connection`] sends a
//! pipeline of [`Command`]s in one write and reads one [`Reply`] per command, in order.
//!
//! Invariants:
//! - a server error (`-ERR ...`) is a [`Reply::Error`] value, not a failure of the call, so
//!   one bad command of a pipeline does not hide the replies of the others;
//! - a malformed reply, a reply larger than the limits below, a timeout or an I/O error fail
//!   the call with [`RespError`] and leave the connection unusable (drop it);
//! - nothing here panics on what the server sends.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Largest bulk string accepted from a server (Redis' own limit, `proto-max-bulk-len`).
const MAX_BULK_LEN: usize = 512 << 20;
/// Largest array accepted from a server.
const MAX_ARRAY_LEN: usize = 1 << 24;
/// Longest status, error or integer line accepted.
const MAX_LINE_LEN: usize = 64 << 10;
/// Deepest nesting of arrays accepted.
const MAX_DEPTH: usize = 8;

/// One reply of the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`-style status.
    Status(String),
    /// `-ERR ...`: the server refused the command.
    Error(String),
    /// `:<n>`.
    Int(i64),
    /// `$<n>` bulk string; `None` for the null bulk string.
    Bulk(Option<Vec<u8>>),
    /// `*<n>` array; `None` for the null array.
    Array(Option<Vec<Reply>>),
}

/// Why a call on a connection failed.
#[derive(Debug, thiserror::Error)]
pub enum RespError {
    /// Connecting, writing or reading failed (timeouts included).
    #[error("i/o with the redis server failed")]
    Io(#[from] io::Error),
    /// The server sent something that is not valid RESP2 or exceeds a limit.
    #[error("malformed reply from the redis server: {0}")]
    Protocol(String),
    /// The server refused a command of the connection handshake (AUTH, SELECT).
    #[error("redis refused {command}: {message}")]
    Refused {
        /// The command refused.
        command: &'static str,
        /// The server's error message.
        message: String,
    },
}

/// One command, encoded as it is built: a RESP2 array of bulk strings.
#[derive(Debug, Clone)]
pub struct Command {
    count: usize,
    body: Vec<u8>,
}

impl Command {
    /// A command named `name` with no arguments yet.
    pub fn new(name: &str) -> Command {
        let mut command = Command {
            count: 0,
            body: Vec::with_capacity(64),
        };
        command.arg(name);
        command
    }

    /// Appends one argument.
    pub fn arg(&mut self, arg: impl AsRef<[u8]>) -> &mut Command {
        let arg = arg.as_ref();
        push_header(&mut self.body, b'$', arg.len());
        self.body.extend_from_slice(arg);
        self.body.extend_from_slice(b"\r\n");
        self.count += 1;
        self
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        push_header(out, b'*', self.count);
        out.extend_from_slice(&self.body);
    }
}

/// Appends `<kind><n>\r\n` without allocating.
fn push_header(out: &mut Vec<u8>, kind: u8, n: usize) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    out.push(kind);
    out.extend_from_slice(&digits[at..]);
    out.extend_from_slice(b"\r\n");
}

/// Credentials and database sent when a connection opens.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Handshake {
    /// ACL user; `None` for the default user.
    pub user: Option<String>,
    /// Password; `None` for no AUTH.
    pub password: Option<String>,
    /// Logical database (`SELECT`); 0 sends nothing.
    pub db: u32,
}

/// One open connection to a server.
#[derive(Debug)]
pub struct Connection {
    stream: BufReader<TcpStream>,
    out: Vec<u8>,
}

impl Connection {
    /// Connects to `addr` (`host:port`) within `timeout`; reads and writes time out after
    /// `timeout` too. Runs the handshake (AUTH, SELECT) before returning.
    pub fn open(addr: &str, timeout: Duration, handshake: &Handshake) -> Result<Self, RespError> {
        let stream = connect(addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.set_nodelay(true)?;
        let mut connection = Connection {
            stream: BufReader::with_capacity(64 << 10, stream),
            out: Vec::with_capacity(4 << 10),
        };
        connection.handshake(handshake)?;
        Ok(connection)
    }

    fn handshake(&mut self, handshake: &Handshake) -> Result<(), RespError> {
        if let Some(password) = &handshake.password {
            let mut auth = Command::new("AUTH");
            if let Some(user) = &handshake.user {
                auth.arg(user);
            }
            auth.arg(password);
            self.expect_ok("AUTH", &auth)?;
        }
        if handshake.db != 0 {
            let mut select = Command::new("SELECT");
            select.arg(handshake.db.to_string());
            self.expect_ok("SELECT", &select)?;
        }
        Ok(())
    }

    fn expect_ok(&mut self, name: &'static str, command: &Command) -> Result<(), RespError> {
        match self.call(command)? {
            Reply::Status(_) => Ok(()),
            Reply::Error(message) => Err(RespError::Refused {
                command: name,
                message,
            }),
            other => Err(RespError::Protocol(format!("{name} answered {other:?}"))),
        }
    }

    /// Sends one command and reads its reply.
    pub fn call(&mut self, command: &Command) -> Result<Reply, RespError> {
        let mut replies = self.pipeline(std::slice::from_ref(command))?;
        replies
            .pop()
            .ok_or_else(|| RespError::Protocol("no reply".to_owned()))
    }

    /// Sends every command in one write, then reads one reply per command, in order.
    pub fn pipeline(&mut self, commands: &[Command]) -> Result<Vec<Reply>, RespError> {
        self.out.clear();
        for command in commands {
            command.encode_into(&mut self.out);
        }
        self.stream.get_mut().write_all(&self.out)?;
        (0..commands.len())
            .map(|_| read_reply(&mut self.stream, 0))
            .collect()
    }

    /// True when the server has not closed the connection and nothing unread is waiting on it
    /// (a stale pooled connection is detected before a write is sent on it).
    pub fn is_usable(&self) -> bool {
        if !self.stream.buffer().is_empty() {
            return false;
        }
        let stream = self.stream.get_ref();
        if stream.set_nonblocking(true).is_err() {
            return false;
        }
        let idle =
            matches!(stream.peek(&mut [0u8; 1]), Err(e) if e.kind() == io::ErrorKind::WouldBlock);
        stream.set_nonblocking(false).is_ok() && idle
    }
}

fn connect(addr: &str, timeout: Duration) -> Result<TcpStream, RespError> {
    let mut last = io::Error::new(
        io::ErrorKind::NotFound,
        format!("{addr} resolves to nothing"),
    );
    for socket in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&socket, timeout) {
            Ok(stream) => return Ok(stream),
            Err(e) => last = e,
        }
    }
    Err(RespError::Io(last))
}

fn read_reply(input: &mut impl BufRead, depth: usize) -> Result<Reply, RespError> {
    if depth > MAX_DEPTH {
        return Err(RespError::Protocol("arrays nested too deep".to_owned()));
    }
    let line = read_line(input)?;
    let (kind, rest) = line
        .split_first()
        .ok_or_else(|| RespError::Protocol("empty line".to_owned()))?;
    match kind {
        b'+' => Ok(Reply::Status(text(rest))),
        b'-' => Ok(Reply::Error(text(rest))),
        b':' => Ok(Reply::Int(number(rest)?)),
        b'$' => read_bulk(input, number(rest)?),
        b'*' => read_array(input, number(rest)?, depth),
        other => Err(RespError::Protocol(format!(
            "unknown reply type byte 0x{other:02x}"
        ))),
    }
}

fn read_bulk(input: &mut impl BufRead, len: i64) -> Result<Reply, RespError> {
    let Some(len) = length(len, MAX_BULK_LEN, "bulk string")? else {
        return Ok(Reply::Bulk(None));
    };
    let mut data = vec![0; len + 2];
    input.read_exact(&mut data)?;
    if !data.ends_with(b"\r\n") {
        return Err(RespError::Protocol(
            "bulk string not ended by CRLF".to_owned(),
        ));
    }
    data.truncate(len);
    Ok(Reply::Bulk(Some(data)))
}

fn read_array(input: &mut impl BufRead, len: i64, depth: usize) -> Result<Reply, RespError> {
    let Some(len) = length(len, MAX_ARRAY_LEN, "array")? else {
        return Ok(Reply::Array(None));
    };
    let mut items = Vec::with_capacity(len.min(1024));
    for _ in 0..len {
        items.push(read_reply(input, depth + 1)?);
    }
    Ok(Reply::Array(Some(items)))
}

/// `None` for -1 (null), the length when within `max`, an error otherwise.
fn length(len: i64, max: usize, what: &str) -> Result<Option<usize>, RespError> {
    if len == -1 {
        return Ok(None);
    }
    usize::try_from(len)
        .ok()
        .filter(|&n| n <= max)
        .map(Some)
        .ok_or_else(|| RespError::Protocol(format!("{what} length {len} out of range")))
}

/// One line without its CRLF.
fn read_line(input: &mut impl BufRead) -> Result<Vec<u8>, RespError> {
    let mut line = Vec::new();
    let read = input
        .take(MAX_LINE_LEN as u64 + 2)
        .read_until(b'\n', &mut line)?;
    if read == 0 {
        return Err(RespError::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the server closed the connection",
        )));
    }
    if !line.ends_with(b"\r\n") {
        return Err(RespError::Protocol(
            "line too long or not ended by CRLF".to_owned(),
        ));
    }
    line.truncate(line.len() - 2);
    Ok(line)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn number(bytes: &[u8]) -> Result<i64, RespError> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| RespError::Protocol(format!("bad integer {:?}", text(bytes))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> Result<Reply, RespError> {
        read_reply(&mut &bytes[..], 0)
    }

    #[test]
    fn parses_every_reply_type() {
        let input = b"*5\r\n+OK\r\n-ERR no\r\n:-7\r\n$3\r\na\r\n\r\n$-1\r\n";
        let expected = Reply::Array(Some(vec![
            Reply::Status("OK".into()),
            Reply::Error("ERR no".into()),
            Reply::Int(-7),
            Reply::Bulk(Some(b"a\r\n".to_vec())),
            Reply::Bulk(None),
        ]));
        assert_eq!(parse(input).expect("valid"), expected);
        assert_eq!(parse(b"*-1\r\n").expect("null"), Reply::Array(None));
    }

    #[test]
    fn malformed_replies_are_errors() {
        for bad in [
            &b"?x\r\n"[..],
            b":12a\r\n",
            b"$5\r\nab\r\n",
            b"$2\r\nabcd",
            b"$-5\r\n",
            b"*99999999999\r\n",
            b"+OK\n",
            b"",
            b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
        ] {
            assert!(parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn commands_encode_as_arrays_of_bulk_strings() {
        let mut command = Command::new("SET");
        command.arg("k").arg(b"v\r\n");
        let mut out = Vec::new();
        command.encode_into(&mut out);
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nv\r\n\r\n");
        let mut header = Vec::new();
        for n in [0, 9, 10, 1234, usize::MAX] {
            header.clear();
            push_header(&mut header, b'$', n);
            assert_eq!(header, format!("${n}\r\n").into_bytes());
        }
    }
}
