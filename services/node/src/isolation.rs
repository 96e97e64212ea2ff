//! Isolating a session's commands, with direct system calls (no `unshare`/`mount` tools).
//!
//! Each session gets a sandbox when it attaches (or, after a node restart, before its first
//! command): a keeper process ([`plinth_sandbox::keeper`]), started on a dedicated thread of
//! the node ([`Namespaces`]), owns the session's PID, mount, IPC, UTS and network namespaces
//! and builds its root from an allow-list ([`plinth_sandbox::root`]): the version read-only at
//! `/env/<slug>`, the working directory at [`WORKDIR`], its own `/etc/passwd` and `/tmp`, the
//! node's tools at [`TOOLS`], and nothing of the node's state or other sessions. Each command
//! enters the keeper's namespaces ([`crate::spawn`]) as the session's uid with no capabilities;
//! ending the session kills the keeper and with it every process left in its PID namespace. The
//! host never holds any of the sandbox's mounts.
//!
//! What the root holds, path by path: `docs/design/SANDBOX.md#a-sessions-sandbox`.

use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use plinth_sandbox::keeper::{Keeper, KeeperError};

pub use crate::session_sandbox::Sandbox;
use plinth_sandbox::root::{Bind, RootPlan, RootSpec};

/// Where environments appear.
pub const ENV_ROOT: &str = plinth_kit::slug::MOUNT_ROOT;

/// Where an isolated session sees its own working directory (its `HOME` and starting
/// directory), whatever the host path: mounted there in the session's namespace.
pub const WORKDIR: &str = "/home/session";

/// Where an isolated session finds the node's tools (`uv`): the node's tools directory,
/// shown read-only, on `PATH` after the environment's own directories.
pub const TOOLS: &str = "/plinth/bin";

/// Size of a session's private `/tmp`, at most: half its memory limit when that is less.
pub const TMP_BYTES: u64 = 256 * 1024 * 1024;
/// Size of a session's private `/dev/shm`, at most: a quarter of its memory limit when that
/// is less.
pub const SHM_BYTES: u64 = 64 * 1024 * 1024;

/// The sizes of a session's `/tmp` and `/dev/shm` under a memory limit of `memory_bytes`.
///
/// Their files are charged to the session's memory cgroup, and killing processes frees none
/// of it: were they as large as the limit, a session that filled them would be left at its
/// limit for good, every later command OOM-killed. So together they hold at most three
/// quarters of it (a fill ends in `ENOSPC`), and a quarter always stays for commands.
pub fn tmpfs_sizes(memory_bytes: Option<u64>) -> (u64, u64) {
    match memory_bytes {
        Some(memory) => (TMP_BYTES.min(memory / 2), SHM_BYTES.min(memory / 4)),
        None => (TMP_BYTES, SHM_BYTES),
    }
}

/// The PATH a session's shell starts from, after the environment's own directories.
pub const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How commands are isolated on this node.
#[derive(Debug, Clone)]
pub struct Isolation {
    /// False only with `--insecure-no-isolation`.
    pub enabled: bool,
    /// Each session's cgroup is made under these (detected at start; isolated nodes only).
    pub cgroups: Option<Arc<plinth_sandbox::cgroup::Cgroups>>,
    /// A session's memory, process and CPU limits.
    pub limits: plinth_sandbox::cgroup::Limits,
    /// What sessions may reach: nothing but their own loopback (`None`), or the internet
    /// through the node's filtering proxy.
    pub egress: Option<Arc<plinth_sandbox::egress::EgressPolicy>>,
    /// The system calls sessions' commands may not make.
    pub seccomp: Option<&'static plinth_sandbox::seccomp::Filter>,
    /// Network namespaces made ahead (with the egress proxy's listener bound in each when
    /// sessions have egress); set at start on isolated nodes.
    pub networks: Option<Arc<plinth_sandbox::egress::SpareNetworks>>,
    /// Paths never shown to sessions (the node's state, the data directory, the
    /// configuration file): absent from their root, and covered should they lie beneath a
    /// system directory it shows.
    pub hidden: Vec<PathBuf>,
    /// The node's tools directory, holding its copy of the host's `uv` (set at start when the
    /// host has one): shown at [`TOOLS`] to isolated sessions, on `PATH` as it is otherwise.
    pub tools: Option<PathBuf>,
    /// The node's copy of the host's `/etc`, what sessions see there (an allow-list,
    /// [`plinth_sandbox::root::copy_etc`]); made at start on isolated nodes. `None` shows the
    /// host's whole `/etc`.
    pub etc: Option<PathBuf>,
    /// Each scope's CPU weight, divided among its sessions on this node.
    pub shares: Arc<crate::shares::Shares>,
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

/// Why a command or a sandbox could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// A path or value holds a NUL byte.
    #[error("{0} contains a NUL byte")]
    Nul(&'static str),
    /// Isolated commands run in their session's sandbox, and there is none.
    #[error("the session has no sandbox")]
    NoNamespace,
    /// The sandbox's root could not be planned.
    #[error("planning the session's sandbox: {0}")]
    Plan(#[from] plinth_sandbox::root::RootError),
    /// The sandbox could not be made.
    #[error(transparent)]
    Keeper(#[from] KeeperError),
    /// The namespace thread is gone.
    #[error("the node's namespace thread has stopped; restart the node agent")]
    Stopped,
}

fn c_path(path: &Path, what: &'static str) -> Result<CString, LaunchError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| LaunchError::Nul(what))
}

/// What a session's sandbox holds, prepared before the namespace thread makes it.
#[derive(Debug)]
pub struct NamespacePlan {
    root: RootPlan,
}

/// Why this node cannot isolate sessions.
#[derive(Debug, thiserror::Error)]
pub enum CannotIsolate {
    /// Not root: no mount namespaces or uid switches.
    #[error(
        "the node agent is not running as root: it cannot give sessions a private mount \
         namespace with a read-only environment and their own uid. Run it as root, or pass \
         --insecure-no-isolation to run commands unisolated (every session will say so)"
    )]
    NotRoot,
    /// The directory the sandboxes' roots are built over could not be made.
    #[error("creating {root}: {0}", root = ENV_ROOT)]
    EnvRoot(std::io::Error),
}

impl Isolation {
    /// Checks the node can isolate sessions: root (mount namespaces and uid switches).
    pub fn check(&self) -> Result<(), CannotIsolate> {
        if !self.enabled {
            return Ok(());
        }
        if !rustix::process::geteuid().is_root() {
            return Err(CannotIsolate::NotRoot);
        }
        // The sandbox's root is built on a tmpfs mounted over /env in its own namespace.
        std::fs::create_dir_all(ENV_ROOT).map_err(CannotIsolate::EnvRoot)
    }

    /// The command, ready to spawn: in `namespace` (the session's) and as the session's uid
    /// when isolated.
    pub fn command(
        &self,
        launch: &Launch,
        namespace: Option<Arc<Sandbox>>,
        cgroup: Option<plinth_sandbox::cgroup::SessionCgroup>,
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
            cgroup,
            seccomp: if self.enabled { self.seccomp } else { None },
            uid,
            terminal: None,
            stdin: None,
        })
    }

    /// What a session's sandbox holds: `version_dir` (over its `lower` layers) read-only at
    /// `/env/<slug>`, `workdir` at [`WORKDIR`], its `identity` over the host's user and group
    /// databases, the node's tools at [`TOOLS`], the system directories read-only, nothing
    /// else of the node; its `/tmp` and `/dev/shm` sized for `memory_bytes`, its memory limit
    /// ([`tmpfs_sizes`]).
    pub fn namespace_plan(
        &self,
        version_dir: &Path,
        lower: &[PathBuf],
        slug: &str,
        workdir: &Path,
        identity: Option<&crate::identity::Identity>,
        memory_bytes: Option<u64>,
    ) -> Result<NamespacePlan, LaunchError> {
        let (tmp_bytes, shm_bytes) = tmpfs_sizes(memory_bytes);
        let read_only = |host: &Path, inside: &str| Bind {
            host: host.to_owned(),
            lower: Vec::new(),
            inside: PathBuf::from(inside),
            read_only: true,
        };
        let mut spec = RootSpec {
            cover: self.hidden.clone(),
            binds: vec![
                Bind {
                    host: version_dir.to_owned(),
                    lower: lower.to_vec(),
                    inside: PathBuf::from(plinth_kit::slug::mount(slug)),
                    read_only: true,
                },
                Bind {
                    host: workdir.to_owned(),
                    lower: Vec::new(),
                    inside: PathBuf::from(WORKDIR),
                    read_only: false,
                },
            ],
            tmp_bytes,
            tmp_host: None,
            shm_bytes,
            etc: self.etc.clone(),
        };
        if let Some(identity) = identity {
            spec.binds.extend([
                read_only(&identity.passwd, crate::identity::HOST_PASSWD),
                read_only(&identity.group, crate::identity::HOST_GROUP),
            ]);
        }
        if let Some(tools) = &self.tools {
            spec.binds.push(read_only(tools, TOOLS));
        }
        Ok(NamespacePlan {
            root: RootPlan::new(&spec)?,
        })
    }
}

/// Starts sessions' keepers on one dedicated thread, which lives as long as the node: a
/// keeper is killed when the thread that started it ends. What else runs on that thread is a
/// session's setup around its sandbox (its directories), handed over in the same job so an
/// attach costs one hand-off.
#[derive(Debug, Clone)]
pub struct Namespaces {
    jobs: std::sync::mpsc::Sender<Job>,
}

type Job = Box<dyn FnOnce(&NamespaceThread) + Send>;

/// The namespace thread, as a job sees it.
pub struct NamespaceThread {
    _private: (),
}

impl NamespaceThread {
    /// Starts one session's keeper, its sandbox built as `plan` says, in the cgroup made for
    /// it (whose descriptors the keeper writes itself into first).
    pub fn make(
        &self,
        plan: &NamespacePlan,
        cgroup: Option<&plinth_sandbox::cgroup::SessionCgroup>,
        network: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<Keeper, LaunchError> {
        let join = cgroup.map_or(&[][..], |cgroup| cgroup.join_fds());
        Ok(Keeper::start(&plan.root, join, network)?)
    }
}

impl Namespaces {
    /// Starts the thread.
    pub fn start() -> std::io::Result<Self> {
        let (jobs, queue) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("plinth-namespaces".to_owned())
            .spawn(move || {
                let thread = NamespaceThread { _private: () };
                for job in queue {
                    job(&thread);
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

/// What a session's environment is made from (see [`session_env`]).
#[derive(Debug, Clone, Copy)]
pub struct SessionEnv<'a> {
    /// `sess_…`.
    pub session_id: &'a str,
    /// The environment's slug: the version is at `/env/<slug>`.
    pub slug: &'a str,
    /// The working directory as commands see it.
    pub workdir: &'a Path,
    /// The version has a `.venv`.
    pub has_venv: bool,
    /// The version is a uv project: a `pyproject.toml` beside its `.venv`.
    pub uv_project: bool,
    /// Where commands find the node's `uv` ([`TOOLS`] when isolated), when it has one.
    pub tools: Option<&'a Path>,
    /// Its commands run in its sandbox, as its own uid, which the sandbox names
    /// ([`crate::identity`]); otherwise as the node's own user.
    pub isolated: bool,
}

/// The environment a session's commands get (UHP §6.3): the environment's tools first on
/// `PATH` (then the node's `uv`), `PYTHONPATH`/`NODE_PATH` starting with it, `PROJECT_ROOT`,
/// `HOME` = the working directory, `PLINTH_SESSION_ID` = the session's id. Caller-given
/// variables come first; `PATH`, `PYTHONPATH` and `NODE_PATH` given by the caller follow the
/// environment's entries, and `HOME`, `PROJECT_ROOT` and `PLINTH_SESSION_ID` cannot be
/// replaced.
///
/// Everyday tools write caches and data beside the project they run on (pytest's
/// `.pytest_cache`, Hypothesis's `.hypothesis`, coverage's `.coverage`, ruff's `.ruff_cache`,
/// mypy's `.mypy_cache`), and the project is read-only: pytest then exits 1 after every test
/// passed when warnings are errors, and ruff aborts. So every cache is sent beneath
/// `XDG_CACHE_HOME` (`$HOME/.cache`, private to the session and kept between its commands) and
/// coverage's data to `$HOME/.coverage`, each variable only when the caller did not set it;
/// see [`tool_env`]. `uv` runs the environment as built: offline, never downloading a
/// Python, and for a uv project with the version's `.venv` as the project's environment and
/// no sync (which would lock and install into the read-only version).
pub fn session_env(session: &SessionEnv<'_>, extra: &[(String, String)]) -> Vec<(String, String)> {
    let mount = plinth_kit::slug::mount(session.slug);
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
    let tools = session
        .tools
        .map(|tools| format!("{}:", tools.display()))
        .unwrap_or_default();
    set(
        "PATH",
        join(
            format!("{mount}/.venv/bin:{mount}/node_modules/.bin:{tools}{SYSTEM_PATH}"),
            "PATH",
        ),
    );
    set("PYTHONPATH", join(mount.clone(), "PYTHONPATH"));
    set(
        "NODE_PATH",
        join(format!("{mount}/node_modules"), "NODE_PATH"),
    );
    set("PROJECT_ROOT", mount.clone());
    let home = session.workdir.to_string_lossy().into_owned();
    set("HOME", home.clone());
    set("PLINTH_SESSION_ID", session.session_id.to_owned());
    let mut defaults = vec![("LANG", "C.UTF-8".to_owned())];
    if session.has_venv {
        set("VIRTUAL_ENV", format!("{mount}/.venv"));
        if session.uv_project {
            defaults.extend([
                ("UV_PROJECT_ENVIRONMENT", format!("{mount}/.venv")),
                ("UV_NO_SYNC", "1".to_owned()),
            ]);
        }
    }
    if session.isolated {
        let user = crate::identity::USER;
        defaults.extend([("USER", user.to_owned()), ("LOGNAME", user.to_owned())]);
    } else {
        // Unisolated commands run as the node's user, which may own (or, as root, write)
        // the cached version: Python would leave `__pycache__` in it, for every session.
        defaults.push(("PYTHONDONTWRITEBYTECODE", "1".to_owned()));
    }
    defaults.extend(tool_env(&home, given("XDG_CACHE_HOME").as_deref()));
    for (name, value) in defaults {
        if given(name).is_none() {
            set(name, value);
        }
    }
    env
}

/// Where everyday tools keep their caches and data and what `uv` may do, beneath `cache` (the
/// caller's `XDG_CACHE_HOME`) or `$HOME/.cache`, or in `home`: never beside the read-only
/// project, so its tests run from it (`cd $PROJECT_ROOT && python -m pytest`, where its own
/// configuration applies) without a write there failing them.
///
/// | variable | for | default it replaces |
/// |---|---|---|
/// | `XDG_CACHE_HOME` | everything that follows XDG (pip, black, pre-commit, go, yarn…) | `$HOME/.cache` already |
/// | `PYTEST_ADDOPTS=-o cache_dir=…` | pytest's cache (so `--lf` still works) | `.pytest_cache` in the rootdir |
/// | `HYPOTHESIS_STORAGE_DIRECTORY` | Hypothesis's example database and caches | `.hypothesis` in the current directory |
/// | `COVERAGE_FILE=$HOME/.coverage` | coverage's data (data, not a cache: in `home`, not `cache`) | `.coverage` in the current directory |
/// | `RUFF_CACHE_DIR` | ruff | `.ruff_cache` in the project |
/// | `MYPY_CACHE_DIR` | mypy | `.mypy_cache` in the current directory |
/// | `PIP_CACHE_DIR`, `UV_CACHE_DIR`, `npm_config_cache` | installers' downloads | `$HOME/.cache/…`, `$HOME/.npm` |
/// | `UV_OFFLINE=1`, `UV_PYTHON_DOWNLOADS=never` | `uv` runs what is installed | resolving, downloading a Python |
///
/// Unwritable, each of the defaults fails a suite that passes: pytest's cache and Hypothesis's
/// database warn (an error under `filterwarnings = error`), and coverage cannot save its data.
///
/// Not `PYTHONPYCACHEPREFIX`: Python skips a `__pycache__` it cannot write without a word,
/// and the build compiled the environment's bytecode already, which a prefix would make
/// Python ignore and compile again, system modules too, into every session.
pub fn tool_env(home: &str, cache: Option<&str>) -> Vec<(&'static str, String)> {
    let cache = cache
        .filter(|cache| !cache.is_empty())
        .map_or_else(|| format!("{home}/.cache"), str::to_owned);
    vec![
        ("XDG_CACHE_HOME", cache.clone()),
        // pytest splits it as a shell would.
        (
            "PYTEST_ADDOPTS",
            format!("-o {}", shell_word(&format!("cache_dir={cache}/pytest"))),
        ),
        (
            "HYPOTHESIS_STORAGE_DIRECTORY",
            format!("{cache}/hypothesis"),
        ),
        ("COVERAGE_FILE", format!("{home}/.coverage")),
        ("RUFF_CACHE_DIR", format!("{cache}/ruff")),
        ("MYPY_CACHE_DIR", format!("{cache}/mypy")),
        ("PIP_CACHE_DIR", format!("{cache}/pip")),
        ("UV_CACHE_DIR", format!("{cache}/uv")),
        ("npm_config_cache", format!("{cache}/npm")),
        ("UV_OFFLINE", "1".to_owned()),
        ("UV_PYTHON_DOWNLOADS", "never".to_owned()),
    ]
}

/// `word` as one word of a POSIX shell's command line: as it is when nothing in it is special,
/// else single-quoted.
fn shell_word(word: &str) -> String {
    if word
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/._-=:+,@%".contains(&b))
    {
        return word.to_owned();
    }
    format!("'{}'", word.replace('\'', "'\"'\"'"))
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
    plinth_kit::slug::is_valid(slug)
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

    fn demo(tools: Option<&Path>) -> SessionEnv<'_> {
        SessionEnv {
            session_id: "sess_1",
            slug: "demo",
            workdir: Path::new("/w"),
            has_venv: true,
            uv_project: true,
            tools,
            isolated: true,
        }
    }

    #[test]
    fn the_environment_comes_first_and_home_cannot_be_replaced() {
        let env = session_env(
            &demo(Some(Path::new(TOOLS))),
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
                "/env/demo/.venv/bin:/env/demo/node_modules/.bin:/plinth/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/mine"
            )
        );
        assert_eq!(get("HOME"), Some("/w"));
        assert_eq!(get("PLINTH_SESSION_ID"), Some("sess_1"));
        assert_eq!(get("PROJECT_ROOT"), Some("/env/demo"));
        assert_eq!(get("PYTHONPATH"), Some("/env/demo"));
        assert_eq!(get("NODE_PATH"), Some("/env/demo/node_modules"));
        assert_eq!(get("VIRTUAL_ENV"), Some("/env/demo/.venv"));
        assert_eq!(get("USER"), Some("session"));
        assert_eq!(get("LOGNAME"), Some("session"));
        assert_eq!(get("FOO"), Some("bar"));
    }

    #[test]
    fn caches_go_to_the_working_directory_unless_the_caller_says_otherwise() {
        let env = session_env(&demo(None), &[]);
        let get = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        for (name, value) in [
            ("XDG_CACHE_HOME", "/w/.cache"),
            ("PYTEST_ADDOPTS", "-o cache_dir=/w/.cache/pytest"),
            ("HYPOTHESIS_STORAGE_DIRECTORY", "/w/.cache/hypothesis"),
            ("COVERAGE_FILE", "/w/.coverage"),
            ("RUFF_CACHE_DIR", "/w/.cache/ruff"),
            ("MYPY_CACHE_DIR", "/w/.cache/mypy"),
            ("PIP_CACHE_DIR", "/w/.cache/pip"),
            ("UV_CACHE_DIR", "/w/.cache/uv"),
            ("npm_config_cache", "/w/.cache/npm"),
            ("UV_OFFLINE", "1"),
            ("UV_PYTHON_DOWNLOADS", "never"),
            ("UV_NO_SYNC", "1"),
            ("UV_PROJECT_ENVIRONMENT", "/env/demo/.venv"),
        ] {
            assert_eq!(get(name), Some(value), "{name}");
        }
        assert!(
            get("PATH").is_some_and(|path| !path.contains("/plinth/bin")),
            "no uv, no tools directory on PATH"
        );
        // Python skips bytecode it cannot write on its own; a prefix would make it ignore
        // what the build compiled (the venv's, the system's) and compile it all again into
        // every session's working directory.
        assert_eq!(get("PYTHONPYCACHEPREFIX"), None);
        assert_eq!(get("PYTHONDONTWRITEBYTECODE"), None);

        // A caller's cache directory moves every cache; its own settings are kept.
        let env = session_env(
            &demo(None),
            &[
                ("XDG_CACHE_HOME".into(), "/tmp/my cache".into()),
                ("PYTEST_ADDOPTS".into(), "-p no:cacheprovider".into()),
                ("UV_OFFLINE".into(), "0".into()),
                ("USER".into(), "agent".into()),
            ],
        );
        let get = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        assert_eq!(get("XDG_CACHE_HOME"), Some("/tmp/my cache"));
        assert_eq!(get("RUFF_CACHE_DIR"), Some("/tmp/my cache/ruff"));
        assert_eq!(
            get("HYPOTHESIS_STORAGE_DIRECTORY"),
            Some("/tmp/my cache/hypothesis")
        );
        // Coverage's data is not a cache: it stays in the working directory.
        assert_eq!(get("COVERAGE_FILE"), Some("/w/.coverage"));
        assert_eq!(get("PYTEST_ADDOPTS"), Some("-p no:cacheprovider"));
        assert_eq!(get("UV_OFFLINE"), Some("0"));
        assert_eq!(get("USER"), Some("agent"));
        assert_eq!(
            env.iter().filter(|(k, _)| k == "XDG_CACHE_HOME").count(),
            1,
            "{env:?}"
        );

        // uv is told about the project's environment only where there is a uv project.
        let env = session_env(
            &SessionEnv {
                uv_project: false,
                isolated: false,
                ..demo(None)
            },
            &[],
        );
        let get = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        assert_eq!(get("UV_NO_SYNC"), None);
        assert_eq!(get("UV_PROJECT_ENVIRONMENT"), None);
        assert_eq!(get("USER"), None);
        assert_eq!(get("PYTHONDONTWRITEBYTECODE"), Some("1"));
        assert_eq!(get("VIRTUAL_ENV"), Some("/env/demo/.venv"));
    }

    #[test]
    fn pytest_options_are_quoted_as_a_shell_would_split_them() {
        let env = tool_env("/srv/my sessions/s/work", None);
        let addopts = env
            .iter()
            .find(|(name, _)| *name == "PYTEST_ADDOPTS")
            .map(|(_, value)| value.as_str());
        assert_eq!(
            addopts,
            Some("-o 'cache_dir=/srv/my sessions/s/work/.cache/pytest'")
        );
        assert_eq!(shell_word("it's"), "'it'\"'\"'s'");
    }

    #[test]
    fn environment_names_are_checked() {
        assert!(valid_env_name("FOO_1"));
        assert!(!valid_env_name("1FOO"));
        assert!(!valid_env_name("A=B"));
        assert!(!valid_env_name(""));
    }
}
