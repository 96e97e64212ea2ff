//! `/v1/environments`: the UHP environment object (§2) over the catalog's gRPC contract.
//! Request bodies are parsed strictly here; every rule (names, slugs, limits, scopes) is the
//! catalog's.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use plinth_kit::PlinthError;
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
use crate::rest::build_status::{BuildPhase, BuildState, build_state, millis};
use crate::runtime::Services;
use axum::extract::FromRef;

/// The environment routes.
pub fn routes<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    Services: FromRef<S>,
    Arc<Tokens>: FromRef<S>,
{
    OpenApiRouter::new()
        .routes(routes!(create_environment, list_environments))
        .routes(routes!(
            get_environment,
            update_environment,
            delete_environment
        ))
}

/// `POST /v1/environments`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(
    deny_unknown_fields,
    expecting = "a JSON object with name, description, entry, install"
)]
pub struct CreateEnvironment {
    /// Display name, up to 200 characters, without control characters and with at least one
    /// ASCII letter or digit; the slug and mount path are derived from it and never change.
    #[schema(
        example = "Content Studio",
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]*[A-Za-z0-9][^\\x00-\\x1f\\x7f-\\x9f]*$"
    )]
    pub name: String,
    /// Free text, up to 4000 characters.
    #[serde(default)]
    #[schema(max_length = 4000)]
    pub description: Option<String>,
    /// How to run the project, told to agents; up to 4000 characters.
    #[serde(default)]
    #[schema(example = "python3 run.py --episode <id>", max_length = 4000)]
    pub entry: Option<String>,
    /// How builds install, where the manifests found should not decide (Plinth's own field).
    #[serde(default)]
    pub install: Option<InstallBody>,
}

/// `PUT /v1/environments/{id}`: fields left out stay as they are.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(
    deny_unknown_fields,
    expecting = "a JSON object with name, description, entry, install"
)]
pub struct UpdateEnvironment {
    /// New display name. The slug and mount path stay, so scripts that use the absolute path
    /// keep working.
    #[serde(default)]
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]*[A-Za-z0-9][^\\x00-\\x1f\\x7f-\\x9f]*$"
    )]
    pub name: Option<String>,
    /// New description.
    #[serde(default)]
    #[schema(max_length = 4000)]
    pub description: Option<String>,
    /// New entry.
    #[serde(default)]
    #[schema(max_length = 4000)]
    pub entry: Option<String>,
    /// New install settings, replacing the old whole; `{}` clears them.
    #[serde(default)]
    pub install: Option<InstallBody>,
}

/// How an environment's builds install, where its owner says rather than the manifests found
/// (Plinth's own field; docs/guide/builds.md, "What a build runs").
#[derive(Debug, Default, Deserialize, Serialize, ToSchema)]
#[serde(
    deny_unknown_fields,
    expecting = r#"a JSON object with python, such as {"python": {"requirements": ["requirements.txt"]}}"#
)]
pub struct InstallBody {
    /// The Python manifest to install; null: chosen from the manifests found.
    #[serde(default)]
    pub python: Option<PythonBody>,
}

/// Which Python manifest a build installs: requirements files, the project in
/// `pyproject.toml`, or both (the project first).
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(
    deny_unknown_fields,
    expecting = r#"a JSON object with requirements, project, or both, such as {"requirements": ["requirements.txt"]} or {"project": {"groups": ["dev"], "extras": ["test"]}}"#
)]
pub struct PythonBody {
    /// Requirements files relative to the project's root, installed together, in this order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(example = json!(["requirements.txt", "requirements-dev.txt"]))]
    pub requirements: Vec<String>,
    /// The project in `pyproject.toml`; absent: it is not installed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<ProjectBody>,
}

/// The project in `pyproject.toml`, with which of its dependency groups and extras.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(
    deny_unknown_fields,
    expecting = r#"a JSON object with groups, extras, such as {"groups": ["dev"], "extras": ["test"]}"#
)]
pub struct ProjectBody {
    /// The dependency groups (PEP 735) to install, exactly these; absent: uv's default
    /// groups (`dev`); `[]`: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = json!(["dev"]))]
    pub groups: Option<Vec<String>>,
    /// The optional dependencies to install with it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(example = json!(["test"]))]
    pub extras: Vec<String>,
}

impl From<InstallBody> for pb::InstallSettings {
    fn from(body: InstallBody) -> Self {
        pb::InstallSettings {
            python: body.python.map(|python| pb::PythonInstall {
                requirements: python.requirements,
                project: python.project.map(|project| pb::PythonProject {
                    groups: project.groups.map(|names| pb::Names { names }),
                    extras: project.extras,
                }),
            }),
        }
    }
}

impl From<pb::InstallSettings> for InstallBody {
    fn from(settings: pb::InstallSettings) -> Self {
        InstallBody {
            python: settings.python.map(|python| PythonBody {
                requirements: python.requirements,
                project: python.project.map(|project| ProjectBody {
                    groups: project.groups.map(|groups| groups.names),
                    extras: project.extras,
                }),
            }),
        }
    }
}

/// The environment object of UHP §2.
#[derive(Debug, Serialize, ToSchema)]
pub struct EnvironmentBody {
    /// `henv_` + 32 lowercase hex digits.
    #[schema(
        example = "henv_2f1c9d4e8a7b4c3d9e6f5a4b3c2d1e0f",
        pattern = "^henv_[0-9a-f]{32}$"
    )]
    pub id: String,
    /// Always `environment`.
    #[schema(example = "environment")]
    pub object: &'static str,
    /// Display name.
    pub name: String,
    /// Fixed at creation.
    #[schema(example = "content-studio")]
    pub slug: String,
    /// Free text; empty when not given.
    pub description: String,
    /// How to run the project; empty when not given.
    pub entry: String,
    /// How builds install (Plinth's own field, beyond the spec's object): present only when
    /// the owner named the Python manifest (`install.python`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub install: Option<InstallBody>,
    /// `empty` (nothing built yet), `building`, `ready` (a version is active) or `failed`.
    #[schema(example = "empty")]
    pub status: &'static str,
    /// Where sessions see it: `/env/<slug>`.
    #[schema(example = "/env/content-studio")]
    pub mount: String,
    /// The active version; null until a build succeeds.
    pub version: Option<u32>,
    /// The newest version built or building; null until a build starts.
    #[serde(rename = "latestVersion")]
    pub latest_version: Option<u32>,
    /// Size of the source.
    pub files: FilesBody,
    /// Packages the active version installed.
    pub packages: Vec<PackageBody>,
    /// Every version, newest first.
    pub versions: Vec<VersionBody>,
    /// The latest build; null until a build starts.
    pub build: Option<BuildBody>,
    /// Milliseconds since the Unix epoch.
    #[serde(rename = "createdAt")]
    pub created_at: i64,
    /// Milliseconds since the Unix epoch.
    #[serde(rename = "updatedAt")]
    pub updated_at: i64,
}

/// Size of an environment's source.
#[derive(Debug, Serialize, ToSchema)]
pub struct FilesBody {
    /// Regular files.
    pub count: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// An installed package.
#[derive(Debug, Serialize, ToSchema)]
pub struct PackageBody {
    /// `pip` or `npm`.
    pub manager: &'static str,
    /// Its name.
    pub name: String,
    /// Its version.
    pub version: String,
}

/// One version on the environment object.
#[derive(Debug, Serialize, ToSchema)]
pub struct VersionBody {
    /// Its number.
    pub version: u32,
    /// Its build's: `building`, then `ready` or `failed`.
    pub status: BuildState,
    /// While `building`: `queued` (waiting for a builder) or `running`. Left out once
    /// finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<BuildPhase>,
    /// Milliseconds since the Unix epoch; null while queued.
    pub started_at: Option<i64>,
    /// Milliseconds since the Unix epoch; null while building.
    pub finished_at: Option<i64>,
    /// Packages installed.
    pub packages: u32,
}

/// The latest build on the environment object.
#[derive(Debug, Serialize, ToSchema)]
pub struct BuildBody {
    /// The version it builds.
    pub version: u32,
    /// `building` from the moment it is accepted, then `ready` or `failed`.
    pub status: BuildState,
    /// While `building`: `queued` (waiting for a builder) or `running`. Left out once
    /// finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<BuildPhase>,
    /// Milliseconds since the Unix epoch; null while queued.
    pub started_at: Option<i64>,
    /// Milliseconds since the Unix epoch; null while building.
    pub finished_at: Option<i64>,
    /// Why it failed; empty otherwise.
    pub error: String,
}

/// `GET /v1/environments`.
#[derive(Debug, Serialize, ToSchema)]
pub struct EnvironmentList {
    /// Always `list`.
    #[schema(example = "list")]
    pub object: &'static str,
    /// The caller's environments, oldest first.
    pub data: Vec<EnvironmentBody>,
    /// Whether more items follow this page.
    pub has_more: bool,
    /// Pass as `after` for the next page; null on the last page.
    pub next: Option<String>,
}

/// `DELETE /v1/environments/{id}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeletedEnvironment {
    /// The id that was deleted.
    pub id: String,
    /// Always `environment`.
    pub object: &'static str,
    /// Always true.
    pub deleted: bool,
}

fn environment_status(status: i32) -> &'static str {
    match pb::EnvironmentStatus::try_from(status) {
        Ok(pb::EnvironmentStatus::Building) => "building",
        Ok(pb::EnvironmentStatus::Ready) => "ready",
        Ok(pb::EnvironmentStatus::Failed) => "failed",
        Ok(pb::EnvironmentStatus::Empty | pb::EnvironmentStatus::Unspecified) | Err(_) => "empty",
    }
}

impl TryFrom<pb::Package> for PackageBody {
    type Error = plinth_proto::UnknownValue;

    fn try_from(package: pb::Package) -> Result<Self, Self::Error> {
        Ok(PackageBody {
            manager: pb::PackageManager::from_wire(package.manager)?.label(),
            name: package.name,
            version: package.version,
        })
    }
}

impl TryFrom<pb::Environment> for EnvironmentBody {
    type Error = plinth_proto::UnknownValue;

    fn try_from(environment: pb::Environment) -> Result<Self, Self::Error> {
        let files = environment.files.unwrap_or_default();
        Ok(EnvironmentBody {
            id: environment.id,
            object: "environment",
            name: environment.name,
            slug: environment.slug,
            description: environment.description,
            entry: environment.entry,
            install: environment
                .install
                .map(InstallBody::from)
                .filter(|install| install.python.is_some()),
            status: environment_status(environment.status),
            mount: environment.mount,
            version: environment.version,
            latest_version: environment.latest_version,
            files: FilesBody {
                count: files.count,
                bytes: files.bytes,
            },
            packages: environment
                .packages
                .into_iter()
                .map(PackageBody::try_from)
                .collect::<Result<_, _>>()?,
            versions: environment
                .versions
                .into_iter()
                .map(|version| {
                    let (status, phase) = build_state(version.status);
                    VersionBody {
                        version: version.version,
                        status,
                        phase,
                        started_at: millis(version.started_at_ms),
                        finished_at: millis(version.finished_at_ms),
                        packages: version.packages,
                    }
                })
                .collect(),
            build: environment.build.map(|build| {
                let (status, phase) = build_state(build.status);
                BuildBody {
                    version: build.version,
                    status,
                    phase,
                    started_at: millis(build.started_at_ms),
                    finished_at: millis(build.finished_at_ms),
                    error: build.error,
                }
            }),
            created_at: environment.created_at_ms,
            updated_at: environment.updated_at_ms,
        })
    }
}

/// Environment objects with `files` read from the source service, which owns the files.
async fn bodies(
    state: &Services,
    environments: Vec<pb::Environment>,
) -> Result<Vec<EnvironmentBody>, ApiError> {
    let ids = environments.iter().map(|e| e.id.clone()).collect();
    let stats = state
        .source()
        .stats(plinth_proto::source::v1::StatsRequest {
            environment_ids: ids,
        })
        .await?
        .into_inner()
        .stats;
    Ok(environments
        .into_iter()
        .map(|environment| {
            let files = stats.get(&environment.id).cloned().unwrap_or_default();
            let mut body = EnvironmentBody::try_from(environment)?;
            body.files = FilesBody {
                count: files.count,
                bytes: files.bytes,
            };
            Ok(body)
        })
        .collect::<Result<_, plinth_proto::UnknownValue>>()?)
}

pub(crate) async fn environment_body(
    state: &Services,
    environment: pb::Environment,
) -> Result<EnvironmentBody, ApiError> {
    let mut bodies = bodies(state, vec![environment]).await?;
    bodies
        .pop()
        .ok_or_else(|| PlinthError::new(plinth_kit::ErrorCode::Internal, "no environment").into())
}

/// The `{id}` of a route. A segment that does not decode cannot name an environment.
pub struct EnvironmentIdParam(pub String);

impl<S: Send + Sync> FromRequestParts<S> for EnvironmentIdParam {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(id)) => Ok(EnvironmentIdParam(id)),
            Err(_) => Err(PlinthError::not_found("environment").into()),
        }
    }
}

/// Create an environment.
#[utoipa::path(
    post,
    path = "/v1/environments",
    tag = "environments",
    request_body = CreateEnvironment,
    responses(
        (status = 201, description = "Created", body = EnvironmentBody),
        (status = 400, description = "environment_invalid: malformed JSON, unknown or mistyped field, a name that yields no slug, a limit broken, install settings that break a rule (the message names the field, what is wrong and what to write)", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 409, description = "environment_exists: the slug (and mount path) is taken in this scope", body = ErrorBody),
        (status = 429, description = "quota_exceeded: the scope has as many environments as its quota allows (detail: quota, limit, used). Also rate_limited, with Retry-After", body = ErrorBody),
        (status = 503, description = "unavailable: the catalog did not answer", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn create_environment(
    State(state): State<Services>,
    caller: Caller,
    JsonBody(body): JsonBody<CreateEnvironment>,
) -> Result<(StatusCode, Json<EnvironmentBody>), ApiError> {
    let request = pb::CreateEnvironmentRequest {
        scope: caller.scope,
        name: body.name,
        description: body.description.unwrap_or_default(),
        entry: body.entry.unwrap_or_default(),
        install: body.install.map(Into::into),
    };
    let environment = state
        .catalog()
        .create_environment(request)
        .await?
        .into_inner();
    Ok((
        StatusCode::CREATED,
        Json(environment_body(&state, environment).await?),
    ))
}

/// List the caller's environments.
#[utoipa::path(
    get,
    path = "/v1/environments",
    tag = "environments",
    params(PageQuery),
    responses(
        (status = 200, description = "One page of the caller's environments, oldest first", body = EnvironmentList),
        (status = 400, description = "environment_invalid: a limit outside 1–1000, or an `after` this list did not hand out", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 503, description = "unavailable: the catalog did not answer", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn list_environments(
    State(state): State<Services>,
    caller: Caller,
    query: Result<Query<PageQuery>, QueryRejection>,
) -> Result<Json<EnvironmentList>, ApiError> {
    let page = Page::from_query(query)?;
    let request = pb::ListEnvironmentsRequest {
        scope: caller.scope,
        limit: page.limit,
        after: page.after,
    };
    let list = state
        .catalog()
        .list_environments(request)
        .await?
        .into_inner();
    Ok(Json(EnvironmentList {
        object: "list",
        data: bodies(&state, list.environments).await?,
        has_more: list.has_more,
        next: (!list.next.is_empty()).then_some(list.next),
    }))
}

/// One environment, with its versions.
#[utoipa::path(
    get,
    path = "/v1/environments/{id}",
    tag = "environments",
    params(("id" = String, Path, description = "The environment's id")),
    responses(
        (status = 200, description = "The environment", body = EnvironmentBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "environment_not_found: no such environment in the caller's scope", body = ErrorBody),
        (status = 503, description = "unavailable: the catalog did not answer", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn get_environment(
    State(state): State<Services>,
    caller: Caller,
    EnvironmentIdParam(id): EnvironmentIdParam,
) -> Result<Json<EnvironmentBody>, ApiError> {
    let request = pb::GetEnvironmentRequest {
        scope: caller.scope,
        id,
    };
    let environment = state.catalog().get_environment(request).await?.into_inner();
    Ok(Json(environment_body(&state, environment).await?))
}

/// Rename an environment, or change its description, entry or install settings. The slug and
/// mount stay.
#[utoipa::path(
    put,
    path = "/v1/environments/{id}",
    tag = "environments",
    params(("id" = String, Path, description = "The environment's id")),
    request_body = UpdateEnvironment,
    responses(
        (status = 200, description = "The environment as changed", body = EnvironmentBody),
        (status = 400, description = "environment_invalid: malformed JSON, unknown or mistyped field, a limit broken, install settings that break a rule (the message names the field, what is wrong and what to write)", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "environment_not_found", body = ErrorBody),
        (status = 503, description = "unavailable: the catalog did not answer", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn update_environment(
    State(state): State<Services>,
    caller: Caller,
    EnvironmentIdParam(id): EnvironmentIdParam,
    JsonBody(body): JsonBody<UpdateEnvironment>,
) -> Result<Json<EnvironmentBody>, ApiError> {
    let request = pb::UpdateEnvironmentRequest {
        scope: caller.scope,
        id,
        name: body.name,
        description: body.description,
        entry: body.entry,
        install: body.install.map(Into::into),
    };
    let environment = state
        .catalog()
        .update_environment(request)
        .await?
        .into_inner();
    Ok(Json(environment_body(&state, environment).await?))
}

/// Delete an environment and every version of it.
#[utoipa::path(
    delete,
    path = "/v1/environments/{id}",
    tag = "environments",
    params(("id" = String, Path, description = "The environment's id")),
    responses(
        (status = 200, description = "Deleted", body = DeletedEnvironment),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "environment_not_found", body = ErrorBody),
        (status = 409, description = "environment_busy: a build is running", body = ErrorBody),
        (status = 503, description = "unavailable: the catalog did not answer", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn delete_environment(
    State(state): State<Services>,
    caller: Caller,
    EnvironmentIdParam(id): EnvironmentIdParam,
) -> Result<Json<DeletedEnvironment>, ApiError> {
    let request = pb::DeleteEnvironmentRequest {
        scope: caller.scope.clone(),
        id: id.clone(),
    };
    state.catalog().delete_environment(request).await?;
    // The catalog's word is final: the environment is gone. Its source index is forgotten
    // too, and its scope's stored bytes let go of its files and layers; if that fails, the
    // rows are unreachable and still count in the scope's stored bytes.
    let drop = plinth_proto::source::v1::DropEnvironmentRequest {
        environment_id: id.clone(),
        scope: caller.scope,
    };
    if let Err(status) = state.source().drop_environment(drop).await {
        tracing::warn!(environment = %id, error = %status.message(), "forgetting a deleted environment's source failed");
    }
    Ok(Json(DeletedEnvironment {
        id,
        object: "environment",
        deleted: true,
    }))
}
