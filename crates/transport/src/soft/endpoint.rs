//! Text encoding of soft queue-pair endpoints, e.g.
//! `soft-tcp qpn=3 addr=10.0.0.1:40123 token=9f3c… lists=1` (the token, random per queue
//! pair, must be in the hello that binds a connection to it; `lists=1`: its NIC answers
//! READ lists, see `frame` — absent in endpoints of earlier releases, whose peers then get
//! one frame per READ; unknown fields are ignored) or
//! `soft-shm qpn=3 host=<boot id> pid=77 pd=2 ring_cap=4194304 bell=kvcm-nic-77-0
//! broker=kvcm-shm-77-5be1… token=9f3c…` (the broker hands the queue pair's descriptors
//! only to requests that carry the token: see `shm::broker`).

use super::shm::ShmAddress;
use crate::{QpEndpoint, Result, TransportError};
use std::collections::HashMap;
use std::net::SocketAddr;

/// Where a soft queue pair can be reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SoftEndpoint {
    /// Over TCP: the peer NIC's listening address, the queue pair's hello token, and
    /// whether the NIC answers READ lists.
    Tcp {
        qpn: u32,
        addr: SocketAddr,
        token: u64,
        lists: bool,
    },
    /// Over shared memory on host `host` (a boot id).
    Shm {
        qpn: u32,
        host: String,
        address: ShmAddress,
    },
}

impl SoftEndpoint {
    pub(crate) fn encode(&self) -> QpEndpoint {
        let text = match self {
            SoftEndpoint::Tcp {
                qpn,
                addr,
                token,
                lists,
            } => {
                let lists = if *lists { " lists=1" } else { "" };
                format!("soft-tcp qpn={qpn} addr={addr} token={token:016x}{lists}")
            }
            SoftEndpoint::Shm {
                qpn,
                host,
                address: a,
            } => format!(
                "soft-shm qpn={qpn} host={host} pid={} pd={} ring_cap={} bell={} broker={} token={:016x}",
                a.pid, a.pd, a.ring_capacity, a.doorbell, a.broker, a.token
            ),
        };
        QpEndpoint(text.into_bytes())
    }

    pub(crate) fn decode(endpoint: &QpEndpoint) -> Result<Self> {
        let bad = |what: &str| TransportError::BadEndpoint(what.to_string());
        let text = std::str::from_utf8(&endpoint.0).map_err(|_| bad("not UTF-8"))?;
        let mut words = text.split_whitespace();
        let kind = words.next().ok_or_else(|| bad("empty"))?;
        let fields: HashMap<&str, &str> = words.filter_map(|word| word.split_once('=')).collect();
        let field = |name: &str| {
            fields
                .get(name)
                .copied()
                .ok_or_else(|| bad(&format!("missing {name}")))
        };
        let hex = |name: &str| {
            u64::from_str_radix(field(name)?, 16).map_err(|_| bad(&format!("bad {name}")))
        };
        let number = |name: &str| {
            field(name)?
                .parse::<u64>()
                .map_err(|_| bad(&format!("bad {name}")))
        };
        let qpn = u32::try_from(number("qpn")?).map_err(|_| bad("qpn"))?;
        match kind {
            "soft-tcp" => {
                let addr = field("addr")?.parse().map_err(|_| bad("bad addr"))?;
                let token = hex("token")?;
                let lists = fields.get("lists") == Some(&"1");
                Ok(SoftEndpoint::Tcp {
                    qpn,
                    addr,
                    token,
                    lists,
                })
            }
            "soft-shm" => {
                let address = ShmAddress {
                    pid: u32::try_from(number("pid")?).map_err(|_| bad("pid"))?,
                    pd: u32::try_from(number("pd")?).map_err(|_| bad("pd"))?,
                    ring_capacity: usize::try_from(number("ring_cap")?)
                        .map_err(|_| bad("ring_cap"))?,
                    doorbell: field("bell")?.to_string(),
                    broker: field("broker")?.to_string(),
                    token: hex("token")?,
                };
                Ok(SoftEndpoint::Shm {
                    qpn,
                    host: field("host")?.to_string(),
                    address,
                })
            }
            other => Err(bad(&format!("unknown provider {other:?}"))),
        }
    }
}

/// This host's boot id: two processes share memory only if theirs match.
pub(crate) fn host_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|id| id.trim().to_string())
        .unwrap_or_else(|_| "unknown".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_kinds_round_trip() {
        for lists in [false, true] {
            let tcp = SoftEndpoint::Tcp {
                qpn: 3,
                addr: "10.0.0.1:4000".parse().unwrap(),
                token: u64::MAX - 5,
                lists,
            };
            assert_eq!(SoftEndpoint::decode(&tcp.encode()).unwrap(), tcp);
        }
        // An endpoint of an earlier release, and one with a field this release does not know.
        for (text, lists) in [("", false), (" lists=1 zstd=1", true), (" lists=2", false)] {
            let text = format!("soft-tcp qpn=3 addr=10.0.0.1:4000 token=05{text}");
            let decoded = SoftEndpoint::decode(&QpEndpoint(text.into_bytes())).unwrap();
            assert!(
                matches!(decoded, SoftEndpoint::Tcp { token: 5, lists: l, .. } if l == lists),
                "{decoded:?}"
            );
        }
        let address = ShmAddress {
            pid: 7,
            pd: 2,
            ring_capacity: 1 << 22,
            doorbell: "kvcm-nic-7-0".into(),
            broker: "kvcm-shm-7-00000000deadbeef".into(),
            token: u64::MAX - 9,
        };
        let shm = SoftEndpoint::Shm {
            qpn: 4,
            host: host_id(),
            address,
        };
        assert_eq!(SoftEndpoint::decode(&shm.encode()).unwrap(), shm);
    }

    #[test]
    fn garbage_is_refused() {
        for text in [
            "",
            "soft-tcp qpn=1",
            "soft-tcp qpn=1 addr=1.2.3.4:5",
            "soft-tcp qpn=1 addr=1.2.3.4:5 token=xyz",
            "soft-tcp qpn=x addr=1.2.3.4:5",
            "rdma qpn=1",
            "soft-shm qpn=1 pid=2",
            "soft-shm qpn=1 pid=2 pd=0 ring_cap=4096 bell=b broker=k",
            "soft-shm qpn=1 pid=2 pd=0 ring_cap=4096 bell=b broker=k token=zz",
        ] {
            let err = SoftEndpoint::decode(&QpEndpoint(text.as_bytes().to_vec())).unwrap_err();
            assert!(
                matches!(err, TransportError::BadEndpoint(_)),
                "{text}: {err}"
            );
        }
        assert!(SoftEndpoint::decode(&QpEndpoint(vec![0xff, 0xfe])).is_err());
    }
}
