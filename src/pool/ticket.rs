//! Pool tickets: the server's permission to open a queue pair on a pool node, checked by
//! the node without asking the server.
//!
//! When `kvcm.auth.meta = required`, the server answers a node's join with a node key
//! (HMAC-SHA256 of a per-process server secret over the pool, the node id and the
//! incarnation), and answers an authenticated `poolNodes` directory request with a ticket
//! per live node: the ticket's expiry (ms since the Unix epoch), its grant (which credential
//! it was issued to, see `grants`), the instance it was issued for (its tenant number in the
//! pool, when the request named one the credential may use) and the HMAC-SHA256, under that
//! node's key, of the expiry, the node's incarnation, the grant and the tenant. The node
//! refuses a hello without a ticket,
//! with an expired one, or with one made for another incarnation or by another key (and an
//! isolating node one that names no instance: its queue pairs reach one instance's runs); it
//! remembers each queue pair's grant and tears the queue pair down when its heartbeat learns
//! that the grant was revoked. A ticket lives [`TICKET_TTL`]; it may be used more than once
//! within it (the directory is cached by clients, and a ticket travels like a bearer token:
//! keep the meta HTTP port on TLS when the network is not trusted).
//!
//! Invariants: keys and tickets are compared in constant time (`ring::hmac::verify`); a
//! node key is never derived for one incarnation and accepted for another.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ring::hmac;

/// How long a ticket opens queue pairs.
pub const TICKET_TTL: Duration = Duration::from_secs(60);
/// Bytes of a node key.
pub const KEY_LEN: usize = 32;
/// Bytes of a ticket: expiry (u64 LE), grant (u64 LE), tenant (u64 LE, [`NO_TENANT`] when
/// it names no instance) and the tag.
pub const TICKET_LEN: usize = 8 + 8 + 8 + 32;
/// The tenant field of a ticket that names no instance.
const NO_TENANT: u64 = u64::MAX;

/// A node key.
pub type NodeKey = [u8; KEY_LEN];
/// A ticket.
pub type Ticket = [u8; TICKET_LEN];

/// The server's secret, random per process (a restarted server's nodes join again, as new
/// incarnations, and get new keys).
#[derive(Clone)]
pub struct ServerSecret(hmac::Key);

impl std::fmt::Debug for ServerSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerSecret(..)")
    }
}

impl ServerSecret {
    /// A fresh secret from the kernel's random pool.
    pub fn random() -> Result<ServerSecret, getrandom::Error> {
        let mut bytes = [0u8; KEY_LEN];
        getrandom::fill(&mut bytes)?;
        Ok(ServerSecret(hmac::Key::new(hmac::HMAC_SHA256, &bytes)))
    }

    /// The key of node `node_id` of pool `storage` in incarnation `range_id`.
    pub fn node_key(&self, storage: &str, node_id: &str, range_id: u64) -> NodeKey {
        let mut context = hmac::Context::with_key(&self.0);
        for part in [storage.as_bytes(), b"\0", node_id.as_bytes(), b"\0"] {
            context.update(part);
        }
        context.update(&range_id.to_le_bytes());
        let mut key = [0u8; KEY_LEN];
        key.copy_from_slice(context.sign().as_ref());
        key
    }
}

impl ServerSecret {
    /// The first 8 bytes of the HMAC of `parts` (concatenated; callers separate them), as a
    /// number: stable per server process, unguessable without the secret.
    pub fn digest(&self, parts: &[&[u8]]) -> u64 {
        let mut context = hmac::Context::with_key(&self.0);
        for part in parts {
            context.update(part);
        }
        let mut first = [0u8; 8];
        first.copy_from_slice(&context.sign().as_ref()[..8]);
        u64::from_le_bytes(first)
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What a ticket lets its holder do: the grant it was issued under and the instance (tenant
/// number) it was issued for, when it names one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admit {
    /// The credential's grant (`super::grants`).
    pub grant: u64,
    /// The instance's tenant number in the pool.
    pub tenant: Option<u32>,
}

fn message(expiry_ms: u64, range_id: u64, grant: u64, tenant: u64) -> [u8; 32] {
    let mut bytes = [0u8; 32];
    for (at, field) in [expiry_ms, range_id, grant, tenant].into_iter().enumerate() {
        bytes[at * 8..at * 8 + 8].copy_from_slice(&field.to_le_bytes());
    }
    bytes
}

/// A ticket of `admit` for incarnation `range_id` under `key`, valid until `expiry_ms`.
pub fn issue(key: &NodeKey, range_id: u64, expiry_ms: u64, admit: Admit) -> Ticket {
    let tenant = admit.tenant.map_or(NO_TENANT, u64::from);
    let tag = hmac::sign(
        &hmac::Key::new(hmac::HMAC_SHA256, key),
        &message(expiry_ms, range_id, admit.grant, tenant),
    );
    let mut ticket = [0u8; TICKET_LEN];
    ticket[..8].copy_from_slice(&expiry_ms.to_le_bytes());
    ticket[8..16].copy_from_slice(&admit.grant.to_le_bytes());
    ticket[16..24].copy_from_slice(&tenant.to_le_bytes());
    ticket[24..].copy_from_slice(tag.as_ref());
    ticket
}

/// Checks `ticket` for incarnation `range_id` under `key` at `now_ms`: what it admits, or
/// why not.
pub fn verify(
    key: &NodeKey,
    range_id: u64,
    ticket: &Ticket,
    now_ms: u64,
) -> Result<Admit, &'static str> {
    let u64_at = |at: usize| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&ticket[at..at + 8]);
        u64::from_le_bytes(bytes)
    };
    let (expiry_ms, grant, tenant) = (u64_at(0), u64_at(8), u64_at(16));
    hmac::verify(
        &hmac::Key::new(hmac::HMAC_SHA256, key),
        &message(expiry_ms, range_id, grant, tenant),
        &ticket[24..],
    )
    .map_err(|_| "a ticket of another node, incarnation or server")?;
    if expiry_ms <= now_ms {
        return Err("an expired ticket");
    }
    let tenant = match tenant {
        NO_TENANT => None,
        number => Some(u32::try_from(number).map_err(|_| "a ticket with a bad tenant")?),
    };
    Ok(Admit { grant, tenant })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_opens_its_incarnation_until_it_expires() {
        let secret = ServerSecret::random().unwrap();
        let key = secret.node_key("pool", "n1", 7);
        let admit = Admit {
            grant: 42,
            tenant: Some(3),
        };
        let ticket = issue(&key, 7, 1_000, admit);
        assert_eq!(verify(&key, 7, &ticket, 999), Ok(admit));
        let anyone = issue(
            &key,
            7,
            1_000,
            Admit {
                tenant: None,
                ..admit
            },
        );
        assert_eq!(verify(&key, 7, &anyone, 999).unwrap().tenant, None);
        assert_eq!(verify(&key, 7, &ticket, 1_000), Err("an expired ticket"));
        assert!(verify(&key, 8, &ticket, 0).is_err(), "another incarnation");
        let other = secret.node_key("pool", "n2", 7);
        assert!(verify(&other, 7, &ticket, 0).is_err(), "another node's key");
        let restarted = ServerSecret::random().unwrap().node_key("pool", "n1", 7);
        assert!(verify(&restarted, 7, &ticket, 0).is_err(), "another server");
        let mut stretched = ticket;
        stretched[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(verify(&key, 7, &stretched, 0).is_err(), "a forged expiry");
        let mut flipped = ticket;
        flipped[TICKET_LEN - 1] ^= 1;
        assert!(verify(&key, 7, &flipped, 0).is_err(), "a flipped tag bit");
        let mut regranted = ticket;
        regranted[8..16].copy_from_slice(&43u64.to_le_bytes());
        assert!(verify(&key, 7, &regranted, 0).is_err(), "a forged grant");
        for tenant in [4u64, NO_TENANT] {
            let mut moved = ticket;
            moved[16..24].copy_from_slice(&tenant.to_le_bytes());
            assert!(
                verify(&key, 7, &moved, 0).is_err(),
                "a forged tenant {tenant}"
            );
        }
    }

    #[test]
    fn node_keys_differ_per_field() {
        let secret = ServerSecret::random().unwrap();
        let key = secret.node_key("a", "b", 1);
        assert_ne!(key, secret.node_key("a", "b", 2));
        assert_ne!(key, secret.node_key("ab", "", 1), "fields are separated");
    }
}
