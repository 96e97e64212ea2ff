//! Sessions (UHP §6) and tasks (§5): `POST /v1/sessions` asks the catalog to place a session
//! and pin its environment's active version, then the chosen node to attach it; exec and
//! working-directory file calls go to that node, and each is recorded with the catalog as a
//! turn with the version it read. `POST /v1/tasks` is refused before anything starts unless
//! the task's environment (its own, else its harness's) is ready.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::catalog::v1 as pb;
use plinth_proto::node::v1 as node;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;
use crate::auth::Caller;
use crate::conditional::ReadAnswer;
use crate::error::{ApiError, ErrorBody};
use crate::json::JsonBody;
use crate::limits::{LimitsBody, LimitsRequest, SessionLimits};
pub use crate::nodes::MAX_SESSION_FILE_BYTES;
use crate::paging::{Page, PageQuery};
use crate::runtime::{
    active_session, finish_turn, place_and_attach, record, settle, spec, start_session,
};

/// The session and task routes.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_session, list_sessions))
        .routes(routes!(get_session, end_session))
        .routes(routes!(exec, crate::terminal::open_terminal))
        .routes(routes!(list_turns))
        .routes(routes!(read_file, write_file, delete_file))
        .routes(routes!(create_task))
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
async fn test_command(state: &AppState, session: &pb::Session) -> TestCommand {
    let key = (session.environment_id.clone(), session.version);
    if let Some(known) = state.test_commands.get(&key) {
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
            state.test_commands.put(key, command);
            command
        }
        Err(status) => {
            tracing::warn!(session = %session.id, error = %status.message(), "cannot read the session's packages; its instructions offer no test command");
            TestCommand::Unknown
        }
    }
}

/// The session as the API shows it, its instructions included.
async fn shown(state: &AppState, session: pb::Session) -> Result<SessionBody, ApiError> {
    let tests = test_command(state, &session).await;
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
async fn harness_environment(
    state: &AppState,
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
    State(state): State<AppState>,
    caller: Caller,
    headers: axum::http::HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let key = crate::idempotency::key_of(&headers)?;
    crate::json::declared_json(&headers)?;
    let bytes = crate::json::read(body).await?;
    let body: CreateSession = crate::json::parse(&bytes)?;
    let Some(key) = key else {
        let session = start(&state, &caller.scope, body).await?;
        return Ok((StatusCode::CREATED, Json(session)).into_response());
    };
    let key = pb::RequestKey {
        scope: caller.scope.clone(),
        route: "POST /v1/sessions".to_owned(),
        key,
    };
    let work = {
        let state = state.clone();
        async move {
            // A session that could not be started was ended: nothing is left of it, and a
            // retry may start one.
            match start(&state, &caller.scope, body).await {
                Ok(session) => crate::idempotency::Ran::started(
                    (StatusCode::CREATED, Json(session)).into_response(),
                ),
                Err(error) => crate::idempotency::Ran::before(error),
            }
        }
    };
    crate::idempotency::once(&state, key, &bytes, SESSION_START_WAIT, work).await
}

/// How long a retry waits for the session its key's first request is starting.
const SESSION_START_WAIT: Duration = Duration::from_secs(120);

/// Places and attaches the session `body` asks for.
async fn start(
    state: &AppState,
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
    shown(state, session).await
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
    State(state): State<AppState>,
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
        data.push(shown(&state, session).await?);
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
    State(state): State<AppState>,
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
    Ok(Json(shown(&state, session).await?))
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
    State(state): State<AppState>,
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
    Ok(Json(shown(&state, ended).await?))
}

/// `POST /v1/sessions/{id}/exec`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecBody {
    /// A shell command (`/bin/sh -c`).
    pub command: String,
    /// Where it starts: relative to the working directory, or absolute beneath it or beneath
    /// the mount. Default: the working directory.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment variables. `PYTHONUNBUFFERED=1` is set unless given here, so that
    /// Python's output streams as it is printed.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// Time limit in milliseconds (default 120000; at most 3600000).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Text the command reads on its standard input, then end-of-file (default: nothing,
    /// `/dev/null`). The whole body is at most 1 MiB.
    #[serde(default)]
    pub stdin: Option<String>,
    /// The same as bytes, base64-encoded (standard alphabet, padded); not with `stdin`.
    #[serde(default)]
    pub stdin_base64: Option<String>,
}

impl ExecBody {
    /// The command's standard input, decoded; both forms at once, or base64 that does not
    /// decode, is `environment_invalid`.
    fn stdin(&self) -> Result<Bytes, PlinthError> {
        use base64::Engine as _;
        match (&self.stdin, &self.stdin_base64) {
            (None, None) => Ok(Bytes::new()),
            (Some(text), None) => Ok(Bytes::from(text.clone())),
            // Padded standard base64; bits past the last byte are not checked (`0V2=` is
            // `0V0=`), as most decoders do.
            (None, Some(encoded)) => base64::engine::GeneralPurpose::new(
                &base64::alphabet::STANDARD,
                base64::engine::general_purpose::PAD.with_decode_allow_trailing_bits(true),
            )
            .decode(encoded.trim())
            .map(Bytes::from)
            .map_err(|error| PlinthError::invalid(format!("stdin_base64: not base64 ({error})"))),
            (Some(_), Some(_)) => Err(PlinthError::invalid(
                "stdin and stdin_base64: give the command's input one way, not both",
            )),
        }
    }
}

/// `?stream=true`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ExecQuery {
    /// Stream output as it comes (newline-delimited JSON events).
    #[serde(default, deserialize_with = "crate::query::flag")]
    pub stream: Option<bool>,
}

/// A command's result.
#[derive(Debug, Serialize, ToSchema)]
pub struct ExecResultBody {
    /// Its exit status (128 + signal when killed; -1 when it could not start).
    pub exit_code: i32,
    /// What it wrote to stdout, up to the cap, then the truncation marker.
    pub stdout: String,
    /// What it wrote to stderr, up to the cap, then the truncation marker.
    pub stderr: String,
    /// Wall time.
    pub duration_ms: u64,
    /// Whether it was killed at its time limit.
    pub timed_out: bool,
    /// Whether the kernel killed it for exceeding the session's memory limit.
    pub oom_killed: bool,
    /// Whether stdout was cut.
    pub stdout_truncated: bool,
    /// Whether stderr was cut.
    pub stderr_truncated: bool,
    /// The environment version the command read.
    pub version: u32,
    /// The turn's number in the session.
    pub turn: u64,
}

/// Bytes of each stream an exec answer keeps.
pub const EXEC_OUTPUT_BYTES: u64 = 1024 * 1024;

fn marker(dropped: u64) -> String {
    format!("\n[output truncated: {dropped} more bytes were not kept]\n")
}

/// Run a shell command in the session.
///
/// With `pty=true` and a WebSocket upgrade (`Connection: Upgrade`, `Upgrade: websocket`,
/// `Sec-WebSocket-Version: 13`, `Sec-WebSocket-Key`) there is no JSON body: the command (or,
/// without `command`, an interactive shell) runs on a terminal and the answer is `101
/// Switching Protocols` and a WebSocket. Binary frames carry the terminal's bytes both ways;
/// text frames are JSON controls: the client sends `{"type":"resize","cols":N,"rows":N}` when
/// its terminal's size changes and `{"type":"close_stdin"}` at the end of its input; the
/// server sends `{"type":"exit","exit_code":N}` when the command ends, then closes. The turn
/// is recorded as an `exec` turn like any command's.
///
/// A command ends with its caller: a client that hangs up before the answer (or a gRPC call
/// cancelled or past its deadline) has the command killed with its whole process tree, as a
/// closed terminal is hung up; its turn ends with exit code -1.
///
/// With an `Idempotency-Key` (an exec answered whole), the command runs at most once: a retry
/// with the same key and body gets the first answer (`Idempotent-Replayed: true`), waiting
/// while the first still runs; such a command is the key's, not its connection's, and runs to
/// its end even if its caller hangs up, so that the retry finds its answer. Answers are kept
/// 24 hours.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/exec",
    tag = "sessions",
    params(
        ("id" = String, Path, description = "The session's id"),
        ("Idempotency-Key" = Option<String>, Header, description = "1 to 255 visible ASCII characters (a UUID): the command runs at most once under it; a retry gets the first answer. Not with stream=true or pty=true"),
        ExecQuery,
        crate::terminal::TerminalQuery,
    ),
    request_body = ExecBody,
    responses(
        (status = 101, description = "pty=true: switching to the terminal's WebSocket (see the operation's description for its frames)"),
        (status = 200, description = "The command ended (or, with stream=true or `Accept: application/x-ndjson`, newline-delimited JSON events: {\"stdout\":…}, {\"stderr\":…}, then the result)", body = ExecResultBody,
            headers(("Idempotent-Replayed" = String, description = "`true` on the stored answer of an earlier request with the same Idempotency-Key"))),
        (status = 400, description = "environment_invalid: bad command, cwd, env or terminal size; pty=true with a malformed WebSocket handshake; a malformed Idempotency-Key, or one with stream=true or pty=true", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "not_found: no such session, or it ended", body = ErrorBody),
        (status = 426, description = "upgrade_required: pty=true on a request that is no WebSocket upgrade (Connection: Upgrade, Upgrade: websocket); the answer's Upgrade header names websocket", body = ErrorBody,
            headers(("Upgrade" = String, description = "websocket"))),
        (status = 409, description = "idempotency_in_progress: the first exec with this Idempotency-Key still runs (past its time limit and 30 s); outcome_unknown: it was cut off after it started (its node stopped answering), and is not run again under this key", body = ErrorBody),
        (status = 422, description = "idempotency_key_reused: the Idempotency-Key was used on this session's exec with a different body; nothing ran", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn exec(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    query: Result<Query<ExecQuery>, axum::extract::rejection::QueryRejection>,
    terminal: Result<
        Query<crate::terminal::TerminalQuery>,
        axum::extract::rejection::QueryRejection,
    >,
    request: axum::extract::Request,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|error| PlinthError::invalid(format!("query: {error}")))?;
    let Query(terminal) =
        terminal.map_err(|error| PlinthError::invalid(format!("query: {error}")))?;
    let key = crate::idempotency::key_of(request.headers())?;
    if terminal.pty.unwrap_or(false) {
        if key.is_some() {
            return Err(crate::idempotency::refused_for("a terminal"));
        }
        return crate::terminal::open(state, caller, id, terminal, request).await;
    }
    terminal.refuse_without_pty()?;
    // `Accept: application/x-ndjson` asks for the stream as `?stream=true` does (the gRPC
    // `Exec` asks this way).
    let streamed = query.stream.unwrap_or(false)
        || request
            .headers()
            .get(axum::http::header::ACCEPT)
            .is_some_and(|accept| {
                accept
                    .as_bytes()
                    .eq_ignore_ascii_case(b"application/x-ndjson")
            });
    if streamed && key.is_some() {
        return Err(crate::idempotency::refused_for("a streamed exec"));
    }
    crate::json::declared_json(request.headers())?;
    let bytes = crate::json::read(request.into_body()).await?;
    let body: ExecBody = crate::json::parse(&bytes)?;
    body.stdin()?;
    if body.command.trim().is_empty() {
        return Err(PlinthError::invalid("command: must not be empty").into());
    }
    if streamed {
        return stream_command(state, caller.scope, &id, body).await;
    }
    let Some(key) = key else {
        // Run here: a caller that hangs up drops this, and with it the node's call, which
        // kills the command.
        return match run_command(&state, &caller.scope, &id, body).await {
            Ok(result) => Ok(Json(result).into_response()),
            Err(Failed { error, .. }) => Err(error),
        };
    };
    let wait = Duration::from_millis(
        body.timeout_ms
            .unwrap_or(DEFAULT_EXEC_TIMEOUT_MS)
            .min(MAX_EXEC_TIMEOUT_MS),
    ) + WAIT_PAST_TIME_LIMIT;
    let key = pb::RequestKey {
        scope: caller.scope.clone(),
        route: format!("POST /v1/sessions/{id}/exec"),
        key,
    };
    let work = {
        let state = state.clone();
        async move {
            match run_command(&state, &caller.scope, &id, body).await {
                Ok(result) => crate::idempotency::Ran::started(Json(result).into_response()),
                Err(Failed {
                    error,
                    started: false,
                }) => crate::idempotency::Ran::before(error),
                Err(Failed {
                    error,
                    started: true,
                }) => crate::idempotency::Ran::started(error.into_response()),
            }
        }
    };
    crate::idempotency::once(&state, key, &bytes, wait, work).await
}

/// A command's time limit when its request names none, as documented (a node may be
/// configured otherwise).
const DEFAULT_EXEC_TIMEOUT_MS: u64 = 120_000;
/// The longest time limit a command may be given, as documented.
const MAX_EXEC_TIMEOUT_MS: u64 = 3_600_000;
/// How long past its command's time limit a retry waits for a keyed exec's answer.
const WAIT_PAST_TIME_LIMIT: Duration = Duration::from_secs(30);

/// Why a command has no result, and whether it was sent to its node (it may have run).
struct Failed {
    error: ApiError,
    started: bool,
}

impl Failed {
    fn before(error: impl Into<ApiError>) -> Failed {
        Failed {
            error: error.into(),
            started: false,
        }
    }
}

/// The node's request for `body` in `session`. Python's output is unbuffered unless the
/// caller says otherwise (`PYTHONUNBUFFERED` in `env`): its stdout is a pipe here, which
/// Python would otherwise fill in blocks, so a streamed exec would show nothing until the
/// command ends.
fn node_request(session: &pb::Session, body: ExecBody) -> node::ExecRequest {
    // Checked when the request was read.
    let stdin = body.stdin().unwrap_or_default();
    let mut env = body.env.unwrap_or_default();
    env.entry("PYTHONUNBUFFERED".to_owned())
        .or_insert_with(|| "1".to_owned());
    node::ExecRequest {
        session: Some(spec(session)),
        command: body.command,
        cwd: body.cwd.unwrap_or_default(),
        env: env.into_iter().collect(),
        timeout_ms: body.timeout_ms.unwrap_or(0),
        output_limit_bytes: EXEC_OUTPUT_BYTES,
        stdin,
    }
}

/// Runs a command in session `id` to its end and answers its result. The turn is recorded
/// as the command starts, beside it rather than after it; how it ended is added when it ends
/// (or -1 when this is dropped before: its caller left, and the node killed it).
async fn run_command(
    state: &AppState,
    scope: &str,
    id: &str,
    body: ExecBody,
) -> Result<ExecResultBody, Failed> {
    let session = active_session(state, scope, id)
        .await
        .map_err(Failed::before)?;
    let mut node = state
        .nodes
        .client(&session.node_address)
        .map_err(Failed::before)?;
    let mut recording = Recording::start(state, scope, &session, &body.command);
    let request = node_request(&session, body);
    let ran = async {
        let mut events = node.exec(request).await?.into_inner();
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let mut result = None;
        while let Some(event) = events.next().await {
            match event?.event {
                Some(node::exec_event::Event::Stdout(bytes)) => stdout.extend_from_slice(&bytes),
                Some(node::exec_event::Event::Stderr(bytes)) => stderr.extend_from_slice(&bytes),
                Some(node::exec_event::Event::Result(ended)) => result = Some(ended),
                None => {}
            }
        }
        let result = result.ok_or_else(|| {
            PlinthError::new(
                ErrorCode::Unavailable,
                "the node ended the command without a result",
            )
        })?;
        Ok::<_, ApiError>((stdout, stderr, result))
    };
    let (turn, ran) = tokio::join!(recording.turn(), ran);
    recording.settled();
    let (turn, (stdout, stderr, result)) =
        settle(state, scope, &session, turn, ran).map_err(|error| Failed {
            error,
            started: true,
        })?;
    finish_turn(state, scope, &turn, result.exit_code);
    let mut stdout = String::from_utf8_lossy(&stdout).into_owned();
    let mut stderr = String::from_utf8_lossy(&stderr).into_owned();
    if result.stdout_dropped_bytes > 0 {
        stdout.push_str(&marker(result.stdout_dropped_bytes));
    }
    if result.stderr_dropped_bytes > 0 {
        stderr.push_str(&marker(result.stderr_dropped_bytes));
    }
    Ok(ExecResultBody {
        exit_code: result.exit_code,
        stdout,
        stderr,
        duration_ms: result.duration_ms,
        timed_out: result.timed_out,
        oom_killed: result.oom_killed,
        stdout_truncated: result.stdout_dropped_bytes > 0,
        stderr_truncated: result.stderr_dropped_bytes > 0,
        version: turn.version,
        turn: turn.sequence,
    })
}

/// Starts a command in session `id` and answers its events as they come.
async fn stream_command(
    state: AppState,
    scope: String,
    id: &str,
    body: ExecBody,
) -> Result<Response, ApiError> {
    let session = active_session(&state, &scope, id).await?;
    let mut node = state.nodes.client(&session.node_address)?;
    let mut recording = Recording::start(&state, &scope, &session, &body.command);
    let request = node_request(&session, body);
    let started = async { Ok::<_, ApiError>(node.exec(request).await?.into_inner()) };
    let (turn, events) = tokio::join!(recording.turn(), started);
    recording.settled();
    let (turn, events) = settle(&state, &scope, &session, turn, events)?;
    Ok(stream_exec(state, scope, session, turn, events))
}

/// The catalog's answer to a turn's record, still to come.
type PendingTurn = std::pin::Pin<Box<dyn Future<Output = Result<pb::Turn, ApiError>> + Send>>;

/// A command's turn, recorded beside the command. Dropped before [`Recording::settled`] (the
/// caller left while the command ran, and the node killed it), the turn is finished as -1,
/// its end not seen: a record still on its way is completed in the background first, so the
/// turn is never left without an end.
struct Recording {
    state: AppState,
    scope: String,
    pending: Option<PendingTurn>,
    turn: Option<pb::Turn>,
}

impl Recording {
    fn start(state: &AppState, scope: &str, session: &Arc<pb::Session>, detail: &str) -> Self {
        let pending: PendingTurn = {
            let (state, scope, session, detail) = (
                state.clone(),
                scope.to_owned(),
                session.clone(),
                detail.to_owned(),
            );
            Box::pin(async move {
                record(&state, &scope, &session, pb::TurnKind::Exec, &detail, None).await
            })
        };
        Recording {
            state: state.clone(),
            scope: scope.to_owned(),
            pending: Some(pending),
            turn: None,
        }
    }

    /// The turn, once recorded.
    async fn turn(&mut self) -> Result<pb::Turn, ApiError> {
        if let Some(turn) = &self.turn {
            return Ok(turn.clone());
        }
        let Some(pending) = self.pending.as_mut() else {
            return Err(PlinthError::new(ErrorCode::Internal, "the turn was not recorded").into());
        };
        let recorded = pending.await;
        self.pending = None;
        let turn = recorded?;
        self.turn = Some(turn.clone());
        Ok(turn)
    }

    /// The caller records how the command ended from here on.
    fn settled(&mut self) {
        self.pending = None;
        self.turn = None;
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        if let Some(turn) = self.turn.take() {
            finish_turn(&self.state, &self.scope, &turn, -1);
        } else if let Some(pending) = self.pending.take() {
            let (state, scope) = (self.state.clone(), self.scope.clone());
            plinth_kit::tasks::spawn(async move {
                if let Ok(turn) = pending.await {
                    finish_turn(&state, &scope, &turn, -1);
                }
            });
        }
    }
}

/// Streams exec events as newline-delimited JSON; the last line is the result.
fn stream_exec(
    state: AppState,
    scope: String,
    session: Arc<pb::Session>,
    turn: pb::Turn,
    events: tonic::Streaming<node::ExecEvent>,
) -> Response {
    let lines = async_stream_lines(state, scope, session, turn, events);
    Response::builder()
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(lines))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// A streamed command's state: its events until the result, then nothing.
struct Streamed {
    events: Option<tonic::Streaming<node::ExecEvent>>,
    state: AppState,
    scope: String,
    session: Arc<pb::Session>,
    turn: pb::Turn,
}

impl Drop for Streamed {
    /// A stream that ends (or a client that leaves) before the result leaves its turn
    /// finished as a command that could not complete.
    fn drop(&mut self) {
        if self.events.is_some() {
            finish_turn(&self.state, &self.scope, &self.turn, -1);
        }
    }
}

fn async_stream_lines(
    state: AppState,
    scope: String,
    session: Arc<pb::Session>,
    turn: pb::Turn,
    events: tonic::Streaming<node::ExecEvent>,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    let streamed = Streamed {
        events: Some(events),
        state,
        scope,
        session,
        turn,
    };
    futures::stream::unfold(streamed, |mut streamed| async move {
        let events = streamed.events.as_mut()?;
        let line = match events.next().await {
            Some(Ok(node::ExecEvent { event: Some(event) })) => match event {
                node::exec_event::Event::Stdout(bytes) => {
                    serde_json::json!({ "stdout": String::from_utf8_lossy(&bytes) })
                }
                node::exec_event::Event::Stderr(bytes) => {
                    serde_json::json!({ "stderr": String::from_utf8_lossy(&bytes) })
                }
                node::exec_event::Event::Result(ended) => {
                    // The call's status follows the result: read it, so the call ends `OK`.
                    plinth_kit::streams::finish(events).await;
                    streamed.events = None;
                    finish_turn(
                        &streamed.state,
                        &streamed.scope,
                        &streamed.turn,
                        ended.exit_code,
                    );
                    let line = serde_json::json!({
                        "exit_code": ended.exit_code,
                        "duration_ms": ended.duration_ms,
                        "timed_out": ended.timed_out,
                        "oom_killed": ended.oom_killed,
                        "stdout_truncated": ended.stdout_dropped_bytes > 0,
                        "stderr_truncated": ended.stderr_dropped_bytes > 0,
                        "stdout_dropped_bytes": ended.stdout_dropped_bytes,
                        "stderr_dropped_bytes": ended.stderr_dropped_bytes,
                        "version": streamed.turn.version,
                        "turn": streamed.turn.sequence,
                    });
                    let mut text = line.to_string();
                    text.push('\n');
                    return Some((Ok(Bytes::from(text)), streamed));
                }
            },
            Some(Ok(_)) => serde_json::json!({}),
            Some(Err(status)) => {
                streamed
                    .state
                    .live
                    .forget(&streamed.scope, &streamed.session.id);
                let error = PlinthError::from_status(&status);
                serde_json::json!({ "error": { "code": error.code.as_str(), "message": error.message } })
            }
            None => return None,
        };
        let mut text = line.to_string();
        text.push('\n');
        Some((Ok(Bytes::from(text)), streamed))
    })
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
    State(state): State<AppState>,
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

/// `{id}` and `{*path}`.
#[derive(Debug, Deserialize)]
pub struct SessionFilePath {
    id: String,
    path: String,
}

fn file_path(
    path: Result<Path<SessionFilePath>, axum::extract::rejection::PathRejection>,
) -> Result<SessionFilePath, ApiError> {
    path.map(|Path(path)| path)
        .map_err(|error| PlinthError::invalid(format!("path: {error}")).into())
}

/// Read a file of the session's working directory. Reads are conditional and ranged like an
/// environment file's (see `conditional`). The node answers a working-directory file whole
/// (it is at most 64 MiB), so its `ETag` is the SHA-256 of the bytes answered: a strong
/// validator that costs one pass over bytes already in memory, where size and modification
/// time would miss a same-size write within the file system's time granularity.
#[utoipa::path(
    get,
    operation_id = "read_session_file",
    path = "/v1/sessions/{id}/files/{*path}",
    tag = "sessions",
    params(
        ("id" = String, Path, description = "The session's id"),
        ("path" = String, Path, description = "Relative to the working directory"),
        ("If-None-Match" = Option<String>, Header, description = "Entity tags (or `*`) the caller holds: 304 when one is the file's (weak comparison)"),
        ("If-Match" = Option<String>, Header, description = "Entity tags (or `*`): 412 precondition_failed unless one is the file's (strong comparison)"),
        ("Range" = Option<String>, Header, description = "One byte range: `bytes=a-b`, `bytes=a-` or `bytes=-n` (206); several ranges are answered with the whole file (200)"),
        ("If-Range" = Option<String>, Header, description = "An entity tag: the range is answered only while it is the file's; otherwise the whole file (200)"),
    ),
    responses(
        (status = 200, description = "The file's bytes, never to be sniffed (`X-Content-Type-Options: nosniff`); HTML, SVG, JavaScript, XHTML and XML come as `Content-Disposition: attachment`", content_type = "application/octet-stream",
            headers(("ETag" = String, description = "`\"sha256:<hex>\"` of the bytes: a strong validator"), ("Accept-Ranges" = String, description = "`bytes`"))),
        (status = 206, description = "The one range asked for", content_type = "application/octet-stream",
            headers(("Content-Range" = String, description = "`bytes <first>-<last>/<size>`"), ("ETag" = String, description = "The file's entity tag"))),
        (status = 304, description = "Not modified: If-None-Match named the file's tag; no body",
            headers(("ETag" = String, description = "The file's entity tag"))),
        (status = 400, description = "environment_invalid: a bad path, or a directory; an If-Match or If-None-Match that is not a list of quoted entity tags", body = ErrorBody),
        (status = 404, description = "not_found", body = ErrorBody),
        (status = 412, description = "precondition_failed: If-Match names none of the file's tags (detail.etag is the current one)", body = ErrorBody),
        (status = 413, description = "file_too_large", body = ErrorBody),
        (status = 416, description = "range_not_satisfiable: the range starts at or past the end of the file", body = ErrorBody,
            headers(("Content-Range" = String, description = "`bytes */<size>`"))),
    ),
    security(("bearer" = []))
)]
async fn read_file(
    State(state): State<AppState>,
    caller: Caller,
    path: Result<Path<SessionFilePath>, axum::extract::rejection::PathRejection>,
    headers: axum::http::HeaderMap,
) -> Result<Response, ApiError> {
    let path = file_path(path)?;
    let session = active_session(&state, &caller.scope, &path.id).await?;
    let content = state
        .nodes
        .client(&session.node_address)?
        .read_file(node::ReadFileRequest {
            session_id: session.id.clone(),
            path: path.path.clone(),
        })
        .await?
        .into_inner()
        .content;
    record(
        &state,
        &caller.scope,
        &session,
        pb::TurnKind::ReadFile,
        &path.path,
        None,
    )
    .await?;
    let size = content.len() as u64;
    let etag = crate::conditional::content_etag(&content);
    let range = match crate::conditional::weigh_read(&headers, &etag, size) {
        Err(error) => {
            return Ok(crate::conditional::precondition_failed_response(
                error.into(),
            ));
        }
        Ok(ReadAnswer::NotModified) => return Ok(crate::conditional::not_modified(&etag)),
        Ok(ReadAnswer::Unsatisfiable) => return Ok(crate::conditional::unsatisfiable(size)),
        Ok(ReadAnswer::Full) => None,
        Ok(ReadAnswer::Partial(range)) => Some(range),
    };
    let body = match range {
        None => content,
        // Within the file: `weigh_read` bounds a range by its size, a usize here.
        Some(range) => content.slice(range.start as usize..=range.end as usize),
    };
    let mime = mime_guess::from_path(&path.path).first_or_octet_stream();
    let mut response = (
        [(header::CONTENT_TYPE, mime.essence_str().to_owned())],
        body,
    )
        .into_response();
    crate::conditional::mark_answer(&mut response, &etag, size, range);
    crate::downloads::mark(response.headers_mut(), &path.path);
    Ok(response)
}

/// Write a file of the session's working directory (parents made).
#[utoipa::path(
    put,
    operation_id = "write_session_file",
    path = "/v1/sessions/{id}/files/{*path}",
    tag = "sessions",
    params(("id" = String, Path, description = "The session's id"), ("path" = String, Path, description = "Relative to the working directory")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses(
        (status = 200, description = "Written: {path, size, version}"),
        (status = 400, description = "environment_invalid: a bad path, or a file in the way", body = ErrorBody),
        (status = 404, description = "not_found", body = ErrorBody),
        (status = 413, description = "file_too_large", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn write_file(
    State(state): State<AppState>,
    caller: Caller,
    path: Result<Path<SessionFilePath>, axum::extract::rejection::PathRejection>,
    body: Body,
) -> Result<Json<serde_json::Value>, ApiError> {
    let path = file_path(path)?;
    let session = active_session(&state, &caller.scope, &path.id).await?;
    let content = axum::body::to_bytes(body, MAX_SESSION_FILE_BYTES)
        .await
        .map_err(|_| {
            PlinthError::new(
                ErrorCode::FileTooLarge,
                format!("the file is larger than {MAX_SESSION_FILE_BYTES} bytes, or was not received whole"),
            )
            .with_detail(serde_json::json!({ "max_bytes": MAX_SESSION_FILE_BYTES }))
        })?;
    let bytes = content.len();
    let written = state
        .nodes
        .client(&session.node_address)?
        .write_file(state.nodes.carrying(
            node::WriteFileRequest {
                session_id: session.id.clone(),
                path: path.path.clone(),
                content,
            },
            bytes,
        ))
        .await?
        .into_inner();
    let turn = record(
        &state,
        &caller.scope,
        &session,
        pb::TurnKind::WriteFile,
        &path.path,
        None,
    )
    .await?;
    Ok(Json(serde_json::json!({
        "path": path.path,
        "size": written.size,
        "version": turn.version,
    })))
}

/// Delete a file or directory of the session's working directory.
#[utoipa::path(
    delete,
    path = "/v1/sessions/{id}/files/{*path}",
    tag = "sessions",
    params(("id" = String, Path, description = "The session's id"), ("path" = String, Path, description = "Relative to the working directory")),
    responses(
        (status = 200, description = "Deleted: {path, deleted, version}"),
        (status = 400, description = "environment_invalid: a bad path", body = ErrorBody),
        (status = 404, description = "not_found", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn delete_file(
    State(state): State<AppState>,
    caller: Caller,
    path: Result<Path<SessionFilePath>, axum::extract::rejection::PathRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let path = file_path(path)?;
    let session = active_session(&state, &caller.scope, &path.id).await?;
    state
        .nodes
        .client(&session.node_address)?
        .delete_file(node::DeleteFileRequest {
            session_id: session.id.clone(),
            path: path.path.clone(),
        })
        .await?;
    let turn = record(
        &state,
        &caller.scope,
        &session,
        pb::TurnKind::DeleteFile,
        &path.path,
        None,
    )
    .await?;
    Ok(Json(serde_json::json!({
        "path": path.path,
        "deleted": true,
        "version": turn.version,
    })))
}

/// `POST /v1/tasks`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTask {
    /// What the task is to do.
    pub input: String,
    /// `{harness_id}` and anything else the caller keeps with the task.
    #[serde(default)]
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
    /// The environment the task reads; overrides its harness's.
    #[serde(default)]
    pub environment: Option<String>,
}

/// A task and the session it runs in.
#[derive(Debug, Serialize, ToSchema)]
pub struct TaskBody {
    /// `task_` + 32 lowercase hex.
    pub id: String,
    /// Always `task`.
    pub object: &'static str,
    /// Its input.
    pub input: String,
    /// Its metadata as given.
    #[schema(value_type = Object)]
    pub metadata: serde_json::Value,
    /// The environment it reads.
    pub environment: SessionEnvironment,
    /// The version it reads.
    pub version: u32,
    /// Its session.
    pub session: SessionBody,
    /// Milliseconds since the Unix epoch.
    #[serde(rename = "createdAt")]
    pub created_at: i64,
}

/// Create a task: refused before anything starts unless its environment is ready.
#[utoipa::path(
    post,
    path = "/v1/tasks",
    tag = "tasks",
    request_body = CreateTask,
    responses(
        (status = 201, description = "Created, with its session", body = TaskBody),
        (status = 400, description = "environment_invalid: malformed body", body = ErrorBody),
        (status = 401, description = "unauthenticated", body = ErrorBody),
        (status = 404, description = "environment_not_found: no environment (the task's, or its harness's), or not there", body = ErrorBody),
        (status = 409, description = "environment_not_ready: nothing built yet", body = ErrorBody),
        (status = 429, description = "quota_exceeded: the task's session would pass the scope's active-sessions quota (detail: quota, limit, used). Also rate_limited, with Retry-After", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn create_task(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(body): JsonBody<CreateTask>,
) -> Result<(StatusCode, Json<TaskBody>), ApiError> {
    let metadata = body.metadata.unwrap_or_default();
    let harness_id = match metadata.get("harness_id") {
        None | Some(serde_json::Value::Null) => String::new(),
        Some(serde_json::Value::String(id)) => id.clone(),
        Some(_) => {
            return Err(PlinthError::invalid("metadata.harness_id: expected a string").into());
        }
    };
    let environment = match body.environment {
        Some(environment) => environment,
        None if !harness_id.is_empty() => {
            harness_environment(&state, &caller.scope, &harness_id).await?
        }
        None => {
            return Err(PlinthError::new(
                ErrorCode::EnvironmentNotFound,
                "the task names no environment, and no harness (metadata.harness_id) that does",
            )
            .into());
        }
    };
    let metadata = serde_json::Value::Object(metadata);
    let task = state
        .sessions()
        .create_task(pb::CreateTaskRequest {
            scope: caller.scope.clone(),
            input: body.input,
            environment_id: environment,
            harness_id,
            metadata_json: metadata.to_string(),
            limits: Some(state.session_limits.defaults().to_catalog()),
        })
        .await?
        .into_inner();
    let session = task
        .session
        .ok_or_else(|| PlinthError::new(ErrorCode::Internal, "the task has no session"))?;
    let session = start_session(&state, &caller.scope, session).await?;
    let session = shown(&state, session).await?;
    Ok((
        StatusCode::CREATED,
        Json(TaskBody {
            id: task.id,
            object: "task",
            input: task.input,
            metadata,
            environment: SessionEnvironment {
                id: session.environment.id.clone(),
                version: session.environment.version,
                mount: session.environment.mount.clone(),
            },
            version: session.environment.version,
            session,
            created_at: task.created_at_ms,
        }),
    ))
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
