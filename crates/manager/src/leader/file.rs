//! `file://<dir>`: a lease lock shared by the processes of one machine.
//!
//! The record `<dir>/leader.record` (holder, fencing token, wall-clock lease expiry, the
//! holder's endpoint; text, one `key value` per line) changes only while the changer holds
//! an exclusive `flock` on `<dir>/leader.guard`, so read-decide-write is atomic across
//! processes. A change is written to `leader.record.tmp`, fsynced, renamed over the record
//! and the directory fsynced: a reader (who needs no guard) sees the old or the new record,
//! never a torn one, and a crash keeps one of them. Leases are wall-clock, so every process
//! must share the machine's clock (they do on one machine). Deleting the record by hand
//! resets the fencing tokens to 1.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::lock::{HolderRecord, LockError, LockResult, NodeEndpoint, Slot, SlotStore};

/// How long an operation waits for another process to drop the guard.
const GUARD_WAIT: Duration = Duration::from_millis(500);
/// First line of a record: format name and version.
const MAGIC: &str = "kvcm-lease-lock 1";

/// A lease lock in a directory.
#[derive(Debug)]
pub struct FileLock {
    dir: PathBuf,
    guard: PathBuf,
    record: PathBuf,
    partial: PathBuf,
}

impl FileLock {
    /// The lock in `dir` (created if missing).
    pub fn open(dir: &Path) -> LockResult<FileLock> {
        std::fs::create_dir_all(dir).map_err(|source| LockError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let lock = FileLock {
            dir: dir.to_path_buf(),
            guard: dir.join("leader.guard"),
            record: dir.join("leader.record"),
            partial: dir.join("leader.record.tmp"),
        };
        lock.read()?;
        Ok(lock)
    }

    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> LockError + '_ {
        move |source| LockError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// Runs `change` on the record under the guard; writes the record back if it changed.
    fn with_guard<T>(&self, change: impl FnOnce(&mut Slot) -> T) -> LockResult<T> {
        let guard = self.take_guard()?;
        let mut slot = self.read_record()?;
        let before = slot.clone();
        let outcome = change(&mut slot);
        if slot != before {
            self.write(&slot)?;
        }
        // Closing the file drops the flock.
        drop(guard);
        Ok(outcome)
    }

    /// The guard file, exclusively flocked (waits at most [`GUARD_WAIT`]).
    fn take_guard(&self) -> LockResult<File> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&self.guard)
            .map_err(Self::io(&self.guard))?;
        let deadline = Instant::now() + GUARD_WAIT;
        loop {
            match try_flock(&file) {
                Ok(true) => return Ok(file),
                Ok(false) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Ok(false) => return Err(LockError::Busy(self.guard.clone())),
                Err(source) => return Err(Self::io(&self.guard)(source)),
            }
        }
    }

    fn read_record(&self) -> LockResult<Slot> {
        match std::fs::read_to_string(&self.record) {
            Ok(text) => decode(&text).map_err(|reason| LockError::Corrupt {
                path: self.record.clone(),
                reason,
            }),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Slot::default()),
            Err(source) => Err(Self::io(&self.record)(source)),
        }
    }

    fn write(&self, slot: &Slot) -> LockResult<()> {
        let mut file = File::create(&self.partial).map_err(Self::io(&self.partial))?;
        file.write_all(encode(slot).as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(Self::io(&self.partial))?;
        std::fs::rename(&self.partial, &self.record).map_err(Self::io(&self.record))?;
        File::open(&self.dir)
            .and_then(|dir| dir.sync_all())
            .map_err(Self::io(&self.dir))
    }
}

impl SlotStore for FileLock {
    fn change<T>(&self, change: impl Fn(&mut Slot) -> T) -> LockResult<T> {
        self.with_guard(change)
    }

    fn read(&self) -> LockResult<Slot> {
        self.read_record()
    }
}

/// Takes an exclusive `flock` on `file` without waiting: false when another open file
/// description holds it. The lock lasts until `file` is closed.
fn try_flock(file: &File) -> std::io::Result<bool> {
    // SAFETY: flock only reads the descriptor number; `file` keeps it open for the call.
    let outcome = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if outcome == 0 {
        return Ok(true);
    }
    let error = std::io::Error::last_os_error();
    match error.raw_os_error() {
        Some(libc::EWOULDBLOCK) => Ok(false),
        Some(libc::EINTR) => try_flock(file),
        _ => Err(error),
    }
}

/// The record's text (also what the Redis lock stores).
pub(super) fn encode(slot: &Slot) -> String {
    let mut text = format!("{MAGIC}\nlast_token {}\n", slot.last_token);
    if let Some(holder) = &slot.holder {
        let e = &holder.endpoint;
        let lines = [
            ("node_id", escape(&e.node_id)),
            ("fencing_token", holder.fencing_token.to_string()),
            ("expires_at_ms", holder.expires_at_ms.to_string()),
            ("host", escape(&e.host)),
            ("rpc_port", e.rpc_port.to_string()),
            ("http_port", e.http_port.to_string()),
            ("admin_rpc_port", e.admin_rpc_port.to_string()),
            ("admin_http_port", e.admin_http_port.to_string()),
            ("custom_info", escape(&e.custom_info)),
        ];
        for (key, value) in lines {
            text.push_str(&format!("{key} {value}\n"));
        }
    }
    text
}

/// The slot of a record's text.
pub(super) fn decode(text: &str) -> Result<Slot, String> {
    let mut lines = text.lines();
    if lines.next() != Some(MAGIC) {
        return Err(format!("the first line is not {MAGIC:?}"));
    }
    let fields: std::collections::BTreeMap<&str, &str> = lines
        .map(|line| line.split_once(' ').unwrap_or((line, "")))
        .collect();
    let text_of = |key: &str| -> Result<String, String> {
        let value = fields.get(key).ok_or_else(|| format!("no {key} line"))?;
        unescape(value).map_err(|reason| format!("{key}: {reason}"))
    };
    let number = |key: &str| -> Result<u64, String> {
        text_of(key)?.parse().map_err(|e| format!("{key}: {e}"))
    };
    let port = |key: &str| -> Result<u16, String> {
        u16::try_from(number(key)?).map_err(|e| format!("{key}: {e}"))
    };
    let last_token = number("last_token")?;
    if !fields.contains_key("node_id") {
        return Ok(Slot {
            last_token,
            holder: None,
        });
    }
    let endpoint = NodeEndpoint {
        node_id: text_of("node_id")?,
        host: text_of("host")?,
        rpc_port: port("rpc_port")?,
        http_port: port("http_port")?,
        admin_rpc_port: port("admin_rpc_port")?,
        admin_http_port: port("admin_http_port")?,
        custom_info: text_of("custom_info")?,
    };
    let holder = HolderRecord {
        endpoint,
        fencing_token: number("fencing_token")?,
        expires_at_ms: number("expires_at_ms")?,
    };
    Ok(Slot {
        last_token,
        holder: Some(holder),
    })
}

/// `\` → `\\`, newline → `\n`, carriage return → `\r`: a value fits on one line.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out
}

/// The inverse of [`escape`].
fn unescape(value: &str) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('\\') => out.push('\\'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            other => {
                return Err(format!(
                    "bad escape \\{}",
                    other.map_or(String::new(), String::from)
                ))
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::lock::{conformance, LeaseLock};
    use super::*;

    fn two(dir: &Path) -> (FileLock, FileLock) {
        (FileLock::open(dir).unwrap(), FileLock::open(dir).unwrap())
    }

    #[test]
    fn two_lockers_exclude_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = two(dir.path());
        conformance::two_lockers_exclude_each_other(&a, &b);
    }

    #[test]
    fn an_expired_lease_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = two(dir.path());
        conformance::an_expired_lease_is_taken_over(&a, &b);
    }

    #[test]
    fn an_expired_lease_is_not_renewed() {
        let dir = tempfile::tempdir().unwrap();
        conformance::an_expired_lease_is_not_renewed(&FileLock::open(dir.path()).unwrap());
    }

    #[test]
    fn racing_campaigners_on_separate_opens_elect_exactly_one() {
        for _ in 0..10 {
            let dir = tempfile::tempdir().unwrap();
            let start = std::sync::Barrier::new(6);
            let winners: Vec<bool> = std::thread::scope(|scope| {
                let racers: Vec<_> = (0..6)
                    .map(|i| {
                        let (dir, start) = (dir.path(), &start);
                        scope.spawn(move || {
                            let lock = FileLock::open(dir).unwrap();
                            start.wait();
                            let node = conformance::node(&format!("n{i}"));
                            lock.try_acquire(&node, Duration::from_secs(60))
                                .unwrap()
                                .is_some()
                        })
                    })
                    .collect();
                racers.into_iter().map(|r| r.join().unwrap()).collect()
            });
            assert_eq!(winners.iter().filter(|&&won| won).count(), 1, "{winners:?}");
        }
    }

    #[test]
    fn tokens_survive_a_reopen_and_a_corrupt_record_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let node = conformance::node("a");
        let first = {
            let lock = FileLock::open(dir.path()).unwrap();
            let token = lock
                .try_acquire(&node, Duration::from_secs(60))
                .unwrap()
                .unwrap();
            assert!(lock.release("a", token.fencing_token).unwrap());
            token
        };
        let lock = FileLock::open(dir.path()).unwrap();
        let second = lock
            .try_acquire(&node, Duration::from_secs(60))
            .unwrap()
            .unwrap();
        assert!(second.fencing_token > first.fencing_token);
        std::fs::write(dir.path().join("leader.record"), "garbage").unwrap();
        let error = lock.current_holder().unwrap_err().to_string();
        assert!(
            error.contains("leader.record") && error.contains("corrupt"),
            "{error}"
        );
    }

    #[test]
    fn a_held_guard_makes_changes_wait_then_fail_busy() {
        let dir = tempfile::tempdir().unwrap();
        let lock = FileLock::open(dir.path()).unwrap();
        let held = lock.take_guard().unwrap();
        let other = FileLock::open(dir.path()).unwrap();
        let refused = other.try_acquire(&conformance::node("b"), Duration::from_secs(1));
        assert!(matches!(refused, Err(LockError::Busy(_))), "{refused:?}");
        drop(held);
        assert!(other
            .try_acquire(&conformance::node("b"), Duration::from_secs(1))
            .unwrap()
            .is_some());
    }

    #[test]
    fn records_round_trip() {
        let slot = Slot {
            last_token: 9,
            holder: Some(HolderRecord {
                endpoint: conformance::node("n\\1\r"),
                fencing_token: 9,
                expires_at_ms: 12345,
            }),
        };
        assert_eq!(decode(&encode(&slot)).unwrap(), slot);
        let free = Slot {
            last_token: 3,
            holder: None,
        };
        assert_eq!(decode(&encode(&free)).unwrap(), free);
        assert!(unescape("bad \\x").is_err());
    }
}
