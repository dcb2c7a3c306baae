//! API keys (kvcm's extension to the reference's accounts): the credential engines and
//! operators present as `Authorization: Bearer <key>`. A key reads `kvcm_<id>_<secret>`: the
//! id (16 hex digits) names it in lists, logs and revocations; the secret (64 hex digits,
//! 256 bits from the operating system's random source) is shown once, when the key is
//! created, and kept only as its SHA-256 digest.
//!
//! Invariants: a key belongs to an existing account (deleting the account revokes its keys);
//! a key of a ROLE_USER account names at least one instance; a key verifies only while it is
//! unexpired and unrevoked at the moment of the check (nothing is cached, so a revocation
//! holds from the next request on); a secret is never stored, logged or returned after its
//! creation; comparing digests takes the same time wherever they differ.

use sha2::{Digest, Sha256};

use super::accounts::AccountRole;
use super::error::{ManagerError, ManagerResult};
use super::journal::Record;
use super::leader::now_ms;
use super::Manager;
use crate::sync::{lock, read_lock, write_lock};

/// Keys one server holds at most.
pub const MAX_API_KEYS: usize = 65_536;
/// Instances one key may name at most.
pub const MAX_KEY_INSTANCES: usize = 256;
/// Longest instance id a key may name (the instance-id limit of the file tier).
const MAX_INSTANCE_ID_BYTES: usize = 255;

const PREFIX: &str = "kvcm_";
const ID_DIGITS: usize = 16;
const SECRET_DIGITS: usize = 64;

/// One API key as the server keeps it (no secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKey {
    /// Its public id (16 lower-case hex digits).
    pub id: String,
    /// The account it acts for.
    pub user_name: String,
    /// SHA-256 of its secret.
    pub digest: [u8; 32],
    /// The instances it may touch on the meta API and the lookup path (empty = every one;
    /// only for ROLE_ADMIN and ROLE_OPERATOR accounts).
    pub instances: Vec<String>,
    /// When it was created (ms since the Unix epoch).
    pub created_ms: u64,
    /// When it stops working (ms since the Unix epoch; 0 = never).
    pub expires_ms: u64,
}

/// What a new key is asked to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewApiKey {
    /// The account it acts for.
    pub user_name: String,
    /// The instances it may touch (empty = every one, refused for ROLE_USER accounts).
    pub instances: Vec<String>,
    /// When it stops working (ms since the Unix epoch; 0 = never).
    pub expires_ms: u64,
}

/// What a verified key grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyGrant {
    /// The key's id.
    pub key_id: String,
    /// Its account.
    pub user_name: String,
    /// The account's role.
    pub role: AccountRole,
    /// The instances it may touch (empty = every one).
    pub instances: Vec<String>,
}

/// Why a presented key does not verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyRefusal {
    /// Not of the form `kvcm_<16 hex>_<64 hex>`.
    #[error("not an API key")]
    Malformed,
    /// No such key (never created, revoked, or its secret differs).
    #[error("the API key is not valid")]
    Unknown,
    /// The key has expired.
    #[error("the API key has expired")]
    Expired,
}

fn digest_of(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Equality of two digests in time independent of where they differ.
fn digests_equal(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let difference = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(difference) == 0
}

/// The id and secret of `kvcm_<id>_<secret>`.
fn split_key(presented: &[u8]) -> Result<(&str, &str), KeyRefusal> {
    let text = std::str::from_utf8(presented).map_err(|_| KeyRefusal::Malformed)?;
    let rest = text.strip_prefix(PREFIX).ok_or(KeyRefusal::Malformed)?;
    let (id, secret) = rest.split_once('_').ok_or(KeyRefusal::Malformed)?;
    let lower_hex = |s: &str, digits| {
        s.len() == digits && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    if !lower_hex(id, ID_DIGITS) || !lower_hex(secret, SECRET_DIGITS) {
        return Err(KeyRefusal::Malformed);
    }
    Ok((id, secret))
}

/// `n` bytes from the operating system's random source.
fn random_bytes<const N: usize>() -> ManagerResult<[u8; N]> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes)
        .map_err(|e| ManagerError::Refused(format!("no random bytes for a key: {e}")))?;
    Ok(bytes)
}

fn check_new_key(request: &NewApiKey, role: AccountRole, now: u64) -> ManagerResult<()> {
    let detail = |field, detail: &str| ManagerError::InvalidField {
        field,
        detail: detail.to_string(),
    };
    if role == AccountRole::User && request.instances.is_empty() {
        let why = "a key of a ROLE_USER account must name the instances it may touch";
        return Err(detail("instance_ids", why));
    }
    if request.instances.len() > MAX_KEY_INSTANCES {
        let why = format!("at most {MAX_KEY_INSTANCES} instances per key");
        return Err(detail("instance_ids", &why));
    }
    let bad = |id: &String| id.is_empty() || id.len() > MAX_INSTANCE_ID_BYTES || id.contains('\0');
    if request.instances.iter().any(bad) {
        let why = format!("each instance id must be 1 to {MAX_INSTANCE_ID_BYTES} bytes, no NUL");
        return Err(detail("instance_ids", &why));
    }
    if request.expires_ms != 0 && request.expires_ms <= now {
        return Err(detail("expires_at_ms", "the expiry is not in the future"));
    }
    Ok(())
}

impl Manager {
    /// Creates a key for an existing account; answers it and its full text (`kvcm_<id>_<secret>`,
    /// the only time the secret is seen).
    pub fn create_api_key(&self, request: NewApiKey) -> ManagerResult<(ApiKey, String)> {
        let now = now_ms();
        // Held to the end (accounts before keys, as in `delete_account`), so no key is
        // created for an account being deleted.
        let accounts = lock(&self.accounts);
        let Some(account) = accounts.get(&request.user_name) else {
            let name = &request.user_name;
            return Err(ManagerError::NotFound(format!(
                "account {name:?} does not exist"
            )));
        };
        check_new_key(&request, account.role, now)?;
        let secret = crate::hex::encode(&random_bytes::<32>()?);
        let mut keys = write_lock(&self.api_keys);
        if keys.len() >= MAX_API_KEYS {
            return Err(ManagerError::Capacity(format!(
                "at most {MAX_API_KEYS} API keys; revoke some first"
            )));
        }
        let id = loop {
            let id = crate::hex::encode(&random_bytes::<8>()?);
            if !keys.contains_key(&id) {
                break id;
            }
        };
        let key = ApiKey {
            id: id.clone(),
            user_name: request.user_name,
            digest: digest_of(&secret),
            instances: request.instances,
            created_ms: now,
            expires_ms: request.expires_ms,
        };
        let ticket = self.journal_append(&Record::ApiKey(key.clone()))?;
        keys.insert(id.clone(), key.clone());
        drop((keys, accounts));
        self.journal_wait(ticket)?;
        Ok((key, format!("{PREFIX}{id}_{secret}")))
    }

    /// Revokes a key by id: it stops working at the next request.
    pub fn revoke_api_key(&self, id: &str) -> ManagerResult<()> {
        let mut keys = write_lock(&self.api_keys);
        if !keys.contains_key(id) {
            return Err(ManagerError::NotFound(format!(
                "API key {id:?} does not exist"
            )));
        }
        let ticket = self.journal_append(&Record::ApiKeyRevoked(id.to_string()))?;
        keys.remove(id);
        drop(keys);
        self.journal_wait(ticket)
    }

    /// Revokes every key of an account (its deletion).
    pub(crate) fn revoke_keys_of(&self, user_name: &str) -> ManagerResult<()> {
        let ids: Vec<String> = read_lock(&self.api_keys)
            .values()
            .filter(|key| key.user_name == user_name)
            .map(|key| key.id.clone())
            .collect();
        ids.iter().try_for_each(|id| match self.revoke_api_key(id) {
            Err(ManagerError::NotFound(_)) => Ok(()),
            other => other,
        })
    }

    /// Every key, by id (digests, never secrets).
    pub fn list_api_keys(&self) -> Vec<ApiKey> {
        read_lock(&self.api_keys).values().cloned().collect()
    }

    /// Restores a logged key (recovery): its account must exist.
    pub(crate) fn restore_api_key(&self, key: ApiKey) -> ManagerResult<()> {
        if self.account_role(&key.user_name).is_none() {
            return Err(ManagerError::NotFound(format!(
                "account {:?} of the key does not exist",
                key.user_name
            )));
        }
        write_lock(&self.api_keys).insert(key.id.clone(), key);
        Ok(())
    }

    /// What the presented key text grants, checked now.
    pub fn verify_api_key(&self, presented: &[u8]) -> Result<KeyGrant, KeyRefusal> {
        let (id, secret) = split_key(presented)?;
        let digest = digest_of(secret);
        let key = read_lock(&self.api_keys)
            .get(id)
            .filter(|key| digests_equal(&key.digest, &digest))
            .cloned()
            .ok_or(KeyRefusal::Unknown)?;
        if key.expires_ms != 0 && key.expires_ms <= now_ms() {
            return Err(KeyRefusal::Expired);
        }
        // The key lock is released first: accounts are locked before keys everywhere.
        let role = self
            .account_role(&key.user_name)
            .ok_or(KeyRefusal::Unknown)?;
        Ok(KeyGrant {
            key_id: key.id,
            user_name: key.user_name,
            role,
            instances: key.instances,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_text_is_parsed_strictly() {
        let id = "0123456789abcdef";
        let secret = "a".repeat(64);
        let good = format!("kvcm_{id}_{secret}");
        assert_eq!(split_key(good.as_bytes()), Ok((id, secret.as_str())));
        for bad in [
            format!("kvcm-{id}_{secret}"),
            format!("kvcm_{id}{secret}"),
            format!("kvcm_{}_{secret}", &id[1..]),
            format!("kvcm_{id}_{}", &secret[1..]),
            format!("kvcm_{id}_{}A", &secret[1..]),
            format!("kvcm_{}_{secret}", id.to_uppercase()),
            format!("kvcm_{id}_{secret}\n"),
            String::new(),
        ] {
            assert_eq!(
                split_key(bad.as_bytes()),
                Err(KeyRefusal::Malformed),
                "{bad:?}"
            );
        }
        assert_eq!(split_key(b"kvcm_\xff"), Err(KeyRefusal::Malformed));
    }

    #[test]
    fn digests_compare_as_equality() {
        let a = digest_of("x");
        let mut b = a;
        assert!(digests_equal(&a, &b));
        b[31] ^= 1;
        assert!(!digests_equal(&a, &b));
        // SHA-256("abc"), FIPS 180-2 appendix B.1.
        assert_eq!(
            crate::hex::encode(&digest_of("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn new_keys_are_checked() {
        let request = |instances: Vec<&str>, expires_ms| NewApiKey {
            user_name: "u".into(),
            instances: instances.into_iter().map(String::from).collect(),
            expires_ms,
        };
        let ok = |r: &NewApiKey, role| check_new_key(r, role, 1_000).is_ok();
        assert!(
            !ok(&request(vec![], 0), AccountRole::User),
            "user keys name instances"
        );
        assert!(ok(&request(vec![], 0), AccountRole::Operator));
        assert!(ok(&request(vec!["a"], 2_000), AccountRole::User));
        assert!(
            !ok(&request(vec!["a"], 1_000), AccountRole::User),
            "expiry in the past"
        );
        assert!(!ok(&request(vec![""], 0), AccountRole::User));
        assert!(!ok(&request(vec!["a\0b"], 0), AccountRole::User));
        let long = "x".repeat(256);
        assert!(!ok(&request(vec![long.as_str()], 0), AccountRole::User));
        let many = vec!["i"; MAX_KEY_INSTANCES + 1];
        assert!(!ok(&request(many, 0), AccountRole::Admin));
    }
}
