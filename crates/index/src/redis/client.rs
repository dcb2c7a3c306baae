//! The connection pool of one index and the rules for retrying: reconnect with backoff,
//! follow cluster redirections, and never re-send a write that may have reached the server.
//!
//! An index talks to one node: the server of a single-node URI, or on a cluster the master of
//! its namespace's slot (found with `CLUSTER SLOTS` at start, updated on `MOVED`).
//!
//! Invariants:
//! - a call that fails before its command was sent (connect refused, stale pooled connection
//!   detected) is retried with backoff, up to [`ATTEMPTS`] times; a refused AUTH or SELECT is
//!   not retried;
//! - once a command was sent, an I/O failure or timeout is retried only for a
//!   [`Resend::Safe`] command (reads); a [`Resend::Never`] command (a write script) fails
//!   with [`ClientError::Unknown`]: the write may or may not have been applied, and the next
//!   read shows which — it is never reported as done;
//! - replies that say the command did not run (`MOVED`, `ASK`, `TRYAGAIN`, `LOADING`,
//!   `CLUSTERDOWN`) are retried for every command;
//! - at most [`MAX_IDLE`] idle connections are kept; a connection that failed is dropped.

use std::sync::Mutex;
use std::time::Duration;

use super::cluster::{self, Redirect};
use super::resp::{Command, Connection, Handshake, Reply, RespError};
use super::uri::RedisUri;

/// Tries of a call before it gives up.
pub const ATTEMPTS: u32 = 6;
/// Idle connections kept per index.
pub const MAX_IDLE: usize = 8;
/// Wait before the second try; doubled after each further failure.
const FIRST_BACKOFF: Duration = Duration::from_millis(20);
/// Longest wait between tries.
const MAX_BACKOFF: Duration = Duration::from_millis(500);
/// Redirections followed by one call.
const MAX_REDIRECTS: u32 = 5;

/// Whether a command may be sent again after it may have reached the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resend {
    /// Reads: sending twice is harmless.
    Safe,
    /// Writes: a second send could apply twice.
    Never,
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server could not be reached (or kept failing) on every try.
    #[error("redis at {addr} failed on {attempts} tries")]
    Unreachable {
        /// The node tried last.
        addr: String,
        /// Tries made.
        attempts: u32,
        /// The last failure.
        #[source]
        source: RespError,
    },
    /// A write was sent and its reply never came: it may or may not have been applied.
    #[error(
        "the connection to redis at {addr} failed after a write was sent; it may or may not \
         have been applied (read the keys to see)"
    )]
    Unknown {
        /// The node written to.
        addr: String,
        /// The failure.
        #[source]
        source: RespError,
    },
    /// The server refused the credentials or the database (not retried).
    #[error("redis at {addr} refused the connection's handshake")]
    Handshake {
        /// The node.
        addr: String,
        /// The refusal.
        #[source]
        source: RespError,
    },
    /// The cluster kept redirecting or its topology could not be read.
    #[error("redis cluster: {0}")]
    Cluster(String),
}

/// The node an index talks to and its idle connections.
#[derive(Debug)]
struct Target {
    addr: String,
    idle: Vec<Connection>,
}

/// Connections to the node that holds one hash tag's slot.
#[derive(Debug)]
pub struct Client {
    seed: RedisUri,
    timeout: Duration,
    /// `Some(slot)` on a Redis Cluster.
    slot: Option<u16>,
    target: Mutex<Target>,
}

/// One try's failure: whether it may be retried and why it failed.
enum TryError {
    Retry(RespError),
    Fatal(ClientError),
}

/// What an error reply means for the call.
enum Next {
    /// A real refusal: the caller gets the error reply.
    Refused,
    /// The slot moved; the owner is updated: try again at once.
    Moved,
    /// The slot is migrating: try this node once, after `ASKING`.
    Ask(String),
    /// The node could not run it now: retry after a backoff.
    Busy(RespError),
}

impl Client {
    /// Connects to the URI's node; on a cluster (`CLUSTER SLOTS` answers), to the master of
    /// `tag`'s slot.
    pub fn connect(seed: RedisUri, tag: &str, timeout: Duration) -> Result<Client, ClientError> {
        let client = Client {
            target: Mutex::new(Target {
                addr: seed.address(),
                idle: Vec::new(),
            }),
            slot: None,
            timeout,
            seed,
        };
        let mut slots = Command::new("CLUSTER");
        slots.arg("SLOTS");
        match client.call(&slots, Resend::Safe)? {
            Reply::Array(_) => {
                let slot = cluster::tag_slot(tag);
                let client = Client {
                    slot: Some(slot),
                    ..client
                };
                client.refresh_owner()?;
                Ok(client)
            }
            _ => Ok(client),
        }
    }

    /// True on a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.slot.is_some()
    }

    /// The node this client talks to now.
    pub fn address(&self) -> String {
        self.lock().addr.clone()
    }

    /// Sends `command` and returns its reply (which may be a server error reply).
    pub fn call(&self, command: &Command, resend: Resend) -> Result<Reply, ClientError> {
        let mut redirects = 0;
        let mut attempt = 0;
        let mut ask: Option<String> = None;
        loop {
            let asking = ask.is_some();
            let addr = ask.take().unwrap_or_else(|| self.address());
            let failure = match self.try_once(&addr, asking, command, resend) {
                Ok(Reply::Error(error)) => match self.after_error(&error, &mut redirects)? {
                    Next::Refused => return Ok(Reply::Error(error)),
                    Next::Moved => continue,
                    Next::Ask(to) => {
                        ask = Some(to);
                        continue;
                    }
                    Next::Busy(failure) => failure,
                },
                Ok(reply) => return Ok(reply),
                Err(TryError::Fatal(error)) => return Err(error),
                Err(TryError::Retry(failure)) => failure,
            };
            attempt += 1;
            if attempt >= ATTEMPTS {
                return Err(ClientError::Unreachable {
                    addr,
                    attempts: attempt,
                    source: failure,
                });
            }
            std::thread::sleep(backoff(attempt));
            if self.is_cluster() {
                // Best effort: a failed refresh leaves the owner as it was, and the next try's
                // failure is the one reported.
                let _ = self.refresh_owner();
            }
        }
    }

    /// What to do after an error reply: return it, or retry (following a redirection).
    fn after_error(&self, error: &str, redirects: &mut u32) -> Result<Next, ClientError> {
        let transient = ["TRYAGAIN", "LOADING", "CLUSTERDOWN", "MASTERDOWN"];
        if transient.iter().any(|word| error.starts_with(word)) {
            return Ok(Next::Busy(RespError::Protocol(format!(
                "server busy: {error}"
            ))));
        }
        let Some(redirect) = cluster::redirect(error) else {
            return Ok(Next::Refused);
        };
        *redirects += 1;
        if *redirects > MAX_REDIRECTS {
            return Err(ClientError::Cluster(format!(
                "more than {MAX_REDIRECTS} redirections (last: {error})"
            )));
        }
        Ok(match redirect {
            Redirect::Moved(addr) => {
                self.retarget(self.full_address(&addr));
                Next::Moved
            }
            Redirect::Ask(addr) => Next::Ask(self.full_address(&addr)),
        })
    }

    /// One send on a pooled or new connection to `addr`, preceded by `ASKING` if `asking`.
    fn try_once(
        &self,
        addr: &str,
        asking: bool,
        command: &Command,
        resend: Resend,
    ) -> Result<Reply, TryError> {
        let mut connection = self.checkout(addr).map_err(|failure| match failure {
            RespError::Refused { .. } => TryError::Fatal(ClientError::Handshake {
                addr: addr.to_owned(),
                source: failure,
            }),
            failure => TryError::Retry(failure),
        })?;
        let sent = match asking {
            true => connection
                .pipeline(&[Command::new("ASKING"), command.clone()])
                .and_then(|mut replies| {
                    replies
                        .pop()
                        .ok_or_else(|| RespError::Protocol("no reply".to_owned()))
                }),
            false => connection.call(command),
        };
        match sent {
            Ok(reply) => {
                self.checkin(addr, connection);
                Ok(reply)
            }
            Err(failure) if resend == Resend::Safe => Err(TryError::Retry(failure)),
            Err(failure) => Err(TryError::Fatal(ClientError::Unknown {
                addr: addr.to_owned(),
                source: failure,
            })),
        }
    }

    fn checkout(&self, addr: &str) -> Result<Connection, RespError> {
        loop {
            let pooled = {
                let mut target = self.lock();
                if target.addr != addr {
                    None
                } else {
                    target.idle.pop()
                }
            };
            match pooled {
                Some(connection) if connection.is_usable() => return Ok(connection),
                Some(_stale) => continue,
                None => return Connection::open(addr, self.timeout, self.handshake()),
            }
        }
    }

    fn checkin(&self, addr: &str, connection: Connection) {
        let mut target = self.lock();
        if target.addr == addr && target.idle.len() < MAX_IDLE {
            target.idle.push(connection);
        }
    }

    fn handshake(&self) -> &Handshake {
        &self.seed.handshake
    }

    fn retarget(&self, addr: String) {
        let mut target = self.lock();
        if target.addr != addr {
            target.addr = addr;
            target.idle.clear();
        }
    }

    /// Re-reads the owner of the slot from the seed node (and, failing that, the current one).
    fn refresh_owner(&self) -> Result<(), ClientError> {
        let Some(slot) = self.slot else {
            return Ok(());
        };
        let mut slots = Command::new("CLUSTER");
        slots.arg("SLOTS");
        let mut last = String::from("no node answered");
        for addr in [self.seed.address(), self.address()] {
            let reply = Connection::open(&addr, self.timeout, self.handshake())
                .and_then(|mut connection| connection.call(&slots));
            match reply.map(|reply| cluster::slot_owner(&reply, slot, &self.seed.host)) {
                Ok(Ok(Some(owner))) => {
                    self.retarget(owner);
                    return Ok(());
                }
                Ok(Ok(None)) => last = format!("no node serves slot {slot}"),
                Ok(Err(message)) => last = message,
                Err(failure) => last = format!("{addr}: {failure}"),
            }
        }
        Err(ClientError::Cluster(last))
    }

    /// `host:port` of a redirection, the seed host standing for an empty host.
    fn full_address(&self, addr: &str) -> String {
        match addr.strip_prefix(':') {
            Some(port) => format!("{}:{port}", self.seed.host),
            None => addr.to_owned(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Target> {
        // The target holds no invariant a panic could break (an address and idle sockets).
        self.target
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Wait after the `attempt`-th failed try.
fn backoff(attempt: u32) -> Duration {
    FIRST_BACKOFF
        .saturating_mul(1 << attempt.saturating_sub(1).min(10))
        .min(MAX_BACKOFF)
}
