//! The build sandbox: runs one command of a build at the environment's mount path, as an
//! unprivileged user, in private namespaces, with a time limit, streaming its output.
//!
//! It is the sessions' recipe ([`plinth_sandbox`]), so sessions and builds cannot drift apart in
//! what they hide: the same allow-listed root ([`plinth_sandbox::root`], never the host's root
//! minus a deny-list), the same seccomp filter, the same egress proxy. The command sees its
//! scratch directory at `/env/<slug>`, its own HOME and `/tmp`, the system directories and tools
//! read-only, and nothing of other builds, sessions or Plinth's state. When it ends, times out or
//! the run is dropped, every process it left dies with its PID namespace. Setup is raw system
//! calls between `fork` and `exec` on data prepared before the fork: nothing is allocated and no
//! lock is taken there. Limits: [`Sandbox::cgroup`] and [`Sandbox::timeout`].
//!
//! What the command sees, path by path, and the three processes that set it up:
//! `docs/design/builds.md#the-build-sandbox`.

mod child;

use std::ffi::CString;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use plinth_sandbox::root::{Bind, RootPlan, RootSpec, SYSTEM_DIRS};
use plinth_sandbox::seccomp::Filter;
use rustix::thread::UnshareFlags;
use tokio::sync::mpsc;

use self::child::{Plan, enter};

/// Where environments are mounted; inside the sandbox, the root's own directory.
pub const ENV_ROOT: &str = "/env";
/// The command's `HOME` inside the sandbox.
pub const HOME: &str = "/env/.home";

/// What a failed setup step writes before its name (and what the error reports).
const CANNOT: &[u8] = b"plinth-sandbox: cannot ";
/// At most this much setup output is kept for an error message.
const SETUP_OUTPUT_CAP: u64 = 64 * 1024;
/// How long to wait for the output pipe to close once the sandbox is dead.
const DRAIN_AFTER_KILL: Duration = Duration::from_secs(5);
/// How long a killed namespace may take to empty before its waiter is killed outright.
const TEARDOWN_GRACE: Duration = Duration::from_secs(10);
/// Size of the build's private `/dev/shm`.
const SHM_BYTES: u64 = 64 * 1024 * 1024;
/// Host paths a build sees as its own, whatever the host has there.
const OWN_PATHS: [&str; 4] = [ENV_ROOT, "/tmp", "/dev", "/proc"];

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error(
        "the build sandbox is not permitted here: {0}. Run the builder as root (in a container: \
         with CAP_SYS_ADMIN, CAP_SETUID, CAP_SETGID, CAP_SETPCAP, CAP_CHOWN and a \
         seccomp/AppArmor profile that allows unshare and mount)"
    )]
    NotPermitted(String),
    #[error(
        "invalid environment slug {0:?}: use letters, digits, '.', '_' and '-', not starting with '.' or '-'"
    )]
    InvalidSlug(String),
    #[error("invalid hidden path {0:?}: it must be absolute and not the root")]
    InvalidHiddenPath(PathBuf),
    #[error("the sandbox's directories must be absolute paths, not {0:?}")]
    RelativePath(PathBuf),
    #[error("{path:?} cannot be shown to builds: {why}")]
    CannotShow { path: PathBuf, why: String },
    #[error("invalid command or environment for the sandbox: {0}")]
    InvalidCommand(String),
    #[error("could not set up the build sandbox: {0}")]
    Setup(String),
    #[error("exceeded its time limit of {limit:?} and was killed")]
    TimedOut { limit: Duration },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl SandboxError {
    fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> SandboxError {
        let context = context.into();
        move |source| SandboxError::Io { context, source }
    }
}

/// One build's sandbox. Every path is a host path and should be absolute.
#[derive(Debug, Clone)]
pub struct Sandbox {
    /// The environment's slug: the command runs in `/env/<slug>`.
    pub slug: String,
    /// The scratch directory holding the source, mounted read-write at `/env/<slug>`.
    pub root: PathBuf,
    /// The build's HOME, mounted at [`HOME`].
    pub home: PathBuf,
    /// The build's own `/tmp`.
    pub tmp: PathBuf,
    /// Host directories shown read-only at their own path besides the system directories: the
    /// tools directory, find-links ([`shown_directories`]). None may be or hold a hidden path.
    pub shown: Vec<PathBuf>,
    pub uid: u32,
    pub gid: u32,
    /// Host paths never shown: covered by an empty read-only tmpfs (directories) or `/dev/null`
    /// (files) where they fall beneath a system directory; absent anywhere else.
    pub hidden_paths: Vec<PathBuf>,
    /// The network the command is given.
    pub network: Network,
    /// The wall-clock limit for one command.
    pub timeout: Duration,
    /// The build's cgroup ([`crate::limits`]): every process of the command is in it.
    pub cgroup: Option<Arc<plinth_sandbox::cgroup::SessionCgroup>>,
}

/// The network a build's command is given.
#[derive(Debug, Clone)]
pub enum Network {
    /// A network namespace of the command's own, holding only its loopback: no network.
    None,
    /// The network namespace behind this descriptor (a build's, whose only way out is the
    /// egress proxy the builder serves in it).
    Join(Arc<OwnedFd>),
    /// The host's network, unfiltered.
    Host,
}

/// Checks a slug is one path segment that cannot collide with the sandbox's own `/env/.home`,
/// nor be read as an option.
pub fn validate_slug(slug: &str) -> Result<(), SandboxError> {
    if plinth_kit::slug::is_valid(slug) {
        Ok(())
    } else {
        Err(SandboxError::InvalidSlug(slug.to_owned()))
    }
}

/// Why a build could not be shown `path` as it is on the host, if it could not: `/env`, `/tmp`,
/// `/dev` and `/proc` are the sandbox's own, and a hidden path is never shown. For a path a
/// build must reach (the tools directory), so a configuration that hides it is refused at start
/// instead of failing every build with "No such file".
pub fn hidden_from_builds(path: &Path, hidden_paths: &[PathBuf]) -> Option<String> {
    let bytes = path.as_os_str().as_bytes();
    for own in OWN_PATHS {
        if path_is_under(bytes, own.as_bytes()) {
            return Some(format!(
                "{} is under {own}, which the build sandbox replaces with its own",
                path.display()
            ));
        }
    }
    if let Some(hidden) = hidden_paths.iter().find(|hidden| path.starts_with(hidden)) {
        return Some(format!(
            "{} is under {}, which the build sandbox hides (Plinth's data and the builder's \
             state)",
            path.display(),
            hidden.display()
        ));
    }
    hidden_paths
        .iter()
        .find(|hidden| hidden.starts_with(path))
        .map(|hidden| {
            format!(
                "{} holds {}, which the build sandbox hides (Plinth's data and the builder's \
                 state): showing it would show that too",
                path.display(),
                hidden.display()
            )
        })
}

/// Refuses early when the sandbox cannot work: it needs root to mount and to change uid.
pub fn check_permitted() -> Result<(), SandboxError> {
    if rustix::process::geteuid().is_root() {
        Ok(())
    } else {
        Err(SandboxError::NotPermitted(
            "the builder is not running as root, and the sandbox mounts in a private mount \
             namespace and switches to an unprivileged uid"
                .to_owned(),
        ))
    }
}

/// The exit status as one number: the exit code, or 128 + the signal that killed it (as a shell
/// reports it).
pub fn status_code(status: ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// The host directories a build is shown read-only at their own path: each absolute directory
/// on the installers' `path` that is not beneath a system directory (the tools directory, where
/// `uv` and the certificate bundle's copy are), then `extra` (find-links), without one that
/// lies beneath another or does not exist.
pub fn shown_directories(path: &str, extra: &[PathBuf]) -> Vec<PathBuf> {
    let candidates = path
        .split(':')
        .map(PathBuf::from)
        .chain(extra.iter().cloned())
        .filter(|dir| dir.is_absolute() && dir.is_dir())
        .filter(|dir| !SYSTEM_DIRS.iter().any(|system| dir.starts_with(system)));
    let mut shown: Vec<PathBuf> = Vec::new();
    for dir in candidates {
        if shown.iter().any(|kept| dir.starts_with(kept)) {
            continue;
        }
        shown.retain(|kept| !kept.starts_with(&dir));
        shown.push(dir);
    }
    shown
}

impl Sandbox {
    /// The command's working directory and the environment's mount path: `/env/<slug>`.
    pub fn mount_path(&self) -> String {
        format!("{ENV_ROOT}/{}", self.slug)
    }

    /// Runs `argv` (looked up on `env`'s PATH) in the sandbox with exactly `env` as its
    /// environment, passing its stdout and stderr, interleaved as written, to `output` as they
    /// come. Returns its exit status; a command past the time limit is killed with everything it
    /// started, and that is [`SandboxError::TimedOut`].
    pub async fn run(
        &self,
        argv: &[String],
        env: &[(String, String)],
        output: &mut (dyn FnMut(&[u8]) + Send),
    ) -> Result<ExitStatus, SandboxError> {
        validate_slug(&self.slug)?;
        check_permitted()?;
        // The root's tmpfs needs a mount point; an empty directory on the host is all it leaves
        // there.
        std::fs::create_dir_all(ENV_ROOT)
            .map_err(SandboxError::io(format!("creating {ENV_ROOT} on the host")))?;
        let plan = self.plan(argv, env)?;

        let (reader, writer) = std::io::pipe().map_err(SandboxError::io("creating a pipe"))?;
        let stderr = writer
            .try_clone()
            .map_err(SandboxError::io("creating a pipe"))?;
        let mut command = tokio::process::Command::new(&argv[0]);
        command
            .args(&argv[1..])
            .env_clear()
            .envs(env.iter().map(|(name, value)| (name, value)))
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(stderr)
            // Its own process group, the fallback for a timeout; and if this future is dropped,
            // the waiter is killed, and the namespace's first process with it.
            .process_group(0)
            .kill_on_drop(true);
        // SAFETY: the closure runs in the child std forks, before exec. It only makes raw system
        // calls on data `plan` prepared before the fork (it owns the root's plan of C strings,
        // the network namespace's descriptor and a reference to the compiled filter; nothing
        // is allocated, no lock is taken), and the processes it forks do the same until they
        // exit or exec (see `enter`), as `pre_exec` requires.
        #[allow(unsafe_code)]
        unsafe {
            command.pre_exec(move || enter(&plan).map_err(std::io::Error::from));
        }
        // Returns once the command is executing or the setup failed (a few milliseconds of
        // system calls).
        let spawned = command.spawn();
        // The command holds our copies of the pipe's write end: drop them, or EOF never comes.
        drop(command);
        let mut child = match spawned {
            Ok(child) => child,
            Err(error) => return Err(setup_error(error, reader, &argv[0])),
        };

        let (chunks, mut received) = mpsc::channel::<Vec<u8>>(16);
        // A blocking reader on its own thread: one pipe for both streams keeps their order,
        // and the bounded channel makes a chatty command wait for the log, not fill memory.
        let reader_task = tokio::task::spawn_blocking(move || {
            let mut reader = reader;
            let mut buffer = vec![0u8; 64 * 1024];
            loop {
                match reader.read(&mut buffer) {
                    Ok(0) => break,
                    Ok(read) => {
                        if chunks.blocking_send(buffer[..read].to_vec()).is_err() {
                            break;
                        }
                    }
                    Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
        });

        let deadline = tokio::time::sleep(self.timeout);
        tokio::pin!(deadline);
        let mut status = None;
        let mut eof = false;
        while status.is_none() || !eof {
            tokio::select! {
                chunk = received.recv(), if !eof => match chunk {
                    Some(chunk) => output(&chunk),
                    None => eof = true,
                },
                exited = child.wait(), if status.is_none() => {
                    status = Some(exited.map_err(SandboxError::io("waiting for the sandbox"))?);
                }
                () = &mut deadline => {
                    stop(&mut child).await;
                    // Whatever was written before the kill still belongs in the log.
                    let _ = tokio::time::timeout(DRAIN_AFTER_KILL, async {
                        while let Some(chunk) = received.recv().await {
                            output(&chunk);
                        }
                    })
                    .await;
                    return Err(SandboxError::TimedOut { limit: self.timeout });
                }
            }
        }
        let _ = reader_task.await;
        status.ok_or_else(|| SandboxError::Setup("no exit status".to_owned()))
    }

    /// Checks the command and the sandbox's paths and prepares everything the child needs: the
    /// root's steps as C strings, the namespaces, the filter.
    fn plan(&self, argv: &[String], env: &[(String, String)]) -> Result<Plan, SandboxError> {
        let Some(program) = argv.first() else {
            return Err(SandboxError::InvalidCommand("empty command".to_owned()));
        };
        // A word with '=' in the program's place is an assignment to a shell or `env`: no
        // manifest names a program that way.
        if program.is_empty() || program.contains('=') {
            return Err(SandboxError::InvalidCommand(format!(
                "program name {program:?}"
            )));
        }
        if argv.iter().any(|arg| arg.contains('\0')) {
            return Err(SandboxError::InvalidCommand(
                "a NUL in an argument".to_owned(),
            ));
        }
        for (name, value) in env {
            if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
                return Err(SandboxError::InvalidCommand(format!(
                    "environment variable {name:?}"
                )));
            }
        }
        let own = [&self.root, &self.home, &self.tmp];
        if let Some(relative) = own
            .into_iter()
            .chain(&self.shown)
            .find(|path| !path.is_absolute())
        {
            return Err(SandboxError::RelativePath(relative.clone()));
        }
        for hidden in &self.hidden_paths {
            if !hidden.is_absolute() || hidden == Path::new("/") {
                return Err(SandboxError::InvalidHiddenPath(hidden.clone()));
            }
        }
        // The root is built on a tmpfs over /env: a host directory beneath it is out of reach
        // by then.
        if let Some(under) = own
            .into_iter()
            .find(|path| path_is_under(path.as_os_str().as_bytes(), ENV_ROOT.as_bytes()))
        {
            return Err(SandboxError::CannotShow {
                path: under.clone(),
                why: format!("the build sandbox builds its root over {ENV_ROOT}"),
            });
        }
        for shown in &self.shown {
            if let Some(why) = hidden_from_builds(shown, &self.hidden_paths) {
                return Err(SandboxError::CannotShow {
                    path: shown.clone(),
                    why,
                });
            }
        }
        let mut binds = vec![
            Bind {
                host: self.root.clone(),
                lower: Vec::new(),
                inside: PathBuf::from(self.mount_path()),
                read_only: false,
            },
            Bind {
                host: self.home.clone(),
                lower: Vec::new(),
                inside: PathBuf::from(HOME),
                read_only: false,
            },
        ];
        binds.extend(self.shown.iter().map(|dir| Bind {
            host: dir.clone(),
            lower: Vec::new(),
            inside: dir.clone(),
            read_only: true,
        }));
        let spec = RootSpec {
            cover: self.hidden_paths.clone(),
            binds,
            tmp_bytes: 0,
            tmp_host: Some(self.tmp.clone()),
            shm_bytes: SHM_BYTES,
            // The host's whole `/etc`: builds read registries' configuration there.
            etc: None,
        };
        let root = RootPlan::new(&spec).map_err(|error| SandboxError::Setup(error.to_string()))?;
        let seccomp = Filter::shared()
            .map_err(|error| SandboxError::Setup(format!("the seccomp filter: {error}")))?;
        // A cgroup namespace too, as sessions have: the build sees its cgroup as the root.
        let mut namespaces = UnshareFlags::NEWNS
            | UnshareFlags::NEWPID
            | UnshareFlags::NEWIPC
            | UnshareFlags::NEWUTS
            | UnshareFlags::NEWCGROUP;
        let netns = match &self.network {
            Network::None => {
                namespaces |= UnshareFlags::NEWNET;
                None
            }
            Network::Join(netns) => Some(netns.clone()),
            Network::Host => None,
        };
        Ok(Plan {
            namespaces,
            netns,
            loopback: matches!(self.network, Network::None),
            root,
            mount_path: c_string(self.mount_path().as_bytes())?,
            uid: rustix::process::Uid::from_raw(self.uid),
            gid: rustix::process::Gid::from_raw(self.gid),
            seccomp,
            cgroup: self.cgroup.clone(),
        })
    }
}

fn c_string(bytes: &[u8]) -> Result<CString, SandboxError> {
    CString::new(bytes).map_err(|_| {
        SandboxError::InvalidCommand(format!(
            "a NUL in the path {:?}",
            String::from_utf8_lossy(bytes)
        ))
    })
}

/// The error for a spawn that failed: a setup step that said which it was (on the command's
/// stderr, read here to the end: every process of the sandbox is gone by now), or else the
/// command itself could not be executed.
fn setup_error(error: std::io::Error, reader: std::io::PipeReader, program: &str) -> SandboxError {
    let mut said = Vec::new();
    let _ = reader.take(SETUP_OUTPUT_CAP).read_to_end(&mut said);
    let said = String::from_utf8_lossy(&said);
    let prefix = String::from_utf8_lossy(CANNOT);
    let Some(step) = said
        .lines()
        .rev()
        .find_map(|line| line.strip_prefix(prefix.as_ref()))
    else {
        return SandboxError::Io {
            context: format!("starting {program:?} in the build sandbox"),
            source: error,
        };
    };
    let text = format!("cannot {step}: {error}");
    match error.kind() {
        std::io::ErrorKind::PermissionDenied => SandboxError::NotPermitted(text),
        _ => SandboxError::Setup(text),
    }
}

fn path_is_under(path: &[u8], root: &[u8]) -> bool {
    path.strip_prefix(root)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(b"/"))
}

/// Stops a sandbox past its time limit, returning once nothing of it runs. Killing the PID
/// namespace's first process (C, the child of the waiter P that the builder spawned) makes the
/// kernel kill every process in the namespace, and P, which waits for C, exits only after the
/// last one is gone. Should that not happen in time, or C not exist yet, the process group (P
/// and whatever did not leave it) is killed instead.
async fn stop(child: &mut tokio::process::Child) {
    use rustix::process::{Pid, Signal, kill_process, kill_process_group};
    let Some(pid) = child.id() else { return };
    let inits = children_of(pid);
    for init in &inits {
        // It may have exited already; then there is nothing to kill.
        let _ = kill_process(*init, Signal::KILL);
    }
    if !inits.is_empty()
        && tokio::time::timeout(TEARDOWN_GRACE, child.wait())
            .await
            .is_ok()
    {
        return;
    }
    if let Some(group) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
        let _ = kill_process_group(group, Signal::KILL);
    }
    let _ = child.kill().await;
}

/// The processes whose parent is `parent`, from `/proc/<pid>/stat` (which every kernel has,
/// unlike `/proc/<pid>/task/<tid>/children`).
fn children_of(parent: u32) -> Vec<rustix::process::Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let pid: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
            (parent_of(&stat)? == parent).then_some(rustix::process::Pid::from_raw(pid)?)
        })
        .collect()
}

/// The parent pid in a `/proc/<pid>/stat` line: `pid (comm) state ppid …`, where `comm` may
/// hold spaces and parentheses, so fields are counted from the last `)`.
fn parent_of(stat: &[u8]) -> Option<u32> {
    let close = stat.iter().rposition(|&byte| byte == b')')?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    rest.split_ascii_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn slugs_are_one_safe_segment() {
        for good in ["content-studio", "a", "v1-2"] {
            assert!(validate_slug(good).is_ok(), "{good}");
        }
        for bad in ["", ".home", "-x", "a/b", "..", "a b", "é", "a'b", "v1.2_x"] {
            assert!(validate_slug(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn parents_are_read_from_stat_lines_with_odd_names() {
        assert_eq!(parent_of(b"42 (a b) c) S 7 42 42 0 -1"), Some(7));
        assert_eq!(parent_of(b"garbage"), None);
        let me = std::process::id();
        let child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("sleep");
        let found = children_of(me);
        let child_pid = i32::try_from(child.id()).expect("pid");
        let mut child = child;
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            found
                .iter()
                .any(|pid| pid.as_raw_nonzero().get() == child_pid)
        );
    }

    fn sandbox() -> Sandbox {
        Sandbox {
            slug: "demo".to_owned(),
            root: PathBuf::from("/scratch/it's"),
            home: PathBuf::from("/work/home"),
            tmp: PathBuf::from("/work/tmp"),
            shown: vec![PathBuf::from("/var/lib/plinth/tools")],
            uid: 65534,
            gid: 65534,
            hidden_paths: vec![
                PathBuf::from("/var/lib/plinth/data"),
                PathBuf::from("/env/x"),
            ],
            network: Network::None,
            timeout: Duration::from_secs(1),
            cgroup: None,
        }
    }

    /// The root's binds and bind flags as `from -> to (ro|rw)`, and whether a tmpfs is at
    /// `/tmp`.
    fn binds(plan: &Plan) -> (Vec<String>, bool) {
        use plinth_sandbox::root::Step;
        let mut shown = Vec::new();
        for (index, step) in plan.root.steps.iter().enumerate() {
            if let Step::Bind(from, to, _) = step {
                let read_only = plan.root.steps[index + 1..]
                    .iter()
                    .find_map(|later| match later {
                        Step::Remount(path, flags) if path == to => {
                            Some(flags.contains(rustix::mount::MountFlags::RDONLY))
                        }
                        _ => None,
                    });
                shown.push(format!(
                    "{} -> {} ({})",
                    from.to_string_lossy(),
                    to.to_string_lossy(),
                    if read_only == Some(false) { "rw" } else { "ro" }
                ));
            }
        }
        let tmpfs_at_tmp =
            plan.root.steps.iter().any(
                |step| matches!(step, Step::Tmpfs(path, _, _) if path.as_c_str() == c"/env/tmp"),
            );
        (shown, tmpfs_at_tmp)
    }

    #[test]
    fn the_plan_shows_the_scratch_home_tmp_and_tools_and_nothing_of_the_host_beyond() {
        let argv = vec!["bash".to_owned(), "setup.sh".to_owned()];
        let env = vec![("A".to_owned(), "x y".to_owned())];
        let plan = sandbox().plan(&argv, &env).expect("plan");
        assert_eq!(plan.mount_path.as_bytes(), b"/env/demo");
        let (shown, tmpfs_at_tmp) = binds(&plan);
        for expected in [
            "/scratch/it's -> /env/env/demo (rw)",
            "/work/home -> /env/env/.home (rw)",
            "/work/tmp -> /env/tmp (rw)",
            "/var/lib/plinth/tools -> /env/var/lib/plinth/tools (ro)",
            "/usr -> /env/usr (ro)",
        ] {
            assert!(
                shown.iter().any(|bind| bind == expected),
                "{expected}: {shown:?}"
            );
        }
        assert!(!tmpfs_at_tmp, "a build's /tmp is its directory on disk");
        assert!(
            !shown
                .iter()
                .any(|bind| bind.starts_with("/var ") || bind.starts_with("/root")),
            "{shown:?}"
        );
        assert_eq!(
            plan.namespaces,
            UnshareFlags::NEWNS
                | UnshareFlags::NEWPID
                | UnshareFlags::NEWIPC
                | UnshareFlags::NEWUTS
                | UnshareFlags::NEWCGROUP
                | UnshareFlags::NEWNET
        );
        assert!(plan.loopback && plan.netns.is_none());

        // A build given a namespace enters it, and makes none.
        let mut joined = sandbox();
        let netns = Arc::new(
            rustix::fs::open(
                "/proc/self/ns/net",
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .expect("our own network namespace"),
        );
        joined.network = Network::Join(netns);
        let plan = joined.plan(&argv, &env).expect("plan");
        assert!(!plan.namespaces.contains(UnshareFlags::NEWNET));
        assert!(plan.netns.is_some() && !plan.loopback);
        let mut host = sandbox();
        host.network = Network::Host;
        let plan = host.plan(&argv, &env).expect("plan");
        assert!(!plan.namespaces.contains(UnshareFlags::NEWNET) && plan.netns.is_none());
    }

    #[test]
    fn the_plan_refuses_bad_input_and_paths_it_cannot_show() {
        let argv = vec!["bash".to_owned(), "setup.sh".to_owned()];
        let bad_env = vec![("A=B".to_owned(), String::new())];
        assert!(sandbox().plan(&argv, &bad_env).is_err());
        assert!(sandbox().plan(&["X=1".to_owned()], &[]).is_err());
        assert!(sandbox().plan(&["a\0b".to_owned()], &[]).is_err());
        assert!(sandbox().plan(&[], &[]).is_err());
        let mut relative = sandbox();
        relative.home = PathBuf::from("home");
        assert!(matches!(
            relative.plan(&argv, &[]),
            Err(SandboxError::RelativePath(_))
        ));
        let mut root_hidden = sandbox();
        root_hidden.hidden_paths = vec![PathBuf::from("/")];
        assert!(matches!(
            root_hidden.plan(&argv, &[]),
            Err(SandboxError::InvalidHiddenPath(_))
        ));
        // A tools directory that holds a hidden path, or lies beneath one, or beneath a path
        // the sandbox replaces; a scratch directory under /env.
        for (shown, root) in [
            ("/var/lib/plinth", "/scratch"),
            ("/var/lib/plinth/data/tools", "/scratch"),
            ("/tmp/tools", "/scratch"),
            ("/var/lib/plinth/tools", "/env/scratch"),
        ] {
            let mut sandbox = sandbox();
            sandbox.shown = vec![PathBuf::from(shown)];
            sandbox.root = PathBuf::from(root);
            assert!(
                matches!(
                    sandbox.plan(&argv, &[]),
                    Err(SandboxError::CannotShow { .. })
                ),
                "{shown}, {root}"
            );
        }
    }

    #[test]
    fn shown_directories_are_the_tools_outside_system_directories_once_each() {
        let tools = tempfile::Builder::new()
            .prefix("plinth-shown-")
            .tempdir_in("/var/tmp")
            .expect("tempdir");
        let inner = tools.path().join("bin");
        std::fs::create_dir(&inner).expect("mkdir");
        let other = tempfile::Builder::new()
            .prefix("plinth-shown-")
            .tempdir_in("/var/tmp")
            .expect("tempdir");
        let path = format!(
            "{}:/usr/local/bin:/usr/bin:relative:/nowhere/at/all:{}",
            inner.display(),
            tools.path().display()
        );
        assert_eq!(
            shown_directories(&path, &[other.path().to_owned(), inner.clone()]),
            vec![tools.path().to_owned(), other.path().to_owned()]
        );
        assert_eq!(
            shown_directories("/usr/local/bin:/usr/bin:/bin", &[]),
            Vec::<PathBuf>::new()
        );
    }

    #[test]
    fn a_failed_step_is_named_in_the_error() {
        let (reader, mut writer) = std::io::pipe().expect("pipe");
        std::io::Write::write_all(
            &mut writer,
            b"plinth-sandbox: warning: x\nplinth-sandbox: cannot build the root while mounting a tmpfs on /env\n",
        )
        .expect("write");
        drop(writer);
        let error = setup_error(std::io::Error::from_raw_os_error(1), reader, "uv");
        assert!(
            matches!(&error, SandboxError::NotPermitted(text) if text.starts_with("cannot build the root while mounting a tmpfs on /env: ")),
            "{error}"
        );
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(writer);
        let error = setup_error(std::io::Error::from_raw_os_error(2), reader, "uv");
        assert!(
            error
                .to_string()
                .contains("starting \"uv\" in the build sandbox"),
            "{error}"
        );
    }
}
