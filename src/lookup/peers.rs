//! The queue-pair listener: a client opens a TCP connection, names the wire it speaks
//! (`b"KVQP"` + one wire-index byte), and both sides exchange queue-pair endpoints
//! ([`kvcm_transport::exchange_endpoints`]). The server's queue pair then answers the
//! client's one-sided READs (its soft NIC serves them) and its write-path messages (the
//! polling-thread core owns it from then on).
//!
//! Each connection is set up on a thread of its own with a 2-second deadline, at most
//! [`MAX_HANDSHAKES`] at once (more are closed at once), so silent clients neither delay
//! others nor pile up.

use std::io::Read;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use kvcm_transport::{exchange_endpoints, QueuePair};

use super::core::CoreHandle;
use super::LookupError;

/// First bytes of a connection request.
pub const HELLO: &[u8; 4] = b"KVQP";
/// How long a connecting client may take.
const DEADLINE: Duration = Duration::from_secs(2);
/// Most connections being set up at once.
const MAX_HANDSHAKES: usize = 64;

/// Binds on `bind` (port chosen by the OS) and accepts on a thread of its own; returns
/// the listener's address.
pub(super) fn listen(bind: IpAddr, core: CoreHandle) -> Result<SocketAddr, LookupError> {
    let listener = TcpListener::bind((bind, 0)).map_err(LookupError::Listener)?;
    let addr = listener.local_addr().map_err(LookupError::Listener)?;
    let accept = move |stream| {
        if let Err(error) = connect(stream, &core) {
            tracing::debug!(%error, "lookup queue pair refused");
        }
    };
    crate::handshakes::serve(listener, "kvcm-lookup-qp", MAX_HANDSHAKES, accept)
        .map_err(LookupError::Listener)?;
    Ok(addr)
}

/// Reads the hello, creates a queue pair on the named wire, connects it and hands it to
/// the core.
fn connect(mut stream: TcpStream, core: &CoreHandle) -> Result<(), LookupError> {
    let io = LookupError::Listener;
    stream.set_read_timeout(Some(DEADLINE)).map_err(io)?;
    stream.set_write_timeout(Some(DEADLINE)).map_err(io)?;
    let _ = stream.set_nodelay(true);
    let mut hello = [0u8; 5];
    stream.read_exact(&mut hello).map_err(io)?;
    if &hello[..4] != HELLO {
        return Err(LookupError::Refused("not a lookup hello".into()));
    }
    let wire = usize::from(hello[4]);
    let qp = core.create_qp(wire)?;
    let remote = exchange_endpoints(&mut stream, &qp.endpoint())?;
    qp.connect(&remote)?;
    core.adopt(wire, qp)
}
