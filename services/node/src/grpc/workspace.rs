//! The gRPC face of workspace operations (`plinth.node.v1.WorkspaceService`): requests are
//! checked here, `workspace` does the work on blocking threads. Writes of one session take
//! turns (its snapshots and records are updated together); reads never wait.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use futures::StreamExt;
use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::node::v1 as pb;
use tokio::io::AsyncWriteExt;
use tonic::{Request, Response, Status};

use crate::node::Node;
use crate::sessions::LocalSession;
use crate::workspace::beneath::Previous;
use crate::workspace::patch::{self, EditKind};
use crate::workspace::search::{self, Query};
use crate::workspace::text::{self, Range};
use crate::workspace::track::{self, Change};
use crate::workspace::{MAX_FILE_BYTES, Workspace, beneath};

impl Node {
    fn workspace(&self, id: &str) -> Result<(Arc<LocalSession>, Workspace), PlinthError> {
        let session = self
            .sessions
            .get(id)
            .ok_or_else(|| PlinthError::session_lost(id))?;
        let uid = if self.isolation.enabled {
            session.record.uid
        } else {
            rustix::process::getuid().as_raw()
        };
        let state = session
            .workdir
            .parent()
            .map(|dir| dir.join("workspace"))
            .unwrap_or_else(|| session.workdir.join("../workspace"));
        let mount = plinth_kit::slug::mount(&session.record.slug);
        // What the session's commands see at the mount: in its sandbox, an overlay of the
        // version's layer over its bases (the layer's own directory holds only what changed),
        // reached through the keeper's root; without isolation, the version's directory,
        // which is what `/env/<slug>` links to.
        let version_dir = match session.namespace.get() {
            Some(sandbox) if self.isolation.enabled => PathBuf::from(format!(
                "/proc/{}/root{mount}",
                sandbox.keeper.pid().as_raw_nonzero()
            )),
            _ => self
                .cache
                .version_dir(&session.record.environment_id, session.record.version),
        };
        let workspace = Workspace {
            root: session.workdir.clone(),
            shown_root: self.seen_workdir(&session),
            mount,
            version_dir,
            uid,
            state,
            snapshot_budget: self.limits.workspace_snapshot_max_bytes,
        };
        Ok((session, workspace))
    }
}

/// Runs `work` on a blocking thread.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, PlinthError> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| PlinthError::internal(&error))?
        .map_err(Status::from)
}

/// A caller's count: `default` for 0, never past `max` (the answer then says it was cut,
/// where there was more).
fn count(value: u64, default: usize, max: usize) -> usize {
    if value == 0 {
        default.min(max)
    } else {
        usize::try_from(value).unwrap_or(usize::MAX).min(max)
    }
}

/// When a walk started now must answer.
fn walk_deadline() -> std::time::Instant {
    std::time::Instant::now() + search::WALK_TIME_LIMIT
}

/// Most bytes of a diff one changed file's snippet may have.
const MAX_SNIPPET_BYTES: usize = 64 * 1024;
/// Most bytes of each of stdout and stderr a command's answer carries inline.
const MAX_INLINE_BYTES: usize = 4 * 1024 * 1024;

fn entry(found: search::Entry) -> pb::Entry {
    pb::Entry {
        path: found.path,
        kind: match found.kind {
            search::EntryKind::File => pb::EntryKind::File,
            search::EntryKind::Directory => pb::EntryKind::Directory,
            search::EntryKind::Symlink => pb::EntryKind::Symlink,
        }
        .into(),
        size: found.size,
        mtime_ms: found.mtime_ms,
    }
}

fn slice_response(path: String, size: u64, mtime_ms: i64, slice: text::Slice) -> pb::ReadResponse {
    pb::ReadResponse {
        path,
        content: slice.content.into(),
        binary: slice.binary,
        size,
        truncated: slice.truncated,
        mtime_ms,
        start_line: slice.start_line,
        end_line: slice.end_line,
        total_lines: slice.total_lines,
        total_lines_partial: slice.total_lines_partial,
    }
}

fn valid_output_id(id: &str) -> bool {
    plinth_kit::ids::OutputId::is_valid(id)
}

/// One output stream as it comes: its first bytes (for the inline head) and its line count.
#[derive(Debug, Default)]
struct Stream {
    start: Vec<u8>,
    newlines: u64,
    last: Option<u8>,
}

impl Stream {
    fn push(&mut self, bytes: &[u8], inline: usize) {
        if self.start.len() <= inline {
            self.start.extend_from_slice(bytes);
        }
        self.newlines += bytes.iter().filter(|b| **b == b'\n').count() as u64;
        if let Some(last) = bytes.last() {
            self.last = Some(*last);
        }
    }

    /// Whether the stream is already past its inline head (its answer will be cut).
    fn cut(&self, inline: usize) -> bool {
        self.start.len() > inline
    }

    /// The head answered inline, whether it was cut, and how many lines of the whole
    /// stream it leaves out (a line it shows only the start of counts as left out).
    fn head(&self, inline: usize) -> (Vec<u8>, bool, u64) {
        let (kept, cut, _) = head(&self.start, inline);
        if !cut {
            return (kept, false, 0);
        }
        let total = self.newlines + u64::from(self.last.is_some_and(|b| b != b'\n'));
        let shown = kept.iter().filter(|b| **b == b'\n').count() as u64;
        (kept, true, total.saturating_sub(shown))
    }
}

/// A command's whole output as it came (stdout and stderr interleaved), for `ReadOutput`: a
/// file in the workspace's `outputs`, made only once the answer needs it (a stream past its
/// inline head, or past what is kept). Until then what came is held here (about the two inline
/// heads at most: the file is made with the chunk that passes one), so a command answered
/// whole inline makes, writes and removes no file on its way to its answer.
#[derive(Debug)]
struct Spill {
    outputs: PathBuf,
    held: Vec<u8>,
    file: Option<(String, tokio::fs::File)>,
}

impl Spill {
    fn new(outputs: PathBuf) -> Self {
        Spill {
            outputs,
            held: Vec::new(),
            file: None,
        }
    }

    /// Takes the next bytes the command wrote; `needed`: the answer is known to be cut, so
    /// the file is made now (if it was not yet) and written from here on.
    async fn push(&mut self, bytes: &[u8], needed: bool) -> Result<(), PlinthError> {
        if let Some((_, file)) = &mut self.file {
            return file
                .write_all(bytes)
                .await
                .map_err(|error| PlinthError::internal(&error));
        }
        self.held.extend_from_slice(bytes);
        if needed {
            self.open().await?;
        }
        Ok(())
    }

    /// Makes the file and writes to it what was held.
    async fn open(&mut self) -> Result<(), PlinthError> {
        if self.file.is_some() {
            return Ok(());
        }
        tokio::fs::create_dir_all(&self.outputs)
            .await
            .map_err(|error| PlinthError::internal(&error))?;
        let id = plinth_kit::ids::OutputId::generate().to_string();
        let mut file = tokio::fs::File::create(self.outputs.join(&id))
            .await
            .map_err(|error| PlinthError::internal(&error))?;
        file.write_all(&std::mem::take(&mut self.held))
            .await
            .map_err(|error| PlinthError::internal(&error))?;
        self.file = Some((id, file));
        Ok(())
    }

    /// Once the command ended: with `needed` (its answer was cut, or output was dropped),
    /// the id of the file holding all of it, written through before it is answered; without,
    /// no file.
    async fn finish(mut self, needed: bool) -> Result<Option<String>, PlinthError> {
        if !needed {
            if let Some((id, file)) = self.file.take() {
                drop(file);
                let _ = tokio::fs::remove_file(self.outputs.join(id)).await;
            }
            return Ok(None);
        }
        self.open().await?;
        let Some((id, mut file)) = self.file.take() else {
            return Ok(None);
        };
        file.flush()
            .await
            .map_err(|error| PlinthError::internal(&error))?;
        Ok(Some(id))
    }
}

/// The head of a stream answered inline: at most `limit` bytes, cut after a line end in its
/// last quarter when there is one; and how many lines of `bytes` were left out.
fn head(bytes: &[u8], limit: usize) -> (Vec<u8>, bool, u64) {
    if bytes.len() <= limit {
        return (bytes.to_vec(), false, 0);
    }
    let mut cut = limit;
    if let Some(newline) = bytes[limit - limit / 4..limit]
        .iter()
        .rposition(|b| *b == b'\n')
    {
        cut = limit - limit / 4 + newline + 1;
    }
    while cut > 0 && std::str::from_utf8(&bytes[..cut]).is_err_and(|e| e.error_len().is_none()) {
        cut -= 1;
    }
    let rest = &bytes[cut..];
    let mut lines = rest.iter().filter(|b| **b == b'\n').count() as u64;
    if !rest.is_empty() && !rest.ends_with(b"\n") {
        lines += 1;
    }
    (bytes[..cut].to_vec(), true, lines)
}

#[tonic::async_trait]
impl pb::workspace_service_server::WorkspaceService for Node {
    #[tracing::instrument(name = "node.workspace.read", skip_all)]
    async fn read(
        &self,
        request: Request<pb::ReadRequest>,
    ) -> Result<Response<pb::ReadResponse>, Status> {
        let request = request.into_inner();
        let (_, ws) = self.workspace(&request.session_id)?;
        let answer = blocking(move || {
            let target = ws.resolve(&request.path)?;
            let base = ws.open_base(target.base)?;
            let (fd, stat) = beneath::lookup(&base, &target.rel(), &target.display)?;
            beneath::check_readable(&stat, &target.display, ws.owner(target.base))?;
            let size = u64::try_from(stat.st_size).unwrap_or(0);
            let mut content = Vec::new();
            use std::io::Read;
            beneath::reopen(&fd, &target.display)?
                .take(MAX_FILE_BYTES)
                .read_to_end(&mut content)
                .map_err(|error| PlinthError::internal(&error))?;
            let partial = size > content.len() as u64;
            let slice = text::slice(
                &content,
                partial,
                Range {
                    start_line: request.start_line,
                    end_line: request.end_line,
                    max_bytes: request.max_bytes,
                    lines_threshold: request.lines_threshold,
                },
            )?;
            Ok(slice_response(
                target.display,
                size,
                beneath::mtime_ms(&stat),
                slice,
            ))
        })
        .await?;
        Ok(Response::new(answer))
    }

    #[tracing::instrument(name = "node.workspace.list", skip_all)]
    async fn list(
        &self,
        request: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        let request = request.into_inner();
        let (_, ws) = self.workspace(&request.session_id)?;
        let answer = blocking(move || {
            let target = ws.resolve(&request.path)?;
            let (entries, truncated) = search::list(
                &ws,
                &target,
                request.recursive,
                request.include_hidden,
                count(request.max_entries, 500, search::MAX_ENTRIES),
                walk_deadline(),
            )?;
            Ok(pb::ListResponse {
                root: target.display,
                entries: entries.into_iter().map(entry).collect(),
                truncated,
            })
        })
        .await?;
        Ok(Response::new(answer))
    }

    #[tracing::instrument(name = "node.workspace.search", skip_all)]
    async fn search(
        &self,
        request: Request<pb::SearchRequest>,
    ) -> Result<Response<pb::SearchResponse>, Status> {
        let request = request.into_inner();
        let (_, ws) = self.workspace(&request.session_id)?;
        let answer = blocking(move || {
            let target = ws.resolve(&request.path)?;
            let query = Query {
                pattern: request.pattern,
                literal: request.literal,
                ignore_case: request.ignore_case,
                glob: (!request.glob.is_empty()).then_some(request.glob),
                context: usize::try_from(request.context).unwrap_or(usize::MAX),
                per_file: count(request.limit_per_file, 100, search::MAX_RESULTS),
                max_results: count(request.max_results, 100, search::MAX_RESULTS),
                max_line_bytes: count(request.max_bytes_per_line, 500, search::MAX_LINE_BYTES),
                deadline: walk_deadline(),
            };
            let (found, truncated, searched) = search::search(&ws, &target, &query)?;
            Ok(pb::SearchResponse {
                matches: found
                    .into_iter()
                    .map(|found| pb::Match {
                        path: found.path,
                        line: found.line,
                        text: found.text,
                        before: found.before,
                        after: found.after,
                    })
                    .collect(),
                truncated,
                files_searched: searched,
            })
        })
        .await?;
        Ok(Response::new(answer))
    }

    #[tracing::instrument(name = "node.workspace.find", skip_all)]
    async fn find(
        &self,
        request: Request<pb::FindRequest>,
    ) -> Result<Response<pb::FindResponse>, Status> {
        let request = request.into_inner();
        let (_, ws) = self.workspace(&request.session_id)?;
        let answer = blocking(move || {
            let target = ws.resolve(&request.path)?;
            let (entries, truncated) = search::find(
                &ws,
                &target,
                &request.pattern,
                count(request.max_entries, 200, search::MAX_ENTRIES),
                walk_deadline(),
            )?;
            Ok(pb::FindResponse {
                entries: entries.into_iter().map(entry).collect(),
                truncated,
            })
        })
        .await?;
        Ok(Response::new(answer))
    }

    #[tracing::instrument(name = "node.workspace.edit", skip_all)]
    async fn edit(
        &self,
        request: Request<pb::EditRequest>,
    ) -> Result<Response<pb::EditResponse>, Status> {
        let request = request.into_inner();
        let (_, ws) = self.workspace(&request.session_id)?;
        let kind = match pb::EditOperation::try_from(request.operation) {
            Ok(pb::EditOperation::Create) => EditKind::Create,
            Ok(pb::EditOperation::Replace) => EditKind::Replace,
            Ok(pb::EditOperation::InsertAfter) => EditKind::InsertAfter,
            Ok(pb::EditOperation::InsertBefore) => EditKind::InsertBefore,
            Ok(pb::EditOperation::Append) => EditKind::Append,
            _ => {
                return Err(PlinthError::new(
                    ErrorCode::WorkspaceInvalidRequest,
                    "operation: one of create, replace, insert_after, insert_before, append",
                )
                .into());
            }
        };
        let lock = self.edits.of(&request.session_id);
        let _turn = lock.lock().await;
        let answer = blocking(move || {
            let target = ws.resolve_writable(&request.path)?;
            let before = track::current(&ws, &target.parts, &target.display)?;
            let current = match &before {
                Previous::Missing => None,
                Previous::File { content, .. } => {
                    Some(String::from_utf8(content.clone()).map_err(|_| {
                        PlinthError::new(
                            ErrorCode::WorkspaceInvalidRequest,
                            format!(
                                "{}: not UTF-8 text; edits work on text files",
                                target.display
                            ),
                        )
                    })?)
                }
            };
            let new = patch::edit(
                &target.display,
                current.as_deref(),
                kind,
                request.contents.as_deref(),
                request.find.as_deref(),
                request.replace_all,
            )?;
            let mut warnings = Vec::new();
            if kind == EditKind::Create && current.is_some() {
                warnings.push(format!("{} existed and was overwritten", target.display));
            }
            if matches!(kind, EditKind::Replace) && request.contents.as_deref() == Some("") {
                warnings.push("contents was empty: the matched text was deleted".to_owned());
            }
            let created = current.is_none();
            let bytes_written = new.len() as u64;
            let rollback_token = if request.dry_run {
                String::new()
            } else {
                track::write(
                    &ws,
                    &[Change {
                        parts: target.parts.clone(),
                        display: target.display.clone(),
                        content: Some(new.into_bytes()),
                    }],
                )?
            };
            Ok(pb::EditResponse {
                path: target.display,
                bytes_written,
                created,
                rollback_token,
                warnings,
            })
        })
        .await?;
        Ok(Response::new(answer))
    }

    #[tracing::instrument(name = "node.workspace.apply_patch", skip_all)]
    async fn apply_patch(
        &self,
        request: Request<pb::ApplyPatchRequest>,
    ) -> Result<Response<pb::PatchResponse>, Status> {
        let request = request.into_inner();
        let (_, ws) = self.workspace(&request.session_id)?;
        if request.operations.is_empty() {
            return Err(PlinthError::new(
                ErrorCode::WorkspaceInvalidRequest,
                "operations: at least one is required",
            )
            .into());
        }
        let lock = self.edits.of(&request.session_id);
        let _turn = lock.lock().await;
        let answer = blocking(move || {
            // Work every operation out in memory, later ones seeing earlier ones.
            let mut state: HashMap<String, Option<String>> = HashMap::new();
            let mut changes: Vec<Change> = Vec::new();
            let mut results = Vec::new();
            let mut failed = false;
            for operation in &request.operations {
                let outcome = (|| -> Result<Change, String> {
                    let target = ws
                        .resolve_writable(&operation.path)
                        .map_err(|e| e.message)?;
                    let key = target.parts.join("/");
                    let now = match state.get(&key) {
                        Some(now) => now.clone(),
                        None => match track::current(&ws, &target.parts, &target.display)
                            .map_err(|e| e.message)?
                        {
                            Previous::Missing => None,
                            Previous::File { content, .. } => Some(
                                String::from_utf8(content)
                                    .map_err(|_| "not UTF-8 text".to_owned())?,
                            ),
                        },
                    };
                    let kind = pb::PatchOperationKind::from_wire(operation.kind)
                        .map_err(|error| format!("type: {error}"))?;
                    let new = match kind {
                        pb::PatchOperationKind::CreateFile => {
                            if now.is_some() {
                                return Err(format!("{} already exists", target.display));
                            }
                            Some(patch::created(&operation.diff).map_err(|e| e.to_string())?)
                        }
                        pb::PatchOperationKind::UpdateFile => {
                            let Some(now) = now else {
                                return Err(format!("{} does not exist", target.display));
                            };
                            Some(patch::apply(&now, &operation.diff).map_err(|e| e.to_string())?)
                        }
                        pb::PatchOperationKind::DeleteFile => {
                            if now.is_none() {
                                return Err(format!("{} does not exist", target.display));
                            }
                            None
                        }
                        // `from_wire` never answers it; the match names it rather than hide
                        // it under a wildcard.
                        pb::PatchOperationKind::Unspecified => {
                            return Err("type: not set".to_owned());
                        }
                    };
                    state.insert(key, new.clone());
                    Ok(Change {
                        parts: target.parts,
                        display: target.display,
                        content: new.map(String::into_bytes),
                    })
                })();
                match outcome {
                    Ok(change) if !failed => {
                        changes.push(change);
                        results.push((pb::PatchOperationStatus::Ok, String::new()));
                    }
                    Ok(_) => results.push((pb::PatchOperationStatus::Skipped, String::new())),
                    Err(error) if !failed => {
                        failed = true;
                        results.push((pb::PatchOperationStatus::Error, error));
                    }
                    Err(_) => results.push((pb::PatchOperationStatus::Skipped, String::new())),
                }
            }
            if failed {
                // Nothing is written: every operation that would have applied is skipped.
                for result in &mut results {
                    if result.0 == pb::PatchOperationStatus::Ok {
                        result.0 = pb::PatchOperationStatus::Skipped;
                    }
                }
            }
            let rollback_token = if failed || request.dry_run {
                String::new()
            } else {
                track::write(&ws, &changes)?
            };
            Ok(pb::PatchResponse {
                applied: !failed,
                operations: request
                    .operations
                    .iter()
                    .zip(results)
                    .map(|(operation, (status, error))| pb::PatchOperationResult {
                        kind: operation.kind,
                        path: operation.path.clone(),
                        status: status.into(),
                        error,
                    })
                    .collect(),
                rollback_token,
                warnings: Vec::new(),
            })
        })
        .await?;
        Ok(Response::new(answer))
    }

    #[tracing::instrument(name = "node.workspace.write", skip_all)]
    async fn write(
        &self,
        request: Request<pb::WriteRequest>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        let request = request.into_inner();
        let (_, ws) = self.workspace(&request.session_id)?;
        if request.content.len() as u64 > MAX_FILE_BYTES {
            return Err(PlinthError::new(
                ErrorCode::FileTooLarge,
                format!("at most {MAX_FILE_BYTES} bytes can be written"),
            )
            .with_detail(serde_json::json!({ "max_bytes": MAX_FILE_BYTES }))
            .into());
        }
        let lock = self.edits.of(&request.session_id);
        let _turn = lock.lock().await;
        let answer = blocking(move || {
            let target = ws.resolve_writable(&request.path)?;
            let created = !track::exists(&ws, &target.parts, &target.display)?;
            let bytes_written = request.content.len() as u64;
            let rollback_token = track::write(
                &ws,
                &[Change {
                    parts: target.parts.clone(),
                    display: target.display.clone(),
                    content: Some(request.content.to_vec()),
                }],
            )?;
            Ok(pb::WriteResponse {
                path: target.display,
                bytes_written,
                created,
                rollback_token,
            })
        })
        .await?;
        Ok(Response::new(answer))
    }

    #[tracing::instrument(name = "node.workspace.restore", skip_all)]
    async fn restore(
        &self,
        request: Request<pb::RestoreRequest>,
    ) -> Result<Response<pb::RestoreResponse>, Status> {
        let request = request.into_inner();
        let (_, ws) = self.workspace(&request.session_id)?;
        let lock = self.edits.of(&request.session_id);
        let _turn = lock.lock().await;
        let paths = blocking(move || track::restore(&ws, &request.token)).await?;
        Ok(Response::new(pb::RestoreResponse { paths }))
    }

    #[tracing::instrument(name = "node.workspace.run_command", skip_all)]
    async fn run_command(
        &self,
        request: Request<pb::RunCommandRequest>,
    ) -> Result<Response<pb::RunCommandResponse>, Status> {
        let request = request.into_inner();
        let spec = request
            .session
            .clone()
            .ok_or_else(|| PlinthError::invalid("a session is required"))?;
        let (_, ws) = self.workspace(&spec.session_id)?;
        let cwd = if request.cwd.is_empty() {
            ws.shown_root.to_string_lossy().into_owned()
        } else {
            let target = ws.resolve(&request.cwd)?;
            // The directory must be there, beneath its base without a link out, before the
            // command is started in it by path.
            let (check, checked) = (ws.clone(), target.clone());
            blocking(move || {
                let base = check.open_base(checked.base)?;
                let (_, stat) = beneath::lookup(&base, &checked.rel(), &checked.display)?;
                if beneath::kind(&stat) == rustix::fs::FileType::Directory {
                    Ok(())
                } else {
                    Err(PlinthError::new(
                        ErrorCode::WorkspacePathInvalid,
                        format!("cwd {}: not a directory", checked.display),
                    ))
                }
            })
            .await?;
            match target.base {
                crate::workspace::Base::Root => ws
                    .shown_root
                    .join(target.rel())
                    .to_string_lossy()
                    .into_owned(),
                crate::workspace::Base::Mount => target.display,
            }
        };
        let keep = request.keep_bytes;
        let inline = count(request.inline_bytes, 64 * 1024, MAX_INLINE_BYTES);
        let events = pb::node_service_server::NodeService::exec(
            self,
            Request::new(pb::ExecRequest {
                session: Some(spec),
                command: request.command,
                cwd: cwd.clone(),
                env: request.env,
                timeout_ms: request.timeout_ms,
                output_limit_bytes: keep,
                stdin: Default::default(),
            }),
        )
        .await?
        .into_inner();
        let mut spill = Spill::new(ws.state.join("outputs"));
        let (mut stdout, mut stderr) = (Stream::default(), Stream::default());
        let mut result = None;
        let mut events = events;
        while let Some(event) = events.next().await {
            match event?.event {
                Some(pb::exec_event::Event::Stdout(bytes)) => {
                    stdout.push(&bytes, inline);
                    let cut = stdout.cut(inline) || stderr.cut(inline);
                    spill.push(&bytes, cut).await?;
                }
                Some(pb::exec_event::Event::Stderr(bytes)) => {
                    stderr.push(&bytes, inline);
                    let cut = stdout.cut(inline) || stderr.cut(inline);
                    spill.push(&bytes, cut).await?;
                }
                Some(pb::exec_event::Event::Result(ended)) => result = Some(ended),
                None => {}
            }
        }
        let result = result.ok_or_else(|| {
            PlinthError::new(ErrorCode::Unavailable, "the command ended without a result")
        })?;
        let (stdout, stdout_truncated, stdout_lines) = stdout.head(inline);
        let (stderr, stderr_truncated, stderr_lines) = stderr.head(inline);
        let dropped = result.stdout_dropped_bytes > 0 || result.stderr_dropped_bytes > 0;
        let spilled = stdout_truncated || stderr_truncated || dropped;
        let output_id = spill.finish(spilled).await?;
        Ok(Response::new(pb::RunCommandResponse {
            exit_code: result.exit_code,
            signal: if result.timed_out {
                "SIGKILL".to_owned()
            } else {
                String::new()
            },
            stdout: stdout.into(),
            stderr: stderr.into(),
            stdout_truncated: stdout_truncated || result.stdout_dropped_bytes > 0,
            stderr_truncated: stderr_truncated || result.stderr_dropped_bytes > 0,
            stdout_lines_truncated: stdout_lines,
            stderr_lines_truncated: stderr_lines,
            duration_ms: result.duration_ms,
            timed_out: result.timed_out,
            output_id: output_id.unwrap_or_default(),
            output_truncated: dropped,
            cwd,
        }))
    }

    #[tracing::instrument(name = "node.workspace.read_output", skip_all)]
    async fn read_output(
        &self,
        request: Request<pb::ReadOutputRequest>,
    ) -> Result<Response<pb::ReadResponse>, Status> {
        let request = request.into_inner();
        let (_, ws) = self.workspace(&request.session_id)?;
        let answer = blocking(move || {
            let missing = || {
                PlinthError::new(
                    ErrorCode::WorkspaceNotFound,
                    format!(
                        "{:?} is not a command output of this workspace; pass output_file_path back unchanged",
                        request.output_id
                    ),
                )
            };
            if !valid_output_id(&request.output_id) {
                return Err(missing());
            }
            let path = ws.state.join("outputs").join(&request.output_id);
            // A command's kept output is bounded by its exec limit; read no more than a file.
            let mut bytes = Vec::new();
            {
                use std::io::Read;
                std::fs::File::open(&path)
                    .map_err(|_| missing())?
                    .take(MAX_FILE_BYTES)
                    .read_to_end(&mut bytes)
                    .map_err(|error| PlinthError::internal(&error))?;
            }
            let mtime_ms = std::fs::metadata(&path)
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(0));
            // Output is answered as text whatever bytes the command wrote.
            let text = String::from_utf8_lossy(&bytes).replace('\0', "\u{fffd}");
            let slice = text::slice(
                text.as_bytes(),
                false,
                Range {
                    start_line: request.start_line,
                    end_line: request.end_line,
                    max_bytes: request.max_bytes,
                    lines_threshold: 0,
                },
            )?;
            Ok(slice_response(request.output_id, bytes.len() as u64, mtime_ms, slice))
        })
        .await?;
        Ok(Response::new(answer))
    }

    #[tracing::instrument(name = "node.workspace.list_changes", skip_all)]
    async fn list_changes(
        &self,
        request: Request<pb::ListChangesRequest>,
    ) -> Result<Response<pb::ListChangesResponse>, Status> {
        let request = request.into_inner();
        let (_, ws) = self.workspace(&request.session_id)?;
        let lock = self.edits.of(&request.session_id);
        let _turn = lock.lock().await;
        let changes = blocking(move || {
            track::changes(
                &ws,
                request.external_only,
                &request.exclude,
                count(request.max_snippet_bytes, 8 * 1024, MAX_SNIPPET_BYTES),
            )
        })
        .await?;
        Ok(Response::new(pb::ListChangesResponse {
            changes: changes
                .into_iter()
                .map(|change| pb::FileChange {
                    path: change.path,
                    change: match change.change {
                        track::ChangeKind::Created => pb::FileChangeKind::Created,
                        track::ChangeKind::Modified => pb::FileChangeKind::Modified,
                        track::ChangeKind::Deleted => pb::FileChangeKind::Deleted,
                    }
                    .into(),
                    size: change.size,
                    snippet: change.snippet,
                    reason: change.reason.map(|reason| {
                        match reason {
                            track::NoSnippet::Binary => pb::NoSnippetReason::Binary,
                            track::NoSnippet::PartialPriorRead => {
                                pb::NoSnippetReason::PartialPriorRead
                            }
                            track::NoSnippet::TooLarge => pb::NoSnippetReason::SnippetTooLarge,
                            track::NoSnippet::Deleted => pb::NoSnippetReason::Deleted,
                        }
                        .into()
                    }),
                })
                .collect(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_output_is_cut_at_a_line_end_near_the_limit() {
        let (kept, cut, lines) = head(b"aaaa\nbbbb\ncccc\n", 12);
        assert_eq!(
            (kept.as_slice(), cut, lines),
            (&b"aaaa\nbbbb\n"[..], true, 1)
        );
        let (kept, cut, lines) = head(b"short\n", 100);
        assert_eq!((kept.as_slice(), cut, lines), (&b"short\n"[..], false, 0));
    }

    #[test]
    fn lines_left_out_are_counted_over_the_whole_stream() {
        let mut stream = Stream::default();
        let lines: Vec<String> = (1..=1000).map(|n| format!("{n}\n")).collect();
        for chunk in lines.chunks(100) {
            stream.push(chunk.concat().as_bytes(), 12);
        }
        let (kept, cut, left_out) = stream.head(12);
        assert_eq!((kept.as_slice(), cut), (&b"1\n2\n3\n4\n5\n6\n"[..], true));
        assert_eq!(left_out, 994);
        let mut stream = Stream::default();
        stream.push(b"aaaa\nbbbb\ncc", 4);
        stream.push(b"cc", 4);
        assert_eq!(
            stream.head(4).2,
            3,
            "a line shown in part, and one without its end, count"
        );
    }

    #[tokio::test]
    async fn output_answered_whole_inline_leaves_no_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let outputs = dir.path().join("outputs");
        let mut spill = Spill::new(outputs.clone());
        spill.push(b"out\n", false).await.expect("push");
        spill.push(b"err\n", false).await.expect("push");
        assert_eq!(spill.finish(false).await.expect("finish"), None);
        assert!(
            !outputs.exists(),
            "nothing is made for an answer that was not cut"
        );
    }

    #[tokio::test]
    async fn output_past_the_head_is_kept_whole_as_it_came() {
        let dir = tempfile::tempdir().expect("temp dir");
        let outputs = dir.path().join("outputs");
        let mut spill = Spill::new(outputs.clone());
        spill.push(b"1\n", false).await.expect("push");
        spill.push(b"e\n", false).await.expect("push");
        spill.push(b"2\n", true).await.expect("push");
        spill.push(b"3\n", true).await.expect("push");
        let id = spill
            .finish(true)
            .await
            .expect("finish")
            .expect("an output id");
        assert!(valid_output_id(&id), "{id}");
        assert_eq!(
            std::fs::read(outputs.join(&id)).expect("kept output"),
            b"1\ne\n2\n3\n"
        );
        // Cut only at the end (output past what is kept): the file is made then.
        let mut spill = Spill::new(outputs.clone());
        spill.push(b"abc", false).await.expect("push");
        let id = spill
            .finish(true)
            .await
            .expect("finish")
            .expect("an output id");
        assert_eq!(
            std::fs::read(outputs.join(&id)).expect("kept output"),
            b"abc"
        );
    }

    #[test]
    fn a_stream_is_cut_once_it_passes_its_head() {
        let mut stream = Stream::default();
        stream.push(b"abcd", 4);
        assert!(!stream.cut(4));
        assert!(!stream.head(4).1);
        stream.push(b"e", 4);
        assert!(stream.cut(4));
        assert!(stream.head(4).1);
    }
}
