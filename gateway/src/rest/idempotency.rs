//! `Idempotency-Key` on `POST /v1/sessions` and `POST /v1/sessions/{id}/exec`: a request
//! retried because its answer was lost gets the first request's answer, and never starts a
//! second session or runs its command twice. A key is its caller's scope's, for one route
//! (`POST /v1/sessions`, or one session's exec), and is claimed in the catalog before the
//! request runs (`RequestKeyService`: the ledger rules of Novo's `Novo-Request-Id`, in a table
//! of their own), so the rule holds across gateway replicas and restarts:
//!
//! - the first request with a key runs in a task of its own, to its end even if its caller
//!   hangs up, so that the retry finds its answer: a keyed command is the key's, not its
//!   connection's (ending the session stops it). Its answer is kept 24 hours;
//! - a retry with the same body gets that answer, marked `Idempotent-Replayed: true`; one
//!   that arrives while the first runs waits for it (for an exec, as long as its command may
//!   run), then `409 idempotency_in_progress`;
//! - the same key with another body is `422 idempotency_key_reused`, and nothing runs;
//! - a request refused before it did anything (its session ended, no node) gives its key
//!   up, so the retry runs it; one cut off after it started (its node stopped answering, or
//!   its gateway stopped) is `409 outcome_unknown`, for it and every retry.
//!
//! The claim's lease is renewed while the request runs (the gateway's one lease loop,
//! `ledger::hold`), and the answer is stored after the caller has it, with the claim still
//! held, as Novo's are.

use std::future::Future;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::catalog::v1 as pb;
use sha2::Digest as _;
use tracing::Instrument as _;

use crate::http::error::ApiError;
use crate::runtime::Services;

/// The request header.
pub(crate) const HEADER: &str = "idempotency-key";
/// The header a replayed answer carries.
pub(crate) const REPLAYED: &str = "idempotent-replayed";
/// The longest key.
const MAX_KEY_BYTES: usize = 255;
/// How long a claim lasts unless renewed (every third of it while the request runs); a retry
/// that finds it run out with no answer settles it as `outcome_unknown`.
const LEASE: Duration = Duration::from_secs(30);
/// How long an answer that could not be stored at once is tried again in the background.
const STORE_ANSWER_FOR: Duration = Duration::from_secs(15 * 60);
/// The largest answer kept: an exec's answer, with 1 MiB of each output stream, JSON-escaped
/// (up to six times longer), stays below it.
const MAX_ANSWER_BYTES: usize = 15 * 1024 * 1024;

/// The `Idempotency-Key` a request carries, checked: 1 to 255 visible ASCII characters, given
/// once. None without the header.
pub(crate) fn key_of(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let mut values = headers.get_all(HEADER).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let refused = || {
        ApiError(PlinthError::invalid(format!(
            "Idempotency-Key: one value of 1 to {MAX_KEY_BYTES} visible ASCII characters (no \
             spaces), such as a UUID"
        )))
    };
    if values.next().is_some() {
        return Err(refused());
    }
    let key = value.to_str().map_err(|_| refused())?;
    if key.is_empty() || key.len() > MAX_KEY_BYTES || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(refused());
    }
    Ok(Some(key.to_owned()))
}

/// The refusal of a key on a request whose answer cannot be given again (a stream, a
/// terminal).
pub(crate) fn refused_for(what: &str) -> ApiError {
    ApiError(PlinthError::invalid(format!(
        "Idempotency-Key: {what} cannot be answered again to a retry; send the key with an exec \
         answered whole (no stream=true, no Accept: application/x-ndjson, no pty=true), or \
         without a key"
    )))
}

/// A keyed request's answer, and whether it did anything.
pub(crate) struct Ran {
    response: Response,
    started: bool,
}

impl Ran {
    /// Refused before it did anything: the key is given up, so a retry runs it.
    pub(crate) fn before(error: ApiError) -> Ran {
        Ran {
            response: error.into_response(),
            started: false,
        }
    }

    /// It ran (or started, and was cut off): this answer is kept for retries, unless it is a
    /// failure of the server, which cannot say what happened (`outcome_unknown`).
    pub(crate) fn started(response: Response) -> Ran {
        Ran {
            response,
            started: true,
        }
    }
}

/// Runs `work` once for `key`, or answers the run's answer: see the module's comment. `body`
/// is the request's body, as received (a retry must send the same bytes); `wait` bounds how
/// long a retry waits for a first request still running.
pub(crate) async fn once<F>(
    state: &Services,
    key: pb::RequestKey,
    body: &[u8],
    wait: Duration,
    work: F,
) -> Result<Response, ApiError>
where
    F: Future<Output = Ran> + Send + 'static,
{
    let body_sha256 = plinth_kit::hex(&sha2::Sha256::digest(body));
    let since = tokio::time::Instant::now();
    let mut pause = Duration::from_millis(100);
    let claim = loop {
        let claimed = state
            .request_keys()
            .claim_request_key(pb::ClaimRequestKeyRequest {
                key: Some(key.clone()),
                body_sha256: body_sha256.clone(),
                lease_ms: crate::runtime::ledger::lease_ms(LEASE),
            })
            .await?
            .into_inner();
        match claimed.outcome() {
            pb::IdempotencyOutcome::Claimed => break claimed.claim,
            pb::IdempotencyOutcome::Done => {
                return Ok(replayed(claimed.status, claimed.response));
            }
            pb::IdempotencyOutcome::Mismatch => {
                return Err(PlinthError::new(
                    ErrorCode::IdempotencyKeyReused,
                    format!(
                        "Idempotency-Key {:?} was used on {} before, with a different body; \
                         nothing ran. A different request takes a new key",
                        key.key, key.route
                    ),
                )
                .into());
            }
            pb::IdempotencyOutcome::InFlight if since.elapsed() < wait => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            pb::IdempotencyOutcome::InFlight => {
                return Err(PlinthError::new(
                    ErrorCode::IdempotencyInProgress,
                    format!(
                        "the first request with Idempotency-Key {:?} is still running (this one \
                         waited {} s for it), or its answer is not stored yet; retry later with \
                         the same key for its answer",
                        key.key,
                        wait.as_secs()
                    ),
                )
                .into());
            }
            pb::IdempotencyOutcome::Unspecified => {
                return Err(PlinthError::new(
                    ErrorCode::Internal,
                    format!(
                        "the catalog answered claim outcome {}, which this gateway does not \
                         know; nothing ran",
                        claimed.outcome
                    ),
                )
                .into());
            }
        }
    };
    let held = Claim { key, claim };
    // The request runs to its end in a task of its own, even if its caller hangs up: its
    // answer must be stored for the retry, and its claim must not be left running with
    // nobody to finish it.
    let (answered, answer) = tokio::sync::oneshot::channel();
    plinth_kit::tasks::spawn(
        run_claimed(state.clone(), held, work, answered).instrument(tracing::Span::current()),
    );
    answer.await.map_err(|_| {
        PlinthError::new(
            ErrorCode::Internal,
            "the request's task ended without an answer; retry with the same Idempotency-Key",
        )
        .into()
    })
}

/// A stored answer, as a retry gets it.
fn replayed(status: u32, response: String) -> Response {
    let status = u16::try_from(status)
        .ok()
        .and_then(|status| StatusCode::from_u16(status).ok())
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut answer = (status, Body::from(response)).into_response();
    let headers = answer.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(REPLAYED, HeaderValue::from_static("true"));
    answer
}

/// The answer of a request cut off after it started.
fn outcome_unknown(key: &str, cause: &str) -> ApiError {
    PlinthError::new(
        ErrorCode::OutcomeUnknown,
        format!(
            "the request with Idempotency-Key {key:?} started, then was cut off ({cause}): it \
             may or may not have taken effect, and it is not run again under this key. Check \
             the session (its turns), then send the request with a new key if it is still \
             wanted"
        ),
    )
    .into()
}

/// Runs a request whose key `held` claims, renewing the claim while it runs; hands its answer
/// to `answered`, then stores it (or gives the key up, if the request did nothing).
async fn run_claimed<F>(
    state: Services,
    held: Claim,
    work: F,
    answered: tokio::sync::oneshot::Sender<Response>,
) where
    F: Future<Output = Ran> + Send + 'static,
{
    let renewing = plinth_kit::tasks::CancellationToken::new();
    let renewals = renewing.clone().drop_guard();
    plinth_kit::tasks::spawn(
        held.clone()
            .hold(state.clone(), renewing.clone())
            .instrument(tracing::Span::current()),
    );
    let Ran { response, started } = work.await;
    let settle = if !started {
        let _ = answered.send(response);
        Settle::Release
    } else {
        let (parts, body) = response.into_parts();
        let failed = parts.status.is_server_error();
        match axum::body::to_bytes(body, MAX_ANSWER_BYTES).await {
            Ok(bytes) if !failed => {
                let stored = String::from_utf8_lossy(&bytes).into_owned();
                let status = parts.status.as_u16();
                let _ = answered.send(Response::from_parts(parts, Body::from(bytes)));
                Settle::Finish { status, stored }
            }
            read => {
                let cause = match read {
                    Ok(bytes) => serde_json::from_slice::<serde_json::Value>(&bytes)
                        .ok()
                        .and_then(|body| body["error"]["message"].as_str().map(str::to_owned))
                        .unwrap_or_else(|| format!("it failed with {}", parts.status)),
                    Err(_) => format!("its answer passed {MAX_ANSWER_BYTES} bytes"),
                };
                tracing::warn!(route = %held.key.route, %cause, "a keyed request failed after it started; its outcome is unknown");
                let unknown = outcome_unknown(&held.key.key, &cause).into_response();
                let (parts, body) = unknown.into_parts();
                let bytes = axum::body::to_bytes(body, MAX_ANSWER_BYTES)
                    .await
                    .unwrap_or_default();
                let stored = String::from_utf8_lossy(&bytes).into_owned();
                let status = parts.status.as_u16();
                let _ = answered.send(Response::from_parts(parts, Body::from(bytes)));
                Settle::Finish { status, stored }
            }
        }
    };
    if let Err(error) = held.settle(&state, &settle).await {
        // The answer is known but not stored (the catalog did not answer): it is stored in
        // the background while the claim is renewed, so a retry waits for it instead of
        // settling the key as unknown.
        tracing::warn!(error = %error.0.message, "a keyed request's answer could not be stored; retrying in the background");
        plinth_kit::tasks::spawn(
            held.settle_in_background(state.clone(), settle, renewals.disarm())
                .instrument(tracing::Span::current()),
        );
    }
}

/// A claim on a key, held while its request runs.
#[derive(Debug, Clone)]
struct Claim {
    key: pb::RequestKey,
    claim: String,
}

/// What becomes of a claim once its request has ended.
#[derive(Debug, Clone)]
enum Settle {
    /// Store this answer for retries.
    Finish { status: u16, stored: String },
    /// Give the key up: the request did nothing.
    Release,
}

impl Claim {
    /// One try at storing the answer, or giving the key up.
    async fn settle(&self, state: &Services, settle: &Settle) -> Result<(), ApiError> {
        match settle {
            Settle::Finish { status, stored } => {
                let finished = state
                    .request_keys()
                    .finish_request_key(pb::FinishRequestKeyRequest {
                        key: Some(self.key.clone()),
                        claim: self.claim.clone(),
                        status: u32::from(*status),
                        response: stored.clone(),
                    })
                    .await?
                    .into_inner();
                if !finished.stored {
                    tracing::warn!(route = %self.key.route, "a keyed request ended after its claim was settled as outcome unknown; retries keep that answer");
                }
            }
            Settle::Release => {
                state
                    .request_keys()
                    .release_request_key(pb::ReleaseRequestKeyRequest {
                        key: Some(self.key.clone()),
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
        state: Services,
        settle: Settle,
        renewing: plinth_kit::tasks::CancellationToken,
    ) {
        let since = tokio::time::Instant::now();
        let mut pause = Duration::from_millis(250);
        loop {
            tokio::time::sleep(pause).await;
            match self.settle(&state, &settle).await {
                Ok(()) => break,
                Err(error) if since.elapsed() >= STORE_ANSWER_FOR => {
                    tracing::error!(route = %self.key.route, error = %error.0.message, "a keyed request's answer could not be stored; a retry will be answered outcome_unknown");
                    break;
                }
                Err(_) => pause = (pause * 2).min(Duration::from_secs(2)),
            }
        }
        renewing.cancel();
    }

    /// Renews the claim until `stop`, or until the catalog says it is not held any more.
    async fn hold(self, state: Services, stop: plinth_kit::tasks::CancellationToken) {
        crate::runtime::ledger::hold("request idempotency key", LEASE, stop, None, || {
            let mut keys = state.request_keys();
            let request = pb::RenewRequestKeyRequest {
                key: Some(self.key.clone()),
                claim: self.claim.clone(),
                lease_ms: crate::runtime::ledger::lease_ms(LEASE),
            };
            async move {
                let renewed = keys.renew_request_key(request).await?;
                Ok(crate::runtime::ledger::Renewed {
                    held: renewed.get_ref().held,
                    cancel_requested: false,
                })
            }
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(
                HEADER,
                HeaderValue::from_str(value).expect("a header value"),
            );
        }
        headers
    }

    #[test]
    fn a_key_is_one_value_of_1_to_255_visible_ascii_characters() {
        assert_eq!(key_of(&headers(&[])).expect("none"), None);
        assert_eq!(
            key_of(&headers(&["7f3a-retry"])).expect("a key"),
            Some("7f3a-retry".to_owned())
        );
        let longest = "k".repeat(255);
        assert!(key_of(&headers(&[&longest])).is_ok());
        for refused in [
            vec![""],
            vec!["with space"],
            vec![&*"k".repeat(256)],
            vec!["one", "two"],
        ] {
            let error = key_of(&headers(&refused)).expect_err("refused");
            assert_eq!(error.0.code, ErrorCode::EnvironmentInvalid, "{refused:?}");
            assert!(
                error.0.message.starts_with("Idempotency-Key"),
                "{refused:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_replayed_answer_is_the_stored_json_marked_replayed() {
        let answer = replayed(201, r#"{"id":"sess_1"}"#.to_owned());
        assert_eq!(answer.status(), StatusCode::CREATED);
        assert_eq!(answer.headers()[REPLAYED], "true");
        assert_eq!(answer.headers()[header::CONTENT_TYPE], "application/json");
        let body = axum::body::to_bytes(answer.into_body(), 1024)
            .await
            .expect("body");
        assert_eq!(&body[..], br#"{"id":"sess_1"}"#);
    }
}
