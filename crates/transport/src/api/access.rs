//! Access rights of a memory registration, as verbs defines them.

use std::ops::BitOr;

/// A set of access rights granted by a memory registration.
///
/// Local read is always allowed; everything else must be granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub struct Access(u32);

impl Access {
    /// No rights beyond local read.
    pub const NONE: Access = Access(0);
    /// The local NIC may write (needed for READ destinations and RECV buffers).
    pub const LOCAL_WRITE: Access = Access(1);
    /// Peers may RDMA READ.
    pub const REMOTE_READ: Access = Access(1 << 1);
    /// Peers may RDMA WRITE (requires `LOCAL_WRITE`).
    pub const REMOTE_WRITE: Access = Access(1 << 2);
    /// Peers may run atomics (requires `LOCAL_WRITE`).
    pub const REMOTE_ATOMIC: Access = Access(1 << 3);
    /// Every right.
    pub const ALL: Access = Access(0b1111);

    /// Whether every right in `other` is granted.
    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether any right for peers (remote read, write or atomics) is granted.
    pub fn grants_remote(self) -> bool {
        self.0 & (Access::REMOTE_READ.0 | Access::REMOTE_WRITE.0 | Access::REMOTE_ATOMIC.0) != 0
    }

    /// The raw bits (stable; used on the wire and in shared key tables).
    pub fn bits(self) -> u32 {
        self.0
    }

    /// Rebuilds from raw bits; unknown bits are dropped.
    pub fn from_bits_truncate(bits: u32) -> Access {
        Access(bits & Access::ALL.0)
    }

    /// Checks the verbs rule that remote write and atomics need local write.
    pub fn validate(self) -> crate::Result<()> {
        let needs_local =
            self.contains(Access::REMOTE_WRITE) || self.contains(Access::REMOTE_ATOMIC);
        if needs_local && !self.contains(Access::LOCAL_WRITE) {
            return Err(crate::TransportError::InvalidArgument(
                "remote write / atomic access requires local write",
            ));
        }
        Ok(())
    }
}

impl BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_write_without_local_write_is_refused() {
        assert!(Access::REMOTE_WRITE.validate().is_err());
        assert!((Access::REMOTE_WRITE | Access::LOCAL_WRITE)
            .validate()
            .is_ok());
        assert!(Access::REMOTE_READ.validate().is_ok());
    }

    #[test]
    fn bits_round_trip_and_drop_unknown() {
        assert_eq!(
            Access::from_bits_truncate(Access::ALL.bits() | 0x100),
            Access::ALL
        );
        assert!(Access::ALL.contains(Access::REMOTE_ATOMIC));
        assert!(!Access::REMOTE_READ.contains(Access::LOCAL_WRITE));
    }
}
