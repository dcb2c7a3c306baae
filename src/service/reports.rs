//! The cache-subscriber RPCs of upstream trunk: ReportEvent (reporters tell which blocks
//! they hold) and GetHostCacheState (per host, how long a prefix it holds). Wire ⇄ domain
//! here, the rules in `kvcm_manager::reports`.

use kvcm_index::BlockKey;
use kvcm_manager::registration::DefaultQuery;
use kvcm_manager::reports::{
    HostMatch, HostStateQuery, ItemResult, ReportEvent, ReportOutcome, ReportRequest,
    ReportedBlock, ReportedSpec,
};
use kvcm_manager::ManagerError;
use kvcm_storage::ReportTier;

use super::meta::{take_ids, MetaHandler};
use super::rpcs;
use crate::proto::meta::{self, event_item::EventParams, ErrorCode, ReportEventType};

impl MetaHandler {
    /// ReportEvent. Header code: OK, or the first failed event's code (then `item_results`
    /// holds one code per event); a request refused as a whole has no `item_results`.
    pub fn report_event(&self, mut request: meta::ReportEventRequest) -> meta::ReportEventResponse {
        let core = &self.core;
        let (trace_id, instance_id) = take_ids(&mut request.trace_id, &mut request.instance_id);
        let mut first_failure = None;
        let rpc = &rpcs::meta::REPORT_EVENT;
        let mut reply = core.instance_call(rpc, &trace_id, &instance_id, |instance| {
            if request.events.is_empty() {
                return Ok((meta::ReportEventResponse::default(), String::new()));
            }
            let report = ReportRequest {
                tier: report_tier(request.storage_type)?,
                host: request.host_ip_port,
                events: request.events.into_iter().map(event_from_wire).collect(),
            };
            let outcome = core.manager.report_event(&instance, &report)?;
            first_failure = first_failure_of(&outcome);
            Ok((
                outcome_to_wire(outcome),
                "Events reported successfully".into(),
            ))
        });
        if let (Some((code, message)), Some(status)) = (
            first_failure,
            reply.header.as_mut().and_then(|h| h.status.as_mut()),
        ) {
            status.code = code as i32;
            status.message = message;
        }
        reply
    }

    /// GetHostCacheState.
    pub fn get_host_cache_state(
        &self,
        mut request: meta::GetHostCacheStateRequest,
    ) -> meta::GetHostCacheStateResponse {
        let core = &self.core;
        let (trace_id, instance_id) = take_ids(&mut request.trace_id, &mut request.instance_id);
        let rpc = &rpcs::meta::GET_HOST_CACHE_STATE;
        core.instance_call(rpc, &trace_id, &instance_id, |instance| {
            let matching = host_match(request.query_type, instance.info().default_query)?;
            let remote_hosts = usize::try_from(request.global_kvs_host_count)
                .map_err(|_| ManagerError::invalid_because("global_kvs_host_count", "negative"))?;
            let keys = core.request_keys(&instance, request.block_cache_keys, &[])?;
            let query = HostStateQuery {
                keys: &keys,
                mediums: &request.medium,
                remote_hosts,
                p2p: request.enable_p2p,
                matching,
            };
            let hosts = core.manager.host_cache_state(&instance, query)?;
            let hosts = hosts.into_iter().map(|host| meta::HostCacheMatch {
                host_ip_port: host.host,
                local: host.local as i64,
                global: host.global as i64,
            });
            let reply = meta::GetHostCacheStateResponse {
                header: None,
                hosts: hosts.collect(),
            };
            Ok((reply, "Host cache state retrieved successfully".into()))
        })
    }
}

/// The tier of a wire `storage_type` (ST_EVENT_REPORT_L1P5 or ST_EVENT_REPORT_L2).
fn report_tier(storage_type: i32) -> Result<ReportTier, ManagerError> {
    match meta::StorageType::try_from(storage_type) {
        Ok(meta::StorageType::StEventReportL1p5) => Ok(ReportTier::L1p5),
        Ok(meta::StorageType::StEventReportL2) => Ok(ReportTier::L2),
        _ => Err(ManagerError::invalid_because(
            "storage_type",
            format!("{storage_type} is not ST_EVENT_REPORT_L1P5 or ST_EVENT_REPORT_L2"),
        )),
    }
}

/// How GetHostCacheState matches: QT_PREFIX_MATCH or QT_PREFIX_MATCH_WITH_MAMBA, or
/// QT_UNSPECIFIED read as the instance's `default_query_type` (kvcm-defined: unset reads as
/// prefix match); any other type is refused.
fn host_match(query_type: i32, default: DefaultQuery) -> Result<HostMatch, ManagerError> {
    use meta::QueryType as Qt;
    let matching = match Qt::try_from(query_type) {
        Ok(Qt::QtPrefixMatch) => Some(HostMatch::Prefix),
        Ok(Qt::QtPrefixMatchWithMamba) => Some(HostMatch::PrefixWithMamba),
        Ok(Qt::QtUnspecified) => match default {
            DefaultQuery::Unspecified | DefaultQuery::PrefixMatch => Some(HostMatch::Prefix),
            DefaultQuery::PrefixMatchWithMamba => Some(HostMatch::PrefixWithMamba),
            DefaultQuery::BatchGet | DefaultQuery::ReverseRollSwMatch => None,
        },
        _ => None,
    };
    matching.ok_or_else(|| {
        ManagerError::invalid_because(
            "query_type",
            format!(
                "{query_type} (instance default {default:?}): GetHostCacheState answers QT_PREFIX_MATCH and QT_PREFIX_MATCH_WITH_MAMBA only"
            ),
        )
    })
}

/// A block key sent as a decimal `int64` or `uint64` (the same 64 bits: "18446744073709551615"
/// is -1); a sign `+`, white space or a value outside both ranges is refused.
fn block_key(text: &str) -> Result<BlockKey, String> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("block_key {text:?} is not a decimal integer"));
    }
    text.parse::<i64>()
        .or_else(|_| text.parse::<u64>().map(|key| key as i64))
        .map_err(|_| format!("block_key {text:?} is outside int64 and uint64"))
}

fn specs_from_wire(specs: Vec<meta::LocationSpec>) -> Vec<ReportedSpec> {
    let specs = specs.into_iter();
    specs
        .map(|s| ReportedSpec {
            name: s.name,
            uri: s.uri,
        })
        .collect()
}

fn block_from_wire(
    key: &str,
    medium: String,
    specs: Vec<meta::LocationSpec>,
) -> Result<ReportedBlock, String> {
    Ok(ReportedBlock {
        key: block_key(key)?,
        medium,
        specs: specs_from_wire(specs),
    })
}

/// The domain event of a wire item: its `event_type` must name the payload it carries.
fn event_from_wire(item: meta::EventItem) -> ReportEvent {
    use ReportEventType as T;
    let event_type = item.event_type;
    let read = match (T::try_from(event_type), item.event_params) {
        (Ok(T::EventNodeRegister), Some(EventParams::NodeRegister(p))) => {
            Ok(ReportEvent::Register { mediums: p.mediums })
        }
        (Ok(T::EventHeartbeat), Some(EventParams::Heartbeat(_))) => Ok(ReportEvent::Heartbeat),
        (Ok(T::EventHostDown), Some(EventParams::HostDown(_))) => Ok(ReportEvent::HostDown),
        (Ok(T::EventBlockAdd), Some(EventParams::BlockAdd(p))) => {
            block_from_wire(&p.block_key, p.medium, p.specs).map(ReportEvent::Add)
        }
        (Ok(T::EventBlockDelete), Some(EventParams::BlockDelete(p))) => block_key(&p.block_key)
            .map(|key| ReportEvent::Delete {
                key,
                medium: p.medium,
                spec_names: p.spec_names,
            }),
        (Ok(T::EventBlockSnapshot), Some(EventParams::BlockSnapshot(p))) => {
            let legacy_medium = p.medium;
            let blocks = p.blocks.into_iter().map(|item| {
                let medium = match item.medium.is_empty() {
                    true => legacy_medium.clone(),
                    false => item.medium,
                };
                block_from_wire(&item.block_key, medium, item.specs)
            });
            blocks.collect::<Result<_, _>>().map(ReportEvent::Snapshot)
        }
        (_, params) => Err(format!(
            "event_type {event_type} does not match its payload ({})",
            params.as_ref().map_or("none", payload_name)
        )),
    };
    read.unwrap_or_else(ReportEvent::Unreadable)
}

fn payload_name(params: &EventParams) -> &'static str {
    match params {
        EventParams::NodeRegister(_) => "node_register",
        EventParams::BlockAdd(_) => "block_add",
        EventParams::BlockDelete(_) => "block_delete",
        EventParams::HostDown(_) => "host_down",
        EventParams::Heartbeat(_) => "heartbeat",
        EventParams::BlockSnapshot(_) => "block_snapshot",
    }
}

/// The wire code of an event's result.
fn item_code(result: &ItemResult) -> ErrorCode {
    match result {
        ItemResult::Ok => ErrorCode::Ok,
        ItemResult::Invalid(_) => ErrorCode::InvalidArgument,
        ItemResult::NotRegistered => ErrorCode::NodeNotRegistered,
        ItemResult::SnapshotInProgress => ErrorCode::SnapshotInProgress,
        ItemResult::RateLimited { .. } => ErrorCode::SnapshotRateLimited,
        ItemResult::SnapshotRequired => ErrorCode::SnapshotRequired,
    }
}

/// The header of a partly failed request: the first failure's code and why.
fn first_failure_of(outcome: &ReportOutcome) -> Option<(ErrorCode, String)> {
    let (index, result) = outcome
        .results
        .iter()
        .enumerate()
        .find(|(_, result)| **result != ItemResult::Ok)?;
    let why = match result {
        ItemResult::Invalid(why) => why.clone(),
        ItemResult::NotRegistered => {
            "the reporter is unregistered: send EVENT_NODE_REGISTER first".into()
        }
        ItemResult::SnapshotInProgress => {
            "another snapshot of the reporter runs, or the wait for it timed out".into()
        }
        ItemResult::RateLimited { retry_after_ms } => {
            format!("the last snapshot was too recent: retry after {retry_after_ms} ms")
        }
        ItemResult::SnapshotRequired => "the reporter changed while the snapshot waited".into(),
        ItemResult::Ok => String::new(),
    };
    let message = format!("ReportEvent partially failed: event {index}: {why}");
    Some((item_code(result), message))
}

fn outcome_to_wire(outcome: ReportOutcome) -> meta::ReportEventResponse {
    let failed = outcome
        .results
        .iter()
        .any(|result| *result != ItemResult::Ok);
    let item_results = match failed {
        true => outcome
            .results
            .iter()
            .map(|r| item_code(r) as i32)
            .collect(),
        false => Vec::new(),
    };
    meta::ReportEventResponse {
        header: None,
        item_results,
        committed_snapshot_version: outcome
            .generation
            .map(|generation| format!("{generation:032x}"))
            .unwrap_or_default(),
        retry_after_ms: outcome
            .results
            .iter()
            .find_map(|result| match result {
                ItemResult::RateLimited { retry_after_ms } => Some(*retry_after_ms),
                _ => None,
            })
            .unwrap_or(0),
        snapshot_required: outcome.snapshot_required,
        extra_info: outcome.extra_info,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_keys_read_as_int64_or_uint64_decimals() {
        assert_eq!(block_key("123"), Ok(123));
        assert_eq!(block_key("-1"), Ok(-1));
        assert_eq!(block_key("18446744073709551615"), Ok(-1));
        assert_eq!(block_key("9223372036854775808"), Ok(i64::MIN));
        assert_eq!(block_key("-9223372036854775808"), Ok(i64::MIN));
        for bad in [
            "",
            "-",
            "+1",
            " 1",
            "1 ",
            "0x10",
            "18446744073709551616",
            "-9223372036854775809",
            "1.0",
        ] {
            assert!(block_key(bad).is_err(), "{bad:?}");
        }
    }
}
