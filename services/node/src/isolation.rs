//! Isolating a session's commands, with direct system calls (the kernel work is ~1 ms a
//! command when done afresh; the `unshare`/`mount` tools would add ~5 ms).
//!
//! Each session gets one private mount namespace, made when it attaches (or, after a node
//! restart, before its first command) on a dedicated thread of the node, [`Namespaces`], and
//! held by a file descriptor. In it:
//!
//! 1. propagation is private, so nothing mounted there reaches the host;
//! 2. a small tmpfs covers `/env`, so no other environment is visible, with `/env/<slug>` in
//!    it: a bind of the version's directory remounted read-only (the version directory holds no
//!    mounts of its own, so this is the recursive read-only view `mount_setattr(AT_RECURSIVE)`
//!    would give), then the tmpfs is made read-only too;
//! 3. the node's state is hidden (every hidden path gets an empty read-only tmpfs: other
//!    sessions' working directories, the blob cache, in `plinth serve` the whole data
//!    directory);
//! 4. the session's working directory, taken as a detached copy of its mount first
//!    (`open_tree`), is moved (`move_mount`) to [`WORKDIR`], `/home/session`, on a small tmpfs
//!    over `/home` that is then made read-only. The path the session sees is the same on every
//!    node and does not depend on where the node keeps it: the node mounts it as root, so the
//!    session's uid needs no way through the host path's parents (a data directory inside a
//!    0700 home works), and the host's home directories are out of sight.
//!
//! Each command then costs only what it must: started without copying the node's memory
//! ([`crate::spawn`]), the child enters the session's namespace (`setns`), drops to the
//! session's uid and gid with no supplementary groups, asks to be killed if the node dies,
//! sets `no_new_privs` and changes to its working directory. The namespace lives as long as
//! its descriptor or a process in it: when the node ends a session, or dies, the mounts go
//! with it, and the host never holds any of them.

use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{CWD, Mode, OFlags};
use rustix::io::Errno;
use rustix::mount::{MountFlags, MountPropagationFlags, MoveMountFlags, OpenTreeFlags};
use rustix::thread::LinkNameSpaceType;

/// Where environments appear.
pub const ENV_ROOT: &str = "/env";

/// Where an isolated session sees its own working directory (its `HOME` and starting
/// directory), whatever the host path: mounted there in the session's namespace.
pub const WORKDIR: &str = "/home/session";

/// The directory [`WORKDIR`] is made in: a fresh tmpfs in each session's namespace.
const WORKDIR_PARENT: &str = "/home";

/// The PATH a session's shell starts from, after the environment's own directories.
pub const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How commands are isolated on this node.
#[derive(Debug, Clone)]
pub struct Isolation {
    /// False only with `--insecure-no-isolation`.
    pub enabled: bool,
    /// Directories hidden from sessions (the node's state, the data directory).
    pub hidden: Vec<PathBuf>,
}

/// One command to start.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The session's uid (and gid).
    pub uid: u32,
    /// Where the command starts.
    pub cwd: PathBuf,
    /// Its whole environment.
    pub env: Vec<(String, String)>,
    /// The shell command.
    pub command: String,
}

/// Why a command or a namespace could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// A path or value holds a NUL byte.
    #[error("{0} contains a NUL byte")]
    Nul(&'static str),
    /// Isolated commands run in their session's namespace, and there is none.
    #[error("the session has no mount namespace")]
    NoNamespace,
    /// The kernel refused to make the namespace.
    #[error("making the session's mount namespace failed at {step}: {errno}")]
    Namespace {
        /// What was being done.
        step: &'static str,
        /// The kernel's answer.
        errno: Errno,
    },
    /// The namespace thread is gone.
    #[error("the node's namespace thread has stopped; restart the node agent")]
    Stopped,
}

fn c_path(path: &Path, what: &'static str) -> Result<CString, LaunchError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| LaunchError::Nul(what))
}

/// What a session's namespace holds, prepared before the namespace thread makes it.
#[derive(Debug)]
pub struct NamespacePlan {
    env_root: CString,
    mount_point: CString,
    version_dir: CString,
    /// For a version made as a layer: `lowerdir=<version>:<base>:…`, an overlay of them is
    /// mounted instead of binding the version's directory.
    overlay: Option<CString>,
    workdir: CString,
    hidden: Vec<CString>,
    /// `/home`, and [`WORKDIR`] in it.
    workdir_parent: CString,
    workdir_mount: CString,
}

impl Isolation {
    /// Checks the node can isolate sessions: root (mount namespaces and uid switches).
    pub fn check(&self) -> Result<(), String> {
        if !self.enabled {
            return Ok(());
        }
        if !rustix::process::geteuid().is_root() {
            return Err(
                "the node agent is not running as root: it cannot give sessions a private mount \
                 namespace with a read-only environment and their own uid. Run it as root, or \
                 pass --insecure-no-isolation to run commands unisolated (every session will \
                 say so)"
                    .to_owned(),
            );
        }
        for dir in [ENV_ROOT, WORKDIR_PARENT] {
            std::fs::create_dir_all(dir).map_err(|error| format!("creating {dir}: {error}"))?;
        }
        Ok(())
    }

    /// The command, ready to spawn: in `namespace` (the session's) and as the session's uid
    /// when isolated.
    pub fn command(
        &self,
        launch: &Launch,
        namespace: Option<Arc<OwnedFd>>,
    ) -> Result<crate::spawn::Command, LaunchError> {
        let argv = vec![
            c"/bin/sh".to_owned(),
            c"-c".to_owned(),
            CString::new(launch.command.as_str()).map_err(|_| LaunchError::Nul("the command"))?,
        ];
        let env = launch
            .env
            .iter()
            .map(|(name, value)| CString::new(format!("{name}={value}")))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| LaunchError::Nul("an environment variable"))?;
        let cwd = c_path(&launch.cwd, "the working directory")?;
        let (namespace, uid) = if self.enabled {
            (
                Some(namespace.ok_or(LaunchError::NoNamespace)?),
                Some(launch.uid),
            )
        } else {
            (None, None)
        };
        Ok(crate::spawn::Command {
            argv,
            env,
            cwd,
            namespace,
            uid,
        })
    }

    /// What a session's namespace holds: `version_dir` read-only at `/env/<slug>`, the node's
    /// state hidden, `workdir` at [`WORKDIR`].
    pub fn namespace_plan(
        &self,
        version_dir: &Path,
        lower: &[PathBuf],
        slug: &str,
        workdir: &Path,
    ) -> Result<NamespacePlan, LaunchError> {
        // Only the outermost hidden paths get a tmpfs: one inside another is hidden already.
        let mut hidden: Vec<PathBuf> = self.hidden.clone();
        hidden.sort();
        hidden.dedup();
        let outermost: Vec<PathBuf> = hidden
            .iter()
            .filter(|path| {
                !hidden
                    .iter()
                    .any(|other| other != *path && path.starts_with(other))
            })
            .cloned()
            .collect();
        let mount_point = format!("{ENV_ROOT}/{slug}");
        let overlay = if lower.is_empty() {
            None
        } else {
            // The cache makes layers only where its path needs no escaping in these options.
            let layers: Vec<String> = std::iter::once(version_dir)
                .chain(lower.iter().map(PathBuf::as_path))
                .map(|path| path.to_string_lossy().into_owned())
                .collect();
            Some(
                CString::new(format!("lowerdir={}", layers.join(":")))
                    .map_err(|_| LaunchError::Nul("the version directory"))?,
            )
        };
        Ok(NamespacePlan {
            overlay,
            env_root: CString::new(ENV_ROOT).map_err(|_| LaunchError::Nul("/env"))?,
            mount_point: CString::new(mount_point).map_err(|_| LaunchError::Nul("the slug"))?,
            version_dir: c_path(version_dir, "the version directory")?,
            workdir: c_path(workdir, "the working directory")?,
            hidden: outermost
                .iter()
                .map(|path| c_path(path, "a hidden path"))
                .collect::<Result<_, _>>()?,
            workdir_parent: CString::new(WORKDIR_PARENT).map_err(|_| LaunchError::Nul("/home"))?,
            workdir_mount: CString::new(WORKDIR).map_err(|_| LaunchError::Nul("/home/session"))?,
        })
    }
}

const TMPFS_OPTIONS: &CStr = c"mode=0755,size=64k";
const EMPTY: &CStr = c"";
const OWN_NAMESPACE: &CStr = c"/proc/thread-self/ns/mnt";

/// Makes sessions' mount namespaces on one dedicated thread: it unshares into a new namespace,
/// mounts what the plan says, keeps a descriptor of it and returns to the node's namespace.
/// What else runs on that thread is a session's setup around its namespace (its directories),
/// handed over in the same job so an attach costs one hand-off; nothing else sees the
/// thread's namespace change.
#[derive(Debug, Clone)]
pub struct Namespaces {
    jobs: std::sync::mpsc::Sender<Job>,
}

type Job = Box<dyn FnOnce(&NamespaceThread) + Send>;

/// The namespace thread, as a job sees it.
pub struct NamespaceThread {
    home: OwnedFd,
    stranded: std::cell::Cell<bool>,
}

impl NamespaceThread {
    /// Makes one session's namespace; answers a descriptor holding it. The thread is back in
    /// the node's namespace afterwards, whatever happened.
    pub fn make(&self, plan: &NamespacePlan) -> Result<OwnedFd, LaunchError> {
        if self.stranded.get() {
            return Err(LaunchError::Stopped);
        }
        let made = make_namespace(plan);
        if let Err(errno) = rustix::thread::move_into_link_name_space(
            self.home.as_fd(),
            Some(LinkNameSpaceType::Mount),
        ) {
            tracing::error!(%errno, "the namespace thread cannot return to the node's mount namespace; sessions' commands cannot start until the node agent restarts");
            self.stranded.set(true);
            return Err(LaunchError::Stopped);
        }
        made
    }
}

impl Namespaces {
    /// Starts the thread.
    pub fn start() -> std::io::Result<Self> {
        let (jobs, queue) = std::sync::mpsc::channel::<Job>();
        let home = rustix::fs::open(
            OWN_NAMESPACE,
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        std::thread::Builder::new()
            .name("plinth-namespaces".to_owned())
            .spawn(move || {
                let thread = NamespaceThread {
                    home,
                    stranded: std::cell::Cell::new(false),
                };
                for job in queue {
                    job(&thread);
                    if thread.stranded.get() {
                        // A thread that cannot return makes no more namespaces; the jobs
                        // still queued, and any sent later, are answered `Stopped`.
                        return;
                    }
                }
            })?;
        Ok(Namespaces { jobs })
    }

    /// Runs `job` on the namespace thread; answers what it answers.
    pub async fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce(&NamespaceThread) -> T + Send + 'static,
    ) -> Result<T, LaunchError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.jobs
            .send(Box::new(move |thread: &NamespaceThread| {
                let _ = reply.send(job(thread));
            }))
            .map_err(|_| LaunchError::Stopped)?;
        answer.await.map_err(|_| LaunchError::Stopped)
    }
}

/// The namespace thread's side: runs in the new namespace, leaves the thread there.
fn make_namespace(plan: &NamespacePlan) -> Result<OwnedFd, LaunchError> {
    let step = |step: &'static str| move |errno: Errno| LaunchError::Namespace { step, errno };
    // SAFETY: this thread shares nothing the unshare changes with any code that expects it
    // unchanged: a new mount namespace (and, implied, its own root and working directory)
    // for this dedicated thread only.
    #[allow(unsafe_code)]
    unsafe {
        rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS)
            .map_err(step("unshare"))?;
    }
    rustix::mount::mount_change(
        c"/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )
    .map_err(step("making propagation private"))?;
    let quiet = MountFlags::NOSUID | MountFlags::NODEV;
    rustix::mount::mount(c"tmpfs", &*plan.env_root, c"tmpfs", quiet, TMPFS_OPTIONS)
        .map_err(step("mounting /env"))?;
    make_dir(&plan.mount_point).map_err(step("making /env/<slug>"))?;
    match &plan.overlay {
        // Only lower layers: the overlay is read-only by construction.
        Some(options) => rustix::mount::mount(
            c"overlay",
            &*plan.mount_point,
            c"overlay",
            MountFlags::RDONLY | quiet,
            &**options,
        )
        .map_err(step("mounting the version's layers"))?,
        None => {
            rustix::mount::mount_bind(&*plan.version_dir, &*plan.mount_point)
                .map_err(step("binding the version"))?;
            rustix::mount::mount_remount(
                &*plan.mount_point,
                MountFlags::BIND | MountFlags::RDONLY | quiet,
                EMPTY,
            )
            .map_err(step("making the version read-only"))?;
        }
    }
    rustix::mount::mount_remount(&*plan.env_root, MountFlags::RDONLY | quiet, TMPFS_OPTIONS)
        .map_err(step("making /env read-only"))?;

    let workdir = rustix::mount::open_tree(
        CWD,
        &*plan.workdir,
        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
    )
    .map_err(step("taking the working directory"))?;
    for hidden in &plan.hidden {
        match rustix::mount::mount(
            c"tmpfs",
            &**hidden,
            c"tmpfs",
            quiet | MountFlags::NOEXEC | MountFlags::RDONLY,
            TMPFS_OPTIONS,
        ) {
            // A hidden path that does not exist on this host has nothing to hide.
            Ok(()) | Err(Errno::NOENT) => {}
            Err(errno) => return Err(step("hiding the node's state")(errno)),
        }
    }
    rustix::mount::mount(
        c"tmpfs",
        &*plan.workdir_parent,
        c"tmpfs",
        quiet | MountFlags::NOEXEC,
        TMPFS_OPTIONS,
    )
    .map_err(step("mounting /home"))?;
    make_dir(&plan.workdir_mount).map_err(step("making the working directory's mount point"))?;
    rustix::mount::move_mount(
        &workdir,
        EMPTY,
        CWD,
        &*plan.workdir_mount,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(step("mounting the working directory"))?;
    rustix::mount::mount_remount(
        &*plan.workdir_parent,
        MountFlags::RDONLY | quiet | MountFlags::NOEXEC,
        TMPFS_OPTIONS,
    )
    .map_err(step("making /home read-only"))?;
    rustix::fs::open(
        OWN_NAMESPACE,
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(step("keeping the namespace"))
}

fn make_dir(path: &CStr) -> Result<(), Errno> {
    match rustix::fs::mkdir(path, Mode::from_raw_mode(0o755)) {
        Ok(()) | Err(Errno::EXIST) => Ok(()),
        Err(error) => Err(error),
    }
}

/// The environment a session's commands get (UHP §6.3): the environment's tools first on
/// `PATH`, `PYTHONPATH`/`NODE_PATH` starting with it, `PROJECT_ROOT`, `HOME` = the working
/// directory, `PLINTH_SESSION_ID` = the session's id. Caller-given variables come first;
/// `PATH`, `PYTHONPATH` and `NODE_PATH` given by the caller follow the environment's entries,
/// and `HOME`, `PROJECT_ROOT` and `PLINTH_SESSION_ID` cannot be replaced.
pub fn session_env(
    session_id: &str,
    slug: &str,
    workdir: &Path,
    has_venv: bool,
    extra: &[(String, String)],
) -> Vec<(String, String)> {
    let mount = format!("{ENV_ROOT}/{slug}");
    let given = |name: &str| {
        extra
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.clone())
    };
    let join = |ours: String, name: &str| match given(name) {
        Some(theirs) if !theirs.is_empty() => format!("{ours}:{theirs}"),
        _ => ours,
    };
    let mut env: Vec<(String, String)> = extra
        .iter()
        .filter(|(key, _)| {
            !matches!(
                key.as_str(),
                "PATH" | "PYTHONPATH" | "NODE_PATH" | "HOME" | "PROJECT_ROOT" | "PLINTH_SESSION_ID"
            )
        })
        .cloned()
        .collect();
    let mut set = |name: &str, value: String| {
        env.retain(|(key, _)| key != name);
        env.push((name.to_owned(), value));
    };
    set(
        "PATH",
        join(
            format!("{mount}/.venv/bin:{mount}/node_modules/.bin:{SYSTEM_PATH}"),
            "PATH",
        ),
    );
    set("PYTHONPATH", join(mount.clone(), "PYTHONPATH"));
    set(
        "NODE_PATH",
        join(format!("{mount}/node_modules"), "NODE_PATH"),
    );
    set("PROJECT_ROOT", mount.clone());
    set("HOME", workdir.to_string_lossy().into_owned());
    set("PLINTH_SESSION_ID", session_id.to_owned());
    if has_venv {
        set("VIRTUAL_ENV", format!("{mount}/.venv"));
    }
    if given("LANG").is_none() {
        set("LANG", "C.UTF-8".to_owned());
    }
    env
}

/// Without isolation there is no namespace to mount the version in: `/env/<slug>` on the host
/// becomes a link to the version's directory (replaced atomically), so paths installed there
/// (venv shebangs, npm bin links) still resolve. Sessions of one environment on different
/// versions then share the newest link: one reason this mode is not for production.
pub fn link_unisolated(slug: &str, version_dir: &Path) -> std::io::Result<()> {
    let link = Path::new(ENV_ROOT).join(slug);
    if std::fs::read_link(&link).is_ok_and(|target| target == version_dir) {
        return Ok(());
    }
    std::fs::create_dir_all(ENV_ROOT)?;
    let temporary = Path::new(ENV_ROOT).join(format!(".{slug}.{}", std::process::id()));
    let _ = std::fs::remove_file(&temporary);
    std::os::unix::fs::symlink(version_dir, &temporary)?;
    std::fs::rename(&temporary, &link)
}

/// Whether `slug` is a slug (lowercase letters and digits in runs joined by `-`): the last
/// segment of `/env/<slug>`, and nothing else.
pub fn valid_slug(slug: &str) -> bool {
    !slug.is_empty()
        && slug.len() <= 128
        && !slug.starts_with('-')
        && !slug.ends_with('-')
        && slug
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Whether `name` may be an environment variable's name.
pub fn valid_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.as_bytes()[0].is_ascii_digit()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Whether `value` can be passed (no NUL).
pub fn valid_env_value(value: &str) -> bool {
    !OsStr::new(value).as_bytes().contains(&0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_comes_first_and_home_cannot_be_replaced() {
        let env = session_env(
            "sess_1",
            "demo",
            Path::new("/w"),
            true,
            &[
                ("PATH".into(), "/mine".into()),
                ("HOME".into(), "/elsewhere".into()),
                ("PLINTH_SESSION_ID".into(), "sess_2".into()),
                ("FOO".into(), "bar".into()),
            ],
        );
        let get = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        assert_eq!(
            get("PATH"),
            Some(
                "/env/demo/.venv/bin:/env/demo/node_modules/.bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/mine"
            )
        );
        assert_eq!(get("HOME"), Some("/w"));
        assert_eq!(get("PLINTH_SESSION_ID"), Some("sess_1"));
        assert_eq!(get("PROJECT_ROOT"), Some("/env/demo"));
        assert_eq!(get("PYTHONPATH"), Some("/env/demo"));
        assert_eq!(get("NODE_PATH"), Some("/env/demo/node_modules"));
        assert_eq!(get("FOO"), Some("bar"));
    }

    #[test]
    fn environment_names_are_checked() {
        assert!(valid_env_name("FOO_1"));
        assert!(!valid_env_name("1FOO"));
        assert!(!valid_env_name("A=B"));
        assert!(!valid_env_name(""));
    }
}
