//! Workspace adapters: `POST /v1/workspace-adapters` registers an endpoint an agent runtime
//! calls (Novo's signed dispatch, Brain's environment operations) to work in sessions on one
//! environment; `GET`/`PATCH`/`DELETE /v1/workspace-adapters/{id}` and
//! `POST …/{id}/rotate-secret` manage it. The credential (Novo: the HMAC secret; Brain: a
//! bearer token) is answered once, on creation and on rotation, and never again. A Brain
//! adapter's `callback_origins` are where its executions' callbacks may go. The catalog owns
//! the rules.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use plinth_kit::PlinthError;
use plinth_proto::catalog::v1 as pb;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::agents::Agents;
use crate::http::auth::Caller;
use crate::http::auth::Tokens;
use crate::http::edge::Bucket;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::json::JsonBody;
use axum::extract::FromRef;

/// The adapter routes.
pub fn routes<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    Agents: FromRef<S>,
    Arc<Tokens>: FromRef<S>,
{
    OpenApiRouter::new()
        .routes(routes!(create_adapter))
        .routes(routes!(get_adapter, update_adapter, delete_adapter))
        .routes(routes!(rotate_secret))
}

/// The protocols an adapter speaks, as the API names them.
#[derive(Debug, ToSchema)]
#[schema(rename_all = "lowercase")]
#[allow(dead_code, reason = "documents the names the protocol field takes")]
pub enum AdapterProtocolName {
    /// Novo's signed calls.
    Novo,
    /// Brain's.
    Brain,
}

/// `POST /v1/workspace-adapters`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateAdapter {
    /// `novo` or `brain`.
    #[schema(value_type = AdapterProtocolName)]
    pub protocol: String,
    /// The environment its runs read (`henv_…`), of the caller's scope.
    pub environment: String,
    /// Novo only: the HMAC secret (16 to 512 printable ASCII characters, no spaces);
    /// generated when left out. Brain tokens are always generated.
    #[serde(default)]
    #[schema(pattern = "^[\\x21-\\x7e]{16,512}$")]
    pub secret: Option<String>,
    /// Brain only: the origins (scheme, host and port: `https://brain.internal:8443`) its
    /// Brain calls back from. An execution whose callback URL is elsewhere is refused, and
    /// without any, every execution that carries a callback is.
    #[serde(default)]
    pub callback_origins: Option<Vec<String>>,
}

/// `PATCH /v1/workspace-adapters/{id}`: what is given changes, the rest stays.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateAdapter {
    /// Brain only: the callback origins, replacing the old ones (`[]`: none).
    #[serde(default)]
    pub callback_origins: Option<Vec<String>>,
}

/// `POST …/{id}/rotate-secret`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RotateSecret {
    /// Novo only: the new secret (16 to 512 printable ASCII characters, no spaces);
    /// generated when left out.
    #[serde(default)]
    #[schema(pattern = "^[\\x21-\\x7e]{16,512}$")]
    pub secret: Option<String>,
    /// How long the previous secret or token is still accepted, in milliseconds, from 0
    /// (refused at once) to 604800000 (a week); `catalog.adapter_credential_grace_seconds`
    /// when left out.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 604_800_000)]
    pub grace_ms: Option<u64>,
}

/// A workspace adapter.
#[derive(Debug, Serialize, ToSchema)]
pub struct AdapterBody {
    /// `wadp_` + 32 lowercase hex.
    pub id: String,
    /// Always `workspace_adapter`.
    pub object: &'static str,
    /// `novo` or `brain`.
    pub protocol: String,
    /// The environment its runs read.
    pub environment: String,
    /// Novo: the dispatch URL to register with Novo. Brain: the base URL (Brain posts to
    /// `{url}/v1/operations`).
    pub url: String,
    /// Novo: the HMAC secret, only in the answer that made it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// Brain: the bearer token, only in the answer that made it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Milliseconds since the Unix epoch.
    #[serde(rename = "createdAt")]
    pub created_at: i64,
    /// When the credential was last rotated (ms), or null.
    #[serde(rename = "rotatedAt")]
    pub rotated_at: Option<i64>,
    /// Until when the previous credential is accepted (ms), or null when none is.
    #[serde(rename = "previousCredentialExpiresAt")]
    pub previous_expires_at: Option<i64>,
    /// Brain: the origins its executions' callbacks may go to, normalised.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub callback_origins: Option<Vec<String>>,
}

/// `DELETE` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct AdapterDeleted {
    /// The adapter's id.
    pub id: String,
    /// Always `workspace_adapter`.
    pub object: &'static str,
    /// Always true.
    pub deleted: bool,
}

/// The path of an adapter's endpoint for its protocol, beneath the gateway's root.
pub fn endpoint_path(id: &str, protocol: &str) -> String {
    format!("/v1/workspace-adapters/{id}/{protocol}")
}

/// The gateway's root URL as runtimes reach it: the configured public URL, else the
/// request's `Host` over plain HTTP.
fn base_url(state: &Agents, headers: &HeaderMap) -> String {
    if let Some(url) = &state.public_url {
        return url.trim_end_matches('/').to_owned();
    }
    let host = headers
        .get(header::HOST)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("localhost");
    format!("http://{host}")
}

fn adapter_body(
    state: &Agents,
    headers: &HeaderMap,
    adapter: pb::Adapter,
    credential: Option<String>,
) -> AdapterBody {
    let protocol = adapter.protocol().label();
    let (secret, token, callback_origins) = match adapter.protocol() {
        pb::AdapterProtocol::Brain => (None, credential, Some(adapter.callback_origins)),
        pb::AdapterProtocol::Novo | pb::AdapterProtocol::Unspecified => (credential, None, None),
    };
    AdapterBody {
        url: format!(
            "{}{}",
            base_url(state, headers),
            endpoint_path(&adapter.id, protocol)
        ),
        id: adapter.id,
        object: "workspace_adapter",
        protocol: protocol.to_owned(),
        environment: adapter.environment_id,
        secret,
        token,
        created_at: adapter.created_at_ms,
        rotated_at: (adapter.rotated_at_ms > 0).then_some(adapter.rotated_at_ms),
        previous_expires_at: (adapter.previous_expires_at_ms > 0)
            .then_some(adapter.previous_expires_at_ms),
        callback_origins,
    }
}

/// Register a workspace adapter on an environment of the caller's scope.
#[utoipa::path(
    post,
    path = "/v1/workspace-adapters",
    tag = "workspace-adapters",
    request_body = CreateAdapter,
    responses(
        (status = 201, description = "Created; `secret` (Novo) or `token` (Brain) is shown only here", body = AdapterBody),
        (status = 400, description = "environment_invalid: malformed body, unknown protocol, a secret that breaks the rules, a callback origin that is not one; invalid_request: a callback origin on an address callbacks may not reach (loopback, private, link-local, metadata, …; gateway.callback_allow)", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "environment_not_found: not an environment of this scope", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn create_adapter(
    State(state): State<Agents>,
    caller: Caller,
    headers: HeaderMap,
    JsonBody(body): JsonBody<CreateAdapter>,
) -> Result<(StatusCode, Json<AdapterBody>), ApiError> {
    let protocol = pb::AdapterProtocol::from_label(&body.protocol).ok_or_else(|| {
        PlinthError::invalid(format!(
            "protocol: {:?} is not one of \"novo\", \"brain\"",
            body.protocol
        ))
    })?;
    if let Some(origins) = &body.callback_origins {
        callback_addresses(&state, origins)?;
    }
    let created = state
        .adapters()
        .create_adapter(pb::CreateAdapterRequest {
            scope: caller.scope,
            protocol: protocol.into(),
            environment_id: body.environment,
            secret: body.secret.unwrap_or_default(),
            callback_origins: body.callback_origins.unwrap_or_default(),
        })
        .await?
        .into_inner();
    let adapter = created.adapter.unwrap_or_default();
    Ok((
        StatusCode::CREATED,
        Json(adapter_body(
            &state,
            &headers,
            adapter,
            Some(created.credential),
        )),
    ))
}

/// One workspace adapter (never its secret or token).
#[utoipa::path(
    get,
    path = "/v1/workspace-adapters/{id}",
    tag = "workspace-adapters",
    params(("id" = String, Path, description = "The adapter's id")),
    responses(
        (status = 200, description = "The adapter", body = AdapterBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "not_found", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn get_adapter(
    State(state): State<Agents>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<AdapterBody>, ApiError> {
    let adapter = state
        .adapters()
        .get_adapter(pb::GetAdapterRequest {
            scope: caller.scope,
            id,
        })
        .await?
        .into_inner();
    Ok(Json(adapter_body(&state, &headers, adapter, None)))
}

/// Change a workspace adapter: a Brain adapter's `callback_origins` (never its protocol,
/// environment or credential).
#[utoipa::path(
    patch,
    path = "/v1/workspace-adapters/{id}",
    tag = "workspace-adapters",
    params(("id" = String, Path, description = "The adapter's id")),
    request_body = UpdateAdapter,
    responses(
        (status = 200, description = "The adapter as it is now", body = AdapterBody),
        (status = 409, description = "conflict: callback_origins for a Novo adapter (only a Brain adapter is called back)", body = ErrorBody),
        (status = 400, description = "environment_invalid: malformed body, a callback origin that is not one; invalid_request: a callback origin on an address callbacks may not reach (gateway.callback_allow)", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "not_found", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn update_adapter(
    State(state): State<Agents>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<UpdateAdapter>,
) -> Result<Json<AdapterBody>, ApiError> {
    if let Some(origins) = &body.callback_origins {
        callback_addresses(&state, origins)?;
    }
    let adapter = state
        .adapters()
        .update_adapter(pb::UpdateAdapterRequest {
            scope: caller.scope,
            id: id.clone(),
            callback_origins: body
                .callback_origins
                .map(|origins| pb::CallbackOrigins { origins }),
        })
        .await?
        .into_inner();
    state.adapter_credentials.forget(&id);
    Ok(Json(adapter_body(&state, &headers, adapter, None)))
}

/// Refuses callback origins on addresses callbacks may not reach (loopback, private,
/// link-local and metadata, …, unless `gateway.callback_allow` names their range):
/// `400 invalid_request` naming the entry, the rule and the setting. Names other than
/// `localhost` are checked each time a callback is sent, when they are resolved.
fn callback_addresses(state: &Agents, origins: &[String]) -> Result<(), ApiError> {
    let addresses = state.brain_runtime.callback_addresses();
    for (index, origin) in origins.iter().enumerate() {
        addresses.check_origin(origin).map_err(|why| {
            PlinthError::new(
                plinth_kit::ErrorCode::InvalidRequest,
                format!("callback_origins[{index}]: {origin:?}: {why}"),
            )
        })?;
    }
    Ok(())
}

/// Adapters' credentials as the catalog answered them less than a second ago, so a burst of
/// calls to one adapter asks the catalog once a second rather than once a call. A gateway
/// that rotates or deletes an adapter, or changes it, forgets its entry at once; another
/// replica sees the change within the second. A previous credential is accepted only until
/// its grace window ends, by the clock, whatever the entry's age.
pub(crate) struct Credentials {
    recent: crate::runtime::recent::Recent<String, pb::AdapterCredentials>,
}

impl Credentials {
    /// How long an answer is used.
    const FOR: std::time::Duration = std::time::Duration::from_secs(1);
    /// Adapters kept at most.
    const CAP: usize = 10_000;

    pub(crate) fn new() -> Self {
        Credentials {
            recent: crate::runtime::recent::Recent::new(Self::FOR, Self::CAP),
        }
    }

    /// The credentials of adapter `id` (with `previous` empty once its window has ended).
    pub(crate) async fn get(
        &self,
        state: &Agents,
        id: &str,
    ) -> Result<pb::AdapterCredentials, tonic::Status> {
        let mut credentials = match self.recent.get(&id.to_owned()) {
            Some(credentials) => credentials,
            None => {
                let found = state
                    .adapters()
                    .get_adapter_credentials(pb::GetAdapterCredentialsRequest { id: id.to_owned() })
                    .await?
                    .into_inner();
                self.recent.put(id.to_owned(), found.clone());
                found
            }
        };
        let window_ends = credentials
            .adapter
            .as_ref()
            .map_or(0, |adapter| adapter.previous_expires_at_ms);
        if plinth_kit::clock::now_ms() >= window_ends {
            credentials.previous.clear();
        }
        Ok(credentials)
    }

    /// Forgets adapter `id`: this gateway changed it.
    fn forget(&self, id: &str) {
        self.recent.forget(&id.to_owned());
    }
}

/// Delete a workspace adapter: its secret or token stops working at once.
#[utoipa::path(
    delete,
    path = "/v1/workspace-adapters/{id}",
    tag = "workspace-adapters",
    params(("id" = String, Path, description = "The adapter's id")),
    responses(
        (status = 200, description = "Deleted", body = AdapterDeleted),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "not_found", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn delete_adapter(
    State(state): State<Agents>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<AdapterDeleted>, ApiError> {
    state
        .adapters()
        .delete_adapter(pb::DeleteAdapterRequest {
            scope: caller.scope,
            id: id.clone(),
        })
        .await?;
    state.adapter_credentials.forget(&id);
    Ok(Json(AdapterDeleted {
        id,
        object: "workspace_adapter",
        deleted: true,
    }))
}

/// Replace the adapter's secret (Novo) or token (Brain); the previous one is accepted for
/// `grace_ms` more (0: refused at once), or the configured grace window
/// (`catalog.adapter_credential_grace_seconds`) when the body does not say.
#[utoipa::path(
    post,
    path = "/v1/workspace-adapters/{id}/rotate-secret",
    tag = "workspace-adapters",
    params(("id" = String, Path, description = "The adapter's id")),
    request_body = RotateSecret,
    responses(
        (status = 200, description = "Rotated; the new `secret` or `token` is shown only here", body = AdapterBody),
        (status = 400, description = "environment_invalid: a secret that breaks the rules; grace_ms not a whole number from 0 to 604800000", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "not_found", body = ErrorBody),
        (status = 409, description = "conflict: a secret given for a Brain adapter, whose token Plinth always makes; nothing changed", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn rotate_secret(
    State(state): State<Agents>,
    caller: Caller,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Body,
) -> Result<Json<AdapterBody>, ApiError> {
    // An empty body rotates to a generated credential, like `{}`.
    let body: RotateSecret = crate::http::json::optional(&headers, body).await?;
    let rotated = state
        .adapters()
        .rotate_adapter_credential(pb::RotateAdapterCredentialRequest {
            scope: caller.scope,
            id: id.clone(),
            secret: body.secret.unwrap_or_default(),
            grace_ms: body.grace_ms,
        })
        .await?
        .into_inner();
    state.adapter_credentials.forget(&id);
    let adapter = rotated.adapter.unwrap_or_default();
    Ok(Json(adapter_body(
        &state,
        &headers,
        adapter,
        Some(rotated.credential),
    )))
}

/// How many calls each workspace adapter's runtime may make to its endpoint (Novo's dispatch,
/// Brain's operations), counted per adapter on each gateway replica after the call is
/// authenticated: a token bucket per adapter refilled at `per_second`, holding up to `burst`.
/// One tenant's runtime past its rate is answered `429 rate_limited` with `Retry-After`; other
/// adapters are not affected. Only the adapter's own credential can spend its rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdapterRate {
    /// Calls per second, sustained; 0 for no limit.
    pub per_second: u32,
    /// Calls at once above the rate.
    pub burst: u32,
}

impl Default for AdapterRate {
    fn default() -> Self {
        AdapterRate {
            per_second: 100,
            burst: 200,
        }
    }
}

/// Every adapter's bucket on this gateway.
#[derive(Debug)]
pub(crate) struct AdapterRates {
    rate: AdapterRate,
    buckets: std::sync::Mutex<std::collections::HashMap<String, Bucket>>,
}

impl AdapterRates {
    /// Buckets kept at most; past it, full ones (adapters idle for a while) are dropped.
    const CAP: usize = 10_000;

    pub(crate) fn new(rate: AdapterRate) -> Self {
        AdapterRates {
            rate,
            buckets: std::sync::Mutex::default(),
        }
    }

    /// Takes one call from adapter `id`'s bucket, or refuses it with when to retry.
    pub(crate) fn take(&self, id: &str) -> Result<(), ApiError> {
        self.take_at(id, tokio::time::Instant::now()).map_err(|wait| {
            metrics::counter!("plinth_gateway_refused_total", "reason" => "adapter_rate_limited")
                .increment(1);
            crate::http::error::retry_after(
                plinth_kit::ErrorCode::RateLimited,
                format!(
                    "this workspace adapter may take {} calls per second ({} at once; \
                         gateway.adapter_rate_limit_per_second, gateway.adapter_rate_limit_burst); \
                         retry after {wait} s",
                    self.rate.per_second, self.rate.burst
                ),
                wait,
            )
        })
    }

    fn take_at(&self, id: &str, now: tokio::time::Instant) -> Result<(), u64> {
        let rate = f64::from(self.rate.per_second);
        if rate <= 0.0 {
            return Ok(());
        }
        let burst = f64::from(self.rate.burst.max(1));
        let mut buckets = self
            .buckets
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if buckets.len() >= Self::CAP && !buckets.contains_key(id) {
            buckets.retain(|_, bucket| !bucket.full_at(now, rate, burst));
        }
        buckets
            .entry(id.to_owned())
            .or_insert_with(|| Bucket::full(burst, now))
            .take(now, rate, burst)
    }
}

#[cfg(test)]
mod rate_tests {
    use super::*;

    #[test]
    fn each_adapter_has_its_own_rate() {
        let rates = AdapterRates::new(AdapterRate {
            per_second: 2,
            burst: 3,
        });
        let start = tokio::time::Instant::now();
        for _ in 0..3 {
            rates.take_at("wadp_a", start).expect("within the burst");
        }
        assert_eq!(rates.take_at("wadp_a", start), Err(1));
        // Another adapter is not touched by the first one's calls.
        rates.take_at("wadp_b", start).expect("its own bucket");
        // Refilled at the rate.
        let later = start + std::time::Duration::from_millis(500);
        rates
            .take_at("wadp_a", later)
            .expect("one more after half a second");
        assert!(rates.take_at("wadp_a", later).is_err());
        // 0 is no limit.
        let open = AdapterRates::new(AdapterRate {
            per_second: 0,
            burst: 0,
        });
        for _ in 0..1000 {
            open.take_at("wadp_a", start).expect("unlimited");
        }
    }
}
