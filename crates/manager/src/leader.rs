//! Leadership of this node. The embedded single-node mode is leader from the start; a
//! LeaderDemote steps down and the node campaigns again after `campaign_delay_time_ms`,
//! but never sooner than one elector-loop period ([`MIN_DEMOTION`]), as the reference's
//! elector only campaigns on its loop tick.

use crate::sync::lock;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Lease length reported in GetManagerClusterInfo.
const LEASE: Duration = Duration::from_secs(10);

/// The shortest demotion: one elector-loop period (a demoted node is a follower at least
/// this long even with `campaign_delay_time_ms` 0).
pub const MIN_DEMOTION: Duration = Duration::from_secs(1);

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

    /// Steps down for the campaign delay (at least [`MIN_DEMOTION`]); false when not leader.
    pub fn demote(&self) -> bool {
        let mut demoted_until = lock(&self.demoted_until);
        let now = Instant::now();
        if demoted_until.is_some_and(|until| now < until) {
            return false;
        }
        let delay_ms = self.campaign_delay_ms.load(Ordering::Relaxed).max(0) as u64;
        let delay = Duration::from_millis(delay_ms).max(MIN_DEMOTION);
        *demoted_until = Some(now + delay);
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

    #[test]
    fn a_zero_campaign_delay_still_demotes_for_one_loop_period() {
        let leadership = Leadership::new("n1".into());
        assert_eq!(leadership.campaign_delay_ms(), 0);
        let demoted_at = Instant::now();
        assert!(leadership.demote());
        std::thread::sleep(Duration::from_millis(50));
        assert!(!leadership.is_leader());
        assert!(!leadership.demote(), "a second demotion finds a follower");
        let give_up = demoted_at + Duration::from_secs(10);
        while !leadership.is_leader() && Instant::now() < give_up {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(leadership.is_leader(), "the node campaigns again");
        assert!(demoted_at.elapsed() >= MIN_DEMOTION);
    }
}
