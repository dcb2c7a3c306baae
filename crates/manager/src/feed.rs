//! The change feed: every location state transition, for subscribers such as the
//! lookup-table publisher (a later issue) and tests.
//!
//! Delivery is lossless and ordered per location (key and location id): each subscriber has
//! its own unbounded queue, and a transition is published inside the index's critical section
//! for its key (the compare-and-set that makes it), so the transitions of one location reach
//! every subscriber in the order they were applied. Subscribers must track locations by
//! (key, location id): the retraction below is published after the key's lock is released,
//! so another location of the same key may be created in between. A subscriber that falls behind costs memory, never an
//! event; one that drops its receiver is forgotten at the next publish. Should an insert fail
//! after its creations were published (an index refusing the batch), each is retracted with a
//! `Writing → None` change, so a subscriber's picture never keeps a location that was not
//! stored.
//!
//! The event log (src/events in the `kvcm` crate) does not subscribe: it records requests
//! and their answers, not transitions.

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};

use kvcm_index::BlockKey;

use super::entry::{LocationId, LocationState};
use crate::sync::lock;

/// One location changing state. `None` means "not stored" (before creation, after removal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateChange {
    /// Instance whose key space holds the key.
    pub instance_id: Arc<str>,
    /// The block key.
    pub key: BlockKey,
    /// The location's id within the key.
    pub location_id: LocationId,
    /// State before.
    pub from: Option<LocationState>,
    /// State after.
    pub to: Option<LocationState>,
}

/// Publishes state changes to every current subscriber.
#[derive(Debug, Clone, Default)]
pub struct ChangeFeed {
    subscribers: Arc<Mutex<Vec<Sender<StateChange>>>>,
}

impl ChangeFeed {
    /// A receiver of every change published from now on.
    pub fn subscribe(&self) -> Receiver<StateChange> {
        let (sender, receiver) = mpsc::channel();
        lock(&self.subscribers).push(sender);
        receiver
    }

    /// Publishes one change to every subscriber (nothing to do when nobody listens).
    pub fn publish(&self, change: StateChange) {
        let mut subscribers = lock(&self.subscribers);
        if subscribers.is_empty() {
            return;
        }
        subscribers.retain(|subscriber| subscriber.send(change.clone()).is_ok());
    }
}
