//! Leadership on shared locks: exclusion, demotion and its delay, promotion hooks, fencing.

use super::elector::campaign_pause;
use super::*;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::Instant;

const QUICK: ElectorSettings = ElectorSettings {
    lease: Duration::from_millis(600),
    loop_interval: Duration::from_millis(20),
};

/// Polls `probe` every millisecond until true; panics after 10 s naming `what`.
fn eventually(what: &str, mut probe: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !probe() {
        assert!(Instant::now() < deadline, "not within 10 s: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A node on `lock` with the quick settings.
fn node(id: &str, lock: &Arc<dyn LeaseLock>) -> Leadership {
    let leadership = Leadership::new(id.into()).expect("elector thread");
    leadership.configure(Election {
        lock: lock.clone(),
        settings: QUICK,
        endpoint: NodeEndpoint::default(),
    });
    leadership
}

#[test]
fn a_new_node_leads_at_once_on_its_own_memory_lock() {
    let leadership = Leadership::new("n1".into()).unwrap();
    assert!(leadership.is_leader());
    assert_eq!(leadership.leader().unwrap().endpoint.node_id, "n1");
    assert!(leadership.lease_expiration_us() > 0);
    assert!(leadership.elector_last_loop_ms() > 0);
}

#[test]
fn one_of_two_nodes_leads_and_a_demotion_passes_the_lead() {
    let lock: Arc<dyn LeaseLock> = Arc::new(MemoryLock::default());
    let a = node("a", &lock);
    let b = node("b", &lock);
    assert!(a.is_leader(), "a campaigned first on a free lock");
    assert!(!b.is_leader());
    assert_eq!(b.leader().unwrap().endpoint.node_id, "a");
    assert!(!b.demote(), "a follower cannot demote");
    let first = lock.current_holder().unwrap().unwrap().fencing_token;

    // A pause longer than the test: with only the minimum (two loop periods) a busy
    // machine may run a's elector before b's, and a would lead again.
    a.set_campaign_delay_ms(60_000);
    assert!(a.demote());
    assert!(!a.is_leader(), "not leader once demote returns");
    assert_eq!(a.lease_expiration_us(), -1);
    eventually("b leads", || b.is_leader());
    assert!(!a.is_leader(), "a is still in its campaign delay");
    let holder = a.leader().unwrap();
    assert_eq!(holder.endpoint.node_id, "b");
    assert!(holder.fencing_token > first);
}

#[test]
fn an_unbounded_campaign_delay_is_undone_by_setting_it_back_to_zero() {
    let leadership = Leadership::new("solo".into()).unwrap();
    leadership.set_campaign_delay_ms(i64::MAX);
    assert!(leadership.demote());
    assert!(!leadership.is_leader());
    assert_eq!(leadership.campaign_delay_ms(), i64::MAX);
    leadership.set_campaign_delay_ms(0);
    eventually("leads again after the delay is set to 0", || {
        leadership.is_leader()
    });
}

#[test]
fn a_demotion_lasts_at_least_two_loop_periods() {
    let leadership = Leadership::new("solo".into()).unwrap();
    let demoted_at = Instant::now();
    assert!(leadership.demote());
    eventually("leads again", || leadership.is_leader());
    assert!(demoted_at.elapsed() >= ElectorSettings::default().min_demotion());
}

#[test]
fn the_campaign_delay_is_clamped_to_the_maximum() {
    let settings = ElectorSettings::default();
    assert_eq!(campaign_pause(i64::MAX, &settings), MAX_CAMPAIGN_DELAY);
    assert_eq!(campaign_pause(-5, &settings), settings.min_demotion());
    assert_eq!(campaign_pause(0, &settings), Duration::from_millis(200));
    assert_eq!(campaign_pause(400, &settings), Duration::from_millis(400));
}

#[test]
fn the_promotion_hook_runs_before_the_node_leads() {
    let lock: Arc<dyn LeaseLock> = Arc::new(MemoryLock::default());
    let leadership = Arc::new(Leadership::new("a".into()).unwrap());
    let (entered, hook_entered) = mpsc::channel();
    let (go, hook_go) = mpsc::channel::<()>();
    let hook_go = Mutex::new(hook_go);
    leadership.set_on_promote(Arc::new(move |promotion: &Promotion| {
        entered
            .send(promotion.fencing_token)
            .map_err(|e| e.to_string())?;
        lock_rx(&hook_go).recv().map_err(|e| e.to_string())
    }));
    let configuring = {
        let (leadership, lock) = (leadership.clone(), lock.clone());
        std::thread::spawn(move || {
            leadership.configure(Election {
                lock,
                settings: QUICK,
                endpoint: NodeEndpoint::default(),
            })
        })
    };
    let token = hook_entered.recv().unwrap();
    assert_eq!(token, 1);
    assert!(!leadership.is_leader(), "not leader while the hook runs");
    go.send(()).unwrap();
    configuring.join().unwrap();
    assert!(leadership.is_leader());
}

fn lock_rx<T>(rx: &Mutex<mpsc::Receiver<T>>) -> std::sync::MutexGuard<'_, mpsc::Receiver<T>> {
    crate::sync::lock(rx)
}

#[test]
fn a_failing_promotion_hook_keeps_the_node_follower_and_frees_the_lock() {
    let lock: Arc<dyn LeaseLock> = Arc::new(MemoryLock::default());
    let calls = Arc::new(AtomicUsize::new(0));
    let leadership = Leadership::new("a".into()).unwrap();
    let counted = calls.clone();
    leadership.set_on_promote(Arc::new(move |_: &Promotion| {
        counted.fetch_add(1, Ordering::SeqCst);
        Err("recovery failed".into())
    }));
    leadership.configure(Election {
        lock: lock.clone(),
        settings: QUICK,
        endpoint: NodeEndpoint::default(),
    });
    eventually("three campaigns", || calls.load(Ordering::SeqCst) >= 3);
    assert!(!leadership.is_leader());
    assert!(
        lock.current_holder().unwrap().is_none(),
        "each failure released the lock"
    );
}

#[test]
fn a_lost_lease_demotes_at_the_next_step_and_runs_the_hook() {
    let lock: Arc<dyn LeaseLock> = Arc::new(MemoryLock::default());
    let a = node("a", &lock);
    let demoted = Arc::new(AtomicBool::new(false));
    let flag = demoted.clone();
    a.add_on_demote(Arc::new(move || flag.store(true, Ordering::SeqCst)));
    let holder = lock.current_holder().unwrap().unwrap();
    assert!(
        lock.release("a", holder.fencing_token).unwrap(),
        "an operator frees the lock"
    );
    let other = NodeEndpoint {
        node_id: "b".into(),
        ..NodeEndpoint::default()
    };
    let taken = lock.try_acquire(&other, Duration::from_secs(60)).unwrap();
    assert!(taken.is_some());
    eventually("a notices", || !a.is_leader());
    eventually("the demotion hook ran", || demoted.load(Ordering::SeqCst));
}

/// A lock whose renewals hang while `stalled` (a stopped process, a stuck disk).
#[derive(Debug, Default)]
struct StallingLock {
    inner: MemoryLock,
    stalled: AtomicBool,
}

impl LeaseLock for StallingLock {
    fn try_acquire(
        &self,
        candidate: &NodeEndpoint,
        lease: Duration,
    ) -> LockResult<Option<LeaseToken>> {
        self.inner.try_acquire(candidate, lease)
    }

    fn renew(&self, holder: &NodeEndpoint, token: u64, lease: Duration) -> LockResult<LeaseToken> {
        while self.stalled.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.inner.renew(holder, token, lease)
    }

    fn release(&self, node_id: &str, token: u64) -> LockResult<bool> {
        self.inner.release(node_id, token)
    }

    fn current_holder(&self) -> LockResult<Option<HolderRecord>> {
        self.inner.current_holder()
    }
}

#[test]
fn a_leader_whose_renewals_stall_stops_leading_before_its_lease_expires() {
    let stalling = Arc::new(StallingLock::default());
    let lock: Arc<dyn LeaseLock> = stalling.clone();
    let a = node("a", &lock);
    assert!(a.is_leader());
    stalling.stalled.store(true, Ordering::SeqCst);
    let stalled_at = Instant::now();
    eventually("a stops leading", || !a.is_leader());
    assert!(
        stalled_at.elapsed() < QUICK.lease,
        "fenced before the lock's expiry"
    );
    let holder = lock.current_holder().unwrap();
    assert!(
        holder.is_some_and(|h| h.endpoint.node_id == "a"),
        "the lock still names a"
    );
    stalling.stalled.store(false, Ordering::SeqCst);
}

#[test]
fn settings_need_three_renewals_per_term() {
    assert!(ElectorSettings::default().validate().is_ok());
    let tight = ElectorSettings {
        lease: Duration::from_millis(1000),
        loop_interval: Duration::from_millis(400),
    };
    assert!(tight.validate().unwrap_err().contains("loop_interval_ms"));
    let zero = ElectorSettings {
        loop_interval: Duration::ZERO,
        ..ElectorSettings::default()
    };
    assert!(zero.validate().is_err());
}
