//! The queue-pair listener: a client opens a TCP connection, names the wire it speaks
//! (`b"KVQP"` + one wire-index byte), and both sides exchange queue-pair endpoints
//! ([`kvcm_transport::exchange_endpoints`]). The server's queue pair then only answers
//! one-sided READs, which its soft NIC serves; nothing is posted on it.
//!
//! Connections are handled one at a time with a 2-second deadline, so a silent client
//! cannot hold the listener longer than that. Broken queue pairs are dropped at the next
//! connection.

use std::io::Read;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kvcm_transport::soft::{SoftCq, SoftDomain, SoftQp};
use kvcm_transport::{exchange_endpoints, Domain, QpConfig, QpState, QueuePair};

use super::LookupError;

/// First bytes of a connection request.
pub const HELLO: &[u8; 4] = b"KVQP";
/// How long a connecting client may take.
const DEADLINE: Duration = Duration::from_secs(2);

/// A connected client queue pair (kept alive while its peer reads).
struct Peer {
    qp: SoftQp,
    _cq: SoftCq,
}

/// The listener and the connected queue pairs.
pub(super) struct Peers {
    addr: SocketAddr,
    /// Kept so the queue pairs live as long as the service.
    _connected: Arc<Mutex<Vec<Peer>>>,
}

impl Peers {
    /// Binds on `bind` (port chosen by the OS) and accepts on a thread of its own.
    pub(super) fn listen(
        bind: IpAddr,
        domains: Vec<(usize, SoftDomain)>,
    ) -> Result<Peers, LookupError> {
        let listener = TcpListener::bind((bind, 0)).map_err(LookupError::Listener)?;
        let addr = listener.local_addr().map_err(LookupError::Listener)?;
        let connected: Arc<Mutex<Vec<Peer>>> = Arc::default();
        let list = connected.clone();
        std::thread::Builder::new()
            .name("kvcm-lookup-qp".into())
            .spawn(move || {
                for stream in listener.incoming().flatten() {
                    match connect(stream, &domains) {
                        Ok(peer) => {
                            let mut peers = list.lock().unwrap_or_else(PoisonError::into_inner);
                            peers.retain(|p| p.qp.state() != QpState::Error);
                            peers.push(peer);
                        }
                        Err(error) => tracing::debug!(%error, "lookup queue pair refused"),
                    }
                }
            })
            .map_err(LookupError::Listener)?;
        Ok(Peers {
            addr,
            _connected: connected,
        })
    }

    /// The listener's address.
    pub(super) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Reads the hello, creates a queue pair on the named wire and connects it.
fn connect(mut stream: TcpStream, domains: &[(usize, SoftDomain)]) -> Result<Peer, LookupError> {
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
    let (_, domain) = domains
        .iter()
        .find(|(index, _)| *index == wire)
        .ok_or_else(|| LookupError::Refused(format!("unknown wire {wire}")))?;
    let cq = domain.create_cq()?;
    let qp = domain.create_qp(&cq, &cq, QpConfig::default())?;
    let remote = exchange_endpoints(&mut stream, &qp.endpoint())?;
    qp.connect(&remote)?;
    Ok(Peer { qp, _cq: cq })
}
