//! AdminService (wire fact sheet §4, §16): storages, groups, instances, accounts, HA and
//! metrics. Admin rules: validation failures are INVALID_ARGUMENT, every other manager
//! failure INTERNAL_ERROR.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use kvcm_manager::leader::NodeEndpoint;
use kvcm_manager::password::StoredPassword;
use kvcm_manager::{Account, GroupConfig, ManagerError, NewApiKey};

use super::auth::TokenChangeError;
use super::convert::transcode;
use super::core::{Core, Outcome};
use super::meta as meta_calls;
use super::rpcs;
use super::wire_admin::{
    account_role, account_role_number, group_from_wire, group_to_wire, instance_info_to_wire,
};
use crate::proto::{admin, meta, storage as wire_storage};

/// Handlers of AdminService.
#[derive(Debug, Clone)]
pub struct AdminHandler {
    pub(super) core: Arc<Core>,
}

/// An admin call that answers a plain CommonResponse.
fn done(message: &str) -> Outcome<admin::CommonResponse> {
    Ok((admin::CommonResponse::default(), message.to_string()))
}

fn missing(field: &'static str) -> ManagerError {
    ManagerError::invalid(field)
}

/// The domain group of a request's wire group.
fn requested_group(group: Option<&admin::InstanceGroup>) -> Result<GroupConfig, ManagerError> {
    let group = group.ok_or_else(|| missing("instance_group"))?;
    group_from_wire(group.clone())
}

/// The typed config of a request's wire storage config.
fn storage_from_wire(
    storage: Option<&admin::StorageConfig>,
) -> Result<kvcm_storage::StorageConfig, ManagerError> {
    let storage = storage.ok_or_else(|| missing("storage"))?;
    wire_storage::from_wire(storage)
        .map_err(|error| ManagerError::invalid_because("storage", error.to_string()))
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn node_endpoint_to_wire(endpoint: NodeEndpoint) -> admin::NodeEndpoint {
    admin::NodeEndpoint {
        node_id: endpoint.node_id,
        host: endpoint.host,
        meta_rpc_port: i32::from(endpoint.rpc_port),
        meta_http_port: i32::from(endpoint.http_port),
        admin_rpc_port: i32::from(endpoint.admin_rpc_port),
        admin_http_port: i32::from(endpoint.admin_http_port),
        custom_info: endpoint.custom_info,
    }
}

impl AdminHandler {
    /// Handlers over the shared core.
    pub fn new(core: Arc<Core>) -> Self {
        AdminHandler { core }
    }

    fn call<R: super::reply::Reply>(
        &self,
        rpc: &'static rpcs::Rpc,
        trace_id: &str,
        op: impl FnOnce(&Core) -> Outcome<R>,
    ) -> R {
        self.core.call(rpc, trace_id, || op(&self.core))
    }

    /// AddStorage.
    pub fn add_storage(&self, request: admin::AddStorageRequest) -> admin::CommonResponse {
        self.call(&rpcs::admin::ADD_STORAGE, &request.trace_id, |core| {
            core.manager
                .add_storage(storage_from_wire(request.storage.as_ref())?)?;
            done("Storage added successfully")
        })
    }

    /// EnableStorage.
    pub fn enable_storage(&self, request: admin::EnableStorageRequest) -> admin::CommonResponse {
        self.call(&rpcs::admin::ENABLE_STORAGE, &request.trace_id, |core| {
            core.manager
                .set_storage_available(&request.storage_unique_name, true)?;
            done("Storage enabled successfully")
        })
    }

    /// DisableStorage.
    pub fn disable_storage(&self, request: admin::DisableStorageRequest) -> admin::CommonResponse {
        self.call(&rpcs::admin::DISABLE_STORAGE, &request.trace_id, |core| {
            core.manager
                .set_storage_available(&request.storage_unique_name, false)?;
            done("Storage disabled successfully")
        })
    }

    /// RemoveStorage.
    pub fn remove_storage(&self, request: admin::RemoveStorageRequest) -> admin::CommonResponse {
        self.call(&rpcs::admin::REMOVE_STORAGE, &request.trace_id, |core| {
            core.manager.remove_storage(&request.storage_unique_name)?;
            done("Storage removed successfully")
        })
    }

    /// UpdateStorage.
    pub fn update_storage(&self, request: admin::UpdateStorageRequest) -> admin::CommonResponse {
        self.call(&rpcs::admin::UPDATE_STORAGE, &request.trace_id, |core| {
            core.manager
                .update_storage(storage_from_wire(request.storage.as_ref())?)?;
            done("Storage updated successfully")
        })
    }

    /// ListStorage.
    pub fn list_storage(&self, request: admin::ListStorageRequest) -> admin::ListStorageResponse {
        self.call(&rpcs::admin::LIST_STORAGE, &request.trace_id, |core| {
            let storage = core
                .manager
                .list_storages()
                .iter()
                .map(wire_storage::to_wire)
                .collect();
            Ok((
                admin::ListStorageResponse {
                    header: None,
                    storage,
                },
                String::new(),
            ))
        })
    }

    /// CreateInstanceGroup.
    pub fn create_instance_group(
        &self,
        request: admin::CreateInstanceGroupRequest,
    ) -> admin::CommonResponse {
        self.call(
            &rpcs::admin::CREATE_INSTANCE_GROUP,
            &request.trace_id,
            |core| {
                core.manager
                    .create_group(requested_group(request.instance_group.as_ref())?)?;
                done("Instance group created successfully")
            },
        )
    }

    /// UpdateInstanceGroup.
    pub fn update_instance_group(
        &self,
        request: admin::UpdateInstanceGroupRequest,
    ) -> admin::CommonResponse {
        self.call(
            &rpcs::admin::UPDATE_INSTANCE_GROUP,
            &request.trace_id,
            |core| {
                let group = requested_group(request.instance_group.as_ref())?;
                core.manager.update_group(group, request.current_version)?;
                done("Instance group updated successfully")
            },
        )
    }

    /// RemoveInstanceGroup.
    pub fn remove_instance_group(
        &self,
        request: admin::RemoveInstanceGroupRequest,
    ) -> admin::CommonResponse {
        self.call(
            &rpcs::admin::REMOVE_INSTANCE_GROUP,
            &request.trace_id,
            |core| {
                core.manager.remove_group(&request.name)?;
                done("Instance group removed successfully")
            },
        )
    }

    /// GetInstanceGroup.
    pub fn get_instance_group(
        &self,
        request: admin::GetInstanceGroupRequest,
    ) -> admin::GetInstanceGroupResponse {
        self.call(
            &rpcs::admin::GET_INSTANCE_GROUP,
            &request.trace_id,
            |core| {
                let group = core.manager.group(&request.name)?;
                let reply = admin::GetInstanceGroupResponse {
                    header: None,
                    instance_group: Some(group_to_wire(&group)),
                };
                Ok((reply, String::new()))
            },
        )
    }

    /// ListInstanceGroup (trunk): every group, by name.
    pub fn list_instance_group(
        &self,
        request: admin::ListInstanceGroupRequest,
    ) -> admin::ListInstanceGroupResponse {
        self.call(
            &rpcs::admin::LIST_INSTANCE_GROUP,
            &request.trace_id,
            |core| {
                let instance_group = core
                    .manager
                    .list_groups()
                    .iter()
                    .map(|group| group_to_wire(group))
                    .collect();
                let reply = admin::ListInstanceGroupResponse {
                    header: None,
                    instance_group,
                };
                Ok((reply, String::new()))
            },
        )
    }

    /// SetAdminAuthTokens (upstream branch T): replaces every admin token of this node (not
    /// persisted); an empty list is open mode.
    pub fn set_admin_auth_tokens(
        &self,
        request: admin::SetAdminAuthTokensRequest,
    ) -> admin::CommonResponse {
        let rpc = &rpcs::admin::SET_ADMIN_AUTH_TOKENS;
        self.call(rpc, &request.trace_id, |core| {
            core.auth.replace(request.tokens);
            tracing::info!(
                "admin tokens replaced: {} in force",
                core.auth.fingerprints().len()
            );
            Ok((admin::CommonResponse::default(), String::new()))
        })
    }

    /// RotateAdminAuthToken (upstream branch T): adds `new_token`, then removes `old_token`
    /// when given; an unknown old or empty new token is INVALID_ARGUMENT and changes nothing.
    pub fn rotate_admin_auth_token(
        &self,
        request: admin::RotateAdminAuthTokenRequest,
    ) -> admin::CommonResponse {
        let rpc = &rpcs::admin::ROTATE_ADMIN_AUTH_TOKEN;
        self.call(rpc, &request.trace_id, |core| {
            let rotated = core.auth.rotate(&request.old_token, &request.new_token);
            rotated.map_err(|error| {
                let field = match error {
                    TokenChangeError::EmptyNewToken => "new_token",
                    TokenChangeError::UnknownOldToken => "old_token",
                };
                ManagerError::invalid_because(field, error.to_string())
            })?;
            Ok((admin::CommonResponse::default(), String::new()))
        })
    }

    /// ListAdminAuthTokens (upstream branch T): whether tokens are enforced, how many, and
    /// their fingerprints (never the tokens).
    pub fn list_admin_auth_tokens(
        &self,
        request: admin::ListAdminAuthTokensRequest,
    ) -> admin::ListAdminAuthTokensResponse {
        let rpc = &rpcs::admin::LIST_ADMIN_AUTH_TOKENS;
        self.call(rpc, &request.trace_id, |core| {
            let fingerprints = core.auth.fingerprints();
            let reply = admin::ListAdminAuthTokensResponse {
                header: None,
                enforcing: !fingerprints.is_empty(),
                token_count: i32::try_from(fingerprints.len()).unwrap_or(i32::MAX),
                fingerprints,
            };
            Ok((reply, String::new()))
        })
    }

    /// GetCacheMeta (meta semantics, admin status rules).
    pub fn get_cache_meta(
        &self,
        request: admin::GetCacheMetaRequest,
    ) -> admin::GetCacheMetaResponse {
        self.call(&rpcs::admin::GET_CACHE_META, &request.trace_id, |core| {
            let instance = core.manager.require_instance(&request.instance_id)?;
            let (reply, message) =
                meta_calls::get_cache_meta(core, &instance, transcode(&request))?;
            Ok((transcode(&reply), message))
        })
    }

    /// RemoveCache (meta semantics, admin status rules).
    pub fn remove_cache(&self, request: admin::RemoveCacheRequest) -> admin::CommonResponse {
        self.call(&rpcs::admin::REMOVE_CACHE, &request.trace_id, |core| {
            let instance = core.manager.require_instance(&request.instance_id)?;
            let (_, message) = meta_calls::remove_cache(core, &instance, transcode(&request))?;
            Ok((admin::CommonResponse::default(), message))
        })
    }

    /// RegisterInstance (meta semantics, CommonResponse, admin status rules).
    pub fn register_instance(
        &self,
        request: admin::RegisterInstanceRequest,
    ) -> admin::CommonResponse {
        self.call(&rpcs::admin::REGISTER_INSTANCE, &request.trace_id, |core| {
            let request: meta::RegisterInstanceRequest = transcode(&request);
            // §16.2: every failure of the admin RegisterInstance is INTERNAL_ERROR, except
            // (upstream trunk, wire delta §4.4) an invalid field → INVALID_ARGUMENT and a
            // changed re-registration → DUPLICATE_ENTITY, both as the meta service answers.
            let (_, message) =
                meta_calls::register_instance(core, request).map_err(|error| match error {
                    ManagerError::InvalidField { .. } | ManagerError::Duplicate(_) => error,
                    other => ManagerError::Refused(other.to_string()),
                })?;
            Ok((admin::CommonResponse::default(), message))
        })
    }

    /// RemoveInstance: unregisters and deletes all its cache.
    pub fn remove_instance(&self, request: admin::RemoveInstanceRequest) -> admin::CommonResponse {
        self.call(&rpcs::admin::REMOVE_INSTANCE, &request.trace_id, |core| {
            if request.instance_id.is_empty() {
                return Err(missing("instance_id"));
            }
            let removed = core.manager.remove_instance(&request.instance_id);
            // Its figures go once it is gone, also when the removal's record then failed.
            if core.manager.require_instance(&request.instance_id).is_err() {
                core.metrics.forget_instance(&request.instance_id);
            }
            removed?;
            done("Instance removed successfully")
        })
    }

    /// GetInstanceInfo.
    pub fn get_instance_info(
        &self,
        request: admin::GetInstanceInfoRequest,
    ) -> admin::GetInstanceInfoResponse {
        self.call(&rpcs::admin::GET_INSTANCE_INFO, &request.trace_id, |core| {
            let instance = core.manager.require_instance(&request.instance_id)?;
            let reply = admin::GetInstanceInfoResponse {
                header: None,
                instance_info: Some(transcode(&instance_info_to_wire(instance.info()))),
            };
            Ok((reply, String::new()))
        })
    }

    /// ListInstanceInfo: the instances of one group.
    pub fn list_instance_info(
        &self,
        request: admin::ListInstanceInfoRequest,
    ) -> admin::ListInstanceInfoResponse {
        self.call(
            &rpcs::admin::LIST_INSTANCE_INFO,
            &request.trace_id,
            |core| {
                if request.instance_group_name.is_empty() {
                    return Err(missing("instance_group_name"));
                }
                let instance_info = core
                    .manager
                    .list_instances(&request.instance_group_name)
                    .iter()
                    .map(|info| transcode(&instance_info_to_wire(info)))
                    .collect();
                Ok((
                    admin::ListInstanceInfoResponse {
                        header: None,
                        instance_info,
                    },
                    String::new(),
                ))
            },
        )
    }

    /// AddAccount.
    pub fn add_account(&self, request: admin::AddAccountRequest) -> admin::CommonResponse {
        self.call(&rpcs::admin::ADD_ACCOUNT, &request.trace_id, |core| {
            core.manager.add_account(Account {
                user_name: request.user_name.clone(),
                password: StoredPassword::Clear(request.password.clone()),
                role: account_role(request.role)?,
            })?;
            done("Account added successfully")
        })
    }

    /// DeleteAccount.
    pub fn delete_account(&self, request: admin::DeleteAccountRequest) -> admin::CommonResponse {
        self.call(&rpcs::admin::DELETE_ACCOUNT, &request.trace_id, |core| {
            core.manager.delete_account(&request.user_name)?;
            done("Account deleted successfully")
        })
    }

    /// ListAccount (passwords are never returned).
    pub fn list_account(&self, request: admin::ListAccountRequest) -> admin::ListAccountResponse {
        self.call(&rpcs::admin::LIST_ACCOUNT, &request.trace_id, |core| {
            let accounts = core
                .manager
                .list_accounts()
                .into_iter()
                .map(|a| admin::Account {
                    user_name: a.user_name,
                    role: account_role_number(a.role),
                })
                .collect();
            Ok((
                admin::ListAccountResponse {
                    header: None,
                    accounts,
                },
                String::new(),
            ))
        })
    }

    /// CreateApiKey (kvcm's extension): the key's text is answered here and never again.
    pub fn create_api_key(
        &self,
        request: admin::CreateApiKeyRequest,
    ) -> admin::CreateApiKeyResponse {
        self.call(&rpcs::admin::CREATE_API_KEY, &request.trace_id, |core| {
            let expires_ms = u64::try_from(request.expires_at_ms).map_err(|_| {
                ManagerError::invalid_because("expires_at_ms", "must not be negative")
            })?;
            let (key, text) = core.manager.create_api_key(NewApiKey {
                user_name: request.user_name.clone(),
                instances: request.instance_ids.clone(),
                expires_ms,
            })?;
            let reply = admin::CreateApiKeyResponse {
                header: None,
                key_id: key.id,
                api_key: text,
            };
            Ok((reply, String::new()))
        })
    }

    /// RevokeApiKey (kvcm's extension): the key stops working at the next request.
    pub fn revoke_api_key(&self, request: admin::RevokeApiKeyRequest) -> admin::CommonResponse {
        self.call(&rpcs::admin::REVOKE_API_KEY, &request.trace_id, |core| {
            core.manager.revoke_api_key(&request.key_id)?;
            done("API key revoked")
        })
    }

    /// ListApiKeys (kvcm's extension): ids, accounts and scopes, never secrets.
    pub fn list_api_keys(&self, request: admin::ListApiKeysRequest) -> admin::ListApiKeysResponse {
        self.call(&rpcs::admin::LIST_API_KEYS, &request.trace_id, |core| {
            let role_of = |user: &str| core.manager.account_role(user).map(account_role_number);
            let keys = core
                .manager
                .list_api_keys()
                .into_iter()
                .map(|key| admin::ApiKeyInfo {
                    role: role_of(&key.user_name).unwrap_or_default(),
                    key_id: key.id,
                    user_name: key.user_name,
                    instance_ids: key.instances,
                    created_at_ms: key.created_ms as i64,
                    expires_at_ms: key.expires_ms as i64,
                })
                .collect();
            let reply = admin::ListApiKeysResponse { header: None, keys };
            Ok((reply, String::new()))
        })
    }

    /// GenConfigSnapshot: not implemented (as in the reference).
    pub fn gen_config_snapshot(
        &self,
        request: admin::GenConfigSnapshotRequest,
    ) -> admin::ConfigSnapShotResponse {
        self.call(&rpcs::admin::GEN_CONFIG_SNAPSHOT, &request.trace_id, |_| {
            Err(ManagerError::Unsupported(
                "GenConfigSnapshot is not implemented".into(),
            ))
        })
    }

    /// LoadConfigSnapshot: not implemented (as in the reference).
    pub fn load_config_snapshot(
        &self,
        request: admin::LoadConfigSnapshotRequest,
    ) -> admin::CommonResponse {
        self.call(
            &rpcs::admin::LOAD_CONFIG_SNAPSHOT,
            &request.trace_id,
            |_| {
                Err(ManagerError::Unsupported(
                    "LoadConfigSnapshot is not implemented".into(),
                ))
            },
        )
    }

    /// GetMetrics.
    pub fn get_metrics(&self, request: admin::GetMetricsRequest) -> admin::GetMetricsResponse {
        self.call(&rpcs::admin::GET_METRICS, &request.trace_id, |core| {
            let reply = admin::GetMetricsResponse {
                header: None,
                timestamp: now_ms(),
                metrics: [
                    core.metrics.to_wire(),
                    core.events.to_wire(),
                    core.access.to_wire(),
                    super::capacity_metrics::to_wire(&core.manager, &core.curves),
                    super::lookup_metrics::to_wire(core),
                ]
                .concat(),
                extra_data: String::new(),
            };
            Ok((reply, String::new()))
        })
    }

    /// CheckHealth.
    pub fn check_health(&self, request: admin::CheckHealthRequest) -> admin::CheckHealthResponse {
        self.call(&rpcs::admin::CHECK_HEALTH, &request.trace_id, |core| {
            let leadership = core.manager.leadership();
            // Unhealthy once the journal failed: writes are refused until a restart.
            let journal_failed = core
                .manager
                .journal_stats()
                .is_some_and(|stats| stats.failure.is_some());
            let reply = admin::CheckHealthResponse {
                header: None,
                is_leader: leadership.is_leader(),
                is_health: !journal_failed,
                elector_last_loop_time_ms: leadership.elector_last_loop_ms(),
            };
            Ok((reply, String::new()))
        })
    }

    /// GetManagerClusterInfo: this node's lease and the leader read from the lock.
    pub fn get_manager_cluster_info(
        &self,
        request: admin::GetManagerClusterInfoRequest,
    ) -> admin::GetManagerClusterInfoResponse {
        self.call(
            &rpcs::admin::GET_MANAGER_CLUSTER_INFO,
            &request.trace_id,
            |core| {
                let leadership = core.manager.leadership();
                let leader = leadership.leader().map(|holder| holder.endpoint);
                let reply = admin::GetManagerClusterInfoResponse {
                    header: None,
                    info_updated_time: 0,
                    self_leader_expiration_time: leadership.lease_expiration_us(),
                    self_node_id: leadership.node_id().to_string(),
                    leader_node_id: leader
                        .as_ref()
                        .map_or_else(String::new, |e| e.node_id.clone()),
                    leader_endpoint: leader.map(node_endpoint_to_wire),
                };
                Ok((reply, String::new()))
            },
        )
    }

    /// LeaderDemote: steps down (open write sessions fail); SERVER_NOT_LEADER on a follower.
    pub fn leader_demote(&self, request: admin::LeaderDemoteRequest) -> admin::CommonResponse {
        self.call(&rpcs::admin::LEADER_DEMOTE, &request.trace_id, |core| {
            if !core.manager.demote() {
                return Err(ManagerError::NotLeader);
            }
            done("Leader demoted successfully")
        })
    }

    /// GetLeaderElectorConfig.
    pub fn get_leader_elector_config(
        &self,
        request: admin::GetLeaderElectorConfigRequest,
    ) -> admin::GetLeaderElectorConfigResponse {
        self.call(
            &rpcs::admin::GET_LEADER_ELECTOR_CONFIG,
            &request.trace_id,
            |core| {
                let reply = admin::GetLeaderElectorConfigResponse {
                    header: None,
                    campaign_delay_time_ms: core.manager.leadership().campaign_delay_ms(),
                };
                Ok((reply, String::new()))
            },
        )
    }

    /// UpdateLeaderElectorConfig.
    pub fn update_leader_elector_config(
        &self,
        request: admin::UpdateLeaderElectorConfigRequest,
    ) -> admin::CommonResponse {
        self.call(
            &rpcs::admin::UPDATE_LEADER_ELECTOR_CONFIG,
            &request.trace_id,
            |core| {
                if request.campaign_delay_time_ms < 0 {
                    return Err(missing("campaign_delay_time_ms"));
                }
                core.manager
                    .leadership()
                    .set_campaign_delay_ms(request.campaign_delay_time_ms);
                done("Leader elector config updated successfully")
            },
        )
    }

    /// UpdateLogger: DEBUG / INFO / WARN / ERROR (case-insensitive) become the log level.
    pub fn update_logger(&self, request: admin::UpdateLoggerRequest) -> admin::CommonResponse {
        self.call(&rpcs::admin::UPDATE_LOGGER, &request.trace_id, |core| {
            let level = match request.log_level.to_ascii_uppercase().as_str() {
                "DEBUG" => tracing::Level::DEBUG,
                "INFO" => tracing::Level::INFO,
                "WARN" => tracing::Level::WARN,
                "ERROR" => tracing::Level::ERROR,
                _ => return Err(missing("log_level")),
            };
            let setter = core.log_level.as_ref().ok_or_else(|| {
                ManagerError::Unsupported("this process has a fixed log level".into())
            })?;
            setter(level).map_err(ManagerError::Unsupported)?;
            done("Logger updated successfully")
        })
    }
}
