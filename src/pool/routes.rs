//! The server's side of pool membership: the [`Registrar`] (joins and heartbeats; it checks
//! no credential itself — the routes check the caller before they call it, and the embedded
//! pool node, part of the server, calls it directly) and, over it, the routes on the meta
//! HTTP port in kvcm's own namespace:
//! `POST /kvcm/v1/poolJoin`, `/kvcm/v1/poolHeartbeat` and `/kvcm/v1/poolNodes` (JSON
//! bodies below); errors answer `{"error":"..."}` with 400 (bad body or value), 404
//! (unknown storage, or an incarnation that is not live: join again), 408 / 413 (a body
//! slower than `kvcm.service.body_timeout_ms` or larger than
//! `kvcm.service.http_max_body_bytes`) or 500. And the reaper thread that declares silent
//! nodes dead.
//!
//! With `kvcm.auth.meta = required` the routes check the caller as the meta API does
//! (`Authorization: Bearer`, or a client certificate's account): join and heartbeat need an
//! operator or admin credential (401 none or not valid, 403 a client key), the directory
//! any valid meta credential — a key limited to instances only for pools their groups use
//! (403 otherwise); a join is then answered the node's ticket key and the directory a
//! ticket per live node (`ticket`), for the instance the request names; a node that says it
//! isolates instances is then told to ([`JoinAnswer::isolated`]) and its heartbeats carry
//! the pool's ownership feed ([`OwnershipAnswer`]). Off, the routes are open (as before)
//! and no tickets exist.

use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use kvcm_manager::{Manager, ManagerError};
use kvcm_storage::allocator::OwnershipChange;
use kvcm_storage::pool::{Applied, OwnershipUpdate, PoolNodeJoin, PoolNodeStatus};
use kvcm_storage::StorageError;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::grants::{Credential, PoolGrants};
use super::ticket::{self, ServerSecret};
use crate::service::auth::{authorize, canonical_authorization, Authenticator, Caller, Grant};
use crate::service::http::{own_answer, own_refusal, read_body, ClientCertificate, HttpLimits};
use crate::service::rpcs::{Access, Service};

/// Join route.
pub const JOIN_ROUTE: &str = "/kvcm/v1/poolJoin";
/// Heartbeat route.
pub const HEARTBEAT_ROUTE: &str = "/kvcm/v1/poolHeartbeat";
/// Member list route.
pub const NODES_ROUTE: &str = "/kvcm/v1/poolNodes";

/// A node joins a pool storage.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JoinRequest {
    /// The pool storage's name.
    pub storage: String,
    /// The node's stable id.
    pub node_id: String,
    /// Its queue-pair listener (`host:port`).
    pub endpoint: String,
    /// Bytes of its region.
    pub capacity: u64,
    /// The incarnation the node had and whose region it kept, to resume it after a
    /// server restart (absent: a new incarnation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_range_id: Option<u64>,
    /// The node can isolate instances (one protection domain per instance, registrations
    /// per owned run); the server has it do so while it issues tickets.
    #[serde(default, skip_serializing_if = "is_false")]
    pub isolates: bool,
}

fn is_false(value: &bool) -> bool {
    !value
}

/// The join's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinAnswer {
    /// The new incarnation.
    pub range_id: u64,
    /// Heartbeat interval in ms.
    pub heartbeat_ms: u64,
    /// The node's ticket key (hex), when the server demands tickets: the node then refuses
    /// queue pairs without a valid ticket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ticket_key: Option<String>,
    /// The node is to isolate instances: its heartbeats carry the ownership version it
    /// applied and are answered who owns what ([`OwnershipAnswer`]).
    #[serde(default, skip_serializing_if = "is_false")]
    pub isolated: bool,
}

/// A node's heartbeat.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HeartbeatRequest {
    /// The pool storage's name.
    pub storage: String,
    /// The node's id.
    pub node_id: String,
    /// Its incarnation.
    pub range_id: u64,
    /// The grants of its live queue pairs' tickets (`super::grants`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub grants: Vec<u64>,
    /// An isolating node: the ownership feed and version it applied (absent: none yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied: Option<AppliedVersion>,
}

/// The ownership an isolating node applied: a feed and its version.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedVersion {
    /// The feed's id.
    pub feed: u64,
    /// The last version of it applied.
    pub version: u64,
}

/// Who owns what, for an isolating node: the changes after the version it applied, or
/// every owned run (`snapshot`), replacing all it holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnershipAnswer {
    /// The feed's id.
    pub feed: u64,
    /// The version applied once these changes are.
    pub version: u64,
    /// `changes` lists every owned run, replacing all the node holds.
    #[serde(default, skip_serializing_if = "is_false")]
    pub snapshot: bool,
    /// The changes, oldest first.
    pub changes: Vec<RunChange>,
}

/// One change, compact on the wire (a snapshot of a large region lists many):
/// `[tenant, offset, len, released]` — the run of `len` bytes at `offset` holds the
/// tenant's parts from now on (`released` false) or no longer does (true).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunChange(pub u32, pub u64, pub u64, pub bool);

impl From<OwnershipUpdate> for OwnershipAnswer {
    fn from(update: OwnershipUpdate) -> Self {
        let change = |change: OwnershipChange| match change {
            OwnershipChange::Granted(run) => RunChange(run.tenant, run.offset, run.len, false),
            OwnershipChange::Released(run) => RunChange(run.tenant, run.offset, run.len, true),
        };
        OwnershipAnswer {
            feed: update.feed,
            version: update.version,
            snapshot: update.snapshot,
            changes: update.changes.into_iter().map(change).collect(),
        }
    }
}

/// The server's answer to a heartbeat.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatAnswer {
    /// The grants of the request whose credential no longer passes: the node tears their
    /// queue pairs down.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub revoked: Vec<u64>,
    /// What an isolating node is to apply next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ownership: Option<OwnershipAnswer>,
}

/// Asks for a pool's members.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodesRequest {
    /// The pool storage's name.
    pub storage: String,
    /// The instance the tickets are for (isolating nodes admit a queue pair to that
    /// instance's runs only, and only with a ticket that names one); the credential must
    /// reach it and its group must use the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
}

/// One member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAnswer {
    /// The node's id.
    pub node_id: String,
    /// Its queue-pair listener.
    pub endpoint: String,
    /// This incarnation.
    pub range_id: u64,
    /// Bytes of its region.
    pub capacity: u64,
    /// Bytes placed on it.
    pub used: u64,
    /// Whether it heartbeats.
    pub live: bool,
    /// A ticket (hex) for its queue-pair hello, when the server demands them (live nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ticket: Option<String>,
}

/// The members of a pool (live incarnations first is not promised: slot order).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodesAnswer {
    /// Every incarnation that joined.
    pub nodes: Vec<NodeAnswer>,
}

impl From<PoolNodeStatus> for NodeAnswer {
    fn from(status: PoolNodeStatus) -> Self {
        NodeAnswer {
            node_id: status.node_id,
            endpoint: status.endpoint,
            range_id: status.range_id,
            capacity: status.capacity,
            used: status.used,
            live: status.live,
            ticket: None,
        }
    }
}

/// The server's side of membership: joins and heartbeats of nodes, the tickets' secret and
/// the grants issued. The routes call it for remote nodes, the embedded node
/// (`super::member::Channel::InProcess`) directly; both get the same answers.
#[derive(Clone)]
pub struct Registrar {
    manager: Arc<Manager>,
    auth: Authenticator,
    secret: ServerSecret,
    grants: Arc<PoolGrants>,
}

impl Registrar {
    /// The registrar of `manager`'s pools: credentials checked by `auth`, tickets made with
    /// `secret`.
    pub fn new(manager: Arc<Manager>, auth: Authenticator, secret: ServerSecret) -> Self {
        Registrar {
            manager,
            auth,
            secret,
            grants: Arc::default(),
        }
    }

    /// Adds a node incarnation; answers its ticket key too while tickets are in force
    /// (`kvcm.auth.meta = required`).
    /// Under meta auth a node that cannot isolate instances is refused: every client
    /// admitted would reach its whole region.
    pub fn join(&self, request: &JoinRequest) -> Result<JoinAnswer, ManagerError> {
        if self.auth.meta_required() && !request.isolates {
            return Err(ManagerError::Refused(format!(
                "this server requires meta auth (kvcm.auth.meta), so its pool nodes must \
                 isolate instances, which node {:?} cannot: a region of more than {} bytes \
                 (about 32 GiB), a node that shared its memory on the shared-memory wire \
                 before (restart it), or a node of an earlier release; run nodes of at most \
                 that size",
                request.node_id,
                super::region::MAX_ISOLATING_BYTES
            )));
        }
        let join = PoolNodeJoin {
            node_id: request.node_id.clone(),
            endpoint: request.endpoint.clone(),
            capacity: request.capacity,
            resume_range_id: request.resume_range_id,
            // Without tickets a queue pair names no instance, so there is none to isolate;
            // with them, a node that cannot isolate was refused above.
            isolated: self.auth.meta_required(),
        };
        let isolated = join.isolated;
        let membership = self.manager.pool_join(&request.storage, join)?;
        let ticket_key = self.auth.meta_required().then(|| {
            let key = self
                .secret
                .node_key(&request.storage, &request.node_id, membership.range_id);
            kvcm_manager::hex::encode(&key)
        });
        Ok(JoinAnswer {
            range_id: membership.range_id,
            heartbeat_ms: membership.heartbeat.as_millis() as u64,
            ticket_key,
            isolated,
        })
    }

    /// Records a heartbeat; answers the grants of the request whose credential fails now.
    pub fn heartbeat(&self, request: &HeartbeatRequest) -> Result<HeartbeatAnswer, ManagerError> {
        let manager = &self.manager;
        let incarnation = (request.node_id.as_str(), request.range_id);
        let applied = request.applied.unwrap_or_default();
        let applied = Applied {
            feed: applied.feed,
            version: applied.version,
        };
        let update = manager.pool_heartbeat(&request.storage, incarnation, applied)?;
        let revoked = self.grants.revoked(&self.auth, manager, &request.grants);
        Ok(HeartbeatAnswer {
            revoked,
            ownership: update.map(OwnershipAnswer::from),
        })
    }

    /// Whether `error` means the incarnation (or its pool) is unknown: the node joins again.
    pub fn is_forgotten(error: &ManagerError) -> bool {
        status_of(error) == StatusCode::NOT_FOUND
    }
}

/// The membership routes, to merge into the meta HTTP router; bodies are read within
/// `limits`, joins and heartbeats answered by `registrar`.
pub fn router(registrar: Registrar, limits: HttpLimits) -> Router {
    Router::new()
        .route(JOIN_ROUTE, post(join))
        .route(HEARTBEAT_ROUTE, post(heartbeat))
        .route(NODES_ROUTE, post(nodes))
        .with_state(Routes { registrar, limits })
}

/// What the routes share.
#[derive(Clone)]
struct Routes {
    registrar: Registrar,
    limits: HttpLimits,
}

impl Routes {
    /// Whether the caller of `request` may make a call that needs `access` (always, while
    /// meta auth is off), and what it was admitted as; the refusal's status and reason
    /// otherwise.
    fn admit(&self, request: &Request, access: Access) -> Result<Admission, (StatusCode, String)> {
        let auth = &self.registrar.auth;
        if !auth.meta_required() {
            return Ok(Admission::default());
        }
        let caller = auth
            .check_request(Service::Meta, request)
            .map_err(|e| (StatusCode::UNAUTHORIZED, e.to_string()))?;
        authorize(caller.as_ref(), access, None).map_err(|why| (StatusCode::FORBIDDEN, why))?;
        // One spelling per key: the grant's id (and what the grant keeps) must not vary
        // with the scheme's case or the blanks of a header that authenticates alike.
        let credential = Credential {
            authorization: request
                .headers()
                .get(axum::http::header::AUTHORIZATION)
                .and_then(|value| canonical_authorization(value.as_bytes())),
            certificate: request
                .extensions()
                .get::<ClientCertificate>()
                .map(|c| c.0.clone()),
        };
        Ok(Admission {
            tickets: true,
            scope: scope_of(caller.as_ref()),
            credential,
        })
    }
}

/// The instances a caller's key is limited to (`None`: a token, or a key on every
/// instance).
pub(super) fn scope_of(caller: Option<&Caller>) -> Option<Vec<String>> {
    match caller.map(|c| &c.grant) {
        Some(Grant::Key { instances, .. }) if !instances.is_empty() => Some(instances.clone()),
        _ => None,
    }
}

/// Whether one of `instances` belongs to a group that uses pool `storage`.
pub(super) fn uses_pool(manager: &Manager, instances: &[String], storage: &str) -> bool {
    instances.iter().any(|id| {
        manager.instance(id).is_some_and(|instance| {
            manager
                .group(instance.group())
                .is_ok_and(|group| group.storage_candidates.iter().any(|s| s == storage))
        })
    })
}

/// What a caller was admitted as.
#[derive(Debug, Default)]
struct Admission {
    /// Tickets are in force (`kvcm.auth.meta = required`).
    tickets: bool,
    /// The instances a key is limited to (`None`: a token, or a key on every instance).
    scope: Option<Vec<String>>,
    /// What the caller showed (kept with the grants of the tickets it gets).
    credential: Credential,
}

impl Admission {
    /// Refuses a key whose instances all belong to groups that do not use pool `storage`.
    fn may_use_pool(&self, manager: &Manager, storage: &str) -> Result<(), RouteError> {
        let Some(instances) = &self.scope else {
            return Ok(());
        };
        if uses_pool(manager, instances, storage) {
            return Ok(());
        }
        Err(RouteError::Forbidden(format!(
            "no instance of the key belongs to a group that uses pool {storage:?}"
        )))
    }

    /// Refuses instance `instance` when the key does not reach it or its group does not
    /// use pool `storage`.
    fn may_use_instance(
        &self,
        manager: &Manager,
        storage: &str,
        instance: &str,
    ) -> Result<(), RouteError> {
        let reached = self
            .scope
            .as_ref()
            .is_none_or(|scope| scope.iter().any(|id| id == instance));
        if reached && uses_pool(manager, &[instance.to_string()], storage) {
            return Ok(());
        }
        Err(RouteError::Forbidden(format!(
            "the key does not reach instance {instance:?}, or its group does not use pool \
             {storage:?}"
        )))
    }
}

/// Why a membership route refused a request.
#[derive(Debug)]
enum RouteError {
    /// The manager refused it.
    Manager(ManagerError),
    /// The caller may not see what it asked for.
    Forbidden(String),
}

impl From<ManagerError> for RouteError {
    fn from(error: ManagerError) -> Self {
        RouteError::Manager(error)
    }
}

async fn join(State(routes): State<Routes>, request: Request) -> Response {
    admitted(
        routes,
        request,
        Access::Operate,
        |routes, _, request: JoinRequest| Ok(routes.registrar.join(&request)?),
    )
    .await
}

async fn heartbeat(State(routes): State<Routes>, request: Request) -> Response {
    admitted(
        routes,
        request,
        Access::Operate,
        |routes, _, request: HeartbeatRequest| Ok(routes.registrar.heartbeat(&request)?),
    )
    .await
}

async fn nodes(State(routes): State<Routes>, request: Request) -> Response {
    admitted(
        routes,
        request,
        Access::Client,
        |routes, admission, request: NodesRequest| {
            let Registrar {
                manager,
                secret,
                grants,
                ..
            } = &routes.registrar;
            admission.may_use_pool(manager, &request.storage)?;
            let tickets = admission.tickets;
            let expiry = ticket::now_ms() + ticket::TICKET_TTL.as_millis() as u64;
            let instance = request.instance_id.as_deref().filter(|_| tickets);
            let tenant = match instance {
                Some(instance) => {
                    admission.may_use_instance(manager, &request.storage, instance)?;
                    Some(manager.pool_tenant(&request.storage, instance)?)
                }
                None => None,
            };
            let admit = tickets.then(|| {
                let credential = &admission.credential;
                let grant = grants.issue(secret, credential, (&request.storage, instance));
                ticket::Admit { grant, tenant }
            });
            let nodes = manager.pool_nodes(&request.storage)?;
            let answer = |status: PoolNodeStatus| {
                let ticket = admit.filter(|_| status.live).map(|admit| {
                    let storage = &request.storage;
                    let key = secret.node_key(storage, &status.node_id, status.range_id);
                    kvcm_manager::hex::encode(&ticket::issue(&key, status.range_id, expiry, admit))
                });
                NodeAnswer {
                    ticket,
                    ..NodeAnswer::from(status)
                }
            };
            Ok(NodesAnswer {
                nodes: nodes.into_iter().map(answer).collect(),
            })
        },
    )
    .await
}

/// Checks the caller of `request` for `access` (a refusal answers at once), then answers
/// its body with `handle`, given the routes and whether tickets are in force.
async fn admitted<Q, A>(
    routes: Routes,
    request: Request,
    access: Access,
    handle: impl FnOnce(&Routes, &Admission, Q) -> Result<A, RouteError> + Send + 'static,
) -> Response
where
    Q: DeserializeOwned + Send + 'static,
    A: Serialize + Send + 'static,
{
    let admission = match routes.admit(&request, access) {
        Ok(admission) => admission,
        Err((status, why)) => return own_refusal(status, &why),
    };
    let limits = routes.limits;
    answer(request.into_body(), limits, move |body| {
        handle(&routes, &admission, body)
    })
    .await
}

/// Reads and decodes the body, runs `handle` off the async threads (a join may sweep an
/// index) and encodes its answer or error.
async fn answer<Q, A>(
    body: Body,
    limits: HttpLimits,
    handle: impl FnOnce(Q) -> Result<A, RouteError> + Send + 'static,
) -> Response
where
    Q: DeserializeOwned + Send + 'static,
    A: Serialize + Send + 'static,
{
    let body = match read_body(body, limits).await {
        Ok(body) => body,
        Err(status) => return own_refusal(status, "the body is too large or too slow"),
    };
    let request: Q = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(error) => return own_refusal(StatusCode::BAD_REQUEST, &format!("bad body: {error}")),
    };
    match tokio::task::spawn_blocking(move || handle(request)).await {
        Ok(Ok(answer)) => own_answer(StatusCode::OK, &answer),
        Ok(Err(RouteError::Manager(error))) => own_refusal(status_of(&error), &error.to_string()),
        Ok(Err(RouteError::Forbidden(why))) => own_refusal(StatusCode::FORBIDDEN, &why),
        Err(_) => own_refusal(StatusCode::INTERNAL_SERVER_ERROR, "pool request failed"),
    }
}

fn status_of(error: &ManagerError) -> StatusCode {
    match error {
        ManagerError::NotFound(_) | ManagerError::Storage(StorageError::UnknownPoolNode(_)) => {
            StatusCode::NOT_FOUND
        }
        ManagerError::Refused(_) | ManagerError::Storage(StorageError::InvalidRequest(_)) => {
            StatusCode::BAD_REQUEST
        }
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// Declares silent pool nodes dead every `interval` until the manager is gone.
pub fn start_reaper(manager: &Arc<Manager>, interval: Duration) -> std::io::Result<()> {
    let manager: Weak<Manager> = Arc::downgrade(manager);
    std::thread::Builder::new()
        .name("kvcm-pool-reaper".into())
        .spawn(move || loop {
            std::thread::sleep(interval);
            let Some(manager) = manager.upgrade() else {
                return;
            };
            let died = manager.reap_pool_nodes();
            if died > 0 {
                tracing::warn!(
                    died,
                    "pool nodes missed their heartbeats: their blocks are gone"
                );
            }
        })?;
    Ok(())
}
