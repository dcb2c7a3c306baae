//! The server's side of leader election: opens the configured lock, puts the node's
//! elector on it before any listener serves, and publishes the bound endpoint once the
//! listeners are up (the lock record carries it; GetClusterInfo and GetManagerClusterInfo
//! return it as the leader's endpoint).

use std::collections::BTreeMap;
use std::net::SocketAddr;

use kvcm_manager::leader::{Election, LockUri, NodeEndpoint};
use kvcm_manager::Manager;

use super::ServerError;
use crate::config::ServerConfig;

/// The node id: `kvcm.leader_elector.node_id`, else `<host>:<admin_http_port>_<16 random>`
/// with the advertised host (the reference's `local_ip_placeholder` when none is set).
pub fn node_id(config: &ServerConfig) -> String {
    if !config.node_id.is_empty() {
        return config.node_id.clone();
    }
    let host = if config.advertised_host.is_empty() {
        "local_ip_placeholder"
    } else {
        &config.advertised_host
    };
    let suffix = kvcm_manager::random_id(16);
    format!("{host}:{}_{suffix}", config.admin_http_port)
}

/// Moves the manager's elector onto the configured lock and campaigns once; the node
/// leads at once when the lock is free (always with the default `memory://`).
pub fn join(config: &ServerConfig, manager: &Manager) -> Result<(), ServerError> {
    let (key, uri) = config.lock_uri();
    let lock = LockUri::parse(uri)
        .and_then(|uri| uri.open())
        .map_err(|source| ServerError::Election { key, source })?;
    let configured = BTreeMap::new();
    let election = Election {
        lock,
        settings: config.elector_settings(),
        endpoint: endpoint(config, &configured),
    };
    manager.leadership().configure(election);
    Ok(())
}

/// Publishes the endpoint of the bound listeners from the next renewal on.
pub fn publish(config: &ServerConfig, manager: &Manager, bound: &BTreeMap<&str, SocketAddr>) {
    manager.leadership().set_endpoint(endpoint(config, bound));
}

/// This node's endpoint: bound ports where known, configured ones otherwise.
fn endpoint(config: &ServerConfig, bound: &BTreeMap<&str, SocketAddr>) -> NodeEndpoint {
    let port = |name: &str, configured: u16| bound.get(name).map_or(configured, SocketAddr::port);
    let rpc_port = port("grpc", config.rpc_port);
    let admin_rpc_port = if config.admin_rpc_shared() {
        rpc_port
    } else {
        port("admin_grpc", config.admin_rpc_port)
    };
    NodeEndpoint {
        node_id: String::new(),
        host: config.published_host().to_string(),
        rpc_port,
        http_port: port("http", config.http_port),
        admin_rpc_port,
        admin_http_port: port("admin_http", config.admin_http_port),
        custom_info: config.custom_info.clone(),
    }
}
