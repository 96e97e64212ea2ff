//! Per-session resource limits: one cgroup per session, so a session that exhausts memory,
//! processes or CPU hurts only itself, and every process of a session can be found and killed
//! when it ends, however it detached itself (`setsid`, double forks, another PID namespace).
//!
//! This module owns the cgroup file system for the node: which hierarchy to use (`detect.rs`),
//! Plinth's parent group, session groups (made, limited, listed, killed, removed) and [`join`],
//! the write a new command makes between `clone` and `execve`, which allocates nothing. It
//! writes the kernel's files directly, with no cgroup library. Every call but [`join`] blocks
//! ([`SessionCgroup::kill_all`] up to 10 s): async callers use `spawn_blocking`. Nothing is
//! undone on `Drop`: a group stays until [`SessionCgroup::remove`], and a restarted node finds
//! leftovers with [`Cgroups::list`] and removes them with [`Cgroups::destroy`].
//!
//! What each limit sets in v1 and v2, and why joining is a write and not `clone3`:
//! `docs/design/SANDBOX.md#cgroups`.

mod detect;
mod v1;
mod v2;

#[cfg(test)]
mod tests;

use std::fs;
use std::io::{self, ErrorKind, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use rustix::process::{Pid, PidfdFlags, Signal};

/// The CPU quota's period: Kubernetes' and systemd's choice; short enough that a throttled
/// session still answers within a tenth of a second.
const CPU_PERIOD_US: u64 = 100_000;
/// The kernel's smallest quota per period.
const CPU_MIN_QUOTA_US: u64 = 1_000;
/// How long [`SessionCgroup::kill_all`] keeps at it before it reports survivors.
const KILL_PATIENCE: Duration = Duration::from_secs(10);
/// How long a freeze may take before signals are sent anyway: a process sleeping in the
/// kernel (NFS, FUSE) can keep a group freezing; SIGKILL still ends it once it wakes.
const FREEZE_PATIENCE: Duration = Duration::from_secs(1);
/// How often a state the kernel reaches on its own (frozen, empty) is looked at.
const POLL: Duration = Duration::from_millis(10);

/// A session's limits; `None` leaves that resource unlimited (up to the node's own limits:
/// session groups live below the node's cgroup).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// Memory, page cache and tmpfs pages included; swap is not allowed to extend it.
    pub memory_bytes: Option<u64>,
    /// Processes and threads at once.
    pub pids: Option<u64>,
    /// CPU time per wall time, in thousandths of a core (1000 = one core); below 10 it is
    /// 10, the kernel's smallest quota.
    pub cpu_millicores: Option<u64>,
}

impl Limits {
    fn check(&self) -> Result<(), CgroupError> {
        for (what, value) in [
            ("memory_bytes", self.memory_bytes),
            ("pids", self.pids),
            ("cpu_millicores", self.cpu_millicores),
        ] {
            if value == Some(0) {
                return Err(CgroupError::InvalidLimit { what, value: 0 });
            }
        }
        self.cpu_quota_us().map(drop)
    }

    /// The CPU quota per [`CPU_PERIOD_US`], in microseconds.
    fn cpu_quota_us(&self) -> Result<Option<u64>, CgroupError> {
        let Some(millicores) = self.cpu_millicores else {
            return Ok(None);
        };
        let quota =
            millicores
                .checked_mul(CPU_PERIOD_US / 1000)
                .ok_or(CgroupError::InvalidLimit {
                    what: "cpu_millicores",
                    value: millicores,
                })?;
        Ok(Some(quota.max(CPU_MIN_QUOTA_US)))
    }
}

/// Which cgroup interface the node uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// One hierarchy per controller (or per set of co-mounted controllers).
    V1,
    /// The unified hierarchy.
    V2,
}

/// Why a cgroup operation failed, and what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CgroupError {
    /// Neither interface offers memory, pids and cpu to the node.
    #[error(
        "no cgroup hierarchy can limit sessions ({v2}; {v1}): mount cgroup2 at /sys/fs/cgroup \
         with the memory, pids and cpu controllers available to the node's cgroup (or the v1 \
         memory, pids and cpu hierarchies), and run the node with write access to /sys/fs/cgroup"
    )]
    Unavailable {
        /// What v2 lacks.
        v2: String,
        /// What v1 lacks.
        v1: String,
    },
    /// The parent of a v2 group does not hand a controller down.
    #[error(
        "the {controller} controller is not available in {}: enable it in its parent's \
         cgroup.subtree_control (for a systemd unit: Delegate=yes)", .path.display()
    )]
    NotDelegated {
        /// The controller.
        controller: String,
        /// The group lacking it.
        path: PathBuf,
    },
    /// The node's v2 cgroup kept getting new processes while they were being moved out.
    #[error(
        "processes keep appearing in {}, which must be empty for session groups to get \
         controllers: start the node in a cgroup of its own", .path.display()
    )]
    Crowded {
        /// The node's cgroup.
        path: PathBuf,
    },
    /// A name that is not one plain path segment.
    #[error(
        "{name:?} cannot name a cgroup: use 1 to 128 letters, digits, '_' or '-' (a session id \
         such as sess_<32 hex digits>)"
    )]
    InvalidName {
        /// The name given.
        name: String,
    },
    /// A limit of 0 (which would stop anything from running) or too large to express.
    #[error(
        "{what} = {value} cannot be a limit: leave it unset for no limit, or give a value from 1 up to what the kernel can hold"
    )]
    InvalidLimit {
        /// The field of [`Limits`].
        what: &'static str,
        /// Its value.
        value: u64,
    },
    /// [`Cgroups::create`] found the session's group already there.
    #[error("the session cgroup {} exists already: open it, or destroy it if no session owns it", .path.display())]
    Exists {
        /// The group.
        path: PathBuf,
    },
    /// [`Cgroups::open`] or [`Cgroups::destroy`] found no such session group.
    #[error("there is no session cgroup {}: create it first", .path.display())]
    NotFound {
        /// The group (in the first hierarchy lacking it).
        path: PathBuf,
    },
    /// [`SessionCgroup::remove`] found processes (or child groups it could not remove).
    #[error("{} still holds processes: kill_all them before removing the group", .path.display())]
    Busy {
        /// The group.
        path: PathBuf,
    },
    /// Processes outlived [`SessionCgroup::kill_all`]'s signals.
    #[error(
        "{} processes of {} outlived SIGKILL for {}s (pids {pids:?}): a process stuck in the \
         kernel (state D, e.g. on a dead NFS or FUSE mount) dies when the call returns; look \
         at /proc/<pid>/stack", .pids.len(), .path.display(), KILL_PATIENCE.as_secs()
    )]
    Survivors {
        /// The group.
        path: PathBuf,
        /// The processes left, in the node's PID namespace.
        pids: Vec<i32>,
    },
    /// A file that this kernel does not have.
    #[error("{what} needs {}, which this kernel lacks: upgrade the kernel", .path.display())]
    Unsupported {
        /// What needed it.
        what: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// A v1 hierarchy the operation needs is not mounted.
    #[error(
        "no cgroup v1 {controller} hierarchy is mounted: mount it at /sys/fs/cgroup/{controller} and restart the node"
    )]
    NoHierarchy {
        /// The controller.
        controller: &'static str,
    },
    /// A kernel file whose content is not what the kernel documents.
    #[error("{}: unexpected content {content:?}: the kernel's cgroup interface differs from the one this node knows", .path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What it held.
        content: String,
    },
    /// Reading, writing, creating or removing a cgroup file failed.
    #[error("{action} {}: {source}{}", .path.display(), advice(.source))]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or group.
        path: PathBuf,
        /// The kernel's answer.
        source: io::Error,
    },
}

fn advice(error: &io::Error) -> &'static str {
    match error.kind() {
        ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem => {
            ": run the node as root with /sys/fs/cgroup mounted read-write, or give it a cgroup \
             of its own to manage (for a systemd unit: Delegate=yes)"
        }
        ErrorKind::NotFound => {
            ": the group or its controller is gone (removed by someone else, or the controller \
             was not delegated to it); detect again"
        }
        ErrorKind::InvalidInput => ": the kernel refused the value",
        _ => "",
    }
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> CgroupError {
    let path = path.to_owned();
    move |source| CgroupError::Io {
        action,
        path,
        source,
    }
}

/// The cgroups the node puts sessions in: one parent group per hierarchy, chosen by
/// [`Cgroups::detect`].
#[derive(Debug)]
pub struct Cgroups {
    version: Version,
    hierarchies: Vec<Hierarchy>,
}

#[derive(Debug)]
struct Hierarchy {
    /// The controllers sessions are joined to through this hierarchy.
    controllers: Vec<String>,
    /// `<node's cgroup>/<group>/sessions`: the session groups' parent.
    sessions: PathBuf,
}

impl Cgroups {
    /// Finds the hierarchy to use (see the module documentation) and prepares Plinth's parent
    /// group `group` (one path segment, e.g. `plinth`) below the node's own cgroup. Calling
    /// it again, in this process or after a restart, finds the same groups.
    pub fn detect(group: &str) -> Result<Self, CgroupError> {
        check_name(group)?;
        let mountinfo = read(Path::new("/proc/self/mountinfo"))?;
        let own = read(Path::new("/proc/self/cgroup"))?;
        let layout = detect::choose(&mountinfo, &own, group, |dir| {
            fs::read_to_string(dir.join("cgroup.controllers")).ok()
        })?;
        let cgroups = match layout {
            detect::Layout::V2 { base } => v2::prepare(&base, group, &detect::REQUIRED)?,
            detect::Layout::V1 { hierarchies } => v1::prepare(hierarchies, group)?,
        };
        tracing::info!(cgroups = %cgroups.describe(), "session cgroups ready");
        Ok(cgroups)
    }

    /// The interface in use.
    pub fn version(&self) -> Version {
        self.version
    }

    /// For logs and readiness details, e.g. `cgroup v2: memory, pids, cpu at
    /// /sys/fs/cgroup/plinth/sessions`.
    pub fn describe(&self) -> String {
        let places: Vec<String> = self
            .hierarchies
            .iter()
            .map(|hierarchy| {
                format!(
                    "{} at {}",
                    hierarchy.controllers.join(", "),
                    hierarchy.sessions.display()
                )
            })
            .collect();
        let version = match self.version {
            Version::V1 => 1,
            Version::V2 => 2,
        };
        format!("cgroup v{version}: {}", places.join("; "))
    }

    /// Makes the group of session `name` (one path segment, e.g. `sess_<32 hex>`) with
    /// `limits`, ready for commands to [`join`]. Nothing is left behind when it fails, unless
    /// the group existed already ([`CgroupError::Exists`]).
    pub fn create(&self, name: &str, limits: &Limits) -> Result<SessionCgroup, CgroupError> {
        check_name(name)?;
        limits.check()?;
        let mut session = SessionCgroup {
            name: name.to_owned(),
            version: self.version,
            dirs: Vec::with_capacity(self.hierarchies.len()),
            join: Vec::with_capacity(self.hierarchies.len()),
        };
        let made = (|| {
            for hierarchy in &self.hierarchies {
                let path = hierarchy.sessions.join(name);
                match fs::create_dir(&path) {
                    Ok(()) => session.dirs.push(SessionDir {
                        controllers: hierarchy.controllers.clone(),
                        path,
                    }),
                    Err(error) if error.kind() == ErrorKind::AlreadyExists => {
                        return Err(CgroupError::Exists { path });
                    }
                    Err(error) => return Err(io_error("creating", &path)(error)),
                }
            }
            match self.version {
                Version::V1 => v1::apply(&session, limits)?,
                Version::V2 => v2::apply(&session.dirs[0].path, limits)?,
            }
            session.open_join_fds()
        })();
        if let Err(error) = made {
            for dir in session.dirs.iter().rev() {
                if let Err(cleanup) = fs::remove_dir(&dir.path) {
                    tracing::warn!(path = %dir.path.display(), error = %cleanup, "could not remove a half-made session cgroup");
                }
            }
            return Err(error);
        }
        Ok(session)
    }

    /// The existing group of session `name` (after a node restart), with its limits as they
    /// were set.
    pub fn open(&self, name: &str) -> Result<SessionCgroup, CgroupError> {
        check_name(name)?;
        let mut session = SessionCgroup {
            name: name.to_owned(),
            version: self.version,
            dirs: Vec::with_capacity(self.hierarchies.len()),
            join: Vec::with_capacity(self.hierarchies.len()),
        };
        for hierarchy in &self.hierarchies {
            let path = hierarchy.sessions.join(name);
            if !path.is_dir() {
                return Err(CgroupError::NotFound { path });
            }
            session.dirs.push(SessionDir {
                controllers: hierarchy.controllers.clone(),
                path,
            });
        }
        session.open_join_fds()?;
        Ok(session)
    }

    /// The names of the session groups there are (in any hierarchy), sorted: after a
    /// restart, the node destroys those no session owns.
    pub fn list(&self) -> Result<Vec<String>, CgroupError> {
        let mut names = Vec::new();
        for hierarchy in &self.hierarchies {
            let entries = fs::read_dir(&hierarchy.sessions)
                .map_err(io_error("listing", &hierarchy.sessions))?;
            for entry in entries {
                let entry = entry.map_err(io_error("listing", &hierarchy.sessions))?;
                let is_dir = entry
                    .file_type()
                    .map_err(io_error("listing", &entry.path()))?
                    .is_dir();
                if let (true, Some(name)) = (is_dir, entry.file_name().to_str())
                    && check_name(name).is_ok()
                {
                    names.push(name.to_owned());
                }
            }
        }
        names.sort_unstable();
        names.dedup();
        Ok(names)
    }

    /// Kills every process of session `name`'s group and removes it, in whichever
    /// hierarchies it exists: also a group a crash left half made.
    pub fn destroy(&self, name: &str) -> Result<(), CgroupError> {
        check_name(name)?;
        let dirs: Vec<SessionDir> = self
            .hierarchies
            .iter()
            .map(|hierarchy| SessionDir {
                controllers: hierarchy.controllers.clone(),
                path: hierarchy.sessions.join(name),
            })
            .filter(|dir| dir.path.is_dir())
            .collect();
        if dirs.is_empty() {
            return Err(CgroupError::NotFound {
                path: self.hierarchies[0].sessions.join(name),
            });
        }
        let session = SessionCgroup {
            name: name.to_owned(),
            version: self.version,
            dirs,
            join: Vec::new(),
        };
        session.kill_all()?;
        session.remove()
    }
}

/// The file of each of `dirs` a process joins by, open for writing.
fn open_join(version: Version, dirs: &[&Path]) -> Result<Vec<OwnedFd>, CgroupError> {
    // v1: `tasks`, which moves only the writing thread (a joining process is single-threaded),
    // and for the writer itself the kernel skips the global threadgroup lock that
    // `cgroup.procs` takes for writing: that lock waits for an RCU grace period, 5-15 ms here,
    // while `tasks` takes 0.3-0.5 ms. v2 has only `cgroup.procs` for domain groups.
    let file = match version {
        Version::V1 => "tasks",
        Version::V2 => "cgroup.procs",
    };
    dirs.iter()
        .map(|dir| {
            let path = dir.join(file);
            rustix::fs::open(&path, OFlags::WRONLY | OFlags::CLOEXEC, Mode::empty())
                .map_err(|errno| io_error("opening", &path)(errno.into()))
        })
        .collect()
}

/// A cgroup's CPU weight file: `base / divisor` is written to it (at least its minimum).
#[derive(Debug, Clone)]
pub struct CpuWeight {
    path: PathBuf,
    base: u64,
    min: u64,
}

impl CpuWeight {
    /// The weight in `path`, `base` for a divisor of 1.
    pub fn file(path: PathBuf, base: u64) -> CpuWeight {
        CpuWeight { path, base, min: 1 }
    }

    fn at_least(mut self, min: u64) -> CpuWeight {
        self.min = min;
        self
    }

    /// Writes `base / divisor`: the group's part of a weight shared by `divisor` groups.
    pub fn set_divisor(&self, divisor: u32) -> Result<(), CgroupError> {
        let weight = (self.base / u64::from(divisor.max(1))).max(self.min);
        // Truncating, as a shell's `>` does: a cgroup file ignores it, a plain file (a test's)
        // needs it.
        fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&self.path)
            .and_then(|mut file| file.write_all(weight.to_string().as_bytes()))
            .map_err(io_error("writing", &self.path))
    }
}

/// A session's group (one directory per hierarchy). Dropping it closes its descriptors and
/// leaves the group as it is.
#[derive(Debug)]
pub struct SessionCgroup {
    name: String,
    version: Version,
    dirs: Vec<SessionDir>,
    join: Vec<OwnedFd>,
}

#[derive(Debug)]
struct SessionDir {
    controllers: Vec<String>,
    path: PathBuf,
}

impl SessionCgroup {
    /// The session's name, as given to [`Cgroups::create`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The file of each hierarchy a process joins by (`tasks` in v1, `cgroup.procs` in v2),
    /// open for writing and closed on `execve`: what a new command passes to [`join`]. They
    /// stay valid while `self` lives.
    pub fn join_fds(&self) -> &[OwnedFd] {
        &self.join
    }

    /// How many times the kernel's OOM killer killed a process of this group: the node reads
    /// it before and after a command to tell whether the command was OOM-killed.
    pub fn oom_kills(&self) -> Result<u64, CgroupError> {
        match self.version {
            Version::V1 => v1::oom_kills(self),
            Version::V2 => v2::oom_kills(&self.dirs[0].path),
        }
    }

    /// The group's CPU weight relative to its sibling session groups (v1 `cpu.shares`, v2
    /// `cpu.weight`), for the node to divide a scope's weight among that scope's sessions;
    /// `None` without a cpu controller.
    pub fn cpu_weight(&self) -> Option<CpuWeight> {
        match self.version {
            Version::V1 => self
                .dir("cpu")
                .map(|dir| CpuWeight::file(dir.join("cpu.shares"), 262_144).at_least(2)),
            Version::V2 => Some(CpuWeight::file(
                self.dirs.first()?.path.join("cpu.weight"),
                8192,
            )),
        }
    }

    /// The CPU time the group's processes used (those gone included).
    pub fn cpu_usage(&self) -> Result<Duration, CgroupError> {
        match self.version {
            Version::V1 => v1::cpu_usage_ns(self).map(Duration::from_nanos),
            Version::V2 => v2::cpu_usage_us(&self.dirs[0].path).map(Duration::from_micros),
        }
    }

    /// The processes in the group and its descendants, in the node's PID namespace.
    pub fn processes(&self) -> Result<Vec<Pid>, CgroupError> {
        read_all_pids(&self.procs_files()?)
    }

    /// Kills every process of the group, including ones that left their session or process
    /// group and ones in other PID namespaces, and returns once none is left (or reports the
    /// survivors after 10 s). v2 uses `cgroup.kill`; otherwise the group is frozen (when a
    /// freezer is available), its processes are sent SIGKILL through pidfds (a pid that exits
    /// and is reused meanwhile is never signalled), thawed, and that is repeated until the
    /// group is empty.
    pub fn kill_all(&self) -> Result<(), CgroupError> {
        let deadline = Instant::now() + KILL_PATIENCE;
        match self.version {
            Version::V1 => v1::kill_all(self, deadline),
            Version::V2 => v2::kill_all(self, deadline),
        }
    }

    /// Removes the group (and any group made below it) in every hierarchy. It must hold no
    /// process: call [`SessionCgroup::kill_all`] first. On failure the group is left; get a
    /// handle again with [`Cgroups::open`] or remove it with [`Cgroups::destroy`].
    pub fn remove(self) -> Result<(), CgroupError> {
        let SessionCgroup { dirs, join, .. } = self;
        drop(join);
        for dir in &dirs {
            remove_tree(&dir.path)?;
        }
        Ok(())
    }

    /// A group below this one, with no limits of its own (this group's hold for it): one per
    /// command, so a command's whole tree, `setsid` daemons included, can be killed without
    /// touching the rest of the session. A group of that name left from before is used as it
    /// is. Its join descriptors are its own, opened here.
    ///
    /// v1 makes it in one hierarchy only, the freezer's (else the pids', else the first): that
    /// is all killing the tree needs, and a command joins the session's own group in the
    /// others. A memory group per command would cost far more than the command: the kernel
    /// makes and reparents a memory cgroup on every create and remove, work that grows with
    /// the number of memory cgroups on the host (every live session's). The OOM count is the
    /// session's, read before and after. v2's session groups hand no controller down, so a
    /// group below one is as cheap.
    pub fn child(&self, name: &str) -> Result<SessionCgroup, CgroupError> {
        check_name(name)?;
        let chosen = match self.version {
            Version::V2 => 0,
            Version::V1 => ["freezer", "pids"]
                .iter()
                .find_map(|controller| {
                    self.dirs
                        .iter()
                        .position(|dir| dir.controllers.iter().any(|name| name == controller))
                })
                .unwrap_or(0),
        };
        let Some(parent) = self.dirs.get(chosen) else {
            return Err(CgroupError::Unsupported {
                what: "a command's group (the session's group has no directory)",
                path: PathBuf::from(&self.name),
            });
        };
        let path = parent.path.join(name);
        match fs::create_dir(&path) {
            Ok(()) => {}
            Err(error) if error.kind() == ErrorKind::AlreadyExists => {}
            Err(error) => return Err(io_error("creating", &path)(error)),
        }
        let joins: Vec<&Path> = self
            .dirs
            .iter()
            .enumerate()
            .map(|(index, dir)| {
                if index == chosen {
                    path.as_path()
                } else {
                    dir.path.as_path()
                }
            })
            .collect();
        let join = open_join(self.version, &joins)?;
        Ok(SessionCgroup {
            name: name.to_owned(),
            version: self.version,
            dirs: vec![SessionDir {
                controllers: parent.controllers.clone(),
                path,
            }],
            join,
        })
    }

    /// Closes the descriptors [`SessionCgroup::join_fds`] gives, once nothing joins this group
    /// directly any more (a session's keeper has; its commands join groups made by
    /// [`SessionCgroup::child`], which opens their own). A node holding thousands of sessions
    /// would otherwise hold five descriptors each, which every command's `execve` closes one
    /// by one in its copy of the node's descriptor table.
    pub fn release_join_fds(&mut self) {
        self.join = Vec::new();
    }

    /// The group's directory for `controller`.
    fn dir(&self, controller: &str) -> Option<&Path> {
        self.dirs
            .iter()
            .find(|dir| dir.controllers.iter().any(|name| name == controller))
            .map(|dir| dir.path.as_path())
    }

    fn open_join_fds(&mut self) -> Result<(), CgroupError> {
        let dirs: Vec<&Path> = self.dirs.iter().map(|dir| dir.path.as_path()).collect();
        self.join = open_join(self.version, &dirs)?;
        Ok(())
    }

    /// `cgroup.procs` of each of the group's directories and of every group below them.
    fn procs_files(&self) -> Result<Vec<PathBuf>, CgroupError> {
        let mut files = Vec::new();
        let mut pending: Vec<PathBuf> = self.dirs.iter().map(|dir| dir.path.clone()).collect();
        while let Some(dir) = pending.pop() {
            let entries = match fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(error) if error.kind() == ErrorKind::NotFound => continue,
                Err(error) => return Err(io_error("listing", &dir)(error)),
            };
            for entry in entries {
                let entry = entry.map_err(io_error("listing", &dir))?;
                if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                    pending.push(entry.path());
                }
            }
            files.push(dir.join("cgroup.procs"));
        }
        Ok(files)
    }
}

/// Moves the calling process (single-threaded: in v1 only the writing thread moves) into the
/// groups whose join descriptors are `fds` ([`SessionCgroup::join_fds`]). Async-signal-safe: one `write(2)` per descriptor, nothing
/// allocated, no lock taken, so a child of `clone(CLONE_VM | CLONE_VFORK)` or of `fork` may
/// call it before `execve`. Call it before entering other namespaces or dropping privileges:
/// moving a process needs the node's rights over the groups.
pub fn join<Fd: AsFd>(fds: &[Fd]) -> Result<(), Errno> {
    for fd in fds {
        loop {
            match rustix::io::write(fd, b"0") {
                Ok(_) => break,
                Err(Errno::INTR) => {}
                Err(errno) => return Err(errno),
            }
        }
    }
    Ok(())
}

/// How a group is frozen while its processes are listed and signalled, so none of them can
/// fork or exit (freeing its pid) in between.
enum Freezer {
    /// v1's freezer hierarchy: `freezer.state`.
    V1 { state: PathBuf },
    /// v2's `cgroup.freeze` (Linux 5.2); `cgroup.events` says `frozen 1` once done.
    V2 { freeze: PathBuf, events: PathBuf },
}

impl Freezer {
    fn freeze(&self, deadline: Instant) -> Result<(), CgroupError> {
        match self {
            Freezer::V1 { state } => write(state, "FROZEN")?,
            Freezer::V2 { freeze, .. } => write(freeze, "1")?,
        }
        let until = deadline.min(Instant::now() + FREEZE_PATIENCE);
        if !wait_until(until, || self.frozen())? {
            tracing::warn!("a session cgroup is still freezing; signalling its processes anyway");
        }
        Ok(())
    }

    fn frozen(&self) -> Result<bool, CgroupError> {
        Ok(match self {
            Freezer::V1 { state } => read(state)?.trim() == "FROZEN",
            Freezer::V2 { events, .. } => field(&read(events)?, "frozen") == Some(1),
        })
    }

    fn thaw(&self) -> Result<(), CgroupError> {
        match self {
            Freezer::V1 { state } => write(state, "THAWED"),
            Freezer::V2 { freeze, .. } => write(freeze, "0"),
        }
    }
}

/// Rounds of freeze, SIGKILL to every listed process, thaw, until the group is empty.
fn kill_by_signals(
    session: &SessionCgroup,
    freezer: Option<&Freezer>,
    deadline: Instant,
) -> Result<(), CgroupError> {
    loop {
        let procs = session.procs_files()?;
        if let Some(freezer) = freezer {
            freezer.freeze(deadline)?;
        }
        let signalled = signal_listed(&procs);
        // Thawed whatever happened: a frozen group would hold its processes forever.
        let thawed = freezer.map_or(Ok(()), Freezer::thaw);
        signalled?;
        thawed?;
        let round = deadline.min(Instant::now() + FREEZE_PATIENCE);
        if wait_until(round, || Ok(read_all_pids(&procs)?.is_empty()))? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(CgroupError::Survivors {
                path: session.dirs[0].path.clone(),
                pids: read_all_pids(&procs)?
                    .into_iter()
                    .map(Pid::as_raw_pid)
                    .collect(),
            });
        }
    }
}

/// Sends SIGKILL to every process listed in `procs`. A pid read from a list may have exited
/// and been reused by a process elsewhere by the time it is signalled; so each is pinned with
/// a pidfd first and signalled only if the pid is still listed after that: the pidfd's process
/// is then the listed one.
fn signal_listed(procs: &[PathBuf]) -> Result<(), CgroupError> {
    let mut pinned = Vec::new();
    for pid in read_all_pids(procs)? {
        match rustix::process::pidfd_open(pid, PidfdFlags::empty()) {
            Ok(pidfd) => pinned.push((pid, Some(pidfd))),
            Err(Errno::SRCH) => {}
            // Before Linux 5.3: a plain kill, safe when frozen, a small race otherwise.
            Err(Errno::NOSYS) => pinned.push((pid, None)),
            Err(errno) => {
                return Err(io_error("pinning a process of", &procs[0])(errno.into()));
            }
        }
    }
    let listed = read_all_pids(procs)?;
    for (pid, pidfd) in pinned {
        if !listed.contains(&pid) {
            continue;
        }
        let sent = match &pidfd {
            Some(pidfd) => rustix::process::pidfd_send_signal(pidfd, Signal::KILL),
            None => rustix::process::kill_process(pid, Signal::KILL),
        };
        match sent {
            Ok(()) | Err(Errno::SRCH) => {}
            Err(errno) => return Err(io_error("killing a process of", &procs[0])(errno.into())),
        }
    }
    Ok(())
}

/// Calls `done` every [`POLL`] until it answers true (then true) or `until` passes (then
/// false).
fn wait_until(
    until: Instant,
    mut done: impl FnMut() -> Result<bool, CgroupError>,
) -> Result<bool, CgroupError> {
    loop {
        if done()? {
            return Ok(true);
        }
        if Instant::now() >= until {
            return Ok(false);
        }
        std::thread::sleep(POLL);
    }
}

/// A name that is one plain path segment: no `/`, no `.` (which also keeps it apart from the
/// kernel's own files, `memory.max` and the like), not empty.
fn check_name(name: &str) -> Result<(), CgroupError> {
    let plain = (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-');
    if plain {
        Ok(())
    } else {
        Err(CgroupError::InvalidName {
            name: name.to_owned(),
        })
    }
}

/// The memory limit of this process's cgroups, in bytes: the least of its own cgroup's and
/// every ancestor's (cgroup v2 `memory.max`, v1 `memory.limit_in_bytes`; both on a hybrid
/// host). `None` when none is limited or none can be read: the host's memory is the bound.
pub fn memory_limit() -> Option<u64> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let own = fs::read_to_string("/proc/self/cgroup").ok()?;
    detect::memory_limit(&mountinfo, &own, |file| fs::read_to_string(file).ok())
}

/// The host's memory (`MemTotal` of `/proc/meminfo`), in bytes.
pub fn host_memory() -> Option<u64> {
    let meminfo = fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|line| line.starts_with("MemTotal:"))?;
    let kib: u64 = line
        .trim_start_matches("MemTotal:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

fn read(path: &Path) -> Result<String, CgroupError> {
    fs::read_to_string(path).map_err(io_error("reading", path))
}

/// Writes `value` in one `write(2)`, as the kernel's files expect; never creates a file.
fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut file| file.write_all(value.as_bytes()))
        .map_err(io_error("writing", path))
}

fn make_dir(path: &Path) -> Result<(), CgroupError> {
    match fs::create_dir(path) {
        Err(error) if error.kind() != ErrorKind::AlreadyExists => {
            Err(io_error("creating", path)(error))
        }
        _ => Ok(()),
    }
}

/// The pids in a `cgroup.procs`; none when the group is gone.
fn read_pids(path: &Path) -> Result<Vec<Pid>, CgroupError> {
    let text = match fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(io_error("reading", path)(error)),
    };
    text.lines()
        .map(|line| {
            line.trim()
                .parse()
                .ok()
                .and_then(Pid::from_raw)
                .ok_or_else(|| CgroupError::Parse {
                    path: path.to_owned(),
                    content: line.to_owned(),
                })
        })
        .collect()
}

fn read_all_pids(files: &[PathBuf]) -> Result<Vec<Pid>, CgroupError> {
    let mut pids = Vec::new();
    for file in files {
        for pid in read_pids(file)? {
            if !pids.contains(&pid) {
                pids.push(pid);
            }
        }
    }
    Ok(pids)
}

/// The number after `key` in a flat-keyed kernel file (`key value` per line).
fn field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (name, value) = line.split_once(' ')?;
        (name == key).then(|| value.trim().parse().ok()).flatten()
    })
}

/// Removes `dir` and any group below it, deepest first; a group already gone is fine.
fn remove_tree(dir: &Path) -> Result<(), CgroupError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(io_error("listing", dir)(error)),
    };
    for entry in entries {
        let entry = entry.map_err(io_error("listing", dir))?;
        if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
            remove_tree(&entry.path())?;
        }
    }
    match fs::remove_dir(dir) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == ErrorKind::NotFound => Ok(()),
        Err(error) if error.kind() == ErrorKind::ResourceBusy => Err(CgroupError::Busy {
            path: dir.to_owned(),
        }),
        Err(error) => Err(io_error("removing", dir)(error)),
    }
}
