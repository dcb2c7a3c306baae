//! The conformance suite on the soft provider, over both wires, plus the peer-process
//! SIGKILL case. The ignored `peer_process_entry` is the far side that the SIGKILL cases
//! start by re-executing this binary.

mod conformance;

use conformance::peer::{self, PeerProcess, PEER_LEN};
use conformance::Side;
use kvcm_transport::soft::{SoftConfig, SoftDomain, Wire};
use kvcm_transport::QpConfig;
use std::net::IpAddr;

fn open(wire: Wire, bind: IpAddr) -> SoftDomain {
    SoftDomain::open(SoftConfig::with_wire(wire).with_bind(bind)).expect("open soft domain")
}

fn localhost() -> IpAddr {
    [127, 0, 0, 1].into()
}

mod tcp {
    use super::*;

    fn open_tcp() -> SoftDomain {
        open(Wire::Tcp, localhost())
    }

    conformance_suite!(SoftDomain, open_tcp);

    #[test]
    fn peer_process_sigkill_fails_in_flight_work() {
        let side = Side::new(open_tcp(), PEER_LEN, QpConfig::default());
        let process = PeerProcess::spawn(&side, "tcp", localhost(), &[]);
        peer::peer_sigkill_fails_in_flight(&side, process);
    }
}

mod shm {
    use super::*;

    fn open_shm() -> SoftDomain {
        open(Wire::Shm, localhost())
    }

    conformance_suite!(SoftDomain, open_shm);

    #[test]
    fn peer_process_sigkill_fails_in_flight_work() {
        let side = Side::new(open_shm(), PEER_LEN, QpConfig::default());
        let process = PeerProcess::spawn(&side, "shm", localhost(), &[]);
        peer::peer_sigkill_fails_in_flight(&side, process);
    }
}

#[test]
#[ignore = "far side of the SIGKILL cases; started by them, not by the harness"]
fn peer_process_entry() {
    peer::serve_if_peer(|role, bind| {
        let wire = if role == "shm" { Wire::Shm } else { Wire::Tcp };
        open(wire, bind)
    });
}
