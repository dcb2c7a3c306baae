//! Provider selection by name (for configuration files and command lines).
//!
//! The API is generic over [`crate::Domain`], so a program picks a provider once at
//! start-up and instantiates its transport code for that provider's domain type.

use crate::{Result, TransportError};
use std::fmt;
use std::str::FromStr;

/// A transport provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProviderKind {
    /// The soft provider over TCP (`soft-tcp`).
    SoftTcp,
    /// The soft provider over same-host shared memory (`soft-shm`).
    SoftShm,
    /// libibverbs (`verbs`), built with feature `rdma`.
    Verbs,
}

impl ProviderKind {
    /// Every provider, in preference order for a host with RDMA hardware.
    pub const ALL: [ProviderKind; 3] = [
        ProviderKind::Verbs,
        ProviderKind::SoftShm,
        ProviderKind::SoftTcp,
    ];

    /// The provider's name as parsed and printed.
    pub fn name(self) -> &'static str {
        match self {
            ProviderKind::SoftTcp => "soft-tcp",
            ProviderKind::SoftShm => "soft-shm",
            ProviderKind::Verbs => "verbs",
        }
    }

    /// Whether this build contains the provider.
    pub fn is_built(self) -> bool {
        self != ProviderKind::Verbs || cfg!(feature = "rdma")
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ProviderKind {
    type Err = TransportError;

    fn from_str(name: &str) -> Result<Self> {
        ProviderKind::ALL
            .into_iter()
            .find(|kind| kind.name() == name)
            .ok_or(TransportError::InvalidArgument(
                "unknown provider (soft-tcp, soft-shm, verbs)",
            ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for kind in ProviderKind::ALL {
            assert_eq!(kind.name().parse::<ProviderKind>().unwrap(), kind);
            assert_eq!(kind.to_string(), kind.name());
        }
        assert!("rdma".parse::<ProviderKind>().is_err());
        assert!(ProviderKind::SoftTcp.is_built());
        assert_eq!(ProviderKind::Verbs.is_built(), cfg!(feature = "rdma"));
    }
}
