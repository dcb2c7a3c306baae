//! The backend URI, in the reference's form:
//! `redis://[user:password@]host[:port][/db][?cluster_name=...&timeout_ms=..&retry_count=..]`.
//!
//! Invariants: parsing never panics; every refusal is `IndexError::InvalidArgument` with a
//! message naming the part of the URI at fault; `rediss://` (TLS) is refused by name until it
//! is built; an unknown query parameter is refused, naming it (a typo must not be ignored).
//! User and password may be percent-encoded (`%40` for `@`).

use super::resp::Handshake;
use crate::IndexError;

/// Port used when the URI names none.
pub const DEFAULT_PORT: u16 = 6379;

/// What a `redis://` URI says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisUri {
    /// Host name or address (IPv6 without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Credentials and database.
    pub handshake: Handshake,
    /// The `cluster_name` parameter (accepted for compatibility; informational).
    pub cluster_name: Option<String>,
    /// `timeout_ms`: the per-call timeout, when the URI sets one (it overrides the caller's).
    pub timeout_ms: Option<u64>,
    /// `retry_count` (the reference's; accepted and checked, not used: kvcm retries a call
    /// a fixed 6 times with backoff, see `client`).
    pub retry_count: Option<u32>,
}

/// The query parameters of a URI.
#[derive(Debug, Default)]
struct Query {
    cluster_name: Option<String>,
    timeout_ms: Option<u64>,
    retry_count: Option<u32>,
}

impl RedisUri {
    /// `host:port`, bracketing an IPv6 host.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

fn invalid(uri: &str, message: impl std::fmt::Display) -> IndexError {
    IndexError::InvalidArgument(format!("redis uri {:?}: {message}", redacted(uri)))
}

/// The URI with any password replaced by `***`, for error messages.
pub fn redacted(uri: &str) -> String {
    match (uri.find("://"), uri.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &uri[scheme_end + 3..at];
            match userinfo.find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &uri[..scheme_end + 3],
                    &userinfo[..colon],
                    &uri[at..]
                ),
                None => uri.to_owned(),
            }
        }
        _ => uri.to_owned(),
    }
}

/// Parses a `redis://` URI.
pub fn parse(uri: &str) -> Result<RedisUri, IndexError> {
    let rest = match uri.split_once("://") {
        Some(("redis", rest)) => rest,
        Some(("rediss", _)) => {
            return Err(invalid(
                uri,
                "scheme rediss://: TLS is not built yet (use redis://)",
            ))
        }
        Some((scheme, _)) => return Err(invalid(uri, format!("scheme {scheme:?} is not redis"))),
        None => return Err(invalid(uri, "no scheme (expected redis://)")),
    };
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((userinfo, hostport)) => (Some(userinfo), hostport),
        None => (None, authority),
    };
    let (host, port) = parse_host_port(uri, hostport)?;
    let (user, password) = parse_userinfo(uri, userinfo)?;
    let query = parse_query(uri, query)?;
    Ok(RedisUri {
        host,
        port,
        handshake: Handshake {
            user,
            password,
            db: parse_db(uri, path)?,
        },
        cluster_name: query.cluster_name,
        timeout_ms: query.timeout_ms,
        retry_count: query.retry_count,
    })
}

fn parse_host_port(uri: &str, hostport: &str) -> Result<(String, u16), IndexError> {
    let (host, port) = if let Some(bracketed) = hostport.strip_prefix('[') {
        let (host, after) = bracketed
            .split_once(']')
            .ok_or_else(|| invalid(uri, "host: unclosed '[' of an IPv6 address"))?;
        match after {
            "" => (host, None),
            _ => match after.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => return Err(invalid(uri, "host: junk after the IPv6 address")),
            },
        }
    } else {
        match hostport.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (hostport, None),
        }
    };
    if host.is_empty() {
        return Err(invalid(uri, "host is empty"));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| invalid(uri, format!("port {port:?} is not 1..=65535")))?,
    };
    Ok((host.to_owned(), port))
}

type Credentials = (Option<String>, Option<String>);

fn parse_userinfo(uri: &str, userinfo: Option<&str>) -> Result<Credentials, IndexError> {
    let Some(userinfo) = userinfo else {
        return Ok((None, None));
    };
    let (user, password) = userinfo.split_once(':').ok_or_else(|| {
        invalid(
            uri,
            "user info must be user:password or :password (no ':' found)",
        )
    })?;
    let user = percent_decode(user).ok_or_else(|| invalid(uri, "user: bad percent-encoding"))?;
    let password =
        percent_decode(password).ok_or_else(|| invalid(uri, "password: bad percent-encoding"))?;
    Ok(((!user.is_empty()).then_some(user), Some(password)))
}

fn parse_db(uri: &str, path: &str) -> Result<u32, IndexError> {
    if path.is_empty() {
        return Ok(0);
    }
    path.parse()
        .map_err(|_| invalid(uri, format!("database {path:?} is not a number")))
}

fn parse_query(uri: &str, text: &str) -> Result<Query, IndexError> {
    let mut query = Query::default();
    let mut unknown = Vec::new();
    for pair in text.split('&').filter(|pair| !pair.is_empty()) {
        match pair.split_once('=').unwrap_or((pair, "")) {
            ("cluster_name", value) => query.cluster_name = Some(value.to_owned()),
            ("timeout_ms", value) => {
                let ms = value.parse().ok().filter(|&ms: &u64| ms > 0);
                let ms = ms.ok_or_else(|| invalid(uri, "timeout_ms must be a positive integer"))?;
                query.timeout_ms = Some(ms);
            }
            ("retry_count", value) => {
                let count = value
                    .parse()
                    .map_err(|_| invalid(uri, "retry_count must be a non-negative integer"))?;
                query.retry_count = Some(count);
            }
            (name, _) => unknown.push(name.to_owned()),
        }
    }
    if unknown.is_empty() {
        Ok(query)
    } else {
        Err(invalid(
            uri,
            format!(
                "unknown query parameter(s) {} (known: cluster_name, timeout_ms, retry_count)",
                unknown.join(", ")
            ),
        ))
    }
}

/// Decodes `%XX` escapes; `None` on a bad escape or bytes that are not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(uri: &str) -> String {
        match parse(uri) {
            Err(IndexError::InvalidArgument(message)) => message,
            other => panic!("{uri}: expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn parses_the_full_form() {
        let parsed =
            parse("redis://alice:p%40ss@cache.example:6380/3?cluster_name=c1").expect("valid");
        assert_eq!(parsed.host, "cache.example");
        assert_eq!(parsed.port, 6380);
        assert_eq!(parsed.handshake.user.as_deref(), Some("alice"));
        assert_eq!(parsed.handshake.password.as_deref(), Some("p@ss"));
        assert_eq!(parsed.handshake.db, 3);
        assert_eq!(parsed.cluster_name.as_deref(), Some("c1"));
        assert_eq!(parsed.address(), "cache.example:6380");
    }

    #[test]
    fn parses_short_forms() {
        let parsed = parse("redis://localhost").expect("valid");
        assert_eq!((parsed.port, parsed.handshake.db), (DEFAULT_PORT, 0));
        assert_eq!(parsed.handshake, Handshake::default());
        let parsed = parse("redis://:secret@[::1]:7000/").expect("valid");
        assert_eq!(parsed.handshake.user, None);
        assert_eq!(parsed.handshake.password.as_deref(), Some("secret"));
        assert_eq!(parsed.address(), "[::1]:7000");
    }

    #[test]
    fn refusals_name_the_part_at_fault() {
        assert!(message("rediss://h:1").contains("TLS is not built yet"));
        assert!(message("http://h:1").contains("scheme"));
        assert!(message("h:1").contains("no scheme"));
        assert!(message("redis://h:0").contains("port"));
        assert!(message("redis://h:99999").contains("port"));
        assert!(message("redis://h:x").contains("port"));
        assert!(message("redis://:6379").contains("host is empty"));
        assert!(message("redis://h:1/x").contains("database"));
        assert!(message("redis://nocolon@h:1").contains("user info"));
        assert!(message("redis://u:%zz@h:1").contains("password"));
        assert!(message("redis://[::1:1").contains("IPv6"));
        let unknown = message("redis://h:1?cluster_name=a&timeout=5&tls");
        assert!(unknown.contains("timeout, tls"), "{unknown}");
        assert!(message("redis://h:1?timeout_ms=0").contains("timeout_ms"));
        assert!(message("redis://h:1?retry_count=-1").contains("retry_count"));
        let tuned = parse("redis://h:1?timeout_ms=250&retry_count=3").expect("valid");
        assert_eq!((tuned.timeout_ms, tuned.retry_count), (Some(250), Some(3)));
    }

    #[test]
    fn errors_do_not_show_the_password() {
        let text = message("redis://u:hunter2@h:1/x");
        assert!(!text.contains("hunter2"), "{text}");
        assert_eq!(redacted("redis://u:pw@h:1"), "redis://u:***@h:1");
        assert_eq!(redacted("redis://h:1"), "redis://h:1");
    }
}
