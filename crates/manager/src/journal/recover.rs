//! Recovery: the newest complete snapshot and the log segments after it are folded into the
//! final state ([`Replay`]), which is then registered into the manager through the same
//! validation as clients' requests, and the entries restored.
//!
//! Restoring an entry: each location's storage is found by name (handles are per process);
//! file-tier parts are adopted by their object names (one reference each, as if allocated);
//! SERVING locations are kept and counted in the instance's quota usage; WRITING locations
//! (sessions open at the crash) and DELETING ones are freed on their storage and dropped.
//! Entries of an instance removed before the crash (a RemoveInstance whose deletion had not
//! finished: its clean-up is not logged) are adopted after every registered instance's
//! entries are restored, so a later instance of the same id keeps what it holds (file blocks
//! are counted per allocation and tracked with their size), and handed to the removal's
//! background deletion; a removed instance's pool parts are left unadopted, which frees them.
//! Locations whose storage is gone, or whose parts cannot be adopted, are dropped and counted;
//! locations written under another config of their storage (an UpdateStorage that moved its
//! root) are dropped from the index and counted as stale, their bytes left where they are.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use kvcm_index::{BlockKey, IndexError, LocalIndex, LocalIndexConfig, MetaIndex};
use kvcm_storage::{DataStorage, NamedPart, PartAddress, PartRef, StorageConfig, StorageKind};

use super::files::{self, ReadEnd, SNAPSHOT_MAGIC};
use super::record::{DurableEntry, Record};
use super::JournalError;
use crate::accounts::Account;
use crate::api_keys::ApiKey;
use crate::entry::{Entry, Location, LocationState, StorageHandle};
use crate::error::ManagerResult;
use crate::group_config::GroupConfig;
use crate::instance::Instance;
use crate::password::StoredPassword;
use crate::registration::InstanceInfo;
use crate::Manager;

/// What recovery found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Sequence of the snapshot replay started from, if any.
    pub snapshot: Option<u64>,
    /// Log segments read.
    pub segments: usize,
    /// Records replayed (snapshot and log).
    pub records: u64,
    /// Where a damaged tail was cut, and what was wrong (file: reason).
    pub cut: Vec<String>,
    /// Objects or records refused and skipped, with the reason.
    pub skipped: Vec<String>,
    /// Storages, groups, instances, accounts and API keys restored.
    pub registry_objects: usize,
    /// Block entries restored.
    pub entries: u64,
    /// Locations dropped (storage gone, bytes volatile, parts not adoptable).
    pub dropped_locations: u64,
    /// Locations of a storage whose config changed since they were written (UpdateStorage
    /// moved its root, say): dropped from the index, their bytes left where they are.
    pub stale_locations: u64,
    /// WRITING or DELETING locations whose bytes were freed.
    pub cleaned_locations: u64,
    /// File-tier locations of removed instances handed to the background deletion (a
    /// removal the earlier process may not have finished; releasing what it did finish
    /// frees nothing twice).
    pub removed_locations: u64,
    /// Entries the index refused to take back (more keys than a lowered `max_key_count`
    /// allows): their locations' bytes were freed.
    pub over_cap_entries: u64,
    /// The sequence the log continues at.
    pub(crate) next_sequence: u64,
}

/// The state the records describe, folded in order.
#[derive(Debug, Default)]
pub(crate) struct Replay {
    storages: BTreeMap<String, (StorageHandle, StorageConfig)>,
    /// Storages the admin disabled.
    disabled: BTreeSet<String>,
    handles: HashMap<StorageHandle, StorageConfig>,
    groups: BTreeMap<String, GroupConfig>,
    instances: BTreeMap<String, InstanceInfo>,
    accounts: BTreeMap<String, Account>,
    api_keys: BTreeMap<String, ApiKey>,
    entries: HashMap<String, HashMap<BlockKey, DurableEntry>>,
    /// Removed instances' registrations and the entries they still had, in removal order.
    removed: Vec<(InstanceInfo, HashMap<BlockKey, DurableEntry>)>,
}

impl Replay {
    /// The accounts recorded with a clear password (by an older build): restoring hashes
    /// them, and the store they came from should be rewritten with the hash.
    pub fn accounts_in_clear(&self) -> Vec<String> {
        let clear = |account: &&Account| matches!(account.password, StoredPassword::Clear(_));
        self.accounts
            .values()
            .filter(clear)
            .map(|a| a.user_name.clone())
            .collect()
    }

    /// Applies one record (index changes of an instance that is not registered are ignored).
    pub fn apply(&mut self, record: Record) {
        match record {
            Record::Storage { handle, config } => {
                self.handles.insert(handle, config.clone());
                self.storages
                    .insert(config.global_unique_name.clone(), (handle, config));
            }
            Record::Incarnation { handle, config } => {
                self.handles.insert(handle, config);
            }
            Record::StorageRemoved(name) => {
                self.disabled.remove(&name);
                self.storages.remove(&name);
            }
            Record::StorageAvailability { name, available } => {
                if available {
                    self.disabled.remove(&name);
                } else {
                    self.disabled.insert(name);
                }
            }
            Record::Group(group) => {
                self.groups.insert(group.name.clone(), group);
            }
            Record::GroupRemoved(name) => {
                self.groups.remove(&name);
            }
            Record::Instance(info) => {
                self.entries.entry(info.instance_id.clone()).or_default();
                self.instances.insert(info.instance_id.clone(), info);
            }
            Record::InstanceRemoved(id) => {
                let info = self.instances.remove(&id);
                let entries = self.entries.remove(&id).filter(|e| !e.is_empty());
                if let (Some(info), Some(entries)) = (info, entries) {
                    self.removed.push((info, entries));
                }
            }
            Record::Account(account) => {
                self.accounts.insert(account.user_name.clone(), account);
            }
            Record::AccountRemoved(name) => {
                self.api_keys.retain(|_, key| key.user_name != name);
                self.accounts.remove(&name);
            }
            Record::ApiKey(key) => {
                self.api_keys.insert(key.id.clone(), key);
            }
            Record::ApiKeyRevoked(id) => {
                self.api_keys.remove(&id);
            }
            Record::Entries {
                instance_id,
                changes,
            } => {
                let Some(entries) = self.entries.get_mut(&instance_id) else {
                    return;
                };
                for (key, entry) in changes {
                    match entry {
                        Some(entry) => entries.insert(key, entry),
                        None => entries.remove(&key),
                    };
                }
            }
            Record::End(_) => {}
        }
    }
}

impl Replay {
    /// Gives the replayed storages handles 0, 1, … in name order and forgets every other
    /// incarnation (a shared store's records carry handles of whichever process wrote them);
    /// returns each storage's handle and spec.
    pub fn renumber_storages(&mut self) -> HashMap<String, (StorageHandle, StorageConfig)> {
        self.handles.clear();
        let mut numbered = HashMap::with_capacity(self.storages.len());
        for (number, (name, (handle, config))) in self.storages.iter_mut().enumerate() {
            *handle = StorageHandle(number as u16);
            self.handles.insert(*handle, config.clone());
            numbered.insert(name.clone(), (*handle, config.clone()));
        }
        numbered
    }

    /// Ids of the replayed instances.
    pub fn instance_ids(&self) -> Vec<String> {
        self.instances.keys().cloned().collect()
    }

    /// Adds one entry of a replayed instance (ignored for any other).
    pub fn insert_entry(&mut self, instance_id: &str, key: BlockKey, entry: DurableEntry) {
        if let Some(entries) = self.entries.get_mut(instance_id) {
            entries.insert(key, entry);
        }
    }
}

/// Reads the journal directory: the newest complete snapshot, then the segments from its
/// sequence on; a damaged segment is cut at its last valid record (the file truncated there)
/// and later segments are set aside (renamed `.discarded`), all reported.
pub(crate) fn read_journal(
    dir: &std::path::Path,
    report: &mut RecoveryReport,
) -> Result<Replay, JournalError> {
    let listing = files::list(dir)?;
    let mut replay = Replay::default();
    let mut start = 0;
    for (sequence, path) in listing.snapshots.iter().rev() {
        match read_snapshot(path) {
            Ok(records) => {
                report.records += records.len() as u64;
                records.into_iter().for_each(|r| replay.apply(r));
                report.snapshot = Some(*sequence);
                start = *sequence;
                break;
            }
            Err(reason) => report.cut.push(format!("{}: {reason}", path.display())),
        }
    }
    // Segments older than a snapshot are removed once it is written: without a readable
    // snapshot the log holds only the changes after it, and replaying them over nothing
    // (then snapshotting that) would lose the rest for good.
    if report.snapshot.is_none() {
        if let Some((_, newest)) = listing.snapshots.last() {
            return Err(JournalError::Damaged {
                path: newest.clone(),
                reason: format!(
                    "no snapshot is readable ({}) and the log alone holds only the changes \
                     after them; kvcm does not start from it. Restore the snapshot from a \
                     backup, or move the snapshot files aside to start from the log alone \
                     (losing what only they held)",
                    report.cut.join("; ")
                ),
            });
        }
    }
    let mut last = start.max(listing.snapshots.last().map_or(0, |(s, _)| *s));
    let newest_file = listing.segments.last().map_or(0, |(s, _)| *s);
    let mut segments = listing.segments.iter().filter(|(s, _)| *s >= start);
    for (sequence, path) in segments.by_ref() {
        last = last.max(*sequence);
        report.segments += 1;
        let mut end = read_segment(path, &mut replay, report)?;
        // Only the newest segment is ever left with zeros after its records (a rotation
        // cuts them before the next segment exists, and so does this recovery, below):
        // zeros ending an older one are lost records.
        if end.zeros_after && *sequence != newest_file {
            end.damage = Some("zeros before the end of a segment that is not the last".into());
        }
        if let Some(damage) = &end.damage {
            cut_tail(path, &end, damage, report)?;
            break;
        }
        if end.zeros_after {
            // The zeros a crash left after the newest segment's records go before a new
            // segment follows it.
            truncate_durably(path, end.valid_bytes)?;
        }
    }
    for (sequence, path) in segments {
        last = last.max(*sequence);
        let aside = path.with_extension("log.discarded");
        std::fs::rename(path, &aside).map_err(|e| JournalError::io(path, e))?;
        report.cut.push(format!(
            "{}: after a damaged segment; set aside as {}",
            path.display(),
            aside.display()
        ));
    }
    report.next_sequence = last.max(newest_file) + 1;
    Ok(replay)
}

fn read_segment(
    path: &std::path::Path,
    replay: &mut Replay,
    report: &mut RecoveryReport,
) -> Result<ReadEnd, JournalError> {
    let mut skipped = Vec::new();
    let end = files::read_records(path, files::LOG_MAGIC, |payload| {
        match Record::decode(payload) {
            Ok(record) => {
                report.records += 1;
                replay.apply(record);
            }
            Err(error) => skipped.push(format!("{}: a record: {error}", path.display())),
        }
    });
    report.skipped.append(&mut skipped);
    match end {
        Err(JournalError::Damaged { reason, .. }) => Ok(ReadEnd {
            sequence: 0,
            valid_bytes: 0,
            damage: Some(reason),
            zeros_after: false,
        }),
        other => other,
    }
}

/// Truncates `path` to `len` bytes, durably.
fn truncate_durably(path: &std::path::Path, len: u64) -> Result<(), JournalError> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| JournalError::io(path, e))?;
    file.set_len(len)
        .and_then(|()| file.sync_all())
        .map_err(|e| JournalError::io(path, e))
}

/// Truncates a damaged segment to its valid prefix (a file whose header is damaged is set
/// aside instead) and reports it.
fn cut_tail(
    path: &std::path::Path,
    end: &ReadEnd,
    damage: &str,
    report: &mut RecoveryReport,
) -> Result<(), JournalError> {
    if end.valid_bytes < files::HEADER_BYTES {
        let aside = path.with_extension("log.discarded");
        std::fs::rename(path, &aside).map_err(|e| JournalError::io(path, e))?;
    } else {
        truncate_durably(path, end.valid_bytes)?;
    }
    report.cut.push(format!(
        "{}: {damage}; cut at byte {}",
        path.display(),
        end.valid_bytes
    ));
    Ok(())
}

/// The records of a complete snapshot (its `End` record counts the others), or why not.
fn read_snapshot(path: &std::path::Path) -> Result<Vec<Record>, String> {
    let mut records = Vec::new();
    let mut decode_error = None;
    let end = files::read_records(path, SNAPSHOT_MAGIC, |payload| {
        match Record::decode(payload) {
            Ok(record) => records.push(record),
            Err(error) => {
                decode_error.get_or_insert(error.to_string());
            }
        }
    })
    .map_err(|e| e.to_string())?;
    if let Some(error) = decode_error {
        return Err(format!("a record does not decode: {error}"));
    }
    if let Some(damage) = end.damage {
        return Err(damage);
    }
    match records.pop() {
        Some(Record::End(count)) if count == records.len() as u64 => Ok(records),
        _ => Err("incomplete (no matching end record)".to_string()),
    }
}

impl Manager {
    /// Registers the replayed registry and restores the entries (the journal is not open yet:
    /// nothing of this is logged; the snapshot taken next records the result).
    /// Returns the bytes of entries not kept, to free once the recovered state is durable.
    pub(crate) fn restore(&self, replay: Replay, report: &mut RecoveryReport) -> DeferredFrees {
        let Replay {
            storages,
            disabled,
            handles,
            groups,
            instances,
            accounts,
            api_keys,
            mut entries,
            removed,
        } = replay;
        let mut restored = |what: String, result: ManagerResult<()>| match result {
            Ok(()) => report.registry_objects += 1,
            Err(error) => report.skipped.push(format!("{what}: {error}")),
        };
        for (name, (_, config)) in storages {
            let mut added = self.restore_storage(config);
            if added.is_ok() && disabled.contains(&name) {
                added = self.storages.set_available(&name, false);
            }
            restored(format!("storage {name:?}"), added);
        }
        for (name, group) in groups {
            restored(format!("group {name:?}"), self.create_group(group));
        }
        // Instances whose group is gone (a journal from before RemoveInstanceGroup kept
        // groups in use) cannot be registered: their entries are deleted like a removed
        // instance's rather than leaked. Other refusals are reported and left alone.
        let mut refused = HashMap::new();
        for (id, info) in instances {
            let result = self.register_instance(info.clone()).map(drop);
            if result.is_err() && self.shared_group(&info.instance_group_name).is_none() {
                refused.insert(id.clone(), info);
            }
            restored(format!("instance {id:?}"), result);
        }
        for (name, account) in accounts {
            restored(format!("account {name:?}"), self.add_account(account));
        }
        for (id, key) in api_keys {
            restored(format!("API key {id:?}"), self.restore_api_key(key));
        }
        // Every instance's SERVING locations are adopted before any location that is freed:
        // a pool part freed and placed again before the crash is adopted for the block that
        // holds it now (a freed one's adoption is then refused as overlapping, and dropped).
        let mut max_nonce = 0;
        let mut to_free = Vec::new();
        let mut over_cap = DeferredFrees::default();
        let mut unregistered = Vec::new();
        for (id, entries) in entries.drain() {
            let Some(instance) = self.instance(&id) else {
                if let Some(info) = refused.remove(&id) {
                    unregistered.push((info, entries));
                }
                continue;
            };
            let unkept = (&mut to_free, &mut over_cap);
            let nonce = self.restore_entries(&instance, entries, &handles, report, unkept);
            max_nonce = max_nonce.max(nonce);
        }
        self.free_unfinished(to_free, &handles, report);
        for (info, entries) in removed.into_iter().chain(unregistered) {
            let nonce = self.restore_removed(info, entries, &handles, report);
            max_nonce = max_nonce.max(nonce);
        }
        self.nonces.fetch_max(
            max_nonce.saturating_add(1),
            std::sync::atomic::Ordering::AcqRel,
        );
        over_cap
    }

    /// Restores one instance's entries; returns the largest nonce seen. Keys with WRITING
    /// or DELETING locations go to `unkept.0` (freed after every SERVING one is adopted), the
    /// bytes of entries the index refused to `unkept.1`.
    fn restore_entries(
        &self,
        instance: &Arc<Instance>,
        entries: HashMap<BlockKey, DurableEntry>,
        handles: &HashMap<StorageHandle, StorageConfig>,
        report: &mut RecoveryReport,
        unkept: (&mut Vec<Unfinished>, &mut DeferredFrees),
    ) -> u32 {
        let (to_free, over_cap) = unkept;
        let mut max_nonce = 0;
        let mut batch: Vec<(BlockKey, Entry)> = Vec::new();
        let mut taken_back: Vec<Vec<TakenBack>> = Vec::new();
        for (key, durable) in entries {
            let mut kept = Vec::new();
            let mut undo = Vec::new();
            let mut unfinished = false;
            for location in durable.entry.locations() {
                max_nonce = max_nonce.max(location.nonce);
                if location.state != LocationState::Serving {
                    unfinished = true;
                    continue;
                }
                let adopted =
                    match self.adopt_location(instance.info(), key, &location, &durable, handles) {
                        Adoption::Adopted(adopted) => adopted,
                        Adoption::Stale => {
                            report.stale_locations += 1;
                            continue;
                        }
                        Adoption::Dropped => {
                            report.dropped_locations += 1;
                            continue;
                        }
                    };
                let bytes = instance.location_bytes(&adopted.location.as_ref());
                instance.usage().add(adopted.storage_type, bytes);
                kept.push(adopted.location);
                undo.push(TakenBack {
                    storage_type: adopted.storage_type,
                    bytes,
                    backend: adopted.backend,
                    uris: adopted.uris,
                });
            }
            if !kept.is_empty() {
                batch.push((key, Entry::new(kept)));
                taken_back.push(undo);
            }
            if unfinished {
                to_free.push((instance.clone(), key, durable));
            }
        }
        for (chunk, undo) in batch.chunks(4096).zip(taken_back.chunks(4096)) {
            let keys = put_restored(instance, chunk, undo, report, over_cap);
            self.published_keys_changed(instance, &keys);
        }
        max_nonce
    }

    /// Adopts and frees the WRITING and DELETING locations of `to_free` (sessions open at
    /// the crash, deletions not finished), once every SERVING location is adopted.
    fn free_unfinished(
        &self,
        to_free: Vec<Unfinished>,
        handles: &HashMap<StorageHandle, StorageConfig>,
        report: &mut RecoveryReport,
    ) {
        let mut freed = Vec::new();
        for (instance, key, durable) in &to_free {
            let unfinished = durable
                .entry
                .locations()
                .filter(|l| l.state != LocationState::Serving);
            for location in unfinished {
                match self.adopt_location(instance.info(), *key, &location, durable, handles) {
                    Adoption::Adopted(adopted) => {
                        report.cleaned_locations += 1;
                        freed.push((adopted.backend, adopted.uris));
                    }
                    Adoption::Stale => report.stale_locations += 1,
                    Adoption::Dropped => report.dropped_locations += 1,
                }
            }
        }
        free_all(freed, report);
    }

    /// Adopts every file-tier location of an instance that was removed before its blocks
    /// were all deleted, and hands them to the removal's own machinery: they are deleted in
    /// the background (retried while the index or storage fails) and, until they are, every
    /// snapshot records them. Returns the largest nonce seen.
    fn restore_removed(
        &self,
        info: InstanceInfo,
        entries: HashMap<BlockKey, DurableEntry>,
        handles: &HashMap<StorageHandle, StorageConfig>,
        report: &mut RecoveryReport,
    ) -> u32 {
        let mut max_nonce = 0;
        let mut adopted_entries = Vec::new();
        let in_pool = |storage| {
            handles
                .get(&storage)
                .is_some_and(|config| config.spec.kind() == StorageKind::TairMemPool)
        };
        for (key, durable) in entries {
            let mut kept = Vec::new();
            for location in durable.entry.locations() {
                max_nonce = max_nonce.max(location.nonce);
                // A pool part nobody adopts is free in this process already.
                if in_pool(location.storage) {
                    continue;
                }
                match self.adopt_location(&info, key, &location, &durable, handles) {
                    Adoption::Adopted(mut adopted) => {
                        report.removed_locations += 1;
                        // SERVING, so that the removal moves it to DELETING and deletes it.
                        adopted.location.state = LocationState::Serving;
                        kept.push(adopted);
                    }
                    Adoption::Stale => report.stale_locations += 1,
                    Adoption::Dropped => report.dropped_locations += 1,
                }
            }
            if !kept.is_empty() {
                adopted_entries.push((key, kept));
            }
        }
        if adopted_entries.is_empty() {
            return max_nonce;
        }
        let id = info.instance_id.clone();
        match self.removed_instance_holding(info, &adopted_entries) {
            Ok(instance) => {
                self.track_unfinished(instance.clone());
                self.delete_removed(instance);
            }
            Err(error) => {
                // No index to hand them over in: freed now, once.
                report.skipped.push(format!(
                    "entries of removed instance {id:?}, freed at once: {error}"
                ));
                let freed = adopted_entries
                    .into_iter()
                    .flat_map(|(_, kept)| kept)
                    .map(|adopted| (adopted.backend, adopted.uris));
                free_all(freed.collect(), report);
            }
        }
        max_nonce
    }

    /// A removed instance (unregistered, its index in memory and logged nowhere) holding the
    /// adopted locations of `entries`.
    fn removed_instance_holding(
        &self,
        info: InstanceInfo,
        entries: &[(BlockKey, Vec<Adopted>)],
    ) -> ManagerResult<Arc<Instance>> {
        let index = LocalIndex::new(LocalIndexConfig::default())?;
        let batch: Vec<(BlockKey, Entry)> = entries
            .iter()
            .map(|(key, kept)| {
                let locations = kept.iter().map(|a| a.location.clone()).collect();
                (*key, Entry::new(locations))
            })
            .collect();
        for chunk in batch.chunks(4096) {
            index.put(chunk.to_vec())?;
        }
        let index: Arc<dyn MetaIndex<Entry>> = Arc::new(index);
        Ok(Arc::new(Instance::new(info, index, 0, self.reclaim_policy)))
    }

    /// Finds a logged location's storage now and adopts its parts there. Dropped when the
    /// storage is gone or a part cannot be adopted (parts adopted so far are freed again);
    /// stale when the storage's config is no longer the one the location was written with.
    fn adopt_location(
        &self,
        instance: &InstanceInfo,
        key: BlockKey,
        location: &crate::entry::LocationRef<'_>,
        durable: &DurableEntry,
        handles: &HashMap<StorageHandle, StorageConfig>,
    ) -> Adoption {
        let Some(logged) = handles.get(&location.storage) else {
            return Adoption::Dropped;
        };
        let current = self.storages.current_handle(&logged.global_unique_name);
        let incarnations = self.storages.incarnations();
        let Some(incarnation) = current.and_then(|handle| incarnations.get(handle)) else {
            return Adoption::Dropped;
        };
        let backend = incarnation.backend.clone();
        if backend.config().spec != logged.spec {
            return Adoption::Stale;
        }
        let handle = current.expect("found above");
        let mut parts = Vec::with_capacity(location.parts.len());
        let mut uris = Vec::with_capacity(location.parts.len());
        for part in location.parts {
            let named = durable
                .names
                .iter()
                .find(|n| n.names(location.storage, part.address));
            let spec = instance.specs.get(usize::from(part.spec));
            let address: Option<PartAddress> = match (named, spec) {
                (Some(object), Some(spec)) => backend
                    .adopt(&NamedPart {
                        instance_id: &instance.instance_id,
                        name: &object.name,
                        block: part.address.block,
                        size: spec.size as u64,
                    })
                    .ok(),
                (None, Some(_)) => Some(part.address),
                (_, None) => None,
            };
            let uri = address.and_then(|address| {
                let spec = spec?;
                let reference = PartRef {
                    instance_id: &instance.instance_id,
                    key,
                    spec,
                    address,
                };
                let mut uri = String::new();
                backend
                    .write_uri(&reference, &mut uri)
                    .then_some((address, uri))
            });
            let Some((address, uri)) = uri else {
                let _ = backend.delete(&uris);
                return Adoption::Dropped;
            };
            parts.push(crate::entry::Part {
                spec: part.spec,
                address,
            });
            uris.push(uri);
        }
        Adoption::Adopted(Adopted {
            location: Location {
                storage: handle,
                state: location.state,
                nonce: location.nonce,
                parts,
                checksums: location.checksums.to_vec(),
            },
            storage_type: incarnation.storage_type,
            backend,
            uris,
        })
    }
}

/// Puts restored entries (`undo`: per entry, what restoring its locations took) into
/// `instance`'s index and returns the keys stored. An entry the index refuses is not kept:
/// its locations are uncounted, and their bytes go to `over_cap` — freed by the caller once
/// the recovered state without them is durable (freed before, a failed startup would bring
/// them back as SERVING at the next, pointing at freed bytes). Refused for its key count (a
/// `max_key_count` lowered since the entries were written), the chunk is put entry by entry,
/// so that the index fills up to its cap.
fn put_restored(
    instance: &Instance,
    chunk: &[(BlockKey, Entry)],
    undo: &[Vec<TakenBack>],
    report: &mut RecoveryReport,
    over_cap: &mut DeferredFrees,
) -> Vec<BlockKey> {
    let refused = |error: IndexError, report: &mut RecoveryReport| {
        report
            .skipped
            .push(format!("entries of instance {:?}: {error}", instance.id()));
        false
    };
    let stored: Vec<bool> = match instance.index.put(chunk.to_vec()) {
        Ok(()) => vec![true; chunk.len()],
        Err(IndexError::Full { .. }) => chunk
            .iter()
            .map(|entry| match instance.index.put(vec![entry.clone()]) {
                Ok(()) => true,
                Err(IndexError::Full { .. }) => {
                    report.over_cap_entries += 1;
                    false
                }
                Err(error) => refused(error, report),
            })
            .collect(),
        Err(error) => vec![refused(error, report); chunk.len()],
    };
    let mut keys = Vec::with_capacity(chunk.len());
    for ((key, _), (stored, undo)) in chunk.iter().zip(stored.into_iter().zip(undo)) {
        if stored {
            keys.push(*key);
            continue;
        }
        for taken in undo {
            instance.usage().add(taken.storage_type, -taken.bytes);
            over_cap.0.push((taken.backend.clone(), taken.uris.clone()));
        }
    }
    report.entries += keys.len() as u64;
    keys
}

/// Bytes of restored locations that were not kept, to free once the recovered state is
/// durable (the startup snapshot written, or the shared store written back).
#[derive(Default)]
#[must_use = "the bytes are freed by DeferredFrees::free once the recovered state is durable"]
pub(crate) struct DeferredFrees(Vec<(Arc<dyn DataStorage>, Vec<String>)>);

impl DeferredFrees {
    /// Frees them; a failure is reported (the file tier tries a failed unlink again after
    /// its storage's next healthy probe).
    pub(crate) fn free(self, report: &mut RecoveryReport) {
        free_all(self.0, report);
    }
}

/// A key of an instance whose WRITING or DELETING locations recovery frees.
type Unfinished = (Arc<Instance>, BlockKey, DurableEntry);

/// What restoring one location took: its bytes in the usage, a reference on its storage.
struct TakenBack {
    storage_type: crate::storage_type::StorageType,
    bytes: i64,
    backend: Arc<dyn DataStorage>,
    uris: Vec<String>,
}

/// Frees the adopted locations' bytes; a failure is reported (the file tier tries a failed
/// unlink again after its storage's next healthy probe).
fn free_all(freed: Vec<(Arc<dyn DataStorage>, Vec<String>)>, report: &mut RecoveryReport) {
    for (backend, uris) in freed {
        if let Err(error) = backend.delete(&uris) {
            report.skipped.push(format!("freeing {uris:?}: {error}"));
        }
    }
}

/// What became of a logged location.
enum Adoption {
    /// Taken back on its storage.
    Adopted(Adopted),
    /// Its storage is gone, or a part cannot be taken back.
    Dropped,
    /// Its storage's config changed since it was written.
    Stale,
}

/// A location taken back on its storage.
struct Adopted {
    location: Location,
    storage_type: crate::storage_type::StorageType,
    backend: Arc<dyn DataStorage>,
    /// Its parts' URIs (to free it).
    uris: Vec<String>,
}
