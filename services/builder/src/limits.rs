//! A build's bounds: memory, processes and CPU for the whole build in a cgroup of its own
//! (the sessions' cgroup code, [`plinth_sandbox::cgroup`], v1 or v2), and wall time for the
//! whole build, and disk for what it writes on its scope's disk ([`crate::scope_disk`]). A
//! build over a bound fails with a reason that names it and the setting that sets it
//! (`builder.limits.*`); the builder and other builds go on.
//!
//! Every command of a build joins the build's group first thing in the process the builder
//! forks (before namespaces and privileges), so everything the build runs, `setsid` daemons
//! included, is charged to it: anonymous memory, its `/tmp` and the page cache of what it
//! writes, its `/dev/shm`, its processes and threads. The builder itself stays outside. When
//! the build ends, whatever is left in the group is killed and the group removed.

use std::sync::Arc;
use std::time::Duration;

use plinth_sandbox::cgroup::{CgroupError, Cgroups, Limits, SessionCgroup};

/// Setting names, as the configuration spells them, for reasons.
pub const MEMORY_SETTING: &str = "builder.limits.memory_mb";
pub const PIDS_SETTING: &str = "builder.limits.pids";
pub const WALL_SETTING: &str = "builder.limits.wall_seconds";
pub const DISK_SETTING: &str = "builder.limits.disk_mb";

/// Why builds cannot be bounded in cgroups here, or one build's group could not be made.
#[derive(Debug, thiserror::Error)]
pub enum LimitsError {
    /// The cgroups refused: no hierarchy to make build groups in ([`detect`]), or the groups
    /// there could not be listed ([`remove_leftovers`]).
    #[error("{0}")]
    Cgroups(CgroupError),
    /// A build's own group could not be made.
    #[error("making the build's cgroup: {0}")]
    Create(CgroupError),
    /// The blocking task that makes or looks for groups ended without an answer (it panicked,
    /// or the runtime is shutting down).
    #[error("{0}")]
    Task(tokio::task::JoinError),
}

/// A build's bounds; `None` leaves one unbounded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BuildLimits {
    /// Memory for the whole build (page cache and tmpfs included; no swap), in MiB.
    pub memory_mb: Option<u64>,
    /// Processes and threads at once.
    pub pids: Option<u64>,
    /// CPU time per wall time, in thousandths of a core.
    pub cpu_millicores: Option<u64>,
    /// Wall time for all of the build's commands together.
    pub wall: Option<Duration>,
    /// Disk for everything the builds of one scope can write (their scratch directories with
    /// the project, `.venv`, `node_modules` and download cache, their HOME and `/tmp`) and
    /// what the builder keeps for the scope between builds, in MiB: the worker puts them on
    /// an ext4 image of this size per scope ([`crate::scope_disk`]).
    pub disk_mb: Option<u64>,
}

impl BuildLimits {
    /// The bounds a cgroup holds, if any.
    pub fn cgroup_limits(&self) -> Option<Limits> {
        let limits = Limits {
            memory_bytes: self.memory_mb.map(|mb| mb.saturating_mul(1024 * 1024)),
            pids: self.pids,
            cpu_millicores: self.cpu_millicores,
        };
        (limits != Limits::default()).then_some(limits)
    }

    pub(crate) fn memory_reason(&self) -> String {
        format!(
            "the build used more than its {} MiB memory limit ({MEMORY_SETTING}) and was killed",
            self.memory_mb.unwrap_or_default()
        )
    }

    pub(crate) fn pids_reason(&self) -> String {
        format!(
            "the build tried to run more than its {} processes at once ({PIDS_SETTING})",
            self.pids.unwrap_or_default()
        )
    }

    pub(crate) fn disk_reason(&self) -> String {
        format!(
            "the build used more than its {} MiB disk limit ({DISK_SETTING}), which its \
             scope's download cache and kept dependencies share: they are dropped before the \
             scope's next build",
            self.disk_mb.unwrap_or_default()
        )
    }

    pub(crate) fn wall_reason(&self) -> String {
        format!(
            "the build ran past its time limit of {} s ({WALL_SETTING}) and was killed",
            self.wall.unwrap_or_default().as_secs()
        )
    }
}

/// The cgroup of one build, removed (with anything left in it) when the build is over.
pub(crate) struct BuildCgroup {
    pub(crate) group: Arc<SessionCgroup>,
    cgroups: Arc<Cgroups>,
    /// OOM kills and process-limit hits seen so far (the counts are the group's whole life).
    seen: std::sync::Mutex<(u64, u64)>,
    /// [`BuildCgroup::finish`] took care of the group.
    finished: bool,
}

/// Which bound a command ran into, if one did.
pub(crate) enum Hit {
    Memory,
    Pids,
}

impl BuildCgroup {
    /// Makes the group of a new build in `cgroups` with `limits`.
    pub(crate) async fn create(
        cgroups: Arc<Cgroups>,
        limits: Limits,
    ) -> Result<BuildCgroup, LimitsError> {
        let name = format!("build-{}", uuid::Uuid::new_v4().simple());
        let made = {
            let cgroups = cgroups.clone();
            tokio::task::spawn_blocking(move || cgroups.create(&name, &limits))
                .await
                .map_err(LimitsError::Task)?
        };
        let group = made.map_err(LimitsError::Create)?;
        Ok(BuildCgroup {
            group: Arc::new(group),
            cgroups,
            seen: std::sync::Mutex::new((0, 0)),
            finished: false,
        })
    }

    /// Whether the command that just ended ran into a bound: an OOM kill (whatever the
    /// command's status: something of the build was killed), or a refused fork when it
    /// failed.
    pub(crate) fn hit(&self, failed: bool) -> Option<Hit> {
        let oom = self.group.oom_kills().unwrap_or(0);
        let pids = pids_limit_hits(&self.group);
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (oom_before, pids_before) = std::mem::replace(&mut *seen, (oom, pids));
        if oom > oom_before {
            Some(Hit::Memory)
        } else if failed && pids > pids_before {
            Some(Hit::Pids)
        } else {
            None
        }
    }

    /// Kills whatever is left in the group and removes it.
    pub(crate) async fn finish(mut self) {
        self.finished = true;
        let name = self.group.name().to_owned();
        let cgroups = self.cgroups.clone();
        let removed = tokio::task::spawn_blocking(move || cgroups.destroy(&name)).await;
        if let Ok(Err(error)) = removed {
            tracing::warn!(%error, "could not remove a build's cgroup");
        }
    }
}

/// How many times a fork in `group` failed because it was at `pids.max`: the `max` count of
/// `pids.events` (v1 and v2) in the group's directory of whichever hierarchy has one, found
/// through the group's join descriptors. Zero when the kernel keeps no such count.
fn pids_limit_hits(group: &SessionCgroup) -> u64 {
    use std::os::fd::AsRawFd;
    group
        .join_fds()
        .iter()
        .filter_map(|fd| std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok())
        .filter_map(|joined| std::fs::read_to_string(joined.parent()?.join("pids.events")).ok())
        .find_map(|events| {
            events.lines().find_map(|line| {
                let (name, value) = line.split_once(' ')?;
                (name == "max").then(|| value.trim().parse().ok()).flatten()
            })
        })
        .unwrap_or(0)
}

impl Drop for BuildCgroup {
    /// A build abandoned midway (its future dropped) still has its group emptied and removed,
    /// off the runtime.
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let (name, cgroups) = (self.group.name().to_owned(), self.cgroups.clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn_blocking(move || {
                if let Err(error) = cgroups.destroy(&name) {
                    tracing::warn!(%error, "could not remove an abandoned build's cgroup");
                }
            });
        }
    }
}

/// The cgroups of the builds run in `work_dir`: Plinth's group for them (named after the
/// work directory) below the builder's own cgroup, v1 or v2 as sessions'.
pub fn detect(work_dir: &std::path::Path) -> Result<Cgroups, LimitsError> {
    let digest = plinth_blobs::Digest::of(work_dir.as_os_str().as_encoded_bytes()).to_hex();
    let cgroups =
        Cgroups::detect(&format!("plinth-build-{}", &digest[..8])).map_err(LimitsError::Cgroups)?;
    tracing::info!(cgroups = %cgroups.describe(), "build limits on cgroups");
    Ok(cgroups)
}

/// Removes every build group a killed builder of `work_dir` left (call it once, before any
/// builder of the work directory starts, as the scratch directories' leftovers are removed).
pub fn remove_leftovers(work_dir: &std::path::Path) -> Result<usize, LimitsError> {
    let cgroups = detect(work_dir)?;
    let names = cgroups.list().map_err(LimitsError::Cgroups)?;
    let mut removed = 0;
    for name in names.into_iter().filter(|name| name.starts_with("build-")) {
        match cgroups.destroy(&name) {
            Ok(()) => removed += 1,
            Err(error) => {
                tracing::warn!(%error, group = %name, "could not remove a build cgroup left from before");
            }
        }
    }
    Ok(removed)
}
