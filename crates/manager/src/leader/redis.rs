//! `redis://...`: a lease lock on Redis / Valkey (single node or Redis Cluster), shared by
//! nodes on any machines that reach it.
//!
//! The lock is one string key, `kvcm:{kvcm-leader}:record`, holding the same text record as
//! the file lock (holder, fencing token, wall-clock expiry, endpoint; see `file`). Every
//! change is a compare-and-set: read the record, apply the shared [`Slot`] rules, write the
//! new text with a Lua script that sets it only if the key still holds the text that was read
//! (absent = empty). A lost race retries with the new record, so acquire, renew and release
//! are atomic and a stale token can never extend or drop a successor's lease.
//!
//! Leases are wall-clock milliseconds written by the nodes, as with the file lock: the nodes'
//! clocks must agree to well within the elector's drift margin (lease / 10).

use std::time::Duration;

use kvcm_index::redis::resp::{Command, Reply};
use kvcm_index::redis::{parse_uri, Client, Resend};

use super::file::{decode, encode};
use super::lock::{LockError, LockResult, Slot, SlotStore};

/// The hash tag of the lock's key (one slot on a cluster).
const TAG: &str = "kvcm-leader";
/// The lock's key.
const KEY: &str = "kvcm:{kvcm-leader}:record";
/// Compare-and-set of the record: `1` when set, `0` when the key changed meanwhile.
const CAS: &str = "local current = redis.call('GET', KEYS[1]) or '' \
    if current ~= ARGV[1] then return 0 end \
    redis.call('SET', KEYS[1], ARGV[2]) return 1";
/// Timeout of one Redis call (the URI's `timeout_ms` overrides it).
const TIMEOUT: Duration = Duration::from_secs(2);
/// Compare-and-set attempts before a change gives up as busy.
const CAS_TRIES: u32 = 16;

/// The Redis lease lock.
#[derive(Debug)]
pub struct RedisLock {
    client: Client,
    uri: String,
}

impl RedisLock {
    /// Connects to the lock's Redis (`redis://[user:password@]host:port[/db]`).
    pub fn open(uri: &str) -> LockResult<RedisLock> {
        let seed = parse_uri(uri).map_err(|e| LockError::Unsupported(e.to_string()))?;
        let timeout = seed.timeout_ms.map_or(TIMEOUT, Duration::from_millis);
        let client = Client::connect(seed, TAG, timeout).map_err(|e| redis_error(uri, &e))?;
        Ok(RedisLock {
            client,
            uri: uri.to_string(),
        })
    }

    /// The record's text now (empty when absent).
    fn read_text(&self) -> LockResult<String> {
        let mut get = Command::new("GET");
        get.arg(KEY);
        match self.client.call(&get, Resend::Safe) {
            Ok(Reply::Bulk(Some(bytes))) => {
                String::from_utf8(bytes).map_err(|_| self.corrupt("not UTF-8"))
            }
            Ok(Reply::Bulk(None)) => Ok(String::new()),
            Ok(other) => Err(self.corrupt(&format!("GET answered {other:?}"))),
            Err(error) => Err(redis_error(&self.uri, &error)),
        }
    }

    /// The slot a record's text holds (empty: a free lock that never had a holder).
    fn parse(&self, text: &str) -> LockResult<Slot> {
        if text.is_empty() {
            return Ok(Slot::default());
        }
        decode(text).map_err(|reason| self.corrupt(&reason))
    }

    fn corrupt(&self, reason: &str) -> LockError {
        LockError::Corrupt {
            path: format!("{}/{KEY}", self.uri).into(),
            reason: reason.to_string(),
        }
    }

    /// Runs `change` on the record and writes it back by compare-and-set when it changed;
    /// retries on a lost race.
    fn with_cas<T>(&self, change: impl Fn(&mut Slot) -> T) -> LockResult<T> {
        for _ in 0..CAS_TRIES {
            let text = self.read_text()?;
            let mut slot = self.parse(&text)?;
            let before = slot.clone();
            let outcome = change(&mut slot);
            if slot == before || self.compare_and_set(&text, &encode(&slot))? {
                return Ok(outcome);
            }
        }
        Err(LockError::Busy(format!("{}/{KEY}", self.uri).into()))
    }

    fn compare_and_set(&self, old: &str, new: &str) -> LockResult<bool> {
        let mut eval = Command::new("EVAL");
        eval.arg(CAS).arg("1").arg(KEY).arg(old).arg(new);
        match self.client.call(&eval, Resend::Never) {
            Ok(Reply::Int(1)) => Ok(true),
            Ok(Reply::Int(0)) => Ok(false),
            Ok(other) => Err(self.corrupt(&format!("the compare-and-set answered {other:?}"))),
            Err(error) => Err(redis_error(&self.uri, &error)),
        }
    }
}

fn redis_error(uri: &str, error: &dyn std::error::Error) -> LockError {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    LockError::Io {
        path: uri.into(),
        source: std::io::Error::other(text),
    }
}

impl SlotStore for RedisLock {
    fn change<T>(&self, change: impl Fn(&mut Slot) -> T) -> LockResult<T> {
        self.with_cas(change)
    }

    fn read(&self) -> LockResult<Slot> {
        self.parse(&self.read_text()?)
    }
}

#[cfg(test)]
mod tests {
    use super::super::lock::{conformance, LeaseLock};
    use super::*;

    use crate::tests::redis_support::{redis_available, RedisServer};

    fn two(server: &RedisServer) -> (RedisLock, RedisLock) {
        let uri = server.uri();
        (
            RedisLock::open(&uri).unwrap(),
            RedisLock::open(&uri).unwrap(),
        )
    }

    #[test]
    fn the_redis_lock_follows_the_shared_rules() {
        if !redis_available("the_redis_lock_follows_the_shared_rules") {
            return;
        }
        let checks: [fn(&RedisLock, &RedisLock); 3] = [
            |a, b| conformance::two_lockers_exclude_each_other(a, b),
            |a, b| conformance::an_expired_lease_is_taken_over(a, b),
            |a, _| conformance::an_expired_lease_is_not_renewed(a),
        ];
        for check in checks {
            let dir = tempfile::tempdir().unwrap();
            let server = RedisServer::start(dir.path());
            let (a, b) = two(&server);
            check(&a, &b);
        }
    }

    #[test]
    fn racing_campaigners_elect_exactly_one_and_a_corrupt_record_is_reported() {
        if !redis_available("racing_campaigners_elect_exactly_one") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let server = RedisServer::start(dir.path());
        let lease = Duration::from_secs(30);
        let won: Vec<bool> = std::thread::scope(|scope| {
            let campaigners: Vec<_> = (0..6)
                .map(|i| {
                    let uri = server.uri();
                    scope.spawn(move || {
                        let lock = RedisLock::open(&uri).unwrap();
                        let node = conformance::node(&format!("n{i}"));
                        lock.try_acquire(&node, lease).unwrap().is_some()
                    })
                })
                .collect();
            campaigners.into_iter().map(|c| c.join().unwrap()).collect()
        });
        assert_eq!(won.iter().filter(|w| **w).count(), 1, "{won:?}");
        let lock = RedisLock::open(&server.uri()).unwrap();
        let mut set = Command::new("SET");
        set.arg(KEY).arg("garbage");
        lock.client.call(&set, Resend::Never).unwrap();
        let error = lock.current_holder().unwrap_err();
        assert!(matches!(error, LockError::Corrupt { .. }), "{error}");
    }

    #[test]
    fn an_unreachable_redis_is_a_clear_error() {
        let error = RedisLock::open("redis://127.0.0.1:1").unwrap_err();
        assert!(error.to_string().contains("redis://127.0.0.1:1"), "{error}");
        let refused = RedisLock::open("rediss://127.0.0.1:1").unwrap_err();
        assert!(refused.to_string().contains("TLS"), "{refused}");
    }
}
