//! The gRPC face of sessions, turns, nodes and tasks (`plinth.catalog.v1.SessionService`):
//! wire types are validated into domain types on receipt, the store does the work.

use plinth_kit::auth::Principal;
use plinth_kit::clock::now_ms;
use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::catalog::v1 as pb;
use tonic::{Request, Response, Status};

use crate::domain::model::{EnvironmentId, PageRequest, Scope, foreign_cursor};
use crate::domain::sessions::{
    CacheReport, NodeCapacity, NodeId, NodeTtl, Session, SessionId, SessionLimits, Task, Turn,
    TurnKind,
};
use crate::domain::warm::ReadOrder;
use crate::persistence::{NewSession, NewTask, Store, StoreError};

/// The `plinth.catalog.v1.SessionService` implementation.
pub struct Sessions {
    store: Store,
    nodes: NodeTtl,
    /// The names of nodes seen so far, by id: a node's id and name never change once it is
    /// registered, so a heartbeat checks its caller's credential without reading the row.
    names: std::sync::RwLock<std::collections::HashMap<NodeId, String>>,
}

impl Sessions {
    pub fn new(store: Store, nodes: NodeTtl) -> Self {
        Sessions {
            store,
            nodes,
            names: std::sync::RwLock::default(),
        }
    }

    /// The name `node` registered with, if it is registered.
    async fn node_name(&self, node: &NodeId) -> Result<Option<String>, Status> {
        if let Some(name) = self
            .names
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(node)
        {
            return Ok(Some(name.clone()));
        }
        let name = self
            .store
            .node_name(node)
            .await
            .map_err(|error| PlinthError::internal(&error))?;
        if let Some(name) = &name {
            self.names
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(node.clone(), name.clone());
        }
        Ok(name)
    }

    /// Refuses a credential for one node acting for another (or for an unknown node, which
    /// must register first, under its own name).
    async fn check_node(&self, caller: Option<&Principal>, node: &NodeId) -> Result<(), Status> {
        let Some(caller) = caller.filter(|caller| caller.name.is_some()) else {
            return Ok(());
        };
        let name = self.node_name(node).await?;
        match name {
            Some(name) if caller.may_act_as(&name) => Ok(()),
            _ => Err(not_this_node(caller)),
        }
    }

    fn new_session(
        &self,
        scope: &str,
        environment_id: &str,
        harness_id: String,
        version: Option<u32>,
        owner: String,
        limits: Option<pb::SessionLimits>,
    ) -> Result<NewSession, PlinthError> {
        if owner.len() > 1024 || owner.chars().any(char::is_control) {
            return Err(PlinthError::invalid(
                "owner: at most 1024 bytes, no control characters",
            ));
        }
        let scope = Scope::parse(scope)?;
        let environment_id = EnvironmentId::parse(environment_id).ok_or_else(|| {
            PlinthError::new(
                ErrorCode::EnvironmentNotFound,
                format!("environment {environment_id:?} not found"),
            )
        })?;
        Ok(NewSession {
            scope,
            environment_id,
            version,
            harness_id,
            owner,
            live_since_ms: self.nodes.live_since_ms(),
            exclude_node: None,
            // The gateway attaches a session it created before it answers.
            workdir_at_placement: true,
            limits: limits_from_wire(limits)?,
        })
    }
}

/// A session's limits as received: absent or 0 is no limit.
pub(crate) fn limits_from_wire(
    limits: Option<pb::SessionLimits>,
) -> Result<SessionLimits, PlinthError> {
    let limits = limits.unwrap_or_default();
    SessionLimits::from_wire([
        limits.memory_mb,
        limits.pids,
        limits.cpu_millicores,
        limits.disk_mb,
        limits.lifetime_ms,
        limits.idle_ms,
    ])
    .map_err(|error| PlinthError::new(ErrorCode::InvalidRequest, error.to_string()))
}

impl From<SessionLimits> for pb::SessionLimits {
    fn from(limits: SessionLimits) -> Self {
        let [
            memory_mb,
            pids,
            cpu_millicores,
            disk_mb,
            lifetime_ms,
            idle_ms,
        ] = limits.to_wire();
        pb::SessionLimits {
            memory_mb,
            pids,
            cpu_millicores,
            disk_mb,
            lifetime_ms,
            idle_ms,
        }
    }
}

/// The longest a gateway's mark on a node lasts without being renewed.
const MAX_SUSPECT_MS: u64 = 60 * 60 * 1000;

/// Errors creating a session (or a task) on `environment`.
fn placement_error(error: StoreError, environment: &str) -> PlinthError {
    match error {
        StoreError::NotFound => PlinthError::new(
            ErrorCode::EnvironmentNotFound,
            format!("environment {environment} not found"),
        ),
        StoreError::NothingBuilt => PlinthError::new(
            ErrorCode::EnvironmentNotReady,
            format!(
                "environment {environment} has no ready version: build it (POST /v1/environments/{environment}/build) and wait for the build to be ready"
            ),
        ),
        StoreError::NotReady(status) => PlinthError::new(
            ErrorCode::EnvironmentNotReady,
            format!(
                "that version of environment {environment} is {}, not ready: only a ready version can be pinned",
                status.as_str()
            ),
        ),
        StoreError::NoLiveNode => no_live_node(),
        StoreError::NoCapacity {
            live_nodes,
            memory_mb,
        } => no_capacity(live_nodes, memory_mb),
        StoreError::QuotaExceeded { quota, limit, used } => {
            plinth_kit::quota::exceeded(quota, limit, used)
        }
        other => PlinthError::internal(&other),
    }
}

/// How long a client waits before asking again for a session no node was alive to take: a
/// node that restarts is back within seconds.
const NO_LIVE_NODE_RETRY_MS: u64 = 1_000;

/// How long a client waits before asking again for a session no node had room for: room comes
/// back when a session ends, or when a node is added.
pub(crate) const NO_CAPACITY_RETRY_MS: u64 = 10_000;

/// `unavailable`: no node agent is alive.
pub(crate) fn no_live_node() -> PlinthError {
    PlinthError::new(
        ErrorCode::Unavailable,
        "no node agent is alive (and answering the gateway) to run the session; start `plinth node` (or check the running ones and the network between them and the gateway) and retry",
    )
    .with_detail(serde_json::json!({
        plinth_kit::error::RETRY_AFTER_MS: NO_LIVE_NODE_RETRY_MS,
        "reason": "no_live_node",
    }))
}

/// `unavailable`: nodes are alive, and every one is full.
pub(crate) fn no_capacity(live_nodes: u64, memory_mb: Option<u64>) -> PlinthError {
    let memory = memory_mb.map_or_else(String::new, |mb| format!(" with {mb} MiB of memory"));
    PlinthError::new(
        ErrorCode::Unavailable,
        format!(
            "no node has room for a session{memory}: each of the {live_nodes} live node(s) runs \
             as many sessions as its node.max_sessions allows or has less memory left than the \
             session's limit. Retry after a session ends, or make room: end sessions, add \
             nodes, raise node.max_sessions (with the memory to match), or ask for less memory \
             (limits.memory_mb)"
        ),
    )
    .with_detail(serde_json::json!({
        plinth_kit::error::RETRY_AFTER_MS: NO_CAPACITY_RETRY_MS,
        "reason": "no_capacity",
        "live_nodes": live_nodes,
        "memory_mb": memory_mb,
    }))
}

/// Errors about one session.
fn session_error(error: StoreError, id: &str) -> PlinthError {
    match error {
        StoreError::NotFound => missing("session", id),
        StoreError::ForeignCursor => foreign_cursor(),
        other => PlinthError::internal(&other),
    }
}

/// Errors reading a page of a list that needs no object to exist.
fn page_error(error: StoreError) -> PlinthError {
    match error {
        StoreError::ForeignCursor => foreign_cursor(),
        other => PlinthError::internal(&other),
    }
}

fn session_id(text: &str) -> Result<SessionId, PlinthError> {
    SessionId::parse(text).ok_or_else(|| missing("session", text))
}

fn not_this_node(caller: &Principal) -> Status {
    Status::permission_denied(format!(
        "this credential is node {:?}'s and acts for no other node",
        caller.name.as_deref().unwrap_or_default()
    ))
}

fn node_id(text: &str) -> Result<NodeId, PlinthError> {
    NodeId::parse(text).ok_or_else(|| missing("node", text))
}

/// A version that is not a ready build of its environment: `not_found`.
fn missing_version(environment: &str, version: u32) -> PlinthError {
    PlinthError::new(
        ErrorCode::NotFound,
        format!("version {version} of environment {environment:?} was not found"),
    )
}

/// An unknown (or another scope's) session or node: `not_found`, not `environment_not_found`.
fn missing(what: &str, id: &str) -> PlinthError {
    PlinthError::new(ErrorCode::NotFound, format!("{what} {id:?} was not found"))
}

impl From<Session> for pb::Session {
    fn from(session: Session) -> Self {
        pb::Session {
            id: session.id.as_str().to_owned(),
            scope: session.scope.as_str().to_owned(),
            environment_id: session.environment_id.as_str().to_owned(),
            version: session.version,
            slug: session.slug,
            layer_tree: session.layer_tree,
            node_id: session.node_id.as_str().to_owned(),
            node_address: session.node_address,
            workdir: session.workdir,
            isolated: session.isolated,
            status: pb::SessionStatus::from(session.status).into(),
            created_at_ms: session.created_at_ms,
            ended_at_ms: session.ended_at_ms,
            harness_id: session.harness_id,
            environment_name: session.environment_name,
            entry: session.entry,
            turns: session.turns,
            owner: session.owner,
            limits: Some(session.limits.into()),
        }
    }
}

impl From<Turn> for pb::Turn {
    fn from(turn: Turn) -> Self {
        pb::Turn {
            session_id: turn.session_id.as_str().to_owned(),
            sequence: turn.sequence,
            kind: pb::TurnKind::from(turn.kind).into(),
            detail: turn.detail,
            version: turn.version,
            at_ms: turn.at_ms,
            exit_code: turn.exit_code,
        }
    }
}

impl From<Task> for pb::Task {
    fn from(task: Task) -> Self {
        pb::Task {
            id: task.id.as_str().to_owned(),
            input: task.input,
            harness_id: task.harness_id,
            metadata_json: task.metadata,
            session: Some(task.session.into()),
            created_at_ms: task.created_at_ms,
        }
    }
}

#[tonic::async_trait]
impl pb::session_service_server::SessionService for Sessions {
    #[tracing::instrument(name = "catalog.register_node", skip_all)]
    async fn register_node(
        &self,
        request: Request<pb::RegisterNodeRequest>,
    ) -> Result<Response<pb::RegisterNodeResponse>, Status> {
        let caller = Principal::of(&request).cloned();
        let request = request.into_inner();
        if let Some(caller) = caller
            && !caller.may_act_as(&request.name)
        {
            return Err(not_this_node(&caller));
        }
        if request.name.is_empty() || request.name.len() > 256 || request.address.is_empty() {
            return Err(
                PlinthError::invalid("a node needs a name (≤ 256 bytes) and an address").into(),
            );
        }
        let absolute_or_empty =
            |path: &str| path.is_empty() || (path.starts_with('/') && path.len() <= 4096);
        if !absolute_or_empty(&request.sessions_dir) || !absolute_or_empty(&request.session_workdir)
        {
            return Err(PlinthError::invalid(
                "sessions_dir and session_workdir are absolute paths (≤ 4096 bytes) or empty",
            )
            .into());
        }
        let capacity = NodeCapacity::from_wire(request.max_sessions, request.memory_mb);
        let id = self
            .store
            .register_node_with(
                &request.name,
                &request.address,
                request.isolated,
                &request.sessions_dir,
                &request.session_workdir,
                capacity,
            )
            .await
            .map_err(|error| PlinthError::internal(&error))?;
        tracing::info!(node = %id, name = %request.name, address = %request.address, isolated = request.isolated, max_sessions = ?capacity.max_sessions, memory_mb = ?capacity.memory_mb, "node registered");
        Ok(Response::new(pb::RegisterNodeResponse {
            node_id: id.as_str().to_owned(),
            heartbeat_every_ms: self.nodes.heartbeat_every_ms(),
        }))
    }

    #[tracing::instrument(name = "catalog.node_heartbeat", skip_all)]
    async fn node_heartbeat(
        &self,
        request: Request<pb::NodeHeartbeatRequest>,
    ) -> Result<Response<pb::NodeHeartbeatResponse>, Status> {
        let caller = Principal::of(&request).cloned();
        let request = request.into_inner();
        let node = node_id(&request.node_id)?;
        self.check_node(caller.as_ref(), &node).await?;
        let cached: Vec<(EnvironmentId, u32)> = request
            .cached
            .iter()
            .filter_map(|cached| {
                Some((
                    EnvironmentId::parse(&cached.environment_id)?,
                    cached.version,
                ))
            })
            .collect();
        let report =
            CacheReport::from_heartbeat(request.cache_digest, request.cache_unchanged, cached);
        // The live sessions are read after the heartbeat arrived, so a session the node
        // attached before sending it is listed unless it has ended.
        let capacity = NodeCapacity::from_wire(request.max_sessions, request.memory_mb);
        let answer = self
            .store
            .node_heartbeat_with(&node, report, Some(capacity), request.active_epoch)
            .await
            .map_err(|error| match error {
                StoreError::NotFound => missing("node", node.as_str()),
                other => PlinthError::internal(&other),
            })?;
        Ok(Response::new(pb::NodeHeartbeatResponse {
            active: answer
                .active
                .unwrap_or_default()
                .into_iter()
                .map(|(environment, version)| pb::CachedVersion {
                    environment_id: environment.as_str().to_owned(),
                    version,
                })
                .collect(),
            live_sessions: answer
                .live_sessions
                .iter()
                .map(|id| id.as_str().to_owned())
                .collect(),
            sessions_listed: true,
            cache_digest: answer.digest,
            active_epoch: answer.epoch,
            active_unchanged: answer.active_unchanged,
            warm: answer
                .warm
                .into_iter()
                .map(|warm| pb::WarmVersion {
                    environment_id: warm.environment_id.as_str().to_owned(),
                    slug: warm.slug,
                    version: warm.version,
                    layer_tree: warm.layer_tree,
                })
                .collect(),
        }))
    }

    #[tracing::instrument(name = "catalog.record_read_order", skip_all)]
    async fn record_read_order(
        &self,
        request: Request<pb::RecordReadOrderRequest>,
    ) -> Result<Response<pb::RecordReadOrderResponse>, Status> {
        let caller = Principal::of(&request).cloned();
        let request = request.into_inner();
        let node = node_id(&request.node_id)?;
        self.check_node(caller.as_ref(), &node).await?;
        let order = ReadOrder::new(request.paths)
            .map_err(|bounds| PlinthError::invalid(bounds.to_string()))?;
        let not_found = || missing_version(&request.environment_id, request.version);
        let environment = EnvironmentId::parse(&request.environment_id).ok_or_else(not_found)?;
        let stored = self
            .store
            .record_read_order(&node, &environment, request.version, &order)
            .await
            .map_err(|error| match error {
                StoreError::NotFound => not_found(),
                other => PlinthError::internal(&other),
            })?;
        if stored {
            tracing::info!(node = %node, environment = %environment, version = request.version, paths = order.paths().len(), "read order recorded");
        }
        Ok(Response::new(pb::RecordReadOrderResponse { stored }))
    }

    #[tracing::instrument(name = "catalog.get_read_order", skip_all)]
    async fn get_read_order(
        &self,
        request: Request<pb::GetReadOrderRequest>,
    ) -> Result<Response<pb::GetReadOrderResponse>, Status> {
        let request = request.into_inner();
        let Some(environment) = EnvironmentId::parse(&request.environment_id) else {
            return Ok(Response::new(pb::GetReadOrderResponse::default()));
        };
        let order = self
            .store
            .read_order(&environment, request.version)
            .await
            .map_err(|error| PlinthError::internal(&error))?;
        Ok(Response::new(pb::GetReadOrderResponse {
            paths: order.map(ReadOrder::into_paths).unwrap_or_default(),
        }))
    }

    #[tracing::instrument(name = "catalog.deregister_node", skip_all)]
    async fn deregister_node(
        &self,
        request: Request<pb::DeregisterNodeRequest>,
    ) -> Result<Response<pb::DeregisterNodeResponse>, Status> {
        let caller = Principal::of(&request).cloned();
        let request = request.into_inner();
        if let Some(caller) = caller
            && !caller.may_act_as(&request.name)
        {
            return Err(not_this_node(&caller));
        }
        let (id, active_sessions) =
            self.store
                .leave_node(&request.name)
                .await
                .map_err(|error| match error {
                    StoreError::NotFound => missing("node", &request.name),
                    other => PlinthError::internal(&other),
                })?;
        tracing::info!(node = %id, name = %request.name, active_sessions, "node left on purpose; it gets no sessions until it registers again");
        Ok(Response::new(pb::DeregisterNodeResponse {
            node_id: id.as_str().to_owned(),
            active_sessions,
        }))
    }

    #[tracing::instrument(name = "catalog.create_session", skip_all)]
    async fn create_session(
        &self,
        request: Request<pb::CreateSessionRequest>,
    ) -> Result<Response<pb::Session>, Status> {
        let request = request.into_inner();
        let mut new = self.new_session(
            &request.scope,
            &request.environment_id,
            request.harness_id,
            request.version,
            request.owner,
            request.limits,
        )?;
        if !request.exclude_node.is_empty() {
            // An id that names no node excludes nothing; it is not worth refusing the create.
            new.exclude_node = NodeId::parse(&request.exclude_node);
        }
        let session = self
            .store
            .create_session(new)
            .await
            .map_err(|error| placement_error(error, &request.environment_id))?;
        tracing::info!(session = %session.id, environment = %session.environment_id, version = session.version, node = %session.node_id, excluded = %request.exclude_node, "session created");
        Ok(Response::new(session.into()))
    }

    #[tracing::instrument(name = "catalog.mark_node_suspect", skip_all)]
    async fn mark_node_suspect(
        &self,
        request: Request<pb::MarkNodeSuspectRequest>,
    ) -> Result<Response<pb::MarkNodeSuspectResponse>, Status> {
        let request = request.into_inner();
        if request.address.is_empty() || request.address.len() > 2048 {
            return Err(PlinthError::invalid("a node's address (≤ 2048 bytes) is required").into());
        }
        let until_ms = match request.suspect_for_ms {
            0 => 0,
            ms => now_ms().saturating_add(
                i64::try_from(ms.min(MAX_SUSPECT_MS)).unwrap_or(MAX_SUSPECT_MS as i64),
            ),
        };
        let nodes = self
            .store
            .mark_node_suspect(&request.address, until_ms)
            .await
            .map_err(|error| PlinthError::internal(&error))?;
        if until_ms > 0 {
            tracing::warn!(address = %request.address, nodes, for_ms = request.suspect_for_ms, "a gateway cannot reach a node; no new sessions go to it");
        } else {
            tracing::info!(address = %request.address, nodes, "a node answers its gateway again; it takes new sessions");
        }
        Ok(Response::new(pb::MarkNodeSuspectResponse {
            nodes: u32::try_from(nodes).unwrap_or(u32::MAX),
        }))
    }

    #[tracing::instrument(name = "catalog.mark_attached", skip_all)]
    async fn mark_attached(
        &self,
        request: Request<pb::MarkAttachedRequest>,
    ) -> Result<Response<pb::Session>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let id = session_id(&request.id)?;
        let session = self
            .store
            .mark_attached(&scope, &id, &request.workdir, request.isolated)
            .await
            .map_err(|error| session_error(error, &request.id))?;
        Ok(Response::new(session.into()))
    }

    #[tracing::instrument(name = "catalog.get_session", skip_all)]
    async fn get_session(
        &self,
        request: Request<pb::GetSessionRequest>,
    ) -> Result<Response<pb::Session>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let id = session_id(&request.id)?;
        let session = self
            .store
            .get_session(&scope, &id)
            .await
            .map_err(|error| session_error(error, &request.id))?;
        Ok(Response::new(session.into()))
    }

    #[tracing::instrument(name = "catalog.end_session", skip_all)]
    async fn end_session(
        &self,
        request: Request<pb::EndSessionRequest>,
    ) -> Result<Response<pb::Session>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let id = session_id(&request.id)?;
        let session = self
            .store
            .end_session(&scope, &id)
            .await
            .map_err(|error| session_error(error, &request.id))?;
        Ok(Response::new(session.into()))
    }

    #[tracing::instrument(name = "catalog.record_turn", skip_all)]
    async fn record_turn(
        &self,
        request: Request<pb::RecordTurnRequest>,
    ) -> Result<Response<pb::Turn>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let turn = request
            .turn
            .ok_or_else(|| PlinthError::invalid("a turn is required"))?;
        let id = session_id(&turn.session_id)?;
        let kind = TurnKind::from_wire(turn.kind)
            .map_err(|error| PlinthError::invalid(format!("turn.kind: {error}")))?;
        let recorded = self
            .store
            .record_turn(&scope, &id, kind, &turn.detail, turn.exit_code)
            .await
            .map_err(|error| session_error(error, &turn.session_id))?;
        Ok(Response::new(recorded.into()))
    }

    #[tracing::instrument(name = "catalog.touch_session", skip_all)]
    async fn touch_session(
        &self,
        request: Request<pb::TouchSessionRequest>,
    ) -> Result<Response<pb::TouchSessionResponse>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let id = session_id(&request.session_id)?;
        self.store
            .touch_session(&scope, &id)
            .await
            .map_err(|error| session_error(error, &request.session_id))?;
        Ok(Response::new(pb::TouchSessionResponse {}))
    }

    #[tracing::instrument(name = "catalog.finish_turn", skip_all)]
    async fn finish_turn(
        &self,
        request: Request<pb::FinishTurnRequest>,
    ) -> Result<Response<pb::FinishTurnResponse>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let id = session_id(&request.session_id)?;
        self.store
            .finish_turn(&scope, &id, request.sequence, request.exit_code)
            .await
            .map_err(|error| session_error(error, &request.session_id))?;
        Ok(Response::new(pb::FinishTurnResponse {}))
    }

    #[tracing::instrument(name = "catalog.list_turns", skip_all)]
    async fn list_turns(
        &self,
        request: Request<pb::ListTurnsRequest>,
    ) -> Result<Response<pb::ListTurnsResponse>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let id = session_id(&request.id)?;
        let page = PageRequest::new(request.limit, &request.after)?;
        let page = self
            .store
            .list_turns(&scope, &id, &page)
            .await
            .map_err(|error| session_error(error, &request.id))?;
        Ok(Response::new(pb::ListTurnsResponse {
            turns: page.items.into_iter().map(Into::into).collect(),
            has_more: page.next.is_some(),
            next: page.next.map(|cursor| cursor.encode()).unwrap_or_default(),
        }))
    }

    #[tracing::instrument(name = "catalog.list_node_sessions", skip_all)]
    async fn list_node_sessions(
        &self,
        request: Request<pb::ListNodeSessionsRequest>,
    ) -> Result<Response<pb::ListNodeSessionsResponse>, Status> {
        let node = node_id(&request.get_ref().node_id)?;
        self.check_node(Principal::of(&request), &node).await?;
        let request = request.into_inner();
        let page = PageRequest::new(request.limit, &request.after)?;
        let page = self
            .store
            .node_sessions(&node, &page)
            .await
            .map_err(page_error)?;
        Ok(Response::new(pb::ListNodeSessionsResponse {
            sessions: page.items.into_iter().map(Into::into).collect(),
            has_more: page.next.is_some(),
            next: page.next.map(|cursor| cursor.encode()).unwrap_or_default(),
        }))
    }

    #[tracing::instrument(name = "catalog.create_task", skip_all)]
    async fn create_task(
        &self,
        request: Request<pb::CreateTaskRequest>,
    ) -> Result<Response<pb::Task>, Status> {
        let request = request.into_inner();
        let session = self.new_session(
            &request.scope,
            &request.environment_id,
            request.harness_id,
            None,
            String::new(),
            request.limits,
        )?;
        let metadata = if request.metadata_json.is_empty() {
            "{}".to_owned()
        } else {
            request.metadata_json
        };
        let task = self
            .store
            .create_task(NewTask {
                input: request.input,
                metadata,
                session,
            })
            .await
            .map_err(|error| placement_error(error, &request.environment_id))?;
        tracing::info!(task = %task.id, session = %task.session.id, "task created");
        Ok(Response::new(task.into()))
    }

    #[tracing::instrument(name = "catalog.list_sessions", skip_all)]
    async fn list_sessions(
        &self,
        request: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let status = match request.status.as_str() {
            "" => None,
            "active" | "ended" => Some(request.status.as_str()),
            other => {
                return Err(PlinthError::invalid(format!(
                    "status: {other:?} is not a session's status (active or ended)"
                ))
                .into());
            }
        };
        let environment =
            (!request.environment_id.is_empty()).then_some(request.environment_id.as_str());
        let page = PageRequest::new(request.limit, &request.after)?;
        let page = self
            .store
            .scope_sessions(&scope, environment, status, &page)
            .await
            .map_err(page_error)?;
        Ok(Response::new(pb::ListSessionsResponse {
            sessions: page.items.into_iter().map(Into::into).collect(),
            has_more: page.next.is_some(),
            next: page.next.map(|cursor| cursor.encode()).unwrap_or_default(),
        }))
    }

    #[tracing::instrument(name = "catalog.list_owned_sessions", skip_all)]
    async fn list_owned_sessions(
        &self,
        request: Request<pb::ListOwnedSessionsRequest>,
    ) -> Result<Response<pb::ListOwnedSessionsResponse>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        if request.owner.is_empty() {
            return Err(PlinthError::invalid("owner: must not be empty").into());
        }
        let page = PageRequest::new(request.limit, &request.after)?;
        let page = self
            .store
            .owned_sessions(&scope, &request.owner, &page)
            .await
            .map_err(page_error)?;
        Ok(Response::new(pb::ListOwnedSessionsResponse {
            sessions: page.items.into_iter().map(Into::into).collect(),
            has_more: page.next.is_some(),
            next: page.next.map(|cursor| cursor.encode()).unwrap_or_default(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::model::{NewEnvironment, Outcome};
    use crate::domain::warm::{MAX_READ_ORDER_PATH_BYTES, MAX_READ_ORDER_PATHS};
    use crate::persistence::LeasePolicy;
    use pb::session_service_server::SessionService as _;

    /// A store on `url`, with one node and one environment whose version 1 is ready.
    async fn service(url: &str) -> (Sessions, String, String) {
        let key = crate::SealKey::from_bytes(&[9; 32]).expect("key");
        let store = Store::connect(url, 2, key).await.expect("connect");
        store.migrate().await.expect("migrate");
        let scope = Scope::parse("acme").expect("scope");
        let environment = store
            .create_environment(
                NewEnvironment::new(scope.clone(), "Studio".into(), String::new(), String::new())
                    .expect("valid"),
            )
            .await
            .expect("create")
            .id;
        store
            .start_build(&scope, &environment, "sha256:source", false)
            .await
            .expect("start");
        let lease = LeasePolicy {
            lease_ms: 60_000,
            max_attempts: 3,
            running_per_scope: 4,
        };
        let claim = store
            .claim_build("builder", lease)
            .await
            .expect("claim")
            .expect("work");
        store
            .complete_build(
                &claim.token,
                Outcome::Ready {
                    layer_tree: "sha256:layer".into(),
                    packages: Vec::new(),
                    size: 1,
                    dependency_key: String::new(),
                    toolchains: Vec::new(),
                },
            )
            .await
            .expect("complete");
        let node = store
            .register_node("host-a", "http://a", true, "", "")
            .await
            .expect("register");
        (
            Sessions::new(store, NodeTtl::default()),
            node.as_str().to_owned(),
            environment.as_str().to_owned(),
        )
    }

    fn record(
        node: &str,
        environment: &str,
        version: u32,
        paths: Vec<String>,
    ) -> Request<pb::RecordReadOrderRequest> {
        Request::new(pb::RecordReadOrderRequest {
            node_id: node.to_owned(),
            environment_id: environment.to_owned(),
            version,
            paths,
        })
    }

    async fn read(sessions: &Sessions, environment: &str, version: u32) -> Vec<String> {
        sessions
            .get_read_order(Request::new(pb::GetReadOrderRequest {
                environment_id: environment.to_owned(),
                version,
            }))
            .await
            .expect("get")
            .into_inner()
            .paths
    }

    async fn read_orders_are_bounded_and_kept_first(url: &str) {
        let (sessions, node, environment) = service(url).await;
        let paths = |paths: &[&str]| paths.iter().map(|path| (*path).to_owned()).collect();

        // Past the bounds: invalid_argument saying them, and nothing stored.
        let too_long = "a".repeat(MAX_READ_ORDER_PATH_BYTES + 1);
        let refused: Vec<Vec<String>> = vec![
            vec!["f".to_owned(); MAX_READ_ORDER_PATHS + 1],
            paths(&["bin/sh", &too_long]),
            paths(&["/etc/passwd"]),
            paths(&["lib/../../etc/passwd"]),
            paths(&["./bin/sh"]),
            paths(&["bin/sh", ""]),
            paths(&["nul\0byte"]),
        ];
        for paths in refused {
            let status = sessions
                .record_read_order(record(&node, &environment, 1, paths.clone()))
                .await
                .expect_err("past the bounds");
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{paths:?}");
            assert!(
                status.message().contains("at most 4096") && status.message().contains("1024"),
                "{}",
                status.message()
            );
            assert!(read(&sessions, &environment, 1).await.is_empty());
        }

        // An unknown environment or version: not_found.
        for (environment, version) in [
            (environment.as_str(), 2),
            ("henv_00000000000000000000000000000000", 1),
            ("not-an-id", 1),
        ] {
            let status = sessions
                .record_read_order(record(&node, environment, version, paths(&["bin/sh"])))
                .await
                .expect_err("no such version");
            assert_eq!(
                status.code(),
                tonic::Code::NotFound,
                "{environment} {version}"
            );
            assert!(read(&sessions, environment, version).await.is_empty());
        }

        // The most paths, each the longest: the first recording is kept, whole.
        let most: Vec<String> = (0..MAX_READ_ORDER_PATHS)
            .map(|index| format!("{index:04}/{}", "x".repeat(MAX_READ_ORDER_PATH_BYTES - 5)))
            .collect();
        let first = sessions
            .record_read_order(record(&node, &environment, 1, most.clone()))
            .await
            .expect("record")
            .into_inner();
        assert!(first.stored);
        let later = sessions
            .record_read_order(record(&node, &environment, 1, paths(&["bin/sh"])))
            .await
            .expect("record")
            .into_inner();
        assert!(!later.stored);
        assert_eq!(read(&sessions, &environment, 1).await, most);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_read_orders_are_bounded_and_kept_first() {
        let dir = tempfile::tempdir().expect("temp dir");
        read_orders_are_bounded_and_kept_first(&crate::testing::sqlite_url(dir.path())).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_read_orders_are_bounded_and_kept_first() {
        let crate::testing::PostgresAvailability::Available(server) = crate::testing::postgres()
        else {
            return;
        };
        read_orders_are_bounded_and_kept_first(
            &crate::testing::fresh_postgres_database(&server).await,
        )
        .await;
    }
}
