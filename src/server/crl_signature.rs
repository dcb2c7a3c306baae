//! The signature of a client CA's certificate revocation list, checked at load against the
//! key of the CA it names: a list its CA did not sign (a stale file from a re-keyed CA, the
//! wrong CA's list under the same name, a list signed with an algorithm the server cannot
//! verify) stops the start or the reload naming the list, instead of making every handshake
//! of that CA's clients fail later. rustls checks the signature again at each handshake that
//! uses the list.
//!
//! Only the outer DER is read here: the list (RFC 5280 §5.1, `SEQUENCE { tbsCertList,
//! signatureAlgorithm, signatureValue }`) and the CA's subject public key info (its
//! contents, as a trust anchor holds them). The check uses the signature algorithms of the
//! server's TLS provider, matched by their algorithm identifiers as the handshake matches
//! them, so a list passes here exactly when a handshake can verify it.

use tokio_rustls::rustls::pki_types::SignatureVerificationAlgorithm;

use super::der::{Der, SEQUENCE};

/// Tag of a BIT STRING.
const BIT_STRING: u8 = 0x03;

/// Checks the signature of the list `crl` (DER) with the CA key `ca_spki` (the contents of
/// its subject public key info) by one of `algorithms`; the reason, when the CA did not sign
/// the list, no algorithm fits, or either does not decode.
pub(super) fn verify(
    crl: &[u8],
    ca_spki: &[u8],
    algorithms: &[&dyn SignatureVerificationAlgorithm],
) -> Result<(), String> {
    let malformed = |what: &str| format!("the list's {what} does not decode");
    let (list, _) = Der(crl)
        .element(SEQUENCE)
        .ok_or_else(|| malformed("outer structure"))?;
    let (signed, rest) = list.whole().ok_or_else(|| malformed("tbsCertList"))?;
    let (signature_algorithm, rest) = rest
        .element(SEQUENCE)
        .ok_or_else(|| malformed("signature algorithm"))?;
    let signature = rest
        .element(BIT_STRING)
        .and_then(|(bits, _)| whole_bytes(bits))
        .ok_or_else(|| malformed("signature"))?;
    let key = Der(ca_spki)
        .element(SEQUENCE)
        .and_then(|(algorithm, rest)| {
            let (bits, _) = rest.element(BIT_STRING)?;
            Some((algorithm, whole_bytes(bits)?))
        });
    let Some((key_algorithm, key)) = key else {
        return Err("the CA's public key does not decode".into());
    };
    let fits = |algorithm: &&&dyn SignatureVerificationAlgorithm| {
        algorithm.signature_alg_id().as_ref() == signature_algorithm.0
            && algorithm.public_key_alg_id().as_ref() == key_algorithm.0
    };
    let Some(algorithm) = algorithms.iter().find(fits) else {
        return Err(
            "it is signed with an algorithm the server cannot verify with its CA's key".into(),
        );
    };
    algorithm
        .verify_signature(key, signed, signature)
        .map_err(|_| "its signature does not verify with the key of its CA".into())
}

/// The bytes of a BIT STRING's contents that has no unused bits.
fn whole_bytes(bits: Der<'_>) -> Option<&[u8]> {
    match bits.0.split_first() {
        Some((0, bytes)) => Some(bytes),
        _ => None,
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
        // The SPKI's contents, as a trust anchor holds them: without its SEQUENCE header.
        let (contents, _) = Der(spki.as_ref()).element(SEQUENCE).expect("SPKI");
        (contents.0.to_vec(), list.der().to_vec())
    }

    /// `list` checked with `key` by the algorithms of the server's TLS provider.
    fn check(list: &[u8], key: &[u8]) -> Result<(), String> {
        let provider = crate::tls_provider::ring_provider();
        verify(list, key, provider.signature_verification_algorithms.all)
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
            assert_eq!(check(&list, &key), Ok(()), "{algorithm:?}");
            let refused = check(&list, &other_key).unwrap_err();
            assert!(refused.contains("does not verify"), "{refused}");
            let mut flipped = list.clone();
            *flipped.last_mut().expect("bytes") ^= 1;
            let refused = check(&flipped, &key).unwrap_err();
            assert!(refused.contains("does not verify"), "{refused}");
        }
    }

    #[test]
    fn a_list_signed_with_another_kind_of_key_than_its_cas_is_refused() {
        // A CA re-keyed from Ed25519 to ECDSA with its old list left in place.
        let (ecdsa_key, _) = ca_and_list("client CA", &rcgen::PKCS_ECDSA_P256_SHA256);
        let (_, ed25519_list) = ca_and_list("client CA", &rcgen::PKCS_ED25519);
        let refused = check(&ed25519_list, &ecdsa_key).unwrap_err();
        assert!(
            refused.contains("cannot verify with its CA's key"),
            "{refused}"
        );
        // No algorithm at all: nothing fits.
        let (key, list) = ca_and_list("client CA", &rcgen::PKCS_ECDSA_P256_SHA256);
        assert!(verify(&list, &key, &[]).is_err());
    }

    #[test]
    fn garbage_is_refused() {
        let (key, list) = ca_and_list("client CA", &rcgen::PKCS_ECDSA_P256_SHA256);
        for bad in [
            &[][..],
            &[0x30],
            &[0x30, 0x85, 0, 0, 0, 0, 1],
            &list[..list.len() - 1],
        ] {
            let refused = check(bad, &key).unwrap_err();
            assert!(refused.contains("does not decode"), "{bad:?}: {refused}");
        }
        let refused = check(&list, &[0x30, 0x00]).unwrap_err();
        assert!(refused.contains("public key does not decode"), "{refused}");
    }
}
