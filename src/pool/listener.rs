//! The pool node's queue-pair listener: a client opens a TCP connection, sends
//! [`HELLO`] and one wire-index byte — or [`HELLO_TICKET`], the wire byte and a ticket,
//! which the node demands when its server does (`super::ticket`; a hello without a valid
//! ticket is then closed before any endpoint is sent) —, both sides exchange queue-pair
//! endpoints (the client first, [`kvcm_transport::exchange_endpoints`]; the node connects
//! its queue pair before it answers with its own), and the node sends the [`RegionInfo`]
//! of that wire; after a ticket hello, one more byte: 1 when the queue pair reaches only
//! the runs of the instance the ticket names (an isolating node, `super::isolation`; the
//! region's rkey is then 0), 0 otherwise. The rkeys of an instance's runs are asked on a
//! connection of their own: [`RUNS`], the wire byte, a ticket, a count (u32 LE, at most
//! [`MAX_RUN_QUERIES`]) and that many region offsets (u64 LE); the node answers the count
//! and, per offset, the run holding it — offset (u64), length (u64, 0 when no run of the
//! instance holds it) and rkey on that wire (u32). When one of them is in no run of the
//! instance, the node first asks its server for the latest ownership (one heartbeat,
//! waited for at most [`RUNS_WAIT`], by at most
//! [`MAX_BEAT_WAITERS`](super::region::MAX_BEAT_WAITERS) requests at once — others answer
//! what the node knows, so slow heartbeats never hold more handshake threads than that):
//! a run granted a moment ago is known by the answer. From then on the node's NIC (the soft NIC thread, or the RDMA device) serves the
//! client's READs and WRITEs; no node
//! thread runs per transfer. A client that sets [`KEEPS_CONNECTION`] in its wire byte keeps
//! the connection open for its queue pair's life; on verbs its closing then tears the queue
//! pair down (`crate::hangups`: a verbs responder never notices a client that is gone). A
//! client without the bit (an engine of an earlier release) is not watched.
//!
//! Each handshake runs on a thread of its own with a 2-second timeout per read and
//! `crate::handshakes::HANDSHAKE_LIMIT` in all, at most [`MAX_HANDSHAKES`] at once; at most 1024 queue pairs are kept (the oldest
//! broken ones are dropped first, then the oldest).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use kvcm_transport::{read_endpoint, write_endpoint, QpEndpoint, QueuePair};

use super::isolation::RunKey;
use super::region::PoolRegion;
use super::ticket::{Admit, TICKET_LEN};
use super::PoolError;
use crate::handshakes::Handshake;
use crate::hangups::HangupWatcher;
use crate::lookup::WIRE_VERBS;

/// First bytes of a connection request without a ticket.
pub const HELLO: &[u8; 4] = b"KVPL";
/// First bytes of a connection request with a ticket (`super::ticket`) after the wire byte.
/// (`KVP2`, the tickets of earlier releases without an instance, is refused.)
pub const HELLO_TICKET: &[u8; 4] = b"KVP3";
/// First bytes of a request for the rkeys of an instance's runs.
pub const RUNS: &[u8; 4] = b"KVPR";
/// Most offsets one runs request asks about.
pub const MAX_RUN_QUERIES: usize = 4096;
/// Bytes of one run in a runs answer.
pub const RUN_ENTRY: usize = 20;
/// How long a runs request waits for the node to learn newer ownership.
const RUNS_WAIT: Duration = Duration::from_secs(1);
/// Bit of the wire byte: the client keeps this connection open while it uses its queue
/// pair (the engine sets it on verbs), so its closing means the client is gone.
pub const KEEPS_CONNECTION: u8 = 0x80;
/// How long a connecting client may take.
const DEADLINE: Duration = Duration::from_secs(2);
/// Most connections being set up at once.
const MAX_HANDSHAKES: usize = 64;

/// Where a client reads and writes the region on its wire, and which incarnation it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionInfo {
    /// Address of byte 0 of the region on this wire.
    pub addr: u64,
    /// Bytes of the region.
    pub len: u64,
    /// The rkey on this wire.
    pub rkey: u32,
    /// The node's incarnation (URIs with another `range_id` are not on this region).
    pub range_id: u64,
}

impl RegionInfo {
    /// Bytes on the wire.
    pub const SIZE: usize = 28;

    /// Little-endian: addr, len, rkey, range_id.
    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut out = [0u8; Self::SIZE];
        out[0..8].copy_from_slice(&self.addr.to_le_bytes());
        out[8..16].copy_from_slice(&self.len.to_le_bytes());
        out[16..20].copy_from_slice(&self.rkey.to_le_bytes());
        out[20..28].copy_from_slice(&self.range_id.to_le_bytes());
        out
    }

    /// The inverse of [`RegionInfo::encode`].
    pub fn decode(bytes: &[u8; Self::SIZE]) -> RegionInfo {
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or([0; 8]));
        RegionInfo {
            addr: u64_at(0),
            len: u64_at(8),
            rkey: u32::from_le_bytes(bytes[16..20].try_into().unwrap_or([0; 4])),
            range_id: u64_at(20),
        }
    }
}

/// Binds `listen` and accepts on a thread of its own; returns the bound address.
pub fn listen(listen: SocketAddr, region: Arc<PoolRegion>) -> Result<SocketAddr, PoolError> {
    let listener = TcpListener::bind(listen).map_err(PoolError::Listener)?;
    let addr = listener.local_addr().map_err(PoolError::Listener)?;
    let hangups = watch_hangups(&region).map_err(PoolError::Listener)?;
    let accept = move |stream, handshake| {
        if let Err(error) = connect(stream, handshake, &region, &hangups) {
            tracing::debug!(%error, "pool queue pair refused");
        }
    };
    crate::handshakes::serve(listener, "kvcm-pool-qp", MAX_HANDSHAKES, accept)
        .map_err(PoolError::Listener)?;
    Ok(addr)
}

/// The watcher that tears a verbs queue pair of `region` down when its client hangs up
/// (`crate::hangups`).
fn watch_hangups(region: &Arc<PoolRegion>) -> std::io::Result<HangupWatcher<u64>> {
    let (kept, held) = (Arc::clone(region), Arc::clone(region));
    let live = move |id: &u64| held.holds(*id);
    let hung_up = move |id: &u64| {
        tracing::info!(peer = id, "pool queue pair torn down: its client hung up");
        kept.drop_peer(*id);
    };
    HangupWatcher::start("kvcm-pool-hangup", live, hung_up)
}

/// Reads the hello, connects a queue pair on the named wire, sends the region's info; on
/// verbs, when the client keeps the connection, it is then watched for the queue pair's
/// life.
fn connect(
    mut stream: TcpStream,
    mut handshake: Handshake,
    region: &PoolRegion,
    hangups: &HangupWatcher<u64>,
) -> Result<(), PoolError> {
    let io = PoolError::Listener;
    stream.set_read_timeout(Some(DEADLINE)).map_err(io)?;
    stream.set_write_timeout(Some(DEADLINE)).map_err(io)?;
    let _ = stream.set_nodelay(true);
    let mut hello = [0u8; 5];
    stream.read_exact(&mut hello).map_err(io)?;
    let wire = usize::from(hello[4] & !KEEPS_CONNECTION);
    let read_ticket = |stream: &mut TcpStream| {
        let mut ticket = [0u8; TICKET_LEN];
        stream.read_exact(&mut ticket).map(|()| ticket).map_err(io)
    };
    let ticket = match &hello[..4] {
        magic if magic == HELLO => None,
        magic if magic == HELLO_TICKET => Some(read_ticket(&mut stream)?),
        magic if magic == RUNS => {
            let admit = region.admit(Some(&read_ticket(&mut stream)?))?;
            return answer_runs(stream, region, wire, admit);
        }
        _ => return Err(PoolError::Refused("not a pool hello".into())),
    };
    let epoch = region.epoch();
    let admit = region.admit(ticket.as_ref())?;
    let keeps_connection = hello[4] & KEEPS_CONNECTION != 0;
    let opened = region.create_qp(wire, admit)?;
    let remote = read_endpoint(&mut stream)?;
    opened.qp.connect(&remote)?;
    let endpoint = opened.qp.endpoint();
    let info = RegionInfo {
        addr: opened.addr,
        len: region.len(),
        rkey: opened.rkey,
        range_id: region.range_id(),
    };
    let isolated = ticket.is_some().then_some(opened.isolated);
    // Kept (or refused) before the client learns the queue pair's endpoint: from then on
    // a join that changes the policy finds it among the peers.
    let id = region.keep(opened.qp, admit, epoch)?;
    let answered = answer_hello(&mut stream, &endpoint, &info, isolated);
    if let Err(error) = answered {
        region.drop_peer(id);
        return Err(error);
    }
    // A verbs queue pair never notices a client that is gone: a client that keeps this
    // connection for its life says so, and its closing tears the queue pair down.
    if wire == WIRE_VERBS && keeps_connection {
        if !handshake.keep() {
            region.drop_peer(id);
            return Err(PoolError::Refused("the handshake ran out of time".into()));
        }
        if let Err(error) = hangups.watch(id, stream) {
            region.drop_peer(id);
            return Err(PoolError::Listener(error));
        }
    }
    Ok(())
}

/// Sends a hello's answer: the queue pair's endpoint, where the region lies, and (to a
/// hello with a ticket) whether the queue pair reaches only its instance's runs.
fn answer_hello(
    stream: &mut TcpStream,
    endpoint: &QpEndpoint,
    info: &RegionInfo,
    isolated: Option<bool>,
) -> Result<(), PoolError> {
    write_endpoint(stream, endpoint)?;
    let mut answer = info.encode().to_vec();
    answer.extend(isolated.map(u8::from));
    stream.write_all(&answer).map_err(PoolError::Listener)
}

/// Answers a runs request (after its ticket): the run of the ticket's instance holding each
/// offset asked, after one heartbeat when one of them is in none.
fn answer_runs(
    mut stream: TcpStream,
    region: &PoolRegion,
    wire: usize,
    admit: Option<Admit>,
) -> Result<(), PoolError> {
    let io = PoolError::Listener;
    let tenant = admit
        .and_then(|a| a.tenant)
        .filter(|_| region.isolates_on(wire));
    let tenant = tenant.ok_or_else(|| {
        PoolError::Refused(
            "runs are asked of an isolating node, with a ticket naming an instance".into(),
        )
    })?;
    let mut count = [0u8; 4];
    stream.read_exact(&mut count).map_err(io)?;
    let count = u32::from_le_bytes(count) as usize;
    if count > MAX_RUN_QUERIES {
        return Err(PoolError::Refused(format!(
            "{count} offsets asked at once (at most {MAX_RUN_QUERIES})"
        )));
    }
    let mut raw = vec![0u8; count * 8];
    stream.read_exact(&mut raw).map_err(io)?;
    let offsets: Vec<u64> = raw
        .chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
        .collect();
    let mut runs = region.runs(tenant, wire, &offsets);
    if runs.iter().any(Option::is_none) && region.beat_now(RUNS_WAIT) {
        runs = region.runs(tenant, wire, &offsets);
    }
    let mut answer = Vec::with_capacity(4 + count * RUN_ENTRY);
    answer.extend_from_slice(&(count as u32).to_le_bytes());
    for run in runs {
        let none = RunKey {
            offset: 0,
            len: 0,
            rkey: 0,
        };
        answer.extend_from_slice(&run.unwrap_or(none).encode());
    }
    stream.write_all(&answer).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_info_round_trips() {
        let info = RegionInfo {
            addr: 0x7f00_0000_1000,
            len: 1 << 30,
            rkey: 0xdead_beef,
            range_id: u64::MAX - 3,
        };
        assert_eq!(RegionInfo::decode(&info.encode()), info);
    }
}
