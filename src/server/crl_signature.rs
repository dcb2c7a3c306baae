//! The signature of a client CA's certificate revocation list, checked at load against the
//! key of the CA it names: a list its CA did not sign (a stale file from a re-keyed CA, the
//! wrong CA's list under the same name) stops the start or the reload naming the list,
//! instead of making every handshake of that CA's clients fail later. rustls checks the
//! signature again at each handshake that uses the list.
//!
//! Only the outer DER is read here: the list (RFC 5280 §5.1, `SEQUENCE { tbsCertList,
//! signatureAlgorithm, signatureValue }`) and the CA's subject public key info (its value, as
//! a trust anchor holds it). Checked: ECDSA on P-256 and P-384 with SHA-256 or SHA-384, RSA
//! PKCS #1 v1.5 with SHA-256, SHA-384 or SHA-512, and Ed25519; a list signed otherwise (RSA-PSS)
//! is [`Signature::NotChecked`] here and left to the handshake.

use ring::signature::{self, VerificationAlgorithm};

/// What the check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Signature {
    /// The CA's key verifies the list.
    Valid,
    /// The algorithm is not one this module checks (see the module doc).
    NotChecked,
}

const ECDSA_SHA256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02];
const ECDSA_SHA384: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03];
const RSA_SHA256: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0b];
const RSA_SHA384: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0c];
const RSA_SHA512: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0d];
const ED25519: &[u8] = &[0x2b, 0x65, 0x70];
const EC_PUBLIC_KEY: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
const RSA_PUBLIC_KEY: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
const P256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const P384: &[u8] = &[0x2b, 0x81, 0x04, 0x00, 0x22];

const SEQUENCE: u8 = 0x30;
const OID: u8 = 0x06;
const BIT_STRING: u8 = 0x03;

/// Checks the signature of the list `crl` (DER) with the CA key `ca_spki` (the value of its
/// subject public key info); why not, when the list is not its signature or does not decode.
pub(super) fn verify(crl: &[u8], ca_spki: &[u8]) -> Result<Signature, String> {
    let malformed = |what: &str| format!("the list's {what} does not decode");
    let list = Der(crl)
        .expect(SEQUENCE)
        .ok_or_else(|| malformed("outer structure"))?;
    let mut fields = Der(list);
    let signed = fields.raw().ok_or_else(|| malformed("tbsCertList"))?;
    let algorithm = fields
        .expect(SEQUENCE)
        .and_then(|a| Der(a).expect(OID))
        .ok_or_else(|| malformed("signature algorithm"))?;
    let signature_value = fields
        .expect(BIT_STRING)
        .and_then(whole_bytes)
        .ok_or_else(|| malformed("signature"))?;
    let mut key_fields = Der(ca_spki);
    let key_algorithm = key_fields.expect(SEQUENCE);
    let key = key_fields.expect(BIT_STRING).and_then(whole_bytes);
    let (Some(key_algorithm), Some(key)) = (key_algorithm, key) else {
        return Err("the CA's public key does not decode".into());
    };
    let mut key_algorithm = Der(key_algorithm);
    let key_kind = key_algorithm.expect(OID).unwrap_or_default();
    let curve = key_algorithm.expect(OID).unwrap_or_default();
    let Some(check) = algorithm_for(algorithm, key_kind, curve) else {
        return Ok(Signature::NotChecked);
    };
    signature::UnparsedPublicKey::new(check, key)
        .verify(signed, signature_value)
        .map(|()| Signature::Valid)
        .map_err(|_| "its signature does not verify with the key of its CA".into())
}

/// The verification of signature algorithm `algorithm` by a key of kind `key_kind` (on
/// `curve` for EC keys), when this module checks it.
fn algorithm_for(
    algorithm: &[u8],
    key_kind: &[u8],
    curve: &[u8],
) -> Option<&'static dyn VerificationAlgorithm> {
    let ec = key_kind == EC_PUBLIC_KEY;
    let rsa = key_kind == RSA_PUBLIC_KEY;
    Some(match algorithm {
        ECDSA_SHA256 if ec && curve == P256 => &signature::ECDSA_P256_SHA256_ASN1,
        ECDSA_SHA256 if ec && curve == P384 => &signature::ECDSA_P384_SHA256_ASN1,
        ECDSA_SHA384 if ec && curve == P256 => &signature::ECDSA_P256_SHA384_ASN1,
        ECDSA_SHA384 if ec && curve == P384 => &signature::ECDSA_P384_SHA384_ASN1,
        RSA_SHA256 if rsa => &signature::RSA_PKCS1_2048_8192_SHA256,
        RSA_SHA384 if rsa => &signature::RSA_PKCS1_2048_8192_SHA384,
        RSA_SHA512 if rsa => &signature::RSA_PKCS1_2048_8192_SHA512,
        ED25519 if key_kind == ED25519 => &signature::ED25519,
        _ => return None,
    })
}

/// The bytes of a BIT STRING's value that has no unused bits.
fn whole_bytes(value: &[u8]) -> Option<&[u8]> {
    match value.split_first() {
        Some((0, bytes)) => Some(bytes),
        _ => None,
    }
}

/// A reader of consecutive DER elements (definite lengths only, as DER requires).
struct Der<'a>(&'a [u8]);

impl<'a> Der<'a> {
    /// The next element whole (tag, length and value) and its value.
    fn next(&mut self) -> Option<(u8, &'a [u8], &'a [u8])> {
        let (&tag, rest) = self.0.split_first()?;
        let (&first, rest) = rest.split_first()?;
        let (len, rest) = match first {
            0..=0x7f => (usize::from(first), rest),
            0x81..=0x84 => {
                let count = usize::from(first & 0x7f);
                let (digits, rest) = rest.split_at_checked(count)?;
                let len = digits
                    .iter()
                    .fold(0usize, |n, &d| (n << 8) | usize::from(d));
                (len, rest)
            }
            _ => return None,
        };
        let (value, after) = rest.split_at_checked(len)?;
        let whole_len = self.0.len() - after.len();
        let whole = &self.0[..whole_len];
        self.0 = after;
        Some((tag, whole, value))
    }

    /// The value of the next element when its tag is `tag`.
    fn expect(&mut self, tag: u8) -> Option<&'a [u8]> {
        self.next().filter(|(t, _, _)| *t == tag).map(|(_, _, v)| v)
    }

    /// The next element whole.
    fn raw(&mut self) -> Option<&'a [u8]> {
        self.next().map(|(_, whole, _)| whole)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use rcgen::{
        BasicConstraints, CertificateParams, CertificateRevocationList,
        CertificateRevocationListParams, CertifiedIssuer, IsCa, KeyIdMethod, KeyPair, SerialNumber,
    };

    /// A self-signed CA named `name` with a new key of `algorithm`.
    pub(in crate::server) fn authority_with(
        name: &str,
        algorithm: &'static rcgen::SignatureAlgorithm,
    ) -> CertifiedIssuer<'static, KeyPair> {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = KeyPair::generate_for(algorithm).expect("key");
        CertifiedIssuer::self_signed(params, key).expect("CA")
    }

    /// An empty revocation list number `number` of `issuer`.
    pub(in crate::server) fn revocation_list_of(
        issuer: &CertifiedIssuer<'static, KeyPair>,
        number: u8,
    ) -> CertificateRevocationList {
        let params = CertificateRevocationListParams {
            this_update: rcgen::date_time_ymd(2026, 1, 1),
            next_update: rcgen::date_time_ymd(2099, 1, 1),
            crl_number: SerialNumber::from_slice(&[number]),
            issuing_distribution_point: None,
            revoked_certs: Vec::new(),
            key_identifier_method: KeyIdMethod::Sha256,
        };
        params.signed_by(issuer).expect("CRL")
    }

    /// A CA named `name` with a new key of `algorithm`: its SPKI value and a list it signed.
    fn ca_and_list(
        name: &str,
        algorithm: &'static rcgen::SignatureAlgorithm,
    ) -> (Vec<u8>, Vec<u8>) {
        let issuer = authority_with(name, algorithm);
        let list = revocation_list_of(&issuer, 1);
        let cert = webpki::EndEntityCert::try_from(issuer.der()).expect("parsed");
        let spki = cert.subject_public_key_info();
        // The SPKI value, as a trust anchor holds it: without its SEQUENCE header.
        let value = Der(spki.as_ref()).expect(SEQUENCE).expect("SPKI").to_vec();
        (value, list.der().to_vec())
    }

    #[test]
    fn a_list_verifies_with_its_own_cas_key_only() {
        for algorithm in [
            &rcgen::PKCS_ECDSA_P256_SHA256,
            &rcgen::PKCS_ECDSA_P384_SHA384,
            &rcgen::PKCS_ED25519,
        ] {
            let (key, list) = ca_and_list("client CA", algorithm);
            let (other_key, _) = ca_and_list("client CA", algorithm);
            assert_eq!(verify(&list, &key), Ok(Signature::Valid), "{algorithm:?}");
            let refused = verify(&list, &other_key).unwrap_err();
            assert!(refused.contains("does not verify"), "{refused}");
            let mut flipped = list.clone();
            *flipped.last_mut().expect("bytes") ^= 1;
            assert!(verify(&flipped, &key).is_err(), "a flipped signature bit");
        }
    }

    #[test]
    fn garbage_is_refused_and_only_matching_key_kinds_are_checked() {
        let (key, list) = ca_and_list("client CA", &rcgen::PKCS_ECDSA_P256_SHA256);
        for bad in [
            &[][..],
            &[0x30],
            &[0x30, 0x85, 0, 0, 0, 0, 1],
            &list[..list.len() - 1],
        ] {
            assert!(verify(bad, &key).is_err(), "{bad:?}");
        }
        assert!(
            verify(&list, &[0x30, 0x00]).is_err(),
            "a key that does not decode"
        );
        // An ECDSA list checked against an RSA key's algorithm: not one this module pairs.
        assert!(algorithm_for(ECDSA_SHA256, RSA_PUBLIC_KEY, &[]).is_none());
        assert!(algorithm_for(RSA_SHA256, RSA_PUBLIC_KEY, &[]).is_some());
    }
}
