//! The gRPC face of the node (`plinth.node.v1.NodeService`): requests are checked here, the
//! cache, the session table and the isolation module do the work.

use std::sync::Arc;
use std::time::{Duration, Instant};

use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::node::v1 as pb;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::isolation;
use crate::sessions::SessionRecord;
use crate::workdir;

use crate::node::{
    Node, Prepared, cache_error, cwd_refused, exec_result, isolate, limits_from_wire,
    session_error, start_proxy,
};

type ExecStream = ReceiverStream<Result<pb::ExecEvent, Status>>;

#[tonic::async_trait]
impl pb::node_service_server::NodeService for Node {
    #[tracing::instrument(name = "node.attach", skip_all)]
    async fn attach(
        &self,
        request: Request<pb::AttachRequest>,
    ) -> Result<Response<pb::AttachResponse>, Status> {
        let started = std::time::Instant::now();
        let spec = request
            .into_inner()
            .session
            .ok_or_else(|| PlinthError::invalid("a session is required"))?;
        let materialized = self
            .cache
            .materialize(&spec.environment_id, spec.version, &spec.layer_tree)
            .await
            .map_err(cache_error)?;
        if !isolation::valid_slug(&spec.slug) {
            return Err(PlinthError::invalid(format!("invalid slug {:?}", spec.slug)).into());
        }
        {
            // Asking an interpreter its version runs it, once per interpreter.
            let (version, slug) = (materialized.clone(), spec.slug.clone());
            tokio::task::spawn_blocking(move || crate::toolchains::check(&version, &slug))
                .await
                .map_err(|error| PlinthError::internal(&error))?
                .map_err(|mismatch| {
                    PlinthError::new(ErrorCode::Unavailable, mismatch.to_string())
                })?;
        }
        let record = SessionRecord {
            session_id: spec.session_id,
            environment_id: spec.environment_id,
            version: spec.version,
            slug: spec.slug,
            layer_tree: spec.layer_tree,
            uid: 0,
            limits: spec.limits.map(limits_from_wire).unwrap_or_default(),
            scope: spec.scope,
        };
        let sessions = self.sessions.clone();
        let session = match &self.namespaces {
            // The directories and the namespace in one hand-off to the namespace thread.
            Some(namespaces) => {
                let (isolation, version) = (self.isolation.clone(), materialized.clone());
                let attached = namespaces
                    .run(move |thread| {
                        let session = sessions
                            .attach(record, true)
                            .map_err(|error| (session_error(error), None))?;
                        if session.namespace.initialized() {
                            return Ok((session, None));
                        }
                        match isolate(
                            thread,
                            &isolation,
                            &version,
                            &session.record,
                            &session.workdir,
                        ) {
                            Ok(sandbox) => Ok((session, Some(sandbox))),
                            Err(error) => Err((error, Some(session.record.session_id.clone()))),
                        }
                    })
                    .await
                    .map_err(|error| PlinthError::new(ErrorCode::Unavailable, error.to_string()))?;
                let attached = attached.and_then(|(session, sandbox)| {
                    if let Some(mut sandbox) = sandbox {
                        start_proxy(&self.isolation, &mut sandbox, &session.record.session_id)
                            .map_err(|error| (error, Some(session.record.session_id.clone())))?;
                        let _ = session.namespace.set(Arc::new(sandbox));
                    }
                    Ok(session)
                });
                match attached {
                    Ok(session) => session,
                    Err((error, made)) => {
                        // A session its commands cannot run in is not kept.
                        if let Some(id) = made {
                            self.sessions.detach(&id).await;
                        }
                        return Err(error.into());
                    }
                }
            }
            None => tokio::task::spawn_blocking(move || sessions.attach(record, false))
                .await
                .map_err(|error| PlinthError::internal(&error))?
                .map_err(session_error)?,
        };
        // Detached while its sandbox was being made (a heartbeat found it ended: the caller
        // gave up on this attach and the catalog ended the session): its directory is gone,
        // and its sandbox goes with the last handle on it, this one.
        if session.ended.is_cancelled() {
            return Err(PlinthError::new(
                ErrorCode::Unavailable,
                format!(
                    "session {} was ended while it was being attached",
                    session.record.session_id
                ),
            )
            .into());
        }
        tracing::info!(session = %session.record.session_id, version = session.record.version, uid = session.record.uid, materialize_ms = materialized.took.as_millis() as u64, fetched = materialized.fetched, "session attached");
        let lookup = if materialized.fetched == 0 {
            "hit"
        } else {
            "miss"
        };
        metrics::counter!("plinth_node_cache_lookups_total", "result" => lookup).increment(1);
        metrics::histogram!("plinth_node_attach_duration_seconds")
            .record(started.elapsed().as_secs_f64());
        metrics::gauge!("plinth_node_sessions").set(self.sessions.len() as f64);
        Ok(Response::new(pb::AttachResponse {
            workdir: self.seen_workdir(&session).to_string_lossy().into_owned(),
            isolated: self.isolation.enabled,
            materialize_ms: if materialized.fetched > 0 {
                u64::try_from(materialized.took.as_millis()).unwrap_or(u64::MAX)
            } else {
                0
            },
        }))
    }

    #[tracing::instrument(name = "node.detach", skip_all)]
    async fn detach(
        &self,
        request: Request<pb::DetachRequest>,
    ) -> Result<Response<pb::DetachResponse>, Status> {
        let id = request.into_inner().session_id;
        if self.sessions.detach(&id).await {
            tracing::info!(session = %id, "session detached");
        }
        Ok(Response::new(pb::DetachResponse {}))
    }

    type ExecStream = ExecStream;

    #[tracing::instrument(name = "node.exec", skip_all)]
    async fn exec(
        &self,
        request: Request<pb::ExecRequest>,
    ) -> Result<Response<Self::ExecStream>, Status> {
        let request = request.into_inner();
        let spec = request
            .session
            .ok_or_else(|| PlinthError::invalid("a session is required"))?;
        let timeout = match request.timeout_ms {
            0 => self.limits.default_timeout,
            ms => Duration::from_millis(ms).min(self.limits.max_timeout),
        };
        let limit = match request.output_limit_bytes {
            0 => self.limits.default_output_bytes,
            bytes => bytes.min(self.limits.max_output_bytes),
        };
        let Prepared {
            session,
            mut command,
            namespace,
            oom_before,
        } = self
            .prepare(&spec, request.command, &request.cwd, request.env)
            .await?;
        let (events, receiver) = mpsc::channel::<Result<pb::ExecEvent, Status>>(32);
        let started = Instant::now();
        let child = crate::spawn::spawn(&command);
        let mut child = match child {
            Ok(child) => child,
            Err(error) if error.cwd_failure().is_some() => {
                return Err(cwd_refused(&error, &request.cwd).into());
            }
            Err(error) => {
                tracing::warn!(session = %session.record.session_id, %error, "a command could not be started");
                let _ = events
                    .send(Ok(event(pb::exec_event::Event::Stderr(
                        format!("the command could not be started: {error}\n").into(),
                    ))))
                    .await;
                let _ = events
                    .send(Ok(event(pb::exec_event::Event::Result(pb::ExecResult {
                        exit_code: -1,
                        duration_ms: 0,
                        ..Default::default()
                    }))))
                    .await;
                return Ok(Response::new(ReceiverStream::new(receiver)));
            }
        };
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let ended = session.ended.clone();
        let command_cgroup = command.cgroup.take();
        drop(command);
        // One task per command: its output pumps and its wait are polled together, so the
        // end of the command reaches the caller without hand-offs between tasks.
        plinth_kit::tasks::spawn(async move {
            let out = pump(stdout, events.clone(), limit, true);
            let err = pump(stderr, events.clone(), limit, false);
            tokio::pin!(out, err);
            let (mut out_done, mut err_done) = (None, None);
            let group = child.pid();
            let kill_group = || {
                let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
            };
            // The command's whole tree: its group, and in its cgroup what left the group.
            let kill_all = || {
                kill_group();
                if let Some(cgroup) = &command_cgroup {
                    let _ = cgroup.kill_all();
                }
            };
            let mut timed_out = false;
            let deadline = tokio::time::sleep(timeout);
            tokio::pin!(deadline);
            let status = loop {
                tokio::select! {
                    status = child.wait() => break status.ok(),
                    dropped = &mut out, if out_done.is_none() => out_done = Some(dropped),
                    dropped = &mut err, if err_done.is_none() => err_done = Some(dropped),
                    () = &mut deadline => {
                        timed_out = true;
                        kill_all();
                        break child.wait().await.ok();
                    }
                    () = ended.cancelled() => {
                        kill_group();
                        break child.wait().await.ok();
                    }
                    // The caller is gone (its call was cancelled, its deadline passed, or
                    // its connection dropped): nobody will read the result, so the command
                    // goes, as a terminal nobody watches is hung up.
                    () = events.closed() => {
                        kill_all();
                        break child.wait().await.ok();
                    }
                }
            };
            // What the command left running in its group goes with it: a turn ends when its
            // command does, and nothing holds the output pipes open after. What escaped the
            // group and still holds a pipe gets two seconds.
            kill_group();
            let drain = tokio::time::sleep(Duration::from_secs(2));
            tokio::pin!(drain);
            while out_done.is_none() || err_done.is_none() {
                tokio::select! {
                    dropped = &mut out, if out_done.is_none() => out_done = Some(dropped),
                    dropped = &mut err, if err_done.is_none() => err_done = Some(dropped),
                    () = &mut drain => break,
                }
            }
            let result = pb::ExecResult {
                stdout_dropped_bytes: out_done.unwrap_or(0),
                stderr_dropped_bytes: err_done.unwrap_or(0),
                ..exec_result(
                    status,
                    started,
                    timed_out,
                    command_cgroup.as_ref(),
                    oom_before,
                    namespace.as_deref(),
                )
            };
            let _ = events
                .send(Ok(event(pb::exec_event::Event::Result(result))))
                .await;
            // A group its processes left is removed; one a daemon still holds stays until the
            // session ends.
            if let Some(cgroup) = command_cgroup {
                let _ = tokio::task::spawn_blocking(move || cgroup.remove()).await;
            }
        });
        Ok(Response::new(ReceiverStream::new(receiver)))
    }

    type PtyStream = crate::pty::PtyStream;

    #[tracing::instrument(name = "node.pty", skip_all)]
    async fn pty(
        &self,
        request: Request<tonic::Streaming<pb::PtyRequest>>,
    ) -> Result<Response<Self::PtyStream>, Status> {
        Ok(Response::new(Node::pty(self, request.into_inner()).await?))
    }

    #[tracing::instrument(name = "node.read_file", skip_all)]
    async fn read_file(
        &self,
        request: Request<pb::ReadFileRequest>,
    ) -> Result<Response<pb::ReadFileResponse>, Status> {
        let request = request.into_inner();
        let session = self.session(&request.session_id)?;
        let max = self.limits.max_file_bytes;
        // A hard link in the working directory is read only if the session owns its file.
        let owner = self.isolation.enabled.then_some(session.record.uid);
        let content = tokio::task::spawn_blocking(move || {
            workdir::read(&session.workdir, &request.path, max, owner)
        })
        .await
        .map_err(|error| PlinthError::internal(&error))??;
        Ok(Response::new(pb::ReadFileResponse {
            content: content.into(),
        }))
    }

    #[tracing::instrument(name = "node.write_file", skip_all)]
    async fn write_file(
        &self,
        request: Request<pb::WriteFileRequest>,
    ) -> Result<Response<pb::WriteFileResponse>, Status> {
        let request = request.into_inner();
        let session = self.session(&request.session_id)?;
        if request.content.len() as u64 > self.limits.max_file_bytes {
            return Err(PlinthError::new(
                ErrorCode::FileTooLarge,
                format!(
                    "the file is {} bytes; at most {} can be written",
                    request.content.len(),
                    self.limits.max_file_bytes
                ),
            )
            .with_detail(serde_json::json!({ "max_bytes": self.limits.max_file_bytes }))
            .into());
        }
        let uid = if self.isolation.enabled {
            session.record.uid
        } else {
            rustix::process::getuid().as_raw()
        };
        let size = tokio::task::spawn_blocking(move || {
            workdir::write(&session.workdir, &request.path, &request.content, uid)
        })
        .await
        .map_err(|error| PlinthError::internal(&error))??;
        Ok(Response::new(pb::WriteFileResponse { size }))
    }

    #[tracing::instrument(name = "node.delete_file", skip_all)]
    async fn delete_file(
        &self,
        request: Request<pb::DeleteFileRequest>,
    ) -> Result<Response<pb::DeleteFileResponse>, Status> {
        let request = request.into_inner();
        let session = self.session(&request.session_id)?;
        tokio::task::spawn_blocking(move || workdir::delete(&session.workdir, &request.path))
            .await
            .map_err(|error| PlinthError::internal(&error))??;
        Ok(Response::new(pb::DeleteFileResponse {}))
    }

    #[tracing::instrument(name = "node.materialize", skip_all)]
    async fn materialize(
        &self,
        request: Request<pb::MaterializeRequest>,
    ) -> Result<Response<pb::MaterializeResponse>, Status> {
        let request = request.into_inner();
        let materialized = self
            .cache
            .materialize(
                &request.environment_id,
                request.version,
                &request.layer_tree,
            )
            .await
            .map_err(cache_error)?;
        Ok(Response::new(pb::MaterializeResponse {
            materialize_ms: if materialized.fetched > 0
                || materialized.took > Duration::from_millis(1)
            {
                u64::try_from(materialized.took.as_millis()).unwrap_or(u64::MAX)
            } else {
                0
            },
            blobs_fetched: materialized.fetched,
        }))
    }
}

fn event(event: pb::exec_event::Event) -> pb::ExecEvent {
    pb::ExecEvent { event: Some(event) }
}

/// Forwards a pipe's bytes as events until `limit` bytes were sent; answers how many more
/// the command wrote (read and dropped, so it never blocks on a full pipe).
async fn pump<R: tokio::io::AsyncRead + Unpin>(
    pipe: Option<R>,
    events: mpsc::Sender<Result<pb::ExecEvent, Status>>,
    limit: u64,
    stdout: bool,
) -> u64 {
    let Some(mut pipe) = pipe else { return 0 };
    // Small: a command usually writes little, and hundreds may run at once.
    let mut buffer = vec![0u8; 16 * 1024];
    let (mut sent, mut dropped) = (0u64, 0u64);
    loop {
        let read = match pipe.read(&mut buffer).await {
            Ok(0) | Err(_) => return dropped,
            Ok(read) => read,
        };
        let keep = usize::try_from(limit.saturating_sub(sent))
            .unwrap_or(usize::MAX)
            .min(read);
        dropped += (read - keep) as u64;
        if keep == 0 {
            continue;
        }
        sent += keep as u64;
        let chunk = bytes::Bytes::copy_from_slice(&buffer[..keep]);
        let kind = if stdout {
            pb::exec_event::Event::Stdout(chunk)
        } else {
            pb::exec_event::Event::Stderr(chunk)
        };
        if events.send(Ok(event(kind))).await.is_err() {
            // The caller went away; keep draining so the command is not blocked.
            continue;
        }
    }
}
