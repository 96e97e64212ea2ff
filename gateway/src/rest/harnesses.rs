//! `/v1/harnesses` and `/v1/environments/{id}/harnesses`: harnesses and the environment their
//! tasks read (UHP Environments §5), over the catalog's `HarnessService`. Request bodies are
//! parsed strictly here; every rule (limits, which environments a harness may name, scopes)
//! is the catalog's.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::catalog::v1 as pb;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::http::auth::Caller;
use crate::http::auth::Tokens;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::json::JsonBody;
use crate::http::paging::{Page, PageQuery};
use crate::rest::environments::EnvironmentIdParam;
use crate::runtime::Services;
use axum::extract::FromRef;

/// The harness routes.
pub fn routes<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    Services: FromRef<S>,
    Arc<Tokens>: FromRef<S>,
{
    OpenApiRouter::new()
        .routes(routes!(create_harness, list_harnesses))
        .routes(routes!(get_harness, update_harness, delete_harness))
        .routes(routes!(list_environment_harnesses))
}

/// `POST /v1/harnesses` and `PUT /v1/harnesses/{id}`: a harness is written whole.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(
    deny_unknown_fields,
    expecting = "a JSON object with name, base, environment"
)]
pub struct HarnessWrite {
    /// Display name: not blank, up to 200 characters, no control characters.
    #[schema(
        example = "Teaser cutter",
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]*[^\\s\\x00-\\x1f\\x7f-\\x9f][^\\x00-\\x1f\\x7f-\\x9f]*$"
    )]
    pub name: String,
    /// The agent the harness builds on: not blank, up to 200 characters, no control
    /// characters.
    #[schema(
        example = "codex",
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]*[^\\s\\x00-\\x1f\\x7f-\\x9f][^\\x00-\\x1f\\x7f-\\x9f]*$"
    )]
    pub base: String,
    /// The environment its tasks read: an environment of the caller's scope. Required: left
    /// out, null, empty, or naming anything else, the write is refused with
    /// `environment_not_found`.
    #[serde(default)]
    #[schema(example = "henv_2f1c9d4e8a7b4c3d9e6f5a4b3c2d1e0f")]
    pub environment: Option<String>,
}

/// A harness: a named agent configuration and the environment its tasks read.
#[derive(Debug, Serialize, ToSchema)]
pub struct HarnessBody {
    /// `chrn_` + 32 lowercase hex digits.
    #[schema(
        example = "chrn_0b6f2a9e4c7d4e1f8a3b5c6d7e8f9a0b",
        pattern = "^chrn_[0-9a-f]{32}$"
    )]
    pub id: String,
    /// Always `harness`.
    #[schema(example = "harness")]
    pub object: &'static str,
    /// Display name.
    pub name: String,
    /// The agent it builds on.
    #[schema(example = "codex", min_length = 1, max_length = 200)]
    pub base: String,
    /// The environment its tasks read. Kept when that environment is deleted; its tasks are
    /// then refused with `environment_not_found`.
    #[schema(example = "henv_2f1c9d4e8a7b4c3d9e6f5a4b3c2d1e0f")]
    pub environment: String,
    /// Milliseconds since the Unix epoch.
    #[serde(rename = "createdAt")]
    pub created_at: i64,
    /// Milliseconds since the Unix epoch.
    #[serde(rename = "updatedAt")]
    pub updated_at: i64,
}

/// `GET /v1/harnesses`, `GET /v1/environments/{id}/harnesses`.
#[derive(Debug, Serialize, ToSchema)]
pub struct HarnessList {
    /// Always `list`.
    #[schema(example = "list")]
    pub object: &'static str,
    /// The harnesses, oldest first.
    pub data: Vec<HarnessBody>,
    /// Whether more items follow this page.
    pub has_more: bool,
    /// Pass as `after` for the next page; null on the last page.
    pub next: Option<String>,
}

/// `DELETE /v1/harnesses/{id}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeletedHarness {
    /// The id that was deleted.
    pub id: String,
    /// Always `harness`.
    pub object: &'static str,
    /// Always true.
    pub deleted: bool,
}

impl From<pb::Harness> for HarnessBody {
    fn from(harness: pb::Harness) -> Self {
        HarnessBody {
            id: harness.id,
            object: "harness",
            name: harness.name,
            base: harness.base,
            environment: harness.environment_id,
            created_at: harness.created_at_ms,
            updated_at: harness.updated_at_ms,
        }
    }
}

fn list(answer: pb::ListHarnessesResponse) -> HarnessList {
    HarnessList {
        object: "list",
        data: answer
            .harnesses
            .into_iter()
            .map(HarnessBody::from)
            .collect(),
        has_more: answer.has_more,
        next: (!answer.next.is_empty()).then_some(answer.next),
    }
}

/// The `{id}` of a harness route. A segment that does not decode cannot name a harness.
pub struct HarnessIdParam(pub String);

impl<S: Send + Sync> FromRequestParts<S> for HarnessIdParam {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(id)) => Ok(HarnessIdParam(id)),
            Err(_) => Err(PlinthError::new(ErrorCode::NotFound, "harness was not found").into()),
        }
    }
}

/// Create a harness naming an environment of the caller's scope.
#[utoipa::path(
    post,
    path = "/v1/harnesses",
    tag = "harnesses",
    request_body = HarnessWrite,
    responses(
        (status = 201, description = "Created", body = HarnessBody),
        (status = 400, description = "environment_invalid: malformed JSON, unknown or mistyped field, a blank name or base, a limit broken", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "environment_not_found: no environment named, or none of the caller's scope by that id", body = ErrorBody),
        (status = 503, description = "unavailable: the catalog did not answer", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn create_harness(
    State(state): State<Services>,
    caller: Caller,
    JsonBody(body): JsonBody<HarnessWrite>,
) -> Result<(StatusCode, Json<HarnessBody>), ApiError> {
    let request = pb::CreateHarnessRequest {
        scope: caller.scope,
        name: body.name,
        base: body.base,
        environment_id: body.environment.unwrap_or_default(),
    };
    let harness = state
        .harnesses()
        .create_harness(request)
        .await?
        .into_inner();
    Ok((StatusCode::CREATED, Json(harness.into())))
}

/// List the caller's harnesses.
#[utoipa::path(
    get,
    path = "/v1/harnesses",
    tag = "harnesses",
    params(PageQuery),
    responses(
        (status = 200, description = "One page of the caller's harnesses, oldest first", body = HarnessList),
        (status = 400, description = "environment_invalid: a limit outside 1–1000, or an `after` this list did not hand out", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 503, description = "unavailable: the catalog did not answer", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn list_harnesses(
    State(state): State<Services>,
    caller: Caller,
    query: Result<Query<PageQuery>, QueryRejection>,
) -> Result<Json<HarnessList>, ApiError> {
    let page = Page::from_query(query)?;
    let request = pb::ListHarnessesRequest {
        scope: caller.scope,
        environment_id: None,
        limit: page.limit,
        after: page.after,
    };
    let answer = state
        .harnesses()
        .list_harnesses(request)
        .await?
        .into_inner();
    Ok(Json(list(answer)))
}

/// One harness.
#[utoipa::path(
    get,
    path = "/v1/harnesses/{id}",
    tag = "harnesses",
    params(("id" = String, Path, description = "The harness's id")),
    responses(
        (status = 200, description = "The harness", body = HarnessBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "not_found: no such harness in the caller's scope", body = ErrorBody),
        (status = 503, description = "unavailable: the catalog did not answer", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn get_harness(
    State(state): State<Services>,
    caller: Caller,
    HarnessIdParam(id): HarnessIdParam,
) -> Result<Json<HarnessBody>, ApiError> {
    let request = pb::GetHarnessRequest {
        scope: caller.scope,
        id,
    };
    let harness = state.harnesses().get_harness(request).await?.into_inner();
    Ok(Json(harness.into()))
}

/// Replace a harness's name, base and environment.
#[utoipa::path(
    put,
    path = "/v1/harnesses/{id}",
    tag = "harnesses",
    params(("id" = String, Path, description = "The harness's id")),
    request_body = HarnessWrite,
    responses(
        (status = 200, description = "The harness as written", body = HarnessBody),
        (status = 400, description = "environment_invalid: malformed JSON, unknown or mistyped field, a blank name or base, a limit broken", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "not_found: no such harness in the caller's scope; environment_not_found: no environment named, or none of the caller's scope by that id", body = ErrorBody),
        (status = 503, description = "unavailable: the catalog did not answer", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn update_harness(
    State(state): State<Services>,
    caller: Caller,
    HarnessIdParam(id): HarnessIdParam,
    JsonBody(body): JsonBody<HarnessWrite>,
) -> Result<Json<HarnessBody>, ApiError> {
    let request = pb::UpdateHarnessRequest {
        scope: caller.scope,
        id,
        name: body.name,
        base: body.base,
        environment_id: body.environment.unwrap_or_default(),
    };
    let harness = state
        .harnesses()
        .update_harness(request)
        .await?
        .into_inner();
    Ok(Json(harness.into()))
}

/// Delete a harness. Its environment is untouched.
#[utoipa::path(
    delete,
    path = "/v1/harnesses/{id}",
    tag = "harnesses",
    params(("id" = String, Path, description = "The harness's id")),
    responses(
        (status = 200, description = "Deleted", body = DeletedHarness),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "not_found: no such harness in the caller's scope", body = ErrorBody),
        (status = 503, description = "unavailable: the catalog did not answer", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn delete_harness(
    State(state): State<Services>,
    caller: Caller,
    HarnessIdParam(id): HarnessIdParam,
) -> Result<Json<DeletedHarness>, ApiError> {
    let request = pb::DeleteHarnessRequest {
        scope: caller.scope,
        id: id.clone(),
    };
    state.harnesses().delete_harness(request).await?;
    Ok(Json(DeletedHarness {
        id,
        object: "harness",
        deleted: true,
    }))
}

/// The harnesses that name an environment: what a rebuild of it reaches.
#[utoipa::path(
    get,
    path = "/v1/environments/{id}/harnesses",
    tag = "harnesses",
    params(("id" = String, Path, description = "The environment's id"), PageQuery),
    responses(
        (status = 200, description = "One page of the caller's harnesses that name the environment, oldest first", body = HarnessList),
        (status = 400, description = "environment_invalid: a limit outside 1–1000, or an `after` this list did not hand out", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "environment_not_found: no such environment in the caller's scope (including a deleted one)", body = ErrorBody),
        (status = 503, description = "unavailable: the catalog did not answer", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn list_environment_harnesses(
    State(state): State<Services>,
    caller: Caller,
    EnvironmentIdParam(id): EnvironmentIdParam,
    query: Result<Query<PageQuery>, QueryRejection>,
) -> Result<Json<HarnessList>, ApiError> {
    let page = Page::from_query(query)?;
    let request = pb::ListHarnessesRequest {
        scope: caller.scope,
        environment_id: Some(id),
        limit: page.limit,
        after: page.after,
    };
    let answer = state
        .harnesses()
        .list_harnesses(request)
        .await?
        .into_inner();
    Ok(Json(list(answer)))
}
