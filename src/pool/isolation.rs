//! An isolating node's access per instance: for each tenant (the pool's number of an
//! instance), a protection domain of its own on each wire that can confine a queue pair
//! (soft-TCP, verbs), holding one registration per run of the region the tenant owns. A
//! queue pair opened with a ticket for tenant T is created in T's domain, so its one-sided
//! operations reach T's runs and nothing else: another tenant's rkey, or the whole-region
//! registration's, fails as a bad key does. The shared-memory wire cannot confine a mapping
//! to runs (a peer maps a whole memfd), so an isolating node does not offer it.
//!
//! Who owns what comes from the server's ownership feed, in heartbeat answers
//! ([`OwnershipAnswer`]): [`Isolation::retire`] takes released runs' registrations out,
//! the node drops them (a dropped registration fails every later operation with its key at
//! once, transfers in flight included: deregistration is a fence on soft-TCP and verbs)
//! outside the lock hellos take, [`Isolation::plan`] plans the granted ones' registrations,
//! the node makes them with that lock let go and [`Isolation::install`] puts them in; only
//! then is the version recorded as applied, which is what lets the server
//! place a released run for another tenant. A grant that fails to register (verbs pins the run a
//! second time, against `RLIMIT_MEMLOCK`) does not hold the feed up: the run stays
//! unreachable for its tenant on every wire (its transfers fail) and is tried again with
//! every later answer, while releases keep flowing.
//!
//! A tenant left with no run, no pending grant and no queue pair for [`FORGET_AFTER`]
//! (counted from the last hello that asked for its domain) is forgotten when an answer is
//! applied, so a long-lived node keeps domains (verbs protection domains are a device's
//! limited resource) only for instances that hold memory or are connected. A hello takes
//! far less (2 s per read of the handshake, 5 s to connect on soft-TCP); one stalled longer
//! keeps its queue pair in the forgotten domain, where it reaches none of the tenant's
//! later runs: its transfers fail as with a stale rkey and its client makes them again over
//! a fresh link (another tenant's runs stay out of its reach either way).
//!
//! Invariants: a tenant's registrations never overlap (its runs are disjoint); applying a
//! change twice is the same as once; the recorded version's releases are all dropped; a
//! snapshot leaves exactly its runs registered or pending; a tenant holding a run or a
//! pending grant keeps its domains.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use kvcm_transport::any::{AnyDomain, AnyRegion};
use kvcm_transport::{Access, Domain, HostMemory, Region};

use super::listener::RUN_ENTRY;
use super::routes::{AppliedVersion, OwnershipAnswer, RunChange};
use super::PoolError;

/// What clients may do with a node's memory: read and write it (the whole region's
/// registration, or a tenant's runs').
pub(super) fn region_access() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE
}

/// A run a tenant owns, as a client addresses it on one wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunKey {
    /// Offset of the run's first byte in the region.
    pub offset: u64,
    /// Its bytes.
    pub len: u64,
    /// The rkey of its registration on the wire asked.
    pub rkey: u32,
}

impl RunKey {
    /// The entry of a runs answer (`super::listener::RUNS`): offset, bytes (0: no run),
    /// rkey, little-endian.
    pub fn encode(&self) -> [u8; RUN_ENTRY] {
        let mut entry = [0u8; RUN_ENTRY];
        entry[..8].copy_from_slice(&self.offset.to_le_bytes());
        entry[8..16].copy_from_slice(&self.len.to_le_bytes());
        entry[16..].copy_from_slice(&self.rkey.to_le_bytes());
        entry
    }

    /// Reads an entry written by [`RunKey::encode`].
    pub fn decode(entry: &[u8; RUN_ENTRY]) -> RunKey {
        let (offset, rest) = entry.split_at(8);
        let (len, rkey) = rest.split_at(8);
        RunKey {
            offset: u64::from_le_bytes(offset.try_into().unwrap_or_default()),
            len: u64::from_le_bytes(len.try_into().unwrap_or_default()),
            rkey: u32::from_le_bytes(rkey.try_into().unwrap_or_default()),
        }
    }
}

/// One tenant's domain on one wire and its registrations, by run offset.
struct TenantWire {
    wire: usize,
    domain: AnyDomain,
    runs: BTreeMap<u64, AnyRegion>,
}

/// How long a tenant stays idle (no run, no pending grant, no queue pair) before it is
/// forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(60);

/// A granted run: its tenant, offset and length.
type Grant = (u32, u64, u64);

/// Every tenant's access, and the ownership version it reflects.
#[derive(Default)]
pub(super) struct Isolation {
    applied: Option<AppliedVersion>,
    tenants: HashMap<u32, Vec<TenantWire>>,
    /// Granted runs not registered on every wire yet (their registration failed).
    pending: HashSet<Grant>,
    /// Tenants found idle, since when (a hello asking for the domain takes its tenant out).
    idle_since: HashMap<u32, Instant>,
    /// What `apply` took out and has not been handed to [`Isolation::take_retired`] yet.
    retired: Retired,
}

/// Registrations and tenant domains an answer took out of an [`Isolation`]: no operation
/// finds them through it any more, but a client holding an rkey still reaches a run until
/// its registration is dropped — a fence that waits for the NIC. The owner drops them
/// after letting go of the lock that hellos take, and before it reports the version
/// applied (the server places a released run for someone else only after that).
#[derive(Default)]
pub(super) struct Retired {
    runs: Vec<AnyRegion>,
    tenants: Vec<Vec<TenantWire>>,
}

#[cfg(test)]
impl Retired {
    /// Registrations of runs held, counting those of retired tenants' domains.
    pub(super) fn runs(&self) -> usize {
        let of_tenants = self.tenants.iter().flatten().map(|wire| wire.runs.len());
        self.runs.len() + of_tenants.sum::<usize>()
    }
}

/// The registrations an answer needs, planned under the lock hellos take
/// ([`Isolation::plan`]) and made with it let go ([`Registrations::make`]): a verbs
/// registration pins its run, which can take a while for a snapshot of many runs.
pub(super) struct Registrations {
    /// Each grant to register, with the tenant's domains (by wire) that lack it.
    jobs: Vec<(Grant, Vec<(usize, AnyDomain)>)>,
    /// Grants refused while planning.
    refused: Vec<(Grant, PoolError)>,
    failed_before: HashSet<Grant>,
    applied: AppliedVersion,
}

/// One run's registrations, by wire.
type RunRegions = Vec<(usize, AnyRegion)>;

/// What [`Registrations::make`] made, for [`Isolation::install`].
pub(super) struct Made {
    /// Each grant's registrations (by wire), or why one failed (none is kept then).
    outcomes: Vec<(Grant, Result<RunRegions, PoolError>)>,
    failed_before: HashSet<Grant>,
    applied: AppliedVersion,
}

impl Registrations {
    /// Registers each planned run of `memory` in its domains (a grant whose registration
    /// fails on one wire keeps none).
    pub(super) fn make(self, memory: &HostMemory) -> Made {
        let mut outcomes: Vec<_> = self
            .refused
            .into_iter()
            .map(|(grant, error)| (grant, Err(error)))
            .collect();
        for (grant @ (_, offset, len), domains) in self.jobs {
            // `plan` checked that the run lies in the region.
            let (start, bytes) = (offset as usize, len as usize);
            let made: Result<Vec<_>, _> = domains
                .into_iter()
                .map(|(wire, domain)| {
                    let region = domain.register(memory, start, bytes, region_access())?;
                    Ok((wire, region))
                })
                .collect();
            outcomes.push((grant, made));
        }
        Made {
            outcomes,
            failed_before: self.failed_before,
            applied: self.applied,
        }
    }
}

impl Isolation {
    /// The feed and version applied (`None`: nothing yet).
    pub(super) fn applied(&self) -> Option<AppliedVersion> {
        self.applied
    }

    /// What the answers applied since the last call took out, to be dropped by the caller
    /// (see [`Retired`]).
    pub(super) fn take_retired(&mut self) -> Retired {
        std::mem::take(&mut self.retired)
    }

    /// The first phase of applying `answer`: the registrations of released runs (and, for
    /// a snapshot, of every run it does not list, with the pending grants it does not
    /// list) are taken out into [`Retired`]. The caller drops them before
    /// [`Self::plan`], so a run moving from one tenant to another in one answer is
    /// never reachable by both.
    pub(super) fn retire(&mut self, answer: &OwnershipAnswer) {
        if answer.snapshot {
            self.keep_only(&answer.changes);
        }
        for &RunChange(tenant, offset, _, released) in &answer.changes {
            if released {
                self.release(tenant, offset);
            }
        }
    }

    /// The second phase of applying `answer`, under the lock: plans the registrations of
    /// granted runs — with those of earlier grants that failed, less those the answer
    /// released — making the tenants' domains on `wires` (the node's, by wire index) where
    /// needed. A grant outside the region's `region_len` bytes (or whose tenant's domains cannot be made) is
    /// refused here. The caller makes the registrations with the lock let go
    /// ([`Registrations::make`]) and hands them to [`Self::install`].
    pub(super) fn plan(
        &mut self,
        answer: &OwnershipAnswer,
        wires: &[(usize, &AnyDomain)],
        region_len: usize,
    ) -> Registrations {
        let failed_before = std::mem::take(&mut self.pending);
        let mut grants: Vec<Grant> = failed_before.iter().copied().collect();
        for &RunChange(tenant, offset, len, released) in &answer.changes {
            if released {
                grants.retain(|&(t, o, _)| (t, o) != (tenant, offset));
            } else {
                grants.push((tenant, offset, len));
            }
        }
        // A snapshot lists again the pending grants it keeps: each is registered once.
        grants.sort_unstable();
        grants.dedup();
        let mut planned = Registrations {
            jobs: Vec::new(),
            refused: Vec::new(),
            failed_before,
            applied: AppliedVersion {
                feed: answer.feed,
                version: answer.version,
            },
        };
        for grant in grants {
            match self.domains_needing(grant, wires, region_len) {
                Ok(domains) if domains.is_empty() => {}
                Ok(domains) => planned.jobs.push((grant, domains)),
                Err(error) => planned.refused.push((grant, error)),
            }
        }
        planned
    }

    /// The third phase, under the lock again: installs what [`Registrations::make`] made
    /// (a run's earlier registration of another length is retired), keeps the grants that
    /// failed pending, records the version, then forgets the tenants left idle (none of
    /// `connected`, the tenants with a queue pair). Grants that failed for the first time
    /// are returned as an error (they stay pending); the version is recorded all the same.
    pub(super) fn install(
        &mut self,
        made: Made,
        connected: &HashSet<u32>,
    ) -> Result<(), PoolError> {
        let Made {
            outcomes,
            failed_before,
            applied,
        } = made;
        let mut errors = Vec::new();
        for (grant, outcome) in outcomes {
            let error = match outcome {
                Ok(regions) => match self.put_runs(grant, regions) {
                    Ok(()) => continue,
                    Err(error) => error,
                },
                Err(error) => error,
            };
            // Reachable on no wire until registered on every one.
            self.release(grant.0, grant.1);
            if self.pending.insert(grant) && !failed_before.contains(&grant) {
                errors.push(format!(
                    "run {}+{} of tenant {}: {error}",
                    grant.1, grant.2, grant.0
                ));
            }
        }
        self.applied = Some(applied);
        self.forget_idle(connected);
        match errors.is_empty() {
            true => Ok(()),
            false => Err(PoolError::Config(format!(
                "runs left unreachable (tried again with each heartbeat): {}",
                errors.join("; ")
            ))),
        }
    }

    /// Forgets the tenants that held no run, waited for no grant and were not `connected`
    /// for [`FORGET_AFTER`]; notes since when the others in that state are.
    fn forget_idle(&mut self, connected: &HashSet<u32>) {
        let pending: HashSet<u32> = self.pending.iter().map(|grant| grant.0).collect();
        let now = Instant::now();
        let idle_since = &mut self.idle_since;
        let forgotten: Vec<u32> = self
            .tenants
            .iter()
            .filter_map(|(tenant, wires)| {
                let busy = connected.contains(tenant)
                    || pending.contains(tenant)
                    || wires.iter().any(|wire| !wire.runs.is_empty());
                if busy {
                    idle_since.remove(tenant);
                    return None;
                }
                let since = *idle_since.entry(*tenant).or_insert(now);
                (now.duration_since(since) >= FORGET_AFTER).then_some(*tenant)
            })
            .collect();
        for tenant in forgotten {
            idle_since.remove(&tenant);
            self.retired.tenants.extend(self.tenants.remove(&tenant));
        }
    }

    /// Drops every registration (and pending grant) a snapshot of `granted` runs does not
    /// list.
    fn keep_only(&mut self, granted: &[RunChange]) {
        let listed: HashSet<Grant> = granted
            .iter()
            .filter(|change| !change.3)
            .map(|&RunChange(tenant, offset, len, _)| (tenant, offset, len))
            .collect();
        for (tenant, wires) in &mut self.tenants {
            for wire in wires {
                let unlisted: Vec<u64> = wire
                    .runs
                    .iter()
                    .filter(|(offset, region)| {
                        !listed.contains(&(*tenant, **offset, region.len() as u64))
                    })
                    .map(|(offset, _)| *offset)
                    .collect();
                let dropped = unlisted
                    .iter()
                    .filter_map(|offset| wire.runs.remove(offset));
                self.retired.runs.extend(dropped);
            }
        }
        self.pending.retain(|grant| listed.contains(grant));
    }

    fn release(&mut self, tenant: u32, offset: u64) {
        for wire in self.tenants.get_mut(&tenant).into_iter().flatten() {
            self.retired.runs.extend(wire.runs.remove(&offset));
        }
    }

    /// The tenant's domains (by wire) on which `grant` is not registered yet with its
    /// length, made the first time; an error for a run outside the region.
    fn domains_needing(
        &mut self,
        (tenant, offset, len): Grant,
        wires: &[(usize, &AnyDomain)],
        region_len: usize,
    ) -> Result<Vec<(usize, AnyDomain)>, PoolError> {
        let bad = || PoolError::Config(format!("run {offset}+{len} is outside the region"));
        let start = usize::try_from(offset).map_err(|_| bad())?;
        let bytes = usize::try_from(len).map_err(|_| bad())?;
        if start.checked_add(bytes).is_none_or(|end| end > region_len) || bytes == 0 {
            return Err(bad());
        }
        let own = self.tenant(tenant, wires)?;
        let unregistered = own
            .iter()
            .filter(|wire| wire.runs.get(&offset).is_none_or(|r| r.len() != bytes));
        Ok(unregistered
            .map(|wire| (wire.wire, wire.domain.clone()))
            .collect())
    }

    /// Puts the registrations made for `grant` in its tenant's domains (retiring any
    /// earlier one of the run); an error, changing nothing, when the tenant (or one of the
    /// wires the registrations were made on) is gone.
    fn put_runs(
        &mut self,
        (tenant, offset, _): Grant,
        regions: RunRegions,
    ) -> Result<(), PoolError> {
        let has_wire = |own: &Vec<TenantWire>, wire: usize| own.iter().any(|w| w.wire == wire);
        let own = self
            .tenants
            .get_mut(&tenant)
            .filter(|own| regions.iter().all(|(wire, _)| has_wire(own, *wire)));
        let Some(own) = own else {
            let made = regions.into_iter().map(|(_, region)| region);
            self.retired.runs.extend(made);
            return Err(PoolError::Config(format!(
                "tenant {tenant} lost its domains while its run was registered"
            )));
        };
        for (wire, region) in regions {
            let own_wire = own.iter_mut().find(|w| w.wire == wire);
            let earlier = own_wire.and_then(|w| w.runs.insert(offset, region));
            self.retired.runs.extend(earlier);
        }
        Ok(())
    }

    /// The tenant's domains, one per wire of `wires` (made the first time).
    fn tenant(
        &mut self,
        tenant: u32,
        wires: &[(usize, &AnyDomain)],
    ) -> Result<&mut Vec<TenantWire>, PoolError> {
        match self.tenants.entry(tenant) {
            Entry::Occupied(own) => Ok(own.into_mut()),
            Entry::Vacant(vacant) => {
                let mut own = Vec::with_capacity(wires.len());
                for &(wire, domain) in wires {
                    own.push(TenantWire {
                        wire,
                        domain: domain.new_pd()?,
                        runs: BTreeMap::new(),
                    });
                }
                Ok(vacant.insert(own))
            }
        }
    }

    /// The tenant's domain on `wire` (made the first time), where its queue pairs are
    /// created.
    pub(super) fn domain(
        &mut self,
        tenant: u32,
        wire: usize,
        wires: &[(usize, &AnyDomain)],
    ) -> Result<AnyDomain, PoolError> {
        self.idle_since.remove(&tenant);
        let own = self.tenant(tenant, wires)?;
        own.iter()
            .find(|w| w.wire == wire)
            .map(|w| w.domain.clone())
            .ok_or_else(|| PoolError::Refused(format!("wire {wire} does not isolate instances")))
    }

    /// The run of `tenant` holding `offset`, with its rkey on `wire`.
    pub(super) fn run_at(&self, tenant: u32, wire: usize, offset: u64) -> Option<RunKey> {
        let own = self.tenants.get(&tenant)?.iter().find(|w| w.wire == wire)?;
        let (start, region) = own.runs.range(..=offset).next_back()?;
        let len = region.len() as u64;
        (offset < start + len).then_some(RunKey {
            offset: *start,
            len,
            rkey: region.rkey(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lookup::{open_wires, WIRE_SOFT_TCP};
    use kvcm_transport::Memory;

    const SLAB: u64 = 2 << 20;

    impl Isolation {
        /// Both phases at once (the node drops what the first retired between them; these
        /// tests keep it until they look).
        fn apply(
            &mut self,
            answer: &OwnershipAnswer,
            wires: &[(usize, &AnyDomain)],
            memory: &HostMemory,
            connected: &HashSet<u32>,
        ) -> Result<(), PoolError> {
            self.retire(answer);
            let made = self.plan(answer, wires, memory.len()).make(memory);
            self.install(made, connected)
        }
    }

    fn answer(feed: u64, version: u64, snapshot: bool, changes: &[RunChange]) -> OwnershipAnswer {
        OwnershipAnswer {
            feed,
            version,
            snapshot,
            changes: changes.to_vec(),
        }
    }

    #[test]
    fn run_entries_round_trip() {
        let run = RunKey {
            offset: u64::MAX - 7,
            len: 2 << 20,
            rkey: 0xfeed_f00d,
        };
        assert_eq!(RunKey::decode(&run.encode()), run);
    }

    #[test]
    fn grants_register_releases_drop_snapshots_replace_and_failed_grants_do_not_hold_the_feed() {
        let domains = open_wires([127, 0, 0, 1].into(), None, "test").unwrap();
        let tcp = &domains.iter().find(|(w, _)| *w == WIRE_SOFT_TCP).unwrap().1;
        let wires = [(WIRE_SOFT_TCP, tcp)];
        let memory = tcp.alloc(4 * SLAB as usize).unwrap();
        // The node's whole-region registration stays beside the tenants' runs.
        let _whole = tcp
            .register(&memory, 0, memory.len(), region_access())
            .unwrap();
        let none = HashSet::new();
        let mut isolation = Isolation::default();
        assert_eq!(isolation.applied(), None);
        let first = answer(
            9,
            2,
            false,
            &[
                RunChange(1, 0, SLAB, false),
                RunChange(2, SLAB, 2 * SLAB, false),
            ],
        );
        isolation.apply(&first, &wires, &memory, &none).unwrap();
        let run = |i: &Isolation, tenant, at| i.run_at(tenant, WIRE_SOFT_TCP, at);
        let a = run(&isolation, 1, 5).expect("tenant 1 holds slab 0");
        assert_eq!((a.offset, a.len), (0, SLAB));
        assert_eq!(
            run(&isolation, 2, 3 * SLAB - 1).map(|r| r.offset),
            Some(SLAB)
        );
        assert_eq!(run(&isolation, 1, SLAB), None, "tenant 2's run");
        assert_eq!(run(&isolation, 2, 0), None, "tenant 1's run");
        assert_eq!(run(&isolation, 2, 3 * SLAB), None, "nobody's");
        assert_ne!(a.rkey, run(&isolation, 2, SLAB).unwrap().rkey);
        // Applying the same changes again keeps the registrations.
        isolation.apply(&first, &wires, &memory, &none).unwrap();
        assert_eq!(run(&isolation, 1, 0), Some(a));
        assert_eq!(isolation.take_retired().runs(), 0, "nothing taken out");
        assert_eq!(
            isolation.applied(),
            Some(AppliedVersion {
                feed: 9,
                version: 2
            })
        );
        // A release drops the run; the slab then goes to tenant 2 in another domain.
        let moved = answer(
            9,
            4,
            false,
            &[RunChange(1, 0, SLAB, true), RunChange(2, 0, SLAB, false)],
        );
        // First phase: the released registration is handed over, still live, for the
        // caller to drop outside its lock (once), and the new owner has nothing yet.
        isolation.retire(&moved);
        assert_eq!(run(&isolation, 1, 0), None);
        assert_eq!(
            run(&isolation, 2, 0),
            None,
            "not before the release is dropped"
        );
        let retired = isolation.take_retired();
        let rkeys: Vec<u32> = retired.runs.iter().map(|region| region.rkey()).collect();
        assert_eq!(rkeys, [a.rkey]);
        assert_eq!(isolation.take_retired().runs(), 0);
        drop(retired);
        // Second phase: the grant is planned; until what was made is installed the
        // isolation answers as before (a hello may ask for a domain meanwhile).
        let planned = isolation.plan(&moved, &wires, memory.len());
        assert_eq!(run(&isolation, 2, 0), None);
        assert!(isolation.domain(2, WIRE_SOFT_TCP, &wires).is_ok());
        let made = planned.make(&memory);
        assert_eq!(run(&isolation, 2, 0), None, "made, not installed");
        isolation.install(made, &none).unwrap();
        assert_eq!(run(&isolation, 2, 0).map(|r| r.len), Some(SLAB));
        assert_eq!(isolation.take_retired().runs(), 0);
        // A run that cannot be registered (outside the region) fails once, loudly, and
        // stays pending; the version moves on and later releases still apply.
        let bad = answer(9, 5, false, &[RunChange(3, 4 * SLAB, SLAB, false)]);
        let error = isolation.apply(&bad, &wires, &memory, &none).unwrap_err();
        assert!(error.to_string().contains("tenant 3"), "{error}");
        assert_eq!(isolation.applied().map(|a| a.version), Some(5));
        assert_eq!(run(&isolation, 3, 4 * SLAB), None);
        let later = answer(9, 6, false, &[RunChange(2, 0, SLAB, true)]);
        isolation.apply(&later, &wires, &memory, &none).unwrap();
        assert_eq!(
            run(&isolation, 2, 0),
            None,
            "released behind a failed grant"
        );
        assert_eq!(isolation.applied().map(|a| a.version), Some(6));
        assert!(isolation.pending.contains(&(3, 4 * SLAB, SLAB)));
        // A snapshot of another feed leaves exactly its runs (and drops pending grants).
        let snapshot = answer(11, 1, true, &[RunChange(1, 3 * SLAB, SLAB, false)]);
        isolation.apply(&snapshot, &wires, &memory, &none).unwrap();
        // Tenant 2's release (version 6) and its run at SLAB, which the snapshot does not
        // list; the snapshot's own run is registered, not retired.
        assert_eq!(isolation.take_retired().runs(), 2);
        assert!(isolation.pending.is_empty());
        assert_eq!(run(&isolation, 2, 0), None);
        assert_eq!(run(&isolation, 2, SLAB), None);
        assert_eq!(
            run(&isolation, 1, 3 * SLAB).map(|r| r.offset),
            Some(3 * SLAB)
        );
        assert_eq!(
            isolation.applied(),
            Some(AppliedVersion {
                feed: 11,
                version: 1
            })
        );
        // Queue pairs are created in the tenant's domain on isolating wires only.
        assert!(isolation.domain(1, WIRE_SOFT_TCP, &wires).is_ok());
        assert!(isolation
            .domain(1, crate::lookup::WIRE_VERBS, &wires)
            .is_err());
    }

    #[test]
    fn tenants_without_runs_pending_grants_or_queue_pairs_are_forgotten() {
        let domains = open_wires([127, 0, 0, 1].into(), None, "test").unwrap();
        let tcp = &domains.iter().find(|(w, _)| *w == WIRE_SOFT_TCP).unwrap().1;
        let wires = [(WIRE_SOFT_TCP, tcp)];
        let memory = tcp.alloc(4 * SLAB as usize).unwrap();
        let mut isolation = Isolation::default();
        let grants = answer(
            1,
            1,
            false,
            &[
                RunChange(1, 0, SLAB, false),
                RunChange(2, SLAB, SLAB, false),
                RunChange(3, 2 * SLAB, SLAB, false),
                RunChange(3, 9 * SLAB, SLAB, false),
            ],
        );
        let none = HashSet::new();
        // Tenant 3's second run is outside the region: it stays pending.
        assert!(isolation.apply(&grants, &wires, &memory, &none).is_err());
        // Tenant 5 said hello before owning anything.
        isolation.domain(5, WIRE_SOFT_TCP, &wires).unwrap();
        // Every tenant is left without runs; 2 and 5 have a queue pair, 3 a pending grant.
        let releases = answer(
            1,
            2,
            false,
            &[
                RunChange(1, 0, SLAB, true),
                RunChange(2, SLAB, SLAB, true),
                RunChange(3, 2 * SLAB, SLAB, true),
            ],
        );
        let connected = HashSet::from([2, 5]);
        let tenants = |isolation: &Isolation| {
            let mut kept: Vec<u32> = isolation.tenants.keys().copied().collect();
            kept.sort_unstable();
            kept
        };
        let age = |isolation: &mut Isolation| {
            for since in isolation.idle_since.values_mut() {
                *since = since.checked_sub(FORGET_AFTER).expect("uptime");
            }
        };
        let apply = |isolation: &mut Isolation, connected: &HashSet<u32>| {
            isolation
                .apply(&releases, &wires, &memory, connected)
                .unwrap()
        };
        apply(&mut isolation, &connected);
        assert_eq!(
            tenants(&isolation),
            [1, 2, 3, 5],
            "idle for less than the grace"
        );
        isolation.take_retired();
        age(&mut isolation);
        apply(&mut isolation, &connected);
        assert_eq!(
            tenants(&isolation),
            [2, 3, 5],
            "idle and unconnected 1 forgotten"
        );
        // Its domain is handed over to be dropped outside the lock.
        let retired = isolation.take_retired();
        let domains: Vec<usize> = retired.tenants.iter().map(Vec::len).collect();
        assert_eq!(domains, [1], "tenant 1's domain on the one wire");
        // 2 and 5 hang up; a hello of 5 asks for its domain again while 2 is idle.
        apply(&mut isolation, &none);
        age(&mut isolation);
        isolation.domain(5, WIRE_SOFT_TCP, &wires).unwrap();
        apply(&mut isolation, &none);
        assert_eq!(tenants(&isolation), [3, 5], "the grace restarts at a hello");
        age(&mut isolation);
        apply(&mut isolation, &none);
        assert_eq!(
            tenants(&isolation),
            [3],
            "a tenant with a pending grant stays"
        );
        // A later grant gives a forgotten tenant a new domain.
        let again = answer(1, 3, false, &[RunChange(1, 0, SLAB, false)]);
        isolation.apply(&again, &wires, &memory, &none).unwrap();
        let run = isolation.run_at(1, WIRE_SOFT_TCP, 0);
        assert_eq!(run.map(|r| r.len), Some(SLAB));
    }
}
