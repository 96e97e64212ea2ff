//! Tool executions: `execute {descriptor: {kind: "tool", name}, input, deadline?}` runs one
//! workspace operation in the binding's Plinth session and answers its output in `result`.
//! A deadline that passes stops it with `timeout`, an explicit cancellation with `cancelled`;
//! either way what the tool left running is killed, and that cleanup's evidence is in the
//! failure's `details` (the stop cause stands even when the cleanup fails).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::catalog::v1 as pb;
use plinth_proto::node::v1 as node;
use serde_json::{Map, Value, json};

use super::Context;
use super::lifecycle;
use super::receipt::{self, Failure, Receipt, codes};
use crate::runtime;

/// The tools served, by name.
pub const TOOLS: [&str; 11] = [
    "run_command",
    "read_command_output",
    "read_file",
    "write_file",
    "delete_file",
    "list_files",
    "search_files",
    "find_files",
    "edit_file",
    "apply_patch",
    "restore",
];

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

/// `execute`.
pub async fn execute(context: &Context, request: &Map<String, Value>) -> Receipt {
    let descriptor = request.get("descriptor").and_then(Value::as_object);
    let kind = descriptor
        .and_then(|descriptor| descriptor.get("kind"))
        .and_then(Value::as_str)
        .unwrap_or("tool");
    if kind != "tool" {
        return Receipt::unsupported(format!(
            "descriptor kind {kind:?} is not served here; this environment serves tools"
        ));
    }
    let Some(name) = descriptor
        .and_then(|descriptor| descriptor.get("name"))
        .and_then(Value::as_str)
    else {
        return Receipt::invalid("operation.request.descriptor.name: the tool to run");
    };
    if !TOOLS.contains(&name) {
        return Receipt::unsupported(format!(
            "tool {name:?} is not served here; the tools are {}",
            TOOLS.join(", ")
        ));
    }
    let input = match request.get("input") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(input)) => input.clone(),
        Some(_) => return Receipt::invalid("operation.request.input: expected an object"),
    };
    let deadline = match request.get("deadline") {
        None | Some(Value::Null) => None,
        Some(deadline) => match deadline.as_u64() {
            Some(ms) => Some(ms),
            None => {
                return Receipt::invalid(
                    "operation.request.deadline: milliseconds since the Unix epoch",
                );
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
        return stopped(Stop::Deadline, json!({ "started": false }));
    }
    let session = match session(context).await {
        Ok(session) => session,
        Err(receipt) => return receipt,
    };
    let marker = format!("{}-{}", context.sequence, uuid::Uuid::new_v4().simple());
    let run = run(context, &session, name, &input, &marker);
    let limit = async {
        match remaining {
            Some(remaining) => tokio::time::sleep(remaining).await,
            None => std::future::pending().await,
        }
    };
    let stop = tokio::select! {
        outcome = run => return match outcome {
            Ok(output) => Receipt::Result { output },
            Err(failure) => failure.into(),
        },
        () = limit => Stop::Deadline,
        () = context.cancel.cancelled() => Stop::Cancelled,
    };
    let evidence = cleanup(context, &session, name, &marker).await;
    stopped(stop, evidence)
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
/// resources are a failure naming them, never a silent replacement.
async fn session(context: &Context) -> Result<pb::Session, Receipt> {
    let binding = match lifecycle::binding(context).await? {
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
        return allocate(context, &binding).await;
    }
    let found = context
        .state
        .sessions()
        .get_session(pb::GetSessionRequest {
            scope: context.adapter.scope.clone(),
            id: binding.plinth_session_id.clone(),
        })
        .await;
    let session = match found {
        Ok(session) => session.into_inner(),
        Err(status) => {
            let error = PlinthError::from_status(&status);
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
    if session.status != "active" {
        return Err(lost(
            &session.id,
            &session.node_address,
            "the session was ended outside this Brain session",
            false,
        )
        .into());
    }
    Ok(session)
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

/// `resource_lost`, naming the resource.
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
            &session.node_address,
            "its node does not answer",
            true,
        ),
        ErrorCode::NotFound if error.message.contains("is not on this node") => lost(
            &session.id,
            &session.node_address,
            "its node no longer has its working directory",
            false,
        ),
        _ => receipt::from_error(&error),
    }
}

/// Runs one tool; answers its output.
async fn run(
    context: &Context,
    session: &pb::Session,
    name: &str,
    input: &Map<String, Value>,
    marker: &str,
) -> Result<Value, Failure> {
    let mut workspace = context
        .state
        .nodes
        .workspace(&session.node_address)
        .map_err(|error| lost(&session.id, &session.node_address, &error.0.message, true))?;
    let id = session.id.clone();
    let failed = |status: tonic::Status| node_failure(session, &status);
    match name {
        "run_command" => {
            let command = string(input, "command")?;
            if command.trim().is_empty() {
                return Err(invalid("input.command: must not be empty"));
            }
            let mut env = string_map(input, "env")?;
            env.insert("UV_NO_SYNC".to_owned(), "1".to_owned());
            env.insert(MARKER_VARIABLE.to_owned(), marker.to_owned());
            let ran = workspace
                .run_command(node::RunCommandRequest {
                    session: Some(runtime::spec(session)),
                    command: command.clone(),
                    cwd: optional_string(input, "cwd")?.unwrap_or_default(),
                    env,
                    timeout_ms: number(input, "timeout_ms")?.unwrap_or(0),
                    inline_bytes: INLINE_BYTES,
                    keep_bytes: 0,
                })
                .await
                .map_err(failed)?
                .into_inner();
            record(context, session, "exec", &command, Some(ran.exit_code)).await;
            let mut output = json!({
                "command": command,
                "cwd": ran.cwd,
                "exit_code": ran.exit_code,
                "stdout": String::from_utf8_lossy(&ran.stdout),
                "stderr": String::from_utf8_lossy(&ran.stderr),
                "stdout_truncated": ran.stdout_truncated,
                "stderr_truncated": ran.stderr_truncated,
                "stdout_lines_truncated": ran.stdout_lines_truncated,
                "stderr_lines_truncated": ran.stderr_lines_truncated,
                "duration_ms": ran.duration_ms,
                "timed_out": ran.timed_out,
                "version": session.version,
            });
            if !ran.signal.is_empty() {
                output["signal"] = json!(ran.signal);
            }
            if !ran.output_id.is_empty() {
                output["output_file_path"] = json!(ran.output_id);
                output["output_truncated"] = json!(ran.output_truncated);
            }
            Ok(output)
        }
        "read_command_output" => {
            let output_id = string(input, "path")?;
            let read = workspace
                .read_output(node::ReadOutputRequest {
                    session_id: id,
                    output_id: output_id.clone(),
                    start_line: number(input, "start_line")?.unwrap_or(0),
                    end_line: number(input, "end_line")?.unwrap_or(0),
                    max_bytes: number(input, "max_bytes")?.unwrap_or(0),
                })
                .await
                .map_err(failed)?
                .into_inner();
            record(context, session, "read_output", &output_id, None).await;
            let mut output = read_output(read);
            output["path"] = json!(output_id);
            output["encoding"] = json!("utf8");
            Ok(output)
        }
        "read_file" => {
            let path = string(input, "path")?;
            let read = workspace
                .read(node::ReadRequest {
                    session_id: id,
                    path: path.clone(),
                    start_line: number(input, "start_line")?.unwrap_or(0),
                    end_line: number(input, "end_line")?.unwrap_or(0),
                    max_bytes: number(input, "max_bytes")?.unwrap_or(0),
                    lines_threshold: number(input, "lines_threshold")?.unwrap_or(0),
                })
                .await
                .map_err(failed)?
                .into_inner();
            record(context, session, "read_file", &path, None).await;
            Ok(read_output(read))
        }
        "write_file" => {
            let path = string(input, "path")?;
            let contents = string(input, "contents")?;
            let written = workspace
                .write(node::WriteRequest {
                    session_id: id,
                    path: path.clone(),
                    content: contents.into_bytes().into(),
                })
                .await
                .map_err(failed)?
                .into_inner();
            record(context, session, "write_file", &written.path, None).await;
            Ok(json!({
                "path": written.path,
                "bytes_written": written.bytes_written,
                "created": written.created,
                "rollback_token": written.rollback_token,
            }))
        }
        "delete_file" => {
            let path = string(input, "path")?;
            let mut client =
                context
                    .state
                    .nodes
                    .client(&session.node_address)
                    .map_err(|error| {
                        lost(&session.id, &session.node_address, &error.0.message, true)
                    })?;
            client
                .delete_file(node::DeleteFileRequest {
                    session_id: id,
                    path: path.clone(),
                })
                .await
                .map_err(failed)?;
            record(context, session, "delete_file", &path, None).await;
            Ok(json!({ "path": path, "deleted": true }))
        }
        "list_files" => {
            let path = optional_string(input, "path")?.unwrap_or_default();
            let listed = workspace
                .list(node::ListRequest {
                    session_id: id,
                    path: path.clone(),
                    recursive: flag(input, "recursive")?,
                    include_hidden: flag(input, "include_hidden")?,
                    max_entries: number(input, "max_entries")?.unwrap_or(0),
                })
                .await
                .map_err(failed)?
                .into_inner();
            record(context, session, "list_files", &listed.root, None).await;
            Ok(json!({
                "root": listed.root,
                "entries": listed.entries.into_iter().map(|entry| {
                    let mut out = json!({ "path": entry.path, "type": entry.kind });
                    if let Some(size) = entry.size {
                        out["bytes"] = json!(size);
                    }
                    out
                }).collect::<Vec<_>>(),
                "truncated": listed.truncated,
            }))
        }
        "search_files" => {
            let pattern = string(input, "pattern")?;
            let path = optional_string(input, "path")?.unwrap_or_default();
            let found = workspace
                .search(node::SearchRequest {
                    session_id: id,
                    pattern,
                    path: path.clone(),
                    glob: optional_string(input, "glob")?.unwrap_or_default(),
                    literal: flag(input, "literal")?,
                    ignore_case: flag(input, "ignore_case")?,
                    context: u32::try_from(number(input, "context")?.unwrap_or(0))
                        .map_err(|_| invalid("input.context: a number of lines"))?,
                    limit_per_file: number(input, "limit")?.unwrap_or(0),
                    max_results: number(input, "max_results")?.unwrap_or(0),
                    max_bytes_per_line: number(input, "max_bytes_per_match")?.unwrap_or(0),
                })
                .await
                .map_err(failed)?
                .into_inner();
            record(
                context,
                session,
                "search_files",
                if path.is_empty() { "." } else { &path },
                None,
            )
            .await;
            Ok(json!({
                "matches": found.matches.into_iter().map(|found| {
                    let mut out = json!({ "path": found.path, "line": found.line, "preview": found.text });
                    if !found.before.is_empty() {
                        out["before"] = json!(found.before);
                    }
                    if !found.after.is_empty() {
                        out["after"] = json!(found.after);
                    }
                    out
                }).collect::<Vec<_>>(),
                "truncated": found.truncated,
                "files_searched": found.files_searched,
            }))
        }
        "find_files" => {
            let pattern = string(input, "pattern")?;
            let path = optional_string(input, "path")?.unwrap_or_default();
            let found = workspace
                .find(node::FindRequest {
                    session_id: id,
                    pattern: pattern.clone(),
                    path: path.clone(),
                    max_entries: number(input, "max_entries")?.unwrap_or(0),
                })
                .await
                .map_err(failed)?
                .into_inner();
            record(context, session, "find_files", &pattern, None).await;
            Ok(json!({
                "pattern": pattern,
                "entries": found.entries.into_iter().map(|entry| {
                    let mut out = json!({ "path": entry.path, "mtimeMs": entry.mtime_ms });
                    if let Some(size) = entry.size {
                        out["bytes"] = json!(size);
                    }
                    out
                }).collect::<Vec<_>>(),
                "truncated": found.truncated,
            }))
        }
        "edit_file" => {
            let path = string(input, "path")?;
            let operation = match string(input, "operation")?.as_str() {
                "create" => node::EditOperation::Create,
                "replace" => node::EditOperation::Replace,
                "insert_after" => node::EditOperation::InsertAfter,
                "insert_before" => node::EditOperation::InsertBefore,
                "append" => node::EditOperation::Append,
                other => {
                    return Err(invalid(format!(
                        "input.operation: create, replace, insert_after, insert_before or append, not {other:?}"
                    )));
                }
            };
            let dry_run = flag(input, "dry_run")?;
            let edited = workspace
                .edit(node::EditRequest {
                    session_id: id,
                    path: path.clone(),
                    operation: operation.into(),
                    contents: optional_string(input, "contents")?,
                    find: optional_string(input, "find")?,
                    replace_all: flag(input, "replace_all")?,
                    dry_run,
                })
                .await
                .map_err(failed)?
                .into_inner();
            record(context, session, "edit_file", &edited.path, None).await;
            let mut output = json!({
                "path": edited.path,
                "dry_run": dry_run,
                "bytes_written": edited.bytes_written,
                "created": edited.created,
            });
            if !edited.rollback_token.is_empty() {
                output["rollback_token"] = json!(edited.rollback_token);
            }
            if !edited.warnings.is_empty() {
                output["warnings"] = json!(edited.warnings);
            }
            Ok(output)
        }
        "apply_patch" => {
            let Some(operations) = input.get("operations").and_then(Value::as_array) else {
                return Err(invalid("input.operations: an array of {type, path, diff?}"));
            };
            let mut asked = Vec::with_capacity(operations.len());
            for (index, operation) in operations.iter().enumerate() {
                let Some(operation) = operation.as_object() else {
                    return Err(invalid(format!("input.operations[{index}]: an object")));
                };
                asked.push(node::PatchOperation {
                    kind: string(operation, "type")?,
                    path: string(operation, "path")?,
                    diff: optional_string(operation, "diff")?.unwrap_or_default(),
                });
            }
            let dry_run = flag(input, "dry_run")?;
            let patched = workspace
                .apply_patch(node::ApplyPatchRequest {
                    session_id: id,
                    operations: asked,
                    dry_run,
                })
                .await
                .map_err(failed)?
                .into_inner();
            let paths: Vec<&str> = patched
                .operations
                .iter()
                .map(|operation| operation.path.as_str())
                .collect();
            record(context, session, "apply_patch", &paths.join(" "), None).await;
            let mut output = json!({
                "applied": patched.applied,
                "dry_run": dry_run,
                "operations": patched.operations.into_iter().map(|operation| {
                    let mut out = json!({ "type": operation.kind, "path": operation.path, "status": operation.status });
                    if !operation.error.is_empty() {
                        out["error"] = json!(operation.error);
                    }
                    out
                }).collect::<Vec<_>>(),
            });
            if !patched.rollback_token.is_empty() {
                output["rollback_token"] = json!(patched.rollback_token);
            }
            if !patched.warnings.is_empty() {
                output["warnings"] = json!(patched.warnings);
            }
            Ok(output)
        }
        "restore" => {
            let token = string(input, "token")?;
            let restored = workspace
                .restore(node::RestoreRequest {
                    session_id: id,
                    token,
                })
                .await
                .map_err(failed)?
                .into_inner();
            record(context, session, "restore", &restored.paths.join(" "), None).await;
            Ok(json!({ "paths": restored.paths }))
        }
        other => Err(Failure {
            code: codes::UNSUPPORTED.to_owned(),
            message: format!("tool {other:?} is not served here"),
            retryable: false,
            details: None,
        }),
    }
}

/// A read's answer in Novo's `readFile` shape: text as UTF-8, anything else as base64.
fn read_output(read: node::ReadResponse) -> Value {
    let mut output = if read.binary {
        json!({ "path": read.path, "content": base64(&read.content), "encoding": "base64" })
    } else {
        json!({
            "path": read.path,
            "content": String::from_utf8_lossy(&read.content),
            "encoding": "utf8",
            "start_line": read.start_line,
            "end_line": read.end_line,
            "total_lines": read.total_lines,
        })
    };
    output["bytes"] = json!(read.size);
    output["truncated"] = json!(read.truncated);
    output["mtimeMs"] = json!(read.mtime_ms);
    if read.total_lines_partial {
        output["total_lines_partial"] = json!(true);
    }
    output
}

fn invalid(message: impl Into<String>) -> Failure {
    Failure {
        code: codes::INVALID_REQUEST.to_owned(),
        message: message.into(),
        retryable: false,
        details: None,
    }
}

fn string(input: &Map<String, Value>, field: &str) -> Result<String, Failure> {
    input
        .get(field)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| invalid(format!("input.{field}: expected a string")))
}

fn optional_string(input: &Map<String, Value>, field: &str) -> Result<Option<String>, Failure> {
    match input.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(_) => Err(invalid(format!("input.{field}: expected a string"))),
    }
}

fn number(input: &Map<String, Value>, field: &str) -> Result<Option<u64>, Failure> {
    match input.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_u64()
            .map(Some)
            .ok_or_else(|| invalid(format!("input.{field}: expected a whole number"))),
    }
}

fn flag(input: &Map<String, Value>, field: &str) -> Result<bool, Failure> {
    match input.get(field) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(value)) => Ok(*value),
        Some(_) => Err(invalid(format!("input.{field}: true or false"))),
    }
}

fn string_map(
    input: &Map<String, Value>,
    field: &str,
) -> Result<std::collections::HashMap<String, String>, Failure> {
    let mut map = std::collections::HashMap::new();
    match input.get(field) {
        None | Some(Value::Null) => {}
        Some(Value::Object(given)) => {
            for (key, value) in given {
                let Some(value) = value.as_str() else {
                    return Err(invalid(format!("input.{field}.{key}: expected a string")));
                };
                map.insert(key.clone(), value.to_owned());
            }
        }
        Some(_) => return Err(invalid(format!("input.{field}: an object of strings"))),
    }
    Ok(map)
}

/// Records the tool's turn with the operation's receipt (`Context::record_with_receipt`:
/// one catalog write for both, when the receipt is stored).
async fn record(
    context: &Context,
    session: &pb::Session,
    kind: &str,
    detail: &str,
    exit_code: Option<i32>,
) {
    context.record_with_receipt(session, kind, detail, exit_code);
}

/// Kills what a stopped tool left running. Answers the evidence.
async fn cleanup(context: &Context, session: &pb::Session, name: &str, marker: &str) -> Value {
    if name != "run_command" {
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
            .nodes
            .client(&session.node_address)
            .map_err(|error| error.0.message)?;
        let mut events = client
            .exec(node::ExecRequest {
                session: Some(runtime::spec(session)),
                command: script,
                cwd: String::new(),
                env: Default::default(),
                timeout_ms: 10_000,
                output_limit_bytes: 64 * 1024,
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

/// Standard base64 with padding, for file contents that are not UTF-8.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(&[0xff, 0xfe, 0x00, 0x01]), "//4AAQ==");
    }
}
