//! Tool executions: `execute {descriptor: {kind: "tool", name}, input, deadline?}` runs one
//! workspace operation in the binding's Plinth session and answers its output in `result`.
//! A deadline that passes stops it with `timeout`, an explicit cancellation with `cancelled`;
//! either way what the tool left running is killed, and that cleanup's evidence is in the
//! failure's `details` (the stop cause stands even when the cleanup fails).

use std::sync::atomic::AtomicBool;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::catalog::v1 as pb;
use plinth_proto::node::v1 as node;
use serde_json::{Map, Value, json};

use super::Context;
use super::lifecycle;
use super::receipt::{self, Failure, Receipt, codes};
use crate::agents::tools::{self, Dialect};
use crate::http::error::ApiError;
use crate::runtime::live;

/// Bytes of each of stdout and stderr a command's result answers inline; the rest is paged
/// with `read_command_output`.
const INLINE_BYTES: u64 = 64 * 1024;

/// The variable that marks every process of one tool execution, so a stop can find and kill
/// them (they run as the session's user, in their own mount namespace).
const MARKER_VARIABLE: &str = "PLINTH_BRAIN_EXECUTION";

/// Why a tool stopped before it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Deadline,
    Cancelled,
}

/// Whether `request` is an execution of a tool that changes nothing (a read): run twice, it
/// answers what the workspace holds and leaves it as it was.
pub fn reads_only(request: &Value) -> bool {
    let descriptor = request.get("descriptor").and_then(Value::as_object);
    let kind = descriptor
        .and_then(|descriptor| descriptor.get("kind"))
        .and_then(Value::as_str)
        .unwrap_or("tool");
    kind == "tool"
        && descriptor
            .and_then(|descriptor| descriptor.get("name"))
            .and_then(Value::as_str)
            .and_then(|name| tools::named(Dialect::Brain, name))
            .is_some_and(|spec| !spec.mutates)
}

/// `execute`.
pub async fn execute(context: &Context, request: &Map<String, Value>) -> Receipt {
    execute_as(context, request, Allocate::Yes)
        .await
        .unwrap_or_else(|| {
            Receipt::failure(
                ErrorCode::Internal.as_str(),
                "the tool found no session and made none",
                true,
            )
        })
}

/// `execute` of a read ([`reads_only`]) run without a claim: `None`, with nothing run, when
/// its binding has no session (released at a turn's end), as making one is an effect that
/// must be claimed first.
pub async fn execute_read(context: &Context, request: &Map<String, Value>) -> Option<Receipt> {
    execute_as(context, request, Allocate::No).await
}

/// Whether a tool may make its binding a session when it has none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Allocate {
    Yes,
    No,
}

async fn execute_as(
    context: &Context,
    request: &Map<String, Value>,
    allocate: Allocate,
) -> Option<Receipt> {
    let descriptor = request.get("descriptor").and_then(Value::as_object);
    let kind = descriptor
        .and_then(|descriptor| descriptor.get("kind"))
        .and_then(Value::as_str)
        .unwrap_or("tool");
    if kind != "tool" {
        return Some(Receipt::unsupported(format!(
            "descriptor kind {kind:?} is not served here; this environment serves tools"
        )));
    }
    let Some(name) = descriptor
        .and_then(|descriptor| descriptor.get("name"))
        .and_then(Value::as_str)
    else {
        return Some(Receipt::invalid(
            "operation.request.descriptor.name: the tool to run",
        ));
    };
    let Some(spec) = tools::named(Dialect::Brain, name) else {
        return Some(Receipt::unsupported(format!(
            "tool {name:?} is not served here; the tools are {}",
            tools::names(Dialect::Brain).collect::<Vec<_>>().join(", ")
        )));
    };
    let input = match request.get("input") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(input)) => input.clone(),
        Some(_) => {
            return Some(Receipt::invalid(
                "operation.request.input: expected an object",
            ));
        }
    };
    let deadline = match request.get("deadline") {
        None | Some(Value::Null) => None,
        Some(deadline) => match deadline.as_u64() {
            Some(ms) => Some(ms),
            None => {
                return Some(Receipt::invalid(
                    "operation.request.deadline: milliseconds since the Unix epoch",
                ));
            }
        },
    };
    let remaining = deadline.map(|ms| {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |now| u64::try_from(now.as_millis()).unwrap_or(u64::MAX));
        Duration::from_millis(ms.saturating_sub(now))
    });
    if remaining == Some(Duration::ZERO) {
        return Some(stopped(Stop::Deadline, json!({ "started": false })));
    }
    let session = match session(context, allocate).await {
        Ok(Some(session)) => session,
        Ok(None) => return None,
        Err(receipt) => return Some(receipt),
    };
    let marker = format!("{}-{}", context.sequence, uuid::Uuid::new_v4().simple());
    let run = run(context, &session, spec.tool, &input, &marker);
    tokio::pin!(run);
    let limit = async {
        match remaining {
            Some(remaining) => tokio::time::sleep(remaining).await,
            None => std::future::pending().await,
        }
    };
    let stop = tokio::select! {
        outcome = &mut run => return Some(match outcome {
            Ok(output) => Receipt::Result { output },
            Err(failure) => failure.into(),
        }),
        () = limit => Stop::Deadline,
        () = context.cancel.cancelled() => Stop::Cancelled,
    };
    // The execution (`run`, let go of when this returns) stays open while its processes are
    // found and killed: let go of first, the node would kill them as its caller went away,
    // and the evidence would name none.
    let evidence = cleanup(context, &session, spec.tool, &marker).await;
    Some(stopped(stop, evidence))
}

fn stopped(stop: Stop, cleanup: Value) -> Receipt {
    let (code, message) = match stop {
        Stop::Deadline => (codes::TIMEOUT, "the tool's deadline expired"),
        Stop::Cancelled => (codes::CANCELLED, "the tool was cancelled"),
    };
    Failure {
        code: code.to_owned(),
        message: message.to_owned(),
        retryable: false,
        details: Some(json!({ "cleanup": cleanup })),
    }
    .into()
}

/// The binding's session, made when it has none (its first tool after a release). Lost
/// resources are a failure naming them, never a silent replacement. `None` when it has none
/// and `allocate` says not to make one.
async fn session(context: &Context, allocate: Allocate) -> Result<Option<pb::Session>, Receipt> {
    // A claimed execution's claim read its binding; a read asks.
    let binding = match context.take_claimed_binding() {
        Some(binding) => Some(binding),
        None => lifecycle::binding(context).await?,
    };
    let binding = match binding {
        Some(binding) => binding,
        None => {
            return Err(Receipt::failure(
                codes::NOT_ATTACHED,
                format!(
                    "Environment {:?} is not set up in this session",
                    context.binding.environment
                ),
                false,
            ));
        }
    };
    if binding.state() != pb::BindingState::Attached {
        return Err(Receipt::failure(
            codes::NOT_ATTACHED,
            format!(
                "Environment {:?} of this session is {}",
                context.binding.environment,
                binding.state().label()
            ),
            false,
        ));
    }
    if binding.plinth_session_id.is_empty() {
        if allocate == Allocate::No {
            return Ok(None);
        }
        return self::allocate(context, &binding).await.map(Some);
    }
    // The gateway's cache of live sessions, as every session call uses: a session ended
    // elsewhere is refused by its node, and that refusal is the loss named below.
    let found = live::active_session(
        &context.state.runtime,
        &context.adapter.scope,
        &binding.plinth_session_id,
    )
    .await;
    let session = match found {
        Ok(session) => pb::Session::clone(&session),
        Err(ApiError(error)) => {
            if error.code != ErrorCode::NotFound {
                return Err(receipt::from_error(&error).into());
            }
            return Err(lost(
                &binding.plinth_session_id,
                "",
                "the session no longer exists",
                false,
            )
            .into());
        }
    };
    if session.status() != pb::SessionStatus::Active {
        return Err(lost(
            &session.id,
            &session.node_id,
            "the session was ended outside this Brain session",
            false,
        )
        .into());
    }
    Ok(Some(session))
}

/// A session for a binding released at a turn's end; two tools racing here agree on one.
async fn allocate(context: &Context, binding: &pb::Binding) -> Result<pb::Session, Receipt> {
    let session = lifecycle::allocate(context, Some(binding.version))
        .await
        .map_err(Receipt::from)?;
    let swapped = context
        .state
        .brain()
        .swap_binding_session(pb::SwapBindingSessionRequest {
            key: Some(context.binding.clone()),
            expected: String::new(),
            replacement: session.id.clone(),
        })
        .await;
    // The catalog gives a session only to an attached binding.
    let swapped = match swapped {
        Ok(swapped) => swapped.into_inner(),
        Err(status) => {
            lifecycle::end(context, &session.id).await;
            return Err(match lifecycle::refused(&status) {
                lifecycle::Refused::Binding(_) => Receipt::failure(
                    codes::NOT_ATTACHED,
                    "the binding was released or detached while a session was being made for it",
                    true,
                ),
                other => other.into(),
            });
        }
    };
    if swapped.swapped {
        tracing::info!(session = %session.id, brain_session = %context.binding.session_id, "brain binding allocated a new session after a release");
        return Ok(session);
    }
    lifecycle::end(context, &session.id).await;
    let winner = swapped.binding.unwrap_or_default();
    if winner.plinth_session_id.is_empty() {
        return Err(Receipt::failure(
            codes::NOT_ATTACHED,
            "the binding was released or detached while a session was being made for it",
            true,
        ));
    }
    context
        .state
        .sessions()
        .get_session(pb::GetSessionRequest {
            scope: context.adapter.scope.clone(),
            id: winner.plinth_session_id,
        })
        .await
        .map(tonic::Response::into_inner)
        .map_err(|status| receipt::from_error(&PlinthError::from_status(&status)).into())
}

/// `resource_lost`, naming the resource and its node by id (never its internal address).
fn lost(session: &str, node: &str, why: &str, retryable: bool) -> Failure {
    Failure {
        code: codes::RESOURCE_LOST.to_owned(),
        message: format!("session {session}: {why}; it is not replaced"),
        retryable,
        details: Some(json!({ "resource": session, "node": node, "reason": why })),
    }
}

/// A node's error as the tool's failure: an unreachable node or a working directory the
/// node no longer holds is the loss of the session's resources; anything else (a bad path,
/// a missing file) is the tool's own failure.
fn node_failure(session: &pb::Session, status: &tonic::Status) -> Failure {
    let error = PlinthError::from_status(status);
    match error.code {
        ErrorCode::Unavailable => lost(
            &session.id,
            &session.node_id,
            "its node does not answer",
            true,
        ),
        ErrorCode::NotFound if error.is_session_lost() => lost(
            &session.id,
            &session.node_id,
            "its node no longer has its working directory",
            false,
        ),
        _ => receipt::from_error(&error),
    }
}

/// Runs one tool in the session; answers its output, and records it as a turn.
async fn run(
    context: &Context,
    session: &pb::Session,
    tool: tools::Tool,
    input: &Map<String, Value>,
    marker: &str,
) -> Result<Value, Failure> {
    let options = tools::Options {
        // A stopped execution's processes are found by this variable.
        env: vec![(MARKER_VARIABLE.to_owned(), marker.to_owned())],
        inline_bytes: INLINE_BYTES,
        keep_bytes: 0,
        ..tools::Options::new(Dialect::Brain)
    };
    let request = tools::Request::parse(
        tool,
        &tools::Args::new(input, Dialect::Brain.arguments()),
        &options,
    )
    .map_err(|tools::Invalid(message)| Failure {
        code: codes::INVALID_REQUEST.to_owned(),
        message,
        retryable: false,
        details: None,
    })?;
    let target = tools::Target {
        nodes: &context.state.runtime.nodes,
        session,
        dispatched: &AtomicBool::new(false),
    };
    let done = tools::run(&target, request, &options)
        .await
        .map_err(|failed| match failed {
            tools::Failed::Unreachable(error) => {
                // The transport's error names the node's internal address: it stays in the log.
                tracing::warn!(session = %session.id, node = %session.node_id, error = %error.0.message, "a brain tool's node cannot be reached");
                lost(&session.id, &session.node_id, "its node cannot be reached", true)
            }
            tools::Failed::Node(status) => node_failure(session, &status),
            tools::Failed::Answer(error) => receipt::from_error(&error),
        })?;
    // The turn is recorded with the operation's receipt, in the same catalog write.
    let turn = &done.turn;
    context.record_with_receipt(session, turn.kind, &turn.detail, turn.exit_code);
    Ok(done.body)
}

/// Kills what a stopped tool left running. Answers the evidence.
async fn cleanup(
    context: &Context,
    session: &pb::Session,
    tool: tools::Tool,
    marker: &str,
) -> Value {
    if tool != tools::Tool::RunCommand {
        return json!({ "started": true, "processes": "none: the tool runs no command" });
    }
    // Every process of the execution carries the marker in its environment; they run as the
    // session's own user, so a command of the same session may read and signal them.
    let script = format!(
        "for p in /proc/[0-9]*; do \
           if grep -qzx '{MARKER_VARIABLE}={marker}' \"$p/environ\" 2>/dev/null; then \
             kill -KILL \"${{p#/proc/}}\" 2>/dev/null && echo \"${{p#/proc/}}\"; \
           fi; \
         done; true"
    );
    let killed = async {
        let mut client = context
            .state
            .runtime
            .nodes
            .client(&session.node_address)
            .map_err(|error| error.0.message)?;
        let mut events = client
            .exec(node::ExecRequest {
                session: Some(live::spec(session)),
                command: script,
                cwd: String::new(),
                env: Default::default(),
                timeout_ms: 10_000,
                output_limit_bytes: 64 * 1024,
                stdin: Default::default(),
            })
            .await
            .map_err(|status| PlinthError::from_status(&status).message)?
            .into_inner();
        let mut stdout = Vec::new();
        let mut exit = None;
        while let Some(event) = events.next().await {
            match event
                .map_err(|status| PlinthError::from_status(&status).message)?
                .event
            {
                Some(node::exec_event::Event::Stdout(bytes)) => stdout.extend_from_slice(&bytes),
                Some(node::exec_event::Event::Result(ended)) => exit = Some(ended.exit_code),
                _ => {}
            }
        }
        let pids: Vec<u64> = String::from_utf8_lossy(&stdout)
            .split_whitespace()
            .filter_map(|pid| pid.parse().ok())
            .collect();
        Ok::<_, String>((pids, exit))
    };
    match tokio::time::timeout(Duration::from_secs(15), killed).await {
        Ok(Ok((pids, Some(0)))) => json!({ "started": true, "killed_processes": pids }),
        Ok(Ok((pids, exit))) => json!({
            "started": true,
            "killed_processes": pids,
            "error": format!("the cleanup command ended with {exit:?}"),
        }),
        Ok(Err(error)) => json!({ "started": true, "error": error }),
        Err(_) => json!({ "started": true, "error": "the cleanup did not end within 15 s" }),
    }
}
