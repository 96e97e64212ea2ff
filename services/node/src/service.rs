//! The gRPC face of the node (`plinth.node.v1.NodeService`): requests are checked here, the
//! cache, the session table and the isolation module do the work.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::node::v1 as pb;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::cache::{CacheError, Materialized, VersionCache};
use crate::isolation::{self, ENV_ROOT, Isolation, Launch, Namespaces};
use crate::sessions::{LocalSession, SessionError, SessionLimits, SessionRecord, SessionTable};
use crate::workdir::{self, WorkdirError};

/// Limits of the node's calls.
#[derive(Debug, Clone)]
pub struct ExecLimits {
    /// A command's time limit when the caller names none.
    pub default_timeout: Duration,
    /// The longest time limit a caller may ask for.
    pub max_timeout: Duration,
    /// Bytes of each of stdout and stderr kept when the caller names no limit.
    pub default_output_bytes: u64,
    /// The most a caller may ask to keep.
    pub max_output_bytes: u64,
    /// Largest working-directory file read or written.
    pub max_file_bytes: u64,
    /// Bytes of workspace snapshots (what writes replaced, kept to undo them) each session
    /// keeps; the oldest past it are removed.
    pub workspace_snapshot_max_bytes: u64,
}

/// The node service.
pub struct Node {
    pub(crate) cache: Arc<VersionCache>,
    pub(crate) sessions: Arc<SessionTable>,
    pub(crate) isolation: Isolation,
    /// Makes sessions' mount namespaces (isolated nodes only).
    pub(crate) namespaces: Option<Namespaces>,
    pub(crate) limits: ExecLimits,
    pub(crate) edits: crate::workspace_service::EditLocks,
}

fn cache_error(error: CacheError) -> PlinthError {
    match error {
        CacheError::BadTree { .. } => PlinthError::invalid(error.to_string()),
        other => PlinthError::new(
            ErrorCode::Unavailable,
            format!("materializing the version failed: {other}"),
        ),
    }
}

fn session_error(error: SessionError) -> PlinthError {
    match error {
        SessionError::InvalidId(_) => PlinthError::invalid(error.to_string()),
        SessionError::Full | SessionError::NoDiskLimits => {
            PlinthError::new(ErrorCode::Unavailable, error.to_string())
        }
        other => PlinthError::internal(&other),
    }
}

fn workdir_error(error: WorkdirError) -> PlinthError {
    match &error {
        WorkdirError::NotFound(path) => PlinthError::new(
            ErrorCode::NotFound,
            format!("{path:?} does not exist in the session's working directory"),
        ),
        WorkdirError::TooLarge { max, .. } => {
            PlinthError::new(ErrorCode::FileTooLarge, error.to_string())
                .with_detail(serde_json::json!({ "max_bytes": max }))
        }
        WorkdirError::Io { .. } => PlinthError::internal(&error),
        WorkdirError::InvalidPath { .. } | WorkdirError::Conflict { .. } => {
            PlinthError::invalid(error.to_string())
        }
    }
}

/// Starts a session's sandbox on the namespace thread: its cgroup (made again if a crashed
/// node left it), then its keeper in it.
fn isolate(
    thread: &isolation::NamespaceThread,
    isolation: &Isolation,
    version: &Materialized,
    record: &SessionRecord,
    workdir: &Path,
) -> Result<isolation::Sandbox, PlinthError> {
    let unavailable = |error: String| {
        tracing::error!(session = %record.session_id, %error, "cannot isolate a session");
        PlinthError::new(ErrorCode::Unavailable, error)
    };
    let begun = Instant::now();
    // Its name, beside its record (written again after a restart: the host's may have
    // changed). Without it the session still runs, nameless.
    let identity = workdir
        .parent()
        .ok_or_else(|| std::io::Error::other("the working directory has no parent"))
        .and_then(|dir| crate::identity::write(dir, record.uid, isolation::WORKDIR))
        .unwrap_or_else(|error| {
            tracing::warn!(session = %record.session_id, %error, "cannot name the session's uid; whoami will fail in it");
            None
        });
    let plan = isolation
        .namespace_plan(
            &version.path,
            &version.lower,
            &record.slug,
            workdir,
            identity.as_ref(),
        )
        .map_err(|error| PlinthError::invalid(error.to_string()))?;
    // The session's own limits; the node's defaults for a record that has none.
    let given = &record.limits;
    let limits =
        if given.memory_mb.is_none() && given.pids.is_none() && given.cpu_millicores.is_none() {
            isolation.limits
        } else {
            plinth_sandbox::cgroup::Limits {
                memory_bytes: given.memory_mb.map(|mb| mb.saturating_mul(1024 * 1024)),
                pids: given.pids,
                cpu_millicores: given.cpu_millicores,
            }
        };
    let planned = begun.elapsed();
    let cgroup = match &isolation.cgroups {
        Some(cgroups) => {
            let made = match cgroups.create(&record.session_id, &limits) {
                Err(plinth_sandbox::cgroup::CgroupError::Exists { .. }) => {
                    // Left by a node that died: nothing of it runs any more.
                    let _ = cgroups.destroy(&record.session_id);
                    cgroups.create(&record.session_id, &limits)
                }
                other => other,
            };
            Some(made.map_err(|error| unavailable(format!("the session's cgroup: {error}")))?)
        }
        None => None,
    };
    let grouped = begun.elapsed();
    let network =
        match &isolation.networks {
            Some(networks) => Some(networks.take().map_err(|error| {
                unavailable(format!("the session's network namespace: {error}"))
            })?),
            None => None,
        };
    // The keeper joins the session's group, so the session's cgroup namespace is rooted
    // there. A move into a cgroup waits for the kernel's migration lock to change mode (an
    // RCU grace period: 5-15 ms here unless another move happened just before); the first
    // command's move right after it is then cheap.
    let keeper = thread
        .make(
            &plan,
            cgroup.as_ref(),
            network
                .as_ref()
                .map(|network| std::os::fd::AsFd::as_fd(&network.namespace)),
        )
        .map_err(|error| unavailable(error.to_string()))?;
    let listener = network.and_then(|network| network.listener);
    tracing::debug!(
        session = %record.session_id,
        plan_us = planned.as_micros() as u64,
        cgroup_us = (grouped - planned).as_micros() as u64,
        keeper_us = (begun.elapsed() - grouped).as_micros() as u64,
        "sandbox made"
    );
    Ok(isolation::Sandbox {
        keeper,
        cgroup,
        proxy: None,
        listener,
        stop_proxy: plinth_kit::tasks::CancellationToken::new(),
    })
}

/// Serves the egress proxy inside the sandbox's network namespace, when sessions have one;
/// answers where commands find it.
fn start_proxy(
    isolation: &Isolation,
    sandbox: &mut isolation::Sandbox,
    session_id: &str,
) -> Result<(), PlinthError> {
    let Some(policy) = &isolation.egress else {
        return Ok(());
    };
    let unavailable = |what: &str, error: std::io::Error| {
        tracing::error!(session = %session_id, %error, "cannot give a session its egress proxy");
        PlinthError::new(ErrorCode::Unavailable, format!("{what}: {error}"))
    };
    let address = plinth_sandbox::egress::DEFAULT_PROXY_ADDR;
    // The spare network namespace the keeper entered came with the listener bound in it;
    // one made now when it did not.
    let listener = match sandbox.listener.take() {
        Some(listener) => Ok(listener),
        None => rustix::fs::open(
            format!("/proc/{}/ns/net", sandbox.keeper.pid().as_raw_nonzero()),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(std::io::Error::from)
        .and_then(|netns| {
            plinth_sandbox::egress::listen_in(std::os::fd::AsFd::as_fd(&netns), address)
        }),
    };
    let listener = listener
        .and_then(|listener| {
            listener.set_nonblocking(true)?;
            tokio::net::TcpListener::from_std(listener)
        })
        .map_err(|error| unavailable("listening inside the session's network", error))?;
    let (policy, stop, label) = (
        policy.clone(),
        sandbox.stop_proxy.clone(),
        session_id.to_owned(),
    );
    tokio::spawn(async move {
        plinth_sandbox::egress::serve(
            listener,
            policy,
            Arc::new(plinth_sandbox::egress::SystemResolver),
            &label,
            stop,
        )
        .await;
    });
    sandbox.proxy = Some(address);
    Ok(())
}

/// Limits as sent (0 is no limit) as the record keeps them.
fn limits_from_wire(limits: pb::Limits) -> SessionLimits {
    let limit = |value: u64| (value > 0).then_some(value);
    SessionLimits {
        memory_mb: limit(limits.memory_mb),
        pids: limit(limits.pids),
        cpu_millicores: limit(limits.cpu_millicores),
        disk_mb: limit(limits.disk_mb),
        lifetime_ms: limit(limits.lifetime_ms),
        idle_ms: limit(limits.idle_ms),
    }
}

/// A session this node does not hold (never attached here, ended, or its directory lost).
fn lost(id: &str) -> PlinthError {
    PlinthError::new(
        ErrorCode::NotFound,
        format!("session {id:?} is not on this node: it ended, or its working directory was lost"),
    )
}

impl Node {
    fn session(&self, id: &str) -> Result<Arc<LocalSession>, PlinthError> {
        self.sessions.get(id).ok_or_else(|| lost(id))
    }

    /// Where the session's commands see its working directory: [`isolation::WORKDIR`] in its
    /// own namespace, or the host path when the node does not isolate.
    pub(crate) fn seen_workdir(&self, session: &LocalSession) -> PathBuf {
        if self.isolation.enabled {
            PathBuf::from(isolation::WORKDIR)
        } else {
            session.workdir.clone()
        }
    }

    /// The session's mount namespace, made the first time it is needed: when it attaches, or
    /// before its first command after a node restart. None when the node does not isolate.
    async fn namespace(
        &self,
        session: &LocalSession,
        version: &Materialized,
    ) -> Result<Option<Arc<isolation::Sandbox>>, PlinthError> {
        let Some(namespaces) = &self.namespaces else {
            return Ok(None);
        };
        let made = session
            .namespace
            .get_or_try_init(|| async {
                let (isolation, version) = (self.isolation.clone(), version.clone());
                let (record, workdir) = (session.record.clone(), session.workdir.clone());
                let mut sandbox = namespaces
                    .run(move |thread| isolate(thread, &isolation, &version, &record, &workdir))
                    .await
                    .map_err(|error| {
                        PlinthError::new(ErrorCode::Unavailable, error.to_string())
                    })??;
                start_proxy(&self.isolation, &mut sandbox, &session.record.session_id)?;
                Ok::<_, PlinthError>(Arc::new(sandbox))
            })
            .await?;
        Ok(Some(made.clone()))
    }

    /// Where a command starts, as the command sees it: the working directory, a path relative
    /// to it, or an absolute path beneath it or beneath the mount.
    fn cwd(&self, session: &LocalSession, cwd: &str) -> Result<PathBuf, PlinthError> {
        let workdir = self.seen_workdir(session);
        if cwd.is_empty() {
            return Ok(workdir);
        }
        let path = Path::new(cwd);
        if path
            .components()
            .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
            || cwd.contains('\0')
        {
            return Err(PlinthError::invalid(format!(
                "cwd {cwd:?} must not have . or .. components"
            )));
        }
        let mount = PathBuf::from(format!("{ENV_ROOT}/{}", session.record.slug));
        if path.is_absolute() {
            if path.starts_with(&workdir) || path.starts_with(&mount) {
                return Ok(path.to_owned());
            }
            return Err(PlinthError::invalid(format!(
                "cwd {cwd:?} must be beneath the working directory ({}) or the environment ({})",
                workdir.display(),
                mount.display()
            )));
        }
        Ok(workdir.join(path))
    }
}

/// Numbers commands' cgroups within this node's run.
fn next_command() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

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
        let session = self.session(&spec.session_id)?;
        if request.command.contains('\0') {
            return Err(PlinthError::invalid("the command contains a NUL byte").into());
        }
        let mut extra = Vec::with_capacity(request.env.len());
        for (name, value) in request.env {
            if !isolation::valid_env_name(&name) || !isolation::valid_env_value(&value) {
                return Err(PlinthError::invalid(format!(
                    "environment variable {name:?}: names are letters, digits and _, not starting with a digit; values hold no NUL"
                ))
                .into());
            }
            extra.push((name, value));
        }
        let cwd = self.cwd(&session, &request.cwd)?;
        let timeout = match request.timeout_ms {
            0 => self.limits.default_timeout,
            ms => Duration::from_millis(ms).min(self.limits.max_timeout),
        };
        let limit = match request.output_limit_bytes {
            0 => self.limits.default_output_bytes,
            bytes => bytes.min(self.limits.max_output_bytes),
        };
        let version = self
            .cache
            .materialize(
                &session.record.environment_id,
                session.record.version,
                &session.record.layer_tree,
            )
            .await
            .map_err(cache_error)?;
        let has_venv = version.has(".venv");
        let uv_project = has_venv && version.has("pyproject.toml");
        if !self.isolation.enabled
            && let Err(error) = isolation::link_unisolated(&session.record.slug, &version.path)
        {
            tracing::warn!(slug = %session.record.slug, %error, "cannot link /env/<slug> to the version without isolation; commands will not find it there");
        }
        let namespace = self.namespace(&session, &version).await?;
        let workdir = self.seen_workdir(&session);
        let tools = self.isolation.tools.as_ref().map(|host| {
            if self.isolation.enabled {
                Path::new(isolation::TOOLS)
            } else {
                host.as_path()
            }
        });
        let mut env = isolation::session_env(
            &isolation::SessionEnv {
                session_id: &session.record.session_id,
                slug: &session.record.slug,
                workdir: &workdir,
                has_venv,
                uv_project,
                tools,
                isolated: self.isolation.enabled,
            },
            &extra,
        );
        if let Some(proxy) = namespace.as_ref().and_then(|sandbox| sandbox.proxy) {
            env.retain(|(name, _)| !name.to_ascii_lowercase().ends_with("_proxy"));
            env.extend(plinth_sandbox::egress::proxy_env(proxy));
        }
        // Each command in a cgroup of its own below its session's, so a command that times
        // out takes its whole tree with it, daemons included.
        let session_cgroup = namespace
            .as_ref()
            .and_then(|sandbox| sandbox.cgroup.as_ref());
        let command_cgroup = match session_cgroup {
            Some(cgroup) => {
                let name = format!("cmd-{}", next_command());
                Some(cgroup.child(&name).map_err(|error| {
                    PlinthError::new(
                        ErrorCode::Unavailable,
                        format!("the command's cgroup: {error}"),
                    )
                })?)
            }
            None => None,
        };
        let oom_before = session_cgroup.and_then(|cgroup| cgroup.oom_kills().ok());
        let launch = Launch {
            uid: session.record.uid,
            cwd,
            env,
            command: request.command,
        };
        let mut command = self
            .isolation
            .command(&launch, namespace.clone(), command_cgroup)
            .map_err(|error| PlinthError::invalid(error.to_string()))?;
        let (events, receiver) = mpsc::channel::<Result<pb::ExecEvent, Status>>(32);
        let started = Instant::now();
        let child = crate::spawn::spawn(&command);
        let mut child = match child {
            Ok(child) => child,
            Err(error) if error.cwd_failure().is_some() => {
                // Like every other bad `cwd`: the request's fault, refused before it runs.
                let why = error
                    .cwd_failure()
                    .map(ToString::to_string)
                    .unwrap_or_default();
                return Err(PlinthError::invalid(format!(
                    "cwd {:?}: {why} (as the session sees it)",
                    request.cwd
                ))
                .into());
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
        tokio::spawn(async move {
            let out = pump(stdout, events.clone(), limit, true);
            let err = pump(stderr, events.clone(), limit, false);
            tokio::pin!(out, err);
            let (mut out_done, mut err_done) = (None, None);
            let group = child.pid();
            let kill_group = || {
                let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
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
                        kill_group();
                        if let Some(cgroup) = &command_cgroup {
                            let _ = cgroup.kill_all();
                        }
                        break child.wait().await.ok();
                    }
                    () = ended.cancelled() => {
                        kill_group();
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
            let exit_code = status.unwrap_or(-1);
            // The kernel counts an OOM kill in the victim's own group (cgroup v1) or in every
            // group above it with memory accounting (v2): either tells.
            let in_command = command_cgroup
                .as_ref()
                .is_some_and(|cgroup| cgroup.oom_kills().is_ok_and(|kills| kills > 0));
            let in_session = match (
                oom_before,
                namespace
                    .as_ref()
                    .and_then(|sandbox| sandbox.cgroup.as_ref()),
            ) {
                (Some(before), Some(cgroup)) => {
                    cgroup.oom_kills().is_ok_and(|after| after > before)
                }
                _ => false,
            };
            let oom_killed = exit_code == 128 + 9 && (in_command || in_session);
            let _ = events
                .send(Ok(event(pb::exec_event::Event::Result(pb::ExecResult {
                    exit_code,
                    duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                    timed_out,
                    stdout_dropped_bytes: out_done.unwrap_or(0),
                    stderr_dropped_bytes: err_done.unwrap_or(0),
                    oom_killed,
                }))))
                .await;
            // A group its processes left is removed; one a daemon still holds stays until the
            // session ends.
            if let Some(cgroup) = command_cgroup {
                let _ = tokio::task::spawn_blocking(move || cgroup.remove()).await;
            }
        });
        Ok(Response::new(ReceiverStream::new(receiver)))
    }

    #[tracing::instrument(name = "node.read_file", skip_all)]
    async fn read_file(
        &self,
        request: Request<pb::FileRequest>,
    ) -> Result<Response<pb::ReadFileResponse>, Status> {
        let request = request.into_inner();
        let session = self.session(&request.session_id)?;
        let max = self.limits.max_file_bytes;
        let content = tokio::task::spawn_blocking(move || {
            workdir::read(&session.workdir, &request.path, max)
        })
        .await
        .map_err(|error| PlinthError::internal(&error))?
        .map_err(workdir_error)?;
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
        .map_err(|error| PlinthError::internal(&error))?
        .map_err(workdir_error)?;
        Ok(Response::new(pb::WriteFileResponse { size }))
    }

    #[tracing::instrument(name = "node.delete_file", skip_all)]
    async fn delete_file(
        &self,
        request: Request<pb::FileRequest>,
    ) -> Result<Response<pb::DeleteFileResponse>, Status> {
        let request = request.into_inner();
        let session = self.session(&request.session_id)?;
        tokio::task::spawn_blocking(move || workdir::delete(&session.workdir, &request.path))
            .await
            .map_err(|error| PlinthError::internal(&error))?
            .map_err(workdir_error)?;
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
