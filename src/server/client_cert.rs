//! The identity a verified client certificate names (`kvcm.tls.client_identity = account`,
//! docs/security.md "Mutual TLS"): the account is the subject's Common Name, the instances
//! are its URI subject-alternative names of the form `urn:kvcm:instance:<id>`.
//!
//! Invariants: only certificates rustls has already verified against the client CA reach
//! this reader; it still never panics on any bytes and answers `None` for anything that is
//! not the DER it expects (no Common Name, a Common Name that is not UTF-8 text, a
//! truncated or over-long element), so a certificate it cannot read authenticates nothing.

use super::der::{Der, SEQUENCE};
use crate::service::auth::CertIdentity;

/// The prefix of a URI subject-alternative name that names an instance.
pub const INSTANCE_URI_PREFIX: &str = "urn:kvcm:instance:";

/// DER tags this reader needs (and [`SEQUENCE`]).
const SET: u8 = 0x31;
const OBJECT_IDENTIFIER: u8 = 0x06;
const OCTET_STRING: u8 = 0x04;
const BOOLEAN: u8 = 0x01;
/// `[0]` constructed: the version of a TBSCertificate.
const VERSION: u8 = 0xa0;
/// `[3]` constructed: the extensions of a TBSCertificate.
const EXTENSIONS: u8 = 0xa3;
/// `[6]` primitive in GeneralName: a uniformResourceIdentifier.
const URI_NAME: u8 = 0x86;
/// String types a Common Name may use (UTF8String, PrintableString, IA5String).
const TEXT: [u8; 3] = [0x0c, 0x13, 0x16];

/// id-at-commonName, 2.5.4.3.
const COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
/// id-ce-subjectAltName, 2.5.29.17.
const SUBJECT_ALT_NAME: &[u8] = &[0x55, 0x1d, 0x11];

/// The identity of the DER certificate `der`, or `None` when it names none.
pub fn identity(der: &[u8]) -> Option<CertIdentity> {
    let (certificate, _) = Der(der).element(SEQUENCE)?;
    let (tbs, _) = certificate.element(SEQUENCE)?;
    let mut rest = tbs;
    if rest.peek() == Some(VERSION) {
        rest = rest.skip()?;
    }
    // serialNumber, signature, issuer, validity.
    for _ in 0..4 {
        rest = rest.skip()?;
    }
    let (subject, mut rest) = rest.element(SEQUENCE)?;
    let account = common_name(subject)?;
    let mut instances = Vec::new();
    while let Some(tag) = rest.peek() {
        if tag == EXTENSIONS {
            let (wrapped, _) = rest.element(EXTENSIONS)?;
            let (extensions, _) = wrapped.element(SEQUENCE)?;
            instances = instance_uris(extensions)?;
            break;
        }
        rest = rest.skip()?;
    }
    Some(CertIdentity { account, instances })
}

/// The first Common Name of a Name (a SEQUENCE of SETs of {type, value}).
fn common_name(mut name: Der<'_>) -> Option<String> {
    while !name.is_empty() {
        let (mut set, rest) = name.element(SET)?;
        name = rest;
        while !set.is_empty() {
            let (attribute, more) = set.element(SEQUENCE)?;
            set = more;
            let (oid, value) = attribute.element(OBJECT_IDENTIFIER)?;
            if oid.0 == COMMON_NAME {
                let tag = value.peek()?;
                let (text, _) = value.element(tag).filter(|_| TEXT.contains(&tag))?;
                let text = std::str::from_utf8(text.0).ok()?;
                return (!text.is_empty()).then(|| text.to_string());
            }
        }
    }
    None
}

/// The instance ids of the subjectAltName extension's URIs (none without that extension).
fn instance_uris(mut extensions: Der<'_>) -> Option<Vec<String>> {
    while !extensions.is_empty() {
        let (extension, rest) = extensions.element(SEQUENCE)?;
        extensions = rest;
        let (oid, mut fields) = extension.element(OBJECT_IDENTIFIER)?;
        if oid.0 != SUBJECT_ALT_NAME {
            continue;
        }
        if fields.peek() == Some(BOOLEAN) {
            fields = fields.skip()?;
        }
        let (value, _) = fields.element(OCTET_STRING)?;
        let (mut names, _) = value.element(SEQUENCE)?;
        let mut instances = Vec::new();
        while let Some(tag) = names.peek() {
            let (name, rest) = names.element(tag)?;
            names = rest;
            let uri = (tag == URI_NAME).then(|| std::str::from_utf8(name.0).ok());
            if let Some(id) = uri
                .flatten()
                .and_then(|u| u.strip_prefix(INSTANCE_URI_PREFIX))
            {
                instances.push(id.to_string());
            }
        }
        return Some(instances);
    }
    Some(Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DnType, KeyPair, SanType};

    fn certificate(common_name: Option<&str>, sans: Vec<SanType>) -> Vec<u8> {
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::OrganizationName, "kvcm tests");
        if let Some(name) = common_name {
            params.distinguished_name.push(DnType::CommonName, name);
        }
        params.subject_alt_names = sans;
        let key = KeyPair::generate().expect("key");
        params.self_signed(&key).expect("cert").der().to_vec()
    }

    fn uri(text: &str) -> SanType {
        SanType::URI(text.try_into().expect("ia5"))
    }

    #[test]
    fn the_common_name_is_the_account_and_instance_uris_the_scope() {
        let der = certificate(
            Some("engine-user"),
            vec![
                SanType::DnsName("engine-1.example".try_into().unwrap()),
                uri("urn:kvcm:instance:a"),
                uri("spiffe://cluster/engine"),
                uri("urn:kvcm:instance:b/with-slash"),
            ],
        );
        let found = identity(&der).expect("identity");
        assert_eq!(found.account, "engine-user");
        assert_eq!(found.instances, ["a", "b/with-slash"]);

        let unscoped = identity(&certificate(Some("operator"), Vec::new()));
        assert_eq!(unscoped.map(|i| i.instances), Some(Vec::new()));
    }

    #[test]
    fn a_certificate_without_a_common_name_names_no_one() {
        let der = certificate(None, vec![uri("urn:kvcm:instance:a")]);
        assert_eq!(identity(&der), None);
    }

    #[test]
    fn a_truncated_certificate_names_no_one() {
        let der = certificate(Some("engine-user"), vec![uri("urn:kvcm:instance:a")]);
        assert!(identity(&der).is_some());
        for end in 0..der.len() {
            assert_eq!(identity(&der[..end]), None, "cut at {end}");
        }
        assert_eq!(identity(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
        assert_eq!(
            identity(&[0x30, 0x85, 1, 1, 1, 1, 1]),
            None,
            "5 length bytes"
        );
    }
}
