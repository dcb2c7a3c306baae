//! Taking over as leader on a shared store: fence the older leader out, read the state it
//! left, restore it through the same path as the local journal's recovery, and write back
//! what recovery changed.
//!
//! Order (each step relies on the one before):
//! 1. the registry's fence is raised to this node's token, then every instance's: from here
//!    on nothing an older leader sends changes the store;
//! 2. registry and entries are read; each entry's storages are mapped to this process's
//!    numbering by name, a location whose storage is gone is dropped and one whose storage's
//!    spec changed is stale (both counted), as in the local journal's recovery;
//! 3. the state is restored ([`Manager::restore`]): file-tier parts adopted, WRITING and
//!    DELETING locations of sessions open at the old leader's end freed;
//! 4. the store becomes the manager's journal, and every key read in step 2 is written back
//!    as it now is (cleaned up, or removed), so the store holds no WRITING entry and no
//!    location this node could not adopt. The index is quiet meanwhile: the node is not
//!    leader yet, so no client call and no reclaimer pass runs, and there is no session to
//!    expire and no removal for the deleter. Accounts an older build stored with a clear
//!    password are written back with the hash restoring gave them.

use std::collections::HashMap;
use std::sync::Arc;

use kvcm_index::BlockKey;

use super::value::{self, StorageRef};
use super::SharedStore;
use crate::entry::StorageHandle;
use crate::error::ManagerResult;
use crate::journal::record::DurableEntry;
use crate::journal::sink::durable_entry;
use crate::journal::{Durable, JournalError, Record, RecoveryReport};
use crate::sync::lock;
use crate::Manager;

/// Keys written back per script.
const WRITE_BACK_CHUNK: usize = 1024;

impl Manager {
    /// Connects to the shared store at `uri` (`redis://…`); the manager reads and writes it
    /// once [`Manager::promote_shared`] ran.
    pub fn connect_shared_store(&self, uri: &str) -> ManagerResult<Arc<SharedStore>> {
        let store = SharedStore::connect(uri, self.storages.incarnations())?;
        let _ = self.shared_store_uri.set(uri.to_string());
        Ok(Arc::new(store))
    }

    /// The shared store's URI, once connected.
    pub(crate) fn shared_store_uri(&self) -> Option<&str> {
        self.shared_store_uri.get().map(String::as_str)
    }

    /// Takes over as leader with the fencing token `token`: fences older leaders out, then
    /// restores what the store holds (see the module doc). Once per process: a node that
    /// lost its lead holds a stale copy and must restart before it can lead again.
    pub fn promote_shared(
        self: &Arc<Self>,
        store: &Arc<SharedStore>,
        token: u64,
    ) -> ManagerResult<RecoveryReport> {
        if self.journal.get().is_some() {
            return Err(JournalError::AlreadyOpen.into());
        }
        // No eviction until what the store held is restored and written back.
        let _recovering = crate::sync::write_lock(&self.recovery_gate);
        let mut report = RecoveryReport::default();
        store.take_over(token)?;
        let mut replay = store.read_registry(&mut report)?;
        let numbered = replay.renumber_storages();
        let ids = store.storage_ids();
        let instance_ids = replay.instance_ids();
        let mut read_keys: HashMap<String, Vec<BlockKey>> = HashMap::new();
        for id in &instance_ids {
            store
                .entries(id)?
                .raise_fence()
                .map_err(|e| store.index_error(e))?;
        }
        for id in &instance_ids {
            let keys = read_keys.entry(id.clone()).or_default();
            let mut restored: Vec<(BlockKey, DurableEntry)> = Vec::new();
            store.read_entries(id, |key, bytes| {
                match value::decode(bytes) {
                    Ok((storages, entry)) => {
                        // Only keys that decode are written back: one written by a newer
                        // build stays as it is for that build to read.
                        keys.push(key);
                        let handles = map_storages(&storages, &entry, &numbered, &ids, &mut report);
                        if let Some(entry) = value::remap(&entry, |i| handles[usize::from(i.0)]) {
                            restored.push((key, entry));
                        }
                    }
                    Err(error) => report
                        .skipped
                        .push(format!("entry {key} of instance {id:?}: {error}")),
                }
            })?;
            for (key, entry) in restored {
                replay.insert_entry(id, key, entry);
            }
        }
        let in_clear = replay.accounts_in_clear();
        let over_cap = self.restore(replay, &mut report);
        self.journal
            .set(Durable::Shared(store.clone()))
            .map_err(|_| JournalError::AlreadyOpen)?;
        self.write_back(store, read_keys)?;
        over_cap.free(&mut report);
        self.rewrite_accounts(&in_clear)?;
        Ok(report)
    }

    /// Writes the accounts `names` back as restored: an older build's clear password is
    /// replaced by its hash in the store too.
    fn rewrite_accounts(&self, names: &[String]) -> ManagerResult<()> {
        for name in names {
            let account = lock(&self.accounts).get(name).cloned();
            if let Some(account) = account {
                self.journal_log(&Record::Account(account))?;
            }
        }
        Ok(())
    }

    /// Writes every key read at promotion back as the restored index now holds it.
    fn write_back(
        &self,
        store: &SharedStore,
        read_keys: HashMap<String, Vec<BlockKey>>,
    ) -> ManagerResult<()> {
        let incarnations = self.storages.incarnations();
        for (id, keys) in read_keys {
            let Some(instance) = self.instance(&id) else {
                continue;
            };
            for chunk in keys.chunks(WRITE_BACK_CHUNK) {
                let values = instance.index.get(chunk)?;
                let changes: Vec<(BlockKey, Option<DurableEntry>)> = chunk
                    .iter()
                    .zip(values)
                    .map(|(key, entry)| {
                        let durable = entry.and_then(|e| durable_entry(&e, &incarnations));
                        (*key, durable)
                    })
                    .collect();
                store.write_entries(&id, &changes)?;
            }
        }
        Ok(())
    }
}

/// This process's handle for each storage a value names (by its list index): `None` for a
/// storage that is gone (dropped) or registered anew since the value was written (stale);
/// each location on such a storage is counted in `report`.
fn map_storages(
    storages: &[StorageRef],
    entry: &DurableEntry,
    numbered: &HashMap<String, (StorageHandle, kvcm_storage::StorageConfig)>,
    store_ids: &HashMap<String, (u64, kvcm_storage::StorageSpec)>,
    report: &mut RecoveryReport,
) -> Vec<Option<StorageHandle>> {
    let ids = store_ids;
    let handles: Vec<Option<StorageHandle>> = storages
        .iter()
        .map(|storage| {
            let (handle, _) = numbered.get(&storage.name)?;
            let current = ids.get(&storage.name).map(|(id, _)| *id);
            (current == Some(storage.id)).then_some(*handle)
        })
        .collect();
    for location in entry.entry.locations() {
        let index = usize::from(location.storage.0);
        if handles[index].is_none() {
            if numbered.contains_key(&storages[index].name) {
                report.stale_locations += 1;
            } else {
                report.dropped_locations += 1;
            }
        }
    }
    handles
}
