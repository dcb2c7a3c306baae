//! The server's record of whom each pool ticket was issued to, so that a node can learn
//! which of its queue pairs no longer have a credential behind them.
//!
//! A ticket carries a grant id (`super::ticket`). The id is derived from the credential the
//! directory request showed — an HMAC, under the server's secret, of the pool's name and the
//! `Authorization` value, or of the client certificate's identity — so one credential keeps
//! one id per pool across directory calls, and the table holds one entry per credential
//! seen. A node's heartbeat lists the grants of its live queue pairs; the server checks each
//! one's credential again, as for a new request (a revoked or expired API key, a deleted
//! account, a removed admin token, or a key no longer scoped to an instance of a group that
//! uses the pool — or, for tickets issued for one instance, a key that no longer reaches
//! that instance or whose group no longer uses the pool — all fail; the grant id covers the
//! instance too, so one instance's queue pairs are revoked without the others'.
//! uses the pool all fail), and answers the ones that fail; the node tears those queue pairs
//! down.
//!
//! Invariants: at most [`MAX_GRANTS`] entries (the least recently issued is forgotten first);
//! a grant the server does not know — forgotten, or issued by an earlier server process —
//! counts as revoked.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use kvcm_manager::Manager;

use super::ticket::ServerSecret;
use crate::service::auth::{authorize, Authenticator, CertIdentity};
use crate::service::rpcs::{Access, Service};

/// Most credentials remembered.
pub const MAX_GRANTS: usize = 65_536;

/// What a directory request showed.
#[derive(Debug, Clone, Default)]
pub struct Credential {
    /// Its `Authorization` header.
    pub authorization: Option<Vec<u8>>,
    /// Its connection's client certificate identity.
    pub certificate: Option<Arc<CertIdentity>>,
}

/// One remembered credential.
#[derive(Debug)]
struct Entry {
    credential: Credential,
    storage: String,
    /// The instance the tickets were issued for, when they name one.
    instance: Option<String>,
    issued: Instant,
}

/// The grants issued by this server process.
#[derive(Debug, Default)]
pub struct PoolGrants {
    entries: Mutex<HashMap<u64, Entry>>,
}

impl PoolGrants {
    /// The grant of `credential` on pool `storage`, for `instance` when the tickets name
    /// one (remembered for later checks).
    pub fn issue(
        &self,
        secret: &ServerSecret,
        credential: &Credential,
        (storage, instance): (&str, Option<&str>),
    ) -> u64 {
        let id = grant_id(secret, credential, (storage, instance));
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if !entries.contains_key(&id) && entries.len() >= MAX_GRANTS {
            let oldest = entries
                .iter()
                .min_by_key(|(_, e)| e.issued)
                .map(|(id, _)| *id);
            if let Some(oldest) = oldest {
                entries.remove(&oldest);
            }
        }
        entries.insert(
            id,
            Entry {
                credential: credential.clone(),
                storage: storage.to_string(),
                instance: instance.map(str::to_string),
                issued: Instant::now(),
            },
        );
        id
    }

    /// The grants of `live` whose credential no longer passes (or that are unknown).
    pub fn revoked(&self, auth: &Authenticator, manager: &Manager, live: &[u64]) -> Vec<u64> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        live.iter()
            .copied()
            .filter(|id| {
                entries
                    .get(id)
                    .is_none_or(|entry| !still_passes(auth, manager, entry))
            })
            .collect()
    }
}

/// Whether the entry's credential passes now, for a directory request of its pool.
fn still_passes(auth: &Authenticator, manager: &Manager, entry: &Entry) -> bool {
    let credential = &entry.credential;
    let caller = auth.check(
        Service::Meta,
        credential.authorization.as_deref(),
        credential.certificate.as_deref(),
    );
    let Ok(caller) = caller else {
        return false;
    };
    if authorize(caller.as_ref(), Access::Client, None).is_err() {
        return false;
    }
    let scope = super::routes::scope_of(caller.as_ref());
    match &entry.instance {
        None => scope
            .is_none_or(|instances| super::routes::uses_pool(manager, &instances, &entry.storage)),
        Some(instance) => {
            let reached = scope.is_none_or(|instances| instances.contains(instance));
            reached
                && super::routes::uses_pool(manager, std::slice::from_ref(instance), &entry.storage)
        }
    }
}

/// The id of a credential on a pool (for an instance).
fn grant_id(
    secret: &ServerSecret,
    credential: &Credential,
    (storage, instance): (&str, Option<&str>),
) -> u64 {
    let mut parts: Vec<&[u8]> = vec![storage.as_bytes(), b"\0"];
    if let Some(instance) = instance {
        parts.extend([b"instance\0".as_slice(), instance.as_bytes(), b"\0"]);
    }
    if let Some(authorization) = &credential.authorization {
        parts.extend([b"authorization\0".as_slice(), authorization]);
    }
    let instances;
    if let Some(certificate) = &credential.certificate {
        instances = certificate.instances.join("\0");
        parts.extend([
            b"certificate\0".as_slice(),
            certificate.account.as_bytes(),
            b"\0",
            instances.as_bytes(),
        ]);
    }
    secret.digest(&parts)
}
