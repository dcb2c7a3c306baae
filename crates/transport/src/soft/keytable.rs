//! The key table: a memfd every same-host peer maps to validate rkeys without a round trip.
//!
//! Layout: a header page (the NIC's `parked` word), then `SLOTS` slots of 8 words each
//! (word 0 the tag, then memory base, memory length, address, length, access << 32 | fd,
//! protection domain). A key is `generation << SLOT_BITS | slot`, the generation random. Slot word 0 holds `key << 1 | 1` while the
//! registration is live and 0 otherwise; the owner writes the other words before publishing
//! word 0 (release) and clears word 0 first on deregistration, and readers re-check word 0
//! after reading the rest (a seqlock), so a reader never trusts a half-written slot. The
//! re-check suffices because a key is published once: a slot's next registration gets a
//! new generation, hence a different word 0.
//!
//! Peers map the table read-only (the descriptor broker hands it out so): they only load.
//! Every peer of the domain, whatever its protection domain, sees every entry: addresses,
//! lengths, rights, memfd numbers and protection domains of all registrations (never the
//! memory's contents, which only the broker hands out, per protection domain).

use crate::sys::{Protection, SharedMemory};
use crate::{Access, Result, TransportError};
use std::os::fd::{OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// Bits of a key that select the slot.
pub(crate) const SLOT_BITS: u32 = 14;
pub(crate) const SLOTS: usize = 1 << SLOT_BITS;
const HEADER: usize = 4096;
const SLOT_WORDS: usize = 8;
/// Bytes of a key table memfd.
pub(crate) const TABLE_LEN: usize = HEADER + SLOTS * SLOT_WORDS * 8;

/// A published registration as peers see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KeyEntry {
    /// Address of the memory's byte 0 in the owner process.
    pub mem_base: u64,
    /// Length of the whole memory (memfd).
    pub mem_len: u64,
    /// First registered address in the owner process.
    pub addr: u64,
    /// Registered length.
    pub len: u64,
    /// Rights granted.
    pub access: Access,
    /// The memory's memfd number in the owner process.
    pub fd: RawFd,
    /// The protection domain the registration belongs to: only queue pairs of the same
    /// protection domain may use the key.
    pub pd: u32,
}

/// A key table mapping (own or a peer's).
#[derive(Debug)]
pub(crate) struct KeyTable {
    memory: SharedMemory,
}

impl KeyTable {
    /// Creates an empty table.
    pub(crate) fn create() -> Result<Self> {
        Ok(KeyTable {
            memory: SharedMemory::create(c"kvcm-keytable", TABLE_LEN)?,
        })
    }

    /// Maps a peer's table, read-only, from the descriptor its broker handed over.
    pub(crate) fn from_descriptor(fd: OwnedFd) -> Result<Self> {
        Ok(KeyTable {
            memory: SharedMemory::from_descriptor(fd, TABLE_LEN, Protection::ReadOnly)?,
        })
    }

    /// The table's memory (the broker hands out read-only descriptors of it).
    pub(crate) fn memory(&self) -> &SharedMemory {
        &self.memory
    }

    /// The owner NIC's `parked` word: non-zero while it sleeps and needs a doorbell
    /// (owner only: the word of a peer's table is read with [`KeyTable::is_parked`]).
    pub(crate) fn parked(&self) -> &AtomicU64 {
        self.memory
            .atomic_u64(0)
            .expect("header word 0 is in bounds and the own table is writable")
    }

    /// Whether the owner NIC sleeps (a `SeqCst` load, for the doorbell handshake).
    pub(crate) fn is_parked(&self) -> bool {
        self.memory
            .load_u64(0, Ordering::SeqCst)
            .is_ok_and(|word| word != 0)
    }

    fn slot_offset(key: u32, index: usize) -> usize {
        let slot = (key as usize) & (SLOTS - 1);
        HEADER + (slot * SLOT_WORDS + index) * 8
    }

    /// A word of `key`'s slot, for the owner's stores.
    fn slot_word(&self, key: u32, index: usize) -> Result<&AtomicU64> {
        self.memory.atomic_u64(Self::slot_offset(key, index))
    }

    /// Loads a word of `key`'s slot (own table or a peer's read-only one).
    fn load(&self, key: u32, index: usize, order: Ordering) -> Option<u64> {
        self.memory
            .load_u64(Self::slot_offset(key, index), order)
            .ok()
    }

    /// Publishes `entry` under `key` (owner only).
    pub(crate) fn publish(&self, key: u32, entry: &KeyEntry) -> Result<()> {
        let fields = [
            entry.mem_base,
            entry.mem_len,
            entry.addr,
            entry.len,
            u64::from(entry.access.bits()) << 32 | u64::from(entry.fd as u32),
            u64::from(entry.pd),
        ];
        for (index, value) in fields.into_iter().enumerate() {
            self.slot_word(key, index + 1)?
                .store(value, Ordering::Relaxed);
        }
        self.slot_word(key, 0)?
            .store(u64::from(key) << 1 | 1, Ordering::Release);
        Ok(())
    }

    /// Withdraws `key` (owner only).
    pub(crate) fn withdraw(&self, key: u32) -> Result<()> {
        self.slot_word(key, 0)?.store(0, Ordering::Release);
        Ok(())
    }

    /// Reads the live entry for `key`, or `None` when the key is not registered.
    pub(crate) fn lookup(&self, key: u32) -> Option<KeyEntry> {
        let tag = u64::from(key) << 1 | 1;
        if self.load(key, 0, Ordering::Acquire)? != tag {
            return None;
        }
        let mut fields = [0u64; 6];
        for (index, field) in fields.iter_mut().enumerate() {
            *field = self.load(key, index + 1, Ordering::Relaxed)?;
        }
        std::sync::atomic::fence(Ordering::Acquire);
        if self.load(key, 0, Ordering::Relaxed)? != tag {
            return None;
        }
        Some(KeyEntry {
            mem_base: fields[0],
            mem_len: fields[1],
            addr: fields[2],
            len: fields[3],
            access: Access::from_bits_truncate((fields[4] >> 32) as u32),
            fd: fields[4] as u32 as RawFd,
            pd: fields[5] as u32,
        })
    }

    /// Whether `key` is still live (a cheap re-check after slow work).
    pub(crate) fn is_live(&self, key: u32) -> bool {
        let tag = u64::from(key) << 1 | 1;
        self.load(key, 0, Ordering::Acquire) == Some(tag)
    }
}

/// Checks that `[addr, addr + len)` lies in the registration and `need` is granted.
pub(crate) fn check_access(entry: &KeyEntry, addr: u64, len: u64, need: Access) -> bool {
    // Entries may come from another process: no arithmetic on them may overflow.
    let region_end = entry.addr.checked_add(entry.len);
    let end = addr.checked_add(len);
    let in_bounds =
        addr >= entry.addr && matches!((end, region_end), (Some(end), Some(limit)) if end <= limit);
    in_bounds && entry.access.contains(need)
}

/// Error used when the table has no free slot.
pub(crate) fn exhausted() -> TransportError {
    TransportError::Exhausted("memory keys")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> KeyEntry {
        KeyEntry {
            mem_base: 4096,
            mem_len: 8192,
            addr: 4096 + 100,
            len: 50,
            access: Access::ALL,
            fd: 7,
            pd: 3,
        }
    }

    #[test]
    fn published_entries_are_seen_by_a_peer_until_withdrawn() {
        let own = KeyTable::create().unwrap();
        let peer = KeyTable::from_descriptor(own.memory().reopen(false).unwrap()).unwrap();
        let key = 3 << SLOT_BITS | 5;
        own.publish(key, &entry()).unwrap();
        assert_eq!(peer.lookup(key), Some(entry()));
        assert_eq!(peer.lookup(5), None, "same slot, other generation");
        assert!(
            peer.publish(key ^ 1, &entry()).is_err(),
            "a peer's table is read-only"
        );
        assert!(!peer.is_parked());
        own.parked().store(1, Ordering::SeqCst);
        assert!(peer.is_parked());
        own.withdraw(key).unwrap();
        assert_eq!(peer.lookup(key), None);
        assert!(!peer.is_live(key));
    }

    #[test]
    fn access_check_covers_bounds_overflow_and_rights() {
        let e = KeyEntry {
            access: Access::REMOTE_READ,
            ..entry()
        };
        assert!(check_access(&e, e.addr, 50, Access::REMOTE_READ));
        assert!(!check_access(&e, e.addr, 51, Access::REMOTE_READ));
        assert!(!check_access(&e, e.addr - 1, 1, Access::REMOTE_READ));
        assert!(!check_access(&e, u64::MAX, 2, Access::REMOTE_READ));
        assert!(!check_access(&e, e.addr, 8, Access::REMOTE_WRITE));
        let hostile = KeyEntry {
            addr: u64::MAX - 4,
            len: 100,
            ..e
        };
        assert!(
            !check_access(&hostile, u64::MAX - 4, 2, Access::REMOTE_READ),
            "overflowing entry"
        );
    }

    #[test]
    fn a_reader_never_sees_a_half_written_entry() {
        use std::sync::atomic::AtomicU64;
        use std::sync::Arc;
        let own = Arc::new(KeyTable::create().unwrap());
        let peer = KeyTable::from_descriptor(own.memory().reopen(false).unwrap()).unwrap();
        // One slot, a new generation (a new key) per publication, as the registry does.
        let key_for = |n: u64| (n as u32) << SLOT_BITS | 9;
        let entry_for = |n: u64| KeyEntry {
            mem_base: n,
            mem_len: n,
            addr: n,
            len: n,
            access: Access::ALL,
            fd: n as RawFd,
            pd: n as u32,
        };
        let latest = Arc::new(AtomicU64::new(0));
        let writer = {
            let (own, latest) = (Arc::clone(&own), Arc::clone(&latest));
            std::thread::spawn(move || {
                for n in 1..20_000u64 {
                    own.publish(key_for(n), &entry_for(n)).unwrap();
                    latest.store(n, Ordering::Release);
                    own.withdraw(key_for(n)).unwrap();
                }
            })
        };
        while !writer.is_finished() {
            let n = latest.load(Ordering::Acquire);
            for candidate in [n, n + 1] {
                if let Some(entry) = peer.lookup(key_for(candidate)) {
                    assert_eq!(
                        entry,
                        entry_for(candidate),
                        "every field from one publication"
                    );
                }
            }
        }
        writer.join().unwrap();
        assert!(
            peer.lookup(key_for(19_999)).is_none(),
            "withdrawn at the end"
        );
    }
}
