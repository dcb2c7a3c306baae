//! `file://<dir>`: a lease lock shared by the processes of one machine.
//!
//! The lock is a numbered series of immutable records, `<dir>/leader.<seq>` (holder, fencing
//! token, wall-clock lease expiry, the holder's endpoint; text, one `key value` per line);
//! the record with the greatest number is the current one. A change is a compare-and-swap
//! without any lock: read the current record `n`, write the changed record to a private
//! temporary file, fsync it, and `link(2)` it as `leader.<n+1>`, which fails when another
//! process published `n+1` first (then the change is re-read and retried). So no process
//! ever holds anything another one waits for: a holder paused or killed in the middle of a
//! change stops nobody (an `flock` guard held across a SIGSTOP blocked every failover).
//!
//! Invariants:
//! - records are created in order (`n+1` is only published on top of a read `n`) and never
//!   rewritten, so a reader sees whole records;
//! - after publishing `m` a writer removes the records below `m-1`; the greatest two are
//!   never removed, so the current record never disappears;
//! - a reader takes record `n` for current only when no record above `n+1` exists once it
//!   has read it, so a paused writer's re-created number (below) is never read;
//! - a writer that read `n` and paused while others published up to `n+3` (pruning `n+1`)
//!   can link `n+1` again, so a publish of `n+1` counts only when no record above `n+2`
//!   exists right after the link. A change judged lost that way may in truth have taken
//!   effect just before others built on it; that only makes a node believe it lost a
//!   lease it held (safe), never the reverse.
//!
//! Leases are wall-clock, so every process must share the machine's clock (they do on one
//! machine). Removing records by hand makes the lock hand out fencing tokens again: removing
//! every record restarts them at 1, removing a corrupt current record falls back to the
//! record before it.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::lock::{HolderRecord, LockError, LockResult, NodeEndpoint, Slot, SlotStore};

/// First line of a record: format name and version.
const MAGIC: &str = "kvcm-lease-lock 1";
/// Records are `leader.<seq>`, the number in this many digits.
const RECORD_PREFIX: &str = "leader.";
const SEQ_DIGITS: usize = 20;
/// Temporary files are `leader.tmp.<16 random hex digits>`, created only if new (processes
/// in separate PID namespaces may share the directory); one left by a crash is removed once
/// older than [`STALE_TEMPORARY`].
const TEMPORARY_PREFIX: &str = "leader.tmp.";
const STALE_TEMPORARY: Duration = Duration::from_secs(60);
/// The record an earlier kvcm kept (one file rewritten under an `flock`): read once, for
/// its tokens, when a directory holds no numbered record yet.
const LEGACY_RECORD: &str = "leader.record";
/// How many times a change is retried when other processes keep publishing first.
const CHANGE_TRIES: u32 = 64;

/// A lease lock in a directory.
#[derive(Debug)]
pub struct FileLock {
    dir: PathBuf,
}

/// The current record: its number (0 when there is none yet) and its slot.
struct Current {
    seq: u64,
    slot: Slot,
}

impl FileLock {
    /// The lock in `dir` (created if missing).
    pub fn open(dir: &Path) -> LockResult<FileLock> {
        std::fs::create_dir_all(dir).map_err(Self::io(dir))?;
        let lock = FileLock {
            dir: dir.to_path_buf(),
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

    fn record_path(&self, seq: u64) -> PathBuf {
        self.dir
            .join(format!("{RECORD_PREFIX}{seq:0width$}", width = SEQ_DIGITS))
    }

    /// The numbers of the records in the directory, ascending.
    fn record_numbers(&self) -> LockResult<Vec<u64>> {
        let entries = std::fs::read_dir(&self.dir).map_err(Self::io(&self.dir))?;
        let mut numbers = Vec::new();
        for entry in entries {
            let entry = entry.map_err(Self::io(&self.dir))?;
            if let Some(seq) = entry.file_name().to_str().and_then(record_number) {
                numbers.push(seq);
            }
        }
        numbers.sort_unstable();
        Ok(numbers)
    }

    /// The current record. A record pruned between listing and reading is listed again,
    /// and so is one read while two newer ones appeared: it may have been a paused writer's
    /// re-created number, never current (the module invariants), whose slot must not be
    /// taken for the holder.
    fn current(&self) -> LockResult<Current> {
        for _ in 0..CHANGE_TRIES {
            let Some(&seq) = self.record_numbers()?.last() else {
                let slot = self.read_slot(&self.dir.join(LEGACY_RECORD))?;
                return Ok(Current {
                    seq: 0,
                    slot: slot.unwrap_or_default(),
                });
            };
            let Some(slot) = self.read_slot(&self.record_path(seq))? else {
                continue;
            };
            if self.newest()?.unwrap_or(seq) <= seq + 1 {
                return Ok(Current { seq, slot });
            }
        }
        Err(LockError::Busy(self.dir.clone()))
    }

    /// The greatest record number, if any.
    fn newest(&self) -> LockResult<Option<u64>> {
        Ok(self.record_numbers()?.last().copied())
    }

    /// The slot a record holds; `None` when the file does not exist.
    fn read_slot(&self, path: &Path) -> LockResult<Option<Slot>> {
        match std::fs::read_to_string(path) {
            Ok(text) => decode(&text)
                .map(Some)
                .map_err(|reason| LockError::Corrupt {
                    path: path.to_path_buf(),
                    reason,
                }),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(Self::io(path)(source)),
        }
    }

    /// Publishes `slot` as record `seq`: true when this process's record is now current
    /// (see the module invariants), false when another process published first.
    fn publish(&self, seq: u64, slot: &Slot) -> LockResult<bool> {
        let temporary = self.write_temporary(slot)?;
        let record = self.record_path(seq);
        let linked = std::fs::hard_link(&temporary, &record);
        let _ = std::fs::remove_file(&temporary);
        match linked {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
            Err(source) => return Err(Self::io(&record)(source)),
        }
        // The record is out now: a listing that fails is tried again rather than report a
        // change that took effect as failed.
        let newest = (0..3)
            .find_map(|_| self.newest().ok())
            .ok_or_else(|| LockError::Busy(self.dir.clone()))?
            .unwrap_or(seq);
        if newest > seq + 1 {
            // A paused writer re-created a pruned number: its record was never current.
            let _ = std::fs::remove_file(&record);
            return Ok(false);
        }
        File::open(&self.dir)
            .and_then(|dir| dir.sync_all())
            .map_err(Self::io(&self.dir))?;
        Ok(true)
    }

    /// Writes `slot` to a new temporary file of its own, fsynced; returns its path.
    fn write_temporary(&self, slot: &Slot) -> LockResult<PathBuf> {
        let (path, created) = loop {
            let path = self
                .dir
                .join(format!("{TEMPORARY_PREFIX}{:016x}", fastrand::u64(..)));
            match File::options().write(true).create_new(true).open(&path) {
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => continue,
                created => break (path, created),
            }
        };
        let mut file = created.map_err(Self::io(&path))?;
        let written = file
            .write_all(encode(slot).as_bytes())
            .and_then(|()| file.sync_all());
        if let Err(source) = written {
            let _ = std::fs::remove_file(&path);
            return Err(Self::io(&path)(source));
        }
        Ok(path)
    }

    /// Removes the records below `newest - 1` (oldest first) and temporary files a crash
    /// left behind. Best effort: what is left is removed by a later change.
    fn prune(&self, newest: u64) {
        let Ok(numbers) = self.record_numbers() else {
            return;
        };
        for seq in numbers.into_iter().filter(|&seq| seq + 1 < newest) {
            let _ = std::fs::remove_file(self.record_path(seq));
        }
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let is_temporary = name
                .to_str()
                .is_some_and(|n| n.starts_with(TEMPORARY_PREFIX));
            let stale = entry
                .metadata()
                .and_then(|meta| meta.modified())
                .is_ok_and(|at| at.elapsed().is_ok_and(|age| age > STALE_TEMPORARY));
            if is_temporary && stale {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

impl SlotStore for FileLock {
    fn change<T>(&self, change: impl Fn(&mut Slot) -> T) -> LockResult<T> {
        for _ in 0..CHANGE_TRIES {
            let Current { seq, slot } = self.current()?;
            let mut changed = slot.clone();
            let outcome = change(&mut changed);
            if changed == slot {
                return Ok(outcome);
            }
            if self.publish(seq + 1, &changed)? {
                self.prune(seq + 1);
                return Ok(outcome);
            }
        }
        Err(LockError::Busy(self.dir.clone()))
    }

    fn read(&self) -> LockResult<Slot> {
        Ok(self.current()?.slot)
    }
}

/// The number in a record's file name; `None` for any other file.
fn record_number(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(RECORD_PREFIX)?;
    let all_digits = digits.len() == SEQ_DIGITS && digits.bytes().all(|b| b.is_ascii_digit());
    all_digits.then(|| digits.parse().ok()).flatten()
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
    use super::super::lock::{conformance, now_ms, LeaseLock};
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
        let newest = *lock.record_numbers().unwrap().last().unwrap();
        std::fs::write(lock.record_path(newest), "garbage").unwrap();
        let error = lock.current_holder().unwrap_err().to_string();
        assert!(
            error.contains(&format!("leader.{newest:020}")) && error.contains("corrupt"),
            "{error}"
        );
        // Removing the corrupt record falls back to the one before it (a token may be
        // handed out again, as the module docs warn).
        std::fs::remove_file(lock.record_path(newest)).unwrap();
        assert!(lock.current_holder().unwrap().is_none());
        assert!(lock
            .try_acquire(&node, Duration::from_secs(60))
            .unwrap()
            .is_some());
    }

    #[test]
    fn only_the_two_newest_records_are_kept_and_crash_leftovers_go() {
        let dir = tempfile::tempdir().unwrap();
        let lock = FileLock::open(dir.path()).unwrap();
        let leftover = dir
            .path()
            .join(format!("{TEMPORARY_PREFIX}0000000000000001"));
        std::fs::write(&leftover, "half").unwrap();
        let old = std::time::SystemTime::now() - STALE_TEMPORARY * 2;
        File::options()
            .write(true)
            .open(&leftover)
            .unwrap()
            .set_modified(old)
            .unwrap();
        for _ in 0..3 {
            acquire_and_release(&lock);
        }
        assert_eq!(lock.record_numbers().unwrap(), vec![5, 6]);
        assert!(!leftover.exists(), "a stale temporary file is removed");
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 2, "nothing but the records: {names:?}");
    }

    #[test]
    fn a_writer_that_lost_the_race_or_paused_past_a_prune_does_not_count() {
        let dir = tempfile::tempdir().unwrap();
        let lock = FileLock::open(dir.path()).unwrap();
        let paused = lock.current().unwrap();
        let mut stale = paused.slot.clone();
        stale.acquire(
            &conformance::node("late"),
            Duration::from_secs(60),
            now_ms(),
        );
        let token = lock
            .try_acquire(&conformance::node("a"), Duration::from_secs(60))
            .unwrap()
            .unwrap();
        // Another writer published the number first.
        assert!(!lock.publish(paused.seq + 1, &stale).unwrap());
        // Others published three more and pruned the number the paused writer wants.
        assert!(lock.release("a", token.fencing_token).unwrap());
        acquire_and_release(&lock);
        assert!(!lock.record_path(paused.seq + 1).exists());
        assert!(!lock.publish(paused.seq + 1, &stale).unwrap());
        assert!(
            !lock.record_path(paused.seq + 1).exists(),
            "the re-created record is removed"
        );
        assert!(
            lock.current_holder().unwrap().is_none(),
            "the late acquire never counted"
        );
        assert_eq!(lock.record_numbers().unwrap(), vec![3, 4]);
    }

    /// Two records: `a` acquires, then releases.
    fn acquire_and_release(lock: &FileLock) {
        let token = lock
            .try_acquire(&conformance::node("a"), Duration::from_secs(60))
            .unwrap()
            .expect("a free lock");
        assert!(lock.release("a", token.fencing_token).unwrap());
    }

    #[test]
    fn a_holder_paused_in_the_middle_of_a_renewal_blocks_nobody() {
        let dir = tempfile::tempdir().unwrap();
        let (holder, rival) = two(dir.path());
        let short = Duration::from_millis(30);
        let token = holder
            .try_acquire(&conformance::node("a"), short)
            .unwrap()
            .unwrap();
        let (paused_tx, paused_rx) = std::sync::mpsc::channel();
        let (resume_tx, resume_rx) = std::sync::mpsc::channel::<()>();
        let resume_rx = std::sync::Mutex::new(resume_rx);
        let first_run = std::sync::atomic::AtomicBool::new(true);
        std::thread::scope(|scope| {
            let renewal = scope.spawn(|| {
                holder.change(|slot| {
                    // The first run pauses between reading the record and publishing.
                    if first_run.swap(false, std::sync::atomic::Ordering::SeqCst) {
                        paused_tx.send(()).unwrap();
                        resume_rx.lock().unwrap().recv().unwrap();
                    }
                    slot.renew(
                        &conformance::node("a"),
                        token.fencing_token,
                        short,
                        now_ms(),
                    )
                })
            });
            paused_rx.recv().unwrap();
            std::thread::sleep(short * 2); // the paused holder's lease runs out
            let taken = rival
                .try_acquire(&conformance::node("b"), Duration::from_secs(60))
                .unwrap()
                .expect("the rival takes the lock while the holder is paused");
            resume_tx.send(()).unwrap();
            let renewed = renewal.join().unwrap().unwrap();
            assert!(matches!(renewed, Err(LockError::Lost)), "{renewed:?}");
            assert_eq!(
                holder.current_holder().unwrap().unwrap().fencing_token,
                taken.fencing_token
            );
        });
    }

    #[test]
    fn a_directory_an_earlier_kvcm_wrote_keeps_its_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let legacy = Slot {
            last_token: 41,
            holder: None,
        };
        std::fs::write(dir.path().join(LEGACY_RECORD), encode(&legacy)).unwrap();
        let lock = FileLock::open(dir.path()).unwrap();
        let token = lock
            .try_acquire(&conformance::node("a"), Duration::from_secs(60))
            .unwrap()
            .unwrap();
        assert_eq!(token.fencing_token, 42);
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
