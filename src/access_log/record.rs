//! [`AccessRecord`]: the facts of one served call, as the request path hands them to the
//! log's thread, and the JSON line the thread makes of them.
//!
//! A line (kvcm-defined, with the reference's field names where it has them):
//! `{"request_begin_time":"2026-12-03T15:24:31.123456Z","ts_us":…,"client_ip":"127.0.0.1",
//! "client_port":40112,"transport":"grpc","service":"meta","api_name":"GetCacheLocation",
//! "caller":null,"trace_id":"…","request_id":"…","status_code":1,"http_status":200,
//! "request_cost_time_us":87,"request":{…},"response":{…}}`. `caller` is the fingerprint of
//! the admin token that authenticated the call (`null`: none was presented or required). `status_code` is the header's
//! wire code, `null` when the edge refused the call before a handler ran (an HTTP body that
//! is too large, too slow or not JSON: see `http_status`); `http_status` is `null` on gRPC;
//! `client_ip` / `client_port` are `null` when the peer address is unknown; `request` and
//! `response` are `{}` unless `kvcm.access_log.bodies` is on.

use std::borrow::Cow;
use std::net::SocketAddr;

use serde::Serialize;
use serde_json::Value;

use super::redact::redact;
use crate::service::rpcs::Service;

/// The transport a call came over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// gRPC (tonic).
    Grpc,
    /// HTTP JSON.
    Http,
}

/// One served call.
#[derive(Debug, Clone, PartialEq)]
pub struct AccessRecord {
    /// When the call began (µs since the Unix epoch).
    pub begin_us: u64,
    /// The peer, when known.
    pub client: Option<SocketAddr>,
    /// Its transport.
    pub transport: Transport,
    /// The RPC's service.
    pub service: Service,
    /// The RPC's name (the path of a request refused before its RPC was known).
    pub api_name: Cow<'static, str>,
    /// The fingerprint of the admin token that authenticated the call.
    pub caller: Option<String>,
    /// The request's trace id ("" when no handler saw it).
    pub trace_id: String,
    /// The answer's header code (`None`: refused before a handler ran).
    pub status_code: Option<i32>,
    /// The answer's request id.
    pub request_id: String,
    /// The HTTP status (HTTP only).
    pub http_status: Option<u16>,
    /// From the call's start to its answer being ready, µs.
    pub cost_us: u64,
    /// The request's JSON (`kvcm.access_log.bodies`), possibly the truncation marker.
    pub request: Option<Vec<u8>>,
    /// The response's JSON, likewise.
    pub response: Option<Vec<u8>>,
}

#[derive(Serialize)]
struct Line<'a> {
    request_begin_time: String,
    ts_us: u64,
    client_ip: Option<String>,
    client_port: Option<u16>,
    transport: Transport,
    service: &'static str,
    api_name: &'a str,
    caller: Option<&'a str>,
    trace_id: &'a str,
    request_id: &'a str,
    status_code: Option<i32>,
    http_status: Option<u16>,
    request_cost_time_us: u64,
    request: Value,
    response: Value,
}

/// The JSON line of a record (secrets in its bodies redacted).
pub fn line_of(record: AccessRecord) -> Vec<u8> {
    let service = match record.service {
        Service::Meta => "meta",
        Service::Admin => "admin",
        Service::Debug => "debug",
    };
    let line = Line {
        request_begin_time: rfc3339_micros(record.begin_us),
        ts_us: record.begin_us,
        client_ip: record.client.map(|client| client.ip().to_string()),
        client_port: record.client.map(|client| client.port()),
        transport: record.transport,
        service,
        api_name: &record.api_name,
        caller: record.caller.as_deref(),
        trace_id: &record.trace_id,
        request_id: &record.request_id,
        status_code: record.status_code,
        http_status: record.http_status,
        request_cost_time_us: record.cost_us,
        request: body_value(record.request.as_deref()),
        response: body_value(record.response.as_deref()),
    };
    // A line holds only strings, numbers and parsed JSON values: it always serialises.
    serde_json::to_vec(&line).unwrap_or_default()
}

/// A logged body: `{}` when none; the redacted JSON; or, for bytes that are not JSON (a
/// refused HTTP body), their size.
fn body_value(body: Option<&[u8]>) -> Value {
    let Some(bytes) = body else {
        return Value::Object(Default::default());
    };
    match serde_json::from_slice::<Value>(bytes) {
        Ok(mut value) => {
            redact(&mut value);
            value
        }
        Err(_) => serde_json::json!({ "kvcm_unparsed_bytes": bytes.len() }),
    }
}

/// `YYYY-MM-DDTHH:MM:SS.ffffffZ` of a time in µs since the Unix epoch (UTC).
pub fn rfc3339_micros(micros: u64) -> String {
    let seconds = micros / 1_000_000;
    let (days, second_of_day) = (seconds / 86_400, seconds % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        second_of_day / 3600,
        second_of_day / 60 % 60,
        second_of_day % 60,
        micros % 1_000_000
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01: shift the epoch to 0000-03-01 so
/// that a leap day ends its year, split into 400-year eras of 146 097 days, then into years
/// of the era and days of the year (March first).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let shifted = days + 719_468;
    let era = shifted / 146_097;
    let day_of_era = shifted % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = era * 400 + year_of_era + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_render_as_utc_rfc3339_with_microseconds() {
        assert_eq!(rfc3339_micros(0), "1970-01-01T00:00:00.000000Z");
        // 2000-02-29 (a leap day of a century leap year), 23:59:59.000001.
        assert_eq!(
            rfc3339_micros(951_868_799_000_001),
            "2000-02-29T23:59:59.000001Z"
        );
        assert_eq!(
            rfc3339_micros(1_796_311_471_123_456),
            "2026-12-03T15:24:31.123456Z"
        );
        assert_eq!(
            rfc3339_micros(4_107_542_400_000_000),
            "2100-03-01T00:00:00.000000Z"
        );
    }

    #[test]
    fn a_line_carries_every_field_and_redacted_bodies() {
        let record = AccessRecord {
            begin_us: 1_796_311_471_123_456,
            client: Some("10.1.2.3:4567".parse().unwrap()),
            transport: Transport::Http,
            service: Service::Admin,
            api_name: "AddAccount".into(),
            caller: Some("e40c292c".into()),
            trace_id: "t-1".into(),
            status_code: Some(0),
            request_id: "t-1_17".into(),
            http_status: Some(200),
            cost_us: 42,
            request: Some(br#"{"user_name":"u","password":"p"}"#.to_vec()),
            response: Some(b"not json".to_vec()),
        };
        let line: Value = serde_json::from_slice(&line_of(record)).unwrap();
        assert_eq!(
            line,
            serde_json::json!({
                "request_begin_time": "2026-12-03T15:24:31.123456Z",
                "ts_us": 1_796_311_471_123_456u64,
                "client_ip": "10.1.2.3",
                "client_port": 4567,
                "transport": "http",
                "service": "admin",
                "api_name": "AddAccount",
                "caller": "e40c292c",
                "trace_id": "t-1",
                "request_id": "t-1_17",
                "status_code": 0,
                "http_status": 200,
                "request_cost_time_us": 42,
                "request": {"user_name": "u", "password": "<redacted>"},
                "response": {"kvcm_unparsed_bytes": 8},
            })
        );
    }
}
