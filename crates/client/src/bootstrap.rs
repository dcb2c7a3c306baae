//! Asks a server where an instance's table is: one POST of `/kvcm/v1/lookupBootstrap`
//! (`kvcm::http_json`).

use std::net::SocketAddr;
use std::time::Duration;

use kvcm::lookup::{BootstrapAnswer, BootstrapRequest, ROUTE};
use kvcm::tls_client::TlsClient;

use crate::error::FastError;

/// Connect and read deadline.
const DEADLINE: Duration = Duration::from_secs(5);

/// The bootstrap answer of the server at `http` for `instance_id`, asked with `api_key`
/// (over `tls` when given).
pub(crate) fn fetch(
    http: SocketAddr,
    instance_id: &str,
    api_key: Option<&str>,
    tls: Option<&TlsClient>,
) -> Result<BootstrapAnswer, FastError> {
    let request = BootstrapRequest {
        instance_id: instance_id.to_string(),
    };
    kvcm::http_json::post_json_with(http, ROUTE, &request, DEADLINE, api_key, tls)
        .map_err(|e| FastError::Broken(format!("bootstrap: {e}")))
}
