//! The Novo workspace adapter: `POST /v1/workspace-adapters/{id}/novo` is the dispatch URL
//! registered with Novo (novo-http-workspace). Every call is verified before anything else,
//! and as much as can be before its body is read (`signature`: the header's shape and age,
//! then the adapter, then the body streamed into the HMAC under its size limit, with a bound
//! on how many unverified bodies are read at once); a verified call passes every header check
//! and its adapter's rate, and a mutating one is admitted once (the catalog's replay memory:
//! a replay inside the window is refused; a read may repeat, it changes nothing), then runs in its run's session (`Novo-Run-Id`; the
//! first call makes it) through the node's workspace operations, is recorded as a turn, and
//! answers the method's response shape. Mutating methods are idempotent by
//! `Novo-Request-Id` and never run twice: the key is claimed in the catalog before the call
//! runs, the claim's lease is renewed while it runs, and its answer is stored; a failure that
//! may have followed the call's effect is stored as `outcome_unknown`, and only a call that
//! certainly did not start gives its key up. Only the JSON shapes live here; the node does
//! the work.

mod signature;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header as http_header};
use axum::response::{IntoResponse, Response};
use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::catalog::v1 as pb;
use plinth_proto::node::v1 as node;
use serde_json::{Value, json};
use sha2::Digest as _;
use tokio::sync::Semaphore;
use tracing::Instrument as _;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::agents::Agents;
use crate::agents::tools::{self, Dialect};
use crate::http::error::{self, ApiError, ErrorBody};
use crate::runtime::live;
use crate::runtime::recent::Recent;
use axum::extract::FromRef;
use signature::SignatureHeader;

/// The dispatch route.
pub fn routes<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    Agents: FromRef<S>,
{
    OpenApiRouter::new().routes(routes!(dispatch))
}

/// Largest request body (a runtime artifact can be large).
const MAX_BODY_BYTES: usize = 70 * 1024 * 1024;
/// Most signatures of mutating calls the replay memory holds for one adapter at once, by
/// default (`gateway.novo_replay_memory_per_adapter`): 20,000 in a 600 s window is a sustained
/// 33 mutating calls a second, past the adapter's default rate.
pub const DEFAULT_REPLAY_MEMORY_PER_ADAPTER: u64 = 20_000;
/// How long a retry waits for the first call with its key before answering 409.
const WAIT_FOR_FIRST: Duration = Duration::from_secs(10);
/// How long a call's answer that could not be stored at once (the catalog did not answer) is
/// tried again in the background; past it, a retry settles the key as `outcome_unknown` once
/// the claim's lease has run out.
const STORE_ANSWER_FOR: Duration = Duration::from_secs(15 * 60);
/// Whether `method` changes the workspace: such calls are idempotent by `Novo-Request-Id`.
fn mutating(method: &str) -> bool {
    tools::named(Dialect::Novo, method).is_some_and(|spec| spec.mutates)
}

/// How the adapter's calls are run and verified.
#[derive(Debug, Clone)]
pub struct NovoOptions {
    /// Bytes of each of stdout and stderr a runCommand answers inline.
    pub command_inline_bytes: u64,
    /// How many bodies not yet verified are read at once (each up to `MAX_BODY_BYTES`).
    unverified_bodies: Arc<Semaphore>,
    /// How long an unverified body may take to arrive.
    body_deadline: Duration,
    /// Most live signatures the replay memory holds per adapter.
    replay_memory: u64,
    /// How long an idempotent call's claim lasts unless renewed (every third of it while the
    /// call runs); a retry that finds it run out with no answer settles it as
    /// `outcome_unknown`.
    call_lease: Duration,
    /// Runs' sessions as the catalog opened them in the last second: a run's calls in a burst
    /// open it (and stamp its last use) once a second, not once a call.
    runs: Arc<Recent<(String, String), pb::Session>>,
}

/// How long an opened run's session is used before the run is opened again.
const RUN_OPEN_FOR: Duration = Duration::from_secs(1);

impl NovoOptions {
    /// Options with at most `max_unverified_bodies` bodies read before their signature is
    /// known, each within `body_deadline`.
    pub fn new(
        command_inline_bytes: u64,
        max_unverified_bodies: usize,
        body_deadline: Duration,
    ) -> Self {
        NovoOptions {
            command_inline_bytes,
            unverified_bodies: Arc::new(Semaphore::new(max_unverified_bodies.max(1))),
            body_deadline,
            replay_memory: DEFAULT_REPLAY_MEMORY_PER_ADAPTER,
            call_lease: DEFAULT_CALL_LEASE,
            runs: Arc::new(Recent::new(RUN_OPEN_FOR, 10_000)),
        }
    }

    /// The replay memory holds at most `entries` signatures per adapter (at least 1).
    pub fn with_replay_memory(mut self, entries: u64) -> Self {
        self.replay_memory = entries.max(1);
        self
    }

    /// An idempotent call's claim lasts `lease` unless renewed (at least a second).
    pub fn with_call_lease(mut self, lease: Duration) -> Self {
        self.call_lease = lease.max(Duration::from_secs(1));
        self
    }
}

/// How long an idempotent call's claim lasts unless renewed, by default.
pub const DEFAULT_CALL_LEASE: Duration = Duration::from_secs(30);

fn invalid(message: impl Into<String>) -> PlinthError {
    PlinthError::new(ErrorCode::WorkspaceInvalidRequest, message)
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

/// An error as the answer's status and body, the way `ApiError` renders it.
fn error_answer(error: &PlinthError) -> (u16, Value) {
    (
        error.code.http_status(),
        json!({ "error": { "code": error.code.as_str(), "message": error.message } }),
    )
}

fn answer(status: u16, body: &Value) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, axum::Json(body.clone())).into_response()
}

/// Dispatch one Novo tool call (the `url` of a Novo workspace adapter).
#[utoipa::path(
    post,
    path = "/v1/workspace-adapters/{id}/novo",
    tag = "workspace-adapters",
    params(("id" = String, Path, description = "The adapter's id")),
    request_body(content = Object, description = "{method, args, options?}, signed (Novo-Signature)"),
    responses(
        (status = 200, description = "The method's response shape (novo-http-workspace)"),
        (status = 400, description = "workspace_invalid_request, workspace_path_invalid, workspace_contents_required", body = ErrorBody),
        (status = 401, description = "unauthenticated: a missing, stale or wrong signature, or a mutating call whose signed request was received before with another Novo-Request-Id or run, or with none (a replay); nothing ran", body = ErrorBody),
        (status = 403, description = "workspace_read_only", body = ErrorBody),
        (status = 404, description = "not_found (no such adapter), workspace_not_found", body = ErrorBody),
        (status = 409, description = "workspace_find_not_unique, workspace_find_not_found; idempotency_in_progress: the first call with this Novo-Request-Id is still running (or its outcome is not stored yet); outcome_unknown: the first call with this Novo-Request-Id was dispatched and then cut off (its node or server stopped), so it may or may not have taken effect; it is never run again under this id", body = ErrorBody),
        (status = 410, description = "workspace_run_ended", body = ErrorBody),
        (status = 413, description = "file_too_large: the body passed 70 MiB (detail.max_bytes); refused as it passed, nothing ran", body = ErrorBody),
        (status = 422, description = "idempotency_key_reused", body = ErrorBody),
        (status = 429, description = "quota_exceeded: the run's session would pass the scope's active-sessions quota (detail: quota, limit, used); rate_limited: this adapter's calls passed its rate (gateway.adapter_rate_limit_per_second), Retry-After says when to retry; nothing ran", body = ErrorBody),
        (status = 503, description = "unavailable: too many unverified bodies being read at once, this adapter's replay memory is full (gateway.novo_replay_memory_per_adapter), or the catalog did not answer; Retry-After says when to retry", body = ErrorBody),
    )
)]
async fn dispatch(
    State(state): State<Agents>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    // Everything the headers alone can refuse is refused before a byte of the body is read.
    let now_s = plinth_kit::clock::now_ms() / 1000;
    let signed = SignatureHeader::parse(header(&headers, "novo-signature"), now_s)?;
    let declared = header(&headers, http_header::CONTENT_LENGTH.as_str())
        .and_then(|length| length.trim().parse::<u64>().ok());
    if declared.is_some_and(|length| length > MAX_BODY_BYTES as u64) {
        return Err(signature::too_large(MAX_BODY_BYTES));
    }
    let found = state.adapter_credentials.get(&state, &id).await?;
    let adapter = found.adapter.unwrap_or_default();
    if adapter.protocol() != pb::AdapterProtocol::Novo {
        return Err(PlinthError::new(
            ErrorCode::NotFound,
            format!("workspace adapter {id:?} is not a Novo adapter"),
        )
        .into());
    }
    // Anyone who knows the URL can send a body that looks signed; only so many are read at once.
    let Ok(reading) = state.novo.unverified_bodies.clone().try_acquire_owned() else {
        metrics::counter!("plinth_gateway_refused_total", "reason" => "novo_unverified_bodies")
            .increment(1);
        return Err(error::retry_after(
            ErrorCode::Unavailable,
            "too many unverified calls are being received at once; retry shortly",
            1,
        ));
    };
    let verified = signature::read_verified(
        body,
        &signed,
        &[found.current.as_bytes(), found.previous.as_bytes()],
        MAX_BODY_BYTES,
        state.novo.body_deadline,
    )
    .await?;
    drop(reading);

    // Signed: from here on the body is trusted to be Novo's.
    let body = verified.body.clone();
    let call: Value = serde_json::from_slice(&body)
        .map_err(|error| invalid(format!("the body is not JSON: {error}")))?;
    let method = call
        .get("method")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("method: required, a string"))?
        .to_owned();
    // Every header (and the call itself) is checked before the call is remembered: a call
    // refused here leaves nothing in the replay memory.
    if header(&headers, "novo-workspace-method") != Some(method.as_str()) {
        return Err(invalid(format!(
            "Novo-Workspace-Method must agree with the body's method ({method:?})"
        ))
        .into());
    }
    let run_id = header(&headers, "novo-run-id")
        .filter(|run| !run.is_empty())
        .ok_or_else(|| invalid("Novo-Run-Id is required"))?
        .to_owned();
    let args = match call.get("args") {
        None | Some(Value::Null) => json!({}),
        Some(Value::Object(args)) => Value::Object(args.clone()),
        Some(_) => return Err(invalid("args: must be an object").into()),
    };
    // The method and its arguments too: a call refused for them never takes room below.
    parsed(&state, &method, &args)?;
    state.adapter_rates.take(&adapter.id)?;
    // A mutating call is run once per signed request: the same bytes again are a replay,
    // unless they are the same idempotent call retried, which idempotency answers below
    // without running it again. A read has no effect to repeat: the same signed read again
    // (an agent reading a file twice in one second) is simply answered.
    if mutating(&method) {
        admit_once(
            &state,
            &adapter.id,
            &verified,
            signed.at,
            &run_id,
            header(&headers, "novo-request-id").unwrap_or_default(),
        )
        .await?;
    }
    drop(verified);

    let key = header(&headers, "novo-request-id")
        .filter(|key| !key.is_empty() && mutating(&method))
        .map(str::to_owned);
    let Some(key) = key else {
        let ran = run(&state, &adapter, &run_id, &method, &args, TurnAt::Now).await;
        return Ok(answer(ran.status, &ran.body));
    };

    // Idempotent: the first call with the key runs, a retry gets its answer.
    let body_sha256 = plinth_kit::hex(&sha2::Sha256::digest(&body));
    let lease_ms = crate::runtime::ledger::lease_ms(state.novo.call_lease);
    let waited_since = tokio::time::Instant::now();
    let claim = loop {
        let claimed = state
            .adapters()
            .claim_idempotency_key(pb::ClaimIdempotencyKeyRequest {
                adapter_id: adapter.id.clone(),
                key: key.clone(),
                run_id: run_id.clone(),
                body_sha256: body_sha256.clone(),
                lease_ms,
            })
            .await?
            .into_inner();
        match claimed.outcome() {
            pb::IdempotencyOutcome::Claimed => break claimed.claim,
            pb::IdempotencyOutcome::Done => {
                let stored: Value = serde_json::from_str(&claimed.response).unwrap_or(Value::Null);
                return Ok(answer(
                    u16::try_from(claimed.status).unwrap_or(500),
                    &stored,
                ));
            }
            pb::IdempotencyOutcome::Mismatch => {
                return Err(PlinthError::new(
                    ErrorCode::IdempotencyKeyReused,
                    format!("Novo-Request-Id {key:?} was used before with a different body"),
                )
                .into());
            }
            pb::IdempotencyOutcome::InFlight if waited_since.elapsed() < WAIT_FOR_FIRST => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            pb::IdempotencyOutcome::InFlight => {
                return Err(PlinthError::new(
                    ErrorCode::IdempotencyInProgress,
                    format!(
                        "the first call with Novo-Request-Id {key:?} is still running, or its outcome is not stored yet; retry later"
                    ),
                )
                .into());
            }
            // Nothing ran, and the catalog's answer says nothing this gateway knows.
            pb::IdempotencyOutcome::Unspecified => {
                return Err(PlinthError::new(
                    ErrorCode::Internal,
                    format!(
                        "the catalog answered claim outcome {} for Novo-Request-Id {key:?}, which this gateway does not know; nothing ran",
                        claimed.outcome
                    ),
                )
                .into());
            }
        }
    };
    let held = Claim {
        adapter: adapter.id.clone(),
        key,
        claim,
    };
    // The call runs to its end in a task of its own, even if Novo hangs up (it retries on a
    // timeout): its answer must be stored for that retry, and its claim must not be left
    // running with nobody to finish it. The task hands the answer over as soon as it is
    // known, and stores it after.
    let (answered, answer_of) = tokio::sync::oneshot::channel();
    plinth_kit::tasks::spawn(
        run_claimed(state.clone(), adapter, run_id, method, args, held, answered)
            .instrument(tracing::Span::current()),
    );
    match answer_of.await {
        Ok((status, response)) => Ok(answer(status, &response)),
        Err(_) => Err(PlinthError::new(
            ErrorCode::Internal,
            "the call's task ended without an answer; retry with the same Novo-Request-Id",
        )
        .into()),
    }
}

/// Runs a call whose key `held` claims, renewing the claim while it runs; hands the call's
/// status and body to `answered`, then stores them with its turn (or releases the key, if
/// the call certainly did not start).
///
/// The caller is answered before the answer is stored, so the catalog write is off the
/// reply path: the claim is still held (and renewed) until it is stored, so a retry that
/// arrives in between waits for the stored answer rather than running the call again. Only
/// a retry after the gateway itself died in that moment finds the claim run out, and is
/// answered `outcome_unknown`, as for any call cut off after it was dispatched.
async fn run_claimed(
    state: Agents,
    adapter: pb::Adapter,
    run_id: String,
    method: String,
    args: Value,
    held: Claim,
    answered: tokio::sync::oneshot::Sender<(u16, Value)>,
) {
    // The claim is renewed while the call runs, so a long command is not settled under it;
    // whatever ends this task ends the renewals (unless the answer is still being stored).
    let renewing = plinth_kit::tasks::CancellationToken::new();
    let renewals = renewing.clone().drop_guard();
    plinth_kit::tasks::spawn(
        held.clone()
            .hold(state.clone(), renewing.clone())
            .instrument(tracing::Span::current()),
    );
    // The turn is recorded with the stored answer, in one catalog write.
    let ran = run(&state, &adapter, &run_id, &method, &args, TurnAt::Finish).await;
    let turn = ran.turn;
    let (status, response, settle) = match (ran.reached, ran.status) {
        // Refused before anything was sent to the node: nothing ran, a retry runs it.
        (Reached::Before, status) => (status, ran.body, Settle::Release),
        // Sent, then no answer (the node, or the way to it, failed): it may have run. It is
        // never run again; this and every retry answer that it is not known.
        (Reached::Dispatched, 500 | 503) => {
            let cause = ran.body["error"]["message"]
                .as_str()
                .unwrap_or("it failed")
                .to_owned();
            tracing::warn!(adapter = %adapter.id, %method, %cause, "an idempotent call failed after it was dispatched; its outcome is unknown");
            let (status, body) = error_answer(&outcome_unknown(&held.key, &cause));
            (status, body.clone(), Settle::Finish { status, body, turn })
        }
        (Reached::Dispatched, status) => (
            status,
            ran.body.clone(),
            Settle::Finish {
                status,
                body: ran.body,
                turn,
            },
        ),
    };
    // Novo may have hung up; the answer is stored all the same.
    let _ = answered.send((status, response));
    if let Err(error) = held.settle(&state, &settle).await {
        // The answer is known but not stored (the catalog did not answer): it is stored in
        // the background while the claim is renewed, so a retry waits for it instead of
        // settling the key as unknown.
        tracing::warn!(adapter = %adapter.id, error = %error.0.message, "an idempotent call's outcome could not be recorded; retrying in the background");
        plinth_kit::tasks::spawn(
            held.settle_in_background(state.clone(), settle, renewals.disarm())
                .instrument(tracing::Span::current()),
        );
    }
}

/// Remembers a verified mutating call's signature in the catalog's replay memory (shared by
/// every gateway replica, kept across restarts, bounded per adapter), once. A second arrival
/// is refused (401) unless it carries the same `Novo-Request-Id` and run as the first, when it
/// is that call retried and idempotency answers it; an adapter whose memory is full is
/// answered 503 with `Retry-After` (only its own calls: each adapter has its own bound).
async fn admit_once(
    state: &Agents,
    adapter: &str,
    verified: &signature::Verified,
    at: i64,
    run_id: &str,
    request_id: &str,
) -> Result<(), ApiError> {
    let admitted = state
        .replays()
        .admit_signed_call(pb::AdmitSignedCallRequest {
            adapter_id: adapter.to_owned(),
            signature_sha256: signature::replay_digest(&verified.signature),
            run_id: run_id.to_owned(),
            request_id: request_id.to_owned(),
            expires_at_ms: signature::accepted_until_ms(at),
            max_live: i64::try_from(state.novo.replay_memory).unwrap_or(i64::MAX),
            // A mutating call with a request id is claimed under it (synced) before it runs.
            claimed_next: !request_id.is_empty(),
        })
        .await?
        .into_inner();
    match admitted.admission() {
        pb::SignedCallAdmission::First => Ok(()),
        pb::SignedCallAdmission::SameRequest => {
            tracing::info!(%adapter, "a signed call arrived again; answered by its Novo-Request-Id");
            Ok(())
        }
        pb::SignedCallAdmission::Replayed => Err(PlinthError::new(
            ErrorCode::Unauthenticated,
            "Novo-Signature: this signed call changes the workspace and was already received \
             (with another Novo-Request-Id or run, or with none); a replay is refused and \
             nothing ran. Sign every call anew",
        )
        .into()),
        pb::SignedCallAdmission::Full => {
            metrics::counter!("plinth_gateway_refused_total", "reason" => "novo_replay_memory")
                .increment(1);
            let wait_ms = u64::try_from(
                admitted
                    .retry_at_ms
                    .saturating_sub(plinth_kit::clock::now_ms()),
            )
            .unwrap_or(0)
            .max(1000);
            Err(error::retry_after(
                ErrorCode::Unavailable,
                format!(
                    "this adapter's replay memory holds its {} signed calls of the last 300 s \
                     (gateway.novo_replay_memory_per_adapter); retry shortly",
                    state.novo.replay_memory
                ),
                wait_ms.div_ceil(1000),
            ))
        }
        pb::SignedCallAdmission::Unspecified => Err(PlinthError::new(
            ErrorCode::Internal,
            format!(
                "the catalog answered replay admission {}, which this gateway does not know; nothing ran",
                admitted.admission
            ),
        )
        .into()),
    }
}

/// The answer of an idempotent call whose outcome is not known.
fn outcome_unknown(key: &str, cause: &str) -> PlinthError {
    PlinthError::new(
        ErrorCode::OutcomeUnknown,
        format!(
            "the call with Novo-Request-Id {key:?} was dispatched to its session, then cut off ({cause}): it may or may not have taken effect, and it is not run again under this id. Check the workspace, then send the call with a new Novo-Request-Id if it is still wanted"
        ),
    )
}

/// A claim on an idempotency key, held while its call runs.
#[derive(Debug, Clone)]
struct Claim {
    adapter: String,
    key: String,
    claim: String,
}

/// What becomes of a claim once its call has ended.
#[derive(Debug, Clone)]
enum Settle {
    /// Store this answer for retries, and record the call's turn with it.
    Finish {
        status: u16,
        body: Value,
        turn: Option<pb::RecordTurnRequest>,
    },
    /// Give the key up: the call certainly did not start.
    Release,
}

impl Claim {
    /// One try at storing the answer, or releasing the key.
    async fn settle(&self, state: &Agents, settle: &Settle) -> Result<(), ApiError> {
        match settle {
            Settle::Finish { status, body, turn } => {
                let finished = state
                    .adapters()
                    .finish_idempotency_key(pb::FinishIdempotencyKeyRequest {
                        adapter_id: self.adapter.clone(),
                        key: self.key.clone(),
                        claim: self.claim.clone(),
                        status: u32::from(*status),
                        response: body.to_string(),
                        turn: turn.clone(),
                    })
                    .await?
                    .into_inner();
                if !finished.stored {
                    tracing::warn!(adapter = %self.adapter, "an idempotent call ended after its claim was settled as outcome unknown; retries keep that answer");
                }
                if let Some(turn) = turn
                    && finished.turn.is_none()
                    && finished.stored
                {
                    let session = turn.turn.as_ref().map(|turn| turn.session_id.as_str());
                    tracing::warn!(
                        session = session.unwrap_or_default(),
                        "a Novo call ran, but its session took no turn (it ended)"
                    );
                }
            }
            Settle::Release => {
                state
                    .adapters()
                    .release_idempotency_key(pb::ReleaseIdempotencyKeyRequest {
                        adapter_id: self.adapter.clone(),
                        key: self.key.clone(),
                        claim: self.claim.clone(),
                    })
                    .await?;
            }
        }
        Ok(())
    }

    /// Tries `settle` until it lands (or `STORE_ANSWER_FOR` passes), then stops `renewing`.
    async fn settle_in_background(
        self,
        state: Agents,
        settle: Settle,
        renewing: plinth_kit::tasks::CancellationToken,
    ) {
        let since = tokio::time::Instant::now();
        let mut pause = Duration::from_millis(250);
        loop {
            tokio::time::sleep(pause).await;
            match self.settle(&state, &settle).await {
                Ok(()) => {
                    tracing::info!(adapter = %self.adapter, "an idempotent call's outcome was recorded after a retry");
                    break;
                }
                Err(error) if since.elapsed() >= STORE_ANSWER_FOR => {
                    tracing::error!(adapter = %self.adapter, error = %error.0.message, "an idempotent call's outcome could not be recorded; a retry will be answered outcome_unknown");
                    break;
                }
                Err(_) => pause = (pause * 2).min(Duration::from_secs(2)),
            }
        }
        renewing.cancel();
    }

    /// Renews the claim (the gateway's one lease loop, `ledger::hold`) until `stop`, or until
    /// the catalog says it is not held any more.
    async fn hold(self, state: Agents, stop: plinth_kit::tasks::CancellationToken) {
        let lease = state.novo.call_lease;
        crate::runtime::ledger::hold("novo idempotency key", lease, stop, None, || {
            let mut adapters = state.adapters();
            let request = pb::RenewIdempotencyKeyRequest {
                adapter_id: self.adapter.clone(),
                key: self.key.clone(),
                claim: self.claim.clone(),
                lease_ms: crate::runtime::ledger::lease_ms(lease),
            };
            async move {
                let renewed = adapters.renew_idempotency_key(request).await?;
                Ok(crate::runtime::ledger::Renewed {
                    held: renewed.get_ref().held,
                    cancel_requested: false,
                })
            }
        })
        .await;
    }
}

/// How far a call got before it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reached {
    /// Nothing was sent to the node: the call certainly did not start.
    Before,
    /// The call was sent to the node: it may have had its effect, whatever came back.
    Dispatched,
}

/// A call's answer and how far it got.
struct Ran {
    status: u16,
    body: Value,
    reached: Reached,
    /// With [`TurnAt::Finish`], the turn the call made, to record with its answer.
    turn: Option<pb::RecordTurnRequest>,
}

/// When a call's turn is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TurnAt {
    /// As soon as the call ran (a call with no idempotency key).
    Now,
    /// With the stored answer, in the same catalog write (an idempotent call).
    Finish,
}

/// Runs a call in its run's session; answers its status and body, errors included, and
/// whether it was sent to the node.
async fn run(
    state: &Agents,
    adapter: &pb::Adapter,
    run_id: &str,
    method: &str,
    args: &Value,
    turn_at: TurnAt,
) -> Ran {
    let dispatched = AtomicBool::new(false);
    let (status, body, turn) =
        match run_call(state, adapter, run_id, method, args, &dispatched, turn_at).await {
            Ok((body, turn)) => (200, body, turn),
            Err(ApiError(error)) => {
                let (status, body) = error_answer(&error);
                (status, body, None)
            }
        };
    Ran {
        status,
        body,
        turn,
        reached: if dispatched.load(Ordering::SeqCst) {
            Reached::Dispatched
        } else {
            Reached::Before
        },
    }
}

/// A call's method and arguments as the node takes them, with the options it runs under;
/// `workspace_invalid_request` for a method Novo does not dispatch or arguments that break
/// its rules.
fn parsed(
    state: &Agents,
    method: &str,
    args: &Value,
) -> Result<(tools::Request, tools::Options), ApiError> {
    let Some(spec) = tools::named(Dialect::Novo, method) else {
        return Err(invalid(format!("method {method:?} is not one Novo dispatches")).into());
    };
    let options = tools::Options {
        inline_bytes: state.novo.command_inline_bytes,
        ..tools::Options::new(Dialect::Novo)
    };
    let no_args = serde_json::Map::new();
    let arguments = tools::Args::new(
        args.as_object().unwrap_or(&no_args),
        Dialect::Novo.arguments(),
    );
    let request = tools::Request::parse(spec.tool, &arguments, &options)
        .map_err(|tools::Invalid(message)| invalid(message))?;
    Ok((request, options))
}

async fn run_call(
    state: &Agents,
    adapter: &pb::Adapter,
    run_id: &str,
    method: &str,
    args: &Value,
    dispatched: &AtomicBool,
    turn_at: TurnAt,
) -> Result<(Value, Option<pb::RecordTurnRequest>), ApiError> {
    // Arguments are checked before the run's session is opened: a call refused here never ran.
    let (request, options) = parsed(state, method, args)?;
    let run = (adapter.id.clone(), run_id.to_owned());
    let session = match state.novo.runs.get(&run) {
        Some(session) => session,
        None => {
            let opened = state
                .adapters()
                .open_run(pb::OpenRunRequest {
                    adapter_id: adapter.id.clone(),
                    run_id: run_id.to_owned(),
                    limits: Some(state.runtime.session_limits.defaults().to_catalog()),
                })
                .await?
                .into_inner();
            let mut session = opened.session.unwrap_or_default();
            if session.workdir.is_empty() {
                session = live::start_session(&state.runtime, &adapter.scope, session).await?;
            }
            state.novo.runs.put(run.clone(), session.clone());
            session
        }
    };
    let target = tools::Target {
        nodes: &state.runtime.nodes,
        session: &session,
        dispatched,
    };
    let done = tools::run(&target, request, &options)
        .await
        .map_err(|failed| {
            // The run is opened again by its next call: the node may no longer hold it.
            state.novo.runs.forget(&run);
            match failed {
                tools::Failed::Unreachable(error) => error,
                tools::Failed::Node(status) => ApiError::from(status),
                tools::Failed::Answer(error) => ApiError(error),
            }
        })?;
    let turn = &done.turn;
    if turn_at == TurnAt::Finish {
        let turn = live::turn(
            &adapter.scope,
            &session,
            turn.kind,
            &turn.detail,
            turn.exit_code,
        );
        return Ok((done.body, Some(turn)));
    }
    // The call has run: a turn that cannot be recorded because the catalog did not answer
    // does not turn its answer into an error.
    match live::record(
        &state.runtime,
        &adapter.scope,
        &session,
        turn.kind,
        &turn.detail,
        turn.exit_code,
    )
    .await
    {
        Err(ApiError(error))
            if matches!(error.code, ErrorCode::Unavailable | ErrorCode::Internal) =>
        {
            tracing::warn!(session = %session.id, error = %error.message, "a Novo call ran, but its turn could not be recorded");
        }
        Err(error) => return Err(error),
        Ok(_) => {}
    }
    Ok((done.body, None))
}

/// Ends runs idle since `idle` ago, every half minute, and tells their nodes.
pub async fn end_idle_runs(
    state: Agents,
    idle: Duration,
    shutdown: plinth_kit::tasks::CancellationToken,
) {
    let every = (idle / 4).clamp(Duration::from_secs(1), Duration::from_secs(30));
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        let cutoff =
            plinth_kit::clock::now_ms() - i64::try_from(idle.as_millis()).unwrap_or(i64::MAX);
        let ended = match state
            .adapters()
            .end_idle_runs(pb::EndIdleRunsRequest {
                idle_before_ms: cutoff,
            })
            .instrument(plinth_kit::telemetry::idle("novo.end_idle_runs"))
            .await
        {
            Ok(ended) => ended.into_inner().sessions,
            Err(status) => {
                tracing::warn!(error = %status.message(), "cannot end idle runs; retrying");
                continue;
            }
        };
        for session in ended {
            let detached = match state.runtime.nodes.client(&session.node_address) {
                Ok(mut client) => client
                    .detach(node::DetachRequest {
                        session_id: session.id.clone(),
                    })
                    .await
                    .map(|_| ())
                    .map_err(|status| status.message().to_owned()),
                Err(ApiError(error)) => Err(error.message),
            };
            match detached {
                Ok(()) => tracing::info!(session = %session.id, "idle run's session ended"),
                Err(error) => {
                    tracing::warn!(session = %session.id, %error, "an idle run's session ended, but its node could not be told")
                }
            }
        }
    }
}
