//! The gRPC face of the node (`plinth.node.v1.NodeService`): requests are checked here, the
//! cache, the session table and the isolation module do the work.
//!
//! A command's end (`Exec`), as at a terminal's prompt: its turn ends when its shell exits,
//! and what it started in the background (`server &`, daemons) keeps running in the command's
//! cgroup below the session's (so within the session's limits) until the session ends, which
//! ends all of it (its keeper's PID namespace, or, without isolation,
//! [`crate::sessions::end_unisolated`]). Its answer is what it wrote until then: once the
//! shell has exited, each pipe gives what it holds at that moment and no more ([`pump`]), so a
//! background process still holding the pipes cannot hold the answer, and what such processes
//! write later is read and dropped until they close the pipes or the session ends
//! ([`drain_left`]). A command stopped before its end is stopped whole: past its time limit,
//! or when its caller goes, its cgroup is killed, whatever it started in the background
//! included (what earlier commands started is in their own cgroups, untouched); it still
//! answers, `timed_out` or `-1`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use plinth_kit::tasks::CancellationToken;
use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::node::v1 as pb;
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
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
            .open_version(&spec.environment_id, spec.version, &spec.layer_tree)
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
        // Standard input given: a pipe the command reads, written below.
        let stdin = if request.stdin.is_empty() {
            None
        } else {
            let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
                .map_err(|errno| PlinthError::internal(&std::io::Error::from(errno)))?;
            command.stdin = Some(read);
            Some(write)
        };
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
        // The command holds its own copy of the read end now.
        drop(command);
        if let Some(write) = stdin {
            plinth_kit::tasks::spawn(feed_stdin(write, request.stdin, ended.clone()));
        }
        // One task per command: its output pumps and its wait are polled together, so the
        // end of the command reaches the caller without hand-offs between tasks.
        plinth_kit::tasks::spawn(async move {
            // Cancelled once the command has exited: its output is what its pipes hold then.
            let exited = CancellationToken::new();
            let out = pump(stdout, Forward::new(&events, limit, true), exited.clone());
            let err = pump(stderr, Forward::new(&events, limit, false), exited.clone());
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
                    // Its end, as at a terminal's prompt: what it started in the background
                    // (`server &`, daemons) runs on, in its cgroup, until the session ends.
                    status = child.wait() => break status.ok(),
                    pumped = &mut out, if out_done.is_none() => out_done = Some(pumped),
                    pumped = &mut err, if err_done.is_none() => err_done = Some(pumped),
                    // Stopped before its end, it is stopped whole: what it started, in the
                    // background or not, was part of what did not finish.
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
            // The answer is what it wrote until it exited, however long what it left running
            // holds the pipes open.
            exited.cancel();
            let (out_dropped, out_left) = match out_done {
                Some(pumped) => pumped,
                None => out.await,
            };
            let (err_dropped, err_left) = match err_done {
                Some(pumped) => pumped,
                None => err.await,
            };
            let result = pb::ExecResult {
                stdout_dropped_bytes: out_dropped,
                stderr_dropped_bytes: err_dropped,
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
            // The last sender: the caller's stream ends with the result.
            drop(events);
            if out_left.is_some() || err_left.is_some() {
                plinth_kit::tasks::spawn(drain_left([out_left, err_left], ended));
            }
            // A group its processes left is removed; one that what the command left running
            // still holds stays until the session ends.
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

/// One of a command's output streams as its caller gets it: events, until `limit` bytes were
/// sent; what passes the limit is read and counted, never sent.
struct Forward {
    events: mpsc::Sender<Result<pb::ExecEvent, Status>>,
    limit: u64,
    sent: u64,
    dropped: u64,
    stdout: bool,
}

impl Forward {
    fn new(events: &mpsc::Sender<Result<pb::ExecEvent, Status>>, limit: u64, stdout: bool) -> Self {
        Forward {
            events: events.clone(),
            limit,
            sent: 0,
            dropped: 0,
            stdout,
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        let keep = usize::try_from(self.limit.saturating_sub(self.sent))
            .unwrap_or(usize::MAX)
            .min(bytes.len());
        self.dropped += (bytes.len() - keep) as u64;
        if keep == 0 {
            return;
        }
        self.sent += keep as u64;
        let chunk = bytes::Bytes::copy_from_slice(&bytes[..keep]);
        let kind = if self.stdout {
            pb::exec_event::Event::Stdout(chunk)
        } else {
            pb::exec_event::Event::Stderr(chunk)
        };
        // A caller that went away gets nothing more; the pipe is still read, so the command
        // is not blocked.
        let _ = self.events.send(Ok(event(kind))).await;
    }
}

/// How long output is gathered after its first bytes before it goes out as one event.
const COALESCE: Duration = Duration::from_millis(5);

/// Forwards what a command writes to one of its pipes until the command has `exited`, then
/// what the pipe holds at that moment (`FIONREAD`: everything the command wrote before it
/// exited, and nothing written after that moment). Answers how many bytes passed the limit,
/// and the pipe when it is still open: processes the command left running in the background
/// hold their copies of it.
async fn pump(
    pipe: Option<pipe::Receiver>,
    mut forward: Forward,
    exited: CancellationToken,
) -> (u64, Option<pipe::Receiver>) {
    let Some(mut pipe) = pipe else {
        return (0, None);
    };
    // Small: a command usually writes little, and hundreds may run at once.
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let read = tokio::select! {
            // First, so a background writer that never stops cannot hold the answer.
            biased;
            () = exited.cancelled() => break,
            read = pipe.read(&mut buffer) => read,
        };
        let mut filled = match read {
            Ok(0) | Err(_) => return (forward.dropped, None),
            Ok(read) => read,
        };
        // Writes that come together go out together: a program that writes a line in pieces
        // (Python's unbuffered `print` writes each argument apart) gives one event, not one
        // a piece. The wait is a few milliseconds, once an event.
        let until = tokio::time::Instant::now() + COALESCE;
        let mut closed = false;
        while filled < buffer.len() {
            tokio::select! {
                biased;
                () = exited.cancelled() => break,
                () = tokio::time::sleep_until(until) => break,
                more = pipe.read(&mut buffer[filled..]) => match more {
                    Ok(0) | Err(_) => {
                        closed = true;
                        break;
                    }
                    Ok(more) => filled += more,
                },
            }
        }
        forward.send(&buffer[..filled]).await;
        if closed {
            return (forward.dropped, None);
        }
    }
    // The pipe is non-blocking (tokio made it so): these reads never wait.
    let mut pending = rustix::io::ioctl_fionread(&pipe).unwrap_or(0);
    while pending > 0 {
        let want = usize::try_from(pending)
            .unwrap_or(usize::MAX)
            .min(buffer.len());
        match rustix::io::read(&pipe, &mut buffer[..want]) {
            Ok(0) => return (forward.dropped, None),
            Ok(read) => {
                pending = pending.saturating_sub(read as u64);
                forward.send(&buffer[..read]).await;
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => break,
        }
    }
    // Every writer gone reads as the end; otherwise a process the command left running holds
    // it (what this read takes, if anything, was written after the command ended).
    match rustix::io::read(&pipe, &mut [0u8; 1][..]) {
        Ok(0) => (forward.dropped, None),
        _ => (forward.dropped, Some(pipe)),
    }
}

/// Reads and drops what processes a command left running write to the stdout and stderr
/// they inherited from it, until the last of them closes its copies or the session ends.
///
/// Nobody reads that output any more, as nobody reads a terminal's once its window is
/// closed, but a background server must go on as it would there: with the read end closed its
/// writes would fail (`EPIPE`, or death by `SIGPIPE`; Python's `http.server` logs every
/// request to stderr, and the request fails), and with it unread it would block once the
/// pipe's 64 KiB are full.
async fn drain_left(pipes: [Option<pipe::Receiver>; 2], ended: CancellationToken) {
    let drain = |pipe: Option<pipe::Receiver>| async move {
        let Some(mut pipe) = pipe else { return };
        let mut buffer = [0u8; 4096];
        while let Ok(read) = pipe.read(&mut buffer).await {
            if read == 0 {
                return;
            }
        }
    };
    let [out, err] = pipes;
    tokio::select! {
        _ = futures::future::join(drain(out), drain(err)) => {}
        () = ended.cancelled() => {}
    }
}

/// Writes a command's standard input and closes it (its end-of-file). It stops early when
/// nobody reads any more (the command and whatever it left running closed the pipe) or the
/// session ends, so a command that never reads its input holds no task.
async fn feed_stdin(
    write: std::os::fd::OwnedFd,
    bytes: bytes::Bytes,
    ended: plinth_kit::tasks::CancellationToken,
) {
    use tokio::io::AsyncWriteExt as _;
    let mut pipe = match tokio::net::unix::pipe::Sender::from_owned_fd(write) {
        Ok(pipe) => pipe,
        Err(error) => {
            tracing::warn!(%error, "a command's standard input could not be written");
            return;
        }
    };
    tokio::select! {
        written = pipe.write_all(&bytes) => {
            if let Err(error) = written {
                tracing::debug!(%error, "a command's standard input was not read whole");
            }
        }
        () = ended.cancelled() => {}
    }
}
