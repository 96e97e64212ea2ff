//! The node's state and what it does with it: its version cache, its session table and how
//! sessions are isolated, and commands prepared and run inside a session's sandbox. The gRPC
//! services (`grpc`, `pty`) are thin layers over this.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use plinth_kit::{ErrorCode, PlinthError};
use plinth_proto::node::v1 as pb;

use crate::cache::{CacheError, Materialized, VersionCache};
use crate::isolation::{self, Isolation, Launch, Namespaces};
use crate::sessions::{LocalSession, SessionError, SessionLimits, SessionRecord, SessionTable};

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
    pub(crate) edits: EditLocks,
}

pub(crate) fn cache_error(error: CacheError) -> PlinthError {
    match error {
        CacheError::BadTree { .. } => PlinthError::invalid(error.to_string()),
        other => PlinthError::new(
            ErrorCode::Unavailable,
            format!("materializing the version failed: {other}"),
        ),
    }
}

pub(crate) fn session_error(error: SessionError) -> PlinthError {
    match error {
        SessionError::InvalidId(_) => PlinthError::invalid(error.to_string()),
        SessionError::Full | SessionError::NoDiskLimits => {
            PlinthError::new(ErrorCode::Unavailable, error.to_string())
        }
        other => PlinthError::internal(&other),
    }
}

/// Starts a session's sandbox on the namespace thread: its cgroup (made again if a crashed
/// node left it), then its keeper in it.
pub(crate) fn isolate(
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
    // A lazily served version: a mount of its own for this session, on the host only until
    // the session's namespace has bound it.
    let mount =
        match &version.lazy {
            Some(lazy) => Some(lazy.mount_for_session().map_err(|error| {
                unavailable(format!("the session's view of its version: {error}"))
            })?),
            None => None,
        };
    let plan = isolation
        .namespace_plan(
            mount
                .as_ref()
                .map_or(version.path.as_path(), |mount| mount.path()),
            &version.lower,
            &record.slug,
            workdir,
            identity.as_ref(),
            limits.memory_bytes,
        )
        .map_err(|error| PlinthError::invalid(error.to_string()))?;
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
    if let Some(mount) = &mount {
        mount.detach();
    }
    // Its commands join groups of their own below it, with descriptors of their own.
    let mut cgroup = cgroup;
    if let Some(cgroup) = cgroup.as_mut() {
        cgroup.release_join_fds();
    }
    let share = cgroup
        .as_ref()
        .and_then(plinth_sandbox::cgroup::SessionCgroup::cpu_weight)
        .map(|weight| {
            isolation
                .shares
                .join(&record.scope, &record.session_id, weight)
        });
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
        share: std::sync::Mutex::new(share),
        version: mount,
    })
}

/// Serves the egress proxy inside the sandbox's network namespace, when sessions have one;
/// answers where commands find it.
pub(crate) fn start_proxy(
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
    plinth_kit::tasks::spawn(async move {
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
pub(crate) fn limits_from_wire(limits: plinth_proto::catalog::v1::SessionLimits) -> SessionLimits {
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
pub(crate) fn lost(id: &str) -> PlinthError {
    PlinthError::session_lost(id)
}

/// A command prepared by [`Node::prepare`], not started yet.
pub(crate) struct Prepared {
    pub(crate) session: Arc<LocalSession>,
    pub(crate) command: crate::spawn::Command,
    pub(crate) namespace: Option<Arc<isolation::Sandbox>>,
    /// The session's OOM kills before the command, to tell whether it was one.
    pub(crate) oom_before: Option<u64>,
}

impl Node {
    pub(crate) fn session(&self, id: &str) -> Result<Arc<LocalSession>, PlinthError> {
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

    /// A command of the session, ready to start exactly as every command of it starts (`Exec`
    /// and `Pty` alike): checked, in the session's sandbox and a cgroup of its own below the
    /// session's, as the session's uid, with the session's environment and `cwd` rules.
    pub(crate) async fn prepare(
        &self,
        spec: &pb::SessionSpec,
        command_line: String,
        cwd: &str,
        env: std::collections::HashMap<String, String>,
    ) -> Result<Prepared, PlinthError> {
        let session = self.session(&spec.session_id)?;
        if command_line.contains('\0') {
            return Err(PlinthError::invalid("the command contains a NUL byte"));
        }
        let mut extra = Vec::with_capacity(env.len());
        for (name, value) in env {
            if !isolation::valid_env_name(&name) || !isolation::valid_env_value(&value) {
                return Err(PlinthError::invalid(format!(
                    "environment variable {name:?}: names are letters, digits and _, not starting with a digit; values hold no NUL"
                )));
            }
            extra.push((name, value));
        }
        let cwd = self.cwd(&session, cwd)?;
        let version = self
            .cache
            .open_version(
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
        if namespace.is_none() {
            // No sandbox to end: what the command leaves running is found by the session's id
            // when the session ends.
            session
                .unisolated
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
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
        // out takes its whole tree with it, daemons included, and what a command that ended
        // left running stays counted in its session's limits.
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
            command: command_line,
        };
        let command = self
            .isolation
            .command(&launch, namespace.clone(), command_cgroup)
            .map_err(|error| PlinthError::invalid(error.to_string()))?;
        Ok(Prepared {
            session,
            command,
            namespace,
            oom_before,
        })
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
        let mount = PathBuf::from(plinth_kit::slug::mount(&session.record.slug));
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
pub(crate) fn next_command() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// A `cwd` the command could not change to, like every other bad `cwd`: the request's fault,
/// refused before it runs.
pub(crate) fn cwd_refused(error: &crate::spawn::SpawnError, cwd: &str) -> PlinthError {
    let why = error
        .cwd_failure()
        .map(ToString::to_string)
        .unwrap_or_default();
    PlinthError::invalid(format!("cwd {cwd:?}: {why} (as the session sees it)"))
}

/// How a command ended, as `Exec` and `Pty` answer it: its exit code (-1 when its end was not
/// seen), wall time since `started`, whether it hit its time limit or was killed for the
/// session's memory limit. The dropped-output counts are the caller's to add.
pub(crate) fn exec_result(
    status: Option<i32>,
    started: std::time::Instant,
    timed_out: bool,
    command_cgroup: Option<&plinth_sandbox::cgroup::SessionCgroup>,
    oom_before: Option<u64>,
    namespace: Option<&isolation::Sandbox>,
) -> pb::ExecResult {
    let exit_code = status.unwrap_or(-1);
    pb::ExecResult {
        exit_code,
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        timed_out,
        oom_killed: oom_killed(exit_code, command_cgroup, oom_before, namespace),
        ..Default::default()
    }
}

/// Whether a command that ended with `exit_code` was killed for the session's memory limit.
fn oom_killed(
    exit_code: i32,
    command_cgroup: Option<&plinth_sandbox::cgroup::SessionCgroup>,
    oom_before: Option<u64>,
    namespace: Option<&isolation::Sandbox>,
) -> bool {
    // The kernel counts an OOM kill in the victim's own group (cgroup v1) or in every group
    // above it with memory accounting (v2): either tells.
    let in_command =
        command_cgroup.is_some_and(|cgroup| cgroup.oom_kills().is_ok_and(|kills| kills > 0));
    let in_session = match (
        oom_before,
        namespace.and_then(|sandbox| sandbox.cgroup.as_ref()),
    ) {
        (Some(before), Some(cgroup)) => cgroup.oom_kills().is_ok_and(|after| after > before),
        _ => false,
    };
    exit_code == 128 + 9 && (in_command || in_session)
}

/// One lock per session for workspace writes.
#[derive(Debug, Default)]
pub struct EditLocks(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl EditLocks {
    pub(crate) fn of(&self, session: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        locks.retain(|_, lock| Arc::strong_count(lock) > 1);
        locks.entry(session.to_owned()).or_default().clone()
    }
}
