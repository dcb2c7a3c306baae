//! The metadata index on Redis / Valkey, single node or Redis Cluster.
//!
//! [`RedisIndex`] stores one key space (a *namespace*, e.g. an instance id) in two Redis keys
//! under one hash tag (`layout`): a HASH field → value and a ZSET of the same fields.
//!
//! **Why one hash tag per namespace.** Every multi-key operation — a batch put, a
//! `read_modify_write` over many keys, a scan page — stays in one cluster slot, so each write
//! is one atomic Lua script and no operation ever needs cross-slot coordination. The price:
//! one namespace lives on one shard (its memory and its write rate are bounded by one master);
//! scale-out is across namespaces (instances), which spread over the masters by their tags.
//!
//! Invariants:
//! - every write (`put`, `delete`, `read_modify_write`) is one run of the write script
//!   (`scripts`), atomic over all its keys, which changes hash and zset together and refuses
//!   (changing nothing) a write that would pass the key cap;
//! - `read_modify_write` is optimistic: it reads the keys (`HMGET`), runs the caller's closure
//!   in Rust once per key occurrence in request order (a key listed twice sees its first
//!   modification), then the script applies the result only if every key still holds the
//!   bytes that were read; otherwise it reads again and re-runs the closure (at most
//!   [`RMW_TRIES`] tries). So under contention the closure may run more than once per key; only
//!   the last run's result is applied, and no other write lands between that run's read and
//!   its write;
//! - `get` answers from one `HMGET` (atomic), `scan` pages by `ZRANGEBYLEX` from a cursor
//!   (pages cover disjoint consecutive key ranges: a key present for the whole scan comes back
//!   exactly once), `sample` is `HRANDFIELD <count>` (distinct fields), `len` is `HLEN`;
//! - connection failures are retried with backoff (`client`); a write whose reply was lost
//!   fails with `IndexError::Backend` ("may or may not have been applied"), never `Ok`;
//! - a value that does not decode, a key field that is not 8 bytes, or an unexpected reply is
//!   `IndexError::Backend` naming what was wrong; nothing panics on what Redis holds.

mod client;
mod cluster;
mod codec;
mod layout;
pub mod resp;
mod scripts;
mod uri;

use std::collections::HashMap;
use std::error::Error;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;

use crate::{BlockKey, IndexError, MetaIndex, Modify, ScanCursor, ScanPage};
use resp::{Command, Reply};
use scripts::{Outcome, WriteBatch};

pub use client::{Client, ClientError, Resend};
pub use cluster::{crc16, tag_slot};
pub use codec::{BytesCodec, U64Codec, ValueCodec};
pub use uri::{parse as parse_uri, redacted as redacted_uri, RedisUri};

/// Tries of one `read_modify_write` against concurrent writers before it gives up.
pub const RMW_TRIES: u32 = 64;
/// Keys per `HMGET` of a large `get`.
const GET_CHUNK: usize = 8192;
/// Longest wait between two tries of a contended `read_modify_write`.
const MAX_RMW_BACKOFF_MICROS: u64 = 5_000;

/// How to reach and shape one Redis index.
#[derive(Clone)]
pub struct RedisIndexConfig {
    /// `redis://[user:password@]host:port[/db][?cluster_name=...]`.
    pub uri: String,
    /// The key space's name (an instance id); it is the hash tag of its Redis keys.
    pub namespace: String,
    /// Key cap (`u64::MAX`: none).
    pub max_key_count: u64,
    /// Connect, read and write timeout of each connection (above zero).
    pub timeout: Duration,
}

/// Shows the URI with its password masked.
impl std::fmt::Debug for RedisIndexConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisIndexConfig")
            .field("uri", &uri::redacted(&self.uri))
            .field("namespace", &self.namespace)
            .field("max_key_count", &self.max_key_count)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// The metadata index of one namespace on Redis. See the module doc for the layout.
pub struct RedisIndex<V, C> {
    client: Client,
    layout: layout::Layout,
    max_key_count: u64,
    codec: C,
    /// SHA1 of the write script, from `SCRIPT LOAD`.
    script_sha: String,
    /// The writer's fencing token (the leader's), read at each write; `None`: unfenced.
    fence: Option<Arc<AtomicU64>>,
    values: PhantomData<fn() -> V>,
}

impl<V, C> std::fmt::Debug for RedisIndex<V, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisIndex")
            .field("node", &self.client.address())
            .field("cluster", &self.client.is_cluster())
            .field("namespace", &self.layout.tag)
            .field("max_key_count", &self.max_key_count)
            .finish()
    }
}

/// `IndexError::Backend` with the message of `error` and of each of its sources.
fn backend(error: &dyn Error) -> IndexError {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    IndexError::Backend(message)
}

impl From<ClientError> for IndexError {
    fn from(error: ClientError) -> IndexError {
        backend(&error)
    }
}

fn unexpected(command: &str, reply: &Reply) -> IndexError {
    match reply {
        Reply::Error(message) => IndexError::Backend(format!("redis refused {command}: {message}")),
        other => IndexError::Backend(format!("redis answered {command} with {other:?}")),
    }
}

impl<V, C: ValueCodec<V>> RedisIndex<V, C> {
    /// Connects (finding the slot's master on a cluster) and loads the write script.
    pub fn connect(config: RedisIndexConfig, codec: C) -> Result<Self, IndexError> {
        let uri = uri::parse(&config.uri)?;
        let layout = layout::Layout::new(&config.namespace)?;
        if config.timeout.is_zero() {
            return Err(IndexError::InvalidArgument(
                "redis timeout must be above zero".to_owned(),
            ));
        }
        let timeout = uri.timeout_ms.map_or(config.timeout, Duration::from_millis);
        let client = Client::connect(uri.clone(), &layout.tag, timeout)?;
        if client.is_cluster() && uri.handshake.db != 0 {
            return Err(IndexError::InvalidArgument(format!(
                "redis uri: database {} on a Redis Cluster (only 0 exists there)",
                uri.handshake.db
            )));
        }
        let mut load = Command::new("SCRIPT");
        load.arg("LOAD").arg(scripts::WRITE);
        let script_sha = match client.call(&load, Resend::Safe)? {
            Reply::Bulk(Some(sha)) => String::from_utf8_lossy(&sha).into_owned(),
            other => return Err(unexpected("SCRIPT LOAD", &other)),
        };
        Ok(RedisIndex {
            client,
            layout,
            max_key_count: config.max_key_count,
            codec,
            script_sha,
            fence: None,
            values: PhantomData,
        })
    }

    /// Makes every write carry the token `fence` holds at that moment: once a write with a
    /// greater token reached the namespace, this index's writes fail with
    /// [`IndexError::Fenced`] and change nothing.
    pub fn fenced_by(mut self, fence: Arc<AtomicU64>) -> Self {
        self.fence = Some(fence);
        self
    }

    /// The node this index talks to now (`host:port`).
    pub fn node(&self) -> String {
        self.client.address()
    }

    /// True when the URI's server is part of a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.client.is_cluster()
    }

    /// The Redis keys of this index: the value HASH and the order ZSET.
    pub fn redis_keys(&self) -> [&str; 2] {
        [&self.layout.values, &self.layout.order]
    }

    /// Applies `changes` in one atomic write (one run of the write script, fenced like every
    /// write): per key the last change wins, `Some` stores the value, `None` removes the key.
    /// Its outcome is the same however often it runs, so a write whose reply was lost is sent
    /// again: the caller must keep other writes to these keys out meanwhile (the manager's
    /// shared store writes under the index's key locks; other nodes are fenced).
    pub fn apply(&self, changes: &[(BlockKey, Option<V>)]) -> Result<(), IndexError> {
        let mut last: HashMap<BlockKey, &Option<V>> = HashMap::with_capacity(changes.len());
        for (key, change) in changes {
            last.insert(*key, change);
        }
        let mut batch = WriteBatch::default();
        for (key, change) in last {
            let field = layout::field(key);
            match change {
                Some(value) => {
                    batch.puts.push((field, self.codec.encode(value)));
                    batch.new_members.push(field);
                }
                None => batch.deletes.push(field),
            }
        }
        if self.max_key_count != u64::MAX {
            batch.uncertain.clone_from(&batch.new_members);
        }
        self.write_unchecked(&batch, Resend::Safe).map(drop)
    }

    /// Raises the namespace's fence to this index's token without writing anything else: from
    /// now on, writes carrying an older token are refused. An unfenced index does nothing.
    pub fn raise_fence(&self) -> Result<(), IndexError> {
        self.fenced_script(scripts::FENCE, &[&self.layout.fence])
    }

    /// Removes every key of the namespace (fenced like a write; the fence stays).
    pub fn drop_all(&self) -> Result<(), IndexError> {
        let keys = [&self.layout.fence, &self.layout.values, &self.layout.order];
        self.fenced_script(scripts::DROP, &keys)
    }

    /// Runs `script` (`FENCE` or `DROP`) with this index's token; `Fenced` when refused. Both
    /// end in the same state however often they run: a lost reply is sent again.
    fn fenced_script(&self, script: &str, keys: &[&String]) -> Result<(), IndexError> {
        let Some(fence) = &self.fence else {
            if script == scripts::FENCE {
                return Ok(());
            }
            let mut unlink = Command::new("UNLINK");
            unlink.arg(&self.layout.values).arg(&self.layout.order);
            return self
                .client
                .call(&unlink, Resend::Safe)
                .map(drop)
                .map_err(Into::into);
        };
        let token = fence.load(Ordering::Acquire);
        let mut eval = Command::new("EVAL");
        eval.arg(script).arg(keys.len().to_string());
        for key in keys {
            eval.arg(key.as_str());
        }
        eval.arg(token.to_string());
        match self.client.call(&eval, Resend::Safe)? {
            Reply::Int(1) => Ok(()),
            Reply::Status(status) if status == scripts::FENCED => Err(IndexError::Fenced { token }),
            other => Err(unexpected("a fence script", &other)),
        }
    }

    fn decode(&self, key: BlockKey, bytes: &[u8]) -> Result<V, IndexError> {
        self.codec.decode(bytes).map_err(|message| {
            IndexError::Backend(format!(
                "corrupt redis index: the value of key {key} in {}: {message}",
                self.layout.values
            ))
        })
    }

    /// Raw values of `keys` (distinct or not), in order.
    fn read_raw(&self, keys: &[BlockKey]) -> Result<Vec<Option<Vec<u8>>>, IndexError> {
        let mut values = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(GET_CHUNK) {
            let mut hmget = Command::new("HMGET");
            hmget.arg(&self.layout.values);
            for &key in chunk {
                hmget.arg(layout::field(key));
            }
            match self.client.call(&hmget, Resend::Safe)? {
                Reply::Array(Some(items)) if items.len() == chunk.len() => {
                    values.extend(items.into_iter().map(bulk).collect::<Result<Vec<_>, _>>()?);
                }
                other => return Err(unexpected("HMGET", &other)),
            }
        }
        Ok(values)
    }

    /// Runs the write script once (EVALSHA, EVAL when the server lost its script cache).
    fn run_write(&self, batch: &WriteBatch, resend: Resend) -> Result<Outcome, IndexError> {
        let keys = [
            self.layout.values.as_str(),
            &self.layout.order,
            &self.layout.fence,
        ];
        let token = self.fence.as_ref().map(|f| f.load(Ordering::Acquire));
        let by_sha = batch.command(Some(&self.script_sha), keys, self.max_key_count, token);
        let reply = match self.client.call(&by_sha, resend)? {
            Reply::Error(message) if message.starts_with("NOSCRIPT") => {
                let by_text = batch.command(None, keys, self.max_key_count, token);
                self.client.call(&by_text, resend)?
            }
            reply => reply,
        };
        if matches!(&reply, Reply::Status(status) if status == scripts::FENCED) {
            return Err(IndexError::Fenced {
                token: token.unwrap_or(0),
            });
        }
        scripts::outcome(&reply).map_err(|_| unexpected("the write script", &reply))
    }

    /// Runs a write that checks nothing (put, delete): it cannot conflict.
    fn write_unchecked(&self, batch: &WriteBatch, resend: Resend) -> Result<u64, IndexError> {
        if batch.is_noop() {
            return Ok(0);
        }
        match self.run_write(batch, resend)? {
            Outcome::Applied(removed) => Ok(removed),
            Outcome::Full => Err(IndexError::Full {
                max: self.max_key_count,
            }),
            Outcome::Conflict => Err(IndexError::Backend(
                "the write script reported a conflict for a write without checks".to_owned(),
            )),
        }
    }

    /// One optimistic try of `read_modify_write`; `Ok(false)` on a conflict.
    fn try_read_modify_write(
        &self,
        keys: &[BlockKey],
        f: &mut dyn FnMut(BlockKey, Option<&V>) -> Modify<V>,
    ) -> Result<bool, IndexError> {
        let distinct = distinct(keys);
        let raw = self.read_raw(&distinct)?;
        let mut slots: Vec<Slot<V>> = Vec::with_capacity(distinct.len());
        for (&key, bytes) in distinct.iter().zip(&raw) {
            let current = bytes.as_deref().map(|b| self.decode(key, b)).transpose()?;
            slots.push(Slot {
                current,
                changed: false,
            });
        }
        let position: HashMap<BlockKey, usize> =
            distinct.iter().enumerate().map(|(i, &k)| (k, i)).collect();
        for &key in keys {
            let slot = &mut slots[position[&key]];
            match f(key, slot.current.as_ref()) {
                Modify::Keep => {}
                Modify::Put(value) => (slot.current, slot.changed) = (Some(value), true),
                Modify::Delete => (slot.current, slot.changed) = (None, true),
            }
        }
        let batch = self.checked_batch(&distinct, raw, &slots);
        if batch.is_noop() {
            return Ok(true);
        }
        match self.run_write(&batch, Resend::Never)? {
            Outcome::Applied(_) => Ok(true),
            Outcome::Conflict => Ok(false),
            Outcome::Full => Err(IndexError::Full {
                max: self.max_key_count,
            }),
        }
    }

    /// The script batch of a read-modify-write: check every key read, apply the changes.
    fn checked_batch(
        &self,
        keys: &[BlockKey],
        raw: Vec<Option<Vec<u8>>>,
        slots: &[Slot<V>],
    ) -> WriteBatch {
        let mut batch = WriteBatch::default();
        for ((&key, read), slot) in keys.iter().zip(raw).zip(slots) {
            let field = layout::field(key);
            let was_present = read.is_some();
            match read {
                Some(bytes) => batch.expect_present.push((field, bytes)),
                None => batch.expect_absent.push(field),
            }
            match (&slot.current, slot.changed) {
                (Some(value), true) => {
                    batch.puts.push((field, self.codec.encode(value)));
                    if !was_present {
                        batch.new_members.push(field);
                        batch.known_growth += 1;
                    }
                }
                (None, true) if was_present => {
                    batch.deletes.push(field);
                    batch.known_growth -= 1;
                }
                _ => {}
            }
        }
        batch
    }
}

/// One distinct key of a read-modify-write: its value as the closure left it.
struct Slot<V> {
    current: Option<V>,
    changed: bool,
}

/// `keys` without repeats, in order of first occurrence.
fn distinct(keys: &[BlockKey]) -> Vec<BlockKey> {
    let mut seen = std::collections::HashSet::with_capacity(keys.len());
    keys.iter()
        .copied()
        .filter(|key| seen.insert(*key))
        .collect()
}

fn bulk(reply: Reply) -> Result<Option<Vec<u8>>, IndexError> {
    match reply {
        Reply::Bulk(bytes) => Ok(bytes),
        other => Err(unexpected("HMGET (an element)", &other)),
    }
}

/// Keys of an array of 8-byte fields.
fn field_keys(command: &str, reply: &Reply) -> Result<Vec<BlockKey>, IndexError> {
    let Reply::Array(Some(items)) = reply else {
        return Err(unexpected(command, reply));
    };
    items
        .iter()
        .map(|item| match item {
            Reply::Bulk(Some(field)) => layout::key_of(field),
            other => Err(unexpected(command, other)),
        })
        .collect()
}

/// A short random wait before the `attempt`-th retry of a contended write.
fn contention_backoff(attempt: u32) {
    let ceiling = (50u64 << attempt.min(10)).min(MAX_RMW_BACKOFF_MICROS);
    let micros = rand::rng().random_range(0..=ceiling);
    std::thread::sleep(Duration::from_micros(micros));
}

impl<V, C: ValueCodec<V>> MetaIndex<V> for RedisIndex<V, C> {
    fn get(&self, keys: &[BlockKey]) -> Result<Vec<Option<V>>, IndexError> {
        let raw = self.read_raw(keys)?;
        keys.iter()
            .zip(raw)
            .map(|(&key, bytes)| bytes.map(|b| self.decode(key, &b)).transpose())
            .collect()
    }

    fn put(&self, entries: Vec<(BlockKey, V)>) -> Result<(), IndexError> {
        let mut last: HashMap<BlockKey, usize> = HashMap::with_capacity(entries.len());
        let mut batch = WriteBatch::default();
        for (key, value) in &entries {
            let encoded = (layout::field(*key), self.codec.encode(value));
            match last.get(key) {
                Some(&at) => batch.puts[at] = encoded,
                None => {
                    last.insert(*key, batch.puts.len());
                    batch.new_members.push(encoded.0);
                    batch.puts.push(encoded);
                }
            }
        }
        if self.max_key_count != u64::MAX {
            batch.uncertain.clone_from(&batch.new_members);
        }
        self.write_unchecked(&batch, Resend::Never).map(|_| ())
    }

    fn delete(&self, keys: &[BlockKey]) -> Result<usize, IndexError> {
        let batch = WriteBatch {
            deletes: distinct(keys).into_iter().map(layout::field).collect(),
            ..WriteBatch::default()
        };
        self.write_unchecked(&batch, Resend::Never)
            .map(|removed| removed as usize)
    }

    fn read_modify_write(
        &self,
        keys: &[BlockKey],
        f: &mut dyn FnMut(BlockKey, Option<&V>) -> Modify<V>,
    ) -> Result<(), IndexError> {
        if keys.is_empty() {
            return Ok(());
        }
        for attempt in 0..RMW_TRIES {
            if self.try_read_modify_write(keys, f)? {
                return Ok(());
            }
            contention_backoff(attempt);
        }
        Err(IndexError::Backend(format!(
            "contention: read_modify_write of {} keys conflicted with other writers {RMW_TRIES} \
             times in a row",
            keys.len()
        )))
    }

    fn scan(&self, cursor: ScanCursor, limit: usize) -> Result<ScanPage, IndexError> {
        if limit == 0 {
            return Err(IndexError::InvalidArgument(
                "scan limit must be at least 1".to_owned(),
            ));
        }
        let mut range = Command::new("ZRANGEBYLEX");
        range
            .arg(&self.layout.order)
            .arg(layout::lex_start(cursor))
            .arg("+")
            .arg("LIMIT")
            .arg("0")
            .arg(limit.to_string());
        let keys = field_keys("ZRANGEBYLEX", &self.client.call(&range, Resend::Safe)?)?;
        let next = match keys.last() {
            Some(&last) if keys.len() >= limit => layout::cursor_after(last),
            _ => None,
        };
        Ok(ScanPage { keys, next })
    }

    fn sample(&self, count: usize) -> Result<Vec<BlockKey>, IndexError> {
        if count == 0 {
            return Ok(Vec::new());
        }
        let mut draw = Command::new("HRANDFIELD");
        draw.arg(&self.layout.values)
            .arg(count.min(i64::MAX as usize).to_string());
        field_keys("HRANDFIELD", &self.client.call(&draw, Resend::Safe)?)
    }

    fn len(&self) -> Result<u64, IndexError> {
        let mut hlen = Command::new("HLEN");
        hlen.arg(&self.layout.values);
        match self.client.call(&hlen, Resend::Safe)? {
            Reply::Int(n) if n >= 0 => Ok(n as u64),
            other => Err(unexpected("HLEN", &other)),
        }
    }
}
