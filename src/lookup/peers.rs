//! The queue-pair listener: a client opens a TCP connection and sends the hello —
//! [`HELLO`], one wire-index byte and the 16-byte token its bootstrap was answered
//! (`grants`) — and both sides exchange queue-pair endpoints: the client sends its endpoint
//! first ([`kvcm_transport::exchange_endpoints`]); the server connects its queue pair and
//! posts its receive buffers before it answers with its own, so that the client's first
//! message never reaches a queue pair that cannot receive it yet (on verbs such a message
//! is dropped and retried for only ~0.5 s). The server's queue pair is created in the
//! protection domain of the token's instance, so it serves READs of that instance's table
//! only (its NIC — the soft NIC thread, or the RDMA device — answers them) and carries write-path messages of that instance only
//! (the polling-thread core owns it from then on). A hello without a valid, unused,
//! unexpired token is refused: the connection is closed before any endpoint is sent.
//!
//! On verbs the connection then stays open for the queue pair's life: the client keeps it,
//! and its closing tears the queue pair down (`crate::hangups`); on the soft wires it is closed.
//!
//! Each connection is set up on a thread of its own with a 2-second timeout per read and
//! `crate::handshakes::HANDSHAKE_LIMIT` in all, at most [`MAX_HANDSHAKES`] at once (more
//! are closed at once), so silent or trickling clients neither delay others nor pile up.

use std::io::Read;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Weak};
use std::time::Duration;

use kvcm_transport::{read_endpoint, write_endpoint, QueuePair};

use super::grants::{Token, TOKEN_LEN};
use super::{LookupError, LookupService, WIRE_VERBS};
use crate::handshakes::Handshake;

/// First bytes of a connection request (version 2: with a token).
pub const HELLO: &[u8; 4] = b"KVQ2";
/// Bytes of the whole hello.
pub const HELLO_LEN: usize = HELLO.len() + 1 + TOKEN_LEN;
/// How long a connecting client may take.
const DEADLINE: Duration = Duration::from_secs(2);
/// Most connections being set up at once.
const MAX_HANDSHAKES: usize = 64;

/// The hello a client sends for `wire` with `token`.
pub fn hello(wire: u8, token: &Token) -> [u8; HELLO_LEN] {
    let mut bytes = [0u8; HELLO_LEN];
    bytes[..4].copy_from_slice(HELLO);
    bytes[4] = wire;
    bytes[5..].copy_from_slice(token);
    bytes
}

/// Binds on `bind` (port chosen by the OS).
pub(super) fn bind(bind: IpAddr) -> Result<TcpListener, LookupError> {
    TcpListener::bind((bind, 0)).map_err(LookupError::Listener)
}

/// Accepts on a thread of its own, connecting queue pairs for `service` while it lives.
pub(super) fn serve(
    listener: TcpListener,
    service: Weak<LookupService>,
) -> Result<(), LookupError> {
    let accept = move |stream, handshake| {
        let Some(service) = service.upgrade() else {
            return;
        };
        if let Err(error) = connect(stream, handshake, &service) {
            tracing::debug!(%error, "lookup queue pair refused");
        }
    };
    crate::handshakes::serve(listener, "kvcm-lookup-qp", MAX_HANDSHAKES, accept)
        .map_err(LookupError::Listener)
}

/// Reads the hello, redeems its token, creates a queue pair on the named wire in the
/// instance's protection domain, connects it and hands it to the core.
fn connect(
    mut stream: TcpStream,
    mut handshake: Handshake,
    service: &LookupService,
) -> Result<(), LookupError> {
    let io = LookupError::Listener;
    stream.set_read_timeout(Some(DEADLINE)).map_err(io)?;
    stream.set_write_timeout(Some(DEADLINE)).map_err(io)?;
    let _ = stream.set_nodelay(true);
    // Magic and wire first, so that a stranger or an old client is refused at once.
    let mut head = [0u8; 5];
    stream.read_exact(&mut head).map_err(io)?;
    if &head[..4] != HELLO {
        return Err(LookupError::Refused(
            "not a lookup hello (version 2, with a bootstrap token)".into(),
        ));
    }
    let wire = usize::from(head[4]);
    if !service.serves_wire(wire) {
        return Err(LookupError::Refused(format!("unknown wire {wire}")));
    }
    let mut token = [0u8; TOKEN_LEN];
    stream.read_exact(&mut token).map_err(io)?;
    let grant = service
        .grants
        .redeem(&token)
        .ok_or_else(|| LookupError::Refused("unknown, used or expired queue-pair token".into()))?;
    (service.access)(&grant.check()).map_err(LookupError::Refused)?;
    service.core.has_room(&grant.instance_id)?;
    let (table, _) = service.table_for(&grant.instance_id)?;
    let pd = table.domain(wire).ok_or(LookupError::NoWire)?;
    let qp = service.core.create_qp(wire, pd)?;
    let remote = read_endpoint(&mut stream)?;
    qp.connect(&remote)?;
    let local = qp.endpoint();
    let (key, grant) = service.core.adopt(wire, pd, qp, grant)?;
    let answered = write_endpoint(&mut stream, &local).map_err(LookupError::from);
    // A verbs queue pair never notices a client that is gone: the connection stays open
    // for its life, and its closing tears it down (`crate::hangups`).
    let watched = answered.and_then(|()| match wire {
        WIRE_VERBS if !handshake.keep() => {
            Err(LookupError::Refused("the handshake ran out of time".into()))
        }
        WIRE_VERBS => service
            .hangups
            .watch((key, Arc::clone(&grant)), stream)
            .map_err(LookupError::Listener),
        _ => Ok(()),
    });
    if watched.is_err() {
        // The queue pair is adopted already: a client that hung up meanwhile must not
        // leave it (and its receive buffers) behind.
        service.core.close(key, grant);
    }
    watched
}

/// The address a bound listener accepts on.
pub(super) fn local_addr(listener: &TcpListener) -> Result<SocketAddr, LookupError> {
    listener.local_addr().map_err(LookupError::Listener)
}
