//! Write sessions (wire fact sheet §12): StartWriteCache opens one, FinishWriteCache or the
//! expiry thread consumes it exactly once. The expiry thread sleeps until the earliest
//! deadline (or a newer, earlier one), so a session fails within milliseconds of its deadline.
//!
//! Invariant: `open_per_instance` counts, per instance object, the sessions in `sessions`
//! (every insertion and removal goes through [`State::insert`] and [`State::remove`]), so the
//! per-instance limit is checked in O(1). Sessions of a removed instance do not count against
//! a later instance registered under its id.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use kvcm_index::BlockKey;

use super::entry::LocationId;
use super::error::{ManagerError, ManagerResult};
use super::instance::Instance;
use crate::sync::lock;

/// Length of a session id (lower-case letters and digits).
pub const SESSION_ID_LEN: usize = 32;

/// One block a session allocated.
#[derive(Debug, Clone)]
pub struct PendingWrite {
    /// The block key.
    pub key: BlockKey,
    /// The WRITING location created for it.
    pub location_id: LocationId,
    /// How many parts that location has.
    pub parts: usize,
}

impl PendingWrite {
    /// The write of `location`, the new WRITING location of `key`.
    pub fn of(key: BlockKey, location: &crate::entry::Location) -> PendingWrite {
        PendingWrite {
            key,
            location_id: location.as_ref().id(),
            parts: location.parts.len(),
        }
    }
}

/// An open write session.
#[derive(Debug)]
pub struct Session {
    /// The instance whose key space holds the blocks.
    pub instance: Arc<Instance>,
    /// The blocks to write, in the order of the StartWriteCache answer.
    pub writes: Vec<PendingWrite>,
    /// When the session fails on its own.
    pub deadline: Instant,
}

#[derive(Default)]
struct State {
    sessions: HashMap<String, Session>,
    deadlines: BTreeSet<(Instant, String)>,
    open_per_instance: HashMap<InstanceKey, usize>,
    /// What the expiry thread waits for (it reads the deadlines again before every wait).
    expiry: ExpiryWait,
    shutdown: bool,
}

/// The expiry thread's state, as far as a new deadline is concerned.
#[derive(Default, Clone, Copy)]
enum ExpiryWait {
    /// Not waiting: it looks at the deadlines before it waits again.
    #[default]
    Running,
    /// Asleep until this instant.
    Until(Instant),
    /// Asleep until woken (no deadline was pending).
    Forever,
}

/// Why [`SessionTable::open`] refused a session (handed back with it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenRefusal {
    /// The caller's condition said no (this node is no longer the leader).
    NotAllowed,
    /// The instance already holds this many open sessions.
    PerInstanceLimit(usize),
}

impl State {
    /// Stores a session under a fresh random id; also says whether the expiry thread must be
    /// woken for its deadline (it sleeps past it, or without a deadline).
    fn insert(&mut self, session: Session) -> (String, bool) {
        let id = loop {
            let candidate = random_id(SESSION_ID_LEN);
            if !self.sessions.contains_key(&candidate) {
                break candidate;
            }
        };
        let wake = match self.expiry {
            ExpiryWait::Running => false,
            ExpiryWait::Until(wakes_at) => session.deadline < wakes_at,
            ExpiryWait::Forever => true,
        };
        self.deadlines.insert((session.deadline, id.clone()));
        *self
            .open_per_instance
            .entry(InstanceKey::of(&session.instance))
            .or_default() += 1;
        self.sessions.insert(id.clone(), session);
        (id, wake)
    }

    /// Removes session `id` (its deadline stays; expiry skips ids no longer present).
    fn remove(&mut self, id: &str) -> Option<Session> {
        let session = self.sessions.remove(id)?;
        let instance = InstanceKey::of(&session.instance);
        if let Some(count) = self.open_per_instance.get_mut(&instance) {
            *count -= 1;
            if *count == 0 {
                self.open_per_instance.remove(&instance);
            }
        }
        Some(session)
    }

    /// Open sessions of `instance`.
    fn open_of(&self, instance: &Arc<Instance>) -> usize {
        let key = InstanceKey::of(instance);
        self.open_per_instance.get(&key).copied().unwrap_or(0)
    }
}

/// An instance object's identity: its address, unique among live objects (a counted session
/// holds its instance alive, so no other instance can take the address meanwhile).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct InstanceKey(usize);

impl InstanceKey {
    fn of(instance: &Arc<Instance>) -> InstanceKey {
        InstanceKey(Arc::as_ptr(instance) as usize)
    }
}

/// All open sessions.
#[derive(Default)]
pub struct SessionTable {
    state: Mutex<State>,
    wake: Condvar,
}

impl SessionTable {
    /// Stores a session under a fresh random id and returns the id, if `may_open` (asked
    /// under the table lock, so that no session slips in after a [`SessionTable::take_all`]
    /// that followed a change of its answer) and its instance holds fewer than
    /// `per_instance` open sessions; otherwise hands the session back, with the reason.
    pub fn open(
        &self,
        session: Session,
        per_instance: usize,
        may_open: impl FnOnce() -> bool,
    ) -> Result<String, (Session, OpenRefusal)> {
        let mut state = lock(&self.state);
        if !may_open() {
            return Err((session, OpenRefusal::NotAllowed));
        }
        if state.open_of(&session.instance) >= per_instance {
            return Err((session, OpenRefusal::PerInstanceLimit(per_instance)));
        }
        let (id, wake) = state.insert(session);
        drop(state);
        if wake {
            self.wake.notify_all();
        }
        Ok(id)
    }

    /// Queues a consumed session again (its blocks could not be failed yet): the expiry
    /// thread hands it back at `session.deadline`.
    pub fn requeue(&self, session: Session) {
        let (_, wake) = lock(&self.state).insert(session);
        if wake {
            self.wake.notify_all();
        }
    }

    /// Removes and returns session `id` if `check` accepts it; a rejected session stays open.
    pub fn take_checked(
        &self,
        id: &str,
        check: impl FnOnce(&Session) -> ManagerResult<()>,
    ) -> ManagerResult<Session> {
        let mut state = lock(&self.state);
        let session = state.sessions.get(id).ok_or_else(|| {
            ManagerError::NotFound(format!("write_session_id {id:?} has been deleted"))
        })?;
        check(session)?;
        let deadline = (session.deadline, id.to_string());
        state.deadlines.remove(&deadline);
        state
            .remove(id)
            .ok_or_else(|| ManagerError::NotFound(id.to_string()))
    }

    /// Removes and returns every open session.
    pub fn take_all(&self) -> Vec<Session> {
        let mut state = lock(&self.state);
        state.deadlines.clear();
        state.open_per_instance.clear();
        state.sessions.drain().map(|(_, s)| s).collect()
    }

    /// Number of open sessions.
    pub fn len(&self) -> usize {
        lock(&self.state).sessions.len()
    }

    /// Stops the expiry thread.
    pub fn shutdown(&self) {
        lock(&self.state).shutdown = true;
        self.wake.notify_all();
    }

    /// Blocks until a session expires (returned, removed) or the table shuts down (`None`).
    fn next_expired(&self) -> Option<Session> {
        let mut state = lock(&self.state);
        loop {
            if state.shutdown {
                return None;
            }
            let now = Instant::now();
            match state.deadlines.first().cloned() {
                Some((deadline, id)) if deadline <= now => {
                    state.deadlines.remove(&(deadline, id.clone()));
                    if let Some(session) = state.remove(&id) {
                        return Some(session);
                    }
                }
                Some((deadline, _)) => {
                    state.expiry = ExpiryWait::Until(deadline);
                    state = self
                        .wake
                        .wait_timeout(state, deadline - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
                None => {
                    state.expiry = ExpiryWait::Forever;
                    state = self.wake.wait(state).unwrap_or_else(|p| p.into_inner());
                }
            }
            state.expiry = ExpiryWait::Running;
        }
    }
}

/// Starts the thread that hands every expired session to `on_expire`.
pub fn spawn_expiry(
    table: Arc<SessionTable>,
    on_expire: impl Fn(Session) + Send + 'static,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("kvcm-session-expiry".into())
        .spawn(move || {
            while let Some(session) = table.next_expired() {
                on_expire(session);
            }
        })
}

/// A random string of lower-case letters and digits.
pub fn random_id(len: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    (0..len)
        .map(|_| ALPHABET[fastrand::usize(..ALPHABET.len())] as char)
        .collect()
}
