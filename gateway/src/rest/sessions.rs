//! Sessions (UHP §6): `POST /v1/sessions` asks the catalog to place a session and pin its
//! environment's active version, then the chosen node to attach it; listing, reading and
//! ending sessions, and the turns recorded for each (commands in `exec`, files in
//! `session_files`).

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use plinth_kit::PlinthError;
use plinth_proto::catalog::v1 as pb;
use plinth_proto::node::v1 as node;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::http::auth::Caller;
use crate::http::auth::Tokens;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::paging::{Page, PageQuery};
use crate::runtime::limits::{LimitsBody, LimitsRequest, SessionLimits};
use crate::runtime::live::place_and_attach;
use crate::runtime::recent::Recent;
use crate::runtime::{Runtime, Services};
use axum::extract::FromRef;

/// The session routes.
pub fn routes<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    Runtime: FromRef<S>,
    TestCommands: FromRef<S>,
    Arc<Tokens>: FromRef<S>,
{
    OpenApiRouter::new()
        .routes(routes!(create_session, list_sessions))
        .routes(routes!(get_session, end_session))
        .routes(routes!(list_turns))
}

/// What a session reads.
#[derive(Debug, Serialize, ToSchema)]
pub struct SessionEnvironment {
    /// The environment's id.
    pub id: String,
    /// The version the session reads, for its whole life.
    pub version: u32,
    /// Where it is mounted, read-only.
    pub mount: String,
}

/// A session.
#[derive(Debug, Serialize, ToSchema)]
pub struct SessionBody {
    /// `sess_` + 32 lowercase hex.
    pub id: String,
    /// Always `session`.
    pub object: &'static str,
    /// `active` or `ended`.
    pub status: &'static str,
    /// What it reads.
    pub environment: SessionEnvironment,
    /// Its private, writable working directory (also its `HOME`).
    pub workdir: String,
    /// What the agent is told about its environment (UHP §6.4).
    pub instructions: String,
    /// False when the node runs without isolation (`--insecure-no-isolation`).
    pub isolated: bool,
    /// The harness it was created for, if any.
    pub harness_id: Option<String>,
    /// Turns recorded so far.
    pub turns: u64,
    /// What it may use: every limit, `null` when it has none. Past `lifetime_ms` since its
    /// creation, or `idle_ms` without an exec or file call, it is ended.
    pub limits: LimitsBody,
    /// Milliseconds since the Unix epoch.
    #[serde(rename = "createdAt")]
    pub created_at: i64,
    /// Milliseconds since the Unix epoch; null while active.
    #[serde(rename = "endedAt")]
    pub ended_at: Option<i64>,
}

/// The test command a session's instructions offer, from what its version installed (the
/// catalog keeps each build's packages). Run from the project itself: pytest's rootdir is
/// then the project's, so its own configuration applies (`testpaths`, `filterwarnings`), as it
/// does not when the project is named from elsewhere (pytest then collects whatever lies
/// under it, benchmarks included). What such a run writes beside the project is sent to the
/// working directory by the node (its `isolation::tool_env`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestCommand {
    /// pytest is installed in the environment's `.venv`: `cd <mount> && python -m pytest`.
    Pytest,
    /// Python packages are installed, pytest is not: `cd <mount> && python -m unittest`,
    /// which needs nothing installed, for tests written with unittest.
    Unittest,
    /// Nothing for Python was installed, or the packages could not be read: no command is
    /// offered rather than one that fails.
    Unknown,
}

impl TestCommand {
    /// The command for a version that installed `packages`.
    pub fn for_packages(packages: &[pb::Package]) -> TestCommand {
        let mut python = packages
            .iter()
            .filter(|package| package.manager() == pb::PackageManager::Pip)
            .peekable();
        if python.peek().is_none() {
            return TestCommand::Unknown;
        }
        // Names as PEP 503 normalizes them: `PyTest` and `pytest` are one package.
        if python.any(|package| plinth_kit::python_install::normalized(&package.name) == "pytest") {
            TestCommand::Pytest
        } else {
            TestCommand::Unittest
        }
    }
}

/// The instructions of §6.4: where the project is, that it is read-only and shared, that its
/// dependencies are installed, where to write, and the entry when there is one; then how to
/// run its tests (`tests`), where tools write, and that background processes outlive their
/// command.
pub fn instructions(session: &pb::Session, tests: TestCommand) -> String {
    let mount = format!("/env/{}", session.slug);
    let workdir = &session.workdir;
    let mut text = format!(
        "The project \"{name}\" (version {version}) is at {mount}. It is read-only and shared \
         with other sessions: do not try to change it. Its dependencies are already installed \
         ({mount}/.venv for Python, {mount}/node_modules for Node, first on PATH): do not \
         install them again. Write your files in your working directory, {workdir}, which is \
         private to this session and writable (it is also HOME).",
        name = session.environment_name,
        version = session.version,
    );
    if !session.entry.is_empty() {
        text.push_str(&format!(
            " Run the project with: {} (from {mount}, or by absolute path from anywhere).",
            session.entry
        ));
    }
    match tests {
        TestCommand::Pytest => text.push_str(&format!(
            " Run the project's tests with: cd {mount} && python -m pytest (from the project, so \
             its own pytest configuration applies)."
        )),
        TestCommand::Unittest => text.push_str(&format!(
            " Tests written with unittest run with: cd {mount} && python -m unittest (pytest \
             is not installed in this environment)."
        )),
        TestCommand::Unknown => {}
    }
    // What the node sets for everyday tools (see the node's `isolation::tool_env`): a test
    // run's cache write failing in the read-only project reads to an agent as failing tests.
    text.push_str(&format!(
        " Tools keep their caches in {workdir}/.cache and coverage its data in \
         {workdir}/.coverage, never in the project (pytest, Hypothesis, ruff, mypy, pip, npm \
         and uv are pointed there). Where uv is on PATH, uv run --project {mount} runs \
         commands in the installed environment, offline, without syncing or changing \
         anything. A process started in the background (server > server.log 2>&1 &) keeps \
         running after its command returns, until the session ends; a command that times out \
         is stopped with everything it started."
    ));
    if !session.isolated {
        text.push_str(
            " Warning: this server runs sessions without isolation; the environment is \
             read-only only by its file modes.",
        );
    }
    text
}

/// What the instructions offer to run `session`'s tests with: from the packages its
/// version's build installed, asked of the catalog once per version (a version never
/// changes) and kept. A catalog that cannot say leaves the command out, this time.
async fn test_command(
    state: &Services,
    tests: &TestCommands,
    session: &pb::Session,
) -> TestCommand {
    let key = (session.environment_id.clone(), session.version);
    if let Some(known) = tests.0.get(&key) {
        return known;
    }
    let build = state
        .catalog()
        .get_build(pb::GetBuildRequest {
            scope: session.scope.clone(),
            id: session.environment_id.clone(),
            version: session.version,
        })
        .await;
    match build {
        Ok(build) => {
            let command = TestCommand::for_packages(&build.into_inner().packages);
            tests.0.put(key, command);
            command
        }
        Err(status) => {
            tracing::warn!(session = %session.id, error = %status.message(), "cannot read the session's packages; its instructions offer no test command");
            TestCommand::Unknown
        }
    }
}

/// The test command each version's sessions are offered, by environment and version.
#[derive(Clone)]
pub(crate) struct TestCommands(Arc<Recent<(String, u32), TestCommand>>);

impl TestCommands {
    /// Entries kept `for` this long, at most `cap` of them.
    pub(crate) fn new(r#for: Duration, cap: usize) -> TestCommands {
        TestCommands(Arc::new(Recent::new(r#for, cap)))
    }
}

/// The session as the API shows it, its instructions included.
pub(crate) async fn shown(
    state: &Services,
    tests: &TestCommands,
    session: pb::Session,
) -> Result<SessionBody, ApiError> {
    let tests = test_command(state, tests, &session).await;
    Ok(session_body(session, tests)?)
}

fn session_body(
    session: pb::Session,
    tests: TestCommand,
) -> Result<SessionBody, plinth_proto::UnknownValue> {
    Ok(SessionBody {
        instructions: instructions(&session, tests),
        environment: SessionEnvironment {
            mount: format!("/env/{}", session.slug),
            id: session.environment_id,
            version: session.version,
        },
        id: session.id,
        object: "session",
        status: pb::SessionStatus::from_wire(session.status)?.label(),
        workdir: session.workdir,
        isolated: session.isolated,
        harness_id: (!session.harness_id.is_empty()).then_some(session.harness_id),
        turns: session.turns,
        limits: SessionLimits::from_catalog(session.limits.as_ref()).body(),
        created_at: session.created_at_ms,
        ended_at: (session.ended_at_ms > 0).then_some(session.ended_at_ms),
    })
}

/// `POST /v1/sessions`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    /// The environment to read (its active version).
    #[serde(default)]
    pub environment: Option<String>,
    /// Or a harness whose environment to read.
    #[serde(default)]
    pub harness_id: Option<String>,
    /// What the session may use; each limit left out gets its configured default, and none
    /// may pass its configured maximum (`invalid_request`, naming the limit and the maximum).
    #[serde(default)]
    #[schema(value_type = Option<LimitsRequest>)]
    pub limits: Option<serde_json::Value>,
}

/// Resolves a harness's environment; an unknown harness is `not_found`.
pub(crate) async fn harness_environment(
    state: &Runtime,
    scope: &str,
    harness: &str,
) -> Result<String, ApiError> {
    let found = state
        .harnesses()
        .get_harness(pb::GetHarnessRequest {
            scope: scope.to_owned(),
            id: harness.to_owned(),
        })
        .await?
        .into_inner();
    Ok(found.environment_id)
}

/// Start a session on an environment's active version.
///
/// With an `Idempotency-Key`, at most one session is started under the key: a retry with the
/// same key and body gets the first answer (`Idempotent-Replayed: true`), waiting while the
/// first is still being started (up to 2 minutes). Answers are kept 24 hours.
#[utoipa::path(
    post,
    path = "/v1/sessions",
    tag = "sessions",
    params(("Idempotency-Key" = Option<String>, Header, description = "1 to 255 visible ASCII characters (a UUID): one session at most is started under it; a retry gets the first answer")),
    request_body = CreateSession,
    responses(
        (status = 201, description = "Started: the version is mounted read-only at environment.mount", body = SessionBody,
            headers(("Idempotent-Replayed" = String, description = "`true` on the stored answer of an earlier request with the same Idempotency-Key"))),
        (status = 400, description = "environment_invalid: malformed body or Idempotency-Key, or neither environment nor harness_id; invalid_request: a limit unknown, not a number of its kind, 0 or less, or past its maximum (detail: limit, max)", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "environment_not_found, or not_found for an unknown harness", body = ErrorBody),
        (status = 409, description = "environment_not_ready: nothing built yet; idempotency_in_progress: the first request with this Idempotency-Key is still starting its session; outcome_unknown: it was cut off after it started, and is not run again under this key", body = ErrorBody),
        (status = 422, description = "idempotency_key_reused: the Idempotency-Key was used with a different body; nothing ran", body = ErrorBody),
        (status = 503, description = "unavailable, with Retry-After: no node agent is alive (detail.reason no_live_node), or no live node has room for the session: each runs its node.max_sessions or has less memory left than the session's memory_mb (detail.reason no_capacity, with live_nodes and memory_mb)", body = ErrorBody),
        (status = 429, description = "quota_exceeded: the scope has as many active sessions as its quota allows (detail: quota, limit, used). Also rate_limited, with Retry-After", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn create_session(
    State(state): State<Runtime>,
    State(tests): State<TestCommands>,
    caller: Caller,
    headers: axum::http::HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let key = crate::rest::idempotency::key_of(&headers)?;
    crate::http::json::declared_json(&headers)?;
    let bytes = crate::http::json::read(body).await?;
    let body: CreateSession = crate::http::json::parse(&bytes)?;
    let Some(key) = key else {
        let session = start(&state, &tests, &caller.scope, body).await?;
        return Ok((StatusCode::CREATED, Json(session)).into_response());
    };
    let key = pb::RequestKey {
        scope: caller.scope.clone(),
        route: "POST /v1/sessions".to_owned(),
        key,
    };
    let work = {
        let state = state.clone();
        let tests = tests.clone();
        async move {
            // A session that could not be started was ended: nothing is left of it, and a
            // retry may start one.
            match start(&state, &tests, &caller.scope, body).await {
                Ok(session) => crate::rest::idempotency::Ran::started(
                    (StatusCode::CREATED, Json(session)).into_response(),
                ),
                Err(error) => crate::rest::idempotency::Ran::before(error),
            }
        }
    };
    crate::rest::idempotency::once(&state.services, key, &bytes, SESSION_START_WAIT, work).await
}

/// How long a retry waits for the session its key's first request is starting.
const SESSION_START_WAIT: Duration = Duration::from_secs(120);

/// Places and attaches the session `body` asks for.
async fn start(
    state: &Runtime,
    tests: &TestCommands,
    scope: &str,
    body: CreateSession,
) -> Result<SessionBody, ApiError> {
    let limits = state.session_limits.resolve(body.limits.as_ref())?;
    let harness_id = body.harness_id.unwrap_or_default();
    let environment = match (body.environment, harness_id.is_empty()) {
        (Some(environment), _) => environment,
        (None, false) => harness_environment(state, scope, &harness_id).await?,
        (None, true) => {
            return Err(PlinthError::invalid(
                "a session names its environment: {\"environment\": \"henv_…\"} or {\"harness_id\": \"chrn_…\"}",
            )
            .into());
        }
    };
    let request = pb::CreateSessionRequest {
        scope: scope.to_owned(),
        environment_id: environment,
        harness_id,
        limits: Some(limits.to_catalog()),
        ..Default::default()
    };
    let session = place_and_attach(state, scope, request).await?;
    shown(&state.services, tests, session).await
}

/// `GET /v1/sessions?limit=&after=&environment=&state=`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct SessionListQuery {
    /// At most this many sessions: default 100, from 1 to 1000.
    #[param(minimum = 1, maximum = 1000, default = 100)]
    pub limit: Option<u32>,
    /// The `next` of the previous page; left out for the first page. Opaque: a value this
    /// list did not hand out is `400 environment_invalid`.
    #[param(max_length = 256, min_length = 1)]
    pub after: Option<String>,
    /// Only the sessions reading this environment (its id, `henv_…`).
    pub environment: Option<String>,
    /// Only the sessions in this state: `active` or `ended` (the session's `status`).
    /// Default: both.
    #[serde(alias = "status")]
    pub state: Option<String>,
}

/// `GET /v1/sessions`.
#[derive(Debug, Serialize, ToSchema)]
pub struct SessionList {
    /// Always `list`.
    #[schema(example = "list")]
    pub object: &'static str,
    /// Oldest first.
    pub data: Vec<SessionBody>,
    /// Whether more sessions follow this page.
    pub has_more: bool,
    /// Pass as `after` for the next page; `null` on the last page.
    pub next: Option<String>,
}

/// List the caller's sessions, active and ended, oldest first.
#[utoipa::path(
    get,
    path = "/v1/sessions",
    tag = "sessions",
    params(SessionListQuery),
    responses(
        (status = 200, description = "One page of the caller's sessions, oldest first", body = SessionList),
        (status = 400, description = "environment_invalid: a limit outside 1–1000, an `after` this list did not hand out, or a state other than active or ended", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 503, description = "unavailable: the catalog did not answer", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn list_sessions(
    State(state): State<Runtime>,
    State(tests): State<TestCommands>,
    caller: Caller,
    query: Result<Query<SessionListQuery>, QueryRejection>,
) -> Result<Json<SessionList>, ApiError> {
    let Query(query) =
        query.map_err(|error| PlinthError::invalid(format!("query: {}", error.body_text())))?;
    let page = Page::from_query(Ok(Query(PageQuery {
        limit: query.limit,
        after: query.after,
    })))?;
    let status = match query.state.as_deref() {
        None => String::new(),
        Some(known @ ("active" | "ended")) => known.to_owned(),
        Some(other) => {
            return Err(PlinthError::invalid(format!(
                "state: {other:?} is not a session's state; use active or ended"
            ))
            .into());
        }
    };
    let list = state
        .sessions()
        .list_sessions(pb::ListSessionsRequest {
            scope: caller.scope,
            environment_id: query.environment.unwrap_or_default(),
            status,
            limit: page.limit,
            after: page.after,
        })
        .await?
        .into_inner();
    let mut data = Vec::with_capacity(list.sessions.len());
    for session in list.sessions {
        data.push(shown(&state.services, &tests, session).await?);
    }
    Ok(Json(SessionList {
        object: "list",
        data,
        has_more: list.has_more,
        next: (!list.next.is_empty()).then_some(list.next),
    }))
}

/// One session.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}",
    tag = "sessions",
    params(("id" = String, Path, description = "The session's id")),
    responses(
        (status = 200, description = "The session", body = SessionBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "not_found", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn get_session(
    State(state): State<Runtime>,
    State(tests): State<TestCommands>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<SessionBody>, ApiError> {
    let session = state
        .sessions()
        .get_session(pb::GetSessionRequest {
            scope: caller.scope,
            id,
        })
        .await?
        .into_inner();
    Ok(Json(shown(&state.services, &tests, session).await?))
}

/// End a session: its commands are stopped and its working directory removed.
#[utoipa::path(
    delete,
    path = "/v1/sessions/{id}",
    tag = "sessions",
    params(("id" = String, Path, description = "The session's id")),
    responses(
        (status = 200, description = "Ended", body = SessionBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "not_found", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn end_session(
    State(state): State<Runtime>,
    State(tests): State<TestCommands>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<SessionBody>, ApiError> {
    let session = state
        .sessions()
        .get_session(pb::GetSessionRequest {
            scope: caller.scope.clone(),
            id: id.clone(),
        })
        .await?
        .into_inner();
    state.live.forget(&caller.scope, &session.id);
    state
        .nodes
        .client(&session.node_address)?
        .detach(node::DetachRequest {
            session_id: session.id.clone(),
        })
        .await?;
    let ended = state
        .sessions()
        .end_session(pb::EndSessionRequest {
            scope: caller.scope,
            id,
        })
        .await?
        .into_inner();
    Ok(Json(shown(&state.services, &tests, ended).await?))
}

/// A session's turns.
#[derive(Debug, Serialize, ToSchema)]
pub struct TurnBody {
    /// 1, 2, … in order.
    pub sequence: u64,
    /// What it did: `exec`, `read_file`, `write_file` or `delete_file` for this API's own
    /// calls; `list_files`, `search_files`, `find_files`, `edit_file`, `apply_patch`,
    /// `read_output`, `restore` or `list_changes` for Novo's and Brain's.
    pub kind: &'static str,
    /// The command or the path.
    pub detail: String,
    /// The environment version the turn read.
    pub version: u32,
    /// The command's exit status (exec only; null while it runs, and -1 for one that could
    /// not start or whose end was not seen).
    pub exit_code: Option<i32>,
    /// Milliseconds since the Unix epoch.
    pub at: i64,
}

/// `GET /v1/sessions/{id}/turns`.
#[derive(Debug, Serialize, ToSchema)]
pub struct TurnList {
    /// Always `list`.
    #[schema(example = "list")]
    pub object: &'static str,
    /// Oldest first.
    pub data: Vec<TurnBody>,
    /// Whether more turns follow this page.
    pub has_more: bool,
    /// Pass as `after` for the next page; `null` on the last page.
    pub next: Option<String>,
}

/// One page of a session's exec and file calls, oldest first, with the version each read.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/turns",
    tag = "sessions",
    params(("id" = String, Path, description = "The session's id"), PageQuery),
    responses(
        (status = 200, description = "One page of the turns", body = TurnList),
        (status = 400, description = "environment_invalid: a limit outside 1–1000, or an `after` this list did not hand out", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "not_found", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn list_turns(
    State(state): State<Runtime>,
    caller: Caller,
    Path(id): Path<String>,
    query: Result<Query<PageQuery>, QueryRejection>,
) -> Result<Json<TurnList>, ApiError> {
    let page = Page::from_query(query)?;
    let turns = state
        .sessions()
        .list_turns(pb::ListTurnsRequest {
            scope: caller.scope,
            id,
            limit: page.limit,
            after: page.after,
        })
        .await?
        .into_inner();
    Ok(Json(TurnList {
        object: "list",
        has_more: turns.has_more,
        next: turns.has_more.then_some(turns.next),
        data: turns
            .turns
            .into_iter()
            .map(|turn| {
                Ok(TurnBody {
                    sequence: turn.sequence,
                    kind: pb::TurnKind::from_wire(turn.kind)?.label(),
                    detail: turn.detail,
                    version: turn.version,
                    exit_code: turn.exit_code,
                    at: turn.at_ms,
                })
            })
            .collect::<Result<_, plinth_proto::UnknownValue>>()?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(entry: &str, isolated: bool) -> pb::Session {
        pb::Session {
            slug: "attrs".to_owned(),
            environment_name: "attrs".to_owned(),
            version: 3,
            workdir: "/home/session".to_owned(),
            entry: entry.to_owned(),
            isolated,
            ..Default::default()
        }
    }

    const PROJECT: &str = "The project \"attrs\" (version 3) is at /env/attrs. It is read-only and \
        shared with other sessions: do not try to change it. Its dependencies are already \
        installed (/env/attrs/.venv for Python, /env/attrs/node_modules for Node, first on \
        PATH): do not install them again. Write your files in your working directory, \
        /home/session, which is private to this session and writable (it is also HOME).";
    const TOOLS: &str = " Tools keep their caches in /home/session/.cache and coverage its data \
        in /home/session/.coverage, never in the project (pytest, Hypothesis, ruff, mypy, pip, \
        npm and uv are pointed there). Where uv is on PATH, uv run --project /env/attrs runs \
        commands in the installed environment, offline, without syncing or changing anything. \
        A process started in the background (server > server.log 2>&1 &) keeps running after \
        its command returns, until the session ends; a command that times out is stopped with \
        everything it started.";

    #[test]
    fn the_test_command_offered_runs_from_the_project_with_what_is_installed() {
        assert_eq!(
            instructions(&session("", true), TestCommand::Pytest),
            format!(
                "{PROJECT} Run the project's tests with: cd /env/attrs && python -m pytest \
                 (from the project, so its own pytest configuration applies).{TOOLS}"
            )
        );
        assert_eq!(
            instructions(&session("", true), TestCommand::Unittest),
            format!(
                "{PROJECT} Tests written with unittest run with: cd /env/attrs && python -m \
                 unittest (pytest is not installed in this environment).{TOOLS}"
            )
        );
        assert_eq!(
            instructions(&session("python3 run.py", false), TestCommand::Unknown),
            format!(
                "{PROJECT} Run the project with: python3 run.py (from /env/attrs, or by absolute \
                 path from anywhere).{TOOLS} Warning: this server runs sessions without \
                 isolation; the environment is read-only only by its file modes."
            )
        );
    }

    #[test]
    fn pytest_is_offered_only_where_the_version_installed_it() {
        let package = |manager: pb::PackageManager, name: &str| pb::Package {
            manager: manager.into(),
            name: name.to_owned(),
            version: "1.0".to_owned(),
        };
        let pip = |name: &str| package(pb::PackageManager::Pip, name);
        assert_eq!(
            TestCommand::for_packages(&[pip("attrs"), pip("PyTest"), pip("pytest-cov")]),
            TestCommand::Pytest
        );
        assert_eq!(
            TestCommand::for_packages(&[pip("attrs"), pip("pytest_cov")]),
            TestCommand::Unittest
        );
        assert_eq!(
            TestCommand::for_packages(&[package(pb::PackageManager::Npm, "pytest")]),
            TestCommand::Unknown
        );
        assert_eq!(TestCommand::for_packages(&[]), TestCommand::Unknown);
        assert_eq!(
            plinth_kit::python_install::normalized("Zope.Interface__x"),
            "zope-interface-x"
        );
    }
}
