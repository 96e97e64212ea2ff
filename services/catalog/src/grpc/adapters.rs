//! The gRPC face of workspace adapters (`plinth.catalog.v1.AdapterService`): wire types are
//! validated into domain types on receipt, the store does the work.

use std::time::Duration;

use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::catalog::v1 as pb;
use tonic::{Request, Response, Status};

use crate::domain::adapters::{
    Adapter, AdapterId, Credential, NewAdapter, Protocol, callback_origins, rotation_grace,
};
use crate::domain::model::{EnvironmentId, Scope};
use crate::domain::sessions::NodeTtl;
use crate::domain::sessions::{SessionId, TurnKind};
use crate::persistence::{Claimed, NewTurn, SignedCall, SignedCallSeen, Store, StoreError};

/// How long an idempotency key's answer is kept.
pub const IDEMPOTENCY_RETENTION_MS: i64 = 24 * 60 * 60 * 1000;

/// The `plinth.catalog.v1.AdapterService` implementation.
pub struct Adapters {
    store: Store,
    grace: Duration,
    nodes: NodeTtl,
}

impl Adapters {
    /// `grace`: how long a rotated-out credential is still accepted when the rotation does not
    /// say.
    pub fn new(store: Store, grace: Duration, nodes: NodeTtl) -> Self {
        Adapters {
            store,
            grace,
            nodes,
        }
    }
}

/// An adapter that is not in the scope (or not at all) is `not_found`; the environment a
/// create names, when it is not in the scope, is `environment_not_found`.
fn store_error(error: StoreError, id: &str, environment: &str) -> PlinthError {
    match error {
        StoreError::NotFound => adapter_not_found(id),
        StoreError::NoSuchEnvironment => PlinthError::new(
            ErrorCode::EnvironmentNotFound,
            format!(
                "environment {environment:?} was not found in this scope; an adapter can name only an environment of its own scope"
            ),
        ),
        other => PlinthError::internal(&other),
    }
}

/// The turn a finished call or operation carries, checked as RecordTurn checks it.
pub(crate) fn new_turn(request: pb::RecordTurnRequest) -> Result<NewTurn, PlinthError> {
    let scope = Scope::parse(&request.scope)?;
    let turn = request
        .turn
        .ok_or_else(|| PlinthError::invalid("turn.turn: required"))?;
    let session = SessionId::parse(&turn.session_id).ok_or_else(|| {
        PlinthError::invalid(format!("turn: {:?} is not a session id", turn.session_id))
    })?;
    let kind = TurnKind::from_wire(turn.kind)
        .map_err(|error| PlinthError::invalid(format!("turn.kind: {error}")))?;
    Ok(NewTurn {
        scope,
        session,
        kind,
        detail: turn.detail,
        exit_code: turn.exit_code,
    })
}

fn adapter_not_found(id: &str) -> PlinthError {
    PlinthError::new(
        ErrorCode::NotFound,
        format!("workspace adapter {id:?} was not found"),
    )
}

fn parse_id(id: &str) -> Result<AdapterId, PlinthError> {
    AdapterId::parse(id).ok_or_else(|| adapter_not_found(id))
}

impl From<Adapter> for pb::Adapter {
    fn from(adapter: Adapter) -> Self {
        pb::Adapter {
            id: adapter.id.as_str().to_owned(),
            scope: adapter.scope.as_str().to_owned(),
            protocol: adapter.protocol.into(),
            environment_id: adapter.environment_id.as_str().to_owned(),
            created_at_ms: adapter.created_at_ms,
            rotated_at_ms: adapter.rotated_at_ms,
            previous_expires_at_ms: adapter.previous_expires_at_ms,
            callback_origins: adapter.callback_origins,
        }
    }
}

#[tonic::async_trait]
impl pb::adapter_service_server::AdapterService for Adapters {
    #[tracing::instrument(name = "catalog.create_adapter", skip_all, fields(scope = %request.get_ref().scope, protocol = request.get_ref().protocol))]
    async fn create_adapter(
        &self,
        request: Request<pb::CreateAdapterRequest>,
    ) -> Result<Response<pb::AdapterWithCredential>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let protocol = Protocol::try_from(request.protocol)
            .ok()
            .filter(|protocol| *protocol != Protocol::Unspecified)
            .ok_or_else(|| {
                PlinthError::invalid(format!(
                    "protocol: {} is not one of NOVO, BRAIN",
                    request.protocol
                ))
            })?;
        let environment_id = EnvironmentId::parse(&request.environment_id).ok_or_else(|| {
            store_error(StoreError::NoSuchEnvironment, "", &request.environment_id)
        })?;
        let credential = Credential::new(protocol, &request.secret)?;
        let origins = callback_origins(protocol, &request.callback_origins)?;
        let adapter = self
            .store
            .create_adapter(NewAdapter {
                scope,
                protocol,
                environment_id,
                stored_credential: credential.stored,
                callback_origins: origins,
            })
            .await
            .map_err(|error| store_error(error, "", &request.environment_id))?;
        tracing::info!(id = %adapter.id, environment = %adapter.environment_id, "workspace adapter created");
        Ok(Response::new(pb::AdapterWithCredential {
            adapter: Some(adapter.into()),
            credential: credential.shown,
        }))
    }

    #[tracing::instrument(name = "catalog.get_adapter", skip_all, fields(scope = %request.get_ref().scope, id = %request.get_ref().id))]
    async fn get_adapter(
        &self,
        request: Request<pb::GetAdapterRequest>,
    ) -> Result<Response<pb::Adapter>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let id = parse_id(&request.id)?;
        let adapter = self
            .store
            .get_adapter(&scope, &id)
            .await
            .map_err(|error| store_error(error, &request.id, ""))?;
        Ok(Response::new(adapter.into()))
    }

    #[tracing::instrument(name = "catalog.delete_adapter", skip_all, fields(scope = %request.get_ref().scope, id = %request.get_ref().id))]
    async fn delete_adapter(
        &self,
        request: Request<pb::DeleteAdapterRequest>,
    ) -> Result<Response<pb::DeleteAdapterResponse>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let id = parse_id(&request.id)?;
        self.store
            .delete_adapter(&scope, &id)
            .await
            .map_err(|error| store_error(error, &request.id, ""))?;
        tracing::info!("workspace adapter deleted");
        Ok(Response::new(pb::DeleteAdapterResponse {}))
    }

    #[tracing::instrument(name = "catalog.rotate_adapter_credential", skip_all, fields(scope = %request.get_ref().scope, id = %request.get_ref().id))]
    async fn rotate_adapter_credential(
        &self,
        request: Request<pb::RotateAdapterCredentialRequest>,
    ) -> Result<Response<pb::AdapterWithCredential>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let id = parse_id(&request.id)?;
        let existing = self
            .store
            .get_adapter(&scope, &id)
            .await
            .map_err(|error| store_error(error, &request.id, ""))?;
        // A secret for a Brain adapter is well formed; the adapter's protocol takes none.
        let credential = Credential::new(existing.protocol, &request.secret).map_err(|error| {
            if existing.protocol == Protocol::Brain && !request.secret.is_empty() {
                PlinthError::new(ErrorCode::Conflict, error.message)
            } else {
                error
            }
        })?;
        let grace = match request.grace_ms {
            Some(ms) => rotation_grace(ms)?,
            None => self.grace,
        };
        let grace_ms = i64::try_from(grace.as_millis()).unwrap_or(i64::MAX);
        let adapter = self
            .store
            .rotate_adapter(&scope, &id, &credential.stored, grace_ms)
            .await
            .map_err(|error| store_error(error, &request.id, ""))?;
        tracing::info!(
            grace_ms,
            previous_expires_at_ms = adapter.previous_expires_at_ms,
            "workspace adapter credential rotated"
        );
        Ok(Response::new(pb::AdapterWithCredential {
            adapter: Some(adapter.into()),
            credential: credential.shown,
        }))
    }

    #[tracing::instrument(name = "catalog.update_adapter", skip_all, fields(scope = %request.get_ref().scope, id = %request.get_ref().id))]
    async fn update_adapter(
        &self,
        request: Request<pb::UpdateAdapterRequest>,
    ) -> Result<Response<pb::Adapter>, Status> {
        let request = request.into_inner();
        let scope = Scope::parse(&request.scope)?;
        let id = parse_id(&request.id)?;
        let existing = self
            .store
            .get_adapter(&scope, &id)
            .await
            .map_err(|error| store_error(error, &request.id, ""))?;
        let Some(given) = request.callback_origins else {
            return Ok(Response::new(existing.into()));
        };
        // The body is well formed; it is the adapter's protocol that takes no origins.
        let origins = callback_origins(existing.protocol, &given.origins).map_err(|error| {
            if existing.protocol != Protocol::Brain && !given.origins.is_empty() {
                PlinthError::new(ErrorCode::Conflict, error.message)
            } else {
                error
            }
        })?;
        let adapter = self
            .store
            .set_callback_origins(&scope, &id, &origins)
            .await
            .map_err(|error| store_error(error, &request.id, ""))?;
        tracing::info!(callback_origins = ?adapter.callback_origins, "workspace adapter updated");
        Ok(Response::new(adapter.into()))
    }

    #[tracing::instrument(name = "catalog.get_adapter_credentials", skip_all, fields(id = %request.get_ref().id))]
    async fn get_adapter_credentials(
        &self,
        request: Request<pb::GetAdapterCredentialsRequest>,
    ) -> Result<Response<pb::AdapterCredentials>, Status> {
        let request = request.into_inner();
        let id = parse_id(&request.id)?;
        let found = self
            .store
            .adapter_credentials(&id)
            .await
            .map_err(|error| store_error(error, &request.id, ""))?;
        Ok(Response::new(pb::AdapterCredentials {
            adapter: Some(found.adapter.into()),
            current: found.current,
            previous: found.previous.unwrap_or_default(),
        }))
    }

    #[tracing::instrument(name = "catalog.open_run", skip_all, fields(adapter = %request.get_ref().adapter_id))]
    async fn open_run(
        &self,
        request: Request<pb::OpenRunRequest>,
    ) -> Result<Response<pb::Run>, Status> {
        let request = request.into_inner();
        let id = parse_id(&request.adapter_id)?;
        let run = &request.run_id;
        if run.is_empty() || run.len() > 256 || !run.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(PlinthError::new(
                ErrorCode::WorkspaceInvalidRequest,
                "a run id is 1 to 256 printable ASCII characters",
            )
            .into());
        }
        let adapter = self
            .store
            .adapter_credentials(&id)
            .await
            .map_err(|error| store_error(error, &request.adapter_id, ""))?
            .adapter;
        let limits = crate::grpc::sessions::limits_from_wire(request.limits)?;
        let live_since = self.nodes.live_since_ms();
        let opened = self
            .store
            .open_run(&adapter, run, live_since, limits)
            .await
            .map_err(|error| match error {
                StoreError::RunEnded => PlinthError::new(
                    ErrorCode::WorkspaceRunEnded,
                    format!("run {run:?} ended (idle too long, or past its session's lifetime); its workspace is gone, start a new run"),
                ),
                StoreError::NotFound => PlinthError::new(
                    ErrorCode::EnvironmentNotFound,
                    format!("environment {} of this adapter was not found", adapter.environment_id),
                ),
                StoreError::NothingBuilt => PlinthError::new(
                    ErrorCode::EnvironmentNotReady,
                    format!("environment {} has no ready version: build it first", adapter.environment_id),
                ),
                StoreError::NoLiveNode => crate::grpc::sessions::no_live_node(),
                StoreError::NoCapacity {
                    live_nodes,
                    memory_mb,
                } => crate::grpc::sessions::no_capacity(live_nodes, memory_mb),
                StoreError::QuotaExceeded { quota, limit, used } => {
                    plinth_kit::quota::exceeded(quota, limit, used)
                }
                other => PlinthError::internal(&other),
            })?;
        if opened.created {
            tracing::info!(session = %opened.session.id, run = %run, "run session created");
        }
        Ok(Response::new(pb::Run {
            session: Some(opened.session.into()),
            started_at_ms: opened.started_at_ms,
            created: opened.created,
        }))
    }

    #[tracing::instrument(name = "catalog.end_idle_runs", skip_all)]
    async fn end_idle_runs(
        &self,
        request: Request<pb::EndIdleRunsRequest>,
    ) -> Result<Response<pb::EndIdleRunsResponse>, Status> {
        let request = request.into_inner();
        let ended = self
            .store
            .end_idle_runs(request.idle_before_ms)
            .await
            .map_err(|error| PlinthError::internal(&error))?;
        // Idempotency records past their retention go in the same sweep.
        let purged = self
            .store
            .purge_keys()
            .await
            .map_err(|error| PlinthError::internal(&error))?;
        // And Novo signatures whose `t` is no longer accepted.
        let forgotten = self
            .store
            .purge_signatures()
            .await
            .map_err(|error| PlinthError::internal(&error))?;
        if !ended.is_empty() || purged > 0 || forgotten > 0 {
            tracing::info!(ended = ended.len(), purged, forgotten, "idle runs ended");
        }
        Ok(Response::new(pb::EndIdleRunsResponse {
            sessions: ended.into_iter().map(Into::into).collect(),
        }))
    }

    #[tracing::instrument(name = "catalog.claim_idempotency_key", skip_all)]
    async fn claim_idempotency_key(
        &self,
        request: Request<pb::ClaimIdempotencyKeyRequest>,
    ) -> Result<Response<pb::ClaimIdempotencyKeyResponse>, Status> {
        let request = request.into_inner();
        let id = parse_id(&request.adapter_id)?;
        if request.key.is_empty() || request.key.len() > 256 {
            return Err(PlinthError::new(
                ErrorCode::WorkspaceInvalidRequest,
                "an idempotency key is 1 to 256 bytes",
            )
            .into());
        }
        let claimed = self
            .store
            .claim_key(
                &id,
                &request.key,
                &request.run_id,
                &request.body_sha256,
                request.lease_ms.max(1000),
                IDEMPOTENCY_RETENTION_MS,
            )
            .await
            .map_err(|error| PlinthError::internal(&error))?;
        Ok(Response::new(claim_response(claimed)))
    }

    #[tracing::instrument(name = "catalog.finish_idempotency_key", skip_all)]
    async fn finish_idempotency_key(
        &self,
        request: Request<pb::FinishIdempotencyKeyRequest>,
    ) -> Result<Response<pb::FinishIdempotencyKeyResponse>, Status> {
        let request = request.into_inner();
        let id = parse_id(&request.adapter_id)?;
        let request_had_turn = request.turn.is_some();
        let turn = request.turn.map(new_turn).transpose()?;
        let (stored, turn) = self
            .store
            .finish_key(
                &id,
                &request.key,
                &request.claim,
                (request.status, &request.response),
                turn.as_ref(),
                IDEMPOTENCY_RETENTION_MS,
            )
            .await
            .map_err(|error| PlinthError::internal(&error))?;
        if turn.is_none() && request_had_turn {
            tracing::warn!(adapter = %id, "an idempotent call's answer is stored, but its session took no turn (it ended)");
        }
        Ok(Response::new(pb::FinishIdempotencyKeyResponse {
            stored,
            turn: turn.map(Into::into),
        }))
    }

    #[tracing::instrument(name = "catalog.release_idempotency_key", skip_all)]
    async fn release_idempotency_key(
        &self,
        request: Request<pb::ReleaseIdempotencyKeyRequest>,
    ) -> Result<Response<pb::FinishIdempotencyKeyResponse>, Status> {
        let request = request.into_inner();
        let id = parse_id(&request.adapter_id)?;
        self.store
            .release_key(&id, &request.key, &request.claim)
            .await
            .map_err(|error| PlinthError::internal(&error))?;
        Ok(Response::new(pb::FinishIdempotencyKeyResponse {
            stored: false,
            turn: None,
        }))
    }

    #[tracing::instrument(name = "catalog.renew_idempotency_key", skip_all)]
    async fn renew_idempotency_key(
        &self,
        request: Request<pb::RenewIdempotencyKeyRequest>,
    ) -> Result<Response<pb::RenewIdempotencyKeyResponse>, Status> {
        let request = request.into_inner();
        let id = parse_id(&request.adapter_id)?;
        let held = self
            .store
            .renew_key(
                &id,
                &request.key,
                &request.claim,
                request.lease_ms.max(1000),
            )
            .await
            .map_err(|error| PlinthError::internal(&error))?;
        Ok(Response::new(pb::RenewIdempotencyKeyResponse { held }))
    }
}

/// What a claim found, as the wire says it (an adapter's key and a tenant request's alike).
pub(crate) fn claim_response(claimed: Claimed) -> pb::ClaimIdempotencyKeyResponse {
    match claimed {
        Claimed::Claimed(claim) => pb::ClaimIdempotencyKeyResponse {
            outcome: pb::IdempotencyOutcome::Claimed.into(),
            claim,
            ..Default::default()
        },
        Claimed::Done { status, response } => pb::ClaimIdempotencyKeyResponse {
            outcome: pb::IdempotencyOutcome::Done.into(),
            status,
            response,
            ..Default::default()
        },
        Claimed::InFlight => pb::ClaimIdempotencyKeyResponse {
            outcome: pb::IdempotencyOutcome::InFlight.into(),
            ..Default::default()
        },
        Claimed::Mismatch => pb::ClaimIdempotencyKeyResponse {
            outcome: pb::IdempotencyOutcome::Mismatch.into(),
            ..Default::default()
        },
    }
}

/// The `plinth.catalog.v1.ReplayMemoryService` implementation: Novo's used signatures.
pub struct ReplayMemory {
    store: Store,
}

impl ReplayMemory {
    /// The replay memory kept in `store`.
    pub fn new(store: Store) -> Self {
        ReplayMemory { store }
    }
}

#[tonic::async_trait]
impl pb::replay_memory_service_server::ReplayMemoryService for ReplayMemory {
    #[tracing::instrument(name = "catalog.admit_signed_call", skip_all)]
    async fn admit_signed_call(
        &self,
        request: Request<pb::AdmitSignedCallRequest>,
    ) -> Result<Response<pb::AdmitSignedCallResponse>, Status> {
        let request = request.into_inner();
        let id = parse_id(&request.adapter_id)?;
        let hex = |text: &str| text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit());
        if !hex(&request.signature_sha256) {
            return Err(PlinthError::invalid(
                "signature_sha256: 64 lowercase hex digits (a SHA-256)",
            )
            .into());
        }
        if request.run_id.len() > 256 || request.request_id.len() > 256 {
            return Err(PlinthError::new(
                ErrorCode::WorkspaceInvalidRequest,
                "Novo-Run-Id and Novo-Request-Id are at most 256 bytes",
            )
            .into());
        }
        let seen = self
            .store
            .admit_signed_call(
                SignedCall {
                    adapter: &id,
                    signature: &request.signature_sha256.to_ascii_lowercase(),
                    run_id: &request.run_id,
                    request_id: &request.request_id,
                    expires_at_ms: request.expires_at_ms,
                    claimed_next: request.claimed_next && !request.request_id.is_empty(),
                },
                request.max_live.max(1),
            )
            .await
            .map_err(|error| PlinthError::internal(&error))?;
        let (admission, retry_at_ms) = match seen {
            SignedCallSeen::First => (pb::SignedCallAdmission::First, 0),
            SignedCallSeen::SameRequest => (pb::SignedCallAdmission::SameRequest, 0),
            SignedCallSeen::Replayed => (pb::SignedCallAdmission::Replayed, 0),
            SignedCallSeen::Full { until_ms } => (pb::SignedCallAdmission::Full, until_ms),
        };
        Ok(Response::new(pb::AdmitSignedCallResponse {
            admission: admission.into(),
            retry_at_ms,
        }))
    }
}
