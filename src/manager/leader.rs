//! Leadership of this node. The embedded single-node mode is leader from the start; a
//! LeaderDemote steps down and the node campaigns again after `campaign_delay_time_ms`.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Lease length reported in GetManagerClusterInfo.
const LEASE: Duration = Duration::from_secs(10);

/// Leader state of the node.
#[derive(Debug)]
pub struct Leadership {
    node_id: String,
    campaign_delay_ms: AtomicI64,
    demoted_until: Mutex<Option<Instant>>,
}

impl Leadership {
    /// A node that is leader at once.
    pub fn new(node_id: String) -> Self {
        Leadership {
            node_id,
            campaign_delay_ms: AtomicI64::new(0),
            demoted_until: Mutex::new(None),
        }
    }

    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// Whether this node holds leadership now (re-campaigning once a demotion's delay passed).
    pub fn is_leader(&self) -> bool {
        let mut demoted_until = lock(&self.demoted_until);
        match *demoted_until {
            Some(until) if Instant::now() < until => false,
            Some(_) => {
                *demoted_until = None;
                true
            }
            None => true,
        }
    }

    /// Steps down for the campaign delay; false when not leader.
    pub fn demote(&self) -> bool {
        if !self.is_leader() {
            return false;
        }
        let delay_ms = self.campaign_delay_ms.load(Ordering::Relaxed).max(1) as u64;
        *lock(&self.demoted_until) = Some(Instant::now() + Duration::from_millis(delay_ms));
        true
    }

    /// How long a demoted node refrains from campaigning.
    pub fn campaign_delay_ms(&self) -> i64 {
        self.campaign_delay_ms.load(Ordering::Relaxed)
    }

    /// Sets the campaign delay (negative values are stored as 0).
    pub fn set_campaign_delay_ms(&self, delay_ms: i64) {
        self.campaign_delay_ms
            .store(delay_ms.max(0), Ordering::Relaxed);
    }

    /// Lease expiry in microseconds since the epoch, -1 when not leader.
    pub fn lease_expiration_us(&self) -> i64 {
        if !self.is_leader() {
            return -1;
        }
        let expiry = SystemTime::now() + LEASE;
        expiry
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64)
    }
}

/// Locks a mutex, recovering from poisoning (the guarded data stays consistent: every
/// critical section here is a single assignment).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demotion_lasts_the_campaign_delay() {
        let leadership = Leadership::new("n1".into());
        assert!(leadership.is_leader());
        leadership.set_campaign_delay_ms(60_000);
        assert!(leadership.demote());
        assert!(!leadership.is_leader());
        assert!(!leadership.demote());
        assert_eq!(leadership.lease_expiration_us(), -1);
    }
}
