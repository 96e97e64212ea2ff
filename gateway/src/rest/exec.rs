//! Commands in a session (UHP §6): `POST /v1/sessions/{id}/exec` runs one on the session's
//! node, answered whole or streamed as lines, and records it as a turn with the version it read.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
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

use crate::http::auth::Caller;
use crate::http::auth::Tokens;
use crate::http::error::{ApiError, ErrorBody};
use crate::runtime::Runtime;
use crate::runtime::live::{active_session, finish_turn, record, settle, spec};
use axum::extract::FromRef;

/// The routes.
pub fn routes<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    Runtime: FromRef<S>,
    Arc<Tokens>: FromRef<S>,
{
    OpenApiRouter::new()
        .routes(routes!(exec, crate::rest::terminal::open_terminal))
        .routes(routes!(crate::rest::terminal::issue_ticket))
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
    #[serde(default, deserialize_with = "crate::http::query::flag")]
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
        crate::rest::terminal::TerminalQuery,
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
    State(state): State<Runtime>,
    caller: Result<Caller, ApiError>,
    Path(id): Path<String>,
    query: Result<Query<ExecQuery>, axum::extract::rejection::QueryRejection>,
    terminal: Result<
        Query<crate::rest::terminal::TerminalQuery>,
        axum::extract::rejection::QueryRejection,
    >,
    request: axum::extract::Request,
) -> Result<Response, ApiError> {
    // Who calls is settled first (401 before anything else), unless a terminal ticket says.
    let ticketed = matches!(&terminal, Ok(Query(terminal)) if terminal.ticket.is_some());
    let caller = if ticketed { caller } else { Ok(caller?) };
    let Query(query) = query.map_err(|error| PlinthError::invalid(format!("query: {error}")))?;
    let Query(terminal) =
        terminal.map_err(|error| PlinthError::invalid(format!("query: {error}")))?;
    let key = crate::rest::idempotency::key_of(request.headers())?;
    if terminal.pty.unwrap_or(false) {
        if key.is_some() {
            return Err(crate::rest::idempotency::refused_for("a terminal"));
        }
        return crate::rest::terminal::open_with(state, caller, id, terminal, request).await;
    }
    terminal.refuse_without_pty()?;
    let caller = caller?;
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
        return Err(crate::rest::idempotency::refused_for("a streamed exec"));
    }
    crate::http::json::declared_json(request.headers())?;
    let bytes = crate::http::json::read(request.into_body()).await?;
    let body: ExecBody = crate::http::json::parse(&bytes)?;
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
                Ok(result) => crate::rest::idempotency::Ran::started(Json(result).into_response()),
                Err(Failed {
                    error,
                    started: false,
                }) => crate::rest::idempotency::Ran::before(error),
                Err(Failed {
                    error,
                    started: true,
                }) => crate::rest::idempotency::Ran::started(error.into_response()),
            }
        }
    };
    crate::rest::idempotency::once(&state.services, key, &bytes, wait, work).await
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
    state: &Runtime,
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
    state: Runtime,
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
    state: Runtime,
    scope: String,
    pending: Option<PendingTurn>,
    turn: Option<pb::Turn>,
}

impl Recording {
    fn start(state: &Runtime, scope: &str, session: &Arc<pb::Session>, detail: &str) -> Self {
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
    state: Runtime,
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
    state: Runtime,
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
    state: Runtime,
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
