//! MetaService: the engine-facing RPCs (wire fact sheet §3, §8). Each handler converts the
//! wire request into one manager call; status, gates and metrics come from [`Core`].

use std::sync::Arc;

use kvcm_manager::{CacheLookup, Instance, ManagerError};

use super::auth::authorize;
use super::convert::{
    cache_meta_to_wire, checksums_from_wire, location_to_wire, mask_from_wire, mask_to_wire,
    query_kind, trim_strategy, view_to_wire,
};
use super::core::{Core, Outcome};
use super::location_json::LocationsJson;
use super::reply::Reply;
use super::rpcs::{self, Access, Service};
use super::wire_admin::{instance_info_to_wire, registration_from_wire};
use crate::lookup::messages::Request;
use crate::proto::{meta, storage};

/// Handlers of MetaService.
#[derive(Debug, Clone)]
pub struct MetaHandler {
    pub(super) core: Arc<Core>,
}

impl MetaHandler {
    /// Handlers over the shared core.
    pub fn new(core: Arc<Core>) -> Self {
        MetaHandler { core }
    }

    /// What one request may ask for (`kvcm.service.max_keys_per_request`, ...).
    pub fn request_limits(&self) -> crate::config::RequestLimits {
        self.core.limits
    }

    /// The answer to a message-path Authenticate: OK when `credential` (an API key or admin
    /// token) is valid now (or none is required), INVALID_ARGUMENT saying why not.
    pub fn check_credential(&self, credential: Option<&[u8]>) -> meta::CommonResponse {
        let mut reply = meta::CommonResponse::default();
        match self.core.auth.check_token(Service::Meta, credential) {
            Ok(_) => reply.set_header(meta::ErrorCode::Ok, String::new(), String::new()),
            Err(refusal) => {
                let why = refusal.to_string();
                reply.set_header(meta::ErrorCode::InvalidArgument, why, String::new())
            }
        }
        reply
    }

    /// Whether a message-path request may run with the queue pair's `credential` (always,
    /// while no credential is required): the same rule as its RPC on gRPC, for every
    /// instance it names.
    pub fn message_allowed(&self, credential: Option<&[u8]>, request: &Request) -> bool {
        let Ok(caller) = self.core.auth.check_token(Service::Meta, credential) else {
            return false;
        };
        let may = |instance_id: &str| {
            authorize(caller.as_ref(), Access::Client, Some(instance_id)).is_ok()
        };
        match request {
            Request::StartWrite(r) => may(&r.instance_id),
            Request::FinishWrite(r) => may(&r.instance_id),
            Request::Remove(r) => may(&r.instance_id),
            Request::Reads(lookups) => lookups.iter().all(|r| may(&r.instance_id)),
            Request::Authenticate(_) => true,
        }
    }

    /// RegisterInstance.
    pub fn register_instance(
        &self,
        request: meta::RegisterInstanceRequest,
    ) -> meta::RegisterInstanceResponse {
        let trace_id = request.trace_id.clone();
        self.core
            .call(&rpcs::meta::REGISTER_INSTANCE, &trace_id, || {
                register_instance(&self.core, request)
            })
    }

    /// GetInstanceInfo.
    pub fn get_instance_info(
        &self,
        request: meta::GetInstanceInfoRequest,
    ) -> meta::GetInstanceInfoResponse {
        self.core
            .call(&rpcs::meta::GET_INSTANCE_INFO, &request.trace_id, || {
                if request.instance_id.is_empty() {
                    return Err(ManagerError::invalid("instance_id"));
                }
                let instance = self.core.manager.require_instance(&request.instance_id)?;
                let reply = meta::GetInstanceInfoResponse {
                    header: None,
                    instance_group: instance.group().to_string(),
                    instance_info: Some(instance_info_to_wire(instance.info())),
                };
                Ok((reply, String::new()))
            })
    }

    /// GetCacheMeta.
    pub fn get_cache_meta(
        &self,
        mut request: meta::GetCacheMetaRequest,
    ) -> meta::GetCacheMetaResponse {
        let core = &self.core;
        let (trace_id, instance_id) = take_ids(&mut request.trace_id, &mut request.instance_id);
        core.instance_call(
            &rpcs::meta::GET_CACHE_META,
            &trace_id,
            &instance_id,
            move |instance| get_cache_meta(core, &instance, request),
        )
    }

    /// GetCacheLocation.
    pub fn get_cache_location(
        &self,
        request: meta::GetCacheLocationRequest,
    ) -> meta::GetCacheLocationResponse {
        self.look_up(request, |lookup| meta::GetCacheLocationResponse {
            header: None,
            locations: lookup.locations().map(|view| view_to_wire(&view)).collect(),
        })
    }

    /// GetCacheLocation answered in JSON (the HTTP route): the same call as
    /// [`MetaHandler::get_cache_location`], printed straight from the lookup.
    pub fn get_cache_location_json(&self, request: meta::GetCacheLocationRequest) -> LocationsJson {
        self.look_up(request, LocationsJson::of)
    }

    /// GetCacheLocationLen (trunk): GetCacheLocation's lookup, answering only how many
    /// keys it hits.
    pub fn get_cache_location_len(
        &self,
        request: meta::GetCacheLocationLenRequest,
    ) -> meta::GetCacheLocationLenResponse {
        let lookup = meta::GetCacheLocationRequest {
            trace_id: request.trace_id,
            instance_id: request.instance_id,
            query_type: request.query_type,
            block_keys: request.block_keys,
            token_ids: request.token_ids,
            block_mask: None,
            sw_size: request.sw_size,
            location_spec_names: Vec::new(),
        };
        let rpc = &rpcs::meta::GET_CACHE_LOCATION_LEN;
        self.look_up_as(rpc, lookup, |lookup| meta::GetCacheLocationLenResponse {
            header: None,
            cache_location_len: lookup.hit_count() as i64,
        })
    }

    /// GetCacheLocation's call, its answer built by `answer` from the lookup.
    fn look_up<R: Reply>(
        &self,
        request: meta::GetCacheLocationRequest,
        answer: impl FnOnce(&CacheLookup<'_>) -> R,
    ) -> R {
        self.look_up_as(&rpcs::meta::GET_CACHE_LOCATION, request, answer)
    }

    /// A lookup served as `rpc` (GetCacheLocation or GetCacheLocationLen). Only a
    /// GetCacheLocation goes to the event log: it records reads, and a GetCacheLocationLen is
    /// a router's estimate that reads nothing.
    fn look_up_as<R: Reply>(
        &self,
        rpc: &'static rpcs::Rpc,
        mut request: meta::GetCacheLocationRequest,
        answer: impl FnOnce(&CacheLookup<'_>) -> R,
    ) -> R {
        let core = &self.core;
        let (trace_id, instance_id) = take_ids(&mut request.trace_id, &mut request.instance_id);
        core.instance_call(rpc, &trace_id, &instance_id, move |instance| {
            let (block_keys, tokens) = (request.block_keys, &request.token_ids);
            let keys = if *rpc == rpcs::meta::GET_CACHE_LOCATION {
                core.located_keys(&instance, block_keys, tokens)?
            } else {
                core.request_keys(&instance, block_keys, tokens)?
            };
            let kind = query_kind(request.query_type, request.sw_size)?;
            let mask = mask_from_wire(request.block_mask.as_ref(), "block_mask")?;
            let lookup = core.manager.lookup_cache_locations(
                &instance,
                kind,
                &keys,
                &mask,
                &request.location_spec_names,
            )?;
            let reply = answer(&lookup);
            if *rpc == rpcs::meta::GET_CACHE_LOCATION {
                core.record_lookup(&instance, &keys, &request.token_ids);
            }
            Ok((reply, "Cache locations retrieved successfully".into()))
        })
    }

    /// StartWriteCache.
    pub fn start_write_cache(
        &self,
        mut request: meta::StartWriteCacheRequest,
    ) -> meta::StartWriteCacheResponse {
        let core = &self.core;
        let (trace_id, instance_id) = take_ids(&mut request.trace_id, &mut request.instance_id);
        core.instance_call(
            &rpcs::meta::START_WRITE_CACHE,
            &trace_id,
            &instance_id,
            move |instance| {
                let min_replicas = usize::try_from(request.min_replica_count)
                    .map_err(|_| ManagerError::invalid_because("min_replica_count", "negative"))?;
                let keys = core.located_keys(&instance, request.block_keys, &request.token_ids)?;
                let event_keys = core.events.keys_if_enabled(&keys);
                let started = core.manager.start_write_replicas(
                    &instance,
                    keys,
                    &request.location_spec_group_names,
                    request.write_timeout_seconds,
                    min_replicas,
                )?;
                core.events.write_started(&instance, event_keys, &started);
                let message = match &started.refused {
                    None => "Write session started successfully".to_string(),
                    Some(why) => format!(
                        "Write session started; blocks without a location were refused: {why}"
                    ),
                };
                let reply = meta::StartWriteCacheResponse {
                    header: None,
                    write_session_id: started.session_id,
                    block_mask: Some(mask_to_wire(started.mask)),
                    locations: started
                        .locations
                        .into_iter()
                        .map(|location| location_to_wire(&instance, location))
                        .collect(),
                };
                Ok((reply, message))
            },
        )
    }

    /// Lookups a client answered from the published table, reported afterwards (the `Reads`
    /// message, src/lookup/messages.rs): each counts as a served GetCacheLocation counts —
    /// its keys touch the access clock, it reaches the event log and the live capacity
    /// curves. A lookup of an unknown instance or with keys the server would refuse is
    /// skipped; the answer's message says how many counted. Not the leader: SERVER_NOT_LEADER,
    /// nothing counted.
    pub fn record_table_lookups(
        &self,
        lookups: Vec<meta::GetCacheLocationRequest>,
    ) -> meta::CommonResponse {
        let core = &self.core;
        let mut reply = meta::CommonResponse::default();
        if !core.manager.leadership().is_leader() {
            let why = "not the leader: lookups are counted by the leader".to_string();
            reply.set_header(meta::ErrorCode::ServerNotLeader, why, String::new());
            return reply;
        }
        let total = lookups.len();
        let mut counted = 0;
        for request in lookups {
            let Some(instance) = core.manager.instance(&request.instance_id) else {
                continue;
            };
            let keys = core.request_keys(&instance, request.block_keys, &request.token_ids);
            let Ok(keys) = keys else {
                continue;
            };
            instance.access().touch(&keys);
            core.record_lookup(&instance, &keys, &request.token_ids);
            counted += 1;
        }
        let message = format!("{counted} of {total} lookups recorded");
        reply.set_header(meta::ErrorCode::Ok, message, String::new());
        reply
    }

    /// Abandons a write session whose answer could not be delivered (see
    /// `Manager::abandon_write`); false when the instance or session is unknown.
    pub fn abandon_write_session(&self, instance_id: &str, session_id: &str) -> bool {
        let Some(instance) = self.core.manager.instance(instance_id) else {
            return false;
        };
        match self.core.manager.abandon_write(&instance, session_id) {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(%error, "abandoning a write session");
                false
            }
        }
    }

    /// FinishWriteCache.
    pub fn finish_write_cache(
        &self,
        mut request: meta::FinishWriteCacheRequest,
    ) -> meta::CommonResponse {
        let core = &self.core;
        let (trace_id, instance_id) = take_ids(&mut request.trace_id, &mut request.instance_id);
        core.instance_call(
            &rpcs::meta::FINISH_WRITE_CACHE,
            &trace_id,
            &instance_id,
            move |instance| {
                if request.write_session_id.is_empty() {
                    return Err(ManagerError::invalid("write_session_id"));
                }
                let Some(success) = request.success_blocks.as_ref() else {
                    return Err(ManagerError::invalid("success_blocks"));
                };
                let success = mask_from_wire(Some(success), "success_blocks")?;
                let checksums = checksums_from_wire(&request.locations)?;
                let committed = core.manager.finish_write_with_checksums(
                    &instance,
                    &request.write_session_id,
                    &success,
                    &checksums,
                )?;
                let session = &request.write_session_id;
                core.events.write_finished(&instance, session, committed);
                Ok((
                    meta::CommonResponse::default(),
                    "Write session finished successfully".into(),
                ))
            },
        )
    }

    /// RemoveCache.
    pub fn remove_cache(&self, mut request: meta::RemoveCacheRequest) -> meta::CommonResponse {
        let core = &self.core;
        let (trace_id, instance_id) = take_ids(&mut request.trace_id, &mut request.instance_id);
        core.instance_call(
            &rpcs::meta::REMOVE_CACHE,
            &trace_id,
            &instance_id,
            move |instance| remove_cache(core, &instance, request),
        )
    }

    /// TrimCache.
    pub fn trim_cache(&self, mut request: meta::TrimCacheRequest) -> meta::CommonResponse {
        let core = &self.core;
        let (trace_id, instance_id) = take_ids(&mut request.trace_id, &mut request.instance_id);
        core.instance_call(
            &rpcs::meta::TRIM_CACHE,
            &trace_id,
            &instance_id,
            move |instance| {
                let strategy = trim_strategy(request.strategy)?;
                core.manager.trim_cache(&instance, strategy)?;
                Ok((
                    meta::CommonResponse::default(),
                    "Cache trimmed successfully".into(),
                ))
            },
        )
    }

    /// GetClusterInfo: leader discovery on the meta port; any node answers, from the lock.
    pub fn get_cluster_info(
        &self,
        request: meta::GetClusterInfoRequest,
    ) -> meta::GetClusterInfoResponse {
        self.core
            .call(&rpcs::meta::GET_CLUSTER_INFO, &request.trace_id, || {
                let leadership = self.core.manager.leadership();
                let leader = leadership.leader().map(|holder| holder.endpoint);
                let reply = meta::GetClusterInfoResponse {
                    header: None,
                    self_node_id: leadership.node_id().to_string(),
                    leader_node_id: leader
                        .as_ref()
                        .map_or_else(String::new, |e| e.node_id.clone()),
                    leader_endpoint: leader.map(|endpoint| meta::MetaNodeEndpoint {
                        node_id: endpoint.node_id,
                        host: endpoint.host,
                        meta_rpc_port: i32::from(endpoint.rpc_port),
                        meta_http_port: i32::from(endpoint.http_port),
                        custom_info: endpoint.custom_info,
                    }),
                };
                Ok((reply, String::new()))
            })
    }
}

/// Moves the trace and instance ids out of a request (the rest moves into the call).
pub(super) fn take_ids(trace_id: &mut String, instance_id: &mut String) -> (String, String) {
    (std::mem::take(trace_id), std::mem::take(instance_id))
}

/// RegisterInstance's manager call (shared with the admin service).
pub fn register_instance(
    core: &Core,
    request: meta::RegisterInstanceRequest,
) -> Outcome<meta::RegisterInstanceResponse> {
    let info = registration_from_wire(request)?;
    let instance_id = info.instance_id.clone();
    let statuses = core.manager.register_instance(info)?;
    // Upstream trunk: the group's extra_info (of the group the instance is registered in).
    let extra_info = core
        .manager
        .instance(&instance_id)
        .and_then(|instance| core.manager.group(instance.group()).ok())
        .map(|group| group.extra_info.clone())
        .unwrap_or_default();
    let reply = meta::RegisterInstanceResponse {
        header: None,
        storage_configs: storage::storage_configs_json(&statuses),
        extra_info,
    };
    Ok((reply, "Instance registered successfully".into()))
}

/// GetCacheMeta's manager call (shared with the admin service).
pub fn get_cache_meta(
    core: &Core,
    instance: &Instance,
    request: meta::GetCacheMetaRequest,
) -> Outcome<meta::GetCacheMetaResponse> {
    let mask = mask_from_wire(request.block_mask.as_ref(), "block_mask")?;
    let keys = core.located_keys(instance, request.block_keys, &request.token_ids)?;
    let found = core.manager.get_cache_meta(instance, &keys, &mask)?;
    let (locations, metas) = found
        .into_iter()
        .map(|entry| cache_meta_to_wire(instance, entry))
        .unzip();
    let reply = meta::GetCacheMetaResponse {
        header: None,
        locations,
        metas,
    };
    Ok((reply, "Cache meta retrieved successfully".into()))
}

/// RemoveCache's manager call (shared with the admin service).
pub fn remove_cache(
    core: &Core,
    instance: &Arc<Instance>,
    request: meta::RemoveCacheRequest,
) -> Outcome<meta::CommonResponse> {
    let keys = core.request_keys(instance, request.block_keys, &request.token_ids)?;
    core.manager.remove_cache(instance, &keys)?;
    Ok((
        meta::CommonResponse::default(),
        "Cache removed successfully".into(),
    ))
}
