//! The elector: the state behind [`super::Leadership`] and the thread that steps it.
//!
//! Lock I/O never runs under the state mutex (readers of `is_leader` never wait on a
//! file system). A step applies its outcome only if the lease it started from is still the
//! one held, so a demotion racing a renewal wins; steps themselves are serialised.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::lock::{now_ms, HolderRecord, LeaseToken};
use super::{
    DemoteHook, Election, ElectorSettings, NodeEndpoint, PromoteHook, Promotion, MAX_CAMPAIGN_DELAY,
};
use crate::sync::lock;

/// A lease this node holds.
#[derive(Debug, Clone, Copy)]
struct Held {
    token: LeaseToken,
    /// When this node stops acting on it (monotonic clock).
    valid_until: Instant,
}

#[derive(Debug, Default)]
struct State {
    lease: Option<Held>,
    /// When the last LeaderDemote happened.
    demoted_at: Option<Instant>,
    /// No campaign before this (a demotion carried over from before a restart).
    hold_until: Option<Instant>,
    /// The last holder read from the lock.
    observed: Option<HolderRecord>,
    /// A wake-up is due (config change, shutdown).
    wake_pending: bool,
    /// No more campaigns.
    stopped: bool,
}

/// The elector's shared state.
pub(super) struct Shared {
    pub node_id: String,
    pub campaign_delay_ms: AtomicI64,
    pub last_step_ms: AtomicI64,
    election: Mutex<Election>,
    state: Mutex<State>,
    wake: Condvar,
    /// Held for a whole step: steps never overlap.
    stepping: Mutex<()>,
    on_promote: Mutex<Option<PromoteHook>>,
    on_demote: Mutex<Vec<DemoteHook>>,
    /// The last lock error logged (each distinct error is logged once in a row).
    last_error: Mutex<String>,
    /// Whether the election is the configured one (not the provisional process-local lock
    /// a node holds from its creation until the server configures its own): promotions on
    /// the provisional lock are not announced, so a follower never logs a lead it did not
    /// take on the shared lock.
    configured: AtomicBool,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("node_id", &self.node_id)
            .field("state", &*lock(&self.state))
            .finish_non_exhaustive()
    }
}

/// Starts the elector thread of `shared`; it ends once `shared` is resigned.
pub(super) fn spawn(shared: Arc<Shared>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("kvcm-elector".into())
        .spawn(move || {
            while shared.sleep() {
                shared.step();
            }
        })
        .map(drop)
}

impl Shared {
    pub fn new(node_id: String, mut election: Election) -> Self {
        election.endpoint.node_id = node_id.clone();
        Shared {
            node_id,
            campaign_delay_ms: AtomicI64::new(0),
            last_step_ms: AtomicI64::new(0),
            election: Mutex::new(election),
            state: Mutex::default(),
            wake: Condvar::new(),
            stepping: Mutex::new(()),
            on_promote: Mutex::default(),
            on_demote: Mutex::default(),
            last_error: Mutex::default(),
            configured: AtomicBool::new(false),
        }
    }

    fn election(&self) -> Election {
        lock(&self.election).clone()
    }

    /// The token of the live lease, if this node leads.
    pub fn held(&self) -> Option<LeaseToken> {
        let state = lock(&self.state);
        let held = state.lease?;
        (Instant::now() < held.valid_until).then_some(held.token)
    }

    /// One elector step: renew, give up a run-out lease, or campaign.
    pub fn step(&self) {
        let _stepping = lock(&self.stepping);
        self.last_step_ms.store(now_ms() as i64, Ordering::Relaxed);
        let election = self.election();
        let (lease, may_campaign) = {
            let state = lock(&self.state);
            if state.stopped {
                return;
            }
            (state.lease, self.may_campaign(&state, &election))
        };
        match lease {
            Some(held) if Instant::now() < held.valid_until => self.renew(&election, held.token),
            Some(held) => self.lose(held.token.fencing_token, "the lease ran out unrenewed"),
            None if may_campaign => self.campaign(&election),
            None => {}
        }
        self.observe(&election);
    }

    fn may_campaign(&self, state: &State, election: &Election) -> bool {
        let delay_ms = self.campaign_delay_ms.load(Ordering::Relaxed);
        let pause = campaign_pause(delay_ms, &election.settings);
        let held_off = state.hold_until.is_some_and(|until| Instant::now() < until);
        !held_off && state.demoted_at.is_none_or(|at| at.elapsed() >= pause)
    }

    fn renew(&self, election: &Election, token: LeaseToken) {
        let started = Instant::now();
        let lease = election.settings.lease;
        match election
            .lock
            .renew(&election.endpoint, token.fencing_token, lease)
        {
            Ok(renewed) => {
                let mut state = lock(&self.state);
                let still_held = state
                    .lease
                    .as_mut()
                    .filter(|held| held.token.fencing_token == token.fencing_token);
                if let Some(held) = still_held {
                    held.token = renewed;
                    held.valid_until = started + election.settings.local_term();
                }
            }
            Err(error) => self.lose(token.fencing_token, &error.to_string()),
        }
    }

    /// Drops the lease with this token (if still held) and runs the demotion hook.
    fn lose(&self, fencing_token: u64, why: &str) {
        let lost = lock(&self.state)
            .lease
            .take_if(|held| held.token.fencing_token == fencing_token)
            .is_some();
        if lost {
            tracing::warn!(node_id = %self.node_id, fencing_token, "no longer leader: {why}");
            self.run_demote_hook();
        }
    }

    fn campaign(&self, election: &Election) {
        match election
            .lock
            .try_acquire(&election.endpoint, election.settings.lease)
        {
            Ok(Some(token)) => self.promote(election, token),
            Ok(None) => self.clear_error(),
            Err(error) => self.log_error("campaigning", &error.to_string()),
        }
    }

    /// Runs the promotion hook, then renews (the hook may have taken a while) and leads.
    fn promote(&self, election: &Election, token: LeaseToken) {
        let fencing_token = token.fencing_token;
        let hook = lock(&self.on_promote).clone();
        if let Some(Err(reason)) = hook.map(|hook| hook(&Promotion { fencing_token })) {
            tracing::error!(node_id = %self.node_id, "promotion failed, staying follower: {reason}");
            self.release(election, fencing_token);
            return;
        }
        let started = Instant::now();
        let lease = election.settings.lease;
        let renewed = match election
            .lock
            .renew(&election.endpoint, fencing_token, lease)
        {
            Ok(renewed) => renewed,
            Err(error) => {
                // The hook ran (it may have loaded state for a lead it never took): the
                // demotion hooks see the lead lost.
                self.log_error("renewing after promotion", &error.to_string());
                return self.run_demote_hook();
            }
        };
        let mut state = lock(&self.state);
        if state.stopped {
            drop(state);
            return self.release(election, fencing_token);
        }
        state.lease = Some(Held {
            token: renewed,
            valid_until: started + election.settings.local_term(),
        });
        drop(state);
        self.clear_error();
        if self.configured.load(Ordering::Relaxed) {
            tracing::info!(node_id = %self.node_id, fencing_token, "promoted to leader");
        } else {
            tracing::debug!(node_id = %self.node_id, "leads on the process-local lock");
        }
    }

    fn release(&self, election: &Election, fencing_token: u64) {
        if let Err(error) = election.lock.release(&self.node_id, fencing_token) {
            let why = format!("{error}; the lease will expire on its own");
            self.log_error("releasing the lock", &why);
        }
    }

    fn observe(&self, election: &Election) {
        match election.lock.current_holder() {
            Ok(holder) => lock(&self.state).observed = holder,
            Err(error) => self.log_error("reading the lock", &error.to_string()),
        }
    }

    /// The live holder read now, else the last one observed.
    pub fn leader(&self) -> Option<HolderRecord> {
        match self.election().lock.current_holder() {
            Ok(holder) => holder,
            Err(_) => lock(&self.state).observed.clone(),
        }
    }

    pub fn demote(&self) -> bool {
        let token = {
            let mut state = lock(&self.state);
            let now = Instant::now();
            let Some(held) = state.lease.take_if(|held| now < held.valid_until) else {
                return false;
            };
            state.demoted_at = Some(now);
            held.token
        };
        self.release(&self.election(), token.fencing_token);
        tracing::info!(node_id = %self.node_id, "demoted by request");
        self.run_demote_hook();
        true
    }

    pub fn configure(&self, election: Election) {
        {
            let _stepping = lock(&self.stepping);
            let previous = self.election();
            let held = lock(&self.state).lease.take();
            if let Some(held) = held {
                self.release(&previous, held.token.fencing_token);
                self.run_demote_hook();
            }
            let mut election = election;
            election.endpoint.node_id = self.node_id.clone();
            *lock(&self.election) = election;
            self.configured.store(true, Ordering::Relaxed);
        }
        self.step();
    }

    pub fn set_endpoint(&self, mut endpoint: NodeEndpoint) {
        endpoint.node_id = self.node_id.clone();
        lock(&self.election).endpoint = endpoint;
    }

    /// How long until a demoted node may campaign again (zero when it may).
    pub fn campaign_pause_left(&self) -> Duration {
        let delay_ms = self.campaign_delay_ms.load(Ordering::Relaxed);
        let pause = campaign_pause(delay_ms, &lock(&self.election).settings);
        let state = lock(&self.state);
        let after_demotion = state
            .demoted_at
            .map_or(Duration::ZERO, |at| pause.saturating_sub(at.elapsed()));
        let held = state.hold_until.map_or(Duration::ZERO, |until| {
            until.saturating_duration_since(Instant::now())
        });
        after_demotion.max(held)
    }

    /// Campaigns no sooner than `pause` from now.
    pub fn hold_off(&self, pause: Duration) {
        lock(&self.state).hold_until = Some(Instant::now() + pause);
    }

    pub fn set_on_promote(&self, hook: PromoteHook) {
        *lock(&self.on_promote) = Some(hook);
    }

    pub fn add_on_demote(&self, hook: DemoteHook) {
        lock(&self.on_demote).push(hook);
    }

    pub fn resign(&self) {
        let held = {
            let mut state = lock(&self.state);
            state.stopped = true;
            state.lease.take()
        };
        self.wake();
        if let Some(held) = held {
            self.release(&self.election(), held.token.fencing_token);
            self.run_demote_hook();
        }
    }

    /// Whether [`Shared::resign`] ran.
    pub fn resigned(&self) -> bool {
        lock(&self.state).stopped
    }

    fn run_demote_hook(&self) {
        let hooks = lock(&self.on_demote).clone();
        for hook in hooks {
            hook();
        }
    }

    /// Wakes the elector thread for a step now.
    pub fn wake(&self) {
        lock(&self.state).wake_pending = true;
        self.wake.notify_all();
    }

    /// Waits one loop period (or for a wake-up); false once resigned.
    fn sleep(&self) -> bool {
        let deadline = Instant::now() + lock(&self.election).settings.loop_interval;
        let mut state = lock(&self.state);
        loop {
            if state.stopped {
                return false;
            }
            let now = Instant::now();
            if std::mem::take(&mut state.wake_pending) || now >= deadline {
                return true;
            }
            state = wait(&self.wake, state, deadline - now);
        }
    }

    fn log_error(&self, doing: &str, error: &str) {
        let text = format!("{doing}: {error}");
        let mut last = lock(&self.last_error);
        if *last != text {
            tracing::warn!(node_id = %self.node_id, "elector {text}");
            *last = text;
        }
    }

    fn clear_error(&self) {
        lock(&self.last_error).clear();
    }
}

/// How long a demoted node stays follower: the campaign delay clamped to
/// [`MAX_CAMPAIGN_DELAY`], and at least two loop periods.
pub(super) fn campaign_pause(delay_ms: i64, settings: &ElectorSettings) -> Duration {
    Duration::from_millis(delay_ms.max(0) as u64)
        .min(MAX_CAMPAIGN_DELAY)
        .max(settings.min_demotion())
}

/// Waits on `condvar` for at most `timeout`, recovering from poisoning.
fn wait<'a, T>(
    condvar: &Condvar,
    guard: MutexGuard<'a, T>,
    timeout: Duration,
) -> MutexGuard<'a, T> {
    match condvar.wait_timeout(guard, timeout) {
        Ok((guard, _)) => guard,
        Err(poisoned) => poisoned.into_inner().0,
    }
}
