//! The conformance suite on the `verbs` provider. It runs only where the crate is built
//! with feature `rdma` and the host has an RDMA device (a NIC, or kernel soft-RoCE: see
//! docs/transport.md); otherwise the test says loudly that it skipped and why.
//! `KVCM_VERBS_DEVICE` and `KVCM_VERBS_GID_INDEX` select the device and GID index.

mod conformance;

#[cfg(feature = "rdma")]
mod verbs {
    use super::conformance::{self, shout};
    use kvcm_transport::verbs::{VerbsConfig, VerbsDomain};
    use kvcm_transport::TransportError;

    fn config() -> VerbsConfig {
        VerbsConfig {
            device: std::env::var("KVCM_VERBS_DEVICE").ok(),
            port: 1,
            gid_index: std::env::var("KVCM_VERBS_GID_INDEX")
                .ok()
                .and_then(|i| i.parse().ok())
                .unwrap_or(0),
        }
    }

    fn open() -> VerbsDomain {
        VerbsDomain::open(&config()).expect("open verbs domain")
    }

    #[test]
    fn verbs_conformance_suite_or_loud_skip() {
        match VerbsDomain::open(&config()) {
            Err(TransportError::NoDevice(why)) => {
                shout(&format!(
                    "SKIPPED verbs conformance suite: no RDMA device ({why})"
                ));
                assert!(!why.is_empty(), "NoDevice must say why no device was found");
                return;
            }
            Err(other) => panic!("opening the verbs device failed: {other}"),
            Ok(domain) => shout(&format!(
                "running the verbs conformance suite on {}",
                domain.device_name()
            )),
        }
        crate::with_case_names!(conformance_run_all!(VerbsDomain, open));
    }
}

#[cfg(not(feature = "rdma"))]
#[test]
fn verbs_conformance_suite_skipped_feature_rdma_off() {
    conformance::shout("SKIPPED verbs conformance suite: built without feature `rdma`");
}
