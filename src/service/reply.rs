//! Response headers: every response message of the three packages gets its status and
//! request id through one trait, so the call machinery stays generic.

use crate::proto::{admin, debug, meta};

/// A response message with a `header`.
pub trait Reply: Default {
    /// Sets `header.status` and `header.request_id`.
    fn set_header(&mut self, code: meta::ErrorCode, message: String, request_id: String);

    /// Sets `header.tracer_result` (only meta headers have one).
    fn set_tracer_result(&mut self, _tracer_result: String) {}

    /// `header.status.code` and `header.request_id`, once set.
    fn status(&self) -> Option<(i32, &str)>;
}

macro_rules! meta_replies {
    ($($response:ty),* $(,)?) => {$(
        impl Reply for $response {
            fn set_header(&mut self, code: meta::ErrorCode, message: String, request_id: String) {
                self.header = Some(meta::CommonResponseHeader {
                    status: Some(meta::Status { code: code as i32, message }),
                    request_id,
                    tracer_result: String::new(),
                });
            }

            fn set_tracer_result(&mut self, tracer_result: String) {
                if let Some(header) = self.header.as_mut() {
                    header.tracer_result = tracer_result;
                }
            }

            fn status(&self) -> Option<(i32, &str)> {
                let header = self.header.as_ref()?;
                Some((header.status.as_ref()?.code, &header.request_id))
            }
        }
    )*};
}

macro_rules! plain_replies {
    ($package:ident: $($response:ty),* $(,)?) => {$(
        impl Reply for $response {
            fn set_header(&mut self, code: meta::ErrorCode, message: String, request_id: String) {
                self.header = Some($package::CommonResponseHeader {
                    status: Some($package::Status { code: code as i32, message }),
                    request_id,
                });
            }

            fn status(&self) -> Option<(i32, &str)> {
                let header = self.header.as_ref()?;
                Some((header.status.as_ref()?.code, &header.request_id))
            }
        }
    )*};
}

meta_replies!(
    meta::CommonResponse,
    meta::RegisterInstanceResponse,
    meta::GetInstanceInfoResponse,
    meta::GetCacheMetaResponse,
    meta::GetCacheLocationResponse,
    meta::StartWriteCacheResponse,
    meta::GetClusterInfoResponse,
    meta::GetCacheLocationLenResponse,
    meta::ReportEventResponse,
    meta::GetHostCacheStateResponse,
    meta::GetCacheLocationsByBackendResponse,
);

plain_replies!(admin:
    admin::CommonResponse,
    admin::ListStorageResponse,
    admin::GetInstanceGroupResponse,
    admin::GetCacheMetaResponse,
    admin::GetInstanceInfoResponse,
    admin::ListInstanceInfoResponse,
    admin::ListAccountResponse,
    admin::ConfigSnapShotResponse,
    admin::GetMetricsResponse,
    admin::CheckHealthResponse,
    admin::GetManagerClusterInfoResponse,
    admin::GetLeaderElectorConfigResponse,
    admin::ListInstanceGroupResponse,
    admin::ListAdminAuthTokensResponse,
    admin::CreateApiKeyResponse,
    admin::ListApiKeysResponse,
);

plain_replies!(debug: debug::CommonResponse);
