//! Test support, not part of the API: what a peer process sees of another domain's
//! shared-memory wire, for tests that play a foreign or hostile peer (ask a broker for
//! objects with any queue pair number, token or descriptor; read the key table).

pub use super::shm::broker::{request, Object, Refusal, Reply, DEADLINE, MAX_PENDING};

use super::endpoint::SoftEndpoint;
use super::keytable::KeyTable;
use super::shm::broker;
use crate::{QpEndpoint, Result, TransportError};
use std::os::fd::RawFd;

/// Where a shared-memory endpoint's broker is, and what a request names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerAddress {
    /// The broker's abstract socket name.
    pub name: String,
    /// The queue pair's number.
    pub qpn: u32,
    /// The queue pair's secret.
    pub token: u64,
    /// The owner process.
    pub pid: u32,
}

/// The broker address in a `soft-shm` endpoint.
pub fn broker_of(endpoint: &QpEndpoint) -> Result<BrokerAddress> {
    match SoftEndpoint::decode(endpoint)? {
        SoftEndpoint::Shm { qpn, address, .. } => Ok(BrokerAddress {
            name: address.broker,
            qpn,
            token: address.token,
            pid: address.pid,
        }),
        SoftEndpoint::Tcp { .. } => Err(TransportError::BadEndpoint(
            "not a shared-memory endpoint".into(),
        )),
    }
}

/// The memfd number the owner's key table shows for `rkey` (the table obtained from the
/// broker, as a peer does), or `None` if the key is not live.
pub fn key_memfd(endpoint: &QpEndpoint, rkey: u32) -> Result<Option<RawFd>> {
    let address = broker_of(endpoint)?;
    let table = broker::obtain(&address.name, address.qpn, address.token, Object::KeyTable)?;
    Ok(KeyTable::from_descriptor(table)?
        .lookup(rkey)
        .map(|entry| entry.fd))
}
