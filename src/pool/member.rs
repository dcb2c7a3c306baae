//! Membership of a pool node: joins its pool storage on one of the configured servers
//! (over their meta HTTP, [`Channel::Http`]) or on the server it runs in (the embedded node,
//! [`Channel::InProcess`]: direct calls, so no TLS or credential is involved), then
//! heartbeats at the interval the server gave. A heartbeat the server refuses (it
//! declared this incarnation dead, or restarted) makes the node join again, naming the
//! incarnation it had: a restarted server that adopted that incarnation's blocks from its
//! log resumes it (same `range_id`, the blocks found again, since this process kept the
//! region); otherwise the node gets a new incarnation. An unreachable server passes to the
//! next address. A node the server has isolate instances names in each heartbeat the
//! ownership version it applied and applies what the answer carries
//! (`super::isolation`); a client's runs request may ask for a heartbeat early (at most
//! one every 5 ms).
//!
//! Invariant: the region's `range_id` is only set from a join answer, so it always names
//! the incarnation the server knows (or an older one during the next join).

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::region::{PoolRegion, Wake};
use super::routes::{
    HeartbeatAnswer, HeartbeatRequest, JoinAnswer, JoinRequest, Registrar, HEARTBEAT_ROUTE,
    JOIN_ROUTE,
};
use super::PoolError;
use crate::http_json::{post_json_with, PostError};
use crate::tls_client::TlsClient;

/// Deadline of one membership request.
const REQUEST_DEADLINE: Duration = Duration::from_secs(2);
/// Pause between join attempts.
const JOIN_RETRY: Duration = Duration::from_millis(200);
/// Least time between two heartbeats (those clients ask for come early, but not more often:
/// a client cannot flood the server through a node).
const ASKED_BEAT_GAP: Duration = Duration::from_millis(5);
/// Heartbeats that fail in a row before a node turns to its next server — and then only once
/// its last answered beat is as many heartbeat intervals old (beats clients ask for come
/// early, and fail fast against a refused connection): the time the server that issued its
/// incarnation waits before declaring the node dead. A passing failure must not take the
/// node to a server that never knew the incarnation, whose "unknown" answer would make the
/// node drop it (and the issuer then sweep its blocks).
const FAILED_BEATS_BEFORE_MOVING: u32 = 3;

/// What a node joins and how it talks to the server side of membership.
#[derive(Clone)]
pub struct Joining {
    /// The pool storage to join.
    pub storage: String,
    /// How joins and heartbeats reach a server.
    pub channel: Channel,
}

/// How a node reaches the server side of membership.
#[derive(Clone)]
pub enum Channel {
    /// The meta HTTP of kvcm servers (`kvcm pool --server`).
    Http(MetaHttp),
    /// The server this node runs in (`kvcm serve --pool-size`): its registrar, called
    /// directly. The node is part of the server, so it shows no credential.
    InProcess(Registrar),
}

/// The meta HTTP of the kvcm servers a node joins.
#[derive(Clone)]
pub struct MetaHttp {
    /// Their addresses, tried in order (a join that fails passes to the next; heartbeats
    /// pass on after [`FAILED_BEATS_BEFORE_MOVING`] failures in a row).
    pub servers: Vec<SocketAddr>,
    /// TLS towards them (when they serve it).
    pub tls: Option<TlsClient>,
    /// The credential (an operator's or admin's API key, or an admin token) joins and
    /// heartbeats carry, for servers with `kvcm.auth.meta = required`.
    pub api_key: Option<String>,
}

impl MetaHttp {
    /// Posts `request` to `route` of server number `at`: its address and the answer.
    fn post<A: DeserializeOwned>(
        &self,
        at: usize,
        route: &str,
        request: &impl Serialize,
    ) -> (SocketAddr, Result<A, PostError>) {
        let address = self.servers[at];
        let (tls, key) = (self.tls.as_ref(), self.api_key.as_deref());
        let answer = post_json_with(address, route, request, REQUEST_DEADLINE, key, tls);
        (address, answer)
    }

    /// Passes from server number `at` to the next.
    fn next(&self, at: &mut usize) {
        *at = (*at + 1) % self.servers.len();
    }
}

/// Why a heartbeat was not answered.
enum BeatError {
    /// The server does not know this incarnation (declared it dead, or restarted).
    Forgotten,
    /// Anything else (an unreachable server, a refused credential).
    Failed(String),
}

impl Channel {
    /// Passes from server number `server` to the next (the in-process channel has one).
    fn next(&self, server: &mut usize) {
        if let Channel::Http(http) = self {
            http.next(server);
        }
    }

    /// A join attempt on the current server (moving to the next on failure).
    fn join(&self, request: &JoinRequest, server: &mut usize) -> Result<JoinAnswer, String> {
        match self {
            Channel::Http(http) => {
                let (address, answer) = http.post(*server, JOIN_ROUTE, request);
                answer.map_err(|error| {
                    http.next(server);
                    format!("join at {address}: {error}")
                })
            }
            Channel::InProcess(registrar) => registrar
                .join(request)
                .map_err(|error| format!("join: {error}")),
        }
    }

    /// A heartbeat on the current server.
    fn heartbeat(
        &self,
        request: &HeartbeatRequest,
        server: usize,
    ) -> Result<HeartbeatAnswer, BeatError> {
        match self {
            Channel::Http(http) => match http.post(server, HEARTBEAT_ROUTE, request) {
                (_, Ok(answer)) => Ok(answer),
                (_, Err(PostError::Status { status: 404, .. })) => Err(BeatError::Forgotten),
                (address, Err(error)) => {
                    let error = format!("heartbeat at {address}: {error}");
                    Err(BeatError::Failed(error))
                }
            },
            Channel::InProcess(registrar) => match registrar.heartbeat(request) {
                Ok(answer) => Ok(answer),
                Err(error) if Registrar::is_forgotten(&error) => Err(BeatError::Forgotten),
                Err(error) => Err(BeatError::Failed(format!("heartbeat: {error}"))),
            },
        }
    }
}

/// Who the node is and where it joins.
#[derive(Clone)]
pub struct MemberConfig {
    /// The node's stable id.
    pub node_id: String,
    /// Where clients connect (the listener).
    pub endpoint: String,
    /// Bytes of the region.
    pub capacity: u64,
    /// The pool and how to reach the server ([`Channel`]).
    pub joining: Joining,
}

/// The membership thread; dropping it stops the heartbeats (the server then declares the
/// node dead after its missed-heartbeat limit).
pub struct Member {
    region: Arc<PoolRegion>,
    thread: Option<JoinHandle<()>>,
}

impl Member {
    /// Starts joining and heartbeating on a thread of its own.
    pub fn start(config: MemberConfig, region: Arc<PoolRegion>) -> Result<Member, PoolError> {
        let channel = &config.joining.channel;
        if matches!(channel, Channel::Http(http) if http.servers.is_empty()) {
            return Err(PoolError::Config(
                "--server: at least one address is needed".into(),
            ));
        }
        if !region.can_isolate() {
            tracing::warn!(
                bytes = region.len(),
                "this pool region is too large to isolate instances (at most about 32 GiB): \
                 a server that requires meta auth refuses this node"
            );
        }
        let running = region.clone();
        let thread = std::thread::Builder::new()
            .name("kvcm-pool-member".into())
            .spawn(move || run(&config, &running))
            .map_err(PoolError::Listener)?;
        Ok(Member {
            region,
            thread: Some(thread),
        })
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.region.stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Join, heartbeat until refused, join again; until stopped.
fn run(config: &MemberConfig, region: &PoolRegion) {
    let mut server = 0;
    let mut had: Option<u64> = None;
    loop {
        let membership = loop {
            match join(config, region, &mut server, had) {
                Ok(answer) => break answer,
                Err(error) => {
                    note_error(error);
                    if region.pause(JOIN_RETRY, false) == Wake::Stopped {
                        return;
                    }
                }
            }
        };
        let ticket_key = membership
            .ticket_key
            .as_deref()
            .map(kvcm_manager::hex::decode);
        if ticket_key == Some(None) {
            note_error("the server's ticket key is not 64 hex digits: joining again".into());
            continue;
        }
        if had == Some(membership.range_id) {
            tracing::info!(
                range_id = membership.range_id,
                "the server resumed this node's incarnation: its blocks are served again"
            );
        }
        had = Some(membership.range_id);
        let (range_id, isolated) = (membership.range_id, membership.isolated);
        if let Err(error) = region.set_incarnation(range_id, ticket_key.flatten(), isolated) {
            // It serves no one now; its next join says it cannot isolate, which the server
            // refuses, and says why, at every try.
            tracing::error!(%error, "pool membership");
            had = None;
            if region.pause(JOIN_RETRY, false) == Wake::Stopped {
                return;
            }
            continue;
        }
        let interval = Duration::from_millis(membership.heartbeat_ms.max(1));
        let mut last_beat = Instant::now();
        let (mut failed_beats, mut last_answered) = (0, Instant::now());
        loop {
            if region.pause(interval, true) == Wake::Stopped {
                return;
            }
            // Heartbeats asked by clients' runs requests come at most every ASKED_BEAT_GAP.
            let gap = ASKED_BEAT_GAP.saturating_sub(last_beat.elapsed());
            if !gap.is_zero() && region.pause(gap, false) == Wake::Stopped {
                return;
            }
            last_beat = Instant::now();
            let started = region.beat_started();
            let beat = HeartbeatRequest {
                storage: config.joining.storage.clone(),
                node_id: config.node_id.clone(),
                range_id,
                grants: region.live_grants(),
                applied: region.applied(),
            };
            let answer = config.joining.channel.heartbeat(&beat, server);
            let forgotten = matches!(answer, Err(BeatError::Forgotten));
            match answer {
                Ok(answer) => {
                    (failed_beats, last_answered) = (0, Instant::now());
                    take_answer(region, &answer);
                }
                Err(BeatError::Failed(error)) => {
                    note_error(error);
                    failed_beats += 1;
                    let silent = last_answered.elapsed();
                    if failed_beats >= FAILED_BEATS_BEFORE_MOVING
                        && silent >= interval * FAILED_BEATS_BEFORE_MOVING
                    {
                        config.joining.channel.next(&mut server);
                        (failed_beats, last_answered) = (0, Instant::now());
                    }
                }
                Err(BeatError::Forgotten) => {}
            }
            region.beat_finished(started);
            if forgotten {
                region.forget_incarnation();
                break; // join again
            }
        }
    }
}

/// One join attempt on the current server, naming the incarnation this process `had`.
fn join(
    config: &MemberConfig,
    region: &PoolRegion,
    server: &mut usize,
    had: Option<u64>,
) -> Result<JoinAnswer, String> {
    let request = JoinRequest {
        storage: config.joining.storage.clone(),
        node_id: config.node_id.clone(),
        endpoint: config.endpoint.clone(),
        capacity: config.capacity,
        resume_range_id: had,
        isolates: region.may_isolate(),
    };
    config.joining.channel.join(&request, server)
}

/// Tears down the queue pairs of revoked grants and applies the ownership answered.
fn take_answer(region: &PoolRegion, answer: &HeartbeatAnswer) {
    if !answer.revoked.is_empty() {
        let closed = region.revoke(&answer.revoked);
        tracing::info!(closed, "queue pairs of revoked credentials torn down");
    }
    if let Some(ownership) = &answer.ownership {
        if let Err(error) = region.apply_ownership(ownership) {
            note_error(format!("applying who owns which runs: {error}"));
        }
    }
}

fn note_error(error: String) {
    tracing::warn!(%error, "pool membership");
}
