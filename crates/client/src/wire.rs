//! Which wire a client reaches a server's lookup tables and pool nodes over.
//!
//! The soft wires exist in every build; verbs needs feature `rdma` and an RDMA device
//! (`KVCM_VERBS_DEVICE` names it, default the first; `KVCM_VERBS_GID_INDEX` the GID index
//! for RoCE, default 0) on the client, and a server or pool node given one.

use kvcm_transport::any::{AnyDomain, VerbsDevice};
use kvcm_transport::soft::{self, SoftConfig, SoftDomain};
use kvcm_transport::TransportError;
use std::time::Duration;

/// A wire of the fast path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Wire {
    /// The soft provider over TCP: anywhere.
    Tcp,
    /// The soft provider over shared memory: on the server's host.
    Shm,
    /// RDMA verbs (feature `rdma`): a NIC, or kernel soft-RoCE.
    Verbs,
}

impl Wire {
    /// The wire's index in the table header's rkeys (as the server numbers them).
    pub fn index(self) -> usize {
        match self {
            Wire::Tcp => kvcm::lookup::WIRE_SOFT_TCP,
            Wire::Shm => kvcm::lookup::WIRE_SOFT_SHM,
            Wire::Verbs => kvcm::lookup::WIRE_VERBS,
        }
    }

    /// The wire's name in bootstrap answers ("soft-tcp", "soft-shm", "verbs").
    pub fn name(self) -> &'static str {
        kvcm::lookup::wire_name(self.index())
    }

    /// The soft provider's wire, when this is one.
    pub fn soft(self) -> Option<soft::Wire> {
        match self {
            Wire::Tcp => Some(soft::Wire::Tcp),
            Wire::Shm => Some(soft::Wire::Shm),
            Wire::Verbs => None,
        }
    }

    /// Opens a domain of this wire's provider; `response_timeout` bounds how long a soft
    /// peer may take to answer (on verbs the NIC's own retry timers apply).
    pub fn open_domain(self, response_timeout: Duration) -> Result<AnyDomain, TransportError> {
        match self.soft() {
            Some(wire) => {
                let config = SoftConfig::with_wire(wire).with_response_timeout(response_timeout);
                Ok(SoftDomain::open(config)?.into())
            }
            None => AnyDomain::open_verbs(&VerbsDevice::from_env()?),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Client, ClientConfig, ClientError, ServerAddress};

    #[test]
    fn wires_are_numbered_and_named_as_the_server_numbers_them() {
        for (wire, index, name) in [
            (Wire::Tcp, kvcm::lookup::WIRE_SOFT_TCP, "soft-tcp"),
            (Wire::Shm, kvcm::lookup::WIRE_SOFT_SHM, "soft-shm"),
            (Wire::Verbs, kvcm::lookup::WIRE_VERBS, "verbs"),
        ] {
            assert_eq!((wire.index(), wire.name()), (index, name));
            assert_eq!(wire.soft().is_some(), wire != Wire::Verbs);
        }
    }

    #[test]
    fn verbs_is_refused_at_connect_by_a_build_without_the_provider() {
        let config = ClientConfig {
            servers: vec![ServerAddress {
                grpc: "http://127.0.0.1:1".into(),
                http: "127.0.0.1:1".parse().unwrap(),
            }],
            instance_id: "i".into(),
            wire: Some(Wire::Verbs),
            api_key: None,
            tls: None,
        };
        let built = kvcm_transport::ProviderKind::Verbs.is_built();
        match Client::connect(config) {
            Err(ClientError::InvalidArgument(why)) => {
                assert!(!built, "refused although built: {why}");
                assert!(why.contains("rdma"), "{why}");
            }
            Ok(client) => {
                assert!(built, "accepted without the provider");
                assert!(!client.fast_path_up(), "no server, no fast path");
            }
            Err(other) => panic!("{other}"),
        }
    }
}
