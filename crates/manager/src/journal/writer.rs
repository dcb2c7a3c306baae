//! The log writer: appenders frame their records into a shared buffer and get a ticket;
//! whoever flushes writes whatever accumulated with one `write` and, under `fsync = always`,
//! one `fdatasync`, then wakes every appender the flush covered (group commit). Under
//! `always` and `never`, while writers come one at a time, that is the waiter itself (no
//! hand-off between threads on a lone writer's path: its appends do not even wake the
//! flusher); the flusher thread flushes what a waiter that could not lead needs, gathers
//! batches under concurrent writers, and owns every flush under `every N ms`. A record
//! appended while writers come one at a time and never waited for reaches the file with the
//! next flush (a later wait, a rotation or the writer's stop), like any unacknowledged one.
//!
//! Durability of a ticket: under `always` its record was fdatasync'ed; under `every N ms` and
//! `never` it was written to the file (it survives a SIGKILL of the process, not an OS crash:
//! `every N ms` loses at most the last N ms, `never` whatever the OS had not written back).
//!
//! Invariants:
//! - tickets are record positions (1, 2, ...) in append order, and a ticket is durable once
//!   `durable >= ticket`: flushes cover prefixes of the buffer, in order;
//! - the file is only written by whoever holds it out of [`State::file`] (a flush, by the
//!   flusher or a waiter; [`LogWriter::rotate`] while it switches segments), never by two
//!   at once;
//! - after a failed write or sync the writer is failed for good: every waiting and later
//!   ticket gets the error (writes are refused; reads go on), and what reaches the disk is a
//!   prefix of the appends. A restart replays that prefix.

#[cfg(test)]
use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvcm_index::LogTicket;

use super::files;
use super::segment::Segment;
use super::{FsyncPolicy, JournalError, JournalStats};

/// The appended, not yet flushed records and the writer's progress.
#[derive(Debug)]
struct State {
    buffer: Vec<u8>,
    /// Ticket of the last record appended.
    appended: u64,
    /// Every ticket up to this one is durable.
    durable: u64,
    /// Why the writer failed, once it did.
    failed: Option<String>,
    /// The open segment, `None` while a flush or a rotation holds it.
    file: Option<Segment>,
    /// Sequence number of the open segment.
    segment: u64,
    /// Bytes written to segments since the last rotation.
    since_rotation: u64,
    /// Bytes written to segments since start.
    bytes: u64,
    /// Flushes done (each one `write`, and under `always` one `fdatasync`).
    flushes: u64,
    /// fdatasyncs done by flushes (the flusher's or a waiter's).
    syncs: u64,
    /// Every ticket up to this one was fdatasync'ed.
    synced: u64,
    /// The highest ticket a wait returned for.
    acknowledged: u64,
    /// Waits that returned durable.
    waits: u64,
    /// Threads in [`LogWriter::wait`] for a ticket not yet durable.
    waiting: u64,
    /// Writers the last flush covered (the threads waiting when it took the buffer, at least
    /// one): 1 while writers come one at a time — a waiter then flushes its own records,
    /// however many it appended — more under concurrent writers (the flusher gathers).
    last_writers: u64,
    /// Waits that returned, under `always`, for a ticket not yet synced (must stay 0).
    early_acknowledgements: u64,
    /// Records were appended without waking the flusher (a lone writer's: its wait
    /// flushes); a wait that cannot lead wakes it then.
    unannounced: bool,
    stop: bool,
    /// Idle waits the flusher began (a test knows it asleep from this).
    #[cfg(test)]
    flusher_idle_waits: u64,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Signalled when there is something to flush, or a stop.
    work: Condvar,
    /// Signalled when `durable`, `failed` or `file` change.
    progress: Condvar,
    dir: PathBuf,
    policy: FsyncPolicy,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes the buffered records (and fdatasyncs them when `sync`) with the lock released,
    /// holding the file out of the state meanwhile, marks them durable and wakes every
    /// waiter; the records written, or `None` when nothing was (nothing buffered; no file
    /// to take: another flush holds it; or the write failed: the writer is failed for good).
    fn flush<'a>(
        &'a self,
        mut state: MutexGuard<'a, State>,
        sync: bool,
    ) -> (MutexGuard<'a, State>, Option<u64>) {
        if state.buffer.is_empty() {
            return (state, None);
        }
        let Some(mut file) = state.file.take() else {
            return (state, None);
        };
        let batch = std::mem::take(&mut state.buffer);
        state.unannounced = false;
        let upto = state.appended;
        let records = upto - state.durable;
        let writers = state.waiting.max(1);
        drop(state);
        let written = file
            .write(&batch)
            .and_then(|()| if sync { file.sync() } else { Ok(()) })
            .map_err(|error| format!("writing {}: {error}", file.path().display()));
        let mut state = self.lock();
        state.file = Some(file);
        state.flushes += 1;
        let flushed = match written {
            Ok(()) => {
                state.durable = upto;
                state.since_rotation += batch.len() as u64;
                state.bytes += batch.len() as u64;
                if sync {
                    state.syncs += 1;
                    state.synced = upto;
                }
                state.last_writers = writers;
                Some(records)
            }
            Err(error) => {
                state.failed = Some(error);
                None
            }
        };
        self.progress.notify_all();
        // Reuse the batch's allocation for the next appends when nothing came meanwhile;
        // otherwise the flusher takes what came if no waiter does.
        if state.buffer.is_empty() {
            let mut reuse = batch;
            reuse.clear();
            state.buffer = reuse;
        } else {
            self.work.notify_one();
        }
        (state, flushed)
    }
}

/// The group-commit writer of one journal directory.
#[derive(Debug)]
pub(crate) struct LogWriter {
    shared: Arc<Shared>,
    flusher: Option<JoinHandle<()>>,
}

impl LogWriter {
    /// Creates segment `segment` in `dir` and starts the flusher.
    pub fn create(dir: PathBuf, segment: u64, policy: FsyncPolicy) -> Result<Self, JournalError> {
        let file = Segment::create(&dir, segment)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                buffer: Vec::with_capacity(1 << 16),
                appended: 0,
                durable: 0,
                failed: None,
                file: Some(file),
                segment,
                since_rotation: 0,
                bytes: 0,
                flushes: 0,
                syncs: 0,
                synced: 0,
                acknowledged: 0,
                waits: 0,
                waiting: 0,
                last_writers: 0,
                early_acknowledgements: 0,
                unannounced: false,
                stop: false,
                #[cfg(test)]
                flusher_idle_waits: 0,
            }),
            work: Condvar::new(),
            progress: Condvar::new(),
            dir,
            policy,
        });
        let flusher_shared = shared.clone();
        let flusher = std::thread::Builder::new()
            .name("kvcm-journal".into())
            .spawn(move || flush_loop(&flusher_shared))
            .map_err(|e| JournalError::Thread(e.to_string()))?;
        Ok(LogWriter {
            shared,
            flusher: Some(flusher),
        })
    }

    /// Frames `payload` into the buffer; its ticket is durable once [`LogWriter::wait`]
    /// returns for it.
    pub fn append(&self, payload: &[u8]) -> Result<LogTicket, JournalError> {
        let mut state = self.shared.lock();
        if let Some(failed) = &state.failed {
            return Err(JournalError::Failed(failed.clone()));
        }
        files::frame(payload, &mut state.buffer)?;
        state.appended += 1;
        let ticket = LogTicket(state.appended);
        // A lone writer's wait flushes its own records: waking the flusher as well would
        // cost a futex wake and a thread switch per record for nothing. A wait that finds
        // it cannot lead wakes the flusher then (see `wait_counted`).
        let waiter_flushes =
            !matches!(self.shared.policy, FsyncPolicy::Every(_)) && state.last_writers <= 1;
        state.unannounced = waiter_flushes;
        drop(state);
        if !waiter_flushes {
            self.shared.work.notify_one();
        }
        Ok(ticket)
    }

    /// Waits until `ticket` is durable. Under `always` and `never`, while writers come one
    /// at a time (the last flush covered one writer), a waiter that finds no flush running
    /// writes (and syncs) the buffer itself: a lone writer's call then needs no hand-off to
    /// the flusher thread and back, even when it appended several records before waiting.
    /// Once flushes cover several writers the flusher does them, gathering batches (group
    /// commit); under `every N ms` it does every flush (it owns the period's clock).
    pub fn wait(&self, ticket: LogTicket) -> Result<(), JournalError> {
        let mut state = self.shared.lock();
        state.waiting += 1;
        let (mut state, waited) = self.wait_counted(state, ticket);
        state.waiting -= 1;
        waited
    }

    /// [`LogWriter::wait`] with the waiter counted in [`State::waiting`].
    fn wait_counted<'a>(
        &'a self,
        mut state: MutexGuard<'a, State>,
        ticket: LogTicket,
    ) -> (MutexGuard<'a, State>, Result<(), JournalError>) {
        let leads = match self.shared.policy {
            FsyncPolicy::Always => Some(true),
            FsyncPolicy::Never => Some(false),
            FsyncPolicy::Every(_) => None,
        };
        loop {
            if state.durable >= ticket.0 {
                if self.shared.policy == FsyncPolicy::Always && state.synced < ticket.0 {
                    state.early_acknowledgements += 1;
                }
                state.acknowledged = state.acknowledged.max(ticket.0);
                state.waits += 1;
                return (state, Ok(()));
            }
            if let Some(failed) = &state.failed {
                let failed = JournalError::Failed(failed.clone());
                return (state, Err(failed));
            }
            let lone = state.last_writers <= 1 && state.file.is_some() && !state.buffer.is_empty();
            state = match leads {
                Some(sync) if lone => self.shared.flush(state, sync).0,
                _ => {
                    // The append may have left the flusher asleep (it expected a lone
                    // writer to flush); the records this wait needs must not stay put.
                    if state.unannounced && !state.buffer.is_empty() {
                        state.unannounced = false;
                        self.shared.work.notify_one();
                    }
                    wait_on(&self.shared.progress, state)
                }
            };
        }
    }

    /// Flushes and syncs the open segment and continues in a new one (the next sequence
    /// number, returned): every record appended before the call is in an older segment,
    /// every later one in the new segment or after.
    pub fn rotate(&self) -> Result<u64, JournalError> {
        let mut state = self.shared.lock();
        let mut file = loop {
            if let Some(failed) = &state.failed {
                return Err(JournalError::Failed(failed.clone()));
            }
            if let Some(file) = state.file.take() {
                break file;
            }
            state = wait_on(&self.shared.progress, state);
        };
        let next = state.segment + 1;
        let rotated = (|| {
            file.write(&state.buffer)
                .and_then(|()| file.close())
                .map_err(|e| JournalError::io(file.path(), e))?;
            state.bytes += state.buffer.len() as u64;
            Segment::create(&self.shared.dir, next)
        })();
        match rotated {
            Ok(new_file) => {
                state.buffer.clear();
                state.durable = state.appended;
                state.synced = state.appended;
                state.file = Some(new_file);
                state.segment = next;
                state.since_rotation = 0;
                drop(state);
                self.shared.progress.notify_all();
                Ok(next)
            }
            Err(error) => {
                state.failed = Some(error.to_string());
                state.file = Some(file);
                drop(state);
                self.shared.progress.notify_all();
                Err(error)
            }
        }
    }

    /// The writer's counters now.
    pub fn stats(&self) -> JournalStats {
        let state = self.shared.lock();
        JournalStats {
            appended: state.appended,
            durable: state.durable,
            flushes: state.flushes,
            syncs: state.syncs,
            synced: state.synced,
            acknowledged: state.acknowledged,
            waits: state.waits,
            early_acknowledgements: state.early_acknowledgements,
            log_bytes_since_snapshot: state.since_rotation,
            log_bytes: state.bytes,
            failure: state.failed.clone(),
        }
    }

    /// Makes later flushes go to `file` (a test's broken disk).
    #[cfg(test)]
    pub fn replace_file(&self, file: File) {
        drop(self.hold_file());
        self.put_back(Segment::over(file));
    }

    /// Takes the segment out of the writer (no flush can run) until [`LogWriter::put_back`].
    #[cfg(test)]
    fn hold_file(&self) -> Segment {
        let mut state = self.shared.lock();
        loop {
            if let Some(file) = state.file.take() {
                return file;
            }
            state = wait_on(&self.shared.progress, state);
        }
    }

    /// Gives the writer `file` to flush to, and wakes whoever waits for one.
    #[cfg(test)]
    fn put_back(&self, file: Segment) {
        self.shared.lock().file = Some(file);
        self.shared.progress.notify_all();
        self.shared.work.notify_all();
    }
}

impl Drop for LogWriter {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.work.notify_all();
        if let Some(flusher) = self.flusher.take() {
            let _ = flusher.join();
        }
    }
}

fn wait_on<'a>(condvar: &Condvar, state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
    condvar.wait(state).unwrap_or_else(PoisonError::into_inner)
}

/// How long a flush may wait for more records when the last flush covered several writers
/// (the writers it woke are likely appending again): group commit without a delay for a
/// lone writer.
const GATHER: Duration = Duration::from_micros(100);

/// The flusher thread's own state.
struct Flusher<'a> {
    shared: &'a Shared,
    last_sync: Instant,
    /// Something written is not synced yet (`every N ms`).
    unsynced: bool,
}

/// The flusher: waits for appended records, writes them (and syncs per policy), marks them
/// durable; under `every N ms` a flush also syncs once N ms passed since the last sync, and
/// an idle flusher syncs what it wrote when the period ends.
fn flush_loop(shared: &Shared) {
    let mut flusher = Flusher {
        shared,
        last_sync: Instant::now(),
        unsynced: false,
    };
    let mut state = shared.lock();
    loop {
        if state.stop && (state.buffer.is_empty() || state.failed.is_some()) {
            return;
        }
        let idle = state.buffer.is_empty() || state.file.is_none() || state.failed.is_some();
        state = if idle {
            #[cfg(test)]
            {
                state.flusher_idle_waits += 1;
            }
            flusher.idle(state)
        } else {
            let state = flusher.gather(state);
            flusher.flush(state)
        };
    }
}

impl<'a> Flusher<'a> {
    /// Waits for work; under `every N ms` syncs what is unsynced once the period ended.
    fn idle(&mut self, state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        let FsyncPolicy::Every(period) = self.shared.policy else {
            return wait_on(&self.shared.work, state);
        };
        if !self.unsynced {
            return wait_on(&self.shared.work, state);
        }
        let wait = period.saturating_sub(self.last_sync.elapsed());
        let (mut state, _) = self
            .shared
            .work
            .wait_timeout(state, wait.max(Duration::from_millis(1)))
            .unwrap_or_else(PoisonError::into_inner);
        if self.last_sync.elapsed() >= period {
            if let Some(file) = &state.file {
                match file.sync() {
                    Ok(()) => state.synced = state.durable,
                    Err(error) => {
                        state.failed = Some(format!("syncing the journal: {error}"));
                        self.shared.progress.notify_all();
                    }
                }
                state.syncs += 1;
                self.last_sync = Instant::now();
                self.unsynced = false;
            }
        }
        state
    }

    /// After a flush that covered several writers, waits up to [`GATHER`] until as many
    /// records are pending (each of them appends at least one).
    fn gather(&self, mut state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        let last_writers = state.last_writers;
        if last_writers < 2 || self.shared.policy != FsyncPolicy::Always {
            return state;
        }
        let deadline = Instant::now() + GATHER;
        while state.appended - state.durable < last_writers && !state.stop {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                break;
            };
            state = self
                .shared
                .work
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        state
    }

    /// Writes the buffer (and syncs per policy) with the lock released; marks it durable.
    fn flush(&mut self, state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        let sync = match self.shared.policy {
            FsyncPolicy::Always => true,
            FsyncPolicy::Every(period) => self.last_sync.elapsed() >= period,
            FsyncPolicy::Never => false,
        };
        let (state, flushed) = self.shared.flush(state, sync);
        if flushed.is_some() {
            if sync {
                self.last_sync = Instant::now();
            }
            self.unsynced = !sync;
        }
        state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interval_policy_syncs_under_continuous_appends_and_when_idle() {
        let dir = tempfile::tempdir().unwrap();
        let period = Duration::from_millis(2);
        let writer = LogWriter::create(dir.path().into(), 1, FsyncPolicy::Every(period)).unwrap();
        let busy_until = Instant::now() + Duration::from_millis(100);
        while Instant::now() < busy_until {
            let ticket = writer.append(b"record").unwrap();
            writer.wait(ticket).unwrap();
        }
        let busy = writer.stats();
        assert!(busy.syncs >= 2, "synced while busy: {busy:?}");
        assert!(busy.syncs < busy.flushes, "not every flush: {busy:?}");
        let ticket = writer.append(b"last").unwrap();
        writer.wait(ticket).unwrap();
        let synced_at = writer.stats().syncs;
        let deadline = Instant::now() + Duration::from_secs(10);
        while writer.stats().syncs == synced_at {
            assert!(
                Instant::now() < deadline,
                "an idle writer syncs its last write"
            );
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_flush_counts_the_writers_it_covers_not_their_records() {
        let dir = tempfile::tempdir().unwrap();
        let writer = LogWriter::create(dir.path().into(), 1, FsyncPolicy::Always).unwrap();
        // One writer appends three records, then waits: still a lone writer (it flushes its
        // own records next time too, with no hand-off to the flusher).
        let file = writer.hold_file();
        let tickets: Vec<LogTicket> = (0..3).map(|_| writer.append(b"r").unwrap()).collect();
        writer.put_back(file);
        writer.wait(tickets[2]).unwrap();
        let state = writer.shared.lock();
        assert_eq!((state.flushes, state.durable), (1, 3), "one flush took all");
        assert_eq!(state.last_writers, 1);
        drop(state);

        // Two writers waiting when the flush takes the buffer: the flusher gathers next time.
        let file = writer.hold_file();
        std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| writer.wait(writer.append(b"w").unwrap()).unwrap());
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while writer.shared.lock().waiting < 2 {
                assert!(Instant::now() < deadline, "both writers wait");
                std::thread::yield_now();
            }
            writer.put_back(file);
        });
        let state = writer.shared.lock();
        assert_eq!((state.flushes, state.durable), (2, 5));
        assert_eq!(state.last_writers, 2);
        assert_eq!(state.waiting, 0);
    }

    #[test]
    fn a_waiter_that_cannot_lead_gets_its_record_flushed() {
        let dir = tempfile::tempdir().unwrap();
        let writer = LogWriter::create(dir.path().into(), 1, FsyncPolicy::Never).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while writer.shared.lock().flusher_idle_waits == 0 {
            assert!(Instant::now() < deadline, "the flusher goes idle");
            std::thread::yield_now();
        }
        // Appended while writers came one at a time: the append leaves the flusher asleep.
        let ticket = writer.append(b"r").unwrap();
        // Concurrent writers since: the waiter does not lead, so it must wake the flusher.
        writer.shared.lock().last_writers = 2;
        let (done, waited) = std::sync::mpsc::channel();
        std::thread::scope(|scope| {
            scope.spawn(|| done.send(writer.wait(ticket)).unwrap());
            let answer = waited.recv_timeout(Duration::from_secs(10));
            // Unstick a waiter left hanging before failing, so that the scope can end.
            writer.shared.work.notify_all();
            assert!(
                matches!(answer, Ok(Ok(()))),
                "the record is flushed: {answer:?}"
            );
        });
        assert_eq!(writer.stats().durable, 1);
    }

    #[test]
    fn a_record_larger_than_recovery_reads_is_refused_and_the_writer_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let writer = LogWriter::create(dir.path().into(), 1, FsyncPolicy::Never).unwrap();
        let huge = vec![0u8; files::MAX_RECORD_BYTES + 1];
        let refused = writer.append(&huge);
        assert!(
            matches!(refused, Err(JournalError::RecordTooLarge { bytes, .. }) if bytes == huge.len()),
            "{refused:?}"
        );
        let ticket = writer.append(b"after").unwrap();
        writer.wait(ticket).unwrap();
        let stats = writer.stats();
        assert_eq!((stats.appended, stats.durable), (1, 1), "{stats:?}");
        assert_eq!(
            stats.failure, None,
            "a refused record does not fail the writer"
        );
    }

    #[test]
    fn a_dropped_failed_writer_does_not_hang() {
        let dir = tempfile::tempdir().unwrap();
        let writer = LogWriter::create(dir.path().into(), 1, FsyncPolicy::Always).unwrap();
        writer.replace_file(
            std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .unwrap(),
        );
        let ticket = writer.append(b"lost").unwrap();
        assert!(writer.wait(ticket).is_err());
        assert!(writer.append(b"refused").is_err());
        drop(writer);
    }
}
