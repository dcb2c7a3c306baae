//! The change feed: every location state transition, for subscribers such as the lookup-table
//! publisher and the event log. Sending never blocks; a slow subscriber sees `Lagged`.

use std::sync::Arc;

use kvcm_index::BlockKey;
use tokio::sync::broadcast;

use super::entry::LocationState;

/// Capacity of the feed's ring; older events are dropped for subscribers that lag behind.
pub const FEED_CAPACITY: usize = 4096;

/// One location changing state. `None` means "not stored" (before creation, after removal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateChange {
    /// Instance whose key space holds the key.
    pub instance_id: Arc<str>,
    /// The block key.
    pub key: BlockKey,
    /// The location's id within the key.
    pub location_id: Arc<str>,
    /// State before.
    pub from: Option<LocationState>,
    /// State after.
    pub to: Option<LocationState>,
}

/// Publishes state changes to every current subscriber.
#[derive(Debug, Clone)]
pub struct ChangeFeed {
    sender: broadcast::Sender<StateChange>,
}

impl Default for ChangeFeed {
    fn default() -> Self {
        ChangeFeed {
            sender: broadcast::channel(FEED_CAPACITY).0,
        }
    }
}

impl ChangeFeed {
    /// A receiver of every change published from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<StateChange> {
        self.sender.subscribe()
    }

    /// Publishes one change (dropped when nobody listens).
    pub fn publish(&self, change: StateChange) {
        if self.sender.receiver_count() > 0 {
            // An error only means every receiver went away in the meantime.
            let _ = self.sender.send(change);
        }
    }
}
