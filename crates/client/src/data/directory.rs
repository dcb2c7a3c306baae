//! Where pool nodes are: `(storage, node_id)` → the live incarnation's endpoint and range,
//! as the server lists them (`POST /kvcm/v1/poolNodes`, with the client's API key), cached
//! and refreshed when a URI names a node or incarnation the cache does not have, or when
//! the node's ticket (servers with `kvcm.auth.meta = required`) is half its life old.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kvcm::pool::ticket::{Ticket, TICKET_TTL};
use kvcm::pool::{NodesAnswer, NodesRequest, NODES_ROUTE};
use kvcm::tls_client::TlsClient;

/// Deadline of one directory request.
const DEADLINE: Duration = Duration::from_secs(2);

/// A live pool node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodePlace {
    /// Its queue-pair listener.
    pub endpoint: SocketAddr,
    /// Its live incarnation.
    pub range_id: u64,
    /// The ticket its hello must carry, when the server gave one.
    pub ticket: Option<Ticket>,
    /// When the server listed it.
    listed: Instant,
}

impl NodePlace {
    /// Whether the entry may still be used: the incarnation asked, and a ticket (if any)
    /// with at least half its life left.
    fn fresh_for(&self, range_id: u64) -> bool {
        self.range_id == range_id
            && (self.ticket.is_none() || self.listed.elapsed() < TICKET_TTL / 2)
    }
}

/// The cached directory.
#[derive(Debug, Default)]
pub(crate) struct Directory {
    servers: Vec<SocketAddr>,
    tls: Option<TlsClient>,
    api_key: Option<String>,
    /// The instance the tickets are asked for.
    instance_id: String,
    nodes: HashMap<(String, String), NodePlace>,
}

impl Directory {
    /// A directory asking these meta HTTP servers (in order; over `tls` and with `api_key`
    /// when given) for the tickets of instance `instance_id`.
    pub(crate) fn new(
        servers: Vec<SocketAddr>,
        (tls, api_key): (Option<TlsClient>, Option<String>),
        instance_id: String,
    ) -> Self {
        Directory {
            servers,
            tls,
            api_key,
            instance_id,
            nodes: HashMap::new(),
        }
    }

    /// The live incarnation of `node_id` in pool `storage` when it is `range_id`; refreshes
    /// the pool's entries once when the cache has another. `Err` says why not.
    pub(crate) fn place(
        &mut self,
        storage: &str,
        node_id: &str,
        range_id: u64,
    ) -> Result<NodePlace, String> {
        let key = (storage.to_string(), node_id.to_string());
        if let Some(place) = self.nodes.get(&key).filter(|p| p.fresh_for(range_id)) {
            return Ok(place.clone());
        }
        self.refresh(storage)?;
        match self.nodes.get(&key) {
            Some(place) if place.range_id == range_id => Ok(place.clone()),
            Some(_) => Err(format!("pool node {node_id} is on another incarnation now")),
            None => Err(format!("pool node {node_id} of {storage} is not live")),
        }
    }

    /// Replaces the entries of `storage` by the server's list of its live nodes.
    fn refresh(&mut self, storage: &str) -> Result<(), String> {
        let request = NodesRequest {
            storage: storage.to_string(),
            instance_id: Some(self.instance_id.clone()),
        };
        let mut last = String::from("no server");
        for server in &self.servers {
            match kvcm::http_json::post_json_with::<NodesAnswer>(
                *server,
                NODES_ROUTE,
                &request,
                DEADLINE,
                self.api_key.as_deref(),
                self.tls.as_ref(),
            ) {
                Ok(answer) => {
                    self.nodes.retain(|(s, _), _| s != storage);
                    for node in answer.nodes.into_iter().filter(|n| n.live) {
                        let Ok(endpoint) = node.endpoint.parse() else {
                            continue;
                        };
                        let place = NodePlace {
                            endpoint,
                            range_id: node.range_id,
                            ticket: node.ticket.as_deref().and_then(kvcm_manager::hex::decode),
                            listed: Instant::now(),
                        };
                        self.nodes
                            .insert((storage.to_string(), node.node_id), place);
                    }
                    return Ok(());
                }
                Err(error) => last = format!("pool directory at {server}: {error}"),
            }
        }
        Err(last)
    }
}
