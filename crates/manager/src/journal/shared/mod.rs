//! The shared store: the manager's durable state on Redis / Valkey (one server or a Redis
//! Cluster), so that whichever node wins the leader lock serves what the last leader
//! acknowledged. It takes the local journal's place (`kvcm.registry_storage.uri=redis://…`):
//! the same records, written to Redis instead of a log file, and read back when a node is
//! promoted ([`promote`]).
//!
//! Layout:
//! - the registry under one hash tag, `{kvcm-registry}`: a HASH per kind of object
//!   (`storages`, `disabled`, `groups`, `instances`, `accounts`, `api_keys`), field = the
//!   object's name, value = the journal record that registers it (a storage's preceded by
//!   the 8-byte id of that registration, which entries name); and the fence key;
//! - each instance's entries in a namespace of its own, in the index layout of
//!   [`kvcm_index::RedisIndex`] (hash, order zset, fence under one tag), named
//!   `i.<32 hex digits of the SHA-256 of the instance id>` (any id fits a hash tag); values
//!   per [`value`].
//!
//! Why this split: one registry change, even one that touches two kinds (an account and its
//! API keys), is one script in one slot; entries of different instances spread over a
//! cluster's masters by their tags, and one instance's batch is one script in its slot.
//!
//! Invariants:
//! - every write is fenced: it carries the fencing token of the lease this node won (set at
//!   promotion) and changes nothing where a newer leader's token already is (the write fails
//!   with [`JournalError::Fenced`]); before any promotion the token is 0 and every write is
//!   refused;
//! - a change is acknowledged only after Redis answered it: its durability is the Redis
//!   server's (run it with `appendonly yes`, `appendfsync always` for the guarantee of the
//!   local journal's `fsync = always`); a write whose reply was lost is an error, never
//!   reported done (it may or may not have been applied: the next promotion reads what is
//!   there);
//! - reading back decodes what it can: a registry object or an entry that does not decode is
//!   reported and skipped, the rest is restored.

mod promote;
mod value;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvcm_index::redis::resp::{Command, Reply};
use kvcm_index::redis::{parse_uri, redacted_uri, BytesCodec, Client, ClientError, Resend};
use kvcm_index::{BlockKey, IndexError, MetaIndex, RedisIndex, RedisIndexConfig, ScanCursor};
use kvcm_storage::StorageSpec;
use sha2::{Digest, Sha256};

use super::record::{DurableEntry, Record};
use super::recover::{RecoveryReport, Replay};
use super::{JournalError, JournalStats};
use crate::storages::Incarnations;
use crate::sync::lock;
use value::StorageRef;

/// The registry's hash tag (one slot on a cluster).
const TAG: &str = "kvcm-registry";
/// The registry's fence key.
const FENCE_KEY: &str = "kvcm:{kvcm-registry}:fence";
/// Timeout of one Redis call (the URI's `timeout_ms` overrides it).
const TIMEOUT: Duration = Duration::from_secs(5);
/// Keys read per page when entries are read back.
const PAGE: usize = 4096;

/// The kinds of registry object, each one HASH; the order is the order they are read back
/// in (a group names storages, an instance its group, an API key its account).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Storages,
    Disabled,
    Groups,
    Instances,
    Accounts,
    ApiKeys,
}

impl Kind {
    const ALL: [Kind; 6] = [
        Kind::Storages,
        Kind::Disabled,
        Kind::Groups,
        Kind::Instances,
        Kind::Accounts,
        Kind::ApiKeys,
    ];

    fn key(self) -> &'static str {
        match self {
            Kind::Storages => "kvcm:{kvcm-registry}:storages",
            Kind::Disabled => "kvcm:{kvcm-registry}:disabled",
            Kind::Groups => "kvcm:{kvcm-registry}:groups",
            Kind::Instances => "kvcm:{kvcm-registry}:instances",
            Kind::Accounts => "kvcm:{kvcm-registry}:accounts",
            Kind::ApiKeys => "kvcm:{kvcm-registry}:api_keys",
        }
    }

    /// The `KEYS` index of the hash in [`REGISTRY_WRITE`] (the fence is 1).
    fn key_index(self) -> usize {
        2 + Kind::ALL.iter().position(|k| *k == self).unwrap_or(0)
    }

    /// Whether a record read from this kind's hash may be there.
    fn holds(self, record: &Record) -> bool {
        matches!(
            (self, record),
            (Kind::Storages, Record::Storage { .. })
                | (Kind::Disabled, Record::StorageAvailability { .. })
                | (Kind::Groups, Record::Group(_))
                | (Kind::Instances, Record::Instance(_))
                | (Kind::Accounts, Record::Account(_))
                | (Kind::ApiKeys, Record::ApiKey(_))
        )
    }
}

/// One registry change: set a field to a record, or delete it.
enum Op {
    Set(Kind, String, Vec<u8>),
    Del(Kind, String),
}

/// The registry write: check and raise the fence, then apply each op. `KEYS`: the fence and
/// the six hashes; `ARGV`: the token, then per op the hash's `KEYS` index, `S` or `D`, the
/// field, and for `S` the value. No op: only the fence is raised.
const REGISTRY_WRITE: &str = r#"
local token = tonumber(ARGV[1])
if not token or token < 1 then
  return redis.error_reply('kvcm: a registry write without a fencing token')
end
if token < tonumber(redis.call('GET', KEYS[1]) or '0') then
  return redis.status_reply('FENCED')
end
redis.call('SET', KEYS[1], ARGV[1])
local i = 2
while i <= #ARGV do
  local h = KEYS[tonumber(ARGV[i])]
  if ARGV[i + 1] == 'S' then
    redis.call('HSET', h, ARGV[i + 2], ARGV[i + 3])
    i = i + 4
  else
    redis.call('HDEL', h, ARGV[i + 2])
    i = i + 3
  end
end
return 1
"#;

/// The entries of one instance on Redis.
type EntryIndex = RedisIndex<Vec<u8>, BytesCodec>;

/// The manager's state on Redis. See the module doc.
pub struct SharedStore {
    /// The URI with its password masked (for messages).
    shown_uri: String,
    uri: String,
    timeout: Duration,
    registry: Client,
    /// The fencing token of this node's lease (0 until promoted).
    token: Arc<AtomicU64>,
    /// Where entries' handles are resolved to storage names.
    incarnations: Incarnations,
    /// Each instance's entry index, opened on first use.
    instances: Mutex<HashMap<String, Arc<EntryIndex>>>,
    /// Per storage name, the id of its current registration and the spec it was made with
    /// (see [`value`]: entries name storages by name and id).
    storage_ids: Mutex<HashMap<String, (u64, StorageSpec)>>,
    /// Changes written since start.
    writes: AtomicU64,
}

impl std::fmt::Debug for SharedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedStore")
            .field("uri", &self.shown_uri)
            .field("token", &self.token.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl SharedStore {
    /// Connects to the registry's node (`redis://[user:password@]host:port[/db][?…]`).
    pub(crate) fn connect(uri: &str, incarnations: Incarnations) -> Result<Self, JournalError> {
        let shown_uri = redacted_uri(uri);
        let seed = parse_uri(uri).map_err(|e| JournalError::Shared {
            uri: shown_uri.clone(),
            reason: e.to_string(),
        })?;
        let timeout = seed.timeout_ms.map_or(TIMEOUT, Duration::from_millis);
        let registry = Client::connect(seed, TAG, timeout).map_err(|e| JournalError::Shared {
            uri: shown_uri.clone(),
            reason: error_chain(&e),
        })?;
        Ok(SharedStore {
            shown_uri,
            uri: uri.to_string(),
            timeout,
            registry,
            token: Arc::new(AtomicU64::new(0)),
            incarnations,
            instances: Mutex::new(HashMap::new()),
            storage_ids: Mutex::new(HashMap::new()),
            writes: AtomicU64::new(0),
        })
    }

    fn failed(&self, reason: impl Into<String>) -> JournalError {
        JournalError::Shared {
            uri: self.shown_uri.clone(),
            reason: reason.into(),
        }
    }

    fn index_error(&self, error: IndexError) -> JournalError {
        match error {
            IndexError::Fenced { token } => JournalError::Fenced { token },
            other => self.failed(other.to_string()),
        }
    }

    /// The entry index of `instance_id` (opened on first use).
    fn entries(&self, instance_id: &str) -> Result<Arc<EntryIndex>, JournalError> {
        if let Some(index) = lock(&self.instances).get(instance_id) {
            return Ok(index.clone());
        }
        let config = RedisIndexConfig {
            uri: self.uri.clone(),
            namespace: namespace(instance_id),
            max_key_count: u64::MAX,
            timeout: self.timeout,
        };
        let index = RedisIndex::connect(config, BytesCodec)
            .map_err(|e| self.index_error(e))?
            .fenced_by(self.token.clone());
        let index = Arc::new(index);
        lock(&self.instances).insert(instance_id.to_string(), index.clone());
        Ok(index)
    }

    /// Writes one record's change (see the module doc for where each kind goes).
    pub(crate) fn append(&self, record: &Record) -> Result<(), JournalError> {
        let ops = match record {
            Record::Storage { config, .. } => return self.write_storage(record, config),
            Record::StorageRemoved(name) => {
                let ops = [
                    Op::Del(Kind::Storages, name.clone()),
                    Op::Del(Kind::Disabled, name.clone()),
                ];
                self.write_registry(&ops)?;
                lock(&self.storage_ids).remove(name);
                return Ok(());
            }
            Record::StorageAvailability { name, available } => vec![if *available {
                Op::Del(Kind::Disabled, name.clone())
            } else {
                Op::Set(Kind::Disabled, name.clone(), record.encode())
            }],
            Record::Group(group) => {
                vec![Op::Set(Kind::Groups, group.name.clone(), record.encode())]
            }
            Record::GroupRemoved(name) => vec![Op::Del(Kind::Groups, name.clone())],
            Record::Instance(info) => {
                // A new registration: whatever an earlier instance of this id left (a removal
                // whose clean-up failed) must not become this one's entries.
                self.entries(&info.instance_id)?
                    .drop_all()
                    .map_err(|e| self.index_error(e))?;
                vec![Op::Set(
                    Kind::Instances,
                    info.instance_id.clone(),
                    record.encode(),
                )]
            }
            Record::InstanceRemoved(id) => return self.remove_instance(id),
            Record::Account(account) => vec![Op::Set(
                Kind::Accounts,
                account.user_name.clone(),
                record.encode(),
            )],
            Record::AccountRemoved(name) => {
                let mut ops = vec![Op::Del(Kind::Accounts, name.clone())];
                for (id, key) in self.read_kind(Kind::ApiKeys)? {
                    if matches!(Record::decode(&key), Ok(Record::ApiKey(k)) if k.user_name == *name)
                    {
                        ops.push(Op::Del(Kind::ApiKeys, id));
                    }
                }
                ops
            }
            Record::ApiKey(key) => vec![Op::Set(Kind::ApiKeys, key.id.clone(), record.encode())],
            Record::ApiKeyRevoked(id) => vec![Op::Del(Kind::ApiKeys, id.clone())],
            Record::Entries {
                instance_id,
                changes,
            } => return self.write_entries(instance_id, changes),
            Record::Incarnation { .. } | Record::End(_) => return Ok(()),
        };
        self.write_registry(&ops)
    }

    /// Registers a storage under an id: the id it had when its spec is unchanged (an update
    /// of other settings), a new random one otherwise, so that entries of its earlier spec
    /// read as stale. The stored value is the id (8 bytes, little-endian) and the record.
    fn write_storage(
        &self,
        record: &Record,
        config: &kvcm_storage::StorageConfig,
    ) -> Result<(), JournalError> {
        let name = &config.global_unique_name;
        let id = match lock(&self.storage_ids).get(name) {
            Some((id, spec)) if *spec == config.spec => *id,
            _ => fastrand::u64(1..),
        };
        let mut value = id.to_le_bytes().to_vec();
        value.extend_from_slice(&record.encode());
        self.write_registry(&[Op::Set(Kind::Storages, name.clone(), value)])?;
        lock(&self.storage_ids).insert(name.clone(), (id, config.spec.clone()));
        Ok(())
    }

    /// Removes an instance: the registry's record first (the commit point), then its entries;
    /// entries a failure leaves behind are dropped when an instance of that id registers.
    fn remove_instance(&self, id: &str) -> Result<(), JournalError> {
        self.write_registry(&[Op::Del(Kind::Instances, id.to_string())])?;
        let dropped = self
            .entries(id)
            .and_then(|index| index.drop_all().map_err(|e| self.index_error(e)));
        lock(&self.instances).remove(id);
        if let Err(error) = dropped {
            tracing::warn!(instance = id, %error, "the removed instance's entries stay on the shared store until an instance of its id registers");
        }
        Ok(())
    }

    /// One registry script run: the fence check, then `ops` (none: only the fence is raised).
    fn write_registry(&self, ops: &[Op]) -> Result<(), JournalError> {
        let token = self.token.load(Ordering::Acquire);
        if token == 0 {
            return Err(JournalError::Fenced { token });
        }
        let mut eval = Command::new("EVAL");
        eval.arg(REGISTRY_WRITE)
            .arg((1 + Kind::ALL.len()).to_string());
        eval.arg(FENCE_KEY);
        for kind in Kind::ALL {
            eval.arg(kind.key());
        }
        eval.arg(token.to_string());
        for op in ops {
            match op {
                Op::Set(kind, field, value) => {
                    eval.arg(kind.key_index().to_string())
                        .arg("S")
                        .arg(field)
                        .arg(value);
                }
                Op::Del(kind, field) => {
                    eval.arg(kind.key_index().to_string()).arg("D").arg(field);
                }
            }
        }
        // The script ends in the same state however often it runs (and the manager orders
        // registry changes under its locks): a lost reply is sent again.
        let reply = self
            .registry
            .call(&eval, Resend::Safe)
            .map_err(|e| self.failed(error_chain(&e)))?;
        match reply {
            Reply::Int(1) => {
                self.writes.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Reply::Status(status) if status == "FENCED" => Err(JournalError::Fenced { token }),
            other => Err(self.failed(format!("the registry script answered {other:?}"))),
        }
    }

    /// Writes one instance's changes (per key its new entry, `None` when removed) in one
    /// fenced script.
    pub(crate) fn write_entries(
        &self,
        instance_id: &str,
        changes: &[(BlockKey, Option<DurableEntry>)],
    ) -> Result<(), JournalError> {
        if self.token.load(Ordering::Acquire) == 0 {
            return Err(JournalError::Fenced { token: 0 });
        }
        let ids = lock(&self.storage_ids);
        let describe = |handle| {
            let config = self.incarnations.get(handle)?.backend.config();
            let name = &config.global_unique_name;
            // A location of an earlier incarnation (its storage's spec changed since) gets
            // id 0, which no registration has: it reads back as stale.
            let id = match ids.get(name) {
                Some((id, spec)) if *spec == config.spec => *id,
                _ => 0,
            };
            Some(StorageRef {
                name: name.clone(),
                id,
            })
        };
        let encoded: Vec<(BlockKey, Option<Vec<u8>>)> = changes
            .iter()
            .map(|(key, entry)| (*key, entry.as_ref().map(|e| value::encode(e, describe))))
            .collect();
        drop(ids);
        self.entries(instance_id)?
            .apply(&encoded)
            .map_err(|e| self.index_error(e))?;
        self.writes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Every field of one registry hash.
    fn read_kind(&self, kind: Kind) -> Result<Vec<(String, Vec<u8>)>, JournalError> {
        let mut all = Command::new("HGETALL");
        all.arg(kind.key());
        let reply = self
            .registry
            .call(&all, Resend::Safe)
            .map_err(|e| self.failed(error_chain(&e)))?;
        let Reply::Array(Some(items)) = reply else {
            return Err(self.failed(format!("HGETALL {} answered {reply:?}", kind.key())));
        };
        let mut pairs = Vec::with_capacity(items.len() / 2);
        let mut items = items.into_iter();
        while let (Some(Reply::Bulk(Some(field))), Some(Reply::Bulk(Some(value)))) =
            (items.next(), items.next())
        {
            pairs.push((String::from_utf8_lossy(&field).into_owned(), value));
        }
        Ok(pairs)
    }

    /// Sets the token of this node's lease and raises the registry's fence to it: from now
    /// on an older leader's registry writes are refused.
    pub(crate) fn take_over(&self, token: u64) -> Result<(), JournalError> {
        self.token.store(token, Ordering::Release);
        self.write_registry(&[])
    }

    /// The registry as a replay (objects that do not decode are reported and skipped); the
    /// storages' ids become the ones entries are written and read with.
    fn read_registry(&self, report: &mut RecoveryReport) -> Result<Replay, JournalError> {
        let mut replay = Replay::default();
        let mut ids = HashMap::new();
        for kind in Kind::ALL {
            for (name, bytes) in self.read_kind(kind)? {
                let bytes = match kind {
                    Kind::Storages if bytes.len() >= 8 => {
                        let (id, record) = bytes.split_at(8);
                        let id = u64::from_le_bytes(id.try_into().unwrap_or_default());
                        if let Ok(Record::Storage { config, .. }) = Record::decode(record) {
                            ids.insert(name.clone(), (id, config.spec));
                        }
                        record.to_vec()
                    }
                    _ => bytes,
                };
                match Record::decode(&bytes) {
                    Ok(record) if kind.holds(&record) => {
                        report.records += 1;
                        replay.apply(record);
                    }
                    Ok(_) => report.skipped.push(format!(
                        "{}[{name:?}]: a record of another kind",
                        kind.key()
                    )),
                    Err(error) => report
                        .skipped
                        .push(format!("{}[{name:?}]: {error}", kind.key())),
                }
            }
        }
        *lock(&self.storage_ids) = ids;
        Ok(replay)
    }

    /// Every key of `instance_id`'s namespace with its value, page by page.
    fn read_entries(
        &self,
        instance_id: &str,
        mut each: impl FnMut(BlockKey, &[u8]),
    ) -> Result<(), JournalError> {
        let index = self.entries(instance_id)?;
        let mut cursor = Some(ScanCursor::START);
        while let Some(at) = cursor {
            let page = index.scan(at, PAGE).map_err(|e| self.index_error(e))?;
            let values = index.get(&page.keys).map_err(|e| self.index_error(e))?;
            for (key, value) in page.keys.iter().zip(values) {
                if let Some(bytes) = value {
                    each(*key, &bytes);
                }
            }
            cursor = page.next;
        }
        Ok(())
    }

    /// The storages' registration ids as last read or written.
    fn storage_ids(&self) -> HashMap<String, (u64, StorageSpec)> {
        lock(&self.storage_ids).clone()
    }

    /// Counters in the journal's terms: every change written is durable once answered.
    pub(crate) fn stats(&self) -> JournalStats {
        let writes = self.writes.load(Ordering::Relaxed);
        JournalStats {
            appended: writes,
            durable: writes,
            flushes: writes,
            syncs: 0,
            synced: 0,
            acknowledged: writes,
            waits: writes,
            early_acknowledgements: 0,
            log_bytes_since_snapshot: 0,
            log_bytes: 0,
            failure: None,
        }
    }
}

/// The namespace of an instance's entries: a digest, so that any id fits a hash tag.
fn namespace(instance_id: &str) -> String {
    let digest = Sha256::digest(instance_id.as_bytes());
    format!("i.{}", crate::hex::encode(&digest[..16]))
}

/// The message of `error` and of each of its sources.
fn error_chain(error: &ClientError) -> String {
    let mut message = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests;
