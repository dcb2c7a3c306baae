//! Queue-pair grants: the control plane's permission to open a lookup queue pair.
//!
//! A bootstrap that passes the access check is answered a random 128-bit token; the
//! client's queue-pair hello must carry it (`peers`). A token opens one queue pair, of one
//! instance, within [`TOKEN_TTL`]: it is redeemed (removed) by the first hello that shows
//! it, so a replayed or guessed token opens nothing. The queue pair it opens is bound to
//! the instance (its protection domain holds only that instance's table, and its messages
//! may name only that instance) and keeps the bootstrap's credentials, which the service
//! checks again every sweep: a queue pair whose credentials no longer pass (a revoked or
//! expired key, an instance removed) is torn down.
//!
//! Invariants: at most [`MAX_PENDING`] tokens wait at once, holding at most
//! [`MAX_PENDING_BYTES`] of credentials and instance ids (expired ones are dropped first;
//! beyond that a bootstrap is refused, so unredeemed tokens cannot grow memory, however long
//! the headers they keep); a grant keeps the `Authorization` header in its one canonical
//! spelling (`Bearer <token>`, see `canonical_authorization`) or not at all; tokens come
//! from the kernel's random pool and are compared by map lookup of the whole value.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::{AccessCheck, LookupError};
use crate::service::auth::{canonical_authorization, CertIdentity};

/// How long a token may wait for its hello.
pub const TOKEN_TTL: Duration = Duration::from_secs(30);
/// Most tokens waiting for a hello at once.
pub const MAX_PENDING: usize = 65_536;
/// Most bytes of credentials and instance ids the waiting tokens' grants hold together.
pub const MAX_PENDING_BYTES: usize = 64 << 20;
/// Bytes of a token.
pub const TOKEN_LEN: usize = 16;

/// A token, as the hello carries it.
pub type Token = [u8; TOKEN_LEN];

/// What a bootstrap showed, kept to check its queue pair again later.
#[derive(Debug, Clone)]
pub struct Grant {
    /// The instance the queue pair is bound to.
    pub instance_id: Arc<str>,
    /// The bootstrap caller's address.
    pub peer: Option<SocketAddr>,
    /// The bootstrap's `Authorization` header, canonical (`Bearer <token>`); `None` when
    /// it carried no bearer token.
    pub authorization: Option<String>,
    /// The bootstrap connection's client certificate identity.
    pub certificate: Option<Arc<CertIdentity>>,
}

impl Grant {
    /// The grant of a bootstrap that passed `check`.
    pub fn of(check: &AccessCheck<'_>) -> Grant {
        Grant {
            instance_id: check.instance_id.into(),
            peer: check.peer,
            authorization: check
                .authorization
                .and_then(|value| canonical_authorization(value.as_bytes()))
                .and_then(|value| String::from_utf8(value).ok()),
            certificate: check.certificate.cloned().map(Arc::new),
        }
    }

    /// Bytes this grant holds beyond its fixed size (counted against [`MAX_PENDING_BYTES`]).
    fn held_bytes(&self) -> usize {
        let certificate = self.certificate.as_ref().map_or(0, |c| {
            c.account.len() + c.instances.iter().map(String::len).sum::<usize>()
        });
        self.instance_id.len() + self.authorization.as_ref().map_or(0, String::len) + certificate
    }

    /// The access check this grant passes again.
    pub fn check(&self) -> AccessCheck<'_> {
        AccessCheck {
            instance_id: &self.instance_id,
            peer: self.peer,
            authorization: self.authorization.as_deref(),
            certificate: self.certificate.as_deref(),
        }
    }
}

/// Tokens issued and not yet redeemed.
#[derive(Debug, Default)]
pub struct Grants {
    pending: Mutex<Pending>,
}

/// The waiting tokens, their deadlines and grants, and the bytes those grants hold.
#[derive(Debug, Default)]
struct Pending {
    tokens: HashMap<Token, (Instant, Grant)>,
    held_bytes: usize,
}

impl Pending {
    fn is_full(&self, adding: usize) -> bool {
        self.tokens.len() >= MAX_PENDING || self.held_bytes + adding > MAX_PENDING_BYTES
    }

    fn drop_expired(&mut self) {
        let now = Instant::now();
        let held_bytes = &mut self.held_bytes;
        self.tokens.retain(|_, (deadline, grant)| {
            let live = *deadline > now;
            if !live {
                *held_bytes -= grant.held_bytes();
            }
            live
        });
    }

    fn remove(&mut self, token: &Token) -> Option<(Instant, Grant)> {
        let (deadline, grant) = self.tokens.remove(token)?;
        self.held_bytes -= grant.held_bytes();
        Some((deadline, grant))
    }
}

impl Grants {
    /// Issues a token for `grant`.
    pub fn issue(&self, grant: Grant) -> Result<Token, LookupError> {
        let mut token = [0u8; TOKEN_LEN];
        getrandom::fill(&mut token)
            .map_err(|e| LookupError::Listener(std::io::Error::other(e.to_string())))?;
        let adding = grant.held_bytes();
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        if pending.is_full(adding) {
            pending.drop_expired();
        }
        if pending.is_full(adding) {
            return Err(LookupError::Busy(format!(
                "{} queue-pair tokens ({} bytes of credentials) wait for their hello; \
                 try again later",
                pending.tokens.len(),
                pending.held_bytes
            )));
        }
        pending.held_bytes += adding;
        pending
            .tokens
            .insert(token, (Instant::now() + TOKEN_TTL, grant));
        Ok(token)
    }

    /// The grant of `token`, once: redeeming removes it; an expired token is refused.
    pub fn redeem(&self, token: &Token) -> Option<Grant> {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let (deadline, grant) = pending.remove(token)?;
        (deadline > Instant::now()).then_some(grant)
    }
}

/// A token as text (lower-case hex), as the bootstrap answers it.
pub fn token_hex(token: &Token) -> String {
    kvcm_manager::hex::encode(token)
}

/// The inverse of [`token_hex`]; `None` for anything else.
pub fn parse_token(text: &str) -> Option<Token> {
    kvcm_manager::hex::decode(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(instance: &str) -> Grant {
        Grant::of(&AccessCheck {
            instance_id: instance,
            peer: None,
            authorization: Some("Bearer k"),
            certificate: None,
        })
    }

    #[test]
    fn a_token_opens_once() {
        let grants = Grants::default();
        let token = grants.issue(grant("a")).unwrap();
        let redeemed = grants.redeem(&token).unwrap();
        assert_eq!(&*redeemed.instance_id, "a");
        assert_eq!(redeemed.check().authorization, Some("Bearer k"));
        assert!(grants.redeem(&token).is_none(), "replayed");
        assert!(grants.redeem(&[0; TOKEN_LEN]).is_none(), "never issued");
    }

    #[test]
    fn tokens_differ_and_round_trip_as_text() {
        let grants = Grants::default();
        let (a, b) = (
            grants.issue(grant("a")).unwrap(),
            grants.issue(grant("a")).unwrap(),
        );
        assert_ne!(a, b);
        assert_eq!(parse_token(&token_hex(&a)), Some(a));
        for bad in ["", "00", &"g".repeat(32), &"0".repeat(33), &"é".repeat(16)] {
            assert_eq!(parse_token(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_grant_keeps_only_the_canonical_bearer_header() {
        let with = |authorization| {
            Grant::of(&AccessCheck {
                instance_id: "a",
                peer: None,
                authorization: Some(authorization),
                certificate: None,
            })
            .authorization
        };
        assert_eq!(with("bEaReR \t k").as_deref(), Some("Bearer k"));
        assert_eq!(with("Basic dXNlcjpwdw=="), None);
    }

    #[test]
    fn long_credentials_fill_the_byte_budget_before_the_count() {
        let grants = Grants::default();
        let long = format!("Bearer {}", "k".repeat(1 << 20));
        let big = || {
            Grant::of(&AccessCheck {
                instance_id: "a",
                peer: None,
                authorization: Some(&long),
                certificate: None,
            })
        };
        let fit = MAX_PENDING_BYTES / big().held_bytes();
        let tokens: Vec<Token> = (0..fit).map(|_| grants.issue(big()).unwrap()).collect();
        let refused = grants.issue(big()).unwrap_err().to_string();
        assert!(refused.contains("bytes of credentials"), "{refused}");
        assert!(grants.issue(grant("a")).is_ok(), "a short grant still fits");
        assert!(grants.redeem(&tokens[0]).is_some());
        assert!(
            grants.issue(big()).is_ok(),
            "a redeemed token frees its bytes"
        );
    }

    #[test]
    fn an_expired_token_is_refused() {
        let grants = Grants::default();
        let token = grants.issue(grant("a")).unwrap();
        let mut pending = grants.pending.lock().unwrap();
        pending.tokens.get_mut(&token).unwrap().0 = Instant::now();
        drop(pending);
        assert!(grants.redeem(&token).is_none());
    }
}
