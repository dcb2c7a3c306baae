//! Snapshots: the log is rotated (every earlier record is then in a closed segment), the
//! whole state is written to `snapshot-<new segment>.snap` (temporary name, synced, renamed,
//! directory synced), and the files it makes redundant are removed: segments and snapshots
//! of lower sequence.
//!
//! The state is read while writes go on; each key's value is read at some moment after the
//! rotation, and every change after the rotation is in the new segment, so the snapshot plus
//! the segments from its sequence on replay to the current state.

use std::io::{BufWriter, Write};
use std::sync::{Arc, Weak};
use std::time::Duration;

use kvcm_index::{BlockKey, ScanCursor};

use super::files::{self, SNAPSHOT_MAGIC};
use super::record::{DurableEntry, Record};
use super::sink::durable_entry;
use super::{Journal, JournalError};
use crate::entry::StorageHandle;
use crate::instance::Instance;
use crate::storages::Incarnations;
use crate::sync::{lock, read_lock};
use crate::Manager;

/// Keys per `Entries` record of a snapshot.
const KEYS_PER_RECORD: usize = 1024;
/// How often the snapshot thread looks at the log's growth.
const CHECK_EVERY: Duration = Duration::from_millis(500);

impl Manager {
    /// Takes a snapshot now; returns its sequence.
    pub(crate) fn take_snapshot(&self, journal: &Journal) -> Result<u64, JournalError> {
        let _one_at_a_time = lock(&journal.snapshotting);
        let sequence = journal.writer.rotate()?;
        // The instances after the rotation, both lists under one lock (a removal moves an
        // instance from one to the other under it). Not under it across the rotation, whose
        // sync would stall every reader of the map: a removal and a new registration of one
        // id landing in between then replay over the snapshot's copy of the new instance,
        // whose entries the new segment rebuilds; the copy, replayed as removed, releases
        // blocks the restored instance holds too, which frees nothing.
        let (registered, unfinished) = {
            let instances = read_lock(&self.instances);
            let registered: Vec<_> = instances.values().cloned().collect();
            (registered, self.unfinished_removals())
        };
        let dir = &journal.config.dir;
        let path = files::snapshot_path(dir, sequence);
        let temporary = path.with_extension("snap.tmp");
        let file =
            std::fs::File::create(&temporary).map_err(|e| JournalError::io(&temporary, e))?;
        let mut out = SnapshotWriter {
            out: BufWriter::with_capacity(1 << 20, file),
            frame: Vec::new(),
            records: 0,
        };
        let written = out
            .header(sequence)
            .and_then(|()| self.write_state(&mut out, &registered, &unfinished))
            .and_then(|()| out.finish());
        written.and_then(|file| file.sync_data()).map_err(|e| {
            // A partial snapshot is never read; it would only hold the disk until the
            // next snapshot succeeds.
            let _ = std::fs::remove_file(&temporary);
            JournalError::io(&temporary, e)
        })?;
        std::fs::rename(&temporary, &path).map_err(|e| JournalError::io(&path, e))?;
        files::sync_dir(&path)?;
        remove_before(dir, sequence)?;
        Ok(sequence)
    }

    /// Every registry object, the `registered` instances' entries and the `unfinished`
    /// removals, as records.
    fn write_state(
        &self,
        out: &mut SnapshotWriter,
        registered: &[Arc<Instance>],
        unfinished: &[Arc<Instance>],
    ) -> std::io::Result<()> {
        let incarnations = self.storages.incarnations();
        for handle in 0..incarnations.len() {
            let handle = StorageHandle(handle as u16);
            if let Some(incarnation) = incarnations.get(handle) {
                let config = incarnation.backend.config().clone();
                out.record(&Record::Incarnation { handle, config })?;
            }
        }
        for config in self.storages.list() {
            if let Some(handle) = self.storages.current_handle(&config.global_unique_name) {
                out.record(&Record::Storage { handle, config })?;
            }
        }
        for name in self.storages.disabled() {
            out.record(&Record::StorageAvailability {
                name,
                available: false,
            })?;
        }
        let groups: Vec<_> = read_lock(&self.groups).values().cloned().collect();
        for group in groups {
            out.record(&Record::Group(group.as_ref().clone()))?;
        }
        for account in self.list_accounts() {
            out.record(&Record::Account(account))?;
        }
        for key in self.list_api_keys() {
            out.record(&Record::ApiKey(key))?;
        }
        // Removed instances first: a registered one may have the same id.
        for instance in unfinished {
            write_instance(out, instance, &incarnations)?;
            out.record(&Record::InstanceRemoved(instance.id().to_string()))?;
        }
        for instance in registered {
            write_instance(out, instance, &incarnations)?;
        }
        Ok(())
    }
}

/// An instance's registration and entries, as records.
fn write_instance(
    out: &mut SnapshotWriter,
    instance: &Instance,
    incarnations: &Incarnations,
) -> std::io::Result<()> {
    out.record(&Record::Instance(instance.info().clone()))?;
    let mut cursor = Some(ScanCursor::START);
    while let Some(position) = cursor {
        let page = instance
            .index
            .scan(position, KEYS_PER_RECORD)
            .map_err(std::io::Error::other)?;
        let values = instance
            .index
            .get(&page.keys)
            .map_err(std::io::Error::other)?;
        let changes = page
            .keys
            .iter()
            .zip(values)
            .filter_map(|(key, value)| {
                let durable = durable_entry(value.as_ref()?, incarnations)?;
                Some((*key, Some(durable)))
            })
            .collect();
        write_entries(out, instance.id(), changes)?;
        cursor = page.next;
    }
    Ok(())
}

/// Writes `changes` as `Entries` records within the journal's record limit (see
/// [`split_entries`]).
fn write_entries(
    out: &mut SnapshotWriter,
    instance_id: &str,
    changes: Vec<(BlockKey, Option<DurableEntry>)>,
) -> std::io::Result<()> {
    let limit = files::MAX_RECORD_BYTES;
    split_entries(instance_id, changes, limit, &mut |payload| {
        out.payload(payload)
    })
}

/// Encodes `changes` as one `Entries` record or, when that record would pass `limit`
/// bytes, as two halves (recursively), handing each encoded record to `emit`: only a single
/// entry over the limit — which the live log refused — is handed on too large (and refused
/// by the frame: the snapshot fails).
fn split_entries(
    instance_id: &str,
    mut changes: Vec<(BlockKey, Option<DurableEntry>)>,
    limit: usize,
    emit: &mut dyn FnMut(&[u8]) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let record = Record::Entries {
        instance_id: instance_id.to_string(),
        changes,
    };
    let payload = record.encode();
    if payload.len() <= limit {
        return emit(&payload);
    }
    match record {
        Record::Entries { changes: all, .. } if all.len() >= 2 => changes = all,
        _ => return emit(&payload),
    }
    let second = changes.split_off(changes.len() / 2);
    split_entries(instance_id, changes, limit, emit)?;
    split_entries(instance_id, second, limit, emit)
}

/// A snapshot file being written.
struct SnapshotWriter {
    out: BufWriter<std::fs::File>,
    frame: Vec<u8>,
    records: u64,
}

impl SnapshotWriter {
    fn header(&mut self, sequence: u64) -> std::io::Result<()> {
        self.out.write_all(&files::header(SNAPSHOT_MAGIC, sequence))
    }

    fn record(&mut self, record: &Record) -> std::io::Result<()> {
        self.payload(&record.encode())
    }

    /// Writes one encoded record.
    fn payload(&mut self, payload: &[u8]) -> std::io::Result<()> {
        self.frame.clear();
        files::frame(payload, &mut self.frame)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        self.records += 1;
        self.out.write_all(&self.frame)
    }

    /// Writes the end record and flushes; returns the file.
    fn finish(mut self) -> std::io::Result<std::fs::File> {
        let end = Record::End(self.records);
        self.record(&end)?;
        self.out.into_inner().map_err(|e| e.into_error())
    }
}

/// Removes segments, snapshots and unfinished snapshots of sequence below `sequence`.
fn remove_before(dir: &std::path::Path, sequence: u64) -> Result<(), JournalError> {
    let listing = files::list(dir)?;
    let old = listing
        .segments
        .iter()
        .chain(&listing.snapshots)
        .filter(|(s, _)| *s < sequence);
    for (_, path) in old {
        std::fs::remove_file(path).map_err(|e| JournalError::io(path, e))?;
    }
    for path in listing.unfinished.iter().filter(|(s, _)| *s < sequence) {
        std::fs::remove_file(&path.1).map_err(|e| JournalError::io(&path.1, e))?;
    }
    files::sync_dir(&files::segment_path(dir, sequence))
}

/// Starts the thread that snapshots once the log grew by `snapshot_bytes`; it ends with the
/// manager.
pub(crate) fn spawn_snapshotter(
    manager: Weak<Manager>,
    journal: Arc<Journal>,
) -> Result<(), JournalError> {
    let limit = journal.config.snapshot_bytes;
    let thread = std::thread::Builder::new().name("kvcm-snapshot".into());
    let spawned = thread.spawn(move || loop {
        std::thread::sleep(CHECK_EVERY);
        let Some(manager) = manager.upgrade() else {
            return;
        };
        manager.prune_unfinished();
        if journal.stats().log_bytes_since_snapshot < limit {
            continue;
        }
        if let Err(error) = manager.take_snapshot(&journal) {
            tracing::warn!(%error, "taking a journal snapshot");
        }
    });
    spawned
        .map(drop)
        .map_err(|e| JournalError::Thread(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_past_the_record_limit_are_split_into_records_within_it() {
        let changes: Vec<(BlockKey, Option<DurableEntry>)> = (0..20).map(|k| (k, None)).collect();
        let mut payloads: Vec<Vec<u8>> = Vec::new();
        split_entries("i", changes, 64, &mut |payload| {
            payloads.push(payload.to_vec());
            Ok(())
        })
        .unwrap();
        assert!(payloads.len() > 1, "split");
        let mut keys = Vec::new();
        for payload in &payloads {
            assert!(payload.len() <= 64, "{} bytes", payload.len());
            match Record::decode(payload).unwrap() {
                Record::Entries {
                    instance_id,
                    changes,
                } => {
                    assert_eq!(instance_id, "i");
                    keys.extend(changes.into_iter().map(|(key, _)| key));
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            keys,
            (0..20).collect::<Vec<BlockKey>>(),
            "every change, in order"
        );
    }
}
