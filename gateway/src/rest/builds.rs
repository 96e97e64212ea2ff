//! Builds and versions (UHP §4): `POST …/build` snapshots the source and queues the next
//! version; `GET …/builds/{version}` is its record with the installers' output; `…/log`
//! streams that output as it is written; `GET …/versions` and `POST …/versions/{n}/activate`
//! list versions and move the active pointer. The catalog owns every rule; builders do the
//! work.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use plinth_kit::PlinthError;
use plinth_proto::catalog::v1 as pb;
use plinth_proto::source::v1 as source;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::http::auth::Caller;
use crate::http::auth::Tokens;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::paging::{self, Page, PageQuery};
use crate::rest::build_status::{BuildPhase, BuildState, build_state, millis};
use crate::rest::environments::{EnvironmentBody, EnvironmentIdParam, PackageBody};
use crate::runtime::Services;
use axum::extract::FromRef;

/// How often a followed log asks the catalog for more.
const FOLLOW_POLL: Duration = Duration::from_millis(250);

/// The build routes.
pub fn routes<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    Services: FromRef<S>,
    Arc<Tokens>: FromRef<S>,
{
    OpenApiRouter::new()
        .routes(routes!(start_build))
        .routes(routes!(get_build))
        .routes(routes!(build_log))
        .routes(routes!(list_versions))
        .routes(routes!(activate_version))
        .routes(routes!(version_files))
}

/// The source files a version was built from: the tree of `GET …/files` as it was when the
/// build was started (the snapshot the build froze), so two versions' files can be compared.
#[utoipa::path(
    get,
    path = "/v1/environments/{id}/versions/{version}/files",
    tag = "builds",
    params(
        ("id" = String, Path, description = "The environment's id"),
        ("version" = u32, Path, description = "The version"),
        crate::rest::files::TreeQuery
    ),
    responses(
        (status = 200, description = "One page of the version's source files and directories, sorted by path", body = crate::rest::files::FileTree),
        (status = 400, description = "environment_invalid: a limit outside 1–1000, or an `after` this list did not hand out", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "environment_not_found: no such environment or version", body = ErrorBody),
        (status = 503, description = "unavailable", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn version_files(
    State(state): State<Services>,
    caller: Caller,
    path: Result<Path<VersionPath>, axum::extract::rejection::PathRejection>,
    query: Result<Query<crate::rest::files::TreeQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<crate::rest::files::FileTree>, ApiError> {
    let (id, version) = version_path(path)?;
    let Query(query) =
        query.map_err(|error| PlinthError::invalid(format!("query: {}", error.body_text())))?;
    let page = Page::new(query.limit, query.after)?;
    let build = state
        .catalog()
        .get_build(pb::GetBuildRequest {
            scope: caller.scope,
            id: id.clone(),
            version,
        })
        .await?
        .into_inner();
    if build.source_tree.is_empty() {
        return Err(PlinthError::new(
            plinth_kit::ErrorCode::EnvironmentNotFound,
            format!("version {version} has no source snapshot"),
        )
        .into());
    }
    let tree = state
        .source()
        .list_tree(source::ListTreeRequest {
            environment_id: id,
            limit: page.limit,
            after: page.after,
            links: query.links.unwrap_or(false),
            tree: build.source_tree,
        })
        .await?
        .into_inner();
    Ok(Json(crate::rest::files::FileTree::from_page(tree)?))
}

/// A build's record.
#[derive(Debug, Serialize, ToSchema)]
pub struct BuildRecord {
    /// Always `build`.
    pub object: &'static str,
    /// The version it builds.
    pub version: u32,
    /// `building` from the moment the build is accepted, then `ready` or `failed` (UHP §4).
    pub status: BuildState,
    /// Where a `building` build is: `queued` (waiting for a builder) or `running`. Left out
    /// once the build is `ready` or `failed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<BuildPhase>,
    /// The installers' own output (head and tail kept when long).
    pub log: String,
    /// Why it failed; empty otherwise.
    pub error: String,
    /// What it installed.
    pub packages: Vec<PackageBody>,
    /// The layer's bytes, once ready.
    pub size: u64,
    /// Leases handed out: more than 1 when a builder was lost.
    pub attempt: u32,
    /// When it was accepted: milliseconds since the Unix epoch.
    #[schema(example = 1790569990000_i64)]
    pub queued_at: i64,
    /// When a builder started it: milliseconds since the Unix epoch; null while queued.
    #[schema(example = 1790570000000_i64)]
    pub started_at: Option<i64>,
    /// When it ended: milliseconds since the Unix epoch; null while building.
    #[schema(example = 1790570094000_i64)]
    pub finished_at: Option<i64>,
    /// Whether it was asked to reuse nothing from earlier builds.
    pub clean: bool,
    /// The toolchains its installers ran with, once ready.
    pub toolchains: Vec<ToolchainBody>,
}

/// A toolchain a build's installers ran with; sessions of the version run the same programs.
#[derive(Debug, Serialize, ToSchema)]
pub struct ToolchainBody {
    /// `python` or `node`.
    pub name: &'static str,
    /// As the program reports it (`3.11.7`).
    pub version: String,
    /// The program's path.
    pub path: String,
}

fn toolchains(
    toolchains: Vec<pb::Toolchain>,
) -> Result<Vec<ToolchainBody>, plinth_proto::UnknownValue> {
    toolchains
        .into_iter()
        .map(|t| {
            Ok(ToolchainBody {
                name: pb::ToolchainName::from_wire(t.name)?.label(),
                version: t.version,
                path: t.path,
            })
        })
        .collect()
}

/// `POST …/build`'s optional body.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartBuild {
    /// Reuse nothing from earlier builds: every installer runs from scratch, with an empty
    /// start (the download cache still serves what it holds).
    #[serde(default)]
    pub clean: bool,
}

/// One version in `GET …/versions`.
#[derive(Debug, Serialize, ToSchema)]
pub struct VersionEntry {
    /// Its number.
    pub version: u32,
    /// Its build's: `building`, then `ready` or `failed`.
    pub status: BuildState,
    /// While `building`: `queued` or `running`. Left out once finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<BuildPhase>,
    /// Whether sessions get it.
    pub active: bool,
    /// Packages installed.
    pub packages: u32,
    /// Milliseconds since the Unix epoch; null while queued.
    pub started_at: Option<i64>,
    /// Milliseconds since the Unix epoch; null while building.
    pub finished_at: Option<i64>,
    /// The toolchains its installers ran with, once ready.
    pub toolchains: Vec<ToolchainBody>,
}

/// `GET …/versions`.
#[derive(Debug, Serialize, ToSchema)]
pub struct VersionList {
    /// Always `list`.
    pub object: &'static str,
    /// The active version; null when none is.
    pub active: Option<u32>,
    /// Builds, newest first.
    pub data: Vec<VersionEntry>,
    /// Whether more items follow this page.
    pub has_more: bool,
    /// Pass as `after` for the next page; null on the last page.
    pub next: Option<String>,
}

/// `…/log` query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct LogQuery {
    /// Keep the response open and stream lines as they are written, until the build ends.
    #[serde(default, deserialize_with = "crate::http::query::flag")]
    pub follow: Option<bool>,
    /// Start at this byte of the log: a client that reconnects passes the bytes it has.
    pub offset: Option<u64>,
}

fn record(build: pb::Build, log: String) -> Result<BuildRecord, plinth_proto::UnknownValue> {
    let (status, phase) = build_state(build.status);
    Ok(BuildRecord {
        object: "build",
        version: build.version,
        status,
        phase,
        log,
        error: build.error,
        packages: build
            .packages
            .into_iter()
            .map(PackageBody::try_from)
            .collect::<Result<_, _>>()?,
        size: build.size,
        attempt: build.attempt,
        queued_at: build.queued_at_ms,
        started_at: millis(build.started_at_ms),
        finished_at: millis(build.finished_at_ms),
        clean: build.clean,
        toolchains: toolchains(build.toolchains)?,
    })
}

/// The `{id}` and `{version}` of a route; a version that is not a number cannot exist.
#[derive(Debug, Deserialize)]
pub struct VersionPath {
    id: String,
    version: String,
}

fn version_path(
    path: Result<Path<VersionPath>, axum::extract::rejection::PathRejection>,
) -> Result<(String, u32), ApiError> {
    let Ok(Path(path)) = path else {
        return Err(PlinthError::not_found("environment").into());
    };
    let version = path.version.parse::<u32>().map_err(|_| {
        PlinthError::not_found(format_args!(
            "version {:?} of environment {}",
            path.version, path.id
        ))
    })?;
    Ok((path.id, version))
}

/// Starts a build: the source as it is now becomes the next version.
#[utoipa::path(
    post,
    path = "/v1/environments/{id}/build",
    tag = "builds",
    params(("id" = String, Path, description = "The environment's id")),
    request_body(content = Option<StartBuild>, description = "Optional; `{\"clean\": true}` reuses nothing from earlier builds"),
    responses(
        (status = 202, description = "Accepted: `building`, phase `queued` or `running`; poll or follow …/builds/{version}", body = BuildRecord),
        (status = 400, description = "environment_invalid: the body is not a valid StartBuild", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "environment_not_found", body = ErrorBody),
        (status = 409, description = "environment_busy: a build is queued or running", body = ErrorBody),
        (status = 429, description = "quota_exceeded: the scope has as many builds queued or running as its quota allows (detail: quota, limit, used). Also rate_limited, with Retry-After", body = ErrorBody),
        (status = 503, description = "unavailable", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn start_build(
    State(state): State<Services>,
    caller: Caller,
    EnvironmentIdParam(id): EnvironmentIdParam,
    headers: axum::http::HeaderMap,
    body: axum::body::Body,
) -> Result<(StatusCode, Json<BuildRecord>), ApiError> {
    // The body is optional: no body (or an empty one) is a build that may reuse.
    let options: StartBuild = crate::http::json::optional(&headers, body).await?;
    // The environment must be the caller's before its source is touched.
    state
        .catalog()
        .get_environment(pb::GetEnvironmentRequest {
            scope: caller.scope.clone(),
            id: id.clone(),
        })
        .await?;
    let snapshot = state
        .source()
        .snapshot(source::SnapshotRequest {
            environment_id: id.clone(),
        })
        .await?
        .into_inner();
    let build = state
        .catalog()
        .start_build(pb::StartBuildRequest {
            scope: caller.scope,
            id,
            source_tree: snapshot.tree_digest,
            clean: options.clean,
        })
        .await?
        .into_inner();
    Ok((StatusCode::ACCEPTED, Json(record(build, String::new())?)))
}

/// A build's record: status, the installers' output, the error, packages, size, times.
#[utoipa::path(
    get,
    path = "/v1/environments/{id}/builds/{version}",
    tag = "builds",
    params(("id" = String, Path, description = "The environment's id"), ("version" = u32, Path, description = "The version")),
    responses(
        (status = 200, description = "The build", body = BuildRecord),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "environment_not_found: no such environment or version", body = ErrorBody),
        (status = 503, description = "unavailable", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn get_build(
    State(state): State<Services>,
    caller: Caller,
    path: Result<Path<VersionPath>, axum::extract::rejection::PathRejection>,
) -> Result<Json<BuildRecord>, ApiError> {
    let (id, version) = version_path(path)?;
    let build = state
        .catalog()
        .get_build(pb::GetBuildRequest {
            scope: caller.scope.clone(),
            id: id.clone(),
            version,
        })
        .await?
        .into_inner();
    let log = state
        .catalog()
        .read_build_log(pb::ReadBuildLogRequest {
            scope: caller.scope,
            id,
            version,
            offset: 0,
        })
        .await?
        .into_inner()
        .text;
    Ok(Json(record(build, log)?))
}

/// A build's log as plain text; with `follow=true`, streamed as it is written until the build
/// ends. `offset` resumes after the bytes a client already has.
#[utoipa::path(
    get,
    path = "/v1/environments/{id}/builds/{version}/log",
    tag = "builds",
    params(("id" = String, Path, description = "The environment's id"), ("version" = u32, Path, description = "The version"), LogQuery),
    responses(
        (status = 200, description = "The log from `offset`", content_type = "text/plain", body = String),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "environment_not_found: no such environment or version", body = ErrorBody),
        (status = 503, description = "unavailable", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn build_log(
    State(state): State<Services>,
    caller: Caller,
    path: Result<Path<VersionPath>, axum::extract::rejection::PathRejection>,
    query: Result<Query<LogQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let (id, version) = version_path(path)?;
    let Query(query) =
        query.map_err(|error| PlinthError::invalid(format!("query: {}", error.body_text())))?;
    let request = pb::ReadBuildLogRequest {
        scope: caller.scope,
        id,
        version,
        offset: query.offset.unwrap_or(0),
    };
    // The first read answers errors (unknown version, other scope) before the stream starts.
    let first = state
        .catalog()
        .read_build_log(request.clone())
        .await?
        .into_inner();
    let follow = query.follow.unwrap_or(false);
    let catalog = state.catalog();
    let stream = futures::stream::unfold(
        (Some(first), request, catalog, false),
        move |(pending, mut request, mut catalog, done)| async move {
            if done {
                return None;
            }
            let part = match pending {
                Some(part) => part,
                None => {
                    tokio::time::sleep(FOLLOW_POLL).await;
                    match catalog.read_build_log(request.clone()).await {
                        Ok(answer) => answer.into_inner(),
                        Err(status) => {
                            let error = std::io::Error::other(status.message().to_owned());
                            return Some((Err(error), (None, request, catalog, true)));
                        }
                    }
                }
            };
            request.offset = part.next_offset;
            let finished = part.finished || !follow;
            Some((
                Ok::<_, std::io::Error>(bytes::Bytes::from(part.text)),
                (None, request, catalog, finished),
            ))
        },
    );
    let mut response = Body::from_stream(stream).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    Ok(response)
}

/// Every build of an environment, and which version is active.
#[utoipa::path(
    get,
    path = "/v1/environments/{id}/versions",
    tag = "builds",
    params(("id" = String, Path, description = "The environment's id"), PageQuery),
    responses(
        (status = 200, description = "One page of the versions, newest first", body = VersionList),
        (status = 400, description = "environment_invalid: a limit outside 1–1000, or an `after` this list did not hand out", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "environment_not_found", body = ErrorBody),
        (status = 503, description = "unavailable", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn list_versions(
    State(state): State<Services>,
    caller: Caller,
    EnvironmentIdParam(id): EnvironmentIdParam,
    query: Result<Query<PageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<VersionList>, ApiError> {
    let page = Page::from_query(query)?;
    let environment = state
        .catalog()
        .get_environment(pb::GetEnvironmentRequest {
            scope: caller.scope,
            id,
        })
        .await?
        .into_inner();
    let active = environment.version;
    let (versions, next) = paging::slice_descending(environment.versions, &page, |version| {
        u64::from(version.version)
    })?;
    Ok(Json(VersionList {
        object: "list",
        active,
        has_more: next.is_some(),
        next,
        data: versions
            .into_iter()
            .map(|version| {
                let (status, phase) = build_state(version.status);
                Ok(VersionEntry {
                    version: version.version,
                    status,
                    phase,
                    active: Some(version.version) == active,
                    packages: version.packages,
                    started_at: millis(version.started_at_ms),
                    finished_at: millis(version.finished_at_ms),
                    toolchains: toolchains(version.toolchains)?,
                })
            })
            .collect::<Result<_, plinth_proto::UnknownValue>>()?,
    }))
}

/// Makes a finished build the active version; rolling back is activating an earlier one.
#[utoipa::path(
    post,
    path = "/v1/environments/{id}/versions/{version}/activate",
    tag = "builds",
    params(("id" = String, Path, description = "The environment's id"), ("version" = u32, Path, description = "The version")),
    responses(
        (status = 200, description = "The environment, with the version active", body = EnvironmentBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "environment_not_found: no such environment or version", body = ErrorBody),
        (status = 409, description = "environment_not_ready: the version is building or failed", body = ErrorBody),
        (status = 503, description = "unavailable", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn activate_version(
    State(state): State<Services>,
    caller: Caller,
    path: Result<Path<VersionPath>, axum::extract::rejection::PathRejection>,
) -> Result<Json<EnvironmentBody>, ApiError> {
    let (id, version) = version_path(path)?;
    let environment = state
        .catalog()
        .activate_version(pb::ActivateVersionRequest {
            scope: caller.scope,
            id,
            version,
        })
        .await?
        .into_inner();
    Ok(Json(
        crate::rest::environments::environment_body(&state, environment).await?,
    ))
}
