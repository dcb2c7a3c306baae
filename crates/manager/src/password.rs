//! Account passwords at rest: kept as a salted, slow hash in memory, the journal, snapshots
//! and the shared store: `pbkdf2-sha256$<iterations>$<salt hex>$<hash hex>`
//! (PBKDF2-HMAC-SHA256, a random 16-byte salt per password, a 32-byte hash).
//!
//! Records written by builds before this one hold the clear password; decoding keeps what
//! it reads as it is ([`StoredPassword::Clear`]: decoding stays cheap and bounded), and
//! restoring the account hashes it ([`StoredPassword::hashed`]) as adding one does, so the
//! manager's accounts hold hashes only; recovery's snapshot (local journal) or the promoted
//! leader's write-back (shared store) then drops the clear text.
//!
//! Invariant: a [`PasswordHash`] always holds a string of the form above. What is not of that
//! exact form reads as a clear password: a later build that changes the scheme must keep
//! this one's form readable (or mark its own in the encoding), and a legacy clear password
//! that happens to have that form stays as it is.

use std::num::NonZeroU32;

use ring::pbkdf2;

/// PBKDF2 rounds of new hashes (passwords authenticate nothing today; the cost keeps a
/// leaked journal from giving them away cheaply).
const ITERATIONS: u32 = 100_000;
/// The scheme's tag, first in the stored form.
const SCHEME: &str = "pbkdf2-sha256";
/// Bytes of a salt and of a hash.
const SALT_BYTES: usize = 16;
const HASH_BYTES: usize = 32;

/// A salted, slow hash of an account's password.
#[derive(Clone, PartialEq, Eq)]
pub struct PasswordHash(String);

impl std::fmt::Debug for PasswordHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PasswordHash(..)")
    }
}

impl PasswordHash {
    /// The hash of `password` with a fresh random salt.
    pub fn of(password: &str) -> PasswordHash {
        let mut salt = [0u8; SALT_BYTES];
        getrandom::fill(&mut salt).expect("the OS random source");
        let iterations = NonZeroU32::new(ITERATIONS).expect("non-zero");
        let mut hash = [0u8; HASH_BYTES];
        let algorithm = pbkdf2::PBKDF2_HMAC_SHA256;
        pbkdf2::derive(algorithm, iterations, &salt, password.as_bytes(), &mut hash);
        let (salt, hash) = (crate::hex::encode(&salt), crate::hex::encode(&hash));
        PasswordHash(format!("{SCHEME}${ITERATIONS}${salt}${hash}"))
    }

    /// The stored form.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `password` is the one hashed.
    #[cfg(test)]
    pub fn matches(&self, password: &str) -> bool {
        let (iterations, salt, hash) = parse(&self.0).expect("a hash (type invariant)");
        let algorithm = pbkdf2::PBKDF2_HMAC_SHA256;
        pbkdf2::verify(algorithm, iterations, &salt, password.as_bytes(), &hash).is_ok()
    }
}

/// An account's password as a record holds it (its `Debug` shows neither).
#[derive(Clone, PartialEq, Eq)]
pub enum StoredPassword {
    /// Its hash (every build since passwords were hashed writes this).
    Hash(PasswordHash),
    /// A password not hashed yet: as a caller gives it, or as an older build recorded it
    /// (the manager hashes it when it adds or replays the account).
    Clear(String),
}

impl std::fmt::Debug for StoredPassword {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StoredPassword::Hash(_) => "Hash(..)",
            StoredPassword::Clear(_) => "Clear(..)",
        })
    }
}

impl StoredPassword {
    /// What a record holds: a hash when it has the hash's form, else an older build's
    /// clear password. Cheap: nothing is hashed here.
    pub fn parse(stored: String) -> StoredPassword {
        match parse(&stored) {
            Some(_) => StoredPassword::Hash(PasswordHash(stored)),
            None => StoredPassword::Clear(stored),
        }
    }

    /// The text a record holds.
    pub(crate) fn as_stored(&self) -> &str {
        match self {
            StoredPassword::Hash(hash) => hash.as_str(),
            StoredPassword::Clear(clear) => clear,
        }
    }

    /// The hash (a clear password is hashed now).
    pub fn hashed(self) -> StoredPassword {
        match self {
            StoredPassword::Clear(clear) => StoredPassword::Hash(PasswordHash::of(&clear)),
            hash => hash,
        }
    }
}

/// A stored hash's iterations, salt and hash.
type Parts = (NonZeroU32, [u8; SALT_BYTES], [u8; HASH_BYTES]);

/// Most PBKDF2 rounds a stored hash may name (a bound for any future verification).
const MAX_ITERATIONS: u32 = 100_000_000;

/// The parts of a stored hash (exactly as [`PasswordHash::of`] writes them: decimal rounds
/// up to [`MAX_ITERATIONS`], lower-case hex); `None` for anything else.
fn parse(stored: &str) -> Option<Parts> {
    let mut fields = stored.split('$');
    if fields.next()? != SCHEME {
        return None;
    }
    let rounds = fields
        .next()
        .filter(|r| r.bytes().all(|b| b.is_ascii_digit()))?;
    let iterations = NonZeroU32::new(rounds.parse().ok()?).filter(|n| n.get() <= MAX_ITERATIONS)?;
    let lower_hex = |text: &str| text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let (salt, hash) = (fields.next()?, fields.next()?);
    if !lower_hex(salt) || !lower_hex(hash) || fields.next().is_some() {
        return None;
    }
    Some((
        iterations,
        crate::hex::decode(salt)?,
        crate::hex::decode(hash)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_salted_match_their_password_and_show_nothing() {
        let first = PasswordHash::of("hunter2");
        let second = PasswordHash::of("hunter2");
        assert_ne!(first, second, "a salt of its own");
        assert!(first.matches("hunter2") && second.matches("hunter2"));
        assert!(!first.matches("hunter3"));
        assert!(!first.as_str().contains("hunter2"));
        assert!(first.as_str().starts_with("pbkdf2-sha256$100000$"));
        assert_eq!(format!("{first:?}"), "PasswordHash(..)");
    }

    #[test]
    fn stored_hashes_parse_as_hashes_and_anything_else_is_an_older_clear_password() {
        let hash = PasswordHash::of("pw");
        let upper_case = hash
            .as_str()
            .to_uppercase()
            .replace("PBKDF2-SHA256", SCHEME);
        let signed = hash.as_str().replace("$100000$", "$+100000$");
        let too_many_rounds = hash.as_str().replace("$100000$", "$100000001$");
        let stored = StoredPassword::parse(hash.as_str().to_string());
        assert_eq!(stored, StoredPassword::Hash(hash.clone()));
        assert_eq!(stored.clone().hashed(), stored, "a hash stays");
        let clear = StoredPassword::parse("hunter2".into());
        assert_eq!(format!("{clear:?} {stored:?}"), "Clear(..) Hash(..)");
        for clear in [
            "pw",
            "pbkdf2-sha256$0$00$00",
            "pbkdf2-sha256$100000$zz$00",
            "pbkdf2-sha256$100000$00112233445566778899aabbccddeeff$00",
            "other$100000$00112233445566778899aabbccddeeff$",
            &upper_case,
            &signed,
            &too_many_rounds,
        ] {
            let stored = StoredPassword::parse(clear.to_string());
            assert_eq!(stored, StoredPassword::Clear(clear.to_string()));
            assert_eq!(stored.as_stored(), clear, "written back as read");
            let StoredPassword::Hash(hashed) = stored.hashed() else {
                panic!("{clear} was not hashed");
            };
            assert!(hashed.matches(clear), "{clear}");
        }
    }
}
