//! Running a checked [`Request`] in a session on its node, and its answer in the tool's
//! result shape.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use base64::Engine as _;
use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::catalog::v1 as pb;
use plinth_proto::node::v1 as node;
use serde_json::{Value, json};

use super::{Dialect, NOT_ARTIFACTS, Request};
use crate::http::error::ApiError;
use crate::runtime::live;
use crate::runtime::nodes::NodeClients;

/// Bytes of each of a command's stdout and stderr kept for `readCommandOutput` by default.
const KEEP_OUTPUT_BYTES: u64 = 16 * 1024 * 1024;

/// How an adapter runs its tools.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub dialect: Dialect,
    /// Bytes of each of a command's stdout and stderr answered inline.
    pub inline_bytes: u64,
    /// Bytes of each kept beside the session for reading later (0: none).
    pub keep_bytes: u64,
    /// Variables every command gets besides its own (the adapter's markers).
    pub env: Vec<(String, String)>,
}

impl Options {
    /// 64 KiB inline, 16 MiB kept, nothing added.
    pub(crate) fn new(dialect: Dialect) -> Self {
        Options {
            dialect,
            inline_bytes: 64 * 1024,
            keep_bytes: KEEP_OUTPUT_BYTES,
            env: Vec::new(),
        }
    }
}

/// Where a call runs.
/// The time limit of a command that names none, for its call's deadline: the largest a node
/// may be configured to allow (`node.exec_max_timeout_seconds`' default); the node applies its
/// own default, which is shorter.
const COMMAND_LIMIT_UNNAMED: Duration = Duration::from_secs(3600);

pub(crate) struct Target<'a> {
    pub nodes: &'a NodeClients,
    pub session: &'a pb::Session,
    /// Set once a request is sent to the node: from then on the call may have run.
    pub dispatched: &'a AtomicBool,
}

/// A tool's answer, and the turn it is recorded as.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Done {
    pub body: Value,
    pub turn: Turn,
}

/// A turn as the session's history shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Turn {
    pub kind: pb::TurnKind,
    pub detail: String,
    pub exit_code: Option<i32>,
}

/// Why a tool did not answer.
#[derive(Debug)]
pub(crate) enum Failed {
    /// The session's node could not be reached; nothing was sent.
    Unreachable(ApiError),
    /// The node answered with an error (a bad path, a missing file, a session it does not
    /// hold, or it stopped answering mid-call).
    Node(tonic::Status),
    /// The node's answer carried a value this gateway does not know (a newer node).
    Answer(PlinthError),
}

impl From<plinth_proto::UnknownValue> for Failed {
    fn from(unknown: plinth_proto::UnknownValue) -> Self {
        Failed::Answer(PlinthError::new(
            ErrorCode::Internal,
            format!("the node answered a value this gateway does not know: {unknown}"),
        ))
    }
}

impl From<tonic::Status> for Failed {
    fn from(status: tonic::Status) -> Self {
        Failed::Node(status)
    }
}

impl Target<'_> {
    fn workspace(&self) -> Result<crate::runtime::nodes::WorkspaceClient, Failed> {
        let client = self
            .nodes
            .workspace(&self.session.node_address)
            .map_err(Failed::Unreachable)?;
        self.dispatched.store(true, Ordering::SeqCst);
        Ok(client)
    }

    fn id(&self) -> String {
        self.session.id.clone()
    }
}

fn turn(kind: pb::TurnKind, detail: impl Into<String>) -> Turn {
    Turn {
        kind,
        detail: detail.into(),
        exit_code: None,
    }
}

/// Runs `request` in `target`'s session.
pub(crate) async fn run(
    target: &Target<'_>,
    request: Request,
    options: &Options,
) -> Result<Done, Failed> {
    let session_id = target.id();
    let (body, turn) = match request {
        Request::ReadFile(mut read) => {
            read.session_id = session_id;
            let path = read.path.clone();
            let answer = target.workspace()?.read(read).await?.into_inner();
            (read_body(answer), turn(pb::TurnKind::ReadFile, path))
        }
        Request::ListFiles(mut list) => {
            list.session_id = session_id;
            let path = list.path.clone();
            let listed = target.workspace()?.list(list).await?.into_inner();
            let entries = listed
                .entries
                .into_iter()
                .map(|entry| {
                    let kind = node::EntryKind::from_wire(entry.kind)?;
                    let mut value = json!({ "path": entry.path, "type": kind.label() });
                    if let Some(size) = entry.size {
                        value["bytes"] = json!(size);
                    }
                    Ok(value)
                })
                .collect::<Result<Vec<_>, plinth_proto::UnknownValue>>()?;
            (
                json!({ "root": listed.root, "entries": entries, "truncated": listed.truncated }),
                turn(pb::TurnKind::ListFiles, path),
            )
        }
        Request::SearchFiles(mut search) => {
            search.session_id = session_id;
            let pattern = search.pattern.clone();
            let with_context = search.context > 0;
            let found = target.workspace()?.search(search).await?.into_inner();
            let matches: Vec<Value> = found
                .matches
                .into_iter()
                .map(|found| {
                    let mut value =
                        json!({ "path": found.path, "line": found.line, "preview": found.text });
                    if with_context {
                        value["before"] = json!(found.before);
                        value["after"] = json!(found.after);
                    }
                    value
                })
                .collect();
            (
                json!({ "matches": matches, "truncated": found.truncated, "files_searched": found.files_searched }),
                turn(pb::TurnKind::SearchFiles, pattern),
            )
        }
        Request::FindFiles(mut find) => {
            find.session_id = session_id;
            let pattern = find.pattern.clone();
            let found = target.workspace()?.find(find).await?.into_inner();
            let entries: Vec<Value> = found
                .entries
                .into_iter()
                .map(|entry| json!({ "path": entry.path, "bytes": entry.size.unwrap_or(0), "mtimeMs": entry.mtime_ms }))
                .collect();
            (
                json!({ "pattern": pattern, "entries": entries, "truncated": found.truncated }),
                turn(pb::TurnKind::FindFiles, pattern),
            )
        }
        Request::EditFile(mut edit) => {
            edit.session_id = session_id;
            let (path, dry_run) = (edit.path.clone(), edit.dry_run);
            let edited = target.workspace()?.edit(edit).await?.into_inner();
            let mut body = json!({ "path": edited.path, "dry_run": dry_run, "bytes_written": edited.bytes_written });
            if edited.created {
                body["created"] = json!(true);
            }
            changed(&mut body, edited.rollback_token, edited.warnings);
            (body, turn(pb::TurnKind::EditFile, path))
        }
        Request::ApplyPatch { mut patch, asked } => {
            patch.session_id = session_id;
            let dry_run = patch.dry_run;
            let paths = patch
                .operations
                .iter()
                .map(|operation| operation.path.as_str())
                .collect::<Vec<_>>()
                .join(" ");
            let patched = target.workspace()?.apply_patch(patch).await?.into_inner();
            let operations = patch_results(&asked, patched.operations)?;
            let mut body =
                json!({ "applied": patched.applied, "dry_run": dry_run, "operations": operations });
            changed(&mut body, patched.rollback_token, patched.warnings);
            (body, turn(pb::TurnKind::ApplyPatch, paths))
        }
        Request::RunCommand(mut command) => {
            command.session = Some(live::spec(target.session));
            let text = command.command.clone();
            // Unary, but it answers only when the command ends: its deadline is the
            // command's own time limit (the longest a node allows when it names none) and
            // the unary deadline on top.
            let limit = match command.timeout_ms {
                0 => COMMAND_LIMIT_UNNAMED,
                ms => Duration::from_millis(ms),
            };
            let mut call = tonic::Request::new(command);
            call.set_timeout(limit.saturating_add(target.nodes.call_timeout()));
            let ran = target.workspace()?.run_command(call).await?.into_inner();
            let exit_code = ran.exit_code;
            let body = command_body(&text, ran, target.session, options.dialect);
            (
                body,
                Turn {
                    kind: pb::TurnKind::Exec,
                    detail: text,
                    exit_code: Some(exit_code),
                },
            )
        }
        Request::ReadCommandOutput(mut read) => {
            read.session_id = session_id;
            let id = read.output_id.clone();
            let answer = target.workspace()?.read_output(read).await?.into_inner();
            let mut body = json!({
                "path": id,
                "content": String::from_utf8_lossy(&answer.content),
                "encoding": "utf8",
                "bytes": answer.size,
                "total_lines": answer.total_lines,
                "start_line": answer.start_line,
                "end_line": answer.end_line,
                "truncated": answer.truncated,
            });
            if answer.total_lines_partial {
                body["total_lines_partial"] = json!(true);
            }
            (body, turn(pb::TurnKind::ReadOutput, id))
        }
        Request::Restore(mut restore) => {
            restore.session_id = session_id;
            let restored = target.workspace()?.restore(restore).await?.into_inner();
            let detail = restored.paths.join(" ");
            // Novo's `restore` answers an empty object; Brain's names what it put back.
            let body = match options.dialect {
                Dialect::Novo => json!({}),
                Dialect::Brain => json!({ "paths": restored.paths }),
            };
            (body, turn(pb::TurnKind::Restore, detail))
        }
        Request::WriteFile(mut write) => {
            write.session_id = session_id;
            let bytes = write.content.len();
            let write = target.nodes.carrying(write, bytes);
            let written = target.workspace()?.write(write).await?.into_inner();
            (
                json!({
                    "path": written.path,
                    "bytes_written": written.bytes_written,
                    "created": written.created,
                    "rollback_token": written.rollback_token,
                }),
                turn(pb::TurnKind::WriteFile, written.path),
            )
        }
        Request::WriteArtifact(mut write) => {
            write.session_id = session_id;
            let path = write.path.clone();
            let bytes = write.content.len();
            let write = target.nodes.carrying(write, bytes);
            let written = target.workspace()?.write(write).await?.into_inner();
            (
                json!({ "path": path, "bytes_written": written.bytes_written }),
                turn(pb::TurnKind::WriteFile, path),
            )
        }
        Request::DeleteFile(mut delete) => {
            delete.session_id = session_id;
            let path = delete.path.clone();
            let mut client = target
                .nodes
                .client(&target.session.node_address)
                .map_err(Failed::Unreachable)?;
            target.dispatched.store(true, Ordering::SeqCst);
            client.delete_file(delete).await?;
            (
                json!({ "path": path, "deleted": true }),
                turn(pb::TurnKind::DeleteFile, path),
            )
        }
        Request::Changes { external } => {
            let changes = target
                .workspace()?
                .list_changes(node::ListChangesRequest {
                    session_id,
                    external_only: external,
                    exclude: NOT_ARTIFACTS
                        .iter()
                        .map(|name| (*name).to_owned())
                        .collect(),
                    max_snippet_bytes: 0,
                })
                .await?
                .into_inner()
                .changes;
            let listed = changes
                .into_iter()
                .map(|change| {
                    Ok(if !external {
                        json!({ "path": change.path, "change": node::FileChangeKind::from_wire(change.change)?.label(), "bytes": change.size })
                    } else if let Some(reason) = change.reason {
                        json!({ "kind": "changed-no-diff", "path": change.path, "reason": node::NoSnippetReason::from_wire(reason)?.label() })
                    } else {
                        json!({ "kind": "changed-with-diff", "path": change.path, "snippet": change.snippet })
                    })
                })
                .collect::<Result<Vec<_>, plinth_proto::UnknownValue>>()?;
            (
                Value::Array(listed),
                turn(
                    pb::TurnKind::ListChanges,
                    if external { "external" } else { "artifacts" },
                ),
            )
        }
    };
    Ok(Done { body, turn })
}

/// What a change that can be undone adds to its answer: the token that undoes it, and
/// what the node warned of.
fn changed(body: &mut Value, rollback_token: String, warnings: Vec<String>) {
    if !rollback_token.is_empty() {
        body["rollback_token"] = json!(rollback_token);
    }
    if !warnings.is_empty() {
        body["warnings"] = json!(warnings);
    }
}

/// A file read: text as UTF-8 with its line window, anything else as base64.
fn read_body(read: node::ReadResponse) -> Value {
    let mut body = json!({
        "path": read.path,
        "bytes": read.size,
        "truncated": read.truncated,
        "mtimeMs": read.mtime_ms,
    });
    if read.binary {
        body["content"] = json!(base64::engine::general_purpose::STANDARD.encode(&read.content));
        body["encoding"] = json!("base64");
    } else {
        body["content"] = json!(String::from_utf8_lossy(&read.content));
        body["encoding"] = json!("utf8");
        body["start_line"] = json!(read.start_line);
        body["end_line"] = json!(read.end_line);
        body["total_lines"] = json!(read.total_lines);
        if read.total_lines_partial {
            body["total_lines_partial"] = json!(true);
        }
    }
    body
}

/// A command's result. Novo's carries the session and version under `metadata`; Brain's
/// names the version the session runs on as `version`.
fn command_body(
    command: &str,
    ran: node::RunCommandResponse,
    session: &pb::Session,
    dialect: Dialect,
) -> Value {
    let mut body = json!({
        "command": command,
        "cwd": ran.cwd,
        "exit_code": ran.exit_code,
        "stdout": String::from_utf8_lossy(&ran.stdout),
        "stderr": String::from_utf8_lossy(&ran.stderr),
        "stdout_truncated": ran.stdout_truncated,
        "stderr_truncated": ran.stderr_truncated,
        "duration_ms": ran.duration_ms,
        "timed_out": ran.timed_out,
    });
    match dialect {
        Dialect::Novo => {
            body["metadata"] =
                json!({ "session_id": session.id, "environment_version": session.version });
        }
        Dialect::Brain => body["version"] = json!(session.version),
    }
    if !ran.signal.is_empty() {
        body["signal"] = json!(ran.signal);
    }
    if ran.stdout_truncated {
        body["stdout_lines_truncated"] = json!(ran.stdout_lines_truncated);
    }
    if ran.stderr_truncated {
        body["stderr_lines_truncated"] = json!(ran.stderr_lines_truncated);
    }
    if !ran.output_id.is_empty() {
        body["output_file_path"] = json!(ran.output_id);
        body["output_truncated"] = json!(ran.output_truncated);
    }
    body
}

/// A patch operation's `type` as a Novo or Brain caller wrote it (`create_file`, …), as the
/// contract carries it. A type that is none of them travels as unspecified: the node fails
/// that operation alone, so the patch stays all or nothing as for any other bad operation,
/// and [`patch_results`] says which type came.
pub(crate) fn patch_operation_kind(given: &str) -> i32 {
    node::PatchOperationKind::from_label(given)
        .unwrap_or(node::PatchOperationKind::Unspecified)
        .into()
}

/// A patch's results as Novo and Brain answer them, one `{type, path, status, error?}` per
/// operation, `type` as the caller wrote it (`asked`, in order).
pub(crate) fn patch_results(
    asked: &[String],
    results: Vec<node::PatchOperationResult>,
) -> Result<Vec<serde_json::Value>, plinth_proto::UnknownValue> {
    asked
        .iter()
        .zip(results)
        .map(|(asked, result)| {
            let status = node::PatchOperationStatus::from_wire(result.status)?;
            let mut error = result.error;
            if status == node::PatchOperationStatus::Error
                && node::PatchOperationKind::from_label(asked).is_none()
            {
                let known: Vec<&str> = node::PatchOperationKind::ALL
                    .iter()
                    .map(|kind| kind.label())
                    .collect();
                error = format!("type {asked:?}: one of {}", known.join(", "));
            }
            let mut out = serde_json::json!({
                "type": asked,
                "path": result.path,
                "status": status.label(),
            });
            if !error.is_empty() {
                out["error"] = serde_json::json!(error);
            }
            Ok(out)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session() -> pb::Session {
        pb::Session {
            id: "sess_1".into(),
            version: 4,
            ..Default::default()
        }
    }

    #[test]
    fn a_read_answers_text_with_its_line_window_and_bytes_as_base64() {
        let text = read_body(node::ReadResponse {
            path: "a.txt".into(),
            content: b"one\ntwo\n".to_vec().into(),
            size: 8,
            start_line: 1,
            end_line: 2,
            total_lines: 2,
            ..Default::default()
        });
        assert_eq!(
            text,
            json!({ "path": "a.txt", "bytes": 8, "truncated": false, "mtimeMs": 0,
                    "content": "one\ntwo\n", "encoding": "utf8",
                    "start_line": 1, "end_line": 2, "total_lines": 2 })
        );
        let binary = read_body(node::ReadResponse {
            path: "b.bin".into(),
            content: vec![0xff, 0xfe, 0x00, 0x01].into(),
            size: 4,
            binary: true,
            ..Default::default()
        });
        assert_eq!(binary["content"], "//4AAQ==");
        assert_eq!(binary["encoding"], "base64");
        assert!(binary.get("total_lines").is_none(), "{binary}");
    }

    #[test]
    fn a_commands_result_names_its_version_in_each_adapters_way() {
        let ran = node::RunCommandResponse {
            cwd: "/home/session".into(),
            exit_code: 3,
            stdout: b"out\n".to_vec().into(),
            stdout_truncated: true,
            stdout_lines_truncated: 7,
            ..Default::default()
        };
        let novo = command_body("ls", ran.clone(), &session(), Dialect::Novo);
        assert_eq!(
            novo["metadata"],
            json!({ "session_id": "sess_1", "environment_version": 4 })
        );
        assert_eq!(
            (
                &novo["stdout_lines_truncated"],
                novo.get("stderr_lines_truncated")
            ),
            (&json!(7), None)
        );
        let brain = command_body("ls", ran, &session(), Dialect::Brain);
        assert_eq!(
            (brain.get("metadata"), &brain["version"]),
            (None, &json!(4))
        );
        assert_eq!(brain["exit_code"], 3);
        assert!(brain.get("output_file_path").is_none(), "{brain}");
    }

    /// An unknown type fails its operation alone, and the answer names the type that came,
    /// as the type was asked; a known one is echoed by its label.
    #[test]
    fn a_patch_answers_each_type_as_it_was_asked() {
        assert_eq!(
            patch_operation_kind("update_file"),
            i32::from(node::PatchOperationKind::UpdateFile)
        );
        assert_eq!(patch_operation_kind("rename_file"), 0);
        let result = |status: node::PatchOperationStatus, error: &str| node::PatchOperationResult {
            kind: 0,
            path: "a.txt".to_owned(),
            status: status.into(),
            error: error.to_owned(),
        };
        let answered = patch_results(
            &["rename_file".to_owned(), "update_file".to_owned()],
            vec![
                result(node::PatchOperationStatus::Error, "type: not set"),
                result(node::PatchOperationStatus::Skipped, ""),
            ],
        )
        .expect("known statuses");
        assert_eq!(
            answered,
            [
                serde_json::json!({"type": "rename_file", "path": "a.txt", "status": "error",
                    "error": "type \"rename_file\": one of create_file, update_file, delete_file"}),
                serde_json::json!({"type": "update_file", "path": "a.txt", "status": "skipped"}),
            ]
        );
        let unset = patch_results(
            &["update_file".to_owned()],
            vec![result(node::PatchOperationStatus::Unspecified, "")],
        );
        assert!(unset.is_err(), "an unset status is an error, not a guess");
    }
}
