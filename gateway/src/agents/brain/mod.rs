//! The Brain environment service: `POST /v1/workspace-adapters/{id}/brain/v1/operations`,
//! where Brain delivers every `environment/v1` operation of its sessions (setup, turn-end
//! release, detach, teardown, tool executions, cancellations) and gets one receipt back.
//!
//! The adapter registration (`/v1/workspace-adapters`, protocol `brain`) gives the base URL
//! and the bearer token; a request without that token is refused before anything runs. Each
//! Brain session's Environment is a *binding* whose resources are a Plinth session on the
//! adapter's environment, with the version pinned at setup mounted read-only at
//! `/env/<slug>` (`lifecycle`); tools run there over the node agent (`tools`).
//!
//! Delivery: an operation is `(adapter, session_id, sequence)`. It is claimed in the catalog
//! before anything runs, so a duplicate delivery, even after a restart, never runs it again.
//! The catalog decides what a duplicate answers (`ClaimOutcome`): the stored receipt,
//! `progress` while the first delivery still runs (its runner renews a lease, `ledger`),
//! `unknown` once that runner stopped renewing without a result (settled in the claim; the
//! effect may have happened and Plinth never retries it), or `sequence_reused`; this module
//! only maps that outcome to a receipt. A read (a tool that changes nothing) is not claimed:
//! it runs, and its receipt is stored with its turn in one catalog write that answers, like
//! a claim, what a delivery stored first. Either way the receipt is committed before it is
//! answered, so every delivery answers the first receipt given, whichever process is killed
//! after; the catalog syncs it to disk just after (a claim, before anything runs), and a loss
//! of power in that moment can cost only the receipt: the redelivery of an effect then
//! answers `unknown`, and of a read, reads again (see docs/design/decisions.md). A delivery
//! that meets the first one running in the same gateway waits briefly for its answer.

mod callbacks;
mod lifecycle;
mod receipt;
mod tools;

pub(crate) use callbacks::CallbackAddresses;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, header};
use plinth_kit::grpc::constant_time_eq;
use plinth_kit::tasks::CancellationToken;
use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::catalog::v1 as pb;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::agents::Agents;
use crate::http::error::{ApiError, ErrorBody};
use axum::extract::FromRef;
pub use receipt::Receipt;
use receipt::codes;

/// The one contract served.
pub const CONTRACT: &str = "environment/v1";

/// Largest operation body accepted (a tool's input carries file contents).
const MAX_BODY_BYTES: usize = 80 * 1024 * 1024;

/// Largest receipt stored (the catalog keeps up to 8 MiB).
const MAX_RECEIPT_BYTES: usize = 8 * 1024 * 1024 - 4096;

/// Most bytes of a Brain session id or Environment name.
const MAX_NAME_BYTES: usize = 256;

/// The Brain routes.
pub fn routes<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    Agents: FromRef<S>,
{
    OpenApiRouter::new().routes(routes!(operations))
}

/// What one gateway process keeps about the operations it is running: their cancellation
/// handles (a cancellation delivered to this process stops its target at once; one delivered
/// to another replica reaches it through the lease), the answer each will give (a second
/// delivery to this process waits a moment for it), and the lease length.
pub struct Runtime {
    running: Mutex<HashMap<(String, String, u64), Running>>,
    lease: Duration,
    callbacks: callbacks::Caller,
}

/// One operation this process is delivering.
struct Running {
    cancel: CancellationToken,
    digest: String,
    answer: tokio::sync::watch::Receiver<Option<std::sync::Arc<Value>>>,
}

/// What a delivery finds in this process.
enum Entered {
    /// Nothing: this delivery is the operation's, here.
    First(Delivery),
    /// A delivery of the same request runs here: its answer, when it has one.
    Meets(tokio::sync::watch::Receiver<Option<std::sync::Arc<Value>>>),
    /// A delivery of another request under the same sequence runs here.
    Reused,
}

/// This process's delivery of an operation, until dropped.
struct Delivery {
    runtime: std::sync::Arc<Runtime>,
    key: (String, String, u64),
    cancel: CancellationToken,
    answer: tokio::sync::watch::Sender<Option<std::sync::Arc<Value>>>,
}

impl Delivery {
    /// Hands the answer to deliveries waiting for it, ends this delivery, and gives the
    /// answer back: shared, not copied (a listing's receipt can be megabytes), unless a
    /// waiting delivery still holds it.
    fn answered(self, answer: Value) -> Value {
        let answer = std::sync::Arc::new(answer);
        self.answer.send_replace(Some(answer.clone()));
        drop(self);
        std::sync::Arc::try_unwrap(answer).unwrap_or_else(|shared| Value::clone(&shared))
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        self.runtime.lock().remove(&self.key);
    }
}

/// How long a second delivery waits for the answer of the first, running in this process,
/// before it is answered `progress`.
const SHARE_WAIT: Duration = Duration::from_millis(500);

impl Runtime {
    /// Nothing running; claims last `lease` unless renewed (every third of it); callbacks
    /// reach the addresses `callbacks` allows.
    pub fn new(lease: Duration, callbacks: callbacks::CallbackAddresses) -> Self {
        Runtime {
            running: Mutex::new(HashMap::new()),
            lease: lease.max(Duration::from_millis(300)),
            callbacks: callbacks::Caller::new(callbacks),
        }
    }

    /// Where callbacks may go.
    pub fn callback_addresses(&self) -> &callbacks::CallbackAddresses {
        self.callbacks.addresses()
    }

    fn lease_ms(&self) -> i64 {
        crate::runtime::ledger::lease_ms(self.lease)
    }

    /// Enters a delivery of `key` with the request `digest`, unless one runs here already.
    fn enter(self: &std::sync::Arc<Self>, key: &pb::OperationKey, digest: &str) -> Entered {
        let mut running = self.lock();
        if let Some(found) = running.get(&tuple(key)) {
            return if found.digest == digest {
                Entered::Meets(found.answer.clone())
            } else {
                Entered::Reused
            };
        }
        let cancel = CancellationToken::new();
        let (answer, answers) = tokio::sync::watch::channel(None);
        running.insert(
            tuple(key),
            Running {
                cancel: cancel.clone(),
                digest: digest.to_owned(),
                answer: answers,
            },
        );
        Entered::First(Delivery {
            runtime: self.clone(),
            key: tuple(key),
            cancel,
            answer,
        })
    }

    /// Cancels the operation if this process runs it.
    fn cancel_local(&self, key: &pb::OperationKey) -> bool {
        match self.lock().get(&tuple(key)) {
            Some(running) => {
                running.cancel.cancel();
                true
            }
            None => false,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String, u64), Running>> {
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn tuple(key: &pb::OperationKey) -> (String, String, u64) {
    (key.adapter_id.clone(), key.session_id.clone(), key.sequence)
}

/// A command, as Brain sends it. Both fields are read as they come: a command in another
/// contract is answered with an `unsupported` receipt (carrying its sequence), not refused.
#[derive(Debug, Deserialize, ToSchema)]
pub struct OperationCommand {
    /// `environment/v1`.
    #[serde(default)]
    #[schema(value_type = String, example = "environment/v1")]
    pub contract: Value,
    /// `{session_id, environment, sequence, request, binding?, configuration?, template?,
    /// context?, reporter?}`: `sequence` a whole number, `request` the tool call or life-cycle
    /// request, with its `type`.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub operation: Value,
}

/// The answer to every operation.
#[derive(Debug, Serialize, ToSchema)]
pub struct OperationAnswer {
    /// The command's contract, as sent.
    #[schema(value_type = String)]
    pub contract: Value,
    /// The operation's sequence, as sent.
    #[schema(value_type = u64)]
    pub sequence: Value,
    /// `{"type": "accepted" | "progress" | "result" | "returned" | "failure" | "unknown", …}`.
    #[schema(value_type = Object)]
    pub receipt: Value,
}

/// Everything one operation runs with.
pub(crate) struct Context {
    pub state: Agents,
    /// The adapter it came through: its scope and environment.
    pub adapter: pb::Adapter,
    /// The binding it addresses.
    pub binding: pb::BindingKey,
    /// Its sequence.
    pub sequence: u64,
    /// The configuration it carries (the Environment's current configuration).
    pub configuration: Option<Value>,
    /// Cancelled on an explicit cancellation of this operation.
    pub cancel: CancellationToken,
    /// The turns the operation made, recorded with its receipt (one catalog write).
    pub turns: Mutex<Vec<pb::RecordTurnRequest>>,
    /// The binding as its claim found it, until a tool takes it (then it is asked for).
    pub claimed_binding: Mutex<Option<pb::Binding>>,
}

impl Context {
    fn scope(&self) -> &str {
        &self.adapter.scope
    }

    /// Records a tool's turn with the operation's receipt, in the same catalog write
    /// (FinishOperation's `turns`): nothing is written now.
    pub(crate) fn record_with_receipt(
        &self,
        session: &pb::Session,
        kind: pb::TurnKind,
        detail: &str,
        exit_code: Option<i32>,
    ) {
        let turn = crate::runtime::live::turn(self.scope(), session, kind, detail, exit_code);
        self.turns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(turn);
    }

    /// The binding as the operation's claim found it, once.
    pub(crate) fn take_claimed_binding(&self) -> Option<pb::Binding> {
        self.claimed_binding
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    fn take_turns(&self) -> Vec<pb::RecordTurnRequest> {
        std::mem::take(
            &mut *self
                .turns
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

/// Serve one Brain environment operation.
#[utoipa::path(
    post,
    path = "/v1/workspace-adapters/{id}/brain/v1/operations",
    tag = "workspace-adapters",
    params(("id" = String, Path, description = "The Brain adapter's id")),
    request_body = OperationCommand,
    responses(
        (status = 200, description = "The receipt, with the command's contract and sequence", body = OperationAnswer),
        (status = 400, description = "environment_invalid: not a command Plinth can answer (no sequence, no session id)", body = ErrorBody),
        (status = 401, description = "unauthenticated: not this adapter's bearer token", body = ErrorBody),
        (status = 429, description = "rate_limited: this adapter's calls passed its rate (gateway.adapter_rate_limit_per_second); Retry-After says when to retry; nothing ran", body = ErrorBody),
        (status = 503, description = "unavailable: the catalog did not answer; nothing ran, or the outcome could not be recorded", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn operations(
    State(state): State<Agents>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<OperationAnswer>, ApiError> {
    let adapter = authenticate(&state, &id, &headers).await?;
    // Counted once the token is checked: only the adapter's own Brain spends its rate.
    state.adapter_rates.take(&adapter.id)?;
    // Read only once the token is checked, and only up to the limit (a tool's input may carry
    // a file, so axum's 2 MB default for bodies does not apply).
    let body = axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|_| {
            PlinthError::new(
                ErrorCode::FileTooLarge,
                format!(
                    "the operation is larger than {MAX_BODY_BYTES} bytes, or was not received whole"
                ),
            )
            .with_detail(serde_json::json!({ "max_bytes": MAX_BODY_BYTES }))
        })?;
    let OperationCommand {
        contract,
        operation,
    } = serde_json::from_slice(&body).map_err(|error| {
        PlinthError::invalid(format!(
            "request body: expected a JSON object {{contract, operation}}: {error}"
        ))
    })?;
    let operation = match operation {
        Value::Object(operation) => operation,
        _ => serde_json::Map::new(),
    };
    let sequence = operation.get("sequence").cloned().unwrap_or(Value::Null);
    let answer = |receipt: Value| {
        Json(OperationAnswer {
            contract: contract.clone(),
            sequence: sequence.clone(),
            receipt,
        })
    };
    if contract.as_str() != Some(CONTRACT) {
        let receipt = Receipt::unsupported(format!(
            "this environment service speaks contract {CONTRACT:?}, not {contract}"
        ));
        return Ok(answer(to_value(&receipt)));
    }
    let Some(number) = sequence.as_u64().filter(|n| i64::try_from(*n).is_ok()) else {
        return Err(PlinthError::invalid(
            "operation.sequence: expected a whole number from 0 to 2^63 - 1",
        )
        .into());
    };
    let session_id = name_field(&operation, "session_id")?;
    let environment = name_field(&operation, "environment")?;
    let request = operation.get("request").cloned().unwrap_or(Value::Null);
    let kind = kind_of(&request);
    let key = pb::OperationKey {
        adapter_id: adapter.id.clone(),
        session_id: session_id.clone(),
        sequence: number,
    };
    let context = Context {
        state: state.clone(),
        binding: pb::BindingKey {
            adapter_id: adapter.id.clone(),
            session_id,
            environment: environment.clone(),
        },
        adapter,
        sequence: number,
        configuration: operation.get("configuration").cloned(),
        cancel: CancellationToken::new(),
        turns: Mutex::new(Vec::new()),
        claimed_binding: Mutex::new(None),
    };
    let receipt = deliver(context, key, kind, digest(&environment, &request), request).await?;
    Ok(answer(receipt))
}

/// What an operation is, by its request's `type`: one this service serves, or `Other`
/// (answered `unsupported`, or `invalid_request` without a type).
fn kind_of(request: &Value) -> pb::OperationKind {
    request
        .get("type")
        .and_then(Value::as_str)
        .and_then(pb::OperationKind::from_label)
        .unwrap_or(pb::OperationKind::Other)
}

/// The receipt an operation abandoned mid-run is settled with.
fn abandoned() -> Receipt {
    Receipt::Unknown {
        message: Some(
            "the operation was started and its runner stopped before recording a result; it may or may not have had its effect, and Plinth does not run it again".into(),
        ),
    }
}

/// Runs the operation once, or answers what a previous delivery left: a delivery that meets
/// the first one running in this process waits a moment for its answer (then `progress`);
/// a read runs without a claim and is recorded with its receipt in one catalog write
/// ([`deliver_read`]); anything else is claimed before it runs ([`deliver_claimed`]).
async fn deliver(
    context: Context,
    key: pb::OperationKey,
    kind: pb::OperationKind,
    digest: String,
    request: Value,
) -> Result<Value, ApiError> {
    let runtime = context.state.brain_runtime.clone();
    let delivery = match runtime.enter(&key, &digest) {
        Entered::First(delivery) => delivery,
        Entered::Meets(answer) => return Ok(shared(answer).await),
        Entered::Reused => return Ok(sequence_reused(&key)),
    };
    if kind == pb::OperationKind::Execute && tools::reads_only(&request) {
        return deliver_read(context, key, kind, digest, request, delivery).await;
    }
    deliver_claimed(context, key, kind, digest, request, delivery).await
}

/// The answer of the delivery running in this process, once it has one; `progress` if it
/// has none within [`SHARE_WAIT`] (or gave none: its receipt could not be stored, and the
/// ledger answers the next delivery).
async fn shared(mut answer: tokio::sync::watch::Receiver<Option<std::sync::Arc<Value>>>) -> Value {
    let waited = tokio::time::timeout(SHARE_WAIT, answer.wait_for(Option::is_some)).await;
    match waited {
        Ok(Ok(answer)) => answer.as_deref().cloned().unwrap_or_else(progress),
        Ok(Err(_)) | Err(_) => progress(),
    }
}

/// What a delivery meeting the first one still running answers.
fn progress() -> Value {
    to_value(&Receipt::Progress {
        message: Some("the first delivery of this operation is still running".into()),
    })
}

/// A read (a tool that changes nothing): run at once, then its receipt and turn stored in
/// one catalog write, unless a delivery of it was stored first, whose receipt every
/// delivery answers. Run twice (two replicas at once), it changes nothing; one receipt is
/// kept, and only the delivery that stored it calls its callback. A read on a binding with
/// no session (released at a turn's end) would make one, which is an effect: it is claimed
/// as any other operation.
async fn deliver_read(
    mut context: Context,
    key: pb::OperationKey,
    kind: pb::OperationKind,
    digest: String,
    request: Value,
    delivery: Delivery,
) -> Result<Value, ApiError> {
    context.cancel = delivery.cancel.clone();
    let runner = uuid::Uuid::new_v4().simple().to_string();
    let (callback, refusal) = callback_of(&context, &key, kind, &request);
    // Runs to its end, and is stored, even if Brain stops waiting.
    let work = plinth_kit::tasks::spawn(async move {
        let receipt = match (refusal, request.as_object()) {
            (Some(refusal), _) => refusal,
            (None, Some(operation)) => match tools::execute_read(&context, operation).await {
                Some(receipt) => receipt,
                None => {
                    return deliver_claimed(context, key, kind, digest, request, delivery).await;
                }
            },
            (None, None) => {
                return deliver_claimed(context, key, kind, digest, request, delivery).await;
            }
        };
        let turns = context.take_turns();
        let recorded = record(
            &context.state,
            &key,
            &context.binding.environment,
            kind,
            &digest,
            &runner,
            &receipt,
            turns,
        )
        .await;
        let (stored_here, answer) = recorded?;
        let answer = delivery.answered(answer);
        if let (true, Some(callback)) = (stored_here, callback) {
            context
                .state
                .brain_runtime
                .callbacks
                .finish(callback, &key.session_id, key.sequence);
        }
        Ok::<_, ApiError>(answer)
    });
    work.await.map_err(|error| PlinthError::internal(&error))?
}

/// An execution's callback, used by this delivery alone once its receipt is stored, and only
/// at an origin the adapter registered: one elsewhere refuses the execution (the receipt
/// given) before anything runs.
fn callback_of(
    context: &Context,
    key: &pb::OperationKey,
    kind: pb::OperationKind,
    request: &Value,
) -> (Option<callbacks::Callback>, Option<Receipt>) {
    if kind != pb::OperationKind::Execute {
        return (None, None);
    }
    match callbacks::Callback::of_execution(
        request,
        &context.adapter.id,
        &context.adapter.callback_origins,
    ) {
        Ok(callback) => (callback, None),
        Err(failure) => {
            tracing::warn!(adapter = %key.adapter_id, brain_session = %key.session_id, sequence = key.sequence, code = %failure.code, "brain execution refused: its callback is not at a registered origin");
            (None, Some(Receipt::from(failure)))
        }
    }
}

/// Stores a read's receipt and turns; answers whether this one was stored, and the receipt
/// every delivery gets: this one, or the one stored first. Retried as a finish is; if it
/// cannot be stored, the answer is a transport failure, and a redelivery runs the read
/// again.
#[allow(clippy::too_many_arguments)]
async fn record(
    state: &Agents,
    key: &pb::OperationKey,
    environment: &str,
    kind: pb::OperationKind,
    digest: &str,
    runner: &str,
    receipt: &Receipt,
    turns: Vec<pb::RecordTurnRequest>,
) -> Result<(bool, Value), ApiError> {
    let text = storable(receipt);
    let recorded = stored(|| {
        let mut brain = state.brain();
        let request = pb::RecordOperationRequest {
            key: Some(key.clone()),
            environment: environment.to_owned(),
            kind: kind.into(),
            digest: digest.to_owned(),
            runner: runner.to_owned(),
            receipt_json: text.clone(),
            turns: turns.clone(),
            unknown_receipt_json: abandoned().to_json(),
        };
        async move { brain.record_operation(request).await }
    })
    .await;
    let status = match recorded {
        Ok(recorded) => {
            let recorded = recorded.into_inner();
            let outcome = recorded.outcome();
            let stored = recorded.operation.unwrap_or_default();
            return match outcome {
                pb::ClaimOutcome::Claimed => Ok((true, stored_receipt(&stored.receipt_json))),
                other => Ok((false, duplicate(key, other, &stored)?)),
            };
        }
        Err(status) => status,
    };
    tracing::error!(brain_session = %key.session_id, sequence = key.sequence, error = %status.message(), "a brain read's receipt could not be stored");
    Err(PlinthError::new(
        ErrorCode::Unavailable,
        "the read ran but its receipt could not be recorded; nothing changed, and a redelivery reads again",
    )
    .into())
}

/// A catalog write of a receipt, tried up to five times, 200 ms more apart each time, while it
/// fails in a way a retry may pass (the catalog unavailable or unanswered); the last failure
/// otherwise.
async fn stored<T, Call, Fut>(mut call: Call) -> Result<T, tonic::Status>
where
    Call: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let mut attempt = 0u32;
    loop {
        match call().await {
            Ok(answer) => return Ok(answer),
            Err(status) => {
                let transient = matches!(
                    status.code(),
                    tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::DeadlineExceeded
                );
                attempt += 1;
                if !transient || attempt == 5 {
                    return Err(status);
                }
                tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
            }
        }
    }
}

/// Claims the operation and runs it, or answers what a previous delivery left.
async fn deliver_claimed(
    mut context: Context,
    key: pb::OperationKey,
    kind: pb::OperationKind,
    digest: String,
    request: Value,
    delivery: Delivery,
) -> Result<Value, ApiError> {
    let state = context.state.clone();
    let runtime = state.brain_runtime.clone();
    let runner = uuid::Uuid::new_v4().simple().to_string();
    let claim = state
        .brain()
        .claim_operation(pb::ClaimOperationRequest {
            key: Some(key.clone()),
            environment: context.binding.environment.clone(),
            kind: kind.into(),
            digest,
            runner: runner.clone(),
            lease_ms: runtime.lease_ms(),
            unknown_receipt_json: abandoned().to_json(),
        })
        .await?
        .into_inner();
    let outcome = claim.outcome();
    let stored = claim
        .operation
        .ok_or_else(|| PlinthError::new(ErrorCode::Internal, "the claim has no operation"))?;
    if outcome != pb::ClaimOutcome::Claimed {
        let answer = duplicate(&key, outcome, &stored)?;
        if outcome != pb::ClaimOutcome::InProgress {
            return Ok(delivery.answered(answer));
        }
        return Ok(answer);
    }
    tracing::info!(adapter = %key.adapter_id, brain_session = %key.session_id, sequence = key.sequence, environment = %context.binding.environment, kind = kind.label(), "brain operation started");
    context.cancel = delivery.cancel.clone();
    context.claimed_binding = Mutex::new(claim.binding);
    let renewal = hold(
        state.clone(),
        key.clone(),
        runner.clone(),
        context.cancel.clone(),
    );
    let (callback, refusal) = callback_of(&context, &key, kind, &request);
    // The operation runs to its end even if Brain stops waiting: its receipt is stored for the
    // next delivery, and its effect is never left half done by a dropped connection.
    let work = plinth_kit::tasks::spawn(async move {
        let receipt = match refusal {
            Some(refusal) => refusal,
            None => tokio::select! {
                receipt = run(&context, kind, &request) => receipt,
                _lost = renewal => Receipt::Unknown {
                    message: Some("the operation's claim was lost while it ran".into()),
                },
            },
        };
        let turns = context.take_turns();
        let outcome = finish(&context.state, &key, &runner, &receipt, turns).await;
        let (recorded, stored) = outcome?;
        let stored = delivery.answered(stored);
        if let (true, Some(callback)) = (recorded, callback) {
            context
                .state
                .brain_runtime
                .callbacks
                .finish(callback, &key.session_id, key.sequence);
        }
        Ok::<_, ApiError>(stored)
    });
    let stored = work
        .await
        .map_err(|error| PlinthError::internal(&error))??;
    Ok(stored)
}

/// Renews the claim (the gateway's one lease loop, `ledger::hold`) until the operation ends;
/// ends only if the claim is lost. A cancellation asked for through another replica is
/// passed on.
async fn hold(
    state: Agents,
    key: pb::OperationKey,
    runner: String,
    cancel: CancellationToken,
) -> crate::runtime::ledger::Released {
    let lease = state.brain_runtime.lease;
    // The operation's end drops this future; nothing else stops it.
    let stop = CancellationToken::new();
    crate::runtime::ledger::hold("brain operation", lease, stop, Some(cancel), || {
        let mut brain = state.brain();
        let request = pb::RenewOperationRequest {
            key: Some(key.clone()),
            runner: runner.clone(),
            lease_ms: crate::runtime::ledger::lease_ms(lease),
        };
        async move {
            let renewed = brain.renew_operation(request).await?.into_inner();
            Ok(crate::runtime::ledger::Renewed {
                held: renewed.held,
                cancel_requested: renewed.cancel_requested,
            })
        }
    })
    .await
}

/// Stores the receipt; answers whether this runner's was stored, and the one every delivery
/// will get. If it cannot be stored, the answer is a transport failure: a redelivery will say
/// `unknown`, never something else.
async fn finish(
    state: &Agents,
    key: &pb::OperationKey,
    runner: &str,
    receipt: &Receipt,
    turns: Vec<pb::RecordTurnRequest>,
) -> Result<(bool, Value), ApiError> {
    let text = storable(receipt);
    let finished = stored(|| {
        let mut brain = state.brain();
        let request = pb::FinishOperationRequest {
            key: Some(key.clone()),
            runner: runner.to_owned(),
            receipt_json: text.clone(),
            turns: turns.clone(),
        };
        async move { brain.finish_operation(request).await }
    })
    .await;
    let status = match finished {
        Ok(finished) => {
            let finished = finished.into_inner();
            let stored = finished.operation.unwrap_or_default();
            if !finished.recorded {
                tracing::warn!(brain_session = %key.session_id, sequence = key.sequence, "a brain operation finished after it was settled; the stored receipt stands");
            }
            return Ok((finished.recorded, stored_receipt(&stored.receipt_json)));
        }
        Err(status) => status,
    };
    tracing::error!(brain_session = %key.session_id, sequence = key.sequence, error = %status.message(), "a brain operation's receipt could not be stored");
    Err(PlinthError::new(
        ErrorCode::Unavailable,
        "the operation ran but its receipt could not be recorded; a redelivery answers `unknown`",
    )
    .into())
}

/// The receipt as stored: an output too large to keep is a failure saying so.
fn storable(receipt: &Receipt) -> String {
    let text = receipt.to_json();
    if text.len() <= MAX_RECEIPT_BYTES {
        return text;
    }
    // An output this large cannot be kept for redelivery; the tool's own paging (`max_bytes`,
    // line ranges, `read_command_output`) gets it in parts.
    Receipt::Failure(receipt::Failure {
        code: ErrorCode::FileTooLarge.as_str().to_owned(),
        message: format!(
            "the operation's output is larger than {MAX_RECEIPT_BYTES} bytes; ask for less (max_bytes, a line range)"
        ),
        retryable: false,
        details: Some(serde_json::json!({ "max_bytes": MAX_RECEIPT_BYTES })),
    })
    .to_json()
}

/// `sequence_reused`: the sequence was delivered with another request.
fn sequence_reused(key: &pb::OperationKey) -> Value {
    to_value(&Receipt::failure(
        codes::SEQUENCE_REUSED,
        format!(
            "sequence {} of this session was delivered before with a different request; an operation is never changed",
            key.sequence
        ),
        false,
    ))
}

/// What a second delivery of an operation answers: the catalog's outcome, as a receipt.
fn duplicate(
    key: &pb::OperationKey,
    outcome: pb::ClaimOutcome,
    stored: &pb::BrainOperation,
) -> Result<Value, ApiError> {
    match outcome {
        pb::ClaimOutcome::Duplicate | pb::ClaimOutcome::SettledUnknown => {
            Ok(stored_receipt(&stored.receipt_json))
        }
        pb::ClaimOutcome::InProgress => Ok(progress()),
        pb::ClaimOutcome::SequenceReused => Ok(sequence_reused(key)),
        // Nothing was run for this delivery: say so, rather than guess what the catalog meant.
        pb::ClaimOutcome::Claimed | pb::ClaimOutcome::Unspecified => Err(PlinthError::new(
            ErrorCode::Internal,
            format!(
                "the catalog answered claim outcome {} for a delivered operation, which this gateway does not know; nothing ran",
                outcome.as_str_name()
            ),
        )
        .into()),
    }
}

/// Runs one claimed operation of `kind` (read from the request by [`kind_of`]).
async fn run(context: &Context, kind: pb::OperationKind, request: &Value) -> Receipt {
    let Some(request) = request.as_object() else {
        return Receipt::invalid("operation.request: expected an object with a `type`");
    };
    let Some(named) = request.get("type").and_then(Value::as_str) else {
        return Receipt::invalid("operation.request.type: expected a string");
    };
    match kind {
        pb::OperationKind::Setup => lifecycle::setup(context).await,
        pb::OperationKind::Call => lifecycle::call(context, request).await,
        pb::OperationKind::Detach => lifecycle::detach(context).await,
        pb::OperationKind::Teardown => lifecycle::teardown(context).await,
        pb::OperationKind::Execute => tools::execute(context, request).await,
        pb::OperationKind::Cancel => cancel(context, request).await,
        pb::OperationKind::Other | pb::OperationKind::Unspecified => Receipt::unsupported(format!(
            "operation {named:?} is not served here; this environment service serves setup, call (release), detach, teardown, execute (tools) and cancel"
        )),
    }
}

/// `cancel {sequence}`: an explicit cancellation of a running execution of this session.
async fn cancel(context: &Context, request: &serde_json::Map<String, Value>) -> Receipt {
    let Some(target) = request.get("sequence").and_then(Value::as_u64) else {
        return Receipt::invalid("operation.request.sequence: the sequence to cancel");
    };
    let key = pb::OperationKey {
        adapter_id: context.adapter.id.clone(),
        session_id: context.binding.session_id.clone(),
        sequence: target,
    };
    let marked = context
        .state
        .brain()
        .cancel_operation(pb::CancelOperationRequest {
            key: Some(key.clone()),
        })
        .await;
    let operation = match marked {
        Ok(operation) => operation.into_inner(),
        Err(status) => {
            let error = PlinthError::from_status(&status);
            if error.code == ErrorCode::NotFound {
                // A read runs without a claim: the ledger has it only once it is stored.
                if context.state.brain_runtime.cancel_local(&key) {
                    tracing::info!(brain_session = %key.session_id, sequence = target, "brain cancellation of a read asked");
                    return Receipt::Returned {
                        output: Some(serde_json::json!({
                            "sequence": target,
                            "running": true,
                            "cancel_requested": true,
                        })),
                    };
                }
                return Receipt::failure(
                    "not_found",
                    format!("sequence {target} of this session was never delivered here"),
                    false,
                );
            }
            return receipt::from_error(&error).into();
        }
    };
    let local = context.state.brain_runtime.cancel_local(&key);
    let running = operation.state() == pb::OperationState::Started;
    tracing::info!(brain_session = %key.session_id, sequence = target, running, local, "brain cancellation asked");
    Receipt::Returned {
        output: Some(serde_json::json!({
            "sequence": target,
            "running": running,
            "cancel_requested": running,
        })),
    }
}

/// The adapter whose bearer token the request carries; anything else is `unauthenticated`,
/// and nothing runs.
async fn authenticate(
    state: &Agents,
    id: &str,
    headers: &HeaderMap,
) -> Result<pb::Adapter, ApiError> {
    let refused = |message: &str| ApiError(PlinthError::new(ErrorCode::Unauthenticated, message));
    let token = headers
        .get(header::AUTHORIZATION)
        .map(|value| value.as_bytes())
        .and_then(bearer)
        .ok_or_else(|| {
            refused("this endpoint needs `Authorization: Bearer <the adapter's token>`")
        })?;
    let found = state.adapter_credentials.get(state, id).await;
    let credentials = match found {
        Ok(credentials) => credentials,
        Err(status) => {
            let error = PlinthError::from_status(&status);
            return Err(match error.code {
                ErrorCode::NotFound | ErrorCode::EnvironmentInvalid => {
                    refused("the bearer token is not valid for this adapter")
                }
                _ => ApiError(error),
            });
        }
    };
    let adapter = credentials.adapter.unwrap_or_default();
    let presented = plinth_kit::hex(&Sha256::digest(token));
    let current = constant_time_eq(presented.as_bytes(), credentials.current.as_bytes());
    let previous = !credentials.previous.is_empty()
        && constant_time_eq(presented.as_bytes(), credentials.previous.as_bytes());
    if adapter.protocol() != pb::AdapterProtocol::Brain || !(current || previous) {
        return Err(refused("the bearer token is not valid for this adapter"));
    }
    Ok(adapter)
}

fn bearer(header: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = header.split_at_checked(7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| rest.trim_ascii())
        .filter(|token| !token.is_empty())
}

/// A digest of what identifies an operation's effect: its Environment and its request. A
/// redelivery carries the same; the capabilities beside them (context, reporter) and an
/// execution's callback, whose credential belongs to one delivery, may differ.
fn digest(environment: &str, request: &Value) -> String {
    let mut request = request.clone();
    if let Some(request) = request.as_object_mut() {
        request.remove("callback");
    }
    let canonical = serde_json::json!({ "environment": environment, "request": request });
    plinth_kit::hex(&Sha256::digest(canonical.to_string().as_bytes()))
}

fn valid_name(text: &str) -> bool {
    !text.is_empty() && text.len() <= MAX_NAME_BYTES && !text.chars().any(char::is_control)
}

fn name_field(operation: &serde_json::Map<String, Value>, field: &str) -> Result<String, ApiError> {
    operation
        .get(field)
        .and_then(Value::as_str)
        .filter(|text| valid_name(text))
        .map(str::to_owned)
        .ok_or_else(|| {
            PlinthError::invalid(format!(
                "operation.{field}: expected a string of 1 to {MAX_NAME_BYTES} bytes without control characters"
            ))
            .into()
        })
}

fn to_value(receipt: &Receipt) -> Value {
    serde_json::to_value(receipt).unwrap_or(Value::Null)
}

fn stored_receipt(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| {
        to_value(&Receipt::Unknown {
            message: Some("the stored receipt could not be read".into()),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_follows_the_request_not_the_capabilities() {
        let request = serde_json::json!({"type": "execute", "input": {"command": "ls"}});
        let same = serde_json::json!({"input": {"command": "ls"}, "type": "execute"});
        assert_eq!(digest("workspace", &request), digest("workspace", &same));
        assert_ne!(digest("workspace", &request), digest("other", &request));
        assert_eq!(digest("w", &request).len(), 64);
        let mut called_back = request.clone();
        called_back["callback"] = serde_json::json!({"url": "http://brain/cb", "token": "t2"});
        assert_eq!(
            digest("workspace", &request),
            digest("workspace", &called_back)
        );
    }

    #[test]
    fn bearer_tokens_are_read_strictly() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer  abc "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bearer "), None);
    }
}
