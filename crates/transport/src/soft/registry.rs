//! Memory and registrations of one soft domain, and the key checks the NIC applies.
//!
//! Invariants: a key maps to at most one live registration; registrations on one memory
//! never overlap; caller-owned memory is registered with local rights only; a [`Target`]
//! (or, for the rest of a pass, the [`KeyMemo`] that lent it) holds the memory alive, so a
//! transfer that resolved its key never touches unmapped memory. A deregistration returns
//! the [`Span`] it withdrew: on the TCP wire, for a registration with remote rights, the
//! NIC's fence (`nic/fence.rs`) then cuts off inbound transfers that still hold it, so that
//! memory handed to another protection domain is never reached under the old key. Not on
//! the shared-memory wire, where a peer maps whole memfds and a batch it started uses a key
//! to the batch's end. Local work in flight is the application's concern, as with
//! hardware.

use super::keytable::{self, KeyEntry, KeyTable, SLOT_BITS};
use crate::memory::MemoryInner;
use crate::sys::SharedMemory;
use crate::{Access, Result, TransportError};
use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

/// Why the soft providers refuse remote rights on caller memory: a same-host peer would
/// need its descriptor (it has none), and serving it over TCP would make this process's
/// NIC thread the only guard of memory the caller lent for local use.
pub(crate) const CALLER_MEMORY_IS_LOCAL: &str =
    "caller-owned memory is registered for local scatter-gather only on the soft providers; \
     remote access to it needs the verbs provider";

/// Where a checked access lands: `offset` bytes into `mem`.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    pub(crate) mem: Arc<SharedMemory>,
    pub(crate) offset: usize,
}

/// The bytes a withdrawn registration covered: `len` bytes of `mem` at `offset`.
#[derive(Debug)]
pub(crate) struct Span {
    pub(crate) mem: Arc<SharedMemory>,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

impl Span {
    /// Whether `len` bytes of `mem` at `offset` share a byte with this span.
    pub(crate) fn overlaps(&self, mem: &Arc<SharedMemory>, offset: usize, len: usize) -> bool {
        Arc::ptr_eq(&self.mem, mem) && offset < self.offset + self.len && self.offset < offset + len
    }
}

/// An 8-byte remote atomic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AtomicOp {
    /// Store `swap` if the word equals `compare`.
    CompareSwap { compare: u64, swap: u64 },
    /// Add (wrapping).
    FetchAdd(u64),
}

impl Target {
    /// Runs `op` on the word here; `addr` is the word's address as the requester named it
    /// and must be 8-byte aligned. Returns the old value, or `None` if unaligned.
    pub(crate) fn run_atomic(&self, addr: u64, op: AtomicOp) -> Option<u64> {
        if addr % 8 != 0 {
            return None;
        }
        let word = self.mem.atomic_u64(self.offset).ok()?;
        Some(match op {
            AtomicOp::CompareSwap { compare, swap } => word
                .compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst)
                .unwrap_or_else(|current| current),
            AtomicOp::FetchAdd(add) => word.fetch_add(add, Ordering::SeqCst),
        })
    }
}

#[derive(Debug)]
struct Live {
    memory: Arc<MemoryInner>,
    entry: KeyEntry,
}

/// The key a batch resolved last (see [`Registry::resolve_memo`] and
/// [`Registry::check_memo`]), for the queue pair of one protection domain; it holds that
/// key's memory alive while it is kept.
#[derive(Debug)]
pub(crate) struct KeyMemo {
    /// The protection domain whose keys resolve.
    pd: u32,
    last: Option<(u32, KeyEntry, Arc<SharedMemory>)>,
}

impl KeyMemo {
    /// An empty memo for a queue pair of protection domain `pd`.
    pub(crate) fn new(pd: u32) -> Self {
        KeyMemo { pd, last: None }
    }
}

#[derive(Debug, Default)]
struct SlotAllocator {
    /// Free slots, oldest freed first: a slot comes back only after every other free slot
    /// was used, so an old key's generation recurs only after 2^18 × (free slots) cycles.
    free: std::collections::VecDeque<u32>,
    generations: Vec<u32>,
}

/// The registrations of one domain: an in-process map for the NIC and a shared key table
/// for same-host peers, changed together.
#[derive(Debug)]
pub(crate) struct Registry {
    table: KeyTable,
    live: RwLock<HashMap<u32, Live>>,
    slots: Mutex<SlotAllocator>,
}

impl Registry {
    pub(crate) fn new() -> Result<Self> {
        let slots = SlotAllocator {
            free: (0..1u32 << SLOT_BITS).collect(),
            generations: vec![0; 1 << SLOT_BITS],
        };
        Ok(Registry {
            table: KeyTable::create()?,
            live: RwLock::default(),
            slots: Mutex::new(slots),
        })
    }

    /// The shared key table.
    pub(crate) fn table(&self) -> &KeyTable {
        &self.table
    }

    /// Registers `[offset, offset + len)` of `memory` in protection domain `pd`; returns
    /// the key and entry.
    pub(crate) fn register(
        &self,
        memory: &Arc<MemoryInner>,
        (offset, len): (usize, usize),
        access: Access,
        pd: u32,
    ) -> Result<(u32, KeyEntry)> {
        access.validate()?;
        if memory.shm.is_caller_owned() && access.grants_remote() {
            return Err(TransportError::Unsupported(CALLER_MEMORY_IS_LOCAL));
        }
        memory.claim(self.owner_id(pd), offset, len)?;
        let Some(key) = self.allocate_key() else {
            memory.release(self.owner_id(pd), offset);
            return Err(keytable::exhausted());
        };
        let entry = KeyEntry {
            mem_base: memory.shm.addr(),
            mem_len: memory.shm.len() as u64,
            addr: memory.shm.addr() + offset as u64,
            len: len as u64,
            access,
            fd: memory.shm.raw_fd(),
            pd,
        };
        self.table.publish(key, &entry)?;
        let live = Live {
            memory: Arc::clone(memory),
            entry,
        };
        self.live
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, live);
        Ok((key, entry))
    }

    /// Withdraws `key`: later resolutions of it fail. Returns the bytes it covered and the
    /// rights it granted (`None` if it was not live).
    pub(crate) fn deregister(&self, key: u32) -> Option<(Span, Access)> {
        let removed = self
            .live
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&key);
        let live = removed?;
        let _ = self.table.withdraw(key);
        let offset = (live.entry.addr - live.entry.mem_base) as usize;
        live.memory.release(self.owner_id(live.entry.pd), offset);
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        slots.free.push_back(key & ((1 << SLOT_BITS) - 1));
        let span = Span {
            mem: Arc::clone(&live.memory.shm),
            offset,
            len: live.entry.len as usize,
        };
        Some((span, live.entry.access))
    }

    /// The memory whose memfd number is `fd`, if some live registration of it in protection
    /// domain `pd` grants a remote right (local-only registrations, such as message
    /// buffers, are never handed out), and whether one of those grants a remote right that writes
    /// (`REMOTE_WRITE` or `REMOTE_ATOMIC`). What the descriptor broker may hand a queue
    /// pair of `pd`; the returned handle keeps the memfd (and so its number) alive.
    pub(crate) fn memory_for_fd(&self, pd: u32, fd: RawFd) -> Option<(Arc<SharedMemory>, bool)> {
        if fd < 0 {
            return None;
        }
        let writes = |access: Access| {
            access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC)
        };
        let live = self.live.read().unwrap_or_else(PoisonError::into_inner);
        let mut found: Option<(Arc<SharedMemory>, bool)> = None;
        for registration in live.values() {
            let entry = &registration.entry;
            if entry.pd != pd || entry.fd != fd || !entry.access.grants_remote() {
                continue;
            }
            let writable = writes(entry.access) || found.as_ref().is_some_and(|(_, w)| *w);
            found = Some((Arc::clone(&registration.memory.shm), writable));
        }
        found
    }

    /// This registry's identity in memories' claim lists (its address: a registry lives
    /// in an `Arc` for the whole life of its domain, so no two live registries share it).
    /// Protection domain `pd` of this registry, as the memory's claims name it.
    fn owner_id(&self, pd: u32) -> crate::memory::Owner {
        (std::ptr::from_ref(self) as usize, pd)
    }

    /// A free slot with a new random generation (never the slot's last one), so that a
    /// key cannot be guessed from another: a peer that knows one key of this domain still
    /// has one chance in 2^18 per try of naming another live key (and a wrong guess breaks
    /// its queue pair, as on hardware).
    fn allocate_key(&self) -> Option<u32> {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = slots.free.pop_front()?;
        let generation = &mut slots.generations[slot as usize];
        let mask = (1u32 << (32 - SLOT_BITS)) - 1;
        let mut next = crate::sys::random_u64().map_or(*generation + 1, |r| r as u32) & mask;
        if next == *generation {
            next = (next + 1) & mask;
        }
        *generation = next;
        Some(next << SLOT_BITS | slot)
    }

    /// Resolves `len` bytes at `addr` under `key` for a queue pair of protection domain
    /// `pd`, if live, registered in `pd`, in bounds and allowed `need`.
    pub(crate) fn resolve(
        &self,
        pd: u32,
        key: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Option<Target> {
        self.resolve_memo(&mut KeyMemo::new(pd), key, addr, len, need)
    }

    /// [`Registry::resolve`], looking `key` up only when `memo` holds another key (a batch
    /// of work requests mostly names one local key; one deregistered while the batch runs
    /// is used to the batch's end, as a NIC uses requests already in flight).
    pub(crate) fn resolve_memo(
        &self,
        memo: &mut KeyMemo,
        key: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Option<Target> {
        let (mem, offset) = self.check_memo(memo, key, addr, len, need)?;
        Some(Target {
            mem: Arc::clone(mem),
            offset,
        })
    }

    /// [`Registry::resolve_memo`] without taking a reference: the memory (held by `memo`)
    /// and the offset in it.
    #[inline]
    pub(crate) fn check_memo<'m>(
        &self,
        memo: &'m mut KeyMemo,
        key: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Option<(&'m Arc<SharedMemory>, usize)> {
        if memo.last.as_ref().is_none_or(|(last, _, _)| *last != key) {
            let live = self.live.read().unwrap_or_else(PoisonError::into_inner);
            let found = live.get(&key)?;
            memo.last = Some((key, found.entry, Arc::clone(&found.memory.shm)));
        }
        let (_, entry, mem) = memo.last.as_ref()?;
        if entry.pd != memo.pd || !keytable::check_access(entry, addr, len, need) {
            return None;
        }
        Some((mem, (addr - entry.mem_base) as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TransportError;

    fn setup() -> (Registry, Arc<MemoryInner>) {
        (
            Registry::new().unwrap(),
            Arc::new(MemoryInner::allocate(8192).unwrap()),
        )
    }

    #[test]
    fn overlapping_registration_is_refused_and_changes_nothing() {
        let (registry, memory) = setup();
        let (key, _) = registry
            .register(&memory, (0, 4096), Access::ALL, 0)
            .unwrap();
        let err = registry
            .register(&memory, (4000, 100), Access::ALL, 0)
            .unwrap_err();
        assert!(
            matches!(err, TransportError::OverlappingRegistration { .. }),
            "{err}"
        );
        assert!(registry
            .register(&memory, (4096, 4096), Access::ALL, 0)
            .is_ok());
        assert!(registry
            .resolve(0, key, memory.shm.addr(), 4096, Access::REMOTE_READ)
            .is_some());
    }

    #[test]
    fn zero_and_out_of_bounds_registrations_are_refused() {
        let (registry, memory) = setup();
        assert!(registry.register(&memory, (0, 0), Access::ALL, 0).is_err());
        assert!(registry
            .register(&memory, (8000, 200), Access::ALL, 0)
            .is_err());
        assert!(registry
            .register(&memory, (usize::MAX, 2), Access::ALL, 0)
            .is_err());
        assert!(registry
            .register(&memory, (0, 8), Access::REMOTE_WRITE, 0)
            .is_err());
    }

    #[test]
    fn deregistered_key_no_longer_resolves_and_range_is_free_again() {
        let (registry, memory) = setup();
        let (key, entry) = registry.register(&memory, (0, 64), Access::ALL, 0).unwrap();
        registry.deregister(key);
        assert!(registry
            .resolve(0, key, entry.addr, 8, Access::NONE)
            .is_none());
        assert!(registry.table().lookup(key).is_none());
        let (again, _) = registry.register(&memory, (0, 64), Access::ALL, 0).unwrap();
        assert_ne!(again, key, "a reused slot gets a new generation");
    }

    #[test]
    fn a_freed_slot_is_reused_last() {
        let (registry, memory) = setup();
        let slot = |key: u32| key & ((1 << SLOT_BITS) - 1);
        let (first, _) = registry.register(&memory, (0, 64), Access::ALL, 0).unwrap();
        registry.deregister(first);
        let (second, _) = registry.register(&memory, (0, 64), Access::ALL, 0).unwrap();
        assert_ne!(
            slot(second),
            slot(first),
            "FIFO: the freed slot waits its turn"
        );
    }

    #[test]
    fn resolve_checks_bounds_and_rights() {
        let (registry, memory) = setup();
        let (key, entry) = registry
            .register(&memory, (64, 64), Access::REMOTE_READ, 0)
            .unwrap();
        let target = registry
            .resolve(0, key, entry.addr + 8, 8, Access::REMOTE_READ)
            .unwrap();
        assert_eq!(target.offset, 72);
        assert!(registry
            .resolve(0, key, entry.addr + 60, 8, Access::REMOTE_READ)
            .is_none());
        assert!(registry
            .resolve(0, key, entry.addr, 8, Access::REMOTE_WRITE)
            .is_none());
        assert!(registry
            .resolve(0, key ^ 1, entry.addr, 8, Access::NONE)
            .is_none());
    }

    #[test]
    fn a_key_resolves_only_for_its_protection_domain() {
        let (registry, memory) = setup();
        let (key, entry) = registry.register(&memory, (0, 64), Access::ALL, 7).unwrap();
        assert!(registry
            .resolve(7, key, entry.addr, 8, Access::REMOTE_READ)
            .is_some());
        assert!(registry
            .resolve(0, key, entry.addr, 8, Access::REMOTE_READ)
            .is_none());
        assert_eq!(registry.table().lookup(key).map(|e| e.pd), Some(7));
    }

    #[test]
    fn a_memory_is_found_by_fd_only_in_its_protection_domain_with_its_widest_right() {
        let (registry, memory) = setup();
        let fd = memory.shm.raw_fd();
        assert!(
            registry.memory_for_fd(0, fd).is_none(),
            "not registered yet"
        );
        let (read, _) = registry
            .register(&memory, (0, 64), Access::REMOTE_READ, 3)
            .unwrap();
        let found = registry
            .memory_for_fd(3, fd)
            .map(|(mem, w)| (mem.raw_fd(), w));
        assert_eq!(found, Some((fd, false)));
        assert!(registry.memory_for_fd(4, fd).is_none(), "another pd");
        assert!(registry.memory_for_fd(3, -1).is_none());
        let (atomic, _) = registry
            .register(
                &memory,
                (64, 64),
                Access::REMOTE_ATOMIC | Access::LOCAL_WRITE,
                3,
            )
            .unwrap();
        assert_eq!(registry.memory_for_fd(3, fd).map(|(_, w)| w), Some(true));
        registry.deregister(atomic);
        assert_eq!(registry.memory_for_fd(3, fd).map(|(_, w)| w), Some(false));
        registry.deregister(read);
        assert!(
            registry.memory_for_fd(3, fd).is_none(),
            "no live registration"
        );
    }

    #[test]
    fn keys_of_one_slot_do_not_follow_a_sequence() {
        let (registry, memory) = setup();
        let mut generations = std::collections::HashSet::new();
        for _ in 0..64 {
            let (key, _) = registry.register(&memory, (0, 64), Access::ALL, 0).unwrap();
            generations.insert(key >> SLOT_BITS);
            registry.deregister(key);
        }
        assert!(
            generations.len() > 60,
            "random generations: {generations:?}"
        );
    }
}
