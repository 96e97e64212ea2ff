//! The gRPC face of the Brain operation ledger and bindings (`plinth.catalog.v1.BrainService`):
//! wire types are validated into domain types on receipt, the store does the work.

use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::catalog::v1 as pb;
use tonic::{Request, Response, Status};

use crate::domain::brain::{
    Binding, BindingKey, BindingState, Claim, Lifetime, NewOperation, Operation, OperationKey,
    OperationKind, valid_name,
};
use crate::domain::model::{EnvironmentId, Scope};
use crate::domain::sessions::SessionId;
use crate::persistence::{Store, StoreError};

/// Longest lease a runner may ask for.
const MAX_LEASE_MS: i64 = 10 * 60 * 1000;
/// Most bytes of a stored receipt or configuration.
const MAX_JSON_BYTES: usize = 8 * 1024 * 1024;
/// Largest message the service takes or answers: a receipt and its envelope.
pub const MAX_MESSAGE_BYTES: usize = MAX_JSON_BYTES + 1024 * 1024;

/// The `plinth.catalog.v1.BrainService` implementation.
pub struct Brain {
    store: Store,
}

impl Brain {
    pub fn new(store: Store) -> Self {
        Brain { store }
    }
}

fn name(field: &str, text: &str) -> Result<(), PlinthError> {
    if valid_name(text) {
        Ok(())
    } else {
        Err(PlinthError::invalid(format!(
            "{field}: not empty, at most {} bytes, no control characters",
            crate::domain::brain::MAX_NAME_BYTES
        )))
    }
}

fn operation_key(key: Option<pb::OperationKey>) -> Result<OperationKey, PlinthError> {
    let key = key.ok_or_else(|| PlinthError::invalid("key: required"))?;
    name("key.adapter_id", &key.adapter_id)?;
    name("key.session_id", &key.session_id)?;
    if i64::try_from(key.sequence).is_err() {
        return Err(PlinthError::invalid("key.sequence: at most 2^63 - 1"));
    }
    Ok(OperationKey {
        adapter_id: key.adapter_id,
        session_id: key.session_id,
        sequence: key.sequence,
    })
}

fn binding_key(key: Option<pb::BindingKey>) -> Result<BindingKey, PlinthError> {
    let key = key.ok_or_else(|| PlinthError::invalid("key: required"))?;
    name("key.adapter_id", &key.adapter_id)?;
    name("key.session_id", &key.session_id)?;
    name("key.environment", &key.environment)?;
    Ok(BindingKey {
        adapter_id: key.adapter_id,
        session_id: key.session_id,
        environment: key.environment,
    })
}

fn lease(ms: i64) -> Result<i64, PlinthError> {
    if (1..=MAX_LEASE_MS).contains(&ms) {
        Ok(ms)
    } else {
        Err(PlinthError::invalid(format!(
            "lease_ms: between 1 and {MAX_LEASE_MS}"
        )))
    }
}

fn json_text(field: &str, text: &str) -> Result<(), PlinthError> {
    if text.len() > MAX_JSON_BYTES {
        return Err(PlinthError::new(
            ErrorCode::FileTooLarge,
            format!("{field}: larger than {MAX_JSON_BYTES} bytes"),
        )
        .with_detail(serde_json::json!({ "max_bytes": MAX_JSON_BYTES })));
    }
    Ok(())
}

fn session(text: &str, field: &str) -> Result<Option<SessionId>, PlinthError> {
    if text.is_empty() {
        return Ok(None);
    }
    SessionId::parse(text)
        .map(Some)
        .ok_or_else(|| PlinthError::invalid(format!("{field}: not a session id")))
}

fn store_error(error: StoreError, what: &str) -> PlinthError {
    match error {
        StoreError::NotFound => {
            PlinthError::new(ErrorCode::NotFound, format!("{what} was not found"))
        }
        StoreError::BindingState(state) => binding_refused(state),
        other => PlinthError::internal(&other),
    }
}

/// A change the binding's life does not allow: `precondition_failed`, with the state it is
/// in as `detail.binding_state` so the caller can answer in its own terms.
fn binding_refused(state: BindingState) -> PlinthError {
    let why = match state {
        BindingState::TornDown => "it was torn down, which is final: set up a new Environment",
        BindingState::Detached => "it is detached: set it up again first",
        BindingState::Attached | BindingState::Unspecified => "its state does not allow it",
    };
    PlinthError::new(
        ErrorCode::PreconditionFailed,
        format!("the binding is {}; {why}", state.label()),
    )
    .with_detail(serde_json::json!({ "binding_state": state.label() }))
}

/// A closed set's value as received: one of its values, never UNSPECIFIED or a number this
/// build does not know.
fn closed<T>(field: &str, value: i32) -> Result<T, PlinthError>
where
    T: TryFrom<i32> + PartialEq + Default + Copy,
{
    T::try_from(value)
        .ok()
        .filter(|value| *value != T::default())
        .ok_or_else(|| PlinthError::invalid(format!("{field}: {value} is not one of its values")))
}

impl From<OperationKey> for pb::OperationKey {
    fn from(key: OperationKey) -> Self {
        pb::OperationKey {
            adapter_id: key.adapter_id,
            session_id: key.session_id,
            sequence: key.sequence,
        }
    }
}

impl From<Operation> for pb::BrainOperation {
    fn from(operation: Operation) -> Self {
        pb::BrainOperation {
            key: Some(operation.key.into()),
            environment: operation.environment,
            kind: operation.kind.into(),
            digest: operation.digest,
            state: operation.state.into(),
            runner: operation.runner,
            lease_until_ms: operation.lease_until_ms,
            cancel_requested: operation.cancel_requested,
            receipt_json: operation.receipt,
            started_at_ms: operation.started_at_ms,
            finished_at_ms: operation.finished_at_ms,
        }
    }
}

impl From<BindingKey> for pb::BindingKey {
    fn from(key: BindingKey) -> Self {
        pb::BindingKey {
            adapter_id: key.adapter_id,
            session_id: key.session_id,
            environment: key.environment,
        }
    }
}

impl From<Binding> for pb::Binding {
    fn from(binding: Binding) -> Self {
        pb::Binding {
            key: Some(binding.key.into()),
            scope: binding.scope.as_str().to_owned(),
            environment_id: binding.environment_id.as_str().to_owned(),
            version: binding.version,
            lifetime: binding.lifetime.into(),
            release_on_turn_end: binding.release_on_turn_end,
            plinth_session_id: binding
                .plinth_session
                .map(|id| id.as_str().to_owned())
                .unwrap_or_default(),
            state: binding.state.into(),
            configuration_json: binding.configuration,
            created_at_ms: binding.created_at_ms,
            updated_at_ms: binding.updated_at_ms,
        }
    }
}

impl TryFrom<pb::Binding> for Binding {
    type Error = PlinthError;

    fn try_from(binding: pb::Binding) -> Result<Self, PlinthError> {
        let key = binding_key(binding.key)?;
        let scope = Scope::parse(&binding.scope)?;
        let environment_id = EnvironmentId::parse(&binding.environment_id).ok_or_else(|| {
            PlinthError::new(
                ErrorCode::EnvironmentNotFound,
                format!("environment {:?} not found", binding.environment_id),
            )
        })?;
        let lifetime: Lifetime = closed("binding.lifetime", binding.lifetime)?;
        json_text("configuration_json", &binding.configuration_json)?;
        Ok(Binding {
            key,
            scope,
            environment_id,
            version: binding.version,
            lifetime,
            release_on_turn_end: binding.release_on_turn_end,
            plinth_session: session(&binding.plinth_session_id, "plinth_session_id")?,
            state: BindingState::Attached,
            configuration: if binding.configuration_json.is_empty() {
                "{}".to_owned()
            } else {
                binding.configuration_json
            },
            created_at_ms: 0,
            updated_at_ms: 0,
        })
    }
}

/// A delivered operation as a claim or a record names it, checked (its lease 0: a claim
/// sets its own), and the receipt an abandoned delivery of it is settled with checked too.
fn new_operation(
    key: Option<pb::OperationKey>,
    environment: String,
    kind: i32,
    digest: String,
    runner: String,
    unknown_receipt_json: &str,
) -> Result<NewOperation, Status> {
    let key = operation_key(key)?;
    name("environment", &environment)?;
    name("digest", &digest)?;
    name("runner", &runner)?;
    if unknown_receipt_json.is_empty() {
        return Err(PlinthError::invalid(
            "unknown_receipt_json: required, the receipt an abandoned operation is settled with",
        )
        .into());
    }
    json_text("unknown_receipt_json", unknown_receipt_json)?;
    let kind: OperationKind = closed("kind", kind)?;
    Ok(NewOperation {
        key,
        environment,
        kind,
        digest,
        runner,
        lease_ms: 0,
    })
}

/// A claim's (or a record's) outcome on the wire.
fn outcome_of(claim: &Claim) -> pb::ClaimOutcome {
    match claim {
        Claim::Claimed(_) => pb::ClaimOutcome::Claimed,
        Claim::Duplicate(_) => pb::ClaimOutcome::Duplicate,
        Claim::InProgress(_) => pb::ClaimOutcome::InProgress,
        Claim::SettledUnknown(_) => pb::ClaimOutcome::SettledUnknown,
        Claim::SequenceReused(_) => pb::ClaimOutcome::SequenceReused,
    }
}

#[tonic::async_trait]
impl pb::brain_service_server::BrainService for Brain {
    #[tracing::instrument(name = "catalog.claim_operation", skip_all)]
    async fn claim_operation(
        &self,
        request: Request<pb::ClaimOperationRequest>,
    ) -> Result<Response<pb::ClaimOperationResponse>, Status> {
        let request = request.into_inner();
        let new = new_operation(
            request.key,
            request.environment,
            request.kind,
            request.digest,
            request.runner,
            &request.unknown_receipt_json,
        )?;
        let new = NewOperation {
            lease_ms: lease(request.lease_ms)?,
            ..new
        };
        let binding = BindingKey {
            adapter_id: new.key.adapter_id.clone(),
            session_id: new.key.session_id.clone(),
            environment: new.environment.clone(),
        };
        let (claim, binding) = self
            .store
            .claim_operation_of(&new, &request.unknown_receipt_json, Some(&binding))
            .await
            .map_err(|error| PlinthError::internal(&error))?;
        Ok(Response::new(pb::ClaimOperationResponse {
            operation: Some(claim.operation().clone().into()),
            outcome: outcome_of(&claim).into(),
            binding: binding.map(Into::into),
        }))
    }

    #[tracing::instrument(name = "catalog.renew_operation", skip_all)]
    async fn renew_operation(
        &self,
        request: Request<pb::RenewOperationRequest>,
    ) -> Result<Response<pb::RenewOperationResponse>, Status> {
        let request = request.into_inner();
        let key = operation_key(request.key)?;
        let renewed = self
            .store
            .renew_operation(&key, &request.runner, lease(request.lease_ms)?)
            .await
            .map_err(|error| PlinthError::internal(&error))?;
        Ok(Response::new(pb::RenewOperationResponse {
            held: renewed.is_some(),
            cancel_requested: renewed.unwrap_or(false),
        }))
    }

    #[tracing::instrument(name = "catalog.finish_operation", skip_all)]
    async fn finish_operation(
        &self,
        request: Request<pb::FinishOperationRequest>,
    ) -> Result<Response<pb::FinishOperationResponse>, Status> {
        let request = request.into_inner();
        let key = operation_key(request.key)?;
        json_text("receipt_json", &request.receipt_json)?;
        let turns = request
            .turns
            .into_iter()
            .map(crate::grpc::adapters::new_turn)
            .collect::<Result<Vec<_>, _>>()?;
        let (recorded, operation) = self
            .store
            .finish_operation(&key, &request.runner, &request.receipt_json, &turns)
            .await
            .map_err(|error| store_error(error, "the operation"))?;
        Ok(Response::new(pb::FinishOperationResponse {
            recorded,
            operation: Some(operation.into()),
        }))
    }

    #[tracing::instrument(name = "catalog.record_operation", skip_all)]
    async fn record_operation(
        &self,
        request: Request<pb::RecordOperationRequest>,
    ) -> Result<Response<pb::RecordOperationResponse>, Status> {
        let request = request.into_inner();
        json_text("receipt_json", &request.receipt_json)?;
        let new = new_operation(
            request.key,
            request.environment,
            request.kind,
            request.digest,
            request.runner,
            &request.unknown_receipt_json,
        )?;
        let turns = request
            .turns
            .into_iter()
            .map(crate::grpc::adapters::new_turn)
            .collect::<Result<Vec<_>, _>>()?;
        let claim = self
            .store
            .record_operation(
                &new,
                &request.receipt_json,
                &turns,
                &request.unknown_receipt_json,
            )
            .await
            .map_err(|error| PlinthError::internal(&error))?;
        Ok(Response::new(pb::RecordOperationResponse {
            operation: Some(claim.operation().clone().into()),
            outcome: outcome_of(&claim).into(),
        }))
    }

    #[tracing::instrument(name = "catalog.cancel_operation", skip_all)]
    async fn cancel_operation(
        &self,
        request: Request<pb::CancelOperationRequest>,
    ) -> Result<Response<pb::BrainOperation>, Status> {
        let key = operation_key(request.into_inner().key)?;
        let operation = self
            .store
            .cancel_operation(&key)
            .await
            .map_err(|error| store_error(error, "the operation"))?;
        Ok(Response::new(operation.into()))
    }

    #[tracing::instrument(name = "catalog.count_running", skip_all)]
    async fn count_running(
        &self,
        request: Request<pb::CountRunningRequest>,
    ) -> Result<Response<pb::CountRunningResponse>, Status> {
        let request = request.into_inner();
        let binding = binding_key(request.binding)?;
        let running = self
            .store
            .count_running(&binding, request.before_sequence)
            .await
            .map_err(|error| PlinthError::internal(&error))?;
        Ok(Response::new(pb::CountRunningResponse { running }))
    }

    #[tracing::instrument(name = "catalog.create_binding", skip_all)]
    async fn create_binding(
        &self,
        request: Request<pb::CreateBindingRequest>,
    ) -> Result<Response<pb::CreateBindingResponse>, Status> {
        let binding: Binding = request
            .into_inner()
            .binding
            .ok_or_else(|| PlinthError::invalid("binding: required"))?
            .try_into()?;
        let (created, binding) = self
            .store
            .create_binding(&binding)
            .await
            .map_err(|error| PlinthError::internal(&error))?;
        if created {
            tracing::info!(adapter = %binding.key.adapter_id, brain_session = %binding.key.session_id, environment = %binding.key.environment, version = binding.version, lifetime = binding.lifetime.label(), "brain binding set up");
        }
        Ok(Response::new(pb::CreateBindingResponse {
            created,
            binding: Some(binding.into()),
        }))
    }

    #[tracing::instrument(name = "catalog.get_binding", skip_all)]
    async fn get_binding(
        &self,
        request: Request<pb::GetBindingRequest>,
    ) -> Result<Response<pb::Binding>, Status> {
        let request = request.into_inner();
        let key = binding_key(Some(pb::BindingKey {
            adapter_id: request.adapter_id,
            session_id: request.session_id,
            environment: request.environment,
        }))?;
        let binding = self
            .store
            .binding(&key)
            .await
            .map_err(|error| store_error(error, "the binding"))?;
        Ok(Response::new(binding.into()))
    }

    #[tracing::instrument(name = "catalog.swap_binding_session", skip_all)]
    async fn swap_binding_session(
        &self,
        request: Request<pb::SwapBindingSessionRequest>,
    ) -> Result<Response<pb::SwapBindingSessionResponse>, Status> {
        let request = request.into_inner();
        let key = binding_key(request.key)?;
        let expected = session(&request.expected, "expected")?;
        let replacement = session(&request.replacement, "replacement")?;
        let (swapped, binding) = self
            .store
            .swap_binding_session(&key, expected.as_ref(), replacement.as_ref())
            .await
            .map_err(|error| store_error(error, "the binding"))?;
        Ok(Response::new(pb::SwapBindingSessionResponse {
            swapped,
            binding: Some(binding.into()),
        }))
    }

    #[tracing::instrument(name = "catalog.set_binding_state", skip_all)]
    async fn set_binding_state(
        &self,
        request: Request<pb::SetBindingStateRequest>,
    ) -> Result<Response<pb::Binding>, Status> {
        let request = request.into_inner();
        let key = binding_key(request.key)?;
        let state: BindingState = closed("state", request.state)?;
        let binding = self
            .store
            .set_binding_state(&key, state)
            .await
            .map_err(|error| store_error(error, "the binding"))?;
        Ok(Response::new(binding.into()))
    }
}
